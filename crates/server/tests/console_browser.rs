//! The console in a real browser: Debian's headless Chromium, driven through chromedriver's
//! WebDriver protocol (a few JSON calls over HTTP, below). An approver signs in, approves a
//! request another token made, watches its job reach COMPLETE and opens the certificate, whose
//! signature the page checks; each step fails when its page lacks the element it needs. The
//! inbox is checked at 1280x800 and on a phone's width. With `LETHE_SCREENSHOTS=DIR` set
//! (`scripts/screenshots`), the pages are saved there as PNG.
//!
//! Without a browser: a form posted without its CSRF token, and one posted after the session
//! expired, are refused and change nothing.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lethe_client::Client;
use lethe_core::clock::SystemClock;
use lethe_engine::config::Role;
use lethe_engine::{Config, Engine};
use lethe_journal::Journal;
use lethe_server::{Dpo, Hooks, Server, Token};
use serde_json::{json, Value};

const REQUESTER: &str = "requester-token-for-tests-01";
const APPROVER: &str = "approver-token-for-tests-001";

struct Env {
    _dir: tempfile::TempDir,
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Env {
    fn new(session_ttl: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        lethe_test_support::copy_memory(dir.path());
        let journal = format!("sqlite:{}", dir.path().join("journal.db").display());
        let config = format!(
            "[control]\njournal = \"{journal}\"\npolicy_version = \"test-1\"\n\n{}",
            lethe_test_support::TARGETS
        );
        let cfg = Config::parse(&config, dir.path(), "test").unwrap();
        let engine = Arc::new(Engine::open(cfg, Arc::new(SystemClock)).unwrap());
        let open = || Journal::open_url(&journal, dir.path()).unwrap();
        let s = common::spawn(Server {
            engine,
            journals: (0..2).map(|_| open()).collect(),
            watcher_journal: open(),
            tokens: vec![
                Token::new(REQUESTER, Role::Requester, "rita"),
                Token::new(APPROVER, Role::Approver, "alex"),
            ],
            dpo: Dpo {
                session_ttl,
                ..Dpo::default()
            },
            clock: Arc::new(SystemClock),
            hooks: Hooks::default(),
            sweep_every: Duration::from_secs(3600),
            idle_timeout: lethe_server::IDLE_TIMEOUT,
            tls: None,
            postgres: None,
        });
        Self {
            _dir: dir,
            addr: s.addr,
            stop: Some(s.stop),
            thread: Some(s.thread),
        }
    }

    /// A request by rita (the requester) for acme/alice, received `days_ago` days ago (CCPA).
    fn request(&self, days_ago: i64) -> String {
        let received = time::OffsetDateTime::now_utc() - time::Duration::days(days_ago);
        let made = Client::new(&self.addr, REQUESTER)
            .call(
                "POST",
                "/v1/requests",
                Some(&json!({"tenant": "acme", "subject": "alice", "basis": "ccpa",
                    "ticket": "DSR-42", "identity_verified": true,
                    "received_at": received.format(&time::format_description::well_known::Rfc3339).unwrap()})),
            )
            .unwrap();
        made["request_id"].as_str().unwrap().to_string()
    }

    fn state_of(&self, request: &str) -> Value {
        Client::new(&self.addr, APPROVER)
            .call("GET", &format!("/v1/requests/{request}"), None)
            .unwrap()["state"]
            .clone()
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

/// chromedriver on a port of its own, with one headless Chromium session.
struct Browser {
    driver: Child,
    base: String,
    agent: ureq::Agent,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/test installs it)");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut b = Self {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            agent,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while b.agent.get(format!("{}/status", b.base)).call().is_err() {
            assert!(Instant::now() < until, "chromedriver did not start");
            std::thread::yield_now();
        }
        // An implicit wait: after a form's submit the next page loads asynchronously, and a
        // lookup made before it is there waits for it instead of failing.
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome",
            "timeouts": {"implicit": 10000},
            "goog:chromeOptions": {"binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,800"]}}}});
        let v = b.post("/session", &caps);
        let id = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"));
        b.base = format!("{}/session/{id}", b.base);
        b
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let mut res = self
            .agent
            .post(format!("{}{path}", self.base))
            .content_type("application/json")
            .send(body.to_string())
            .unwrap();
        serde_json::from_str(&res.body_mut().read_to_string().unwrap()).unwrap()
    }

    fn get(&self, path: &str) -> Value {
        let mut res = self
            .agent
            .get(format!("{}{path}", self.base))
            .call()
            .unwrap();
        serde_json::from_str(&res.body_mut().read_to_string().unwrap()).unwrap()
    }

    fn open(&self, url: &str) {
        self.post("/url", &json!({"url": url}));
    }

    /// The element `css` selects on the current page; panics (the test fails) when there is
    /// none, naming it.
    fn find(&self, css: &str) -> String {
        let v = self.post("/element", &json!({"using": "css selector", "value": css}));
        v["value"][ELEMENT]
            .as_str()
            .unwrap_or_else(|| {
                let page = self.get("/source");
                panic!("no element {css} on the page ({v}): {}", page["value"])
            })
            .to_string()
    }

    fn has(&self, css: &str) -> bool {
        let v = self.post("/elements", &json!({"using": "css selector", "value": css}));
        v["value"].as_array().is_some_and(|a| !a.is_empty())
    }

    fn text(&self, css: &str) -> String {
        let e = self.find(css);
        self.get(&format!("/element/{e}/text"))["value"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn attribute(&self, css: &str, name: &str) -> String {
        let e = self.find(css);
        self.get(&format!("/element/{e}/attribute/{name}"))["value"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn type_in(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.post(&format!("/element/{e}/value"), &json!({"text": text}));
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.post(&format!("/element/{e}/click"), &json!({}));
    }

    fn script(&self, js: &str) -> Value {
        self.post("/execute/sync", &json!({"script": js, "args": []}))["value"].clone()
    }

    fn size(&self, width: u32, height: u32) {
        self.post("/window/rect", &json!({"width": width, "height": height}));
    }

    /// Saves the page as `DIR/name.png` when `LETHE_SCREENSHOTS=DIR` is set.
    fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("LETHE_SCREENSHOTS") else {
            return;
        };
        let png = self.get("/screenshot")["value"]
            .as_str()
            .map(base64)
            .unwrap();
        std::fs::write(PathBuf::from(dir).join(format!("{name}.png")), png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.agent.delete(&self.base).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = s
        .bytes()
        .filter(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
        .map(value)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

#[test]
fn an_approver_signs_in_approves_another_tokens_request_and_reads_the_certificate() {
    let env = Env::new(lethe_server::SESSION_TTL);
    // Due in four days: highlighted in the inbox.
    let id = env.request(41);
    let b = Browser::start();
    let console = format!("http://{}/console", env.addr);
    b.open(&console);
    b.find("#signin-form");
    b.type_in("#token", APPROVER);
    b.click("#signin");
    b.find("#inbox");
    let row = format!("tr[data-request='{id}']");
    assert!(
        b.attribute(&row, "class").contains("due"),
        "not highlighted"
    );
    assert_eq!(b.text(&format!("{row} td.days")), "4");
    assert!(b.text("header").contains("alex"));
    // The inbox names no one: scope kind and keyed hash only.
    assert!(!b.text("#inbox").contains("alice"));
    b.screenshot("inbox");
    // On a phone's width the page does not overflow; its table scrolls in its box.
    b.size(390, 844);
    b.find("#inbox");
    assert_eq!(
        b.script("return document.documentElement.scrollWidth <= window.innerWidth + 1"),
        json!(true)
    );
    b.screenshot("inbox-narrow");
    b.size(1280, 800);
    b.click(&format!("{row} form.approve button"));
    // The job's page; the job runs in the background: reload until COMPLETE.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        b.find("#timeline");
        if b.text("#job-state") == "COMPLETE" {
            break;
        }
        assert!(Instant::now() < until, "the job never completed");
        let url = b.get("/url")["value"].as_str().unwrap().to_string();
        b.open(&url);
    }
    let timeline = b.text("#timeline");
    for kind in [
        "job_requested",
        "fence_closed",
        "verified_clean",
        "completed",
    ] {
        assert!(
            timeline.contains(kind),
            "{kind} not in the timeline: {timeline}"
        );
    }
    assert!(!timeline.contains("alice"), "{timeline}");
    b.screenshot("job-timeline");
    b.click("#certificate-link");
    assert!(
        b.text("#signature-status").starts_with("Signature valid"),
        "{}",
        b.text("#signature-status")
    );
    let cert = b.text("#certificate");
    assert!(cert.contains("SUBJECT") && cert.contains("hmac:"), "{cert}");
    b.find("#targets");
    assert!(!b.text("main").contains("alice"));
    b.screenshot("certificate");
    assert_eq!(env.state_of(&id), json!("APPROVED"));
    // Signed out, the pages send to the sign-in form.
    b.click("#signout");
    b.open(&format!("{console}/inbox"));
    b.find("#signin-form");
    assert!(!b.has("#inbox"));
}

/// The console's session, signed in over plain HTTP as a browser would: the sign-in form's
/// CSRF cookie and field, then the session cookie.
struct Signed {
    agent: ureq::Agent,
    base: String,
    cookie: String,
    csrf: String,
}

fn field(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no {name} field"));
    let rest = &html[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_string()
}

fn cookies(res: &ureq::http::Response<ureq::Body>) -> HashMap<String, String> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next()?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sign_in(addr: &str, token: &str) -> Signed {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let base = format!("http://{addr}/console");
    let mut page = agent.get(format!("{base}/signin")).call().unwrap();
    let signin = cookies(&page)["lethe_signin"].clone();
    let csrf = field(&page.body_mut().read_to_string().unwrap(), "csrf");
    let res = agent
        .post(format!("{base}/signin"))
        .header("cookie", format!("lethe_signin={signin}"))
        .content_type("application/x-www-form-urlencoded")
        .send(format!("csrf={csrf}&token={token}"))
        .unwrap();
    assert_eq!(res.status(), 303);
    let cookie = format!("lethe_session={}", cookies(&res)["lethe_session"]);
    let mut inbox = agent
        .get(format!("{base}/inbox"))
        .header("cookie", &cookie)
        .call()
        .unwrap();
    let csrf = field(&inbox.body_mut().read_to_string().unwrap(), "csrf");
    Signed {
        agent,
        base,
        cookie,
        csrf,
    }
}

impl Signed {
    fn post(&self, path: &str, form: &str) -> (u16, String) {
        let mut res = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .content_type("application/x-www-form-urlencoded")
            .send(form)
            .unwrap();
        (
            res.status().as_u16(),
            res.body_mut().read_to_string().unwrap(),
        )
    }
}

#[test]
fn a_form_without_its_csrf_token_or_after_the_session_expired_does_nothing() {
    let env = Env::new(Duration::from_millis(300));
    let id = env.request(3);
    let s = sign_in(&env.addr, APPROVER);
    let approve = format!("/requests/{id}/approve");
    // Without the token, or with another: refused, nothing done.
    for form in ["", "csrf=0000"] {
        let (status, page) = s.post(&approve, form);
        assert_eq!(status, 403, "{page}");
        assert!(page.contains("CSRF"), "{page}");
    }
    // A sign-in without the form's own token is refused too.
    let (status, _) = s.post("/signin", &format!("token={APPROVER}"));
    assert_eq!(status, 403);
    assert_eq!(env.state_of(&id), json!("PENDING"));
    // The session expires: the post is refused with the reason, nothing done.
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(400) {
        std::thread::yield_now();
    }
    let (status, page) = s.post(&approve, &format!("csrf={}", s.csrf));
    assert_eq!(status, 401, "{page}");
    assert!(page.contains("session expired"), "{page}");
    assert_eq!(env.state_of(&id), json!("PENDING"));
    // Signed in again, the same form works.
    let s = sign_in(&env.addr, APPROVER);
    let (status, _) = s.post(&approve, &format!("csrf={}", s.csrf));
    assert_eq!(status, 303);
    assert_eq!(env.state_of(&id), json!("APPROVED"));
}
