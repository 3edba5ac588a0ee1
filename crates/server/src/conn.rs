//! The connections `lethe serve` accepts, and how long each may make the server wait.
//!
//! - A connection is **unproven** until one of its requests carries a valid bearer token, then
//!   **proven**. At most [`MAX_UNPROVEN`] unproven connections are kept: a new one past that
//!   closes the oldest idle unproven one (one with a request in flight is never closed, so no
//!   answer is lost after the gate acted; when all have one, the new connection is closed). At most [`MAX_CONNECTIONS`] proven ones are kept, and none
//!   is ever closed to make room. So connections opened without a token, however many and
//!   however idle, cost a bounded slice of the server and never stop a runtime with a token
//!   from being answered: its connection is accepted, proven by its first request, and safe.
//!   (A proven connection past [`MAX_CONNECTIONS`] is served, but stays unproven.)
//! - Each bound is on the client, never on the server's own work: a request's headers must all
//!   arrive within the idle timeout of the server starting to wait for them (hyper's header
//!   read timeout, which also closes a kept-alive connection that sends nothing); the rest of a
//!   body within the idle timeout of the server first waiting on it; and a response's bytes must
//!   be taken by the client within the idle timeout of the socket's buffer filling. A request
//!   the server is slow to answer (a gate call waiting on a lock) is never cut: its permit
//!   would be registered and its answer lost.
//! - A revocation stream writes a keepalive every 15 s and reads nothing, so no bound cuts one.
//! - A stop closes the listener, asks every connection to end after its request in flight,
//!   and after [`crate::SHUTDOWN_GRACE`] drops the ones still open.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;

/// The most proven connections (whose requests carry a valid token) kept at once.
pub const MAX_CONNECTIONS: usize = 4096;

/// The most unproven connections (none of whose requests has carried a valid token yet) kept at
/// once; a new one past it closes the oldest. A client with a token sends its first request
/// within milliseconds of connecting, so it is proven long before this many others arrive.
pub const MAX_UNPROVEN: usize = 256;

/// One request's answer, as the connection's service gives it.
type Answer = Pin<
    Box<dyn Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send>,
>;

/// Whether a request's headers carry a valid bearer token (of any role).
pub(crate) type Authenticate = Arc<dyn Fn(&hyper::HeaderMap) -> bool + Send + Sync>;

/// The connections kept, unproven and proven (see the module documentation).
struct Admission {
    proven: Arc<Semaphore>,
    /// Unproven connections by arrival: the signal that closes each, and how many of its
    /// requests are being answered (one with a request in flight is never closed to make room:
    /// its answer would be lost after the gate acted on it).
    unproven: Mutex<BTreeMap<u64, (Arc<Notify>, usize)>>,
}

impl Admission {
    /// Registers a new connection as unproven, closing the oldest idle unproven one if there
    /// are [`MAX_UNPROVEN`]; `None` when every one of those has a request in flight (the new
    /// connection is then closed at once).
    fn admit(&self, id: u64) -> Option<Arc<Notify>> {
        let close = Arc::new(Notify::new());
        let mut unproven = self.unproven.lock().unwrap_or_else(|p| p.into_inner());
        if unproven.len() >= MAX_UNPROVEN {
            let oldest_idle = unproven
                .iter()
                .find(|(_, (_, busy))| *busy == 0)
                .map(|(k, _)| *k)?;
            if let Some((oldest, _)) = unproven.remove(&oldest_idle) {
                // Stored if its task is not waiting yet: it closes as soon as it looks.
                oldest.notify_one();
            }
        }
        unproven.insert(id, (Arc::clone(&close), 0));
        Some(close)
    }

    /// Marks a request of an unproven connection in flight until the guard drops; `None` when
    /// the connection was closed to make room meanwhile (the request is then not served).
    fn start(self: &Arc<Self>, id: u64) -> Option<InFlight> {
        let mut unproven = self.unproven.lock().unwrap_or_else(|p| p.into_inner());
        unproven.get_mut(&id)?.1 += 1;
        Some(InFlight(Arc::clone(self), id))
    }

    /// Proves a connection: it takes a proven slot, if one is free, and can no longer be
    /// closed to make room. Returns the slot, held until the connection ends.
    fn prove(&self, id: u64) -> Option<OwnedSemaphorePermit> {
        let slot = Arc::clone(&self.proven).try_acquire_owned().ok()?;
        let mut unproven = self.unproven.lock().unwrap_or_else(|p| p.into_inner());
        // Gone: it was just told to close, to make room for a newer one.
        unproven.remove(&id)?;
        Some(slot)
    }

    fn forget(&self, id: u64) {
        self.unproven
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// A request of an unproven connection in flight ([`Admission::start`]).
struct InFlight(Arc<Admission>, u64);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut unproven = self.0.unproven.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, busy)) = unproven.get_mut(&self.1) {
            *busy = busy.saturating_sub(1);
        }
    }
}

/// How long the server waits on a client ([`crate::Server`]'s `idle_timeout` in production):
/// for a request's headers, for the rest of its body, for it to take a response's bytes.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `stop` resolves, then ends the connections (see the module
/// documentation).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    authenticate: Authenticate,
    idle: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
    grace: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut listener = listener;
    let admission = Arc::new(Admission {
        proven: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        unproven: Mutex::new(BTreeMap::new()),
    });
    let mut next_id = 0u64;
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    let mut open = JoinSet::new();
    let app = TowerToHyperService::new(app);
    let mut stop = pin!(stop);
    loop {
        // Never fails: axum's accept retries what a listener can recover from.
        let next = async { axum::serve::Listener::accept(&mut listener).await.0 };
        let tcp = tokio::select! {
            _ = &mut stop => break,
            // Finished connections are reaped as they end, so the set stays as large as the open.
            Some(_) = open.join_next(), if !open.is_empty() => continue,
            accepted = next => accepted,
        };
        // Small request/response pairs: never hold a segment back waiting for an ACK.
        let _ = tcp.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        // Every unproven connection has a request in flight: this one is closed at once.
        let Some(evicted) = admission.admit(id) else {
            continue;
        };
        let app = app.clone();
        let (admission_c, authenticate) = (Arc::clone(&admission), Arc::clone(&authenticate));
        // The proven slot, once a request carried a token; dropped with the connection.
        let slot: Mutex<Option<OwnedSemaphorePermit>> = Mutex::new(None);
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let mut held = slot.lock().unwrap_or_else(|p| p.into_inner());
            if held.is_none() && authenticate(req.headers()) {
                *held = admission_c.prove(id);
            }
            // An unproven connection's request is marked in flight, so it is not closed to make
            // room before its answer is written; one closed already is not served.
            let in_flight = match held.is_some() {
                true => None,
                false => match admission_c.start(id) {
                    Some(f) => Some(f),
                    None => {
                        return Box::pin(async {
                            Ok(crate::ApiError::new(
                                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                                "unavailable",
                                "the server closed this connection to make room; retry on a \
                                 new connection, with a token",
                            )
                            .into_response())
                        }) as Answer
                    }
                },
            };
            drop(held);
            let answer =
                hyper::service::Service::call(&app, req.map(|b| Body::new(Timed::new(b, idle))));
            Box::pin(async move {
                let out = answer.await;
                drop(in_flight);
                out
            }) as Answer
        });
        let mut closing = closing_rx.clone();
        let admission_t = Arc::clone(&admission);
        let tls = tls.clone();
        open.spawn(async move {
            let Some(stream) = handshake(tls, tcp, idle).await else {
                admission_t.forget(id);
                return;
            };
            let io = TokioIo::new(Guarded {
                stream,
                idle,
                write_deadline: None,
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(idle);
            let mut conn = pin!(http.serve_connection(io, service));
            let closing_now = tokio::select! {
                _ = conn.as_mut() => false,
                // Closed to make room for a newer connection (module documentation).
                _ = evicted.notified() => false,
                _ = closing.wait_for(|c| *c) => true,
            };
            if closing_now {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            admission_t.forget(id);
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let ended =
        tokio::time::timeout(grace, async { while open.join_next().await.is_some() {} }).await;
    if ended.is_err() {
        tracing::warn!(
            connections = open.len(),
            grace_s = grace.as_secs(),
            "Connections still open after the stop signal; closing them."
        );
        open.shutdown().await;
    }
}

/// The connection's stream: TLS once its handshake is done (in the connection's own task,
/// bounded by the idle timeout as a request's headers are), else plain. `None`: the handshake
/// failed or took too long.
async fn handshake(
    tls: Option<tokio_rustls::TlsAcceptor>,
    tcp: TcpStream,
    idle: Duration,
) -> Option<Stream> {
    let Some(acceptor) = tls else {
        return Some(Stream::Plain(tcp));
    };
    match tokio::time::timeout(idle, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => Some(Stream::Tls(Box::new(s))),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed.");
            None
        }
        Err(_) => None,
    }
}

/// A connection's bytes: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

macro_rules! each {
    ($stream:expr, $s:ident => $e:expr) => {
        match $stream {
            Stream::Plain($s) => $e,
            Stream::Tls($s) => $e,
        }
    };
}

/// A connection, with the deadline of a write the client is not taking.
struct Guarded {
    stream: Stream,
    idle: Duration,
    /// Set when a write first finds the socket's buffer full; cleared by the next write taken.
    write_deadline: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    /// What a write answered, with the rule: a `Pending` is an error once the client has taken
    /// nothing for the idle timeout (its timer wakes the task).
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.write_deadline = None;
            return polled;
        }
        let idle = self.idle;
        let deadline = self
            .write_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no bytes of the response within the idle timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(&mut self.get_mut().stream, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = each!(&mut this.stream, s => Pin::new(s).poll_write(cx, buf));
        this.after_write(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = each!(&mut this.stream, s => Pin::new(s).poll_write_vectored(cx, bufs));
        this.after_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        each!(&self.stream, s => s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(&mut self.get_mut().stream, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(&mut self.get_mut().stream, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// A request body whose rest must arrive within the idle timeout of the server first waiting
/// on it. The timer is made only then: a body that came with its headers costs nothing.
struct Timed {
    inner: Incoming,
    idle: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Timed {
    fn new(inner: Incoming, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            deadline: None,
        }
    }
}

impl hyper::body::Body for Timed {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let idle = this.idle;
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(
                        "the request body did not arrive within the idle timeout".into(),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        hyper::body::Body::size_hint(&self.inner)
    }
}
