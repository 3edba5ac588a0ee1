//! The HTTP/1.1 plumbing the contract doubles of the `opensearch`, `qdrant` and `langsmith`
//! kinds share (tests only): a server on 127.0.0.1, a thread per connection, one request per
//! connection, each answered by the double's handler. It also counts the requests in flight at
//! once, so a test can check a target's `max_in_flight`.
//!
//! The doubles themselves, each written from its vendor's REST reference, are in their kinds'
//! `double.rs` (`qdrant`: `tests/double.rs`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

/// One request as a double receives it.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The query string's pairs, percent-decoded.
    pub query: BTreeMap<String, String>,
    /// Header names lower-cased.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// A double's answer: a status, extra headers and a JSON body; or `None` from the handler to
/// drop the connection unanswered.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Response {
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body,
        }
    }

    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

type Handler = dyn Fn(&Request) -> Option<Response> + Send + Sync;

/// A running double; dropping it stops the server.
pub struct Server {
    port: u16,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    /// The most requests seen in flight at once.
    peak: Arc<AtomicUsize>,
    /// How long each request is held before its handler runs (to make overlap measurable).
    hold_ms: Arc<AtomicUsize>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Option<Response> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let hold_ms = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let (st, inf, pk, hold) = (
            stop.clone(),
            in_flight.clone(),
            peak.clone(),
            hold_ms.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = conn else { continue };
                let (h, inf, pk, hold) = (handler.clone(), inf.clone(), pk.clone(), hold.clone());
                std::thread::spawn(move || {
                    let _ = serve(c, &*h, &inf, &pk, &hold);
                });
            }
        });
        Server {
            port,
            stop,
            in_flight,
            peak,
            hold_ms,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The most requests that were in flight at once so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Holds every request this long before answering it, and resets the peak.
    pub fn hold(&self, ms: usize) {
        self.hold_ms.store(ms, Ordering::SeqCst);
        self.peak
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

fn serve(
    mut c: TcpStream,
    handler: &Handler,
    in_flight: &AtomicUsize,
    peak: &AtomicUsize,
    hold_ms: &AtomicUsize,
) -> std::io::Result<()> {
    let req = read(&mut c)?;
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    peak.fetch_max(now, Ordering::SeqCst);
    let hold = hold_ms.load(Ordering::SeqCst);
    if hold > 0 {
        // A slow server, so that requests overlap where a client lets them.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(Duration::from_millis(hold as u64));
    }
    let answer = handler(&req);
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let Some(r) = answer else { return Ok(()) };
    let body = r.body.to_string();
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        body.len()
    );
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    c.write_all(format!("{head}\r\n{body}").as_bytes())
}

fn read(c: &mut TcpStream) -> std::io::Result<Request> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let len = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    Ok(Request {
        method,
        path: decode(path),
        query,
        headers,
        body,
    })
}
