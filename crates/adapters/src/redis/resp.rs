//! A small RESP2 client: just what erasure needs, with redirects under our control.
//!
//! - one connection per node, `AUTH` and `SELECT` on connect, pipelined commands;
//! - cluster topology from `CLUSTER SLOTS`, and every primary (with slots or without) from
//!   `CLUSTER NODES`; key slots by CRC16 with hash tags;
//! - `-MOVED` refreshes the slot map and retries at the new owner, `-ASK` retries once at the
//!   importing node after `ASKING`, `-TRYAGAIN` (a multi-key command split by a migration) falls
//!   back to one key at a time.
//!
//! Why not a general client: erasure needs per-primary `SCAN` and per-slot pipelined `UNLINK`
//! with every redirect visible, and nothing else.
//!
//! TLS (`rediss://`): OpenSSL, the server's certificate always verified against the trusted CAs
//! (the system's, plus `tls_ca_file`) and the node's host name or IP address. A handshake that
//! fails is an error, never a fall-back to plain TCP.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use openssl::ssl::{SslConnector, SslStream};

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }
    pub(crate) fn array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(a)) => Some(a),
            _ => None,
        }
    }
}

/// A node address.
pub(crate) type Addr = (String, u16);

/// Connection settings.
#[derive(Clone)]
pub(crate) struct Auth {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: u32,
    /// TLS for every node (`rediss://`), with the trusted CAs; `None`: plain TCP.
    pub(crate) tls: Option<SslConnector>,
}

/// A plain or a TLS socket.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

/// How long a read polls the socket before it sleeps in the kernel.
///
/// A reply on loopback or a LAN arrives a few tens of microseconds after the command left, and
/// waking a thread that slept for it costs about as much again on a virtual machine (a `PING`
/// round trip on the 2-core VM of bench/README.md: 72 us sleeping, 21 us polling). A
/// scan-mode pass is one `SCAN` after another, each waiting for the last cursor, so the
/// wake-up was paid 10,000 times a pass over a million keys: polling took a pass from about
/// 1.8 s to 0.9-1.0 s there. The poll yields the core between probes, so the other clients of
/// the same Redis lose nothing to it (their `GET` p99 during the erase, bench/README.md), and
/// it is bounded: after this long the read sleeps as before.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(250);

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }

    /// Polls (without blocking) until the socket has bytes to read, for at most
    /// [`POLL_BEFORE_SLEEP`]. Returns at once when TLS holds decrypted bytes already.
    fn poll_readable(&self) {
        if let Stream::Tls(s) = self {
            if s.ssl().pending() > 0 {
                return;
            }
        }
        let sock = self.tcp();
        if sock.set_nonblocking(true).is_err() {
            return;
        }
        let start = Instant::now();
        let mut probe = [0u8; 1];
        loop {
            match sock.peek(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= POLL_BEFORE_SLEEP {
                        break;
                    }
                    // Yield rather than spin: a runnable thread of this process or
                    // another (on a small machine, the very clients of this Redis)
                    // gets the core first.
                    std::thread::yield_now();
                }
                // Bytes, end of stream or an error: the blocking read reports them.
                _ => break,
            }
        }
        // A socket left non-blocking would turn the read into a spurious error; a failure
        // here is the socket's own failure and the read below reports it.
        let _ = sock.set_nonblocking(false);
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.poll_readable();
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One connection to one node.
pub(crate) struct Conn {
    stream: BufReader<Stream>,
    /// Commands encoded and not yet sent: a pipeline goes out in one write.
    out: Vec<u8>,
}

fn io_err(what: &str, e: std::io::Error) -> String {
    format!("{what}: {e}")
}

impl Conn {
    pub(crate) fn open(addr: &Addr, auth: &Auth, timeout: Duration) -> Result<Self, String> {
        use std::net::ToSocketAddrs;
        let sock = (addr.0.as_str(), addr.1)
            .to_socket_addrs()
            .map_err(|e| io_err("resolving the address", e))?
            .next()
            .ok_or("the address resolves to nothing")?;
        let stream = TcpStream::connect_timeout(&sock, timeout)
            .map_err(|e| io_err(&format!("connecting to {}:{}", addr.0, addr.1), e))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| io_err("socket", e))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| io_err("socket", e))?;
        stream.set_nodelay(true).map_err(|e| io_err("socket", e))?;
        let stream = match &auth.tls {
            None => Stream::Tcp(stream),
            Some(tls) => {
                // Verifies the chain and the host name (or IP address) of the URL: no option
                // turns that off, and a failed handshake never falls back to plain TCP.
                let s = tls
                    .configure()
                    .map_err(|e| format!("TLS setup: {e}"))?
                    .connect(&addr.0, stream)
                    .map_err(|e| format!("TLS handshake with {}:{} failed: {e}", addr.0, addr.1))?;
                Stream::Tls(Box::new(s))
            }
        };
        let mut c = Conn {
            stream: BufReader::new(stream),
            out: Vec::new(),
        };
        if let Some(p) = &auth.password {
            let mut cmd: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(u) = &auth.username {
                cmd.push(u.as_bytes());
            }
            cmd.push(p.as_bytes());
            if let Reply::Error(e) = c.call(&cmd)? {
                return Err(format!(
                    "{BAD_AUTH}: {}",
                    e.split_whitespace().next().unwrap_or("error")
                ));
            }
        }
        if auth.db != 0 {
            if let Reply::Error(e) = c.call(&[b"SELECT", auth.db.to_string().as_bytes()])? {
                return Err(format!("{BAD_DB} ({}): {}", auth.db, shown_error(&e)));
            }
        }
        Ok(c)
    }

    fn write_cmd(&mut self, args: &[&[u8]]) {
        let w = &mut self.out;
        w.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            w.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            w.extend_from_slice(a);
            w.extend_from_slice(b"\r\n");
        }
    }

    fn read_line(&mut self) -> Result<String, String> {
        let mut line = Vec::new();
        self.stream
            .read_until(b'\n', &mut line)
            .map_err(|e| io_err("reading", e))?;
        if !line.ends_with(b"\r\n") {
            return Err("connection closed".into());
        }
        line.truncate(line.len() - 2);
        String::from_utf8(line).map_err(|_| "non-UTF-8 reply header".to_string())
    }

    fn read_reply(&mut self) -> Result<Reply, String> {
        let line = self.read_line()?;
        let (kind, rest) = line.split_at(1.min(line.len()));
        let num = || {
            rest.parse::<i64>()
                // Its length only: a connection out of step with the server would be reading
                // a key or a value here (review).
                .map_err(|_| format!("bad reply length ({} bytes)", rest.len()))
        };
        Ok(match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(num()?),
            "$" => {
                let n = num()?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.stream
                        .read_exact(&mut buf)
                        .map_err(|e| io_err("reading", e))?;
                    buf.truncate(n as usize);
                    Reply::Bulk(Some(buf))
                }
            }
            "*" => {
                let n = num()?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut v = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        v.push(self.read_reply()?);
                    }
                    Reply::Array(Some(v))
                }
            }
            _ => {
                return Err(format!(
                    "unknown reply type (a {}-byte line; the connection is out of step)",
                    line.len()
                ))
            }
        })
    }

    /// One command, one reply.
    pub(crate) fn call(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        Ok(self.pipeline(&[args.to_vec()])?.remove(0))
    }

    /// Several commands written at once, their replies read in order.
    pub(crate) fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Result<Vec<Reply>, String> {
        for c in cmds {
            self.write_cmd(c);
        }
        let out = std::mem::take(&mut self.out);
        let sock = self.stream.get_mut();
        sock.write_all(&out)
            .and_then(|()| sock.flush())
            .map_err(|e| io_err("writing", e))?;
        cmds.iter().map(|_| self.read_reply()).collect()
    }
}

/// CRC16/XMODEM, as Redis Cluster uses for key slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key, honouring a `{hash tag}`.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        key[open + 1..]
            .iter()
            .position(|&b| b == b'}')
            .filter(|&len| len > 0)
            .map(|len| &key[open + 1..open + 1 + len])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

/// A server's error reply, for a message: its words up to the first quoted argument. Some
/// errors quote the command's arguments (`ERR unknown command 'UNLINK', with args beginning
/// with: '<key>'`), and a key names a person.
pub(crate) fn shown_error(e: &str) -> String {
    // Redis 7 quotes arguments with `'`, Redis 6.2 and KeyDB with backticks, some modules with
    // `"`. A backtick opens a quote anywhere; `'` and `"` only after a space, `:`, `(`, `,` or
    // `=` (or at the start), so that "don't" is not taken for one.
    let mut prev = ' ';
    let cut = e.char_indices().find_map(|(i, c)| {
        let opens =
            c == '`' || (matches!(c, '\'' | '"') && matches!(prev, ' ' | ':' | '(' | ',' | '='));
        prev = c;
        opens.then_some(i)
    });
    match cut {
        Some(i) => format!(
            "{} (quoted arguments not shown)",
            e[..i]
                .trim_end()
                .trim_end_matches([':', ',', '(', '='])
                .trim_end()
        ),
        None => e.to_string(),
    }
}

/// Whether an error reply says the server will answer later: a cluster that is down or
/// reconfiguring (`CLUSTERDOWN`, `TRYAGAIN`), a server still loading its data (`LOADING`), a
/// replica cut from its primary (`MASTERDOWN`). The job blocks (`target_unavailable`) and a
/// rerun finishes; any other error reply is a failure.
pub(crate) fn is_transient(e: &str) -> bool {
    matches!(
        e.split_whitespace().next(),
        Some("CLUSTERDOWN" | "TRYAGAIN" | "LOADING" | "MASTERDOWN" | "BUSY")
    )
}

/// `refresh`'s error when a `nodes` seed is a server without cluster support.
/// How a refused `SELECT db` starts: the configured `db` does not exist on the server (`ERR DB
/// index is out of range`), a configuration error, not an outage.
pub(crate) const BAD_DB: &str = "the server refused to select the configured `db`";

/// How a refused `AUTH` starts: a wrong user name or password, which retrying cannot mend.
pub(crate) const BAD_AUTH: &str = "authentication failed";

pub(crate) const NOT_A_CLUSTER: &str = "`nodes` lists a server without cluster support: give a \
     standalone server as `url = \"redis://...\"` (with `db`), not `nodes = [...]`";

/// The primaries in a `CLUSTER NODES` reply, and how many of them are failing (`fail`,
/// `fail?`) or have no address (`noaddr`). A node still in `handshake` has not joined: no slot
/// can be routed to it. An empty host (a node that does not know its own address) is `seed`'s.
fn masters(text: &str, seed: &str) -> (Vec<Addr>, usize) {
    let mut up = Vec::new();
    let mut down = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (f.get(1), f.get(2)) else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.contains(&"handshake") {
            continue;
        }
        if flags
            .iter()
            .any(|x| matches!(*x, "fail" | "fail?" | "noaddr"))
        {
            down += 1;
            continue;
        }
        // ip:port@cport[,hostname]
        let hostport = addr.split(['@', ',']).next().unwrap_or("");
        match hostport
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        {
            Some((h, p)) if p != 0 => {
                let h = if h.is_empty() { seed } else { h };
                up.push((h.to_string(), p));
            }
            _ => down += 1,
        }
    }
    (up, down)
}

/// How many replicas `CLUSTER NODES` lists for each primary (by the primary's address),
/// whatever their state: a replica that is failing or behind has not acknowledged anything.
fn replicas(text: &str, seed: &str) -> BTreeMap<Addr, usize> {
    let mut addr_of = BTreeMap::new();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(id), Some(addr), Some(flags), Some(master)) =
            (f.first(), f.get(1), f.get(2), f.get(3))
        else {
            continue;
        };
        if flags.split(',').any(|x| x == "master") {
            let hostport = addr.split(['@', ',']).next().unwrap_or("");
            if let Some((h, p)) = hostport
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            {
                let h = if h.is_empty() { seed } else { h };
                addr_of.insert(*id, (h.to_string(), p));
            }
        } else if flags.split(',').any(|x| x == "slave") && *master != "-" {
            *count.entry(master).or_default() += 1;
        }
    }
    count
        .into_iter()
        .filter_map(|(id, n)| Some((addr_of.get(id)?.clone(), n)))
        .collect()
}

/// Every primary of a cluster and its own slots field of `CLUSTER NODES` (ranges, and
/// `[slot->-id]` / `[slot-<-id]` for a slot it migrates or imports).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Topology(Vec<(Addr, String)>);

impl Topology {
    /// The primaries to scan.
    pub(crate) fn primaries(&self) -> Vec<Addr> {
        self.0.iter().map(|(a, _)| a.clone()).collect()
    }

    /// Whether a slot is migrating or importing: its keys are moving from one node to
    /// another, so a pass may see a key on neither.
    pub(crate) fn is_moving(&self) -> bool {
        self.0.iter().any(|(_, slots)| slots.contains('['))
    }
}

/// A redirect in an error reply.
pub(crate) enum Redirect {
    Moved(u16, Addr),
    Ask(Addr),
    TryAgain,
}

pub(crate) fn redirect(err: &str) -> Option<Redirect> {
    let mut parts = err.split_whitespace();
    let kind = parts.next()?;
    if kind == "TRYAGAIN" {
        return Some(Redirect::TryAgain);
    }
    let slot: u16 = parts.next()?.parse().ok()?;
    let (host, port) = parts.next()?.rsplit_once(':')?;
    let addr = (host.to_string(), port.parse().ok()?);
    match kind {
        "MOVED" => Some(Redirect::Moved(slot, addr)),
        "ASK" => Some(Redirect::Ask(addr)),
        _ => None,
    }
}

/// Connections to every node met, and (for a cluster) the slot map.
pub(crate) struct Nodes {
    auth: Auth,
    timeout: Duration,
    seeds: Vec<Addr>,
    cluster: bool,
    conns: HashMap<Addr, Conn>,
    /// slot -> owner; empty for a standalone server.
    slots: Vec<Option<Addr>>,
    /// Every primary `CLUSTER NODES` lists, with slots or without: a primary that serves no
    /// slot yet can hold keys (a slot being imported, a migration left half done).
    masters: Vec<Addr>,
    /// Primaries `CLUSTER NODES` flags as failing (`fail`, `fail?`) or without an address
    /// (`noaddr`): their keys cannot be scanned, so a keyspace pass cannot be complete.
    masters_down: usize,
    /// How many replicas `CLUSTER NODES` lists for each primary, failing or not: each must
    /// acknowledge an erase (`WAIT`), or a promoted one could serve the keys again.
    replicas: BTreeMap<Addr, usize>,
}

impl Nodes {
    pub(crate) fn new(seeds: Vec<Addr>, cluster: bool, auth: Auth, timeout: Duration) -> Self {
        Nodes {
            auth,
            timeout,
            seeds,
            cluster,
            conns: HashMap::new(),
            slots: Vec::new(),
            masters: Vec::new(),
            masters_down: 0,
            replicas: BTreeMap::new(),
        }
    }

    pub(crate) fn conn(&mut self, addr: &Addr) -> Result<&mut Conn, String> {
        if !self.conns.contains_key(addr) {
            let c = Conn::open(addr, &self.auth, self.timeout)?;
            self.conns.insert(addr.clone(), c);
        }
        Ok(self.conns.get_mut(addr).expect("inserted above"))
    }

    /// Drops a node's connection after an I/O error, so the next use reconnects.
    pub(crate) fn forget(&mut self, addr: &Addr) {
        self.conns.remove(addr);
    }

    /// Reads the slot map from the first seed that answers. A seed without cluster support
    /// ends it with [`NOT_A_CLUSTER`]: a configuration error, not an outage.
    pub(crate) fn refresh(&mut self) -> Result<(), String> {
        if !self.cluster {
            return Ok(());
        }
        let mut last = String::from("no seed node");
        for seed in self.seeds.clone() {
            let reply = match self
                .conn(&seed)
                .and_then(|c| c.call(&[b"CLUSTER", b"SLOTS"]))
            {
                Ok(r) => r,
                Err(e) => {
                    self.forget(&seed);
                    last = e;
                    continue;
                }
            };
            if let Reply::Error(e) = &reply {
                if e.contains("cluster support disabled") {
                    return Err(NOT_A_CLUSTER.into());
                }
            }
            let mut slots = vec![None; 16384];
            for range in reply.array().unwrap_or(&[]) {
                let r = range.array().unwrap_or(&[]);
                let (Some(lo), Some(hi), Some(master)) = (
                    r.first().and_then(Reply::int),
                    r.get(1).and_then(Reply::int),
                    r.get(2).and_then(Reply::array),
                ) else {
                    continue;
                };
                let host = master
                    .first()
                    .and_then(Reply::bytes)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                let host = if host.is_empty() {
                    seed.0.clone()
                } else {
                    host
                };
                let port = master.get(1).and_then(Reply::int).unwrap_or(0) as u16;
                for s in lo..=hi {
                    slots[s as usize] = Some((host.clone(), port));
                }
            }
            if slots.iter().any(Option::is_none) {
                return Err("the cluster does not cover all 16384 slots".into());
            }
            let nodes = match self
                .conn(&seed)
                .and_then(|c| c.call(&[b"CLUSTER", b"NODES"]))
            {
                Ok(Reply::Bulk(Some(text))) => String::from_utf8_lossy(&text).into_owned(),
                Ok(_) => return Err("CLUSTER NODES answered something other than text".into()),
                Err(e) => {
                    self.forget(&seed);
                    last = e;
                    continue;
                }
            };
            let (masters, down) = masters(&nodes, &seed.0);
            self.slots = slots;
            self.masters = masters;
            self.masters_down = down;
            self.replicas = replicas(&nodes, &seed.0);
            return Ok(());
        }
        Err(last)
    }

    /// Every primary: the standalone server, or every primary of the cluster, with slots or
    /// without. A primary flagged failing is an error: its keys cannot be scanned.
    pub(crate) fn primaries(&mut self) -> Result<Vec<Addr>, String> {
        if !self.cluster {
            return Ok(vec![self.seeds[0].clone()]);
        }
        self.refresh()?;
        if self.masters_down > 0 {
            return Err(format!(
                "{} of the cluster's primaries are failing or have no address (CLUSTER NODES)",
                self.masters_down
            ));
        }
        let mut p: Vec<Addr> = self.slots.iter().flatten().cloned().collect();
        p.extend(self.masters.iter().cloned());
        p.sort();
        p.dedup();
        Ok(p)
    }

    /// What a cluster's keyspace pass depends on: every primary and the slots it says it
    /// serves, migrates or imports, as each says it itself (a migration shows only in the
    /// migrating and the importing node's own `myself` line).
    pub(crate) fn topology(&mut self) -> Result<Topology, String> {
        let mut out = Vec::new();
        for node in self.primaries()? {
            let reply = self
                .conn(&node)
                .and_then(|c| c.call(&[b"CLUSTER", b"NODES"]))
                .inspect_err(|_| self.forget(&node))?;
            let text = match reply {
                Reply::Bulk(Some(t)) => String::from_utf8_lossy(&t).into_owned(),
                _ => return Err("CLUSTER NODES answered something other than text".into()),
            };
            let own = text
                .lines()
                .find(|l| {
                    l.split_whitespace()
                        .nth(2)
                        .is_some_and(|f| f.contains("myself"))
                })
                .map(|l| l.split_whitespace().skip(8).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            out.push((node, own));
        }
        Ok(Topology(out))
    }

    /// Whether this is a cluster (keys of one command must then share a slot).
    /// The database number of a standalone server (0 on a cluster).
    pub(crate) fn db(&self) -> u32 {
        self.auth.db
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// How many replicas must acknowledge a write to `primary`: on a cluster every replica
    /// `CLUSTER NODES` lists for it (as of the last refresh); on a standalone server the ones
    /// `ROLE` lists (connected ones: a standalone server forgets a replica that went away).
    pub(crate) fn replica_count(&mut self, primary: &Addr) -> Result<usize, String> {
        if self.cluster {
            if self.slots.is_empty() {
                self.refresh()?;
            }
            return Ok(self.replicas.get(primary).copied().unwrap_or(0));
        }
        match self.conn(primary)?.call(&[b"ROLE"])? {
            Reply::Array(Some(parts)) => Ok(parts
                .get(2)
                .and_then(Reply::array)
                .map_or(0, <[Reply]>::len)),
            _ => Ok(0),
        }
    }

    pub(crate) fn owner(&mut self, slot: u16) -> Result<Addr, String> {
        if !self.cluster {
            return Ok(self.seeds[0].clone());
        }
        if self.slots.is_empty() {
            self.refresh()?;
        }
        self.slots[slot as usize]
            .clone()
            .ok_or_else(|| "slot without owner".into())
    }

    pub(crate) fn set_owner(&mut self, slot: u16, addr: Addr) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = Some(addr);
        }
    }

    /// Runs a single-key command at the key's owner, following MOVED and ASK.
    pub(crate) fn keyed(&mut self, key: &[u8], args: &[&[u8]]) -> Result<Reply, String> {
        let slot = slot(key);
        let mut addr = self.owner(slot)?;
        let mut asking = false;
        for _ in 0..8 {
            let reply = {
                let c = self.conn(&addr)?;
                let r = if asking {
                    c.pipeline(&[vec![b"ASKING"], args.to_vec()])
                        .map(|mut v| v.remove(1))
                } else {
                    c.call(args)
                };
                match r {
                    Ok(r) => r,
                    Err(e) => {
                        self.forget(&addr);
                        return Err(e);
                    }
                }
            };
            match &reply {
                Reply::Error(e) => match redirect(e) {
                    Some(Redirect::Moved(s, a)) => {
                        self.set_owner(s, a.clone());
                        addr = a;
                        asking = false;
                    }
                    Some(Redirect::Ask(a)) => {
                        addr = a;
                        asking = true;
                    }
                    Some(Redirect::TryAgain) => asking = false,
                    None => return Ok(reply),
                },
                _ => return Ok(reply),
            }
        }
        Err("too many redirects".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            slot(b"foo{}{bar}"),
            "empty tag: whole key hashed"
        );
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn reads_every_primary_of_cluster_nodes() {
        let text = "a 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-16383\n\
                    b 127.0.0.1:7102@17102,host.example master - 0 0 2 connected\n\
                    c 127.0.0.1:7103@17103 slave a 0 0 1 connected\n\
                    d :0@0 master,noaddr - 0 0 0 disconnected\n\
                    e 127.0.0.1:7105@17105 master,fail - 0 0 0 disconnected\n\
                    f 127.0.0.1:7106@17106 handshake - 0 0 0 connected\n\
                    g :7107@17107 myself,master - 0 0 0 connected\n";
        let (up, down) = masters(text, "10.0.0.1");
        assert_eq!(
            up,
            vec![
                ("127.0.0.1".to_string(), 7101),
                ("127.0.0.1".to_string(), 7102),
                ("10.0.0.1".to_string(), 7107)
            ]
        );
        assert_eq!(down, 2, "noaddr and fail");
    }

    #[test]
    fn parses_redirects() {
        assert!(
            matches!(redirect("MOVED 3999 127.0.0.1:6381"), Some(Redirect::Moved(3999, (h, 6381))) if h == "127.0.0.1")
        );
        assert!(matches!(
            redirect("ASK 3999 127.0.0.1:6381"),
            Some(Redirect::Ask(_))
        ));
        assert!(matches!(
            redirect("TRYAGAIN Multiple keys request during rehashing of slot"),
            Some(Redirect::TryAgain)
        ));
        assert!(redirect("ERR unknown command").is_none());
    }
}
