//! A blocking client for the gate of `lethe serve` (HTTP/1.1, JSON), for agent runtimes
//! written in Rust: kept-alive connections, plus one per [`Revocations`] stream. HTTP is
//! `ureq`'s, and `https://` is rustls's, with the server's chain and host name always verified
//! (against the Mozilla roots `webpki-roots` carries, or only a private CA's with
//! [`Client::with_ca_file`]); an `https://` client never speaks plain HTTP, nor follows a
//! redirect.
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
//!
//! Only this crate sends a request again: `ureq` has no retry of its own and follows no
//! redirect here (`max_redirects(0)`), so a request that fails after it left comes back as an
//! error to the rules above (a pooled connection the server closed is found before the request
//! is written, as its pool probes the socket; the unit tests pin each rule).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

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
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Lease {
    /// Its id.
    pub lease_id: i64,
    /// The subject's epoch.
    pub epoch: u64,
    /// The tenant's epoch.
    pub tenant_epoch: u64,
    /// The gate's fencing token for this lease (a MAC over it, its epochs and its owner): what
    /// the database guard checks. Empty from a server older than guard version 7.
    #[serde(default)]
    pub token: String,
    /// When its TTL ends (ms since the Unix epoch).
    pub expires_ms: i64,
}

impl Lease {
    /// The keys a run copies into what it writes, for the database guard: `lethe_epoch`,
    /// `lethe_tenant_epoch` and `lethe_token`. For LangGraph, into the run config's `metadata`
    /// (copied into every checkpoint) and into each store item's value (docs/gate.md,
    /// "Fencing tokens").
    pub fn fencing(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("lethe_epoch".into(), self.epoch.into());
        m.insert("lethe_tenant_epoch".into(), self.tenant_epoch.into());
        m.insert("lethe_token".into(), self.token.clone().into());
        m
    }
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

/// A connection to the gate, kept alive between requests. Threads may share a client (each
/// request in flight gets a connection of its own); give each busy worker thread its own.
pub struct Client {
    /// `http://host:port` or `https://host:port`, without a trailing slash.
    base: String,
    agent: ureq::Agent,
    /// The `Authorization` header's value.
    bearer: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

/// How long a kept-alive connection may sit idle and still be reused: half `lethe serve`'s
/// idle timeout (60 s), so the server is not closing it just as a request leaves, which no
/// look at the socket can see.
const IDLE_REUSE: Duration = Duration::from_secs(30);

/// How long a request waits for its answer before the answer counts as lost.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The agent every request goes through; `roots`: whom `https://` trusts.
fn agent(https: bool, roots: RootCerts) -> ureq::Agent {
    ureq::Agent::config_builder()
        // Never sent elsewhere: a redirect (a POST turned into a GET) or a proxy named in the
        // environment would change what a lost answer means.
        .max_redirects(0)
        .proxy(None)
        .https_only(https)
        // A refusal's body carries its code: statuses are this crate's to read.
        .http_status_as_error(false)
        .max_idle_age(IDLE_REUSE)
        .timeout_recv_response(Some(ANSWER_TIMEOUT))
        .timeout_recv_body(Some(ANSWER_TIMEOUT))
        .user_agent(concat!("lethe-client/", env!("CARGO_PKG_VERSION")))
        .tls_config(TlsConfig::builder().root_certs(roots).build())
        .build()
        .new_agent()
}

impl Client {
    /// A client for the server at `addr`, authenticating with `token`: `host:port` or
    /// `http://host:port` for plain HTTP (loopback, or a network you trust), `https://host:port`
    /// for TLS, verified against the Mozilla root CAs (`webpki-roots`); for a private CA, see
    /// [`Client::with_ca_file`].
    pub fn new(addr: impl Into<String>, token: impl Into<String>) -> Self {
        let addr = addr.into();
        let base = if addr.starts_with("https://") || addr.starts_with("http://") {
            addr.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", addr.trim_end_matches('/'))
        };
        let https = base.starts_with("https://");
        Self {
            agent: agent(https, RootCerts::WebPki),
            base,
            bearer: format!("Bearer {}", token.into()),
        }
    }

    /// Trusts the CA certificates of a PEM file, and only them (a private CA in front of
    /// `lethe serve`: a certificate from a public CA for the same name is refused). For an
    /// `https://` client; an `http://` one is returned unchanged.
    pub fn with_ca_file(mut self, pem: impl AsRef<Path>) -> Result<Self> {
        if !self.base.starts_with("https://") {
            return Ok(self);
        }
        let path = pem.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
        let mut certs: Vec<Certificate<'static>> = Vec::new();
        for item in ureq::tls::parse_pem(&bytes) {
            match item.map_err(|e| Error::Tls(format!("{}: {e}", path.display())))? {
                PemItem::Certificate(c) => certs.push(c),
                _ => continue,
            }
        }
        if certs.is_empty() {
            return Err(Error::Tls(format!(
                "{}: no certificate in the PEM file",
                path.display()
            )));
        }
        self.agent = agent(true, RootCerts::new_with_certs(&certs));
        Ok(self)
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
        let url = format!("{}/v1/revocations?leases={}", self.base, ids.join(","));
        let answer = self
            .agent
            .get(&url)
            .header("Authorization", &self.bearer)
            .header("Accept", "text/event-stream")
            .config()
            // The stream stays open as long as its leases do: no answer is late.
            .timeout_recv_body(None)
            .build()
            .call()
            .map_err(|e| self.error(e))?;
        let status = answer.status().as_u16();
        let mut body = answer.into_body();
        if status != 200 {
            let bytes = read_all(&mut body).map_err(|e| self.error(e))?;
            return Err(refusal(status, &bytes));
        }
        Ok(Revocations {
            reader: BufReader::new(body.into_reader()),
        })
    }

    /// One request, on a kept-alive connection if one is idle.
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
        let body = body.map(|b| b.to_string().into_bytes());
        for attempt in 0..2 {
            let twice = attempt > 0;
            match self.roundtrip(method, path, body.as_deref()) {
                // The control store did not answer, maybe after the commit (a keyed take's
                // permit may be registered): sent again, once, if that is safe.
                Ok((503, _)) if !twice && resend => {}
                Ok((status, bytes)) => {
                    let answer = if status >= 400 {
                        Err(refusal(status, &bytes))
                    } else if !(200..300).contains(&status) {
                        Err(Error::Protocol(format!("status {status}")))
                    } else if bytes.is_empty() {
                        Ok(Value::Null)
                    } else {
                        serde_json::from_slice(&bytes).map_err(|e| Error::Protocol(e.to_string()))
                    };
                    return (answer, twice);
                }
                // The answer was lost (the server closed the connection just as the request
                // left, a proxy cut it): only a request that may be sent again is, once, on a
                // new connection (the failed one is not pooled). Anything else may have been
                // acted on, so its caller sees the error.
                Err(Error::Io(_)) if !twice && resend => {}
                Err(e) => return (Err(e), twice),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Sends one request and reads its whole answer: its status and body.
    fn roundtrip(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<(u16, Vec<u8>)> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("Authorization", &self.bearer);
        let sent = match (method, body) {
            // A request with a body, or a POST without one, declares its length (0 included).
            (_, Some(b)) => self.agent.run(
                request
                    .header("Content-Type", "application/json")
                    .body(b)
                    .map_err(|e| Error::Protocol(e.to_string()))?,
            ),
            ("POST", None) => self.agent.run(
                request
                    .body(&[][..])
                    .map_err(|e| Error::Protocol(e.to_string()))?,
            ),
            (_, None) => self.agent.run(
                request
                    .body(())
                    .map_err(|e| Error::Protocol(e.to_string()))?,
            ),
        };
        let answer = sent.map_err(|e| self.error(e))?;
        let status = answer.status().as_u16();
        // Read to its end, so the connection goes back to the pool.
        let bytes = read_all(answer.into_body()).map_err(|e| self.error(e))?;
        Ok((status, bytes))
    }

    /// This crate's error for one of `ureq`'s. Only [`Error::Io`] is a lost answer, which a
    /// request that may be sent again is.
    fn error(&self, e: ureq::Error) -> Error {
        use std::io::ErrorKind;
        match e {
            // rustls reports a failed handshake, or a record that does not verify, as invalid
            // data read from the socket: that is no lost answer, and never sent again.
            ureq::Error::Io(e)
                if e.kind() == ErrorKind::InvalidData && self.base.starts_with("https://") =>
            {
                Error::Tls(e.to_string())
            }
            ureq::Error::Io(e) => Error::Io(e),
            ureq::Error::Timeout(t) => Error::Io(std::io::Error::new(
                ErrorKind::TimedOut,
                format!("timeout: {t}"),
            )),
            ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
                Error::Io(std::io::Error::new(ErrorKind::NotConnected, e.to_string()))
            }
            ureq::Error::Tls(_)
            | ureq::Error::Pem(_)
            | ureq::Error::Rustls(_)
            | ureq::Error::TlsRequired
            | ureq::Error::RequireHttpsOnly(_) => Error::Tls(e.to_string()),
            e => Error::Protocol(e.to_string()),
        }
    }
}

/// A whole body, without the 10 MiB cap of `ureq`'s `read_to_vec` (a job list may be long).
fn read_all(mut body: impl std::borrow::BorrowMut<ureq::Body>) -> Result<Vec<u8>, ureq::Error> {
    let mut out = Vec::new();
    body.borrow_mut().as_reader().read_to_end(&mut out)?;
    Ok(out)
}

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

/// The revocation stream (server-sent events) for a set of leases: `ureq` undoes the chunked
/// framing, and the events' lines are read here.
pub struct Revocations {
    reader: BufReader<ureq::BodyReader<'static>>,
}

impl std::fmt::Debug for Revocations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revocations").finish_non_exhaustive()
    }
}

impl Revocations {
    /// Blocks until the next revoked lease id; `Ok(None)` when the server ended the stream.
    pub fn next_revoked(&mut self) -> Result<Option<i64>> {
        let (mut name, mut data) = (String::new(), String::new());
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                return Ok(None);
            }
            let l = line.trim_end_matches(['\r', '\n']);
            // A blank line ends an event; a line starting with ':' is a comment (a keepalive).
            if !l.is_empty() {
                if let Some(v) = l.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = l.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
                continue;
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
            name.clear();
            data.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The keep-alive rules against a scripted server on a real socket: a connection the server
    //! closed is replaced before a request is sent; a lost answer makes a keyed permit take or
    //! end go again with its key, and nothing else that may have been acted on.

    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
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

    type Key = openssl::pkey::PKey<openssl::pkey::Private>;

    /// A certificate named `cn` for `key`, signed by `issuer` (by itself if `None`): a CA's, or
    /// a server's for the IP address `ip` (webpki takes no CA's certificate as a server's).
    fn certificate(
        cn: &str,
        key: &Key,
        issuer: Option<(&openssl::x509::X509, &Key)>,
        ip: Option<&str>,
    ) -> openssl::x509::X509 {
        use openssl::asn1::Asn1Time;
        use openssl::hash::MessageDigest;
        use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
        use openssl::x509::{X509NameBuilder, X509};
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", cn).unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        let (issuer_name, signer) = match issuer {
            Some((cert, key)) => (cert.subject_name(), key),
            None => (name.as_ref(), key),
        };
        b.set_issuer_name(issuer_name).unwrap();
        b.set_pubkey(key).unwrap();
        b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        match ip {
            Some(ip) => {
                let san = SubjectAlternativeName::new()
                    .ip(ip)
                    .build(&b.x509v3_context(issuer.map(|(c, _)| c.as_ref()), None))
                    .unwrap();
                b.append_extension(san).unwrap();
            }
            None => b
                .append_extension(BasicConstraints::new().critical().ca().build().unwrap())
                .unwrap(),
        }
        b.sign(signer, MessageDigest::sha256()).unwrap();
        b.build()
    }

    fn new_key() -> Key {
        use openssl::ec::{EcGroup, EcKey};
        let group = EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
        openssl::pkey::PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
    }

    /// A TLS server on 127.0.0.1 with a certificate for `ip` from a CA of its own; the CA file a
    /// client trusts it by.
    fn tls_server(
        ip: &str,
    ) -> (
        TcpListener,
        openssl::ssl::SslAcceptor,
        tempfile::NamedTempFile,
    ) {
        let (ca_key, key) = (new_key(), new_key());
        let ca_cert = certificate("lethe-client-test CA", &ca_key, None, None);
        let cert = certificate(
            "lethe-client-test",
            &key,
            Some((&ca_cert, &ca_key)),
            Some(ip),
        );
        let mut a = openssl::ssl::SslAcceptor::mozilla_intermediate_v5(
            openssl::ssl::SslMethod::tls_server(),
        )
        .unwrap();
        a.set_private_key(&key).unwrap();
        a.set_certificate(&cert).unwrap();
        let mut ca = tempfile::NamedTempFile::new().unwrap();
        ca.write_all(&ca_cert.to_pem().unwrap()).unwrap();
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

    /// A certificate the client does not trust (no CA file: the Mozilla roots; another private
    /// CA's file: that CA only), or one for another host, fails the handshake: `Error::Tls`, no
    /// request sent, no fall-back to plain HTTP.
    #[test]
    fn https_refuses_an_untrusted_or_misnamed_certificate() {
        let (_, _, other_ca) = tls_server("127.0.0.1");
        for (cert_ip, trust) in [
            ("127.0.0.1", None),
            ("127.0.0.1", Some(false)),
            ("127.0.0.2", Some(true)),
        ] {
            let (listener, acceptor, ca) = tls_server(cert_ip);
            let url = format!("https://{}", listener.local_addr().unwrap());
            let mut client = Client::new(url, "t");
            match trust {
                Some(true) => client = client.with_ca_file(ca.path()).unwrap(),
                Some(false) => client = client.with_ca_file(other_ca.path()).unwrap(),
                None => {}
            }
            let runner = std::thread::spawn(move || client.take_lease("acme", "alice", &[], 1000));
            let tcp = listener.accept().unwrap().0;
            assert!(
                acceptor.accept(tcp).is_err(),
                "{cert_ip}: the handshake completed"
            );
            let got = runner.join().unwrap();
            assert!(
                matches!(&got, Err(Error::Tls(m)) if m.contains("certificate")),
                "{cert_ip} {trust:?}: {got:?}"
            );
        }
    }

    /// An `https://` client facing a plain HTTP server sends its TLS hello, never the request,
    /// and takes no plain answer: `Error::Tls`, not sent again.
    #[test]
    fn https_never_falls_back_to_plain_http() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let client = Client::new(url, "t");
        let runner = std::thread::spawn(move || client.take_permit(7, Sink::Tool));
        let mut one = listener.accept().unwrap().0;
        let mut first = [0u8; 1];
        one.read_exact(&mut first).unwrap();
        assert_eq!(first[0], 0x16, "a TLS handshake record");
        let plain = r#"{"permit_id": 1}"#;
        write!(
            one,
            "HTTP/1.1 201 Created\r\nContent-Length: {}\r\n\r\n{plain}",
            plain.len()
        )
        .unwrap();
        let got = runner.join().unwrap();
        assert!(matches!(got, Err(Error::Tls(_))), "{got:?}");
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "sent again on a new connection");
    }

    /// A redirect is not followed (a POST sent again elsewhere, or to plain HTTP): the caller
    /// sees it.
    #[test]
    fn a_redirect_is_reported_not_followed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(listener.local_addr().unwrap().to_string(), "t");
        let elsewhere = format!("http://{}/v1/permits", listener.local_addr().unwrap());
        let runner = std::thread::spawn(move || client.take_permit(7, Sink::Tool));
        let mut one = BufReader::new(listener.accept().unwrap().0);
        assert_eq!(read_request(&mut one).0, "POST /v1/permits HTTP/1.1");
        write!(
            one.get_mut(),
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere}\r\nContent-Length: 0\r\n\r\n"
        )
        .unwrap();
        let got = runner.join().unwrap();
        assert!(matches!(got, Err(Error::Protocol(_))), "{got:?}");
        one.get_ref().set_nonblocking(true).unwrap();
        let more = one.get_mut().read(&mut [0u8; 1]);
        assert!(
            matches!(more, Ok(0))
                || matches!(&more, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "sent again: {more:?}"
        );
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "sent again on a new connection");
    }

    /// A CA file that is missing or holds no certificate is refused when the client is made.
    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        let client = || Client::new("https://127.0.0.1:1", "t");
        for path in [empty.path(), Path::new("/nonexistent/ca.pem")] {
            let got = client().with_ca_file(path);
            assert!(matches!(got, Err(Error::Tls(_))), "{got:?}");
        }
        // Plain HTTP has no use for it.
        assert!(Client::new("127.0.0.1:1", "t")
            .with_ca_file(empty.path())
            .is_ok());
    }
}
