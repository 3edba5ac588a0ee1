//! `lethe serve`: reads `[serve]`, opens the control-store connections, binds, and hands over
//! to [`lethe_server::run`] with Ctrl-C / SIGTERM as the shutdown signal.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use lethe_core::clock::SystemClock;
use lethe_engine::{Config, Engine};
use lethe_journal::Journal;

use crate::exit::{bad, Exit};

pub(crate) fn run(config: &Path, listen: Option<String>) -> Result<i32, Exit> {
    let cfg = Config::load(config).map_err(crate::exit::config)?;
    if cfg.serve.tokens.is_empty() {
        return Err(bad(
            "[serve] has no token: add [[serve.token]] with role = \"runtime\" (or \"operator\") and token_file = \"PATH\"",
        ));
    }
    let mut tokens = Vec::new();
    let mut seen = BTreeSet::new();
    for t in &cfg.serve.tokens {
        let shown = t.token_file.display();
        let token = crate::secret::read_secret_file(&t.token_file, "serve.token_file")?;
        if !seen.insert(token.clone()) {
            return Err(bad(format!(
                "serve.token_file {shown}: the same token is listed twice"
            )));
        }
        tokens.push(lethe_server::Token::new(token, t.role, t.name.clone()));
    }
    let mut webhooks = Vec::new();
    for a in &cfg.serve.alerts {
        let secret = crate::secret::read_secret_file(&a.secret_file, "serve.alert secret_file")?;
        webhooks.push(lethe_server::Webhook {
            url: a.url.clone(),
            secret: secret.into_bytes(),
        });
    }
    let dpo = lethe_server::Dpo {
        require_approval: cfg.serve.require_approval,
        webhooks,
        ..lethe_server::Dpo::default()
    };
    // A journal URL the server refuses as configured (no such database, a role it does not
    // know) is the configuration's error, as for every other command (review).
    let open = || {
        Journal::open_url(&cfg.journal, &cfg.base)
            .map_err(|e| Exit::from(lethe_engine::EngineError::from(e)))
    };
    let journals = (0..cfg.serve.pool)
        .map(|_| open())
        .collect::<Result<Vec<_>, _>>()?;
    let watcher_journal = open()?;
    // One authority per journal: not while an in-process gate grants permits over it, and no
    // in-process gate may load while this server does (review: neither was refused).
    watcher_journal
        .share_gate_authority()
        .map_err(|e| match e {
            lethe_journal::JournalError::GateAuthority => Exit(
                3,
                anyhow::anyhow!(
                "another process's in-process gate (Engine::memory_gate) governs this journal: \
                 its permits live in that process, and `lethe serve` would grant others it \
                 never sees. Stop that process first, or serve another journal"
            ),
            ),
            e => Exit(1, e.into()),
        })?;
    let postgres =
        if cfg.journal.starts_with("postgres://") || cfg.journal.starts_with("postgresql://") {
            Some(lethe_postgres::Settings::from_url(&cfg.journal, &cfg.base).map_err(bad)?)
        } else {
            None
        };
    let listen = listen.unwrap_or_else(|| cfg.serve.listen.clone());
    let allow_plain_http = cfg.serve.allow_plain_http;
    let tls = match &cfg.serve.tls {
        Some(t) => Some(lethe_server::tls_config(&t.cert_file, &t.key_file).map_err(bad)?),
        None => None,
    };
    let engine = Arc::new(Engine::open(cfg, Arc::new(SystemClock))?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Exit(1, e.into()))?;
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .map_err(|e| bad(format!("cannot listen on {listen}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| Exit(1, e.into()))?;
        // Plain HTTP off the machine sends every bearer token readable across the network.
        if tls.is_none() && !addr.ip().is_loopback() {
            if !allow_plain_http {
                return Err(bad(format!(
                    "refusing to listen on {addr} over plain HTTP: bearer tokens are passwords, \
                     and every request would carry one readable across the network. Listen on \
                     a loopback address (127.0.0.1:7400) behind a TLS proxy, give [serve] tls = \
                     {{ cert_file, key_file }}, or set \
                     allow_plain_http = true in [serve] for a network you trust"
                )));
            }
            tracing::warn!(%addr, "Listening on a non-loopback address over plain HTTP (allow_plain_http = true): bearer tokens cross the network readable.");
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        outln!("Listening on {scheme}://{addr}");
        let _ = std::io::stdout().flush();
        let server = lethe_server::Server {
            engine,
            journals,
            watcher_journal,
            tokens,
            dpo,
            clock: Arc::new(SystemClock),
            hooks: lethe_server::Hooks::default(),
            sweep_every: lethe_server::SWEEP_EVERY,
            idle_timeout: lethe_server::IDLE_TIMEOUT,
            postgres,
            tls,
        };
        lethe_server::run(listener, server, shutdown_signal())
            .await
            .map_err(|e| Exit(1, e.into()))
    });
    // A gate call still waiting on the control store (a lock, a slow disk) runs on a blocking
    // thread the stop cannot cut; dropping the runtime would wait for it. Its transaction is
    // rolled back when the process ends, so the stop stays bounded.
    runtime.shutdown_timeout(lethe_server::SHUTDOWN_GRACE);
    served?;
    Ok(0)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
