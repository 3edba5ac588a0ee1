//! A blocking client for the gate of `lethe serve` (HTTP/1.1, JSON), for agent runtimes
//! written in Rust: one keep-alive connection per [`Client`], plus one per [`Revocations`]
//! stream. `https://` goes through OpenSSL (which every Lethe binary links already), with the
//! server's chain and host name always verified; [`Client::with_ca_file`] trusts a private CA.
//!
//! The HTTP/1.1 framing is this crate's own, not a pooled client's: the rules below need to
//! know whether a request left on a connection, and a pool that retries on a stale connection
//! by itself would send a release twice (the unit tests pin each rule).
//!
//! ```no_run
//! use lethe_client::{Client, Sink};
//! let gate = Client::new("127.0.0.1:7400", "runtime-token");
//! let lease = gate.take_lease("acme", "alice", &[("memories/k1", "v3")], 60_000)?;
//! let permit = gate.take_permit(lease.lease_id, Sink::Tool)?; // refused once the fence is closed
//! // ... dispatch the tool ...
//! gate.release_permit(permit)?;
//! # Ok::<(), lethe_client::Error>(())
//! ```
//!
//! The protocol is documented in the server's OpenAPI document (`GET /v1/openapi.json`).
//!
//! After a lost answer (the connection cut, a timeout) or a 503, a request is sent once more
//! only if a second sending changes nothing the first did not: a read, a lease renewal, a
//! permit take (it carries a random key, and the gate returns the permit its first sending
//! registered), and the end of a keyed permit (`no_such_permit` to the second sending means the
//! first ended it). Anything else is reported to the caller.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openssl::ssl::{SslConnector, SslMethod, SslStream};

use serde_json::{json, Value};

/// What went wrong. A gate refusal carries the server's stable code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error status, e.g. 409 `fenced` or `revoked`.
    #[error("gate refused ({status} {code}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Stable code: fenced, revoked, stale_epoch, tombstoned, expired, no_such_lease,
        /// no_such_permit, unauthorized, forbidden, bad_request, ...
        code: String,
        /// The server's sentence (holds no identifiers).
        message: String,
    },
    /// The connection failed.
    #[error("gate unreachable: {0}")]
    Io(#[from] std::io::Error),
    /// The server's answer did not parse.
    #[error("gate answered something unexpected: {0}")]
    Protocol(String),
    /// The TLS handshake failed: a certificate not trusted or not for this host, no common
    /// protocol version. Never retried, and never a fall-back to plain HTTP.
    #[error("TLS with the gate failed: {0}")]
    Tls(String),
}

impl Error {
    /// The stable refusal code, if the gate refused.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a permit is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Emitting model output.
    Output,
    /// Dispatching a tool.
    Tool,
    /// Writing state.
    State,
}

impl Sink {
    fn as_str(self) -> &'static str {
        match self {
            Sink::Output => "output",
            Sink::Tool => "tool",
            Sink::State => "state",
        }
    }
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Lease {
    /// Its id.
    pub lease_id: i64,
    /// The subject's epoch: the fencing token to copy into what the run writes.
    pub epoch: u64,
    /// The tenant's epoch.
    pub tenant_epoch: u64,
    /// When its TTL ends (ms since the Unix epoch).
    pub expires_ms: i64,
}

/// A granted permit: its id, and the key its take carried, which ending it shows (a keyed
/// permit is ended only by its holder: another run naming its id gets `no_such_permit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The gate's id for it.
    pub id: i64,
    /// The take's key (`None` for a permit taken without one, by an older client).
    pub key: Option<String>,
}

impl Permit {
    /// The path segment and query that name it for an end: `ID` or `ID?key=KEY`.
    fn target(&self) -> String {
        match &self.key {
            Some(k) => format!("{}?key={k}", self.id),
            None => self.id.to_string(),
        }
    }
}

/// A connection to the gate. Requests on one client are serialized; give each worker thread
/// its own client.
pub struct Client {
    /// `host:port`, as the `Host` header names it.
    addr: String,
    /// `Some` for `https://`: what the handshake verifies against (or why OpenSSL could not
    /// make it, reported by each request).
    tls: Option<std::result::Result<SslConnector, String>>,
    token: String,
    /// The kept-alive connection, and when its last answer came.
    conn: Mutex<Option<(BufReader<Stream>, Instant)>>,
}

/// One connection to the server: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }

    /// Whether the server has closed the connection (or sent bytes nobody asked for): a look
    /// without waiting. Over TLS a record may arrive unasked and mean nothing (a TLS 1.3
    /// session ticket): it is read, and only application data or a close counts.
    fn closed_by_peer(&mut self) -> bool {
        if self.tcp().set_nonblocking(true).is_err() {
            return true;
        }
        let closed = match self {
            Stream::Plain(s) => {
                !matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
            Stream::Tls(s) => {
                s.ssl().pending() > 0
                    || match s.ssl_read(&mut [0u8; 1]) {
                        Err(e) => !matches!(
                            e.code(),
                            openssl::ssl::ErrorCode::WANT_READ
                                | openssl::ssl::ErrorCode::WANT_WRITE
                        ),
                        Ok(_) => true,
                    }
            }
        };
        self.tcp().set_nonblocking(false).is_err() || closed
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("addr", &self.addr).finish()
    }
}

impl Client {
    /// A client for the server at `addr`, authenticating with `token`: `host:port` or
    /// `http://host:port` for plain HTTP (loopback, or a network you trust), `https://host:port`
    /// for TLS, verified against the system's CA certificates (add one with
    /// [`Client::with_ca_file`]).
    pub fn new(addr: impl Into<String>, token: impl Into<String>) -> Self {
        let addr = addr.into();
        let (addr, tls) = match addr.strip_prefix("https://") {
            Some(rest) => (rest.trim_end_matches('/').to_string(), true),
            None => (
                addr.strip_prefix("http://")
                    .unwrap_or(&addr)
                    .trim_end_matches('/')
                    .to_string(),
                false,
            ),
        };
        Self {
            addr,
            // The system's trusted certificates (OpenSSL's default paths).
            tls: tls.then(|| {
                SslConnector::builder(SslMethod::tls_client())
                    .map(|b| b.build())
                    .map_err(|e| e.to_string())
            }),
            token: token.into(),
            conn: Mutex::new(None),
        }
    }

    /// Trusts the CA certificates of a PEM file too (a private CA in front of `lethe serve`),
    /// beside the system's. For an `https://` client; an `http://` one is returned unchanged.
    pub fn with_ca_file(mut self, pem: impl AsRef<Path>) -> Result<Self> {
        if self.tls.is_none() {
            return Ok(self);
        }
        let tls_err = |e: openssl::error::ErrorStack| Error::Tls(e.to_string());
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(tls_err)?;
        b.set_ca_file(pem.as_ref()).map_err(tls_err)?;
        self.tls = Some(Ok(b.build()));
        Ok(self)
    }

    /// A new connection to the server, TLS-wrapped for `https://`.
    fn connect(&self) -> Result<Stream> {
        let tcp = TcpStream::connect(&self.addr)?;
        tcp.set_nodelay(true)?;
        let Some(tls) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        // The name the certificate must carry: the host part, without brackets for IPv6.
        let host = self
            .addr
            .rsplit_once(':')
            .map_or(self.addr.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let tls = tls.as_ref().map_err(|e| Error::Tls(e.clone()))?;
        let s = tls
            .connect(host, tcp)
            .map_err(|e| Error::Tls(e.to_string()))?;
        Ok(Stream::Tls(Box::new(s)))
    }

    /// Takes a lease for a run that read the subject's memory: `reads` are the
    /// `(memory_id, version)` pairs it read.
    pub fn take_lease(
        &self,
        tenant: &str,
        subject: &str,
        reads: &[(&str, &str)],
        ttl_ms: u64,
    ) -> Result<Lease> {
        let reads: Vec<Value> = reads
            .iter()
            .map(|(m, v)| json!({"memory_id": m, "version": v}))
            .collect();
        let body = json!({"tenant": tenant, "subject": subject, "reads": reads, "ttl_ms": ttl_ms});
        let v = self.call("POST", "/v1/leases", Some(&body))?;
        serde_json::from_value(v).map_err(|e| Error::Protocol(e.to_string()))
    }

    /// Takes a permit at an acceptance point: one atomic check-and-register at the gate.
    pub fn take_permit(&self, lease_id: i64, sink: Sink) -> Result<Permit> {
        let key = take_key()?;
        let body = json!({"lease_id": lease_id, "sink": sink.as_str(), "key": key});
        let v = self.send("POST", "/v1/permits", Some(&body), true)?;
        v.get("permit_id")
            .and_then(Value::as_i64)
            .map(|id| Permit { id, key: Some(key) })
            .ok_or_else(|| Error::Protocol("no permit_id".into()))
    }

    /// Takes a permit and, in the same request, releases `previous`, whose boundary has ended:
    /// one round trip where [`Client::release_permit`] then [`Client::take_permit`] take two
    /// (a run going straight from one acceptance point to the next, e.g. a tool's result
    /// written to state). The release happens whatever the take's answer, so after an `Ok`
    /// or a [`Error::Refused`] other than `bad_request`, `unauthorized` or `forbidden`,
    /// `previous` is no longer active; after [`Error::Io`] or `unavailable`, release it again
    /// with [`Client::release_permit`] (`no_such_permit` then means it was). The `bool` says
    /// whether this request ended it (`false`: it was not active any more, which a take sent
    /// again after a lost answer also reports, since its first sending ended it).
    pub fn take_permit_releasing(
        &self,
        lease_id: i64,
        sink: Sink,
        previous: &Permit,
    ) -> Result<(Permit, bool)> {
        let key = take_key()?;
        let body = json!({"lease_id": lease_id, "sink": sink.as_str(), "release": previous.id,
            "release_key": previous.key, "key": key});
        let v = self.send("POST", "/v1/permits", Some(&body), true)?;
        match (
            v.get("permit_id").and_then(Value::as_i64),
            v.get("released").and_then(Value::as_bool),
        ) {
            (Some(id), Some(released)) => Ok((Permit { id, key: Some(key) }, released)),
            _ => Err(Error::Protocol("no permit_id or released".into())),
        }
    }

    /// Keeps a long run's lease: its expiry moves to at least now + `ttl_ms`. Returns the new
    /// expiry (milliseconds since 1970-01-01 UTC). Refused (`revoked`, `expired`) for a lease an
    /// erasure revoked or whose TTL already passed: read the memory again, take a new lease.
    pub fn renew_lease(&self, lease_id: i64, ttl_ms: u64) -> Result<i64> {
        let body = json!({ "ttl_ms": ttl_ms });
        // Sent again after a lost answer: a renewal only ever moves the expiry later.
        let v = self.send(
            "POST",
            &format!("/v1/leases/{lease_id}/renew"),
            Some(&body),
            true,
        )?;
        v.get("expires_ms")
            .and_then(Value::as_i64)
            .ok_or_else(|| Error::Protocol("no expires_ms".into()))
    }

    /// The boundary ended normally.
    pub fn release_permit(&self, permit: Permit) -> Result<()> {
        self.end_permit(
            "DELETE",
            &format!("/v1/permits/{}", permit.target()),
            &permit,
        )
    }

    /// The run aborted the work the permit covered (after a revocation).
    pub fn confirm_cancelled(&self, permit: Permit) -> Result<()> {
        let path = match &permit.key {
            Some(k) => format!("/v1/permits/{}/cancelled?key={k}", permit.id),
            None => format!("/v1/permits/{}/cancelled", permit.id),
        };
        self.end_permit("POST", &path, &permit)
    }

    /// Ends a permit. A keyed one is sent once more after a lost answer or a 503 (its key names
    /// this take's permit and nothing else), and `no_such_permit` to that second sending means
    /// the first ended it. An unkeyed one is sent once: a second sending could not tell the
    /// two apart. Before, a release whose answer was lost stayed active if it had not arrived,
    /// and its erasure stayed BLOCKED until an operator confirmed the cancellation.
    fn end_permit(&self, method: &str, path: &str, permit: &Permit) -> Result<()> {
        match self.send_counted(method, path, None, permit.key.is_some()) {
            (
                Err(Error::Refused {
                    status: 404, code, ..
                }),
                true,
            ) if code == "no_such_permit" => Ok(()),
            (r, _) => r.map(drop),
        }
    }

    /// Whether the lease was revoked.
    pub fn is_revoked(&self, lease_id: i64) -> Result<bool> {
        let v = self.call("GET", &format!("/v1/leases/{lease_id}"), None)?;
        v.get("revoked")
            .and_then(Value::as_bool)
            .ok_or_else(|| Error::Protocol("no revoked field".into()))
    }

    /// Asks for an erasure (operator token): returns the server's JSON (`job_id`, `state`).
    pub fn create_job(&self, request: &Value) -> Result<Value> {
        self.call("POST", "/v1/jobs", Some(request))
    }

    /// Resumes a job in the background (operator token), e.g. after the permits that blocked
    /// it were released. `request`: `{"drain_timeout_s": N, "reinventory": bool}` or `{}`.
    pub fn resume_job(&self, job_id: &str, request: &Value) -> Result<Value> {
        self.call("POST", &format!("/v1/jobs/{job_id}/resume"), Some(request))
    }

    /// Every job: ids, states, scope hashes (operator token).
    pub fn jobs(&self) -> Result<Value> {
        self.call("GET", "/v1/jobs", None)
    }

    /// A job's outcome (operator token).
    pub fn job(&self, job_id: &str) -> Result<Value> {
        self.call("GET", &format!("/v1/jobs/{job_id}"), None)
    }

    /// Opens the revocation stream for these leases on its own connection.
    pub fn revocations(&self, leases: &[i64]) -> Result<Revocations> {
        let ids: Vec<String> = leases.iter().map(i64::to_string).collect();
        let mut stream = self.connect()?;
        write!(
            stream,
            "GET /v1/revocations?leases={} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
            ids.join(","),
            self.addr,
            self.token
        )?;
        let mut reader = BufReader::new(stream);
        let head = read_head(&mut reader)?;
        if head.status != 200 {
            let body = read_body(&mut reader, &head)?;
            return Err(refusal(head.status, &body));
        }
        Ok(Revocations {
            reader,
            chunked: head.chunked,
            pending: String::new(),
        })
    }

    /// One request on the keep-alive connection, reconnecting once if the server closed it.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        self.send(method, path, body, method == "GET")
    }

    /// [`Client::call`]; `resend`: the request may be sent once more after a lost answer (a
    /// read, a keyed permit take, a renewal), since a second sending changes nothing the first
    /// did not.
    fn send(&self, method: &str, path: &str, body: Option<&Value>, resend: bool) -> Result<Value> {
        self.send_counted(method, path, body, resend).0
    }

    /// [`Client::send`], and whether the answer is to a second sending.
    fn send_counted(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        resend: bool,
    ) -> (Result<Value>, bool) {
        let mut twice = false;
        let answer = self.send_inner(method, path, body, resend, &mut twice);
        (answer, twice)
    }

    fn send_inner(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        resend: bool,
        twice: &mut bool,
    ) -> Result<Value> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        // A kept-alive connection the server has closed meanwhile (its idle timeout, a restart)
        // is found before the request is sent, never after: a request that may have been acted
        // on (a permit registered, a release) is sent twice only when that is safe.
        // One idle past half the server's idle timeout is replaced too: the server may be
        // closing it just as the request leaves, which no look at the socket can see.
        if guard.as_mut().is_some_and(|(r, used)| {
            used.elapsed() > IDLE_REUSE || !r.buffer().is_empty() || r.get_mut().closed_by_peer()
        }) {
            *guard = None;
        }
        for attempt in 0..2 {
            *twice = attempt > 0;
            let fresh = guard.is_none();
            if fresh {
                let s = self.connect()?;
                s.tcp().set_read_timeout(Some(Duration::from_secs(60)))?;
                *guard = Some((BufReader::new(s), Instant::now()));
            }
            let (reader, used) = guard.as_mut().expect("connected above");
            let answer = roundtrip(reader, &self.addr, &self.token, method, path, &body);
            if answer.is_ok() {
                *used = Instant::now();
            }
            match answer {
                // The control store did not answer, maybe after the commit (a keyed take's
                // permit may be registered): sent again, once, if that is safe.
                Ok((503, _)) if attempt == 0 && resend => {}
                Ok((status, bytes)) => {
                    if status >= 400 {
                        return Err(refusal(status, &bytes));
                    }
                    if bytes.is_empty() {
                        return Ok(Value::Null);
                    }
                    return serde_json::from_slice(&bytes)
                        .map_err(|e| Error::Protocol(e.to_string()));
                }
                // The answer was lost (the server closed the connection just as the request
                // left, a proxy cut it): only a request that may be sent again is, once, on a
                // new connection. Anything else may have been acted on, so its caller sees the
                // error.
                Err(Error::Io(_)) if attempt == 0 && resend => *guard = None,
                Err(e) => {
                    *guard = None;
                    return Err(e);
                }
            }
        }
        Err(Error::Protocol("unreachable retry".into()))
    }
}

/// How long a kept-alive connection may sit idle and still be reused: half `lethe serve`'s
/// idle timeout (60 s).
const IDLE_REUSE: Duration = Duration::from_secs(30);

/// A random name for one permit take (its `key`): 128 bits, in hex.
fn take_key() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn refusal(status: u16, body: &[u8]) -> Error {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Error::Refused {
        status,
        code: s("error"),
        message: s("message"),
    }
}

fn roundtrip(
    reader: &mut BufReader<Stream>,
    addr: &str,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, Vec<u8>)> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    reader.get_mut().write_all(req.as_bytes())?;
    let head = read_head(reader)?;
    let bytes = read_body(reader, &head)?;
    Ok((head.status, bytes))
}

struct Head {
    status: u16,
    length: Option<usize>,
    chunked: bool,
}

fn read_head(reader: &mut impl BufRead) -> Result<Head> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Protocol("bad status line".into()))?;
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    Ok(Head {
        status,
        length,
        chunked,
    })
}

fn read_body(reader: &mut impl BufRead, head: &Head) -> Result<Vec<u8>> {
    if head.chunked {
        let mut out = Vec::new();
        while let Some(chunk) = read_chunk(reader)? {
            out.extend_from_slice(&chunk);
        }
        return Ok(out);
    }
    let mut out = vec![0; head.length.unwrap_or(0)];
    reader.read_exact(&mut out)?;
    Ok(out)
}

/// One chunk of a chunked body; `None` at the last (empty) chunk.
fn read_chunk(reader: &mut impl BufRead) -> Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        .map_err(|_| Error::Protocol("bad chunk size".into()))?;
    let mut chunk = vec![0; size];
    reader.read_exact(&mut chunk)?;
    let mut crlf = [0; 2];
    reader.read_exact(&mut crlf)?;
    if size == 0 {
        return Ok(None);
    }
    Ok(Some(chunk))
}

/// The revocation stream (server-sent events) for a set of leases.
pub struct Revocations {
    reader: BufReader<Stream>,
    chunked: bool,
    pending: String,
}

impl std::fmt::Debug for Revocations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revocations").finish_non_exhaustive()
    }
}

impl Revocations {
    /// Blocks until the next revoked lease id; `Ok(None)` when the server ended the stream.
    pub fn next_revoked(&mut self) -> Result<Option<i64>> {
        loop {
            // Complete events end with a blank line.
            if let Some(end) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..end + 2).collect();
                let mut name = "message";
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if name == "revoked" {
                    let v: Value =
                        serde_json::from_str(&data).map_err(|e| Error::Protocol(e.to_string()))?;
                    return v
                        .get("lease_id")
                        .and_then(Value::as_i64)
                        .map(Some)
                        .ok_or_else(|| Error::Protocol("revoked event without lease_id".into()));
                }
                continue;
            }
            let bytes = if self.chunked {
                match read_chunk(&mut self.reader)? {
                    Some(b) => b,
                    None => return Ok(None),
                }
            } else {
                let mut line = String::new();
                if self.reader.read_line(&mut line)? == 0 {
                    return Ok(None);
                }
                line.into_bytes()
            };
            self.pending
                .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The keep-alive rules against a scripted server on a real socket: a connection the server
    //! closed is replaced before a request is sent; a lost answer makes a keyed permit take or
    //! end go again with its key, and nothing else that may have been acted on.

    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// Reads one request; returns its request line and body.
    fn read_request(r: &mut impl BufRead) -> (String, String) {
        let mut first = String::new();
        r.read_line(&mut first).unwrap();
        let mut length = 0;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).unwrap();
        (
            first.trim_end().to_string(),
            String::from_utf8(body).unwrap(),
        )
    }

    fn answer<S: Read + Write>(r: &mut BufReader<S>, status: &str, json: &str) {
        write!(
            r.get_mut(),
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
            json.len()
        )
        .unwrap();
    }

    fn cut(r: BufReader<TcpStream>) {
        r.get_ref().shutdown(std::net::Shutdown::Both).unwrap();
    }

    fn key_of(body: &str) -> String {
        let v: Value = serde_json::from_str(body).unwrap();
        v["key"].as_str().expect("a keyed take").to_string()
    }

    /// The server closed the kept-alive connection while it sat idle: the next request goes on
    /// a new connection, once.
    #[test]
    fn a_connection_the_server_closed_is_replaced_before_the_request_is_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let (done_tx, done_rx) = mpsc::channel();
        let (closed_tx, closed_rx) = mpsc::channel::<()>();
        let runner = std::thread::spawn(move || {
            let first = client.take_permit(7, Sink::Tool).unwrap();
            closed_rx.recv().unwrap();
            let second = client.release_permit(first.clone());
            done_tx.send((Ok::<_, Error>(first.id), second)).unwrap();
        });
        let mut one = BufReader::new(listener.accept().unwrap().0);
        let (line, body) = read_request(&mut one);
        assert_eq!(line, "POST /v1/permits HTTP/1.1");
        let key = key_of(&body);
        answer(&mut one, "201 Created", r#"{"permit_id": 1}"#);
        cut(one);
        closed_tx.send(()).unwrap();
        let mut two = BufReader::new(listener.accept().unwrap().0);
        // The release shows the key its take carried.
        assert_eq!(
            read_request(&mut two).0,
            format!("DELETE /v1/permits/1?key={key} HTTP/1.1")
        );
        answer(&mut two, "204 No Content", "");
        let (first, second) = done_rx.recv().unwrap();
        assert_eq!(first.unwrap(), 1);
        assert!(second.is_ok(), "{second:?}");
        runner.join().unwrap();
    }

    /// The server read the release of a permit taken without a key and closed the connection
    /// without an answer: the client reports it and does not send it again (a second sending's
    /// `no_such_permit` could not tell a release that worked from a wrong id).
    #[test]
    fn an_unkeyed_release_cut_after_it_was_sent_is_not_sent_again() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let (done_tx, done_rx) = mpsc::channel();
        let runner = std::thread::spawn(move || {
            let first = client.take_permit(7, Sink::Tool).map(|p| p.id);
            let second = client.release_permit(Permit { id: 1, key: None });
            done_tx.send((first, second)).unwrap();
        });
        let mut one = BufReader::new(listener.accept().unwrap().0);
        assert_eq!(read_request(&mut one).0, "POST /v1/permits HTTP/1.1");
        answer(&mut one, "201 Created", r#"{"permit_id": 1}"#);
        assert_eq!(read_request(&mut one).0, "DELETE /v1/permits/1 HTTP/1.1");
        cut(one);
        let (first, second) = done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the client answered without waiting on a resent request");
        assert_eq!(first.unwrap(), 1);
        assert!(matches!(second, Err(Error::Io(_))), "{second:?}");
        listener.set_nonblocking(true).unwrap();
        assert!(
            matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the release was sent again on a new connection"
        );
        runner.join().unwrap();
    }

    /// A permit take whose answer was lost goes once more, with the same key, so the gate
    /// returns the permit the first sending registered; each take has a key of its own.
    #[test]
    fn a_permit_take_cut_after_it_was_sent_goes_again_with_its_key() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let runner = std::thread::spawn(move || {
            let first = client.take_permit(7, Sink::Tool).map(|p| p.id);
            let second = client.take_permit(7, Sink::Tool).map(|p| p.id);
            (first, second)
        });
        let mut one = BufReader::new(listener.accept().unwrap().0);
        let (line, body) = read_request(&mut one);
        assert_eq!(line, "POST /v1/permits HTTP/1.1");
        let first_key = key_of(&body);
        cut(one);
        let mut two = BufReader::new(listener.accept().unwrap().0);
        let (_, body) = read_request(&mut two);
        assert_eq!(key_of(&body), first_key, "sent again with its key");
        answer(&mut two, "201 Created", r#"{"permit_id": 5}"#);
        let (_, body) = read_request(&mut two);
        let second_key = key_of(&body);
        assert_ne!(second_key, first_key, "a new take, a new key");
        assert_eq!(second_key.len(), 32);
        answer(&mut two, "201 Created", r#"{"permit_id": 6}"#);
        let (first, second) = runner.join().unwrap();
        assert_eq!((first.unwrap(), second.unwrap()), (5, 6));
    }

    /// A keyed release whose answer was lost goes once more, with its key: `no_such_permit` to
    /// that second sending means the first ended the permit, and the release succeeds; one
    /// answered so the first time is an error.
    #[test]
    fn a_keyed_release_cut_after_it_was_sent_goes_again_and_no_such_permit_then_means_done() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let permit = Permit {
            id: 4,
            key: Some("k4".into()),
        };
        let (p1, p2) = (permit.clone(), permit.clone());
        let runner = std::thread::spawn(move || {
            let first = client.release_permit(p1);
            let second = client.confirm_cancelled(p2);
            (first, second)
        });
        let gone = r#"{"error": "no_such_permit", "message": "no active permit 4"}"#;
        let mut one = BufReader::new(listener.accept().unwrap().0);
        assert_eq!(
            read_request(&mut one).0,
            "DELETE /v1/permits/4?key=k4 HTTP/1.1"
        );
        cut(one);
        let mut two = BufReader::new(listener.accept().unwrap().0);
        assert_eq!(
            read_request(&mut two).0,
            "DELETE /v1/permits/4?key=k4 HTTP/1.1",
            "sent again with its key"
        );
        answer(&mut two, "404 Not Found", gone);
        // The same answer to a first sending is the caller's to see.
        assert_eq!(
            read_request(&mut two).0,
            "POST /v1/permits/4/cancelled?key=k4 HTTP/1.1"
        );
        answer(&mut two, "404 Not Found", gone);
        let (first, second) = runner.join().unwrap();
        assert!(first.is_ok(), "{first:?}");
        assert_eq!(second.unwrap_err().code(), Some("no_such_permit"));
    }

    /// A 503 (the control store did not answer, maybe after the commit) makes a keyed take or
    /// end go once more with its key.
    #[test]
    fn a_503_sends_a_keyed_take_or_release_again() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let runner = std::thread::spawn(move || {
            let taken = client.take_permit(7, Sink::Tool).unwrap();
            let released = client.release_permit(taken.clone());
            (taken, released)
        });
        let unavailable =
            r#"{"error": "unavailable", "message": "the control store did not answer"}"#;
        let mut one = BufReader::new(listener.accept().unwrap().0);
        let (_, body) = read_request(&mut one);
        let key = key_of(&body);
        answer(&mut one, "503 Service Unavailable", unavailable);
        let (_, body) = read_request(&mut one);
        assert_eq!(key_of(&body), key, "sent again with its key");
        answer(&mut one, "201 Created", r#"{"permit_id": 3}"#);
        let (line, _) = read_request(&mut one);
        assert_eq!(line, format!("DELETE /v1/permits/3?key={key} HTTP/1.1"));
        answer(&mut one, "503 Service Unavailable", unavailable);
        let (again, _) = read_request(&mut one);
        assert_eq!(again, line, "sent again with its key");
        answer(&mut one, "204 No Content", "");
        let (taken, released) = runner.join().unwrap();
        assert_eq!(taken.id, 3);
        assert!(released.is_ok(), "{released:?}");
    }

    /// A release answered 503 twice is reported: sent twice, not more.
    #[test]
    fn a_release_answered_503_twice_is_reported() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let runner = std::thread::spawn(move || {
            client.release_permit(Permit {
                id: 3,
                key: Some("k".into()),
            })
        });
        let unavailable =
            r#"{"error": "unavailable", "message": "the control store did not answer"}"#;
        let mut one = BufReader::new(listener.accept().unwrap().0);
        for _ in 0..2 {
            assert_eq!(
                read_request(&mut one).0,
                "DELETE /v1/permits/3?key=k HTTP/1.1"
            );
            answer(&mut one, "503 Service Unavailable", unavailable);
        }
        assert_eq!(
            runner.join().unwrap().unwrap_err().code(),
            Some("unavailable")
        );
        // Nothing more was sent: the connection has no byte waiting (the client, dropped, has
        // closed it, or it is idle).
        one.get_ref().set_nonblocking(true).unwrap();
        let mut rest = [0u8; 1];
        let more = one.get_mut().read(&mut rest);
        assert!(
            matches!(more, Ok(0))
                || matches!(&more, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the release was sent a third time: {more:?}"
        );
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "or on a new connection");
    }

    /// A certificate for `ip`, signed by itself (it is its own CA), and its key.
    fn self_signed(
        ip: &str,
    ) -> (
        openssl::pkey::PKey<openssl::pkey::Private>,
        openssl::x509::X509,
    ) {
        use openssl::asn1::Asn1Time;
        use openssl::ec::{EcGroup, EcKey};
        use openssl::hash::MessageDigest;
        use openssl::nid::Nid;
        use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
        use openssl::x509::{X509NameBuilder, X509};
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let key = openssl::pkey::PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "lethe-client-test")
            .unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        let san = SubjectAlternativeName::new()
            .ip(ip)
            .build(&b.x509v3_context(None, None))
            .unwrap();
        b.append_extension(san).unwrap();
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        (key, b.build())
    }

    /// A TLS server on 127.0.0.1 with a certificate for `ip`; the CA file a client trusts it by.
    fn tls_server(
        ip: &str,
    ) -> (
        TcpListener,
        openssl::ssl::SslAcceptor,
        tempfile::NamedTempFile,
    ) {
        let (key, cert) = self_signed(ip);
        let mut a = openssl::ssl::SslAcceptor::mozilla_intermediate_v5(
            openssl::ssl::SslMethod::tls_server(),
        )
        .unwrap();
        a.set_private_key(&key).unwrap();
        a.set_certificate(&cert).unwrap();
        let mut ca = tempfile::NamedTempFile::new().unwrap();
        ca.write_all(&cert.to_pem().unwrap()).unwrap();
        (TcpListener::bind("127.0.0.1:0").unwrap(), a.build(), ca)
    }

    /// `https://`: the server's certificate is verified against the CA the client trusts, and
    /// two requests share one kept-alive TLS connection.
    #[test]
    fn https_verifies_the_server_and_keeps_the_connection() {
        let (listener, acceptor, ca) = tls_server("127.0.0.1");
        let url = format!("https://{}", listener.local_addr().unwrap());
        let client = Client::new(url, "t").with_ca_file(ca.path()).unwrap();
        let runner = std::thread::spawn(move || {
            let permit = client.take_permit(7, Sink::Tool)?;
            client.release_permit(permit)
        });
        let tcp = listener.accept().unwrap().0;
        let mut one = BufReader::new(acceptor.accept(tcp).unwrap());
        let (line, body) = read_request(&mut one);
        assert_eq!(line, "POST /v1/permits HTTP/1.1");
        let key = key_of(&body);
        answer(&mut one, "201 Created", r#"{"permit_id": 1}"#);
        assert_eq!(
            read_request(&mut one).0,
            format!("DELETE /v1/permits/1?key={key} HTTP/1.1")
        );
        answer(&mut one, "204 No Content", "");
        runner.join().unwrap().unwrap();
        listener.set_nonblocking(true).unwrap();
        assert!(
            matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the second request opened a second connection"
        );
    }

    /// A certificate the client does not trust, or one for another host, fails the handshake:
    /// `Error::Tls`, no request sent, no fall-back to plain HTTP.
    #[test]
    fn https_refuses_an_untrusted_or_misnamed_certificate() {
        for (cert_ip, trust) in [("127.0.0.1", false), ("127.0.0.2", true)] {
            let (listener, acceptor, ca) = tls_server(cert_ip);
            let url = format!("https://{}", listener.local_addr().unwrap());
            let mut client = Client::new(url, "t");
            if trust {
                client = client.with_ca_file(ca.path()).unwrap();
            }
            let runner = std::thread::spawn(move || client.take_lease("acme", "alice", &[], 1000));
            let tcp = listener.accept().unwrap().0;
            assert!(
                acceptor.accept(tcp).is_err(),
                "{cert_ip}: the handshake completed"
            );
            let got = runner.join().unwrap();
            assert!(matches!(got, Err(Error::Tls(_))), "{cert_ip}: {got:?}");
        }
    }
}
