//! One vendor's HTTP client: `ureq` with no redirects, no proxy from the environment and a
//! timeout per request, plus Lethe's retries (the library makes none).
//!
//! Retried: a connection that fails or drops, 500, 502, 503, 504 (exponential backoff from
//! `backoff_ms`), and 429 and 503 after their `Retry-After` (seconds or an HTTP date). A
//! `Retry-After` longer than `retry_after_max_ms` is not waited out: the call is unavailable
//! and the job BLOCKED, to be resumed later. Every wait counts against `budget_ms`. Messages
//! name the operation and the status, never a URL (it holds encoded identifiers), a response
//! body or the token.
//!
//! One client serves one target, and may bound the target's requests in flight
//! ([`Client::with_max_in_flight`]): every attempt, from any thread, takes a slot first, and a
//! `Retry-After` the vendor gives holds every request of the target until it has passed, not
//! only the one it answered.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ureq::http::{self, HeaderName, HeaderValue, Method};

/// The most of a response body read.
const MAX_BODY: u64 = 32 * 1024 * 1024;
/// The longest wait between two attempts by backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How a client retries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pacing {
    pub(crate) timeout: Duration,
    pub(crate) retries: u32,
    pub(crate) backoff: Duration,
    pub(crate) retry_after_max: Duration,
    pub(crate) budget: Duration,
}

/// The vendor's answer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) location: Option<String>,
    pub(crate) body: Vec<u8>,
    /// An earlier attempt of this request may have been applied: its connection failed after
    /// it was sent, or the vendor answered 5xx.
    pub(crate) ambiguous: bool,
}

/// Why a request has no answer.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No answer: the connection failed, dropped or timed out.
    Unavailable(String),
    /// The vendor answered, busy (429, 5xx), each time it was asked.
    Busy(String),
}

pub(crate) struct Client {
    agent: ureq::Agent,
    /// `scheme://host[:port]`.
    pub(crate) origin: String,
    /// `base_url`'s path, without its trailing `/`.
    base_path: String,
    token: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) pacing: Pacing,
    /// The target's requests in flight, and when the next may start.
    slots: Arc<InFlight>,
}

/// A counting semaphore over one target's requests, with the time before which none may
/// start (the latest `Retry-After` any of them was given).
#[derive(Debug)]
pub(crate) struct InFlight {
    max: usize,
    state: Mutex<(usize, Option<Instant>)>,
    freed: Condvar,
}

/// A taken slot; dropping it frees the slot.
pub(crate) struct Slot<'a>(&'a InFlight);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 -= 1;
        self.0.freed.notify_all();
    }
}

impl InFlight {
    /// At most `max` requests at once (at least 1).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            state: Mutex::new((0, None)),
            freed: Condvar::new(),
        }
    }

    /// Waits for a free slot and for any `Retry-After` to pass, then takes the slot.
    pub(crate) fn take(&self) -> Slot<'_> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            let wait = st.1.filter(|at| *at > now).map(|at| at - now);
            match wait {
                Some(d) => {
                    st = self.freed.wait_timeout(st, d).unwrap_or_else(|p| p.into_inner()).0;
                }
                None if st.0 >= self.max => {
                    st = self.freed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                None => {
                    st.0 += 1;
                    return Slot(self);
                }
            }
        }
    }

    /// No request of the target starts before `at`.
    pub(crate) fn hold_until(&self, at: Instant) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.1.is_none_or(|t| t < at) {
            st.1 = Some(at);
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("origin", &self.origin)
            .field("token", &self.token.as_ref().map(|_| "(from token_file)"))
            .finish_non_exhaustive()
    }
}

impl Client {
    pub(crate) fn new(
        origin: String,
        base_path: String,
        token: Option<String>,
        headers: Vec<(HeaderName, HeaderValue)>,
        pacing: Pacing,
    ) -> Self {
        let config = ureq::Agent::config_builder()
            .max_redirects(0)
            .max_redirects_will_error(false)
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(pacing.timeout))
            .user_agent(concat!("lethe/", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            agent: config.into(),
            origin,
            base_path,
            token,
            headers,
            pacing,
            slots: Arc::new(InFlight::new(usize::MAX)),
        }
    }

    /// Bounds the target's requests in flight to `max` (at least 1), across every thread that
    /// uses this client.
    pub(crate) fn with_max_in_flight(mut self, max: usize) -> Self {
        self.slots = Arc::new(InFlight::new(max));
        self
    }

    /// Whether `url`, as a vendor gave it (absolute, or from `/`), is on this client's origin;
    /// its path and query if so. The token goes nowhere else.
    pub(crate) fn same_origin(&self, url: &str) -> Option<String> {
        if url.starts_with('/') && !url.starts_with("//") {
            return Some(url.to_string());
        }
        let rest = url.strip_prefix(&self.origin)?;
        match rest.chars().next() {
            None => Some("/".into()),
            Some('/') => Some(rest.to_string()),
            _ => None,
        }
    }

    /// Sends one request, retrying as the module says. `target` is the path and query after
    /// `base_url` (or from the origin, `absolute`); `op` names it in messages.
    pub(crate) fn send(
        &self,
        method: &Method,
        target: &str,
        absolute: bool,
        body: Option<&[u8]>,
        key: &str,
        op: &str,
    ) -> Result<Reply, SendError> {
        let uri = if absolute {
            format!("{}{target}", self.origin)
        } else {
            format!("{}{}{target}", self.origin, self.base_path)
        };
        let started = Instant::now();
        let mut ambiguous = false;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let answer = {
                let _slot = self.slots.take();
                self.once(method, &uri, body, key)
            };
            let (why, wait, answered) = match answer {
                Ok((status, location, retry_after, body)) => {
                    let retry = matches!(status, 429 | 500 | 502 | 503 | 504);
                    if !retry {
                        return Ok(Reply {
                            status,
                            location,
                            body,
                            ambiguous,
                        });
                    }
                    if status != 429 && *method != Method::GET {
                        ambiguous = true;
                    }
                    let why = format!("{op} answered HTTP {status}");
                    let wait = match (status, retry_after) {
                        (429 | 503, Some(d)) if d > self.pacing.retry_after_max => {
                            return Err(SendError::Busy(format!(
                                "{why} with Retry-After {} s, longer than retry_after_max_ms: resume the job later",
                                d.as_secs()
                            )));
                        }
                        (429 | 503, Some(d)) => {
                            // The vendor asked the target, not this request, to wait.
                            self.slots.hold_until(Instant::now() + d);
                            d
                        }
                        _ => self.backoff(attempt),
                    };
                    (why, wait, true)
                }
                Err(Transport { why, sent }) => {
                    if sent && *method != Method::GET {
                        ambiguous = true;
                    }
                    (format!("{op}: {why}"), self.backoff(attempt), false)
                }
            };
            let give_up = if attempt > self.pacing.retries {
                Some(format!("{why} ({attempt} attempts)"))
            } else if started.elapsed() + wait > self.pacing.budget {
                Some(format!("{why}; retrying would exceed budget_ms"))
            } else {
                None
            };
            if let Some(why) = give_up {
                return Err(match answered {
                    true => SendError::Busy(why),
                    false => SendError::Unavailable(why),
                });
            }
            tracing::debug!(op, attempt, wait_ms = wait.as_millis() as u64, "Vendor request retried.");
            // Pacing a real vendor (its Retry-After, a backoff), not a clock a test controls:
            // no result depends on how long the wait lasted, only that it was not shorter.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(wait);
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.pacing
            .backoff
            .saturating_mul(1u32 << (attempt - 1).min(16))
            .min(MAX_BACKOFF)
    }

    /// One attempt: the status, `Location`, `Retry-After` and the body.
    #[allow(clippy::type_complexity)]
    fn once(
        &self,
        method: &Method,
        uri: &str,
        body: Option<&[u8]>,
        key: &str,
    ) -> Result<(u16, Option<String>, Option<Duration>, Vec<u8>), Transport> {
        let mut b = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .header("accept", "application/json")
            .header("idempotency-key", key);
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in &self.headers {
            b = b.header(k, v);
        }
        let request = match body {
            Some(bytes) => b
                .header("content-type", "application/json")
                .body(bytes.to_vec()),
            None => b.body(Vec::new()),
        }
        .map_err(|_| Transport {
            why: "the request could not be built".into(),
            sent: false,
        })?;
        let mut response = self.agent.run(request).map_err(|e| Transport {
            why: shown(&e),
            sent: !matches!(
                e,
                ureq::Error::HostNotFound | ureq::Error::ConnectionFailed
            ) && !matches!(&e, ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused),
        })?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let location = header("location");
        let retry_after = header("retry-after")
            .and_then(|v| retry_after(&v, header("date").as_deref()));
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| Transport {
                why: format!("reading the answer: {}", shown(&e)),
                sent: true,
            })?;
        Ok((status, location, retry_after, body))
    }
}

struct Transport {
    why: String,
    /// The request may have reached the vendor.
    sent: bool,
}

/// A transport error in words, without the URL `ureq` may quote.
fn shown(e: &ureq::Error) -> String {
    match e {
        // The OS's and ureq's own words: neither holds the URL.
        ureq::Error::Io(io) => format!("connection error: {io}"),
        ureq::Error::Timeout(t) => format!("timed out ({t:?})"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Tls(why) => format!("TLS: {why}"),
        ureq::Error::Protocol(_) => "the vendor's answer is not valid HTTP/1.1".into(),
        ureq::Error::BodyExceedsLimit(_) => {
            format!("the answer is larger than {} MiB", MAX_BODY >> 20)
        }
        _ => "transport error".into(),
    }
}

/// A vendor's origin from config: `https://host[:port]` (any host), or `http://` on loopback
/// only (a test double, a local server), without path, query or credentials; lower-cased,
/// without a trailing `/`. `form` says what the key should look like.
pub(crate) fn origin(url: &str, form: &str) -> Result<String, String> {
    let url = url.trim_end_matches('/');
    let (scheme, authority) = url.split_once("://").ok_or(form)?;
    if !matches!(scheme, "https" | "http")
        || authority.is_empty()
        || authority.contains(['/', '?', '#', '@', '{', '}'])
        || authority.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(form.into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if host.is_empty() || (scheme == "http" && !loopback) {
        return Err(format!(
            "{form}: over plain http the credentials and every identifier would cross the network readable"
        ));
    }
    Ok(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

/// Milliseconds from config within `min..=max`, or `default`.
pub(crate) fn millis(
    key: &str,
    v: Option<u64>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<Duration, String> {
    match v.unwrap_or(default) {
        n if (min..=max).contains(&n) => Ok(Duration::from_millis(n)),
        _ => Err(format!("`{key}` must be between {min} and {max}")),
    }
}

/// `max_in_flight` from config: 1 to 64, default 4.
pub(crate) fn max_in_flight(v: Option<usize>) -> Result<usize, String> {
    match v.unwrap_or(4) {
        n @ 1..=64 => Ok(n),
        _ => Err("`max_in_flight` must be between 1 and 64".into()),
    }
}

/// `Retry-After`: delta seconds, or an HTTP date read against the answer's `Date` (or this
/// machine's clock without one). A date in the past is no wait.
pub(crate) fn retry_after(value: &str, date: Option<&str>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = http_date(value)?;
    let now = match date.and_then(http_date) {
        Some(d) => d,
        None => {
            // Only a vendor's HTTP date without its own Date header is read against this
            // machine's clock; nothing is decided by it but how long to wait.
            #[allow(clippy::disallowed_methods)]
            let now = std::time::SystemTime::now();
            time::OffsetDateTime::from(now)
        }
    };
    let d = at - now;
    Some(if d.is_negative() {
        Duration::ZERO
    } else {
        d.unsigned_abs()
    })
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(s: &str) -> Option<time::OffsetDateTime> {
    let f = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(s.trim(), f)
        .ok()
        .map(|p| p.assume_utc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doubles::{Response, Server};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn client(url: &str, max: usize) -> Client {
        let pacing = Pacing {
            timeout: Duration::from_secs(10),
            retries: 3,
            backoff: Duration::from_millis(10),
            retry_after_max: Duration::from_secs(10),
            budget: Duration::from_secs(30),
        };
        Client::new(url.to_string(), String::new(), None, Vec::new(), pacing).with_max_in_flight(max)
    }

    /// A 429 with `Retry-After` answered to one request holds every request of the target until
    /// it passed, not only the one it answered: a second thread's request sent meanwhile waits
    /// too. Without the hold it would be answered at once.
    #[test]
    fn a_retry_after_holds_every_request_of_the_target() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        let server = Server::start(move |r| {
            let n = c2.fetch_add(1, Ordering::SeqCst);
            Some(if n == 0 && r.path == "/first" {
                Response::json(429, serde_json::json!({})).with("Retry-After", "1")
            } else {
                Response::json(200, serde_json::json!({}))
            })
        });
        let c = client(&server.url(), 8);
        let started = Instant::now();
        std::thread::scope(|s| {
            let a = s.spawn(|| c.send(&Method::GET, "/first", false, None, "k", "first").map(|r| r.status));
            // Sent once the first was answered 429 and the client read its Retry-After.
            while c.slots.state.lock().unwrap().1.is_none() {
                std::thread::yield_now();
            }
            let t = Instant::now();
            let b = c.send(&Method::GET, "/second", false, None, "k", "second").unwrap();
            assert_eq!(b.status, 200);
            assert!(t.elapsed() >= Duration::from_millis(800), "the second request waited out the first's Retry-After: {:?}", t.elapsed());
            assert_eq!(a.join().unwrap().unwrap(), 200);
        });
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    /// `max_in_flight` bounds requests at once across threads.
    #[test]
    fn max_in_flight_bounds_requests_across_threads() {
        let server = Server::start(|_| Some(Response::json(200, serde_json::json!({}))));
        for (max, want) in [(2, 2), (5, 5)] {
            let c = client(&server.url(), max);
            server.hold(50);
            std::thread::scope(|s| {
                for _ in 0..10 {
                    s.spawn(|| c.send(&Method::GET, "/x", false, None, "k", "x").unwrap());
                }
            });
            assert_eq!(server.peak(), want);
            server.hold(0);
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        assert_eq!(retry_after("3", None), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after(
                "Sun, 06 Nov 1994 08:49:40 GMT",
                Some("Sun, 06 Nov 1994 08:49:37 GMT")
            ),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(
                "Sun, 06 Nov 1994 08:49:30 GMT",
                Some("Sun, 06 Nov 1994 08:49:37 GMT")
            ),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", None), None);
        assert_eq!(retry_after("-1", None), None);
    }
}
