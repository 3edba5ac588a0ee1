//! `lethe serve`: the gate over HTTP, for agent runtimes in other processes, and jobs for
//! operators.
//!
//! - Runtimes take a **lease** when they read memory, a **permit** at each acceptance point
//!   (output, tool, state), release it when the boundary ends, and listen on the
//!   **revocation stream** (server-sent events) to abort work when an erasure closes the fence.
//! - Every gate call is a transaction on the control store, through `lethe-gate`
//!   ([`lethe_gate::JournalGate`]): the in-process SQLite file of the embedded default, or the
//!   shared PostgreSQL, where the permits taken and ended at the same time share one
//!   transaction ([`lethe_gate::pg`]). The server holds no SQL of the gate and
//!   keeps no gate state of its own, so several servers over one PostgreSQL journal are one gate,
//!   and a restarted server has lost nothing.
//! - Bearer tokens carry a role and a name: `runtime` may use the gate, `operator` may also
//!   run jobs; `requester`, `approver` and `admin` are the DPO's service (`requests.rs`): a
//!   request is approved by another token than the one that made it, and the journal records
//!   both names.
//! - `/console` (`console.rs`): the DPO's pages, server-rendered, with sessions and CSRF tokens.
//! - `GET /metrics` (`metrics.rs`) and webhook alerts (`alerts.rs`) are read from the control
//!   store by one watcher loop (`watch.rs`), so a restarted server neither loses nor repeats
//!   what it reported.
//!
//! Start reading at [`run`]; the routes are in `api.rs`, the wire contract in `openapi.json`.
//! The listener and the shutdown signal are passed in (mini-redis style), so tests bind port 0.

mod alerts;
mod api;
mod conn;
mod console;
mod error;
mod metrics;
mod pool;
mod requests;
mod revocations;
mod tls;
mod watch;

use std::future::Future;
use std::sync::Arc;

use lethe_core::clock::Clock;
use lethe_engine::config::Role;
use lethe_engine::Engine;
use lethe_journal::Journal;

pub use conn::{IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_UNPROVEN};
pub use error::ApiError;
pub use revocations::MAX_WATCHED_LEASES;
pub use tls::{tls_config, TlsConfig};

/// The OpenAPI 3.1 document served at `GET /v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Everything a server needs, built by the caller.
pub struct Server {
    /// Runs jobs for `POST /v1/jobs`, and holds the targets.
    pub engine: Arc<Engine>,
    /// Connections to the control store for gate requests (at least one). Open them with the
    /// same journal URL as the engine's.
    pub journals: Vec<Journal>,
    /// One more connection for the revocation watcher.
    pub watcher_journal: Journal,
    /// Bearer tokens, their roles and names.
    pub tokens: Vec<Token>,
    /// Approvals, alerts and the watcher's period.
    pub dpo: Dpo,
    /// The gate's clock (lease TTLs).
    pub clock: Arc<dyn Clock>,
    /// Fault injection for tests; [`Hooks::default`] in production.
    pub hooks: Hooks,
    /// How often ended permits and expired leases are deleted ([`SWEEP_EVERY`] in production).
    pub sweep_every: std::time::Duration,
    /// How long a connection may stay without a byte read or written before it is closed
    /// ([`IDLE_TIMEOUT`] in production).
    pub idle_timeout: std::time::Duration,
    /// When the control store is PostgreSQL: its settings, so leases, permits and releases run
    /// on the server's own asynchronous connections (as many as `journals`) instead of a
    /// blocking thread each. `None` (SQLite) keeps every call on `journals`.
    pub postgres: Option<lethe_postgres::Settings>,
    /// TLS ([`tls_config`]): every connection is HTTPS. `None`: plain HTTP.
    pub tls: Option<TlsConfig>,
}

/// A bearer token the server accepts.
#[derive(Clone)]
pub struct Token {
    /// The token itself (a password).
    pub secret: String,
    /// What it may do.
    pub role: Role,
    /// Who holds it: journaled as who requested, approved or paused.
    pub name: String,
}

impl Token {
    /// A token named `name`.
    pub fn new(secret: impl Into<String>, role: Role, name: impl Into<String>) -> Self {
        Self {
            secret: secret.into(),
            role,
            name: name.into(),
        }
    }
}

/// Without the secret.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("role", &self.role)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A webhook alerts go to.
#[derive(Clone)]
pub struct Webhook {
    /// Where to POST.
    pub url: String,
    /// The HMAC-SHA256 key the body is signed with.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The DPO's service: approvals, alerts, and how often the control store is watched.
#[derive(Clone, Debug)]
pub struct Dpo {
    /// `POST /v1/jobs` is refused (403): every job comes from an approved request.
    pub require_approval: bool,
    /// Webhooks every alert is sent to.
    pub webhooks: Vec<Webhook>,
    /// How often the watcher reads the control store for metrics and alerts
    /// ([`WATCH_EVERY`] in production).
    pub watch_every: std::time::Duration,
    /// The first wait before a failed alert delivery is tried again; doubled each time, five
    /// tries in all ([`ALERT_BACKOFF`] in production).
    pub alert_backoff: std::time::Duration,
    /// How long a console session lasts after its last use ([`SESSION_TTL`] in production).
    pub session_ttl: std::time::Duration,
}

impl Default for Dpo {
    fn default() -> Self {
        Self {
            require_approval: false,
            webhooks: Vec::new(),
            watch_every: WATCH_EVERY,
            alert_backoff: ALERT_BACKOFF,
            session_ttl: SESSION_TTL,
        }
    }
}

/// How often `lethe serve` reads the control store for its metrics and alerts.
pub const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a console session lasts after its last use.
pub const SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The first retry's wait for an alert's delivery.
pub const ALERT_BACKOFF: std::time::Duration = std::time::Duration::from_secs(2);

/// Points where a test can stop a request to force an ordering (never a sleep). Each hook runs
/// on the request's blocking thread.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Runs after a permit request is parsed and authorized, just before the gate's atomic
    /// check-and-register: a test closes the fence here.
    pub before_permit: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("before_permit", &self.before_permit.is_some())
            .finish()
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("journals", &self.journals.len())
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

/// Serves until `shutdown` resolves, then stops accepting, ends every revocation stream and
/// finishes the requests in flight. Jobs started over HTTP keep running in their threads until
/// the process exits; a job cut short resumes like any other (`lethe work`, `lethe resume`).
pub async fn run(
    listener: tokio::net::TcpListener,
    server: Server,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let idle_timeout = server.idle_timeout;
    let tls = server.tls.map(tokio_rustls::TlsAcceptor::from);
    let authority_lost = server.watcher_journal.gate_authority_lost();
    let watchers = revocations::Watchers::start(server.watcher_journal, stop_rx.clone());
    let pg = server
        .postgres
        .map(|s| Arc::new(lethe_gate::pg::PgGate::new(s, server.journals.len())));
    let state = api::State {
        pg,
        engine: Arc::new(pool::DropOffRuntime::new(server.engine)),
        pool: Arc::new(pool::Pool::new(server.journals)),
        tokens: Arc::new(server.tokens),
        clock: server.clock,
        hooks: server.hooks,
        watchers,
        stop: stop_rx,
        authority_lost,
        require_approval: server.dpo.require_approval,
        metrics: Arc::new(metrics::Metrics::new()),
        sessions: Arc::new(console::Sessions::new(
            server.dpo.session_ttl,
            tls.is_some(),
        )),
    };
    tokio::spawn(watch::watch(
        state.clone(),
        server.dpo.webhooks,
        server.dpo.watch_every,
        server.dpo.alert_backoff,
    ));
    tokio::spawn(sweep(
        Arc::clone(&state.pool),
        Arc::clone(&state.clock),
        server.sweep_every,
        state.stop.clone(),
    ));
    let addr = listener.local_addr()?;
    tracing::info!(%addr, tls = tls.is_some(), "Gate listening.");
    let tokens = Arc::clone(&state.tokens);
    conn::serve(
        listener,
        api::router(state),
        Arc::new(move |headers: &axum::http::HeaderMap| api::bearer(&tokens, headers).is_ok()),
        idle_timeout,
        tls,
        SHUTDOWN_GRACE,
        async move {
            shutdown.await;
            tracing::info!("Shutting down: no new connections; ending revocation streams.");
            let _ = stop_tx.send(true);
        },
    )
    .await;
    Ok(())
}

/// How long a stop waits for open connections to end before it drops them.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How often `lethe serve` deletes ended permits and expired leases (`Journal::sweep_gate`).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Deletes, every `every`, what the gate no longer needs, until `stop`.
async fn sweep(
    pool: Arc<pool::Pool>,
    clock: Arc<dyn Clock>,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // The first sweep one period after the start, not at once: a sweep that ran whenever the
    // runtime got to it raced the first requests (a test saw a just-released permit deleted).
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let (pool, now) = (Arc::clone(&pool), clock.now());
        // Bounded rounds: a backlog is worked off over several ticks, never in one long lock.
        match tokio::task::spawn_blocking(move || {
            pool.with(|j| lethe_gate::JournalGate::new(j).sweep(now, 50_000))
        })
        .await
        {
            Ok(Ok((permits, leases))) if permits + leases > 0 => {
                tracing::info!(permits, leases, "Gate swept.");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "Gate sweep failed; retried next round."),
            Err(_) => return,
        }
    }
}
