//! The connections `lethe serve` accepts: at most [`MAX_CONNECTIONS`] at once, each closed once
//! nothing was read or written on it for its idle timeout (a client that sends half a request,
//! or none, would otherwise hold a descriptor forever). A revocation stream writes a keepalive
//! every 15 s, so an idle timeout above that never cuts one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The most connections served at once; past it, new ones wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 4096;

/// How long a connection may stay without a byte read or written ([`crate::Server`]'s
/// `idle_timeout` in production).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct Limited {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    idle: Duration,
}

impl Limited {
    pub(crate) fn new(inner: TcpListener, idle: Duration) -> Self {
        Self {
            inner,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            idle,
        }
    }
}

impl axum::serve::Listener for Limited {
    type Io = Guarded;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Guarded, std::net::SocketAddr) {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        // Small request/response pairs: never hold a segment back waiting for an ACK.
        let _ = tcp.set_nodelay(true);
        let guarded = Guarded {
            tcp,
            _slot: slot,
            idle: self.idle,
            deadline: Box::pin(tokio::time::sleep(self.idle)),
        };
        (guarded, addr)
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection holding its slot, with its idle deadline.
pub(crate) struct Guarded {
    tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Guarded {
    fn touched(&mut self) {
        let at = Instant::now() + self.idle;
        self.deadline.as_mut().reset(at);
    }

    /// What the socket answered, with the idle rule: any answer restarts the deadline; a
    /// `Pending` is an error once the deadline passed (its timer wakes the task).
    fn after<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.touched();
            return polled;
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle past its timeout",
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
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_read(cx, buf);
        this.after(cx, polled)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write(cx, buf);
        this.after(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        this.after(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}
