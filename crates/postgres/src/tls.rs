//! TLS to PostgreSQL over OpenSSL: what `postgres-openssl` does, with two differences.
//!
//! - **System roots are loaded only when a connection trusts them** (`verify-ca`/`verify-full`
//!   without `sslrootcert`, or `sslrootcert=system`). OpenSSL parses the whole system bundle
//!   when a context takes the default paths: 26-45 ms on the 2-core VM of bench/README.md,
//!   paid once per process, at start-up, by every `lethe` command, although `prefer` and
//!   `require` never look at a root and a `sslrootcert` file replaces them. libpq does not
//!   load them either.
//! - **A synchronous connection polls before it sleeps.** A synchronous `postgres::Client`
//!   drives its connection on a current-thread runtime, which sleeps in `epoll_wait` when a
//!   reply is not there yet; on a VM the wake-up costs about as much as a short statement, and
//!   a job sends hundreds of statements one after another. After each write, a read that
//!   finds nothing wakes its own task for up to [`POLL_BEFORE_SLEEP`] (the runtime then checks
//!   the socket with a zero timeout and polls again, yielding the core in between), then
//!   sleeps as before. Asynchronous connections (`lethe serve`) never poll: there a task that
//!   woke itself would hold a worker thread the HTTP side needs. A plain (`sslmode=disable`)
//!   connection never reaches this module, so it does not poll either.
//!
//! Everything else is as `SslConnector` sets it up: its options, modes and cipher list, SNI
//! for host names, host name checks without partial wildcards, and the `tls-server-end-point`
//! channel binding for SCRAM.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions, SslRef, SslVerifyMode,
};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::verify::X509CheckFlags;
use openssl::x509::{X509VerifyResult, X509};
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio_openssl::SslStream;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream as PgTlsStream};

/// How long after a write a synchronous connection's read polls instead of sleeping (the
/// Redis client's budget too, `redis/resp.rs`).
pub const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(250);

/// How every connection of one `Settings` does TLS.
#[derive(Clone)]
pub struct Tls {
    ctx: SslContext,
    /// Verify the server's chain (against `roots`, or the context's system roots).
    check_chain: bool,
    /// Verify that the certificate names the host connected to.
    check_host: bool,
    /// The roots of `sslrootcert`: these and no others.
    roots: Option<Arc<Vec<X509>>>,
    /// Poll before sleeping (synchronous connections only).
    poll: bool,
}

impl Tls {
    /// `roots`: `sslrootcert`'s certificates, or `None` for the system's (loaded only if a
    /// chain is checked).
    pub(crate) fn new(
        check_chain: bool,
        check_host: bool,
        roots: Option<Arc<Vec<X509>>>,
    ) -> Result<Self, ErrorStack> {
        let system = check_chain && roots.is_none();
        Ok(Self {
            ctx: context(system)?,
            check_chain,
            check_host,
            roots,
            poll: false,
        })
    }

    /// The same, for a synchronous client: its reads poll before they sleep.
    pub(crate) fn polling(&self) -> Self {
        Self {
            poll: true,
            ..self.clone()
        }
    }

    /// How many certificates the shared context trusts before a connection adds its own.
    #[cfg(test)]
    pub(crate) fn context_roots(&self) -> usize {
        self.ctx.cert_store().all_certificates().len()
    }

    fn ssl(&self, domain: &str) -> Result<Ssl, ErrorStack> {
        let mut ssl = Ssl::new(&self.ctx)?;
        if self.check_chain {
            ssl.set_verify(SslVerifyMode::PEER);
            if let Some(roots) = &self.roots {
                let mut store = X509StoreBuilder::new()?;
                for r in roots.iter() {
                    store.add_cert(r.clone())?;
                }
                ssl.set_verify_cert_store(store.build())?;
            }
        } else {
            ssl.set_verify(SslVerifyMode::NONE);
        }
        // No name: a Unix-domain socket in a list of hosts (the server answers "no TLS" there,
        // and the driver never starts a handshake without a host name).
        if domain.is_empty() {
            return Ok(ssl);
        }
        let ip = domain.parse::<IpAddr>();
        if ip.is_err() {
            ssl.set_hostname(domain)?;
        }
        if self.check_host {
            let param = ssl.param_mut();
            param.set_hostflags(X509CheckFlags::NO_PARTIAL_WILDCARDS);
            match ip {
                Ok(ip) => param.set_ip(ip)?,
                Err(_) => param.set_host(domain)?,
            }
        }
        Ok(ssl)
    }
}

/// The process's client contexts: one without roots, one with the system's, each built on
/// first use. A cache of immutable values, not state.
fn context(system_roots: bool) -> Result<SslContext, ErrorStack> {
    static BARE: OnceLock<SslContext> = OnceLock::new();
    static SYSTEM: OnceLock<SslContext> = OnceLock::new();
    let cell = if system_roots { &SYSTEM } else { &BARE };
    if let Some(c) = cell.get() {
        return Ok(c.clone());
    }
    // As `SslConnector::builder`, less its `set_default_verify_paths` unless asked.
    let mut b = SslContextBuilder::new(SslMethod::tls_client())?;
    let mut opts = SslOptions::ALL
        | SslOptions::NO_COMPRESSION
        | SslOptions::NO_SSLV2
        | SslOptions::NO_SSLV3
        | SslOptions::SINGLE_DH_USE
        | SslOptions::SINGLE_ECDH_USE;
    opts &= !SslOptions::DONT_INSERT_EMPTY_FRAGMENTS;
    b.set_options(opts);
    b.set_mode(
        SslMode::AUTO_RETRY
            | SslMode::ACCEPT_MOVING_WRITE_BUFFER
            | SslMode::ENABLE_PARTIAL_WRITE
            | SslMode::RELEASE_BUFFERS,
    );
    b.set_cipher_list("DEFAULT:!aNULL:!eNULL:!MD5:!3DES:!DES:!RC4:!IDEA:!SEED:!aDSS:!SRP:!PSK")?;
    b.set_verify(SslVerifyMode::PEER);
    if system_roots {
        b.set_default_verify_paths()?;
    }
    Ok(cell.get_or_init(|| b.build()).clone())
}

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = Connect;
    type Error = ErrorStack;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, ErrorStack> {
        Ok(Connect {
            ssl: self.ssl(domain)?,
            poll: self.poll,
        })
    }
}

/// One connection's handshake.
pub struct Connect {
    ssl: Ssl,
    poll: bool,
}

type Handshake<S> = Pin<Box<dyn Future<Output = Result<TlsStream<S>, ConnectError>> + Send>>;

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = ConnectError;
    type Future = Handshake<S>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let mut s = SslStream::new(self.ssl, BufReader::with_capacity(8192, stream))
                .map_err(|e| ConnectError(e.to_string()))?;
            match Pin::new(&mut s).connect().await {
                Ok(()) => Ok(TlsStream {
                    inner: s,
                    poll: self.poll,
                    since: None,
                }),
                Err(e) => {
                    let verify = s.ssl().verify_result();
                    Err(ConnectError(if verify == X509VerifyResult::OK {
                        e.to_string()
                    } else {
                        format!("{e}: {verify}")
                    }))
                }
            }
        })
    }
}

/// A failed handshake: OpenSSL's error and, when the chain was refused, why.
#[derive(Debug)]
pub struct ConnectError(String);

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

/// A TLS connection; see the module's text for `poll`.
pub struct TlsStream<S> {
    inner: SslStream<BufReader<S>>,
    poll: bool,
    /// When the current wait began (the first read that found nothing since the last write or
    /// the last bytes read); `None` while no wait is running.
    since: Option<Instant>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Pending => {
                if this.poll {
                    let since = *this.since.get_or_insert_with(Instant::now);
                    if since.elapsed() < POLL_BEFORE_SLEEP {
                        // Woken at once: the runtime checks the socket without sleeping,
                        // then polls again. Any other runnable thread gets the core first.
                        std::thread::yield_now();
                        cx.waker().wake_by_ref();
                    }
                }
                Poll::Pending
            }
            ready => {
                this.since = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            // A request went out: its reply is worth polling for.
            this.since = None;
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> PgTlsStream for TlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match server_end_point(self.inner.ssl()) {
            Some(digest) => ChannelBinding::tls_server_end_point(digest),
            None => ChannelBinding::none(),
        }
    }
}

/// RFC 5929 `tls-server-end-point`: the server certificate's digest with its signature's hash
/// (SHA-256 in place of MD5 and SHA-1).
fn server_end_point(ssl: &SslRef) -> Option<Vec<u8>> {
    let cert = ssl.peer_certificate()?;
    let algs = cert
        .signature_algorithm()
        .object()
        .nid()
        .signature_algorithms()?;
    let md = match algs.digest {
        Nid::MD5 | Nid::SHA1 => MessageDigest::sha256(),
        nid => MessageDigest::from_nid(nid)?,
    };
    cert.digest(md).ok().map(|d| d.to_vec())
}
