//! `lethe serve` as a real process: config errors refuse to start, and a server SIGKILLed
//! mid-job loses nothing (epochs, revocations and fences live in the control store), so the job
//! resumes after a restart.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lethe_client::{Client, Sink};
use serde_json::{json, Value};

const RUNTIME: &str = "runtime-token-serve-test-01";
const OPERATOR: &str = "operator-token-serve-test-01";

/// The demo's targets, a `[control]` and a `[serve]` with two tokens.
static CONFIG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        r#"
[control]
journal = "sqlite:lethe-journal.db"
policy_version = "test-1"

{}
[serve]
listen = "127.0.0.1:0"
pool = 4

[[serve.token]]
role = "runtime"
token_file = "runtime.token"

[[serve.token]]
role = "operator"
token_file = "operator.token"
"#,
        lethe_test_support::TARGETS
    )
});

fn setup(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    lethe_test_support::copy_memory(dir.path());
    std::fs::write(dir.path().join("lethe.toml"), config).unwrap();
    for (file, token) in [("runtime.token", RUNTIME), ("operator.token", OPERATOR)] {
        let path = dir.path().join(file);
        std::fs::write(&path, format!("{token}\n")).unwrap();
        chmod(&path, 0o600);
    }
    dir
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn lethe(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lethe"));
    c.arg("--config")
        .arg(dir.join("lethe.toml"))
        .env_remove("LETHE_LOG");
    c
}

/// Starts `lethe serve`; returns the child and the address it printed.
fn serve(dir: &Path) -> (Child, String) {
    serve_with(dir, Stdio::null())
}

/// [`serve`], with the server's log (stderr) going to `log`.
fn serve_with(dir: &Path, log: Stdio) -> (Child, String) {
    let mut child = lethe(dir)
        .arg("serve")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("Listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();
    (child, addr)
}

/// A new, empty database `name` on the test PostgreSQL (one a killed run left is dropped
/// first): a connection to the server, to drop it at the end, and the database's URL.
fn fresh_database(name: &str) -> (postgres::Client, String) {
    let admin = std::env::var("LETHE_PG15_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut pg = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .unwrap();
    pg.batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    (pg, url)
}

fn wait_job(op: &Client, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = op.job(id).unwrap();
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "job never got there: {v}");
        std::thread::yield_now();
    }
}

#[test]
fn a_server_killed_mid_job_loses_nothing_and_the_job_resumes() {
    let dir = setup(&CONFIG);
    let (mut server, addr) = serve(dir.path());
    let rt = Client::new(&addr, RUNTIME);
    let op = Client::new(&addr, OPERATOR);
    let lease = rt.take_lease("acme", "alice", &[], 600_000).unwrap();
    let held = rt.take_permit(lease.lease_id, Sink::State).unwrap();
    let job = op
        .create_job(&json!({"tenant": "acme", "subject": "alice", "basis": "gdpr-art17", "ticket": "T-9", "drain_timeout_s": 600}))
        .unwrap();
    let job = job["job_id"].as_str().unwrap().to_string();
    // The job is FROZEN, waiting for the held permit to drain, when the server dies.
    let v = wait_job(&op, &job, |v| v["state"] != "REQUESTED");
    assert_eq!(v["state"], "FROZEN", "{v}");
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();

    let (mut server, addr) = serve(dir.path());
    let rt = Client::new(&addr, RUNTIME);
    assert!(
        rt.is_revoked(lease.lease_id).unwrap(),
        "the revocation survived"
    );
    assert_eq!(
        rt.take_permit(lease.lease_id, Sink::Tool)
            .unwrap_err()
            .code(),
        Some("revoked")
    );
    assert_eq!(
        rt.take_lease("acme", "alice", &[], 1_000)
            .unwrap_err()
            .code(),
        Some("fenced"),
        "the fence survived"
    );
    assert!(
        rt.take_lease("acme", "bob", &[], 1_000).is_ok(),
        "other subjects are served"
    );
    // The held work is cancelled; the job another process left is picked up and finishes.
    rt.confirm_cancelled(held).unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    let out = lethe(dir.path()).args(["work", "--json"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done[0]["job_id"], job.as_str());
    assert_eq!(done[0]["state"], "COMPLETE");
    let (mut server, addr) = serve(dir.path());
    let fresh = Client::new(&addr, RUNTIME)
        .take_lease("acme", "alice", &[], 1_000)
        .unwrap();
    assert_eq!(fresh.epoch, lease.epoch + 1, "the epoch was bumped once");
    server.kill().unwrap();
    server.wait().unwrap();
}

#[test]
fn bad_serve_config_refuses_to_start_with_a_clear_message() {
    let cases = [
        (
            CONFIG
                .replace(
                    "[[serve.token]]\nrole = \"operator\"\ntoken_file = \"operator.token\"\n",
                    "",
                )
                .replace(
                    "[[serve.token]]\nrole = \"runtime\"\ntoken_file = \"runtime.token\"\n",
                    "",
                ),
            "has no token",
        ),
        (
            CONFIG.replace("role = \"operator\"", "role = \"superuser\""),
            "role 'superuser' is unknown",
        ),
        (
            CONFIG.replace("pool = 4", "pool = 4\nthreads = 2"),
            "unknown field",
        ),
        (
            CONFIG.replace(
                "pool = 4",
                "pool = 4\ntls = { cert_file = \"no-such.crt\", key_file = \"no-such.key\" }",
            ),
            "serve.tls cert_file",
        ),
        (
            CONFIG.replace(
                "role = \"operator\"",
                "role = \"operator\"\nname = \"runtime-1\"",
            ),
            "is given twice",
        ),
        (
            CONFIG.replace("operator.token", "missing.token"),
            "missing.token",
        ),
        (
            CONFIG.replace(
                "sqlite:lethe-journal.db",
                "postgres://postgres@127.0.0.1:5432/lethe_serve_no_such_db",
            ),
            "create it first",
        ),
    ];
    for (config, expected) in cases {
        let dir = setup(&config);
        let out = lethe(dir.path()).arg("serve").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{expected}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "wanted '{expected}' in: {err}");
    }
    let dir = setup(&CONFIG);
    std::fs::write(dir.path().join("runtime.token"), "short\n").unwrap();
    let out = lethe(dir.path()).arg("serve").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
    let dir = setup(&CONFIG);
    chmod(&dir.path().join("operator.token"), 0o644);
    let out = lethe(dir.path()).arg("serve").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("readable by group or others"));
}

/// SIGTERM (what systemd and Kubernetes send) stops the server cleanly on either control
/// store: exit 0 and no panic. On PostgreSQL the engine's blocking journal client used to be
/// dropped on the runtime's threads, which panicked ("Cannot start a runtime from within a
/// runtime").
#[test]
fn sigterm_stops_the_server_cleanly_on_either_journal() {
    let db = format!("lethe_cs_{}", std::process::id());
    let (mut pg, url) = fresh_database(&db);
    for journal in ["sqlite:lethe-journal.db".to_string(), url] {
        let dir = setup(&CONFIG.replace("sqlite:lethe-journal.db", &journal));
        let err = std::fs::File::create(dir.path().join("serve.err")).unwrap();
        let mut child = lethe(dir.path())
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line.trim().strip_prefix("Listening on http://").unwrap();
        // Every kind of connection in use: a lease, a permit and its release.
        let rt = Client::new(addr, RUNTIME);
        let lease = rt.take_lease("acme", "alice", &[], 60_000).unwrap();
        let permit = rt.take_permit(lease.lease_id, Sink::State).unwrap();
        rt.release_permit(permit).unwrap();
        let killed = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        let err = std::fs::read_to_string(dir.path().join("serve.err")).unwrap();
        assert!(!err.contains("panicked"), "{journal}: {err}");
        assert_eq!(status.code(), Some(0), "{journal}: {err}");
    }
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .unwrap();
}

/// `lethe serve`'s hold on a PostgreSQL journal's gate authority is a session's. When the
/// server closes that session (a restart, an idle timeout, here `pg_terminate_backend`) and an
/// in-process gate takes the authority meanwhile, the server grants no lease, permit or renewal
/// (503, retryable) from the watchdog's next check (within 200 ms) for as long as that gate
/// holds it; once it is gone the server takes its hold back and grants again. Before, it went
/// on granting unaware. Defence in depth: the in-process gate's freezes write the journal's
/// tables and drain the permits they find there, the server's included (review), so a grant
/// inside those 200 ms is still drained.
#[test]
fn serve_grants_nothing_while_its_postgres_hold_on_the_gate_is_lost() {
    let db = format!("lethe_hold_{}", std::process::id());
    let (mut admin, url) = fresh_database(&db);
    let dir = setup(&CONFIG.replace("sqlite:lethe-journal.db", &url));
    let (mut child, addr) = serve(dir.path());
    let rt = Client::new(&addr, RUNTIME);
    let lease = rt.take_lease("acme", "alice", &[], 600_000).unwrap();
    let permit = rt.take_permit(lease.lease_id, Sink::Tool).unwrap();
    // The session holding the lock shared (key 0x006c_6574_6867: classid 0x6c, objid the rest).
    let mut kill_hold = || -> i64 {
        admin
            .query_one(
                "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN pg_database d \
                 ON d.oid = l.database WHERE d.datname = $1 AND l.locktype = 'advisory' \
                 AND l.classid = 108 AND l.objid = 1702127719 AND l.mode = 'ShareLock'",
                &[&db],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(kill_hold(), 1, "the server's hold");
    let journal = || lethe_journal::Journal::open_url(&url, dir.path()).unwrap();
    let gate = journal();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = Instant::now() + Duration::from_millis(500);
    while gate.hold_gate_authority().is_err() {
        assert!(
            Instant::now() < deadline,
            "the server's hold outlived its session"
        );
        // The server's watchdog takes its hold back as soon as it can (that is its job): on a
        // loaded machine it can do so before this thread's first try. Then end its new
        // session too, and try again.
        if Instant::now() > again {
            kill_hold();
            again = Instant::now() + Duration::from_millis(500);
        }
        std::thread::yield_now();
    }
    // The watchdog notices within its check interval; from then on nothing is granted.
    let refused = |e: &lethe_client::Error| e.code() == Some("unavailable");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rt.call(
            "POST",
            "/v1/leases",
            Some(&serde_json::json!({"tenant": "acme", "subject": "bob"})),
        ) {
            Err(e) if refused(&e) => break,
            _ => assert!(
                Instant::now() < deadline,
                "leases are still granted while an in-process gate holds the authority"
            ),
        }
        std::thread::yield_now();
    }
    let lid = lease.lease_id;
    for (path, body) in [
        (
            "/v1/leases",
            serde_json::json!({"tenant": "acme", "subject": "carol"}),
        ),
        (
            "/v1/permits",
            serde_json::json!({"lease_id": lid, "sink": "tool", "key": "k-1"}),
        ),
        (
            &format!("/v1/leases/{lid}/renew") as &str,
            serde_json::json!({"ttl_ms": 60_000}),
        ),
    ] {
        let e = rt.call("POST", path, Some(&body)).unwrap_err();
        assert_eq!(e.code(), Some("unavailable"), "{path}: {e}");
    }
    assert!(!gate
        .gate_authority_lost()
        .load(std::sync::atomic::Ordering::SeqCst));
    // The in-process gate goes; the server takes its hold back and grants again.
    drop(gate);
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match rt.take_lease("acme", "bob", &[], 60_000) {
            Ok(l) => break l,
            Err(e) => {
                assert!(refused(&e), "refused for another reason");
                assert!(
                    Instant::now() < deadline,
                    "the server never took its hold back"
                );
            }
        }
        std::thread::yield_now();
    };
    rt.take_permit(again.lease_id, Sink::State).unwrap();
    rt.release_permit(permit).unwrap();
    assert!(matches!(
        journal().hold_gate_authority(),
        Err(lethe_journal::JournalError::GateAuthorityTaken)
    ));
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
}

/// A stop is bounded even while a gate call waits on the control store: here a lease status
/// waits on a PostgreSQL lock the test holds. The call runs on a blocking thread the stop
/// cannot cut, and the process used to wait for it (49 s seen); its transaction is rolled back
/// when the process ends.
#[test]
fn a_stop_is_bounded_while_a_gate_call_waits_on_a_lock() {
    use std::io::{Read, Write};
    let db = format!("lethe_cl_{}", std::process::id());
    let (mut pg, url) = fresh_database(&db);
    let dir = setup(&CONFIG.replace("sqlite:lethe-journal.db", &url));
    let (mut child, addr) = serve(dir.path());
    let rt = Client::new(&addr, RUNTIME);
    let lease = rt.take_lease("acme", "bob", &[], 60_000).unwrap();
    let mut locker = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let waiting_addr = addr.clone();
    std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(&waiting_addr).unwrap();
        let _ = write!(
            c,
            "GET /v1/leases/{} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {RUNTIME}\r\n\r\n",
            lease.lease_id
        );
        let _ = c.read_to_end(&mut Vec::new());
    });
    // The call is waiting on the lock: PostgreSQL says so.
    let mut watch = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(Instant::now() < deadline, "the gate call never waited");
        std::thread::yield_now();
    }
    let asked = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let limit = Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if asked.elapsed() > limit {
            break None;
        }
        std::thread::yield_now();
    };
    let took = asked.elapsed();
    lock.rollback().unwrap();
    let status = status.unwrap_or_else(|| child.wait().unwrap());
    assert!(
        took < Duration::from_secs(20),
        "the stop took {took:?} (exit {status:?})"
    );
    assert_eq!(status.code(), Some(0));
    drop(watch);
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .unwrap();
}

/// One gate authority per journal: `lethe serve` refuses to start (exit 3) over a journal an
/// in-process gate governs, and while a server runs an in-process gate cannot load over its
/// journal (review: both ran, each granting permits the other never saw); on both journals.
#[test]
fn serve_and_an_in_process_gate_never_share_a_journal() {
    let (mut admin, url) = fresh_database("lethe_serve_authority");
    for journal in ["sqlite:lethe-journal.db".to_string(), url] {
        let dir = setup(&CONFIG.replace("sqlite:lethe-journal.db", &journal));
        assert_eq!(
            lethe(dir.path()).arg("jobs").status().unwrap().code(),
            Some(0)
        );
        let open = || lethe_journal::Journal::open_url(&journal, dir.path()).unwrap();
        let j = open();
        j.hold_gate_authority().unwrap();
        let mut refused = lethe(dir.path())
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while refused.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                refused.kill().unwrap();
                panic!(
                    "{journal}: `lethe serve` started over a journal an in-process gate governs"
                );
            }
            std::thread::yield_now();
        }
        let out = refused.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{journal}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("in-process gate (Engine::memory_gate) governs this journal"),
            "{err}"
        );
        drop(j);
        let (mut child, _addr) = serve(dir.path());
        assert!(matches!(
            open().hold_gate_authority(),
            Err(lethe_journal::JournalError::GateAuthorityTaken)
        ));
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone with the server (on PostgreSQL once its backend has ended).
        let deadline = Instant::now() + Duration::from_secs(10);
        while open().hold_gate_authority().is_err() {
            assert!(Instant::now() < deadline, "the server's hold outlived it");
            std::thread::yield_now();
        }
    }
    let _ = admin.batch_execute("DROP DATABASE IF EXISTS lethe_serve_authority WITH (FORCE)");
}

/// A token no client can send as written (non-ASCII bytes) refuses to start, and so does a
/// non-loopback address over plain HTTP unless `allow_plain_http = true`, which starts with a
/// warning.
#[test]
fn serve_refuses_a_token_no_client_can_send_and_plain_http_off_the_machine() {
    let dir = setup(&CONFIG);
    std::fs::write(
        dir.path().join("runtime.token"),
        "runtime-tökén-for-tests-01\n",
    )
    .unwrap();
    let out = lethe(dir.path()).arg("serve").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("visible ASCII"), "{err}");
    assert!(!err.contains("tökén"), "the token is not shown: {err}");

    let plain = CONFIG.replace("127.0.0.1:0", "0.0.0.0:0");
    let dir = setup(&plain);
    let out = lethe(dir.path()).arg("serve").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("over plain HTTP") && err.contains("allow_plain_http = true"),
        "{err}"
    );
    let dir = setup(&plain.replace("pool = 4", "pool = 4\nallow_plain_http = true"));
    let (mut child, addr) = serve_with(dir.path(), Stdio::piped());
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
    let mut warning = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut warning)
        .unwrap();
    assert!(
        warning.contains("WARN") && warning.contains("over plain HTTP"),
        "{warning}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
