//! `POST /v1/lineage` end to end over real HTTP, on both control stores: edges recorded into a
//! `sql` target (a SQLite table of summaries that names no subject) are followed by a subject
//! erasure; refusals (a target not configured, a kind without lineage, a bad identifier, a
//! closed fence) store nothing.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lethe_client::{Client, Sink};
use lethe_core::clock::SystemClock;
use lethe_engine::config::Role;
use lethe_engine::{Config, Engine};
use lethe_journal::Journal;
use lethe_server::{Dpo, Hooks, Server, Token};
use serde_json::{json, Value};

const RUNTIME: &str = "runtime-token-for-tests-0001";
const OPERATOR: &str = "operator-token-for-tests-0001";

const SUMMARIES: &str = r#"
[[target]]
name = "summaries"
kind = "sql"
class = "summary"
path = "summaries.db"
table = "summaries"
locate = "SELECT id, 1 FROM summaries WHERE tenant = :tenant AND subject = :subject"
verify = "SELECT count(*) FROM summaries WHERE tenant = :tenant AND subject = :subject"
erase = "DELETE FROM summaries WHERE id = :locator"
"#;

fn journal_url(postgres: bool, dir: &Path) -> String {
    if postgres {
        lethe_test_support::new_database("lethe_lin").1
    } else {
        format!("sqlite:{}", dir.join("journal.db").display())
    }
}

struct Env {
    _dir: tempfile::TempDir,
    summaries: std::path::PathBuf,
    journal: String,
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Env {
    fn new(postgres: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        let summaries = dir.path().join("summaries.db");
        let c = rusqlite::Connection::open(&summaries).unwrap();
        c.execute_batch(
            "CREATE TABLE summaries (id TEXT PRIMARY KEY, tenant TEXT, subject TEXT, body TEXT);
             INSERT INTO summaries VALUES ('s-a1', 'acme', NULL, 'alice likes tea');
             INSERT INTO summaries VALUES ('s-a2', 'acme', NULL, 'alice lives in Lyon');
             INSERT INTO summaries VALUES ('s-b1', 'acme', NULL, 'bob likes coffee');",
        )
        .unwrap();
        drop(c);
        let journal = journal_url(postgres, dir.path());
        let config = format!(
            "[control]\njournal = \"{journal}\"\npolicy_version = \"test-1\"\n\n{}\n{SUMMARIES}",
            lethe_test_support::TARGETS
        );
        let cfg = Config::parse(&config, dir.path(), "test").unwrap();
        let engine = Arc::new(Engine::open(cfg, Arc::new(SystemClock)).unwrap());
        let open = || Journal::open_url(&journal, dir.path()).unwrap();
        let server = Server {
            engine,
            journals: (0..2).map(|_| open()).collect(),
            watcher_journal: open(),
            tokens: vec![
                Token::new(RUNTIME, Role::Runtime, "runtime"),
                Token::new(OPERATOR, Role::Operator, "operator"),
            ],
            dpo: Dpo::default(),
            clock: Arc::new(SystemClock),
            hooks: Hooks::default(),
            sweep_every: Duration::from_secs(3600),
            idle_timeout: lethe_server::IDLE_TIMEOUT,
            tls: None,
            postgres: postgres
                .then(|| lethe_postgres::Settings::from_url(&journal, dir.path()).unwrap()),
        };
        let s = common::spawn(server);
        Self {
            addr: s.addr,
            _dir: dir,
            summaries,
            journal,
            stop: Some(s.stop),
            thread: Some(s.thread),
        }
    }

    fn edges(&self) -> i64 {
        let sql = "SELECT count(*) FROM lineage";
        if let Some(path) = self.journal.strip_prefix("sqlite:") {
            let c = rusqlite::Connection::open(path).unwrap();
            return c.query_row(sql, [], |r| r.get(0)).unwrap();
        }
        let mut c = postgres::Client::connect(&self.journal, postgres::NoTls).unwrap();
        c.query_one(sql, &[]).unwrap().get(0)
    }

    fn rows(&self) -> Vec<(String, String)> {
        let c = rusqlite::Connection::open(&self.summaries).unwrap();
        let mut st = c
            .prepare("SELECT id, body FROM summaries ORDER BY id")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn wait_job(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let op = Client::new(&self.addr, OPERATOR);
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
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn refusal(rt: &Client, body: Value) -> (u16, String) {
    match rt.call("POST", "/v1/lineage", Some(&body)) {
        Err(lethe_client::Error::Refused {
            status,
            code,
            message,
        }) => (status, format!("{code}: {message}")),
        other => panic!("not refused: {other:?}"),
    }
}

fn edges_are_recorded_refused_and_followed(postgres: bool) {
    let env = Env::new(postgres);
    let rt = Client::new(&env.addr, RUNTIME);
    let before = env.rows();
    for (subject, locator, from) in [
        (
            "alice",
            "s-a1",
            json!([{"memory_id": "m1", "version": "v1"}]),
        ),
        ("alice", "s-a2", json!([{"memory_id": "m2"}])),
        ("bob", "s-b1", json!([])),
    ] {
        let answer = rt
            .call(
                "POST",
                "/v1/lineage",
                Some(
                    &json!({"tenant": "acme", "subject": subject, "target": "summaries",
                    "locator": locator, "from": from}),
                ),
            )
            .unwrap();
        assert_eq!(answer, Value::Null);
    }
    assert_eq!(env.edges(), 3);
    // Refused, nothing stored: a target not configured, a kind without lineage, a bad
    // identifier. No message quotes what was sent.
    for body in [
        json!({"tenant": "acme", "subject": "alice", "target": "zz-nowhere", "locator": "s-a1"}),
        json!({"tenant": "acme", "subject": "alice", "target": "memories", "locator": "s-a1"}),
        json!({"tenant": "acme", "subject": "", "target": "summaries", "locator": "s-a1"}),
        json!({"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "zz\u{1}"}),
        json!({"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "s-a1",
            "from": [{"memory_id": "zz-m\n"}]}),
    ] {
        let (status, message) = refusal(&rt, body);
        assert_eq!(status, 400, "{message}");
        assert!(message.starts_with("bad_request"), "{message}");
        assert!(!message.contains("zz"), "{message}");
    }
    assert_eq!(env.edges(), 3);
    // A permit held across alice's freeze keeps her job BLOCKED with its fence closed.
    let lease = rt.take_lease("acme", "alice", &[], 60_000).unwrap();
    let permit = rt.take_permit(lease.lease_id, Sink::State).unwrap();
    let op = Client::new(&env.addr, OPERATOR);
    let job = op
        .create_job(
            &json!({"tenant": "acme", "subject": "alice", "basis": "gdpr-art17",
            "ticket": "T-1", "drain_timeout_s": 0}),
        )
        .unwrap();
    let job = job["job_id"].as_str().unwrap().to_string();
    env.wait_job(&job, |v| v["state"] == "BLOCKED");
    let (status, message) = refusal(
        &rt,
        json!({"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "s-a3"}),
    );
    assert_eq!(
        (status, message.split(':').next().unwrap()),
        (409, "fenced")
    );
    assert_eq!(env.edges(), 3);
    // Released, resumed: both of alice's artifacts go, bob's row stays byte for byte.
    rt.release_permit(permit).unwrap();
    op.resume_job(&job, &json!({})).unwrap();
    let done = env.wait_job(&job, |v| v["state"] == "COMPLETE");
    assert_eq!(env.rows(), before[2..].to_vec(), "{done}");
}

#[test]
fn sqlite_edges_are_recorded_refused_and_followed() {
    edges_are_recorded_refused_and_followed(false);
}

#[test]
fn postgres_edges_are_recorded_refused_and_followed() {
    edges_are_recorded_refused_and_followed(true);
}
