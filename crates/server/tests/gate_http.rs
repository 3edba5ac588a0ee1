//! `lethe serve` end to end over real HTTP, with the Rust client: one suite run against both
//! control stores (a SQLite file; PostgreSQL at LETHE_PG15_URL, each test its own database).
//! Targets are copies of the real-LangGraph SQLite fixtures, so jobs really erase.
//!
//! Orderings are forced with hooks and channels, never with sleeps.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use lethe_client::{Client, Permit, Sink};
use lethe_core::clock::{Clock, ManualClock, SystemClock};
use lethe_core::{MemoryId, Scope, Subject, Tenant};
use lethe_engine::config::Role;
use lethe_engine::{Config, Engine, RunOptions};
use lethe_journal::Journal;
use lethe_server::{Dpo, Hooks, Server, Token};
use serde_json::{json, Value};

const RUNTIME: &str = "runtime-token-for-tests-0001";
const OPERATOR: &str = "operator-token-for-tests-0001";

/// The demo's targets under a `[control]` whose journal is `JOURNAL`, replaced per backend.
static CONFIG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        r#"
[control]
journal = "JOURNAL"
policy_version = "test-1"

{}"#,
        lethe_test_support::TARGETS
    )
});

static N: AtomicUsize = AtomicUsize::new(0);

/// Where the control store lives.
#[derive(Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// A config folder with fixture copies, and a running server over it.
struct Env {
    dir: tempfile::TempDir,
    journal: String,
    engine: Arc<Engine>,
    clock: Arc<dyn Clock>,
    addr: String,
    sweep_every: Duration,
    idle_timeout: Duration,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

fn journal_url(backend: Backend, dir: &Path) -> String {
    match backend {
        Backend::Sqlite => format!("sqlite:{}", dir.join("journal.db").display()),
        Backend::Postgres => {
            let admin = std::env::var("LETHE_PG15_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
            let name = format!(
                "lethe_srv_{}_{}",
                std::process::id(),
                N.fetch_add(1, SeqCst)
            );
            let mut c = postgres::Client::connect(&admin, postgres::NoTls)
                .expect("PostgreSQL reachable (scripts/test)");
            // REPEATABLE READ by default, as a deployment may set: the server's connections
            // must ask for READ COMMITTED themselves (`lethe_postgres::SESSION`).
            c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
            c.batch_execute(&format!(
                "ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'"
            ))
            .unwrap();
            format!("{}/{name}", admin.rsplit_once('/').unwrap().0)
        }
    }
}

impl Env {
    fn new(backend: Backend, clock: Arc<dyn Clock>) -> Self {
        Self::with_hooks(backend, clock, Hooks::default())
    }

    fn with_hooks(backend: Backend, clock: Arc<dyn Clock>, hooks: Hooks) -> Self {
        // The sweep would delete the ended permits other tests count: off (hourly) unless asked.
        Self::with(backend, clock, hooks, Duration::from_secs(3600))
    }

    fn with(backend: Backend, clock: Arc<dyn Clock>, hooks: Hooks, sweep_every: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        let journal = journal_url(backend, dir.path());
        let cfg = Config::parse(&CONFIG.replace("JOURNAL", &journal), dir.path(), "test").unwrap();
        let engine = Arc::new(Engine::open(cfg, Arc::clone(&clock)).unwrap());
        let mut env = Self {
            dir,
            journal,
            engine,
            clock,
            addr: String::new(),
            sweep_every,
            idle_timeout: lethe_server::IDLE_TIMEOUT,
            stop: None,
            thread: None,
        };
        env.start(hooks);
        env
    }

    /// Starts a server (again) over the same journal and targets.
    fn start(&mut self, hooks: Hooks) {
        let open = || Journal::open_url(&self.journal, self.dir.path()).unwrap();
        let server = Server {
            engine: Arc::clone(&self.engine),
            journals: (0..4).map(|_| open()).collect(),
            watcher_journal: open(),
            tokens: vec![
                Token::new(RUNTIME, Role::Runtime, "runtime"),
                Token::new(OPERATOR, Role::Operator, "operator"),
            ],
            dpo: Dpo::default(),
            clock: Arc::clone(&self.clock),
            hooks,
            sweep_every: self.sweep_every,
            idle_timeout: self.idle_timeout,
            // PostgreSQL: the asynchronous gate path, as `lethe serve` runs it.
            tls: None,
            postgres: self.journal.starts_with("postgres").then(|| {
                lethe_postgres::Settings::from_url(&self.journal, self.dir.path()).unwrap()
            }),
        };
        let s = common::spawn(server);
        self.addr = s.addr;
        self.stop = Some(s.stop);
        self.thread = Some(s.thread);
    }

    /// Graceful shutdown; returns what `run` returned.
    fn shutdown(&mut self) -> std::io::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap()
    }

    fn runtime(&self) -> Client {
        Client::new(&self.addr, RUNTIME)
    }

    fn operator(&self) -> Client {
        Client::new(&self.addr, OPERATOR)
    }

    /// Asks for a subject erasure over HTTP; returns the job id.
    fn erase(&self, subject: &str, drain_timeout_s: u64) -> String {
        let v = self
            .operator()
            .create_job(
                &json!({"tenant": "acme", "subject": subject, "basis": "gdpr-art17",
                "ticket": "T-1", "drain_timeout_s": drain_timeout_s}),
            )
            .unwrap();
        v["job_id"].as_str().unwrap().to_string()
    }

    fn job(&self, id: &str) -> Value {
        self.operator().job(id).unwrap()
    }

    /// Waits (bounded) until the job leaves REQUESTED: its fence is closed.
    fn wait_frozen(&self, id: &str) {
        self.wait_job(id, |v| v["state"] != "REQUESTED");
    }

    fn wait_job(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.job(id);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "job never got there: {v}");
            std::thread::yield_now();
        }
    }

    /// Counts rows in the control store, behind the server's back.
    fn count(&self, sql: &str) -> i64 {
        if let Some(path) = self.journal.strip_prefix("sqlite:") {
            let c = rusqlite::Connection::open(path).unwrap();
            return c.query_row(sql, [], |r| r.get(0)).unwrap();
        }
        let mut c = postgres::Client::connect(&self.journal, postgres::NoTls).unwrap();
        c.query_one(sql, &[]).unwrap().get(0)
    }

    /// Permit rows registered for a lease.
    fn permits_of(&self, lease: i64) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM permits WHERE lease_id = {lease}"
        ))
    }

    /// A lease's permits still active (neither released nor cancelled).
    fn active_permits_of(&self, lease: i64) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM permits WHERE lease_id = {lease} AND state = 'active'"
        ))
    }

    /// Permit rows registered for a subject's leases.
    fn permits_for(&self, subject: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM permits p JOIN leases l ON l.lease_id = p.lease_id WHERE l.subject = '{subject}'"
        ))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.stop.is_some() {
            let _ = self.shutdown();
        }
        if let Some((base, name)) = self
            .journal
            .starts_with("postgres")
            .then(|| self.journal.rsplit_once('/'))
            .flatten()
        {
            // FORCE: the engine's own connections are still open.
            if let Ok(mut c) =
                postgres::Client::connect(&format!("{base}/postgres"), postgres::NoTls)
            {
                let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// Runtime workers in a loop of take-permit, release, until stopped: each for one
/// (tenant, subject), on its own lease and its own HTTP client. The only refusal a worker
/// accepts is `revoked`; any other error fails the test. With `swap`, a worker holds each
/// permit until its next request, which takes the next permit and releases it in one round
/// trip; a refused request has released it too, so the worker holds nothing after a refusal.
struct PermitWorkers {
    stop: Arc<AtomicBool>,
    granted: Arc<AtomicUsize>,
    refused_workers: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<WorkerReport>>,
}

/// What one worker saw.
struct WorkerReport {
    tenant: &'static str,
    subject: &'static str,
    lease: i64,
    ok: u64,
    ok_after_refusal: u64,
    refused: u64,
}

impl PermitWorkers {
    /// Starts one worker per entry of `scopes`; returns once every worker holds its lease.
    fn start(addr: &str, scopes: &[(&'static str, &'static str)], sink: Sink, swap: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let granted = Arc::new(AtomicUsize::new(0));
        let refused_workers = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(scopes.len() + 1));
        let threads = scopes
            .iter()
            .enumerate()
            .map(|(i, &(tenant, subject))| {
                let (addr, stop, granted, start, refused_workers) = (
                    addr.to_string(),
                    Arc::clone(&stop),
                    Arc::clone(&granted),
                    Arc::clone(&start),
                    Arc::clone(&refused_workers),
                );
                std::thread::spawn(move || {
                    let c = Client::new(addr, RUNTIME);
                    let lease = c.take_lease(tenant, subject, &[], 600_000).unwrap();
                    start.wait();
                    let (mut ok, mut ok_after_refusal, mut refused) = (0u64, 0u64, 0u64);
                    let mut held = None;
                    while !stop.load(SeqCst) {
                        let taken = match held.take() {
                            Some(prev) => c.take_permit_releasing(lease.lease_id, sink, &prev).map(
                                |(p, released)| {
                                    assert!(released, "worker {i}: its permit was still active");
                                    p
                                },
                            ),
                            None => c.take_permit(lease.lease_id, sink),
                        };
                        match taken {
                            Ok(p) => {
                                ok += 1;
                                granted.fetch_add(1, SeqCst);
                                if refused > 0 {
                                    ok_after_refusal += 1;
                                }
                                if swap {
                                    held = Some(p);
                                } else {
                                    c.release_permit(p).unwrap();
                                }
                            }
                            Err(e) => {
                                assert_eq!(code(e), "revoked", "worker {i} ({tenant}/{subject})");
                                if refused == 0 {
                                    refused_workers.fetch_add(1, SeqCst);
                                }
                                refused += 1;
                            }
                        }
                    }
                    if let Some(p) = held {
                        c.release_permit(p).unwrap();
                    }
                    WorkerReport {
                        tenant,
                        subject,
                        lease: lease.lease_id,
                        ok,
                        ok_after_refusal,
                        refused,
                    }
                })
            })
            .collect();
        start.wait();
        Self {
            stop,
            granted,
            refused_workers,
            threads,
        }
    }

    fn granted(&self) -> usize {
        self.granted.load(SeqCst)
    }

    /// Waits (bounded) until `n` more permits were granted, from now, and `refused` workers met
    /// a refusal.
    fn wait_for(&self, n: usize, refused: usize) {
        let (target, deadline) = (self.granted() + n, Instant::now() + Duration::from_secs(60));
        while self.granted() < target || self.refused_workers.load(SeqCst) < refused {
            assert!(Instant::now() < deadline, "the workers never got there");
            std::thread::yield_now();
        }
    }

    fn stop(self) -> Vec<WorkerReport> {
        self.stop.store(true, SeqCst);
        self.threads
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect()
    }
}

fn code(e: lethe_client::Error) -> String {
    e.code().unwrap_or("not a refusal").to_string()
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(super::Backend::Sqlite) } )*
        }
        mod postgres_backend {
            $( #[test] fn $name() { super::$name(super::Backend::Postgres) } )*
        }
    };
}

both!(
    permit_round_trip_roles_and_refusals,
    every_documented_route_is_served,
    revocation_is_pushed_on_the_stream,
    thirty_two_workers_get_no_permit_after_the_fence_closes,
    thirty_two_swapping_workers_get_no_permit_after_the_fence_closes,
    a_take_carrying_a_release_ends_that_permit_whatever_the_answer,
    a_permit_checked_after_the_close_is_refused_and_the_sink_admits_nothing,
    a_permit_held_forever_leaves_the_job_blocked_whatever_the_lease_ttl,
    a_renewed_lease_keeps_a_long_run_going_until_an_erasure_revokes_it,
    memory_scope_revokes_only_the_lease_that_read_that_version,
    shutdown_ends_revocation_streams,
    a_half_sent_request_does_not_hold_the_stop,
    bearer_in_any_case_and_no_echo_of_a_bad_basis,
    a_stream_for_a_gone_lease_reports_it_revoked,
    an_idle_connection_is_closed_after_the_timeout,
    a_slow_answer_is_not_cut_by_the_idle_timeout,
    a_take_sent_again_with_its_key_gets_its_permit_back_and_the_job_drains,
    a_permit_taken_without_a_key_ends_only_with_the_key_the_gate_named,
    a_client_trickling_headers_or_a_body_is_closed,
    a_restarted_server_keeps_fences_and_revocations,
    the_server_sweeps_expired_leases_and_ended_permits,
    permits_of_many_scopes_while_three_freeze_at_once,
    a_held_job_is_refused_at_once_over_http,
    every_refusal_of_a_malformed_request_has_the_api_shape,
    no_name_or_value_the_caller_sent_is_echoed,
    a_caller_without_a_token_is_refused_before_its_body_is_read,
);

/// PostgreSQL ends the server's connections (a restart, a failover, an administrator): the
/// requests in flight at that moment fail as `unavailable` (retryable), never as a refusal, and
/// the next ones reconnect; the permits taken before and after are all registered and release.
#[test]
fn postgres_connections_cut_under_the_server_are_reopened() {
    let env = Env::new(Backend::Postgres, Arc::new(SystemClock));
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "bob", &[], 600_000).unwrap();
    let before = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    let (base, db) = env.journal.rsplit_once('/').unwrap();
    let mut admin =
        postgres::Client::connect(&format!("{base}/postgres"), postgres::NoTls).unwrap();
    let cut: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
              WHERE datname = $1 AND application_name = 'lethe-serve'",
            &[&db],
        )
        .unwrap()
        .get(0);
    assert!(
        cut >= 2,
        "the lease's and the permit's connections were cut ({cut})"
    );
    let mut taken = Vec::new();
    let mut unavailable = 0;
    while taken.len() < 3 {
        match rt.take_permit(lease.lease_id, Sink::State) {
            Ok(p) => taken.push(p),
            Err(e) => {
                assert_eq!(
                    code(e),
                    "unavailable",
                    "a cut connection is retryable, not a refusal"
                );
                unavailable += 1;
                assert!(unavailable < 10, "the server never reconnected");
            }
        }
    }
    for p in taken.iter().chain([&before]) {
        rt.release_permit(p.clone()).unwrap();
    }
    assert_eq!(env.permits_of(lease.lease_id), 4);
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM permits WHERE lease_id = {} AND state = 'released'",
            lease.lease_id
        )),
        4
    );
    // Leases too (each of the server's lease connections reconnects on its first failure).
    let mut failures = 0;
    while let Err(e) = rt.take_lease("acme", "carol", &[], 60_000) {
        assert_eq!(code(e), "unavailable");
        failures += 1;
        assert!(failures < 10, "the lease connections never reconnected");
    }
}

/// A take that waits on a freeze's scope lock holds back no release: ends have their own worker
/// and connection (`pg.rs`). Here an open transaction holds the subject's lock as a freeze
/// does; a take for that subject waits in PostgreSQL; a release of the same lease's earlier
/// permit is answered meanwhile, and the take is granted once the lock goes.
#[test]
fn a_release_is_answered_while_a_take_waits_on_a_freezes_lock() {
    let env = Env::new(Backend::Postgres, Arc::new(SystemClock));
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "bob", &[], 600_000).unwrap();
    let held = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    let mut freeze = postgres::Client::connect(&env.journal, postgres::NoTls).unwrap();
    let mut lock = freeze.transaction().unwrap();
    lock.execute(
        "SELECT pg_advisory_xact_lock(1818588265, hashtext('acme' || chr(31) || 'bob'))",
        &[],
    )
    .unwrap();
    let (took_tx, took) = mpsc::channel();
    let taker = env.runtime();
    let lease_id = lease.lease_id;
    std::thread::spawn(move || {
        let _ = took_tx.send(taker.take_permit(lease_id, Sink::State));
    });
    // Until the take's batch waits on the lock inside PostgreSQL.
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.count(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lethe-serve' \
          AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
    ) == 0
    {
        assert!(Instant::now() < deadline, "the take never reached the lock");
        std::thread::yield_now();
    }
    let (released_tx, released) = mpsc::channel();
    let releaser = env.runtime();
    std::thread::spawn(move || {
        let _ = released_tx.send(releaser.release_permit(held));
    });
    // A release queued behind the waiting take would wait as long as the lock is held: the
    // bound turns that into a failure instead of a hang.
    let answer = released.recv_timeout(Duration::from_secs(20));
    let waiting = took.try_recv().is_err();
    lock.commit().unwrap();
    answer
        .expect("the release was answered while the take waited on the lock")
        .unwrap();
    assert!(
        waiting,
        "the take was still waiting when the release was answered"
    );
    let p = took.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    rt.release_permit(p).unwrap();
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM permits WHERE lease_id = {} AND state = 'released'",
            lease.lease_id
        )),
        2
    );
}

fn permit_round_trip_roles_and_refusals(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let rt = env.runtime();
    let lease = rt
        .take_lease("acme", "bob", &[("memories/k", "v1")], 60_000)
        .unwrap();
    // With the lease, the database guard's fencing token: the gate's MAC under the deployment
    // key over the lease, its epochs and owner, which a runtime copies into what it writes.
    assert_eq!(
        lease.token,
        env.engine.key().guard_key().token(
            lease.lease_id,
            lease.epoch,
            lease.tenant_epoch,
            "acme",
            "bob"
        )
    );
    let p = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    rt.release_permit(p.clone()).unwrap();
    assert_eq!(code(rt.release_permit(p).unwrap_err()), "no_such_permit");
    assert_eq!(
        code(rt.take_permit(999_999, Sink::State).unwrap_err()),
        "no_such_lease"
    );
    assert!(!rt.is_revoked(lease.lease_id).unwrap());

    let anon = Client::new(&env.addr, "not-a-token-at-all-000");
    assert_eq!(
        code(anon.take_permit(lease.lease_id, Sink::Tool).unwrap_err()),
        "unauthorized"
    );
    let e = rt.create_job(
        &json!({"tenant": "acme", "subject": "bob", "basis": "gdpr-art17", "ticket": "T"}),
    );
    assert_eq!(
        code(e.unwrap_err()),
        "forbidden",
        "a runtime token cannot run jobs"
    );

    // Malformed input: clear codes, nothing registered.
    let bad = rt.call(
        "POST",
        "/v1/permits",
        Some(&json!({"lease_id": lease.lease_id, "sink": "email"})),
    );
    assert_eq!(code(bad.unwrap_err()), "bad_request");
    let bad = rt.call(
        "POST",
        "/v1/leases",
        Some(&json!({"tenant": "acme", "subject": "bob", "colour": 1})),
    );
    assert_eq!(
        code(bad.unwrap_err()),
        "bad_request",
        "unknown fields are refused"
    );
    let bad = rt.call(
        "POST",
        "/v1/leases",
        Some(&json!({"tenant": "", "subject": "bob"})),
    );
    assert_eq!(code(bad.unwrap_err()), "bad_request");
    assert_eq!(
        env.permits_of(lease.lease_id),
        1,
        "only the one permit was registered"
    );
    let e = env.operator().create_job(&json!({"tenant": "acme", "subject": "bob", "basis": "gdpr-art17", "ticket": "T", "extra": 1}));
    assert_eq!(code(e.unwrap_err()), "bad_request");
    // A value of the wrong type is not quoted back: the message names the field only.
    for (path, body, field) in [
        (
            "/v1/leases",
            json!({"tenant": "acme", "subject": 987654321}),
            "subject",
        ),
        (
            "/v1/leases",
            json!({"tenant": "acme", "subject": "bob", "reads": ["mk-secret-42"]}),
            "reads[0]",
        ),
        (
            "/v1/permits",
            json!({"lease_id": lease.lease_id, "sink": "secret-sink-42"}),
            "sink",
        ),
    ] {
        let e = rt.call("POST", path, Some(&body)).unwrap_err();
        let m = e.to_string();
        assert_eq!(code(e), "bad_request", "{m}");
        assert!(m.contains(field), "{m}");
        for value in ["987654321", "mk-secret-42", "secret-sink-42"] {
            assert!(!m.contains(value), "{m}");
        }
    }
    let e = env.operator().create_job(
        &json!({"tenant": 424242, "subject": "bob", "basis": "gdpr-art17", "ticket": "T"}),
    );
    let m = e.unwrap_err().to_string();
    assert!(m.contains("tenant") && !m.contains("424242"), "{m}");
    // Field names stay: they are what a caller needs to fix the request.
    let m = rt
        .call("POST", "/v1/leases", Some(&json!({"tenant": "acme"})))
        .unwrap_err()
        .to_string();
    assert!(m.contains("missing field `subject`"), "{m}");
    let m = rt
        .call(
            "POST",
            "/v1/leases",
            Some(&json!({"tenant": "acme", "subject": "bob", "colour": 1})),
        )
        .unwrap_err()
        .to_string();
    // A key the caller made up is never shown, however field-like (`alice` is a name): the
    // message names the API's fields instead.
    assert!(
        m.contains("unknown field `…`, expected one of `tenant`") && !m.contains("colour"),
        "{m}"
    );
    // Nor quoted, nor as the path to the fault, at any depth.
    for (body, path) in [
        (
            json!({"tenant": "acme", "subject": "bob", "zz-secret-42": 1}),
            None,
        ),
        (
            json!({"tenant": "acme", "subject": "bob",
                   "reads": [{"memory_id": "m", "version": "v", "zz-secret-42": 1}]}),
            Some("reads[0]: unknown field"),
        ),
    ] {
        let m = rt
            .call("POST", "/v1/leases", Some(&body))
            .unwrap_err()
            .to_string();
        assert!(m.contains("unknown field") && !m.contains("secret"), "{m}");
        if let Some(path) = path {
            assert!(m.contains(path), "{m}");
        }
    }
    // A wrong method has the API's error shape too.
    let e = rt.call("GET", "/v1/permits", None).unwrap_err();
    assert_eq!(code(e), "method_not_allowed");
}

/// Sends one raw request; returns the status and the body of the answer.
fn raw(addr: &str, head: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = c.write_all(head.as_bytes());
    let _ = c.write_all(body);
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A malformed request is refused with the API's JSON error, like any other: a JSON array in
/// place of the object (serde would read it as the fields in order), a body over the limit, a
/// job id that is not UTF-8, a body without a JSON content type. An engine's refusal names the
/// request's fields, not the CLI's flags.
fn every_refusal_of_a_malformed_request_has_the_api_shape(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let lease = env
        .runtime()
        .take_lease("acme", "bob", &[], 60_000)
        .unwrap();
    let post = |path: &str, token: &str, ctype: &str, body: &[u8]| {
        raw(
            &env.addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            ),
            body,
        )
    };
    let api = |(status, body): (u16, String)| -> (u16, String) {
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("not the API's shape: {status} {body:?}"));
        (status, v["error"].as_str().unwrap_or("").to_string())
    };
    // Every field, in order: what serde would take for the object.
    let array = format!("[{}, \"tool\", null, null]", lease.lease_id);
    assert_eq!(
        api(post(
            "/v1/permits",
            RUNTIME,
            "application/json",
            array.as_bytes()
        )),
        (400, "bad_request".into()),
        "an array taken for the object"
    );
    assert_eq!(env.permits_of(lease.lease_id), 0);
    let big = format!("{{\"tenant\": \"{}\"}}", "a".repeat(3 << 20));
    assert_eq!(
        api(post(
            "/v1/leases",
            RUNTIME,
            "application/json",
            big.as_bytes()
        )),
        (413, "too_large".into())
    );
    // Anything after the object is refused, and no lease is taken.
    assert_eq!(
        api(post(
            "/v1/leases",
            RUNTIME,
            "application/json",
            br#"{"tenant": "acme", "subject": "bob"} {"x": 1}"#
        )),
        (400, "bad_request".into())
    );
    assert_eq!(
        api(post("/v1/leases", RUNTIME, "text/plain", b"{}")),
        (400, "bad_request".into())
    );
    assert_eq!(
        api(raw(
            &env.addr,
            &format!(
                "GET /v1/jobs/%FF%FE HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPERATOR}\r\n\
                 Connection: close\r\n\r\n"
            ),
            b""
        )),
        (400, "bad_request".into())
    );
    let far = (time::OffsetDateTime::now_utc() + time::Duration::days(80)).date();
    let e = env
        .operator()
        .create_job(
            &json!({"tenant": "acme", "subject": "bob", "basis": "gdpr-art17",
            "ticket": "T-1", "deadline": far.to_string()}),
        )
        .unwrap_err();
    let m = e.to_string();
    assert_eq!(code(e), "bad_request", "{m}");
    assert!(m.contains("extension_reason") && !m.contains("--"), "{m}");
}

/// Jobs over HTTP answer as the CLI does: a legal hold is 409 `held` at once (the CLI's exit
/// 4), on creation and on resume, and the job stays REQUESTED; a resume's optional body is
/// refused with the API's error shape, its values not quoted back.
fn a_held_job_is_refused_at_once_over_http(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let op = env.operator();
    let acme = lethe_core::Tenant::new("acme").unwrap();
    let carol = lethe_core::Subject::new("carol").unwrap();
    env.engine.add_hold(&acme, Some(&carol), None).unwrap();
    let req = json!({"tenant": "acme", "subject": "carol", "basis": "gdpr-art17", "ticket": "T"});
    let e = op.create_job(&req).unwrap_err();
    // The server words the refusal; no command line's (`lethe resume`, a flag) is in it.
    let m = e.to_string();
    assert!(!m.contains("lethe ") && !m.contains("--"), "{m}");
    assert_eq!(code(e), "held");
    let jobs = op.call("GET", "/v1/jobs", None).unwrap();
    let job = jobs[0]["job_id"].as_str().unwrap().to_string();
    assert_eq!(op.job(&job).unwrap()["state"], "REQUESTED");
    let resume = format!("/v1/jobs/{job}/resume");
    assert_eq!(code(op.call("POST", &resume, None).unwrap_err()), "held");
    for (body, want) in [
        (json!({"drain_timeout_s": "secret-x-42"}), "drain_timeout_s"),
        (json!({"bogus": 1}), "unknown field `…`, expected"),
    ] {
        let e = op.call("POST", &resume, Some(&body)).unwrap_err();
        let m = e.to_string();
        assert_eq!(code(e), "bad_request", "{m}");
        assert!(m.contains(want) && !m.contains("secret-x-42"), "{m}");
    }
    env.engine.release_holds(&acme, Some(&carol)).unwrap();
    op.call("POST", &resume, None).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while op.job(&job).unwrap()["state"] != "COMPLETE" {
        assert!(
            std::time::Instant::now() < deadline,
            "the released job never completed"
        );
        std::thread::yield_now();
    }
    // The outcome's shape is `erase --json`'s, less `continued`.
    let v = op.job(&job).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "blocked_reason",
            "blocked_target",
            "certificate",
            "job_id",
            "state"
        ],
        "{v}"
    );
}

/// `POST /v1/permits` with `release`: the permit is released in the same request, whether the
/// take is granted or refused; a permit that was not active is reported, not an error; a bad
/// `release` changes nothing.
fn a_take_carrying_a_release_ends_that_permit_whatever_the_answer(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let rt = env.runtime();
    let state = |p: &Permit| {
        let n = |s: &str| {
            env.count(&format!(
                "SELECT count(*) FROM permits WHERE permit_id = {} AND state = '{s}'",
                p.id
            ))
        };
        match (n("active"), n("released")) {
            (1, 0) => "active",
            (0, 1) => "released",
            other => panic!("permit {} in no single state: {other:?}", p.id),
        }
    };
    let lease = rt.take_lease("acme", "alice", &[], 600_000).unwrap();
    let p1 = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    let (p2, released) = rt
        .take_permit_releasing(lease.lease_id, Sink::State, &p1)
        .unwrap();
    assert!(released);
    assert_ne!(p1, p2);
    assert_eq!((state(&p1), state(&p2)), ("released", "active"));
    // Releasing it again: not active any more, reported; the take is granted all the same.
    let (p3, released) = rt
        .take_permit_releasing(lease.lease_id, Sink::Tool, &p1)
        .unwrap();
    assert!(!released);
    assert_eq!((state(&p2), state(&p3)), ("active", "active"));
    // Malformed: refused before anything runs.
    for bad in [json!(0), json!(-3), json!("7"), json!(1.5)] {
        let e = rt.call(
            "POST",
            "/v1/permits",
            Some(&json!({"lease_id": lease.lease_id, "sink": "tool", "release": bad})),
        );
        assert_eq!(code(e.unwrap_err()), "bad_request", "release {bad}");
    }
    assert_eq!(
        env.permits_of(lease.lease_id),
        3,
        "no permit taken by a bad request"
    );
    // The fence closes while p2 and p3 are held: the job waits for both.
    let job = env.erase("alice", 30);
    env.wait_frozen(&job);
    let e = rt
        .take_permit_releasing(lease.lease_id, Sink::State, &p3)
        .unwrap_err();
    assert_eq!(code(e), "revoked");
    assert_eq!(state(&p3), "released", "released by the refused request");
    assert_eq!(env.permits_of(lease.lease_id), 3, "and no permit taken");
    let v = env.job(&job);
    assert!(
        v["state"] != "COMPLETE",
        "p2 is still held, so the job cannot be complete: {v}"
    );
    rt.release_permit(p2).unwrap();
    let done = env.wait_job(&job, |v| {
        v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
    });
    assert_eq!(done["state"], "COMPLETE", "{done}");
}

fn every_documented_route_is_served(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let op = env.operator();
    let doc: Value = op.call("GET", "/v1/openapi.json", None).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 9, "{paths:?}");
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            if path == "/v1/revocations" {
                continue; // a stream; served in its own test
            }
            let concrete = path
                .replace("{lease_id}", "1")
                .replace("{permit_id}", "1")
                .replace("{job_id}", "del-000000000000");
            let body = (method == "post").then(|| json!({}));
            if let Err(e) = op.call(&method.to_uppercase(), &concrete, body.as_ref()) {
                assert_ne!(
                    code(e),
                    "not_found",
                    "{method} {path} is documented but not routed"
                );
            }
        }
    }
    assert_eq!(
        code(op.call("GET", "/v1/nothing", None).unwrap_err()),
        "not_found"
    );
}

fn revocation_is_pushed_on_the_stream(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let rt = env.runtime();
    let alice = rt.take_lease("acme", "alice", &[], 60_000).unwrap();
    let bob = rt.take_lease("acme", "bob", &[], 60_000).unwrap();
    let mut stream = rt.revocations(&[alice.lease_id, bob.lease_id]).unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let id = stream.next_revoked().unwrap();
        tx.send((id, Instant::now())).unwrap();
    });
    let asked = Instant::now();
    let job = env.erase("alice", 30);
    let (id, at) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a revocation event");
    reader.join().unwrap();
    assert_eq!(id, Some(alice.lease_id), "only alice's lease is revoked");
    eprintln!(
        "revocation pushed {:?} after the job was asked for",
        at - asked
    );
    assert!(!rt.is_revoked(bob.lease_id).unwrap());
    assert!(rt.is_revoked(alice.lease_id).unwrap());
    let done = env.wait_job(&job, |v| {
        v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
    });
    assert_eq!(done["state"], "COMPLETE", "{done}");
    // A stream opened after the revocation reports it at once.
    let mut late = rt.revocations(&[alice.lease_id]).unwrap();
    assert_eq!(late.next_revoked().unwrap(), Some(alice.lease_id));
    assert_eq!(
        late.next_revoked().unwrap(),
        None,
        "the stream ends once every lease was reported"
    );
}

fn thirty_two_workers_get_no_permit_after_the_fence_closes(b: Backend) {
    thirty_two_workers(b, false);
}

/// As above, each worker releasing its permit with its next take (one round trip a cycle): an
/// alice worker's refused request released its last permit, so the job drains without any
/// other release.
fn thirty_two_swapping_workers_get_no_permit_after_the_fence_closes(b: Backend) {
    thirty_two_workers(b, true);
}

fn thirty_two_workers(b: Backend, swap: bool) {
    const WORKERS: usize = 32;
    let env = Env::new(b, Arc::new(SystemClock));
    // Even workers run for alice (erased), odd ones for bob (must keep working).
    let scopes: Vec<_> = (0..WORKERS)
        .map(|i| ("acme", if i % 2 == 0 { "alice" } else { "bob" }))
        .collect();
    let workers = PermitWorkers::start(&env.addr, &scopes, Sink::State, swap);
    workers.wait_for(200, 0);
    let job = env.erase("alice", 30);
    env.wait_frozen(&job);
    // The fence has closed: from here on, alice's leases must not gain a single permit row.
    let alice_at_close = env.permits_for("alice");
    // Bob's workers keep going, and every alice worker meets the closed fence (bounded).
    workers.wait_for(200, WORKERS / 2);
    let finished = || {
        env.wait_job(&job, |v| {
            v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
        })
    };
    let (done, results) = if swap {
        // A swapping alice worker's refused request released its last permit: the job
        // completes while the workers still run, with no release after the refusals.
        let done = finished();
        (done, workers.stop())
    } else {
        let results = workers.stop();
        (finished(), results)
    };
    assert_eq!(
        done["state"], "COMPLETE",
        "every permit from before the close drained: {done}"
    );
    for w in &results {
        let subject = w.subject;
        assert_eq!(
            w.ok_after_refusal, 0,
            "a {subject} worker got a permit after being refused"
        );
        if subject == "alice" {
            assert!(
                w.refused > 0,
                "every alice worker was refused after the close"
            );
            assert_eq!(
                env.permits_of(w.lease) as u64,
                w.ok,
                "no permit row beyond those granted"
            );
        } else {
            assert_eq!(w.refused, 0, "bob was never refused");
        }
    }
    assert_eq!(
        env.permits_for("alice"),
        alice_at_close,
        "a permit was registered after the close"
    );
    let bob_total: u64 = results
        .iter()
        .filter(|w| w.subject == "bob")
        .map(|w| w.ok)
        .sum();
    assert!(bob_total > 0);
}

/// Permit traffic over seven subjects of three tenants (on PostgreSQL the server sends
/// requests that arrive together in one transaction, scopes mixed) while two subjects and a
/// whole tenant are erased at once: every erased scope refuses from its close on, nobody else
/// is ever refused, and no request fails (a lock-order deadlock between a batch and a freeze
/// would surface as `unavailable`).
fn permits_of_many_scopes_while_three_freeze_at_once(b: Backend) {
    const PER_SUBJECT: usize = 3;
    let subjects = [
        ("acme", "s0"),
        ("acme", "s1"),
        ("acme", "s2"),
        ("globex", "s3"),
        ("globex", "s4"),
        ("initech", "s5"),
        ("initech", "s6"),
    ];
    let erased = |tn: &str, sb: &str| {
        (tn, sb) == ("acme", "s0") || (tn, sb) == ("globex", "s3") || tn == "initech"
    };
    let env = Env::new(b, Arc::new(SystemClock));
    let scopes: Vec<_> = (0..subjects.len() * PER_SUBJECT)
        .map(|i| subjects[i % subjects.len()])
        .collect();
    let workers = PermitWorkers::start(&env.addr, &scopes, Sink::Tool, false);
    workers.wait_for(300, 0);
    let op = env.operator();
    let mut jobs = Vec::new();
    for scope in [
        json!({"tenant": "acme", "subject": "s0"}),
        json!({"tenant": "globex", "subject": "s3"}),
        json!({"tenant": "initech"}),
    ] {
        let mut body = scope;
        body["basis"] = json!("gdpr-art17");
        body["ticket"] = json!("T-3");
        body["drain_timeout_s"] = json!(30);
        let v = op.create_job(&body).unwrap();
        jobs.push(v["job_id"].as_str().unwrap().to_string());
    }
    for job in &jobs {
        env.wait_frozen(job);
    }
    let erased_workers = scopes.iter().filter(|(t, s)| erased(t, s)).count();
    workers.wait_for(300, erased_workers);
    let results = workers.stop();
    for job in &jobs {
        let done = env.wait_job(job, |v| v["state"] == "COMPLETE" || v["state"] == "BLOCKED");
        assert_eq!(done["state"], "COMPLETE", "{done}");
    }
    for w in &results {
        let (tn, sb) = (w.tenant, w.subject);
        assert_eq!(
            w.ok_after_refusal, 0,
            "{tn}/{sb} got a permit after being refused"
        );
        if erased(tn, sb) {
            assert!(w.refused > 0, "{tn}/{sb} was refused after its close");
        } else {
            assert_eq!(w.refused, 0, "{tn}/{sb} was never to be refused");
            assert!(w.ok > 0);
        }
        assert_eq!(
            env.permits_of(w.lease) as u64,
            w.ok,
            "one permit row per permit granted"
        );
    }
}

fn a_permit_checked_after_the_close_is_refused_and_the_sink_admits_nothing(b: Backend) {
    // The worker's request reaches the gate, then stops just before the check-and-register;
    // the fence closes; then the request goes on.
    let (arrived_tx, arrived_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (arrived_tx, go_rx) = (
        std::sync::Mutex::new(arrived_tx),
        std::sync::Mutex::new(go_rx),
    );
    let armed = Arc::new(AtomicBool::new(false));
    let hook_armed = Arc::clone(&armed);
    let hooks = Hooks {
        before_permit: Some(Arc::new(move || {
            if hook_armed.swap(false, SeqCst) {
                arrived_tx.lock().unwrap().send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            }
        })),
    };
    let env = Env::with_hooks(b, Arc::new(SystemClock), hooks);
    let lease = env
        .runtime()
        .take_lease("acme", "alice", &[], 60_000)
        .unwrap();
    let sink_admitted = Arc::new(AtomicUsize::new(0));
    armed.store(true, SeqCst);
    let (addr, admitted) = (env.addr.clone(), Arc::clone(&sink_admitted));
    let worker = std::thread::spawn(move || {
        let c = Client::new(addr, RUNTIME);
        match c.take_permit(lease.lease_id, Sink::State) {
            Ok(p) => {
                admitted.fetch_add(1, SeqCst); // the sink accepts only under a permit
                c.release_permit(p).unwrap();
                "granted".to_string()
            }
            Err(e) => code(e),
        }
    });
    arrived_rx.recv().unwrap();
    let job = env.erase("alice", 30);
    env.wait_frozen(&job);
    go_tx.send(()).unwrap();
    assert_eq!(worker.join().unwrap(), "revoked");
    assert_eq!(sink_admitted.load(SeqCst), 0, "the sink admitted nothing");
    assert_eq!(
        env.permits_of(lease.lease_id),
        0,
        "no permit was registered"
    );
    let done = env.wait_job(&job, |v| {
        v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
    });
    assert_eq!(done["state"], "COMPLETE", "{done}");
}

fn a_permit_held_forever_leaves_the_job_blocked_whatever_the_lease_ttl(b: Backend) {
    // A manual clock: the engine's drain wait and the lease TTL pass without sleeping.
    let clock = Arc::new(ManualClock::new(
        time::macros::datetime!(2026-12-02 10:00 UTC),
    ));
    let env = Env::new(b, clock.clone());
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "alice", &[], 1_000).unwrap();
    let held = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    clock.advance(Duration::from_secs(3600)); // the lease's TTL is long past
    let job = env.erase("alice", 5);
    let v = env.wait_job(&job, |v| {
        v["state"] == "BLOCKED" || v["state"] == "COMPLETE"
    });
    assert_eq!(v["state"], "BLOCKED", "{v}");
    assert_eq!(v["blocked_reason"], "undrained");
    assert_eq!(v["certificate"], Value::Null);
    // New leases for alice are refused while the job is open.
    assert_eq!(
        code(rt.take_lease("acme", "alice", &[], 1_000).unwrap_err()),
        "fenced"
    );
    // The holder confirms it aborted; the operator resumes the job over HTTP and it finishes.
    rt.confirm_cancelled(held).unwrap();
    let op = env.operator();
    assert_eq!(
        code(op.resume_job("del-000000000000", &json!({})).unwrap_err()),
        "no_such_job"
    );
    assert_eq!(
        code(rt.resume_job(&job, &json!({})).unwrap_err()),
        "forbidden"
    );
    let v = op.resume_job(&job, &json!({"drain_timeout_s": 5})).unwrap();
    assert_eq!(v["state"], "BLOCKED");
    let done = env.wait_job(&job, |v| v["state"] == "COMPLETE");
    assert_eq!(done["blocked_reason"], Value::Null);
    let jobs = op.jobs().unwrap();
    assert_eq!(jobs[0]["job_id"], job.as_str());
    assert_eq!(jobs[0]["state"], "COMPLETE");
    assert!(
        !jobs.to_string().contains("alice"),
        "no identifier in the listing"
    );
    // After completion the subject can be served again, at the new epoch.
    let fresh = rt.take_lease("acme", "alice", &[], 1_000).unwrap();
    assert_eq!(fresh.epoch, lease.epoch + 1);
}

fn a_renewed_lease_keeps_a_long_run_going_until_an_erasure_revokes_it(b: Backend) {
    let clock = Arc::new(ManualClock::new(
        time::macros::datetime!(2026-12-02 10:00 UTC),
    ));
    let env = Env::new(b, clock.clone());
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "alice", &[], 10_000).unwrap();
    clock.advance(Duration::from_secs(8));
    let until = rt.renew_lease(lease.lease_id, 60_000).unwrap();
    assert_eq!(until, lease.expires_ms + 58_000);
    clock.advance(Duration::from_secs(30)); // past the first TTL, within the renewed one
    let p = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    rt.release_permit(p).unwrap();
    for (body, why) in [
        (json!({"ttl_ms": 0}), "bad_request"),
        (json!({"ttl": 5}), "bad_request"),
    ] {
        let path = format!("/v1/leases/{}/renew", lease.lease_id);
        assert_eq!(code(rt.call("POST", &path, Some(&body)).unwrap_err()), why);
    }
    assert_eq!(
        code(rt.renew_lease(987_654, 1_000).unwrap_err()),
        "no_such_lease"
    );
    // An erasure revokes it: no renewal brings it back.
    let job = env.erase("alice", 5);
    env.wait_job(&job, |v| v["state"] == "COMPLETE");
    assert_eq!(
        code(rt.renew_lease(lease.lease_id, 60_000).unwrap_err()),
        "revoked"
    );
    // A lease whose TTL passed is not renewed either.
    let bob = rt.take_lease("acme", "bob", &[], 1_000).unwrap();
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        code(rt.renew_lease(bob.lease_id, 60_000).unwrap_err()),
        "expired"
    );
}

fn memory_scope_revokes_only_the_lease_that_read_that_version(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    // Two of alice's memories, and the versions the store holds for them.
    let store = env.dir.path().join("memory/store.db");
    let c = rusqlite::Connection::open(&store).unwrap();
    let mut q = c
        .prepare("SELECT key FROM store WHERE prefix = 'acme.alice.memories' ORDER BY key LIMIT 2")
        .unwrap();
    let keys: Vec<String> = q
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(keys.len(), 2);
    let version_of = |key: &str| {
        let scope = Scope::Memory {
            tenant: Tenant::new("acme").unwrap(),
            subject: Subject::new("alice").unwrap(),
            memory: MemoryId::new(format!("memories/{key}")).unwrap(),
            version: None,
        };
        let t = env
            .engine
            .targets()
            .iter()
            .find(|t| t.name == "memories")
            .unwrap();
        t.adapter
            .current_version(&scope)
            .unwrap()
            .unwrap()
            .as_str()
            .to_string()
    };
    let (m1, m2) = (
        format!("memories/{}", keys[0]),
        format!("memories/{}", keys[1]),
    );
    let (v1, v2) = (version_of(&keys[0]), version_of(&keys[1]));
    let rt = env.runtime();
    let read_m1 = rt
        .take_lease("acme", "alice", &[(&m1, &v1)], 60_000)
        .unwrap();
    let read_m2 = rt
        .take_lease("acme", "alice", &[(&m2, &v2)], 60_000)
        .unwrap();
    let v = env
        .operator()
        .create_job(&json!({"tenant": "acme", "subject": "alice", "memory": m1, "basis": "gdpr-art17", "ticket": "T"}))
        .unwrap();
    let job = v["job_id"].as_str().unwrap().to_string();
    let done = env.wait_job(&job, |v| {
        v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
    });
    assert_eq!(done["state"], "COMPLETE", "{done}");
    assert_eq!(
        code(rt.take_permit(read_m1.lease_id, Sink::Output).unwrap_err()),
        "revoked"
    );
    // The lease that read another memory works throughout, and alice can still be served.
    let p = rt.take_permit(read_m2.lease_id, Sink::Output).unwrap();
    rt.release_permit(p).unwrap();
    assert!(!rt.is_revoked(read_m2.lease_id).unwrap());
    // A new lease that read the erased version is refused at its first permit.
    let again = rt
        .take_lease("acme", "alice", &[(&m1, &v1)], 60_000)
        .unwrap();
    assert_eq!(
        code(rt.take_permit(again.lease_id, Sink::Tool).unwrap_err()),
        "tombstoned"
    );
}

fn shutdown_ends_revocation_streams(b: Backend) {
    let mut env = Env::new(b, Arc::new(SystemClock));
    let lease = env
        .runtime()
        .take_lease("acme", "bob", &[], 60_000)
        .unwrap();
    let mut stream = env.runtime().revocations(&[lease.lease_id]).unwrap();
    let reader = std::thread::spawn(move || stream.next_revoked().unwrap());
    env.shutdown().expect("graceful shutdown");
    assert_eq!(
        reader.join().unwrap(),
        None,
        "the stream ended without a revocation"
    );
    assert!(
        env.runtime().take_lease("acme", "bob", &[], 1_000).is_err(),
        "nothing listens"
    );
}

/// A client that sends half a request and waits does not hold a stop forever: after the grace
/// the server ends anyway.
fn a_half_sent_request_does_not_hold_the_stop(b: Backend) {
    use std::io::Write;
    let mut env = Env::new(b, Arc::new(SystemClock));
    let mut half = std::net::TcpStream::connect(&env.addr).unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // The server has read it (a full request on another connection answers meanwhile).
    assert!(env.runtime().take_lease("acme", "bob", &[], 1_000).is_ok());
    let asked = Instant::now();
    env.shutdown().expect("the stop ends");
    let took = asked.elapsed();
    assert!(
        took < lethe_server::SHUTDOWN_GRACE + Duration::from_secs(10),
        "stopped after {took:?}"
    );
    drop(half);
}

/// The scheme name is case-insensitive; a basis the server does not know is not repeated.
fn bearer_in_any_case_and_no_echo_of_a_bad_basis(b: Backend) {
    use std::io::{Read, Write};
    let env = Env::new(b, Arc::new(SystemClock));
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let mut c = std::net::TcpStream::connect(&env.addr).unwrap();
        write!(
            c,
            "GET /v1/leases/1 HTTP/1.1\r\nHost: x\r\nAuthorization: {scheme} {RUNTIME}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 404"), "{scheme}: {answer}");
    }
    let e = env
        .operator()
        .create_job(
            &json!({"tenant": "acme", "subject": "bob", "basis": "SECRETbasis", "ticket": "T"}),
        )
        .unwrap_err();
    let shown = format!("{e:?} {e}");
    assert_eq!(code(e), "bad_request");
    assert!(!shown.contains("SECRETbasis"), "{shown}");
}

/// A stream listing a lease that is gone (swept after it expired, maybe revoked before; or never
/// taken) reports it as revoked and ends, instead of staying silent forever.
fn a_stream_for_a_gone_lease_reports_it_revoked(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let live = env
        .runtime()
        .take_lease("acme", "bob", &[], 60_000)
        .unwrap();
    let mut stream = env
        .runtime()
        .revocations(&[987_654, live.lease_id])
        .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(stream.next_revoked().map_err(|e| e.to_string()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the gone lease was reported");
    assert_eq!(got.unwrap(), Some(987_654));
    assert!(!env.runtime().is_revoked(live.lease_id).unwrap());
}

/// A connection with nothing read or written for the idle timeout is closed (a client holding
/// half a request no longer holds a descriptor forever), while a revocation stream, which
/// writes a keepalive, and a request answered in time are untouched.
fn an_idle_connection_is_closed_after_the_timeout(b: Backend) {
    use std::io::{Read, Write};
    let mut env = Env::new(b, Arc::new(SystemClock));
    env.shutdown().unwrap();
    env.idle_timeout = Duration::from_millis(800);
    env.start(Hooks::default());
    let mut half = std::net::TcpStream::connect(&env.addr).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let asked = Instant::now();
    let mut rest = Vec::new();
    // The server closes it: the read ends (EOF or reset), well before the client's 20 s.
    let _ = half.read_to_end(&mut rest);
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "closed after {:?}",
        asked.elapsed()
    );
    assert!(env.runtime().take_lease("acme", "bob", &[], 60_000).is_ok());
    env.shutdown().unwrap();
}

/// A runtime whose permit answer was lost sends the take again with its key: it gets the same
/// permit, even after the freeze closed the fence, so it can release it and the erasure
/// completes instead of staying BLOCKED on a permit nobody knows. A new key is refused as
/// usual; a malformed key is a bad request, not repeated.
fn a_take_sent_again_with_its_key_gets_its_permit_back_and_the_job_drains(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "alice", &[], 60_000).unwrap();
    let take = |key: &str| {
        rt.call(
            "POST",
            "/v1/permits",
            Some(&json!({"lease_id": lease.lease_id, "sink": "tool", "key": key})),
        )
    };
    let first = take("run-7.step-3").unwrap()["permit_id"].as_i64().unwrap();
    assert_eq!(take("run-7.step-3").unwrap()["permit_id"], first);
    assert_eq!(env.permits_of(lease.lease_id), 1);
    let job = env.erase("alice", 60);
    env.wait_frozen(&job);
    assert_eq!(
        take("run-7.step-3").unwrap()["permit_id"],
        first,
        "the lost answer is found after the freeze"
    );
    assert_eq!(code(take("run-7.step-4").unwrap_err()), "revoked");
    for bad in ["", "has space", "ключ", &"k".repeat(81)] {
        let e = take(bad).unwrap_err();
        let shown = format!("{e:?}");
        assert_eq!(code(e), "bad_request", "{bad:?}");
        assert!(bad.is_empty() || !shown.contains(bad), "{shown}");
    }
    // Only its holder ends it: without its key, or with another, a release or a cancellation
    // naming its id is `no_such_permit` and the job keeps waiting.
    for (query, refusal) in [
        ("", "no_such_permit"),
        ("?key=run-7.step-4", "no_such_permit"),
    ] {
        for (method, end) in [("DELETE", ""), ("POST", "/cancelled")] {
            let e = rt
                .call(method, &format!("/v1/permits/{first}{end}{query}"), None)
                .unwrap_err();
            assert_eq!(code(e), refusal, "{method} {end}{query}");
        }
    }
    let v = env.job(&job);
    assert_ne!(v["state"], "COMPLETE", "{v}");
    assert_eq!(
        code(
            rt.call("DELETE", &format!("/v1/permits/{first}?colour=1"), None)
                .unwrap_err()
        ),
        "bad_request"
    );
    rt.release_permit(Permit {
        id: first,
        key: Some("run-7.step-3".into()),
    })
    .unwrap();
    // Its key grants nothing once it ended: a replayed step must not get a permit no drain set
    // tracks.
    assert_eq!(code(take("run-7.step-3").unwrap_err()), "key_used");
    let v = env.wait_job(&job, |v| {
        v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
    });
    assert_eq!(v["state"], "COMPLETE", "{v}");
    assert_eq!(env.permits_of(lease.lease_id), 1, "one permit per key");
}

/// A permit taken without a key (raw HTTP, a hand-written client) gets one the gate names, and
/// ends only with it: another run naming its sequential id, without the key or with another
/// permit's, cannot end it and so cannot let an erasure drain while its holder is still inside
/// its boundary. It used to be ended by any runtime token.
fn a_permit_taken_without_a_key_ends_only_with_the_key_the_gate_named(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "alice", &[], 60_000).unwrap();
    let take = |body: Value| rt.call("POST", "/v1/permits", Some(&body));
    let answer = take(json!({"lease_id": lease.lease_id, "sink": "tool"})).unwrap();
    let held = answer["permit_id"].as_i64().unwrap();
    let held_key = answer["key"]
        .as_str()
        .expect("the gate names a key")
        .to_string();
    assert_eq!(held_key.len(), 32, "{answer}");
    assert!(held_key.bytes().all(|c| c.is_ascii_hexdigit()), "{answer}");
    // Each take gets a key of its own; a keyed take's answer carries the key it sent.
    let other = take(json!({"lease_id": lease.lease_id, "sink": "tool"})).unwrap();
    let other_key = other["key"].as_str().unwrap().to_string();
    assert_ne!(other_key, held_key);
    let mine = take(json!({"lease_id": lease.lease_id, "sink": "state", "key": "run-1"})).unwrap();
    assert_eq!(mine["key"], "run-1");
    let job = env.erase("alice", 60);
    env.wait_frozen(&job);
    for (query, refusal) in [
        (String::new(), "no_such_permit"),
        (format!("?key={other_key}"), "no_such_permit"),
        ("?key=run-1".into(), "no_such_permit"),
    ] {
        for (method, end) in [("DELETE", ""), ("POST", "/cancelled")] {
            let e = rt
                .call(method, &format!("/v1/permits/{held}{end}{query}"), None)
                .unwrap_err();
            assert_eq!(code(e), refusal, "{method} {end}{query}");
        }
    }
    // Nor as a take's `release`, without `release_key` or with another permit's: the release
    // is not made (the take is refused too: the fence is closed), and the permit stays active.
    for release_key in [None, Some(other_key.as_str())] {
        let e = take(
            json!({"lease_id": lease.lease_id, "sink": "tool", "release": held,
                            "release_key": release_key}),
        );
        assert_eq!(code(e.unwrap_err()), "revoked");
    }
    assert_eq!(env.active_permits_of(lease.lease_id), 3);
    // A permit taken in-process without a key (`Journal::take_permit`) is ended by no key an
    // HTTP caller shows; it used to be ended by any.
    let journal = Journal::open_url(&env.journal, env.dir.path()).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let (acme, bob) = (Tenant::new("acme").unwrap(), Subject::new("bob").unwrap());
    let bobs = journal
        .take_lease(now, &acme, &bob, &[], Duration::from_secs(60))
        .unwrap();
    let inproc = journal
        .take_permit(now, bobs.id, lethe_gate::Sink::Tool)
        .unwrap();
    for key in [other_key.as_str(), held_key.as_str(), "run-1"] {
        let e = rt
            .call(
                "DELETE",
                &format!("/v1/permits/{}?key={key}", inproc.id),
                None,
            )
            .unwrap_err();
        assert_eq!(code(e), "no_such_permit", "{key}");
    }
    assert_eq!(env.active_permits_of(bobs.id), 1);
    journal.release_permit(inproc.id).unwrap();
    assert_eq!(env.active_permits_of(bobs.id), 0);
    for (id, key) in [
        (other["permit_id"].as_i64().unwrap(), other_key),
        (mine["permit_id"].as_i64().unwrap(), "run-1".into()),
    ] {
        rt.release_permit(Permit { id, key: Some(key) }).unwrap();
    }
    let v = env.job(&job);
    assert_ne!(v["state"], "COMPLETE", "held is still active: {v}");
    rt.call(
        "POST",
        &format!("/v1/permits/{held}/cancelled?key={held_key}"),
        None,
    )
    .unwrap();
    let v = env.wait_job(&job, |v| {
        v["state"] == "COMPLETE" || v["state"] == "BLOCKED"
    });
    assert_eq!(v["state"], "COMPLETE", "{v}");
}

/// A request the server is slow to answer (here its gate call waits three idle timeouts) gets
/// its answer: the idle timeout bounds the client, never the server's own work. It used to cut
/// the connection, and the permit it registered was never known to the runtime (its job stayed
/// BLOCKED, undrained).
fn a_slow_answer_is_not_cut_by_the_idle_timeout(b: Backend) {
    let (arrived_tx, arrived_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (arrived_tx, go_rx) = (Mutex::new(arrived_tx), Mutex::new(go_rx));
    // Only the first request waits, so a resent one (a client retrying a cut connection)
    // would go through and show as a second permit.
    let armed = AtomicBool::new(true);
    let hooks = Hooks {
        before_permit: Some(Arc::new(move || {
            if armed.swap(false, SeqCst) {
                arrived_tx.lock().unwrap().send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            }
        })),
    };
    let mut env = Env::new(b, Arc::new(SystemClock));
    env.shutdown().unwrap();
    env.idle_timeout = Duration::from_millis(500);
    env.start(hooks);
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "bob", &[], 60_000).unwrap();
    let taking = std::thread::spawn(move || rt.take_permit(lease.lease_id, Sink::Tool));
    arrived_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the permit request reached the gate");
    // What is tested is real time passing beyond the timeout while the server works (the
    // connection's timers run on the runtime's clock), not an ordering.
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(env.idle_timeout * 3);
    go_tx.send(()).unwrap();
    let permit = taking.join().unwrap().expect("the slow answer arrived");
    assert_eq!(env.permits_of(lease.lease_id), 1, "one request, one permit");
    env.runtime().release_permit(permit).unwrap();
    env.shutdown().unwrap();
}

/// A client that sends a byte now and then, never finishing its headers or its body, holds its
/// connection no longer than about the idle timeout: the bound is on the whole, not on the gap
/// between two bytes (a slot per such client would otherwise be held forever).
fn a_client_trickling_headers_or_a_body_is_closed(b: Backend) {
    use std::io::{Read, Write};
    let mut env = Env::new(b, Arc::new(SystemClock));
    env.shutdown().unwrap();
    env.idle_timeout = Duration::from_millis(800);
    env.start(Hooks::default());
    let body_head = format!(
        "POST /v1/leases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RUNTIME}\r\n\
         Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{{"
    );
    for (what, head) in [
        (
            "headers",
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_string(),
        ),
        ("body", body_head),
    ] {
        let mut c = std::net::TcpStream::connect(&env.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        c.write_all(head.as_bytes()).unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 512];
        let ended = loop {
            if started.elapsed() > Duration::from_secs(15) {
                break false;
            }
            // One byte per read wait (200 ms), well inside the 800 ms between two bytes.
            if c.write_all(b"a").is_err() {
                break true;
            }
            match c.read(&mut buf) {
                Ok(_) => break true, // an end of file, or an answer refusing the request
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break true,
            }
        };
        assert!(
            ended,
            "{what}: the trickling connection was still open after {:?}",
            started.elapsed()
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: closed after {:?}",
            started.elapsed()
        );
    }
    assert!(env.runtime().take_lease("acme", "bob", &[], 60_000).is_ok());
    env.shutdown().unwrap();
}

fn a_restarted_server_keeps_fences_and_revocations(b: Backend) {
    let clock = Arc::new(ManualClock::new(
        time::macros::datetime!(2026-12-02 10:00 UTC),
    ));
    let mut env = Env::new(b, clock.clone());
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "alice", &[], 60_000).unwrap();
    let held = rt.take_permit(lease.lease_id, Sink::State).unwrap();
    let job = env.erase("alice", 1);
    let v = env.wait_job(&job, |v| {
        v["state"] == "BLOCKED" || v["state"] == "COMPLETE"
    });
    assert_eq!(v["blocked_reason"], "undrained", "{v}");
    env.shutdown().unwrap();
    env.start(Hooks::default());
    let rt = env.runtime();
    assert!(
        rt.is_revoked(lease.lease_id).unwrap(),
        "the revocation survived"
    );
    assert_eq!(
        code(rt.take_permit(lease.lease_id, Sink::State).unwrap_err()),
        "revoked"
    );
    assert_eq!(
        code(rt.take_lease("acme", "alice", &[], 1_000).unwrap_err()),
        "fenced",
        "the fence survived"
    );
    rt.release_permit(held).unwrap();
    let out = env
        .engine
        .resume(&job, &RunOptions::default(), &mut |_| {})
        .unwrap();
    assert_eq!(out.state.to_string(), "COMPLETE");
}

fn the_server_sweeps_expired_leases_and_ended_permits(b: Backend) {
    let clock = Arc::new(ManualClock::new(
        time::macros::datetime!(2026-12-02 10:00 UTC),
    ));
    let env = Env::with(
        b,
        clock.clone(),
        Hooks::default(),
        Duration::from_millis(20),
    );
    let rt = env.runtime();
    let old = rt
        .take_lease("acme", "bob", &[("memories/k", "v1")], 1_000)
        .unwrap();
    let p = rt.take_permit(old.lease_id, Sink::Tool).unwrap();
    rt.release_permit(p).unwrap();
    let live = rt.take_lease("acme", "carol", &[], 3_600_000).unwrap();
    let held = rt.take_permit(live.lease_id, Sink::State).unwrap();
    clock.advance(Duration::from_secs(60)); // bob's lease is past its TTL; carol's is not
                                            // The server's sweep runs every 20 ms here: wait (bounded) for bob's rows to go.
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.count(&format!(
        "SELECT count(*) FROM leases WHERE lease_id = {}",
        old.lease_id
    )) > 0
    {
        assert!(Instant::now() < deadline, "the sweep never ran");
        std::thread::yield_now();
    }
    assert_eq!(
        env.permits_of(old.lease_id),
        0,
        "the ended permit went first"
    );
    assert_eq!(
        code(rt.is_revoked(old.lease_id).unwrap_err()),
        "no_such_lease"
    );
    // The live lease and its active permit stay.
    assert!(!rt.is_revoked(live.lease_id).unwrap());
    rt.release_permit(held).unwrap();
}

/// Sends a request and reads the answer's status line and headers only (a stream's answer
/// never ends); `None` when nothing came within `wait`.
fn head_status(addr: &str, request: &str, wait: Duration) -> Option<(u16, std::net::TcpStream)> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(wait)).unwrap();
    c.write_all(request.as_bytes()).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let status = String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())?;
    Some((status, c))
}

/// An error never repeats a name or a value the caller sent: not a query parameter the API
/// does not have (`?Alice-Smith=x`), not a body's key that reads like a field (`alice`), not a
/// value. It names the position or the fields the API has.
fn no_name_or_value_the_caller_sent_is_echoed(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    let rt = env.runtime();
    let lease = rt.take_lease("acme", "bob", &[], 60_000).unwrap();
    for path in [
        format!("/v1/revocations?leases={}&Alice-Smith=x", lease.lease_id),
        format!("/v1/revocations?leases={}&alice=x", lease.lease_id),
        "/v1/revocations?Alice-Smith=1".to_string(),
    ] {
        let (status, body) = raw(
            &env.addr,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RUNTIME}\r\n\
                 Connection: close\r\n\r\n"
            ),
            b"",
        );
        assert_eq!(status, 400, "{path}: {body}");
        assert!(!body.to_lowercase().contains("alice"), "{path}: {body}");
        assert!(body.contains("bad_request"), "{path}: {body}");
    }
    let (status, body) = raw(
        &env.addr,
        &format!(
            "DELETE /v1/permits/1?key=k1&Alice-Smith=x HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {RUNTIME}\r\nConnection: close\r\n\r\n"
        ),
        b"",
    );
    assert_eq!(status, 400, "{body}");
    assert!(!body.to_lowercase().contains("alice"), "{body}");
    for body in [
        json!({"tenant": "acme", "subject": "bob", "alice": 1}),
        json!({"tenant": "acme", "subject": "bob", "reads": [{"memory_id": "m", "version": "v", "alice": 1}]}),
        json!({"tenant": "acme", "subject": "bob", "reads": [["m/alice", "v-alice"]]}),
    ] {
        let m = rt
            .call("POST", "/v1/leases", Some(&body))
            .unwrap_err()
            .to_string();
        assert!(!m.to_lowercase().contains("alice"), "{body}: {m}");
    }
    // A struct nested in the body is read from an object only, never from an array of its
    // fields in order.
    let m = rt
        .call(
            "POST",
            "/v1/leases",
            Some(&json!({"tenant": "acme", "subject": "bob", "reads": [["m-1", "v-1"]]})),
        )
        .unwrap_err()
        .to_string();
    assert!(m.contains("an object with named fields"), "{m}");
    assert_eq!(
        env.count("SELECT count(*) FROM leases"),
        1,
        "no lease was taken by a refused request"
    );
}

/// A request to a route that needs a token is refused before a byte of its body is read: a
/// caller without a token that declares a 2 MiB body and sends none is answered 401 at once,
/// not held until its body arrives. A body declared over the limit is refused unread too.
fn a_caller_without_a_token_is_refused_before_its_body_is_read(b: Backend) {
    let env = Env::new(b, Arc::new(SystemClock));
    for (auth, length, want) in [
        (String::new(), 2 * 1024 * 1024, 401),
        (
            "Authorization: Bearer not-a-token-at-all-000\r\n".to_string(),
            1024,
            401,
        ),
        (
            format!("Authorization: Bearer {RUNTIME}\r\n"),
            3 * 1024 * 1024,
            413,
        ),
    ] {
        let asked = Instant::now();
        let got = head_status(
            &env.addr,
            &format!(
                "POST /v1/leases HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
                 Content-Length: {length}\r\n\r\n"
            ),
            Duration::from_secs(5),
        );
        assert_eq!(
            got.map(|(s, _)| s),
            Some(want),
            "answered without the body ({length} bytes declared) after {:?}",
            asked.elapsed()
        );
    }
    assert!(env.runtime().take_lease("acme", "bob", &[], 60_000).is_ok());
}

/// The leases all of a server's revocation streams watch are bounded: a stream that would take
/// the total past it is refused with 503 `watch_limit`, the streams open keep theirs, and once
/// one closes a new one is admitted.
#[test]
fn the_leases_all_streams_watch_are_bounded() {
    let env = Env::new(Backend::Sqlite, Arc::new(SystemClock));
    // Three streams of a third and one: two fit, the third goes past the bound.
    let per = lethe_server::MAX_WATCHED_LEASES / 3 + 1;
    // Live leases, written behind the server's back in one transaction (a lease a stream
    // watches that does not exist is reported revoked at once, and no longer watched).
    let path = env.journal.strip_prefix("sqlite:").unwrap();
    let c = rusqlite::Connection::open(path).unwrap();
    for from in [100_000, 200_000, 300_000] {
        c.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2) \
             INSERT INTO leases (lease_id, tenant, subject, epoch, tenant_epoch, expires_ms) \
             SELECT ?1 + i, 'acme', 'bob', 0, 0, 99999999999999 FROM n",
            [from as i64, per as i64],
        )
        .unwrap();
    }
    drop(c);
    let stream = |from: usize| {
        let ids: Vec<String> = (from..from + per).map(|i| i.to_string()).collect();
        format!(
            "GET /v1/revocations?leases={} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RUNTIME}\r\n\r\n",
            ids.join(",")
        )
    };
    let (status, first) = head_status(&env.addr, &stream(100_000), Duration::from_secs(10))
        .expect("the first stream is answered");
    assert_eq!(status, 200);
    let (status, _second) = head_status(&env.addr, &stream(200_000), Duration::from_secs(10))
        .expect("the second stream is answered");
    assert_eq!(status, 200);
    let (status, _) = head_status(&env.addr, &stream(300_000), Duration::from_secs(10))
        .expect("the third stream is answered");
    assert_eq!(status, 503, "past the bound");
    drop(first);
    // The watcher forgets a closed stream at its next poll.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) =
            head_status(&env.addr, &stream(300_000), Duration::from_secs(10)).expect("answered");
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        assert!(
            Instant::now() < deadline,
            "a closed stream's leases were never let go"
        );
        std::thread::yield_now();
    }
}

/// Connections opened without a token (4,200 of them, past the 4,096 proven connections a
/// server keeps, and idle) never keep a runtime with a token out: its new connection is
/// accepted and answered within a second, and the oldest idle ones were closed to make room.
#[test]
fn idle_connections_without_a_token_never_keep_a_runtime_out() {
    use std::io::Read;
    let env = Env::new(Backend::Sqlite, Arc::new(SystemClock));
    let n = lethe_server::MAX_CONNECTIONS + 104;
    let idle: Vec<std::net::TcpStream> = (0..n)
        .map(|_| std::net::TcpStream::connect(&env.addr).unwrap())
        .collect();
    // The health check, and a gate call with the token (no such lease: answered 404).
    for (path, want) in [("/healthz", 200), ("/v1/leases/1", 404)] {
        let asked = Instant::now();
        let got = head_status(
            &env.addr,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RUNTIME}\r\n\
                 Connection: close\r\n\r\n"
            ),
            Duration::from_secs(5),
        );
        let waited = asked.elapsed();
        assert_eq!(
            got.map(|g| g.0),
            Some(want),
            "{path}: answered after {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(1),
            "{path}: answered after {waited:?}"
        );
    }
    // The oldest idle connection was closed: its read ends at once.
    let mut oldest = idle.into_iter().next().unwrap();
    oldest
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(oldest.read(&mut buf), Ok(0) | Err(_)),
        "the oldest unproven connection was closed"
    );
}

/// A job asked for over HTTP on a journal whose chain does not verify is refused with 500
/// `journal_broken`, in the API's words, and nothing is erased.
#[test]
fn a_job_on_a_broken_journal_is_refused_as_journal_broken() {
    let env = Env::new(Backend::Sqlite, Arc::new(SystemClock));
    let first = env.erase("bob", 5);
    env.wait_job(&first, |v| v["state"] == "COMPLETE");
    let path = env.journal.strip_prefix("sqlite:").unwrap();
    rusqlite::Connection::open(path)
        .unwrap()
        .execute("UPDATE journal SET body = body || ' ' WHERE seq = 1", [])
        .unwrap();
    // Every subject's rows as they stand after bob's erasure: alice's and carol's, whole.
    let memory = |f: &str| std::fs::read(env.dir.path().join("memory").join(f)).unwrap();
    let before = lethe_test_support::MEMORY_FILES.map(memory);
    let e = env
        .operator()
        .create_job(
            &json!({"tenant": "acme", "subject": "alice", "basis": "gdpr-art17", "ticket": "T-2"}),
        )
        .unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(&e, lethe_client::Error::Refused { status: 500, .. }),
        "{m}"
    );
    assert_eq!(code(e), "journal_broken", "{m}");
    assert!(!m.contains("lethe ") && !m.contains("entry 1"), "{m}");
    assert_eq!(
        env.count("SELECT count(*) FROM jobs"),
        1,
        "no job was added"
    );
    assert_eq!(
        lethe_test_support::MEMORY_FILES.map(memory),
        before,
        "no memory file changed: every subject kept every row"
    );
}
