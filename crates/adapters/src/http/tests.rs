//! The `http` target against an in-process double of a slow, flaky vendor: a tiny HTTP/1.1
//! server on 127.0.0.1 holding notes for several tenants and subjects, which can be told to
//! drop a connection (before or after applying a delete), answer 500 or 429 with
//! `Retry-After`, accept a delete with 202 and complete it after some polls, and which counts
//! requests by idempotency key.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lethe_core::Scope;
use percent_encoding::percent_decode_str;

use crate::conformance::{self, Case, Row};
use crate::{Adapter, AdapterError, Applicability};

use super::Config;

const TOKEN: &str = "vendor-token-s3cret-0123456789";

#[derive(Clone)]
struct Note {
    id: String,
    tenant: String,
    subject: String,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Locate,
    Erase,
    Status,
    Get,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Close the connection without an answer, before doing anything.
    DropBefore,
    /// Apply the request, then close the connection without an answer: a lost response.
    DropAfter,
    /// Answer this status, doing nothing.
    Status(u16),
    /// Answer 429 with this `Retry-After`, in seconds.
    TooMany(u64),
}

#[derive(Default)]
struct State {
    notes: Vec<Note>,
    faults: Vec<(Op, Fault)>,
    /// Requests seen per idempotency key.
    by_key: HashMap<String, usize>,
    /// Replay a delete's answer for a key already answered (as Stripe-like APIs do).
    replay: bool,
    answers: HashMap<String, (u16, String, Option<String>)>,
    /// Accept deletes with 202, completing after this many polls.
    async_polls: Option<u32>,
    /// op number -> (note id, polls left, key).
    ops: HashMap<u64, (String, u32)>,
    next_op: u64,
    /// The `deleted` a delete reports (1 unless told otherwise).
    report: Option<u64>,
    /// Every request's method and target, as sent.
    lines: Vec<String>,
    /// Authorization headers that were not the token.
    bad_auth: usize,
}

struct Vendor {
    state: Arc<Mutex<State>>,
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Drop for Vendor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Vendor {
    fn start(notes: Vec<Note>) -> Vendor {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            notes,
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    let _ = serve(c, &s);
                }
            }
        });
        Vendor { state, port, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    fn fault(&self, op: Op, f: Fault) {
        self.with(|s| s.faults.push((op, f)));
    }
}

struct Request {
    method: String,
    path: Vec<String>,
    query: HashMap<String, String>,
    key: Option<String>,
    auth: Option<String>,
    body: Vec<u8>,
}

fn read_request(c: &mut TcpStream) -> std::io::Result<(Request, String)> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let (mut len, mut key, mut auth) = (0, None, None);
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse().unwrap_or(0),
            "idempotency-key" => key = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let decode = |s: &str| percent_decode_str(s).decode_utf8().unwrap().into_owned();
    let req = Request {
        method: method.clone(),
        path: path.split('/').skip(1).map(decode).collect(),
        query: query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect(),
        key,
        auth,
        body,
    };
    Ok((req, format!("{method} {target}")))
}

fn respond(
    c: &mut TcpStream,
    status: u16,
    body: &str,
    extra: &[(&str, String)],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    c.write_all(format!("{head}\r\n{body}").as_bytes())
}

fn listing<'a>(notes: impl Iterator<Item = &'a Note>) -> String {
    let items: Vec<_> = notes.map(|n| serde_json::json!({ "id": n.id })).collect();
    serde_json::json!({ "results": items }).to_string()
}

fn serve(mut c: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let (req, line) = read_request(&mut c)?;
    let mut s = state.lock().unwrap();
    s.lines.push(line);
    if let Some(k) = &req.key {
        *s.by_key.entry(k.clone()).or_default() += 1;
    }
    let p: Vec<&str> = req.path.iter().map(String::as_str).collect();
    let op = match (req.method.as_str(), p.as_slice()) {
        ("GET", [""]) => return respond(&mut c, 200, "{}", &[]),
        ("POST", ["v1", "search"]) | ("GET", ["v1", "tenants", _, "notes"]) => Op::Locate,
        ("DELETE", ["v1", "notes", _]) => Op::Erase,
        ("GET", ["v1", "notes", _]) => Op::Get,
        ("GET", ["v1", "ops", _]) => Op::Status,
        _ => return respond(&mut c, 404, "{}", &[]),
    };
    if req.auth.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        s.bad_auth += 1;
        return respond(&mut c, 401, "{\"error\":\"bad token\"}", &[]);
    }
    let fault = s
        .faults
        .iter()
        .position(|(o, _)| *o == op)
        .map(|i| s.faults.remove(i).1);
    match fault {
        Some(Fault::DropBefore) => return Ok(()),
        Some(Fault::Status(code)) => return respond(&mut c, code, "{\"error\":\"x\"}", &[]),
        Some(Fault::TooMany(secs)) => {
            return respond(&mut c, 429, "{}", &[("Retry-After", secs.to_string())])
        }
        _ => {}
    }
    let drop_after = matches!(fault, Some(Fault::DropAfter));
    let (status, body, location) = match op {
        Op::Locate => {
            let (tenant, user) = if req.method == "POST" {
                let b: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
                (
                    b["tenant"].as_str().unwrap().to_string(),
                    b["user"].as_str().map(str::to_string),
                )
            } else {
                (req.path[2].clone(), None)
            };
            let l = listing(s.notes.iter().filter(|n| {
                n.tenant == tenant && user.as_ref().is_none_or(|u| *u == n.subject)
            }));
            (200, l, None)
        }
        Op::Get => match s.notes.iter().any(|n| n.id == req.path[2]) {
            true => (200, "{}".into(), None),
            false => (404, "{}".into(), None),
        },
        Op::Erase => {
            let key = req.key.clone().unwrap_or_default();
            if let Some(a) = s.answers.get(&key).filter(|_| s.replay).cloned() {
                a
            } else if !s
                .notes
                .iter()
                .any(|n| n.id == req.path[2] && Some(&n.tenant) == req.query.get("tenant"))
            {
                (404, "{\"error\":\"not found\"}".into(), None)
            } else if let Some(k) = s.async_polls {
                s.next_op += 1;
                let n = s.next_op;
                s.ops.insert(n, (req.path[2].clone(), k));
                let a = (202, format!("{{\"status_url\":\"/v1/ops/{n}\"}}"), Some(format!("/v1/ops/{n}")));
                s.answers.insert(key, a.clone());
                a
            } else {
                s.notes.retain(|n| n.id != req.path[2]);
                let a = (200, format!("{{\"deleted\":{}}}", s.report.unwrap_or(1)), None);
                s.answers.insert(key, a.clone());
                a
            }
        }
        Op::Status => {
            let n: u64 = req.path[2].parse().unwrap();
            let (id, left) = s.ops.get(&n).cloned().unwrap();
            if left > 1 {
                s.ops.insert(n, (id, left - 1));
                (200, "{\"state\":\"running\"}".into(), None)
            } else {
                s.ops.insert(n, (id.clone(), 0));
                let before = s.notes.len();
                s.notes.retain(|x| x.id != id);
                let gone = before - s.notes.len();
                (200, format!("{{\"state\":\"completed\",\"deleted\":{gone}}}"), None)
            }
        }
    };
    if drop_after {
        return Ok(());
    }
    let extra: Vec<(&str, String)> = location.into_iter().map(|l| ("Location", l)).collect();
    respond(&mut c, status, &body, &extra)
}

/// Tenants and subjects with awkward identifiers, and notes whose ids are awkward too.
fn seed() -> Vec<Note> {
    let subjects = [
        ("acme", "a/b"),
        ("acme", ".."),
        ("acme", "%2F"),
        ("acme", "?x=1"),
        ("acme", "zoë 用户"),
        ("acme", "u1"),
        ("acme", "u10"),
        ("acme/eu", "u1"),
        ("beta", "a/b"),
    ];
    let mut out = Vec::new();
    for (i, (t, s)) in subjects.iter().enumerate() {
        for j in 0..3 {
            let id = match j {
                0 => format!("n{i}"),
                1 => format!("n{i}0/x?y#%2F"),
                _ => format!("{i}-zoë"),
            };
            out.push(Note {
                id,
                tenant: t.to_string(),
                subject: s.to_string(),
                text: format!("note {j} of {s}"),
            });
        }
    }
    out
}

struct Double {
    vendor: Vendor,
    adapter: Box<dyn Adapter>,
    _dir: tempfile::TempDir,
}

impl Case for Double {
    fn adapter(&self) -> &dyn Adapter {
        &*self.adapter
    }

    fn snapshot(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self.vendor.with(|s| {
            s.notes
                .iter()
                .map(|n| Row {
                    table: "notes".into(),
                    bytes: format!("{}\0{}", n.id, n.text).into_bytes(),
                    owner: (n.tenant.clone(), n.subject.clone()),
                })
                .collect()
        });
        rows.sort();
        rows
    }
}

/// The config the tests use, with `extra` keys at the top and `tail` tables at the end.
fn config(url: &str, extra: &str, tail: &str) -> String {
    format!(
        "base_url = \"{url}\"\ntoken_file = \"vendor.token\"\nbackoff_ms = 1\n{extra}\n\
         [locate]\nmethod = \"POST\"\npath = \"/v1/search\"\n\
         body = {{ tenant = \"{{tenant}}\", user = \"{{subject}}\" }}\nitems = \"/results\"\nid = \"/id\"\n\
         [locate_tenant]\npath = \"/v1/tenants/{{tenant}}/notes\"\nitems = \"/results\"\nid = \"/id\"\n\
         [erase]\npath = \"/v1/notes/{{locator}}\"\nquery = {{ tenant = \"{{tenant}}\" }}\n\
         [get]\npath = \"/v1/notes/{{locator}}\"\n{tail}"
    )
}

fn double_with(notes: Vec<Note>, extra: &str, tail: &str) -> Double {
    let vendor = Vendor::start(notes);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("vendor.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let text = config(&vendor.url(), extra, tail);
    let adapter = Box::new(
        Config::parse(toml::from_str(&text).unwrap(), dir.path())
            .unwrap()
            .build("crm-notes"),
    );
    Double {
        vendor,
        adapter,
        _dir: dir,
    }
}

fn double() -> Double {
    double_with(seed(), "", "")
}

fn subject(t: &str, s: &str) -> Scope {
    Scope::from_parts(t, Some(s), None, None).unwrap()
}

#[test]
fn the_conformance_suite_passes_for_every_awkward_subject() {
    for (t, s) in [
        ("acme", "a/b"),
        ("acme", ".."),
        ("acme", "%2F"),
        ("acme", "?x=1"),
        ("acme", "zoë 用户"),
        ("acme", "u1"),
        ("acme/eu", "u1"),
    ] {
        let d = double();
        let out = conformance::run(&d, &subject(t, s), &|o| o.0 == t && o.1 == s, 2);
        assert_eq!(out.inventoried, 3, "{t}/{s}");
        // Identifiers crossed the wire only encoded: no raw `/`, `?`, `#` or `..` from them.
        let lines = d.vendor.with(|s| s.lines.clone());
        for l in &lines {
            let target = l.split(' ').nth(1).unwrap();
            assert!(!target.contains("/..") && !target.contains('#'), "{l}");
            assert!(target.matches('?').count() <= 1, "{l}");
        }
        assert_eq!(d.vendor.with(|s| s.bad_auth), 0);
    }
}

#[test]
fn the_conformance_suite_passes_for_a_tenant_through_a_flaky_vendor() {
    let d = double();
    // One of each: a dropped connection, 500 then 200, 429 with Retry-After: 0, a 503.
    d.vendor.fault(Op::Locate, Fault::DropBefore);
    d.vendor.fault(Op::Erase, Fault::Status(500));
    d.vendor.fault(Op::Erase, Fault::TooMany(0));
    d.vendor.fault(Op::Erase, Fault::DropBefore);
    d.vendor.fault(Op::Get, Fault::Status(503));
    let scope = Scope::from_parts("acme", None, None, None).unwrap();
    let out = conformance::run(&d, &scope, &|o| o.0 == "acme", 4);
    assert_eq!(out.inventoried, 21);
    assert!(d.vendor.with(|s| s.faults.is_empty()), "every fault was met");
    // Every retry of an erase carried the same key: one key a locator, some seen twice.
    let keys = d.vendor.with(|s| s.by_key.clone());
    assert!(keys.values().any(|n| *n >= 2));
}

/// The case: a delete the vendor applied whose answer was lost. The retry carries the
/// same idempotency key; the item counts once, whether the vendor replays its answer or says
/// 404; a second erase of the batch counts zero.
#[test]
fn a_lost_response_to_an_erase_is_not_double_counted() {
    for replay in [true, false] {
        let d = double();
        d.vendor.with(|s| s.replay = replay);
        let scope = subject("acme", "a/b");
        let inv = d.adapter.inventory(&scope).unwrap();
        assert_eq!(inv.count, 3);
        d.vendor.fault(Op::Erase, Fault::DropAfter);
        let erased = d.adapter.erase_batch(&scope, &inv.locators).unwrap();
        assert_eq!(erased, 3, "replay {replay}: each item once");
        let keys = d.vendor.with(|s| s.by_key.clone());
        let first = super::adapter::idempotency_key("crm-notes", "erase", &inv.locators[0].0);
        assert_eq!(keys[&first], 2, "the lost attempt and its retry share one key");
        assert_eq!(d.adapter.erase_batch(&scope, &inv.locators).unwrap(), 0);
        assert_eq!(d.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    }
    // Lost, and no retry left: the step is unavailable (the job BLOCKED); the rerun finds the
    // item gone and counts it zero, so the total never exceeds the inventory.
    let d = double_with(seed(), "retries = 0", "");
    d.vendor.with(|s| s.replay = true);
    let scope = subject("acme", "u1");
    let inv = d.adapter.inventory(&scope).unwrap();
    d.vendor.fault(Op::Erase, Fault::DropAfter);
    let e = d.adapter.erase_batch(&scope, &inv.locators[..1]).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(!e.to_string().contains("u1") && !e.to_string().contains("n5"), "{e}");
    assert_eq!(d.adapter.erase_batch(&scope, &inv.locators).unwrap(), 2);
    assert_eq!(d.adapter.verify(&scope, &inv.locators).unwrap(), 0);
}

#[test]
fn retries_honour_retry_after() {
    let d = double();
    d.vendor.fault(Op::Locate, Fault::TooMany(1));
    let started = Instant::now();
    assert_eq!(d.adapter.inventory(&subject("acme", "u1")).unwrap().count, 3);
    assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());
    // Longer than retry_after_max_ms: not waited out, the step is unavailable at once.
    let d = double_with(seed(), "retry_after_max_ms = 1000", "");
    d.vendor.fault(Op::Locate, Fault::TooMany(120));
    let started = Instant::now();
    let e = d.adapter.inventory(&subject("acme", "u1")).unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("Retry-After 120"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // 500 each time: retried `retries` times with backoff, then unavailable.
    let d = double_with(seed(), "retries = 2", "");
    for _ in 0..3 {
        d.vendor.fault(Op::Locate, Fault::Status(500));
    }
    let e = d.adapter.inventory(&subject("acme", "u1")).unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("3 attempts"), "{e}");
    assert!(d.vendor.with(|s| s.faults.is_empty()));
}

const STATUS: &str = "[status]\nurl = \"/status_url\"\ndone = \"/state\"\ndone_value = \"completed\"\n\
    deleted = \"/deleted\"\npoll_ms = 5\n";

#[test]
fn an_accepted_erase_is_polled_until_done_within_its_bound() {
    let d = double_with(seed(), "", STATUS);
    d.vendor.with(|s| s.async_polls = Some(3));
    let scope = subject("acme", "zoë 用户");
    let inv = d.adapter.inventory(&scope).unwrap();
    assert_eq!(d.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(d.adapter.verify(&scope, &inv.locators).unwrap(), 0);
    let status_key = super::adapter::idempotency_key("crm-notes", "status", &inv.locators[0].0);
    assert_eq!(d.vendor.with(|s| s.by_key[&status_key]), 3);

    // Not done within poll_timeout_ms: unavailable; a resume sends the same key, the vendor
    // recognises it (202 again, same operation) and the erase completes, counted once.
    let d = double_with(
        seed(),
        "",
        &format!("{STATUS}poll_timeout_ms = 30\n"),
    );
    d.vendor.with(|s| {
        s.async_polls = Some(1000);
        s.replay = true;
    });
    let scope = subject("beta", "a/b");
    let inv = d.adapter.inventory(&scope).unwrap();
    let e = d.adapter.erase_batch(&scope, &inv.locators[..1]).unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("poll_timeout_ms"), "{e}");
    d.vendor.with(|s| {
        for op in s.ops.values_mut() {
            op.1 = 1;
        }
        s.async_polls = Some(1);
    });
    assert_eq!(d.adapter.erase_batch(&scope, &inv.locators).unwrap(), 3);
    assert_eq!(d.vendor.with(|s| s.ops.len()), 3, "the resumed erase made no second operation");

    // A 202 and no [status] table: a clear failure, not a guess.
    let d = double();
    d.vendor.with(|s| s.async_polls = Some(1));
    let inv = d.adapter.inventory(&scope).unwrap();
    let e = d.adapter.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(e.to_string().contains("no `status` table"), "{e}");
}

#[test]
fn an_unreachable_vendor_is_unavailable() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let d = double();
    let text = config(&format!("http://127.0.0.1:{port}"), "retries = 1", "");
    let a = Config::parse(toml::from_str(&text).unwrap(), d._dir.path())
        .unwrap()
        .build("crm-notes");
    for e in [
        a.probe().unwrap_err(),
        a.inventory(&subject("acme", "u1")).unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Unavailable { .. }), "{e}");
        assert!(!e.to_string().contains("u1") && !e.to_string().contains(&port.to_string()), "{e}");
    }
    d.adapter.probe().unwrap();
}

/// A vendor that erases more than it was asked (reports 2 rows for a one-row item) is stopped
/// at that answer.
#[test]
fn a_vendor_that_erases_more_than_asked_trips_the_anomaly_guard() {
    let d = double_with(seed(), "", "");
    let text = config(&d.vendor.url(), "", "")
        .replace("query = { tenant = \"{tenant}\" }", "query = { tenant = \"{tenant}\" }\ndeleted = \"/deleted\"");
    let a = Config::parse(toml::from_str(&text).unwrap(), d._dir.path())
        .unwrap()
        .build("crm-notes");
    d.vendor.with(|s| s.report = Some(2));
    let scope = subject("acme", "%2F");
    let inv = a.inventory(&scope).unwrap();
    let e = a.erase_batch(&scope, &inv.locators).unwrap_err();
    assert!(
        matches!(e, AdapterError::AnomalousVolume { expected: 1, found: 2, .. }),
        "{e}"
    );
    assert_eq!(d.vendor.with(|s| s.lines.iter().filter(|l| l.starts_with("DELETE")).count()), 1, "stopped at the first");
}

#[test]
fn dot_identifiers_never_become_a_path_segment() {
    // A subject `..` where the erase path takes {subject} whole: inexpressible before anything.
    let d = double();
    let text = config(&d.vendor.url(), "", "")
        .replace("path = \"/v1/notes/{locator}\"\nquery", "path = \"/v1/users/{subject}/notes/{locator}\"\nquery");
    let a = Config::parse(toml::from_str(&text).unwrap(), d._dir.path())
        .unwrap()
        .build("crm-notes");
    let e = a.check_scope(&subject("acme", "..")).unwrap_err();
    assert!(matches!(e, AdapterError::Inexpressible { .. }) && e.to_string().contains("{subject}"), "{e}");
    assert_eq!(a.check_scope(&subject("acme", "a/b")).unwrap(), Applicability::Applies);
    // A tenant scope where erase needs {subject}: inexpressible.
    let e = a.check_scope(&Scope::from_parts("acme", None, None, None).unwrap()).unwrap_err();
    assert!(e.to_string().contains("{subject}"), "{e}");
    assert!(d.vendor.with(|s| s.lines.is_empty()), "nothing was sent");
    // The vendor lists an item with id `..`: the inventory refuses it.
    let mut notes = seed();
    notes[0].id = "..".into();
    let d = double_with(notes, "", "");
    let e = d.adapter.inventory(&subject("acme", "a/b")).unwrap_err();
    assert!(matches!(e, AdapterError::Inexpressible { .. }), "{e}");
    assert!(d.vendor.with(|s| s.lines.iter().all(|l| !l.starts_with("DELETE"))));
}

#[test]
fn scopes_without_their_request_are_refused_or_exempt() {
    let d = double();
    let text = config(&d.vendor.url(), "", "").replace(
        "[locate_tenant]\npath = \"/v1/tenants/{tenant}/notes\"\nitems = \"/results\"\nid = \"/id\"\n",
        "",
    );
    let a = Config::parse(toml::from_str(&text).unwrap(), d._dir.path())
        .unwrap()
        .build("crm-notes");
    let e = a.check_scope(&Scope::from_parts("acme", None, None, None).unwrap()).unwrap_err();
    assert!(matches!(e, AdapterError::Inexpressible { .. }) && e.to_string().contains("locate_tenant"), "{e}");
    let memory = Scope::from_parts("acme", Some("u1"), Some("m1"), None).unwrap();
    assert!(matches!(a.check_scope(&memory).unwrap(), Applicability::Exempt(_)));
}

/// The token goes only in the Authorization header: a refused token fails the step without
/// showing it, and neither the adapter's Debug nor its place holds it.
#[test]
fn the_token_is_sent_from_its_file_and_never_echoed() {
    let d = double();
    assert_eq!(d.adapter.inventory(&subject("acme", "u1")).unwrap().count, 3);
    assert_eq!(d.vendor.with(|s| s.bad_auth), 0);
    std::fs::write(d._dir.path().join("vendor.token"), "another-token-0000000000\n").unwrap();
    let text = config(&d.vendor.url(), "", "");
    let a = Config::parse(toml::from_str(&text).unwrap(), d._dir.path())
        .unwrap()
        .build("crm-notes");
    let e = a.inventory(&subject("acme", "u1")).unwrap_err();
    assert!(e.to_string().contains("401") && e.to_string().contains("token_file"), "{e}");
    for shown in [e.to_string(), format!("{a:?}"), a.place()] {
        assert!(!shown.contains("another-token") && !shown.contains(TOKEN), "{shown}");
    }
}

/// A `[[target]]` whose template would put an identifier into a raw URL path is refused when
/// the config is read, naming the key and not the value.
#[test]
fn a_raw_path_template_is_refused_when_the_config_is_read() {
    let d = double();
    for (from, to, says) in [
        ("/v1/notes/{locator}\"\nquery", "/v1/notes/id={locator}\"\nquery", "erase.path"),
        ("/v1/notes/{locator}\"\nquery", "/v1/notes/{+locator}\"\nquery", "raw or reserved"),
        ("/v1/tenants/{tenant}/notes", "/v1/t/{tenant}/notes?u={tenant}", "`locate_tenant.path`"),
    ] {
        let text = format!(
            "name = \"crm-notes\"\nkind = \"http\"\nclass = \"vendor\"\n{}",
            config(&d.vendor.url(), "", "").replacen(from, to, 1)
        );
        let e = crate::registry::build(1, toml::from_str(&text).unwrap(), d._dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("target crm-notes (http): ") && e.contains(says), "{e}");
    }
    assert!(d.vendor.with(|s| s.lines.is_empty()), "nothing was sent");
    let ok = format!(
        "name = \"crm-notes\"\nkind = \"http\"\nclass = \"vendor\"\n{}",
        config(&d.vendor.url(), "", "")
    );
    crate::registry::build(1, toml::from_str(&ok).unwrap(), d._dir.path()).unwrap();
}
