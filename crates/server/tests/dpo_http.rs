//! The DPO's service over real HTTP: requests approved by a second token (never the one that
//! made them) on both control stores, bad requests refused with nothing stored, the intake
//! switch, `require_approval`; `/metrics` parsed by a Prometheus text-format parser and its
//! counters moved by a scripted run; one alert, signed, for a job due in four days.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use lethe_client::{Client, Sink};
use lethe_core::clock::SystemClock;
use lethe_engine::config::Role;
use lethe_engine::{Config, Engine};
use lethe_journal::Journal;
use lethe_server::{Dpo, Hooks, Server, Token, Webhook};
use serde_json::{json, Value};

const RUNTIME: &str = "runtime-token-for-tests-0001";
const OPERATOR: &str = "operator-token-for-tests-0001";
const REQUESTER: &str = "requester-token-for-tests-01";
const APPROVER: &str = "approver-token-for-tests-001";
const ADMIN: &str = "admin-token-for-tests-000001";
const HOOK_SECRET: &[u8] = b"webhook-secret-for-tests-0001";

struct Env {
    dir: tempfile::TempDir,
    journal: String,
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Env {
    fn new(postgres: bool, dpo: Dpo) -> Self {
        Self::with(postgres, dpo, "", |_| {})
    }

    /// As [`Env::new`], with `extra` config lines after the demo's targets, and `prepare` run
    /// on the folder before the server starts.
    fn with(postgres: bool, dpo: Dpo, extra: &str, prepare: impl FnOnce(&Path)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        prepare(dir.path());
        let journal = if postgres {
            lethe_test_support::new_database("lethe_dpo").1
        } else {
            format!("sqlite:{}", dir.path().join("journal.db").display())
        };
        let config = format!(
            "[control]\njournal = \"{journal}\"\npolicy_version = \"test-1\"\n\n{}\n{extra}",
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
                Token::new(RUNTIME, Role::Runtime, "agents"),
                Token::new(OPERATOR, Role::Operator, "platform"),
                Token::new(REQUESTER, Role::Requester, "rita"),
                Token::new(APPROVER, Role::Approver, "alex"),
                Token::new(ADMIN, Role::Admin, "ada"),
            ],
            dpo,
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
            dir,
            journal,
            stop: Some(s.stop),
            thread: Some(s.thread),
        }
    }

    /// Runs one statement on the control store, as someone with access to its database would.
    fn edit(&self, sql: &str) {
        if let Some(path) = self.journal.strip_prefix("sqlite:") {
            rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(sql)
                .unwrap();
        } else {
            let mut c = postgres::Client::connect(&self.journal, postgres::NoTls).unwrap();
            c.batch_execute(sql).unwrap();
        }
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

    fn metrics(&self) -> String {
        let mut res = ureq::get(format!("http://{}/metrics", self.addr))
            .header("authorization", format!("Bearer {OPERATOR}"))
            .call()
            .unwrap();
        assert!(res
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"));
        res.body_mut().read_to_string().unwrap()
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

/// Every row of the memory files that is not alice's, as text: what an erasure of alice must
/// leave byte for byte. Alice's rows name her (in text, or hex in a blob) or one of her threads
/// (the registry's, and those whose checkpoint metadata names her).
fn others_rows(dir: &Path) -> Vec<String> {
    let names_alice = |r: &str| {
        let r = r.to_lowercase();
        r.contains("alice") || r.contains(&hex::encode("alice"))
    };
    let mut all = Vec::new();
    for file in lethe_test_support::MEMORY_FILES {
        let c = rusqlite::Connection::open(dir.join("memory").join(file)).unwrap();
        let tables: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for t in tables {
            let cols: Vec<String> = c
                .prepare(&format!("SELECT name FROM pragma_table_info('{t}')"))
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let row = cols
                .iter()
                .map(|c| format!("quote(\"{c}\")"))
                .collect::<Vec<_>>()
                .join("||','||");
            let mut st = c
                .prepare(&format!("SELECT {row} FROM \"{t}\" ORDER BY 1"))
                .unwrap();
            for r in st.query_map([], |r| r.get::<_, String>(0)).unwrap() {
                all.push((t.clone(), r.unwrap()));
            }
        }
    }
    let threads: Vec<String> = all
        .iter()
        .filter(|(t, r)| names_alice(r) && (t == "checkpoints" || t == "thread_registry"))
        .map(|(t, r)| {
            let cols: Vec<&str> = r.split(',').collect();
            let thread = if t == "checkpoints" { cols[0] } else { cols[2] };
            thread.to_string()
        })
        .collect();
    all.into_iter()
        .filter(|(_, r)| !names_alice(r) && !threads.iter().any(|th| r.contains(th.as_str())))
        .map(|(t, r)| format!("{t}: {r}"))
        .collect()
}

/// Compares two row sets, saying only how they differ (a failure prints no memory dump).
fn same_rows(after: &[String], before: &[String]) {
    assert_eq!(
        after.len(),
        before.len(),
        "rows of other subjects changed in number"
    );
    if let Some((i, _)) = after
        .iter()
        .zip(before)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        panic!("row {i} of another subject changed");
    }
}

fn refused(c: &Client, method: &str, path: &str, body: Option<&Value>) -> (u16, String, String) {
    match c.call(method, path, body) {
        Err(lethe_client::Error::Refused {
            status,
            code,
            message,
        }) => (status, code, message),
        other => panic!("{method} {path} was not refused: {other:?}"),
    }
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

fn requests_are_approved_by_a_second_token(postgres: bool) {
    let env = Env::new(
        postgres,
        Dpo {
            require_approval: true,
            ..Dpo::default()
        },
    );
    let (req, appr, admin, op) = (
        Client::new(&env.addr, REQUESTER),
        Client::new(&env.addr, APPROVER),
        Client::new(&env.addr, ADMIN),
        Client::new(&env.addr, OPERATOR),
    );
    let before = others_rows(env.dir.path());
    assert!(before.len() > 5, "{before:?}");
    let now = time::OffsetDateTime::now_utc();
    let received = now - time::Duration::days(10);
    let ask = json!({"tenant": "acme", "subject": "alice", "basis": "ccpa", "ticket": "DSR-7",
        "received_at": rfc3339(received), "identity_verified": true});

    // Bad input: refused, clearly, and nothing stored.
    let future = json!({"tenant": "acme", "subject": "alice", "basis": "ccpa", "ticket": "DSR-7",
        "received_at": rfc3339(now + time::Duration::days(2)), "identity_verified": true});
    let unknown = json!({"tenant": "acme", "subject": "alice", "basis": "gdpr", "ticket": "DSR-7",
        "received_at": rfc3339(received), "identity_verified": true});
    let late = (received.date() + time::Duration::days(60)).to_string();
    let no_reason = json!({"tenant": "acme", "subject": "alice", "basis": "ccpa",
        "ticket": "DSR-7", "received_at": rfc3339(received), "identity_verified": true,
        "deadline": late});
    for (body, says) in [
        (&future, "in the future"),
        (&unknown, "unknown basis"),
        (&no_reason, "extension_reason"),
    ] {
        let (status, code, message) = refused(&req, "POST", "/v1/requests", Some(body));
        assert_eq!((status, code.as_str()), (400, "bad_request"), "{message}");
        assert!(message.contains(says), "{message}");
        assert!(!message.contains("alice"), "{message}");
    }
    assert_eq!(req.call("GET", "/v1/requests", None).unwrap(), json!([]));
    // Roles: a runtime cannot ask, a requester cannot approve.
    let rt = Client::new(&env.addr, RUNTIME);
    assert_eq!(refused(&rt, "POST", "/v1/requests", Some(&ask)).0, 403);

    // The deadline counts from receipt: CCPA, 45 days.
    let made = req.call("POST", "/v1/requests", Some(&ask)).unwrap();
    let id = made["request_id"].as_str().unwrap().to_string();
    let due = (received.date() + time::Duration::days(45)).to_string();
    assert_eq!(made["deadline"], json!(due));
    assert_eq!(made["state"], "PENDING");
    let approve = format!("/v1/requests/{id}/approve");
    assert_eq!(refused(&req, "POST", &approve, None).0, 403);
    // The same token never approves its own request, whatever its role.
    let own = admin
        .call(
            "POST",
            "/v1/requests",
            Some(&json!({"tenant": "acme",
        "subject": "bob", "basis": "gdpr-art17", "ticket": "DSR-8",
        "received_at": rfc3339(received), "identity_verified": true})),
        )
        .unwrap();
    let own_id = own["request_id"].as_str().unwrap();
    let (status, code, message) = refused(
        &admin,
        "POST",
        &format!("/v1/requests/{own_id}/approve"),
        None,
    );
    assert_eq!((status, code.as_str()), (403, "same_person"), "{message}");
    // The requests table edited to name another requester: the approval checks the row against
    // the chain's entry of its receipt and refuses; nothing starts.
    env.edit(&format!(
        "UPDATE requests SET requested_by = 'rita' WHERE request_id = '{own_id}'"
    ));
    let (status, code, message) = refused(
        &admin,
        "POST",
        &format!("/v1/requests/{own_id}/approve"),
        None,
    );
    assert_eq!((status, code.as_str()), (500, "corrupt"), "{message}");
    assert!(message.contains("was edited"), "{message}");
    assert_eq!(op.jobs().unwrap(), json!([]));
    env.edit(&format!(
        "UPDATE requests SET requested_by = 'ada' WHERE request_id = '{own_id}'"
    ));
    // A rejection needs its reason; with it, the request is closed.
    let reject = format!("/v1/requests/{own_id}/reject");
    assert_eq!(refused(&appr, "POST", &reject, Some(&json!({}))).0, 400);
    appr.call(
        "POST",
        &reject,
        Some(&json!({"reason": "duplicate of DSR-7"})),
    )
    .unwrap();
    assert_eq!(
        refused(
            &appr,
            "POST",
            &format!("/v1/requests/{own_id}/approve"),
            None
        )
        .1,
        "decided"
    );
    // Every job comes through a request.
    let (status, code, _) = refused(
        &op,
        "POST",
        "/v1/jobs",
        Some(&json!({"tenant": "acme", "subject": "alice", "basis": "gdpr-art17", "ticket": "T"})),
    );
    assert_eq!((status, code.as_str()), (403, "approval_required"));

    // The intake paused: new requests 503, then taken again.
    assert_eq!(refused(&appr, "POST", "/v1/intake/pause", None).0, 403);
    admin.call("POST", "/v1/intake/pause", None).unwrap();
    let (status, code, _) = refused(&req, "POST", "/v1/requests", Some(&ask));
    assert_eq!((status, code.as_str()), (503, "intake_paused"));
    admin.call("POST", "/v1/intake/resume", None).unwrap();

    // Approved by another token: the job runs to COMPLETE, its deadline the request's.
    let shown = appr
        .call("GET", &format!("/v1/requests/{id}"), None)
        .unwrap();
    assert_eq!(shown["subject"], "alice");
    let listed = appr.call("GET", "/v1/requests", None).unwrap();
    assert!(!listed.to_string().contains("alice"), "{listed}");
    let answer = appr.call("POST", &approve, None).unwrap();
    let job = answer["job_id"].as_str().unwrap().to_string();
    let done = env.wait_job(&job, |v| v["state"] == "COMPLETE");
    let cert = &done["certificate"];
    assert_eq!(
        cert["deadline"].as_str().map(|d| &d[..10]),
        Some(due.as_str()),
        "{cert}"
    );
    assert!(!cert.to_string().contains("alice"));
    let shown = appr
        .call("GET", &format!("/v1/requests/{id}"), None)
        .unwrap();
    assert_eq!(
        (
            &shown["state"],
            &shown["requested_by"],
            &shown["decided_by"],
            &shown["job_id"]
        ),
        (
            &json!("APPROVED"),
            &json!("rita"),
            &json!("alex"),
            &json!(job)
        )
    );
    same_rows(&others_rows(env.dir.path()), &before);
}

#[test]
fn sqlite_requests_are_approved_by_a_second_token() {
    requests_are_approved_by_a_second_token(false);
}

#[test]
fn postgres_requests_are_approved_by_a_second_token() {
    requests_are_approved_by_a_second_token(true);
}

/// The value of one sample of a metric with the label given (or none).
fn sample(text: &str, name: &str, label: Option<(&str, &str)>) -> f64 {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let found = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)));
    match found.map(|s| &s.value) {
        Some(prometheus_parse::Value::Counter(v))
        | Some(prometheus_parse::Value::Gauge(v))
        | Some(prometheus_parse::Value::Untyped(v)) => *v,
        Some(prometheus_parse::Value::Histogram(h)) => {
            h.iter().map(|b| b.count).fold(0.0, f64::max)
        }
        other => panic!("{name} {label:?}: {other:?} in\n{text}"),
    }
}

#[test]
fn metrics_move_as_a_scripted_run_says() {
    let env = Env::new(false, Dpo::default());
    let (rt, op, req, appr) = (
        Client::new(&env.addr, RUNTIME),
        Client::new(&env.addr, OPERATOR),
        Client::new(&env.addr, REQUESTER),
        Client::new(&env.addr, APPROVER),
    );
    let first = env.metrics();
    assert_eq!(
        sample(&first, "lethe_jobs", Some(("state", "COMPLETE"))),
        0.0
    );
    assert_eq!(sample(&first, "lethe_permits_active", None), 0.0);
    // One request approved and run to COMPLETE.
    let received = time::OffsetDateTime::now_utc() - time::Duration::days(3);
    let made = req
        .call(
            "POST",
            "/v1/requests",
            Some(&json!({"tenant": "acme", "subject": "alice",
            "basis": "gdpr-art17", "ticket": "DSR-1", "received_at": rfc3339(received),
            "identity_verified": true})),
        )
        .unwrap();
    let id = made["request_id"].as_str().unwrap();
    let job = appr
        .call("POST", &format!("/v1/requests/{id}/approve"), None)
        .unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    env.wait_job(&job, |v| v["state"] == "COMPLETE");
    // One job BLOCKED: bob's permit held across the freeze, no time to drain.
    let lease = rt.take_lease("acme", "bob", &[], 60_000).unwrap();
    let permit = rt.take_permit(lease.lease_id, Sink::State).unwrap();
    let text = env.metrics();
    assert_eq!(sample(&text, "lethe_permits_active", None), 1.0);
    let blocked = op
        .create_job(
            &json!({"tenant": "acme", "subject": "bob", "basis": "gdpr-art17",
            "ticket": "T-2", "drain_timeout_s": 0}),
        )
        .unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    env.wait_job(&blocked, |v| v["state"] == "BLOCKED");
    // Two refusals at the gate: the revoked lease's permit, and a stale one.
    for _ in 0..2 {
        assert!(rt.take_permit(lease.lease_id, Sink::Output).is_err());
    }
    let text = env.metrics();
    assert_eq!(
        sample(&text, "lethe_jobs", Some(("state", "COMPLETE"))),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "lethe_jobs", Some(("state", "BLOCKED"))), 1.0);
    assert_eq!(
        sample(
            &text,
            "lethe_jobs_blocked_total",
            Some(("reason", "undrained"))
        ),
        1.0
    );
    let refusals: f64 = ["revoked", "stale_epoch", "fenced"]
        .iter()
        .map(|r| {
            if text.contains(&format!("lethe_gate_refusals_total{{reason=\"{r}\"}}")) {
                sample(&text, "lethe_gate_refusals_total", Some(("reason", r)))
            } else {
                0.0
            }
        })
        .sum();
    assert_eq!(refusals, 2.0, "{text}");
    assert_eq!(
        sample(&text, "lethe_job_duration_seconds_count", None),
        1.0,
        "{text}"
    );
    let headroom = sample(&text, "lethe_deadline_headroom_seconds", None);
    assert!(
        headroom > 27.0 * 86_400.0 && headroom < 32.5 * 86_400.0,
        "{headroom}"
    );
    for name in ["alice", "bob", "acme"] {
        assert!(!text.contains(name), "{name} in\n{text}");
    }
    rt.release_permit(permit).unwrap();
}

/// One request a webhook received: its headers (names in lower case) and body.
/// When a delivery arrived (taken on arrival, not when the test reads it), its headers, its body.
type Received = (Instant, Vec<(String, String)>, Vec<u8>);

/// A webhook receiver on a port of its own: every request's headers and body, sent on. The
/// first `failures` requests are answered 503, the others 204.
fn receiver(failures: usize) -> (String, mpsc::Receiver<Received>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let mut conn = conn.unwrap();
            let arrived = Instant::now();
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut headers = Vec::new();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            loop {
                line.clear();
                r.read_line(&mut line).unwrap();
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                let (k, v) = l.split_once(':').unwrap();
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
            let len: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .map_or(0, |(_, v)| v.parse().unwrap());
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let answer: &[u8] = if n < failures {
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"
            };
            conn.write_all(answer).unwrap();
            if tx.send((arrived, headers, body)).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

#[test]
fn a_job_due_in_four_days_raises_one_signed_alert() {
    use hmac::{Hmac, Mac};
    let (url, alerts) = receiver(0);
    let env = Env::new(
        false,
        Dpo {
            webhooks: vec![Webhook {
                url,
                secret: HOOK_SECRET.to_vec(),
            }],
            watch_every: Duration::from_millis(50),
            alert_backoff: Duration::from_millis(50),
            ..Dpo::default()
        },
    );
    let (op, appr) = (
        Client::new(&env.addr, OPERATOR),
        Client::new(&env.addr, APPROVER),
    );
    // Held, so it stays REQUESTED, four days from its deadline.
    appr.call(
        "POST",
        "/v1/holds",
        Some(&json!({"tenant": "acme", "subject": "alice",
        "reason": "MATTER-1"})),
    )
    .unwrap();
    let deadline = (time::OffsetDateTime::now_utc().date() + time::Duration::days(4)).to_string();
    let (status, code, _) = refused(
        &op,
        "POST",
        "/v1/jobs",
        Some(
            &json!({"tenant": "acme", "subject": "alice", "basis": "gdpr-art17",
            "ticket": "T-4", "deadline": deadline}),
        ),
    );
    assert_eq!((status, code.as_str()), (409, "held"));
    let (_, headers, body) = alerts.recv_timeout(Duration::from_secs(30)).unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} header"))
    };
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(HOOK_SECRET).unwrap();
    mac.update(header("x-lethe-timestamp").as_bytes());
    mac.update(b".");
    mac.update(&body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(header("x-lethe-signature"), expected);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["alert"], "deadline");
    assert_eq!(v["days_left"], 4);
    assert_eq!(v["state"], "REQUESTED");
    assert!(v["scope_hash"].as_str().unwrap().starts_with("hmac:"));
    let text = String::from_utf8(body).unwrap();
    for id in ["alice", "acme", "MATTER"] {
        assert!(!text.contains(id), "{id} in {text}");
    }
    // Exactly one: the watcher runs on (ten more passes) and raises nothing more.
    let runs = |t: &str| sample(t, "lethe_watch_runs_total", None);
    let start = runs(&env.metrics());
    while runs(&env.metrics()) < start + 10.0 {
        std::thread::yield_now();
    }
    assert!(alerts.try_recv().is_err(), "a second alert was sent");
    assert_eq!(
        sample(
            &env.metrics(),
            "lethe_alerts_total",
            Some(("alert", "deadline"))
        ),
        1.0
    );
}

/// A receiver that fails twice gets the same alert three times (the third delivered), each
/// signed, the waits between them growing; the alert is raised once.
#[test]
fn a_failed_delivery_is_retried_with_backoff_and_raised_once() {
    let (url, alerts) = receiver(2);
    let env = Env::new(
        false,
        Dpo {
            webhooks: vec![Webhook {
                url,
                secret: HOOK_SECRET.to_vec(),
            }],
            watch_every: Duration::from_millis(50),
            alert_backoff: Duration::from_millis(200),
            ..Dpo::default()
        },
    );
    let (rt, op) = (
        Client::new(&env.addr, RUNTIME),
        Client::new(&env.addr, OPERATOR),
    );
    // A BLOCKED job: a permit held across the freeze, no time to drain.
    let lease = rt.take_lease("acme", "bob", &[], 60_000).unwrap();
    let permit = rt.take_permit(lease.lease_id, Sink::State).unwrap();
    let job = op
        .create_job(
            &json!({"tenant": "acme", "subject": "bob", "basis": "gdpr-art17",
            "ticket": "T-5", "drain_timeout_s": 0}),
        )
        .unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    env.wait_job(&job, |v| v["state"] == "BLOCKED");
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(alerts.recv_timeout(Duration::from_secs(30)).unwrap());
    }
    let ids: Vec<Value> = got
        .iter()
        .map(|(_, _, b)| serde_json::from_slice::<Value>(b).unwrap())
        .collect();
    assert!(ids.iter().all(|v| v == &ids[0]), "{ids:?}");
    assert_eq!(
        (&ids[0]["alert"], &ids[0]["reason"]),
        (&json!("blocked"), &json!("undrained"))
    );
    assert_eq!(ids[0]["job_id"], json!(job));
    // The waits double: at least 200 ms, then 400 ms.
    assert!(got[1].0 - got[0].0 >= Duration::from_millis(200));
    assert!(got[2].0 - got[1].0 >= Duration::from_millis(400));
    for (_, headers, body) in &got {
        let h = |n: &str| headers.iter().find(|(k, _)| k == n).unwrap().1.clone();
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(HOOK_SECRET).unwrap();
        mac.update(h("x-lethe-timestamp").as_bytes());
        mac.update(b".");
        mac.update(body);
        assert_eq!(
            h("x-lethe-signature"),
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        );
        assert!(!String::from_utf8_lossy(body).contains("bob"));
    }
    // Delivered: nothing more comes while the watcher runs on.
    let runs = |t: &str| sample(t, "lethe_watch_runs_total", None);
    let start = runs(&env.metrics());
    while runs(&env.metrics()) < start + 10.0 {
        std::thread::yield_now();
    }
    assert!(alerts.try_recv().is_err(), "sent again");
    assert_eq!(
        sample(
            &env.metrics(),
            "lethe_alerts_total",
            Some(("alert", "blocked"))
        ),
        1.0
    );
    rt.release_permit(permit).unwrap();
}

/// A completed job whose backup is kept past its retention (an artifact taken 40 days ago,
/// kept 35) raises one `backup_overdue` alert, signed, naming no one; a final certificate
/// would have settled it.
#[test]
fn a_backup_kept_past_its_retention_raises_one_alert() {
    let (url, alerts) = receiver(0);
    let env = Env::with(
        false,
        Dpo {
            webhooks: vec![Webhook {
                url,
                secret: HOOK_SECRET.to_vec(),
            }],
            watch_every: Duration::from_millis(50),
            alert_backoff: Duration::from_millis(50),
            ..Dpo::default()
        },
        "[[target]]\nname = \"nightly\"\nkind = \"backup-files\"\nclass = \"backup\"\n\
         path = \"backups\"\nretention_days = 35\ncovers = [\"checkpoints\"]\n",
        |dir| {
            std::fs::create_dir(dir.join("backups")).unwrap();
            let f = dir.join("backups/old.dump");
            std::fs::write(&f, b"a dump").unwrap();
            // A file's time is the system's: what the server compares it with.
            #[allow(clippy::disallowed_methods)]
            let old = std::time::SystemTime::now() - Duration::from_secs(40 * 86_400);
            std::fs::File::options()
                .write(true)
                .open(&f)
                .unwrap()
                .set_modified(old)
                .unwrap();
        },
    );
    let op = Client::new(&env.addr, OPERATOR);
    let job = op
        .call(
            "POST",
            "/v1/jobs",
            Some(&json!({"tenant": "acme", "subject": "alice", "basis": "gdpr-art17", "ticket": "T-B"})),
        )
        .unwrap();
    let id = job["job_id"].as_str().unwrap().to_string();
    let done = env.wait_job(&id, |v| v["state"] == "COMPLETE");
    assert_eq!(
        done["certificate"]["targets"]["nightly"]["status"], "PENDING_EXPIRY",
        "{done}"
    );
    let (_, _, body) = loop {
        let got = alerts.recv_timeout(Duration::from_secs(30)).unwrap();
        let v: Value = serde_json::from_slice(&got.2).unwrap();
        if v["alert"] == "backup_overdue" {
            break got;
        }
    };
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["job_id"], id.as_str());
    assert_eq!(v["backup_expiry"], done["certificate"]["backup_expiry"]);
    let text = String::from_utf8(body).unwrap();
    for who in ["alice", "acme", "old.dump"] {
        assert!(!text.contains(who), "{who} in {text}");
    }
    let runs = |t: &str| sample(t, "lethe_watch_runs_total", None);
    let start = runs(&env.metrics());
    while runs(&env.metrics()) < start + 10.0 {
        std::thread::yield_now();
    }
    assert_eq!(
        sample(
            &env.metrics(),
            "lethe_alerts_total",
            Some(("alert", "backup_overdue"))
        ),
        1.0
    );
}

/// `POST /v1/jobs/batch`: every entry checked before any job exists; then each scope its own
/// job and certificate, run one after another; a held scope stays REQUESTED.
#[test]
fn a_batch_makes_one_job_a_scope_and_a_bad_entry_makes_none() {
    let env = Env::new(false, Dpo::default());
    let (op, appr) = (
        Client::new(&env.addr, OPERATOR),
        Client::new(&env.addr, APPROVER),
    );
    let job = |subject: &str| json!({"tenant": "acme", "subject": subject, "basis": "gdpr-art17", "ticket": "T-BATCH"});
    let jobs_now = |op: &Client| {
        op.call("GET", "/v1/jobs", None)
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    for (bad, says) in [
        (json!({"jobs": [job("alice"), job("")]}), "jobs[1]"),
        (
            json!({"jobs": [job("alice"), job("alice")]}),
            "the same scope",
        ),
        (
            json!({"jobs": [job("alice"), {"tenant": "acme", "subject": "bob", "basis": "nope", "ticket": "T"}]}),
            "jobs[1]",
        ),
        (json!({"jobs": []}), "1 to 10000"),
    ] {
        let (status, code, message) = refused(&op, "POST", "/v1/jobs/batch", Some(&bad));
        assert_eq!((status, code.as_str()), (400, "bad_request"), "{message}");
        assert!(message.contains(says), "{message}");
        assert!(!message.contains("alice"), "{message}");
    }
    assert_eq!(jobs_now(&op), 0, "no job made by a refused batch");
    appr.call(
        "POST",
        "/v1/holds",
        Some(&json!({"tenant": "acme", "subject": "carol", "reason": "MATTER-2"})),
    )
    .unwrap();
    let out = op
        .call(
            "POST",
            "/v1/jobs/batch",
            Some(&json!({"jobs": [job("alice"), job("bob"), job("carol")]})),
        )
        .unwrap();
    let entries = out["jobs"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[2]["held"], true);
    assert_eq!(entries[2]["state"], "REQUESTED");
    // One GET that waits for the job to end, instead of polling; a wait too long, or another
    // query parameter, is refused.
    let first = format!("/v1/jobs/{}", entries[0]["job_id"].as_str().unwrap());
    let waited = op
        .call("GET", &format!("{first}?wait_ms=30000"), None)
        .unwrap();
    assert_eq!(waited["state"], "COMPLETE", "{waited}");
    for bad in ["?wait_ms=30001", "?wait=5", "?wait_ms=soon"] {
        let (status, _, message) = refused(&op, "GET", &format!("{first}{bad}"), None);
        assert_eq!(status, 400, "{bad}: {message}");
    }
    // A job that cannot end while held answers where it stands once the wait has passed.
    let held = format!("/v1/jobs/{}", entries[2]["job_id"].as_str().unwrap());
    let t = std::time::Instant::now();
    let v = op
        .call("GET", &format!("{held}?wait_ms=300"), None)
        .unwrap();
    assert_eq!(v["state"], "REQUESTED");
    assert!(t.elapsed() >= Duration::from_millis(300), "it waited");
    for e in &entries[..2] {
        assert_eq!(e["held"], false);
        let done = env.wait_job(e["job_id"].as_str().unwrap(), |v| v["state"] == "COMPLETE");
        assert!(done["certificate"]["signature"].is_string());
    }
    assert_ne!(entries[0]["job_id"], entries[1]["job_id"]);
    assert_eq!(
        op.job(entries[2]["job_id"].as_str().unwrap()).unwrap()["state"],
        "REQUESTED"
    );
}
