//! `lethe lineage add`: an edge from a file or standard input, followed by the next erasure;
//! bad input refused with exit 2 and nothing stored.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const CONFIG: &str = r#"
[control]
journal = "sqlite:journal.db"

[[target]]
name = "summaries"
kind = "sql"
class = "summary"
path = "app.db"
table = "summaries"
locate = "SELECT id, 1 FROM summaries WHERE tenant = :tenant AND subject = :subject"
verify = "SELECT count(*) FROM summaries WHERE tenant = :tenant AND subject = :subject"
erase = "DELETE FROM summaries WHERE id = :locator"
"#;

fn lethe(dir: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lethe"))
        .arg("--config")
        .arg(dir.join("lethe.toml"))
        .args(args)
        .env_remove("LETHE_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

fn edges(dir: &std::path::Path) -> i64 {
    let c = rusqlite::Connection::open(dir.join("journal.db")).unwrap();
    c.query_row(
        "SELECT (SELECT count(*) FROM lineage) + (SELECT count(*) FROM lineage_links)",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn an_edge_from_standard_input_is_followed_and_bad_ones_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lethe.toml"), CONFIG).unwrap();
    let app = rusqlite::Connection::open(dir.path().join("app.db")).unwrap();
    app.execute_batch(
        "CREATE TABLE summaries (id TEXT PRIMARY KEY, tenant TEXT, subject TEXT, body TEXT);
         INSERT INTO summaries VALUES ('s-1', 'acme', NULL, 'from alice');
         INSERT INTO summaries VALUES ('s-2', 'acme', NULL, 'digest of s-1');
         INSERT INTO summaries VALUES ('s-3', 'acme', NULL, 'from bob');",
    )
    .unwrap();
    for bad in [
        "[\"acme\", \"alice\", \"summaries\", \"s-1\"]",
        r#"{"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "s-1", "extra": 1}"#,
        r#"{"tenant": "acme", "subject": "alice", "target": "nowhere", "locator": "s-1"}"#,
        r#"{"tenant": "acme", "subject": "", "target": "summaries", "locator": "s-1"}"#,
        r#"{"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "s-2", "from_artifacts": [{"target": "nowhere", "locator": "s-1"}]}"#,
    ] {
        let o = lethe(dir.path(), &["lineage", "add", "-"], bad);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("alice"),
            "no identifier in the message: {err}"
        );
    }
    let ok = [
        r#"{"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "s-1"}"#,
        r#"{"tenant": "acme", "subject": "alice", "target": "summaries", "locator": "s-2", "from_artifacts": [{"target": "summaries", "locator": "s-1"}]}"#,
        r#"{"tenant": "acme", "subject": "bob", "target": "summaries", "locator": "s-3"}"#,
    ];
    if dir.path().join("journal.db").exists() {
        assert_eq!(edges(dir.path()), 0, "nothing stored by the refused edges");
    }
    for e in ok {
        let o = lethe(dir.path(), &["lineage", "add", "-"], e);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(edges(dir.path()), 3, "two edges and one link");
    let o = lethe(
        dir.path(),
        &[
            "erase",
            "--tenant",
            "acme",
            "--subject",
            "alice",
            "--basis",
            "gdpr-art17",
            "--ticket",
            "T-1",
            "--json",
        ],
        "",
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["certificate"]["targets"]["summaries"]["count"], 2);
    let left: Vec<String> = app
        .prepare("SELECT id || ':' || body FROM summaries")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(left, ["s-3:from bob"]);
    assert_eq!(
        edges(dir.path()),
        1,
        "alice's edges and the link are dropped, bob's kept"
    );
}

/// A node-cache entry recorded by lineage alone (no subject index) is owned, not legacy: with
/// `legacy = "refuse"` a memory erasure takes exactly the entry derived from that memory and
/// completes; another subject's entry, and the one from another memory, stay byte for byte.
#[test]
fn a_cache_entry_recorded_by_lineage_alone_is_not_legacy() {
    let url = std::env::var("LETHE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("lethe-test:lgc-lin:{}:", std::process::id());
    std::fs::write(
        dir.path().join("lethe.toml"),
        format!(
            "[control]\njournal = \"sqlite:journal.db\"\n\n[[target]]\nname = \"node-cache\"\n\
             kind = \"langgraph-redis-cache\"\nclass = \"cache\"\nurl = \"{url}\"\ndb = 9\n\
             prefix = \"{prefix}\"\nindex = \"lethe-test:lgc-lin-idx:{}:{{tenant}}:{{subject}}\"\n\
             legacy = \"refuse\"\n",
            std::process::id()
        ),
    )
    .unwrap();
    let redis = |args: &[&str]| {
        let port = url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .to_string();
        let o = Command::new("redis-cli")
            .args(["-p", &port, "-n", "9"])
            .args(args)
            .output()
            .expect("redis-cli on the PATH");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let keys = [
        (
            format!("{prefix}summarize:h1"),
            "alice",
            "m1",
            "alice's tea, summarized",
        ),
        (
            format!("{prefix}summarize:h2"),
            "alice",
            "m2",
            "alice's city, summarized",
        ),
        (
            format!("{prefix}summarize:h3"),
            "bob",
            "m1",
            "bob's coffee, summarized",
        ),
    ];
    for (k, subject, memory, value) in &keys {
        redis(&["SET", k, value]);
        let edge = format!(
            r#"{{"tenant": "acme", "subject": "{subject}", "target": "node-cache", "locator": "{k}", "from": [{{"memory_id": "{memory}"}}]}}"#
        );
        let o = lethe(dir.path(), &["lineage", "add", "-"], &edge);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = lethe(
        dir.path(),
        &[
            "erase",
            "--tenant",
            "acme",
            "--subject",
            "alice",
            "--memory",
            "m1",
            "--version",
            "v1",
            "--basis",
            "gdpr-art17",
            "--ticket",
            "T-C",
            "--json",
        ],
        "",
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        out["certificate"]["targets"]["node-cache"]["count"], 1,
        "{out}"
    );
    assert_eq!(redis(&["EXISTS", &keys[0].0]), "0");
    assert_eq!(redis(&["GET", &keys[1].0]), keys[1].3);
    assert_eq!(redis(&["GET", &keys[2].0]), keys[2].3);
    for (k, ..) in &keys {
        redis(&["DEL", k]);
    }
}
