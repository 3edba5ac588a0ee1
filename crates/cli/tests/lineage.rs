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
