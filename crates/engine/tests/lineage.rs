//! Lineage through the engine: edges recorded into a `sql` target (a SQLite table of
//! summaries that names no subject), followed by memory and subject erasures.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lethe_core::clock::ManualClock;
use lethe_core::{Basis, MemoryId, Scope, Subject, Tenant, Version};
use lethe_engine::{Config, Engine, EngineError, Request, RunOptions};

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
locate_memory = "SELECT id, 1 FROM summaries WHERE tenant = :tenant AND subject = :subject AND id = :memory_id"
verify_memory = "SELECT count(*) FROM summaries WHERE tenant = :tenant AND subject = :subject AND id = :memory_id"
erase = "DELETE FROM summaries WHERE id = :locator"
"#;

/// A folder with the summaries table: three derived rows whose `subject` is NULL (the
/// pipeline that wrote them knew no subject), so only lineage finds them.
fn setup() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let c = rusqlite::Connection::open(dir.path().join("app.db")).unwrap();
    c.execute_batch(
        "CREATE TABLE summaries (id TEXT PRIMARY KEY, tenant TEXT, subject TEXT, body TEXT);
         INSERT INTO summaries VALUES ('s-a1', 'acme', NULL, 'alice likes tea (from m1)');
         INSERT INTO summaries VALUES ('s-a2', 'acme', NULL, 'alice lives in Lyon (from m2)');
         INSERT INTO summaries VALUES ('s-b1', 'acme', NULL, 'bob likes coffee');",
    )
    .unwrap();
    drop(c);
    let clock = Arc::new(ManualClock::new(
        time::macros::datetime!(2026-12-02 10:00 UTC),
    ));
    let cfg = Config::parse(CONFIG, dir.path(), "test").unwrap();
    (dir, Engine::open(cfg, clock).unwrap())
}

fn ids() -> (Tenant, Subject, Subject) {
    (
        Tenant::new("acme").unwrap(),
        Subject::new("alice").unwrap(),
        Subject::new("bob").unwrap(),
    )
}

fn from(m: &str, v: &str) -> Vec<(MemoryId, Option<Version>)> {
    vec![(MemoryId::new(m).unwrap(), Some(Version::new(v).unwrap()))]
}

fn record_three(engine: &Engine) {
    let (acme, alice, bob) = ids();
    engine
        .record_lineage(&acme, &alice, "summaries", "s-a1", &from("m1", "v1"))
        .unwrap();
    engine
        .record_lineage(&acme, &alice, "summaries", "s-a2", &from("m2", "v1"))
        .unwrap();
    engine
        .record_lineage(&acme, &bob, "summaries", "s-b1", &[])
        .unwrap();
}

fn rows(dir: &Path) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open(dir.join("app.db")).unwrap();
    let mut st = c
        .prepare("SELECT id, body FROM summaries ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn erase(engine: &Engine, scope: Scope, ticket: &str) -> lethe_engine::Outcome {
    let req = Request {
        scope,
        basis: Basis::GdprArt17,
        ticket: ticket.into(),
        deadline: None,
        extension_reason: None,
    };
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(5),
        ..RunOptions::default()
    };
    engine.erase(req, &opts, &mut |_| {}).unwrap()
}

#[test]
fn a_memory_erasure_takes_its_artifact_and_a_subject_erasure_all_of_hers() {
    let (dir, engine) = setup();
    record_three(&engine);
    let (acme, alice, _) = ids();
    let before = rows(dir.path());
    let out = erase(
        &engine,
        Scope::Memory {
            tenant: acme.clone(),
            subject: alice.clone(),
            memory: MemoryId::new("m1").unwrap(),
            version: Some(Version::new("v1").unwrap()),
        },
        "T-1",
    );
    assert_eq!(out.state.to_string(), "COMPLETE", "{out:?}");
    let after = rows(dir.path());
    assert_eq!(
        after,
        before[1..].to_vec(),
        "exactly the artifact derived from m1 goes"
    );
    let out = erase(
        &engine,
        Scope::Subject {
            tenant: acme,
            subject: alice,
        },
        "T-2",
    );
    assert_eq!(out.state.to_string(), "COMPLETE", "{out:?}");
    assert_eq!(
        rows(dir.path()),
        before[2..].to_vec(),
        "alice's artifacts go, bob's row is byte-identical"
    );
}

#[test]
fn another_version_of_the_memory_does_not_reach_an_artifact_of_v1() {
    let (dir, engine) = setup();
    record_three(&engine);
    let (acme, alice, _) = ids();
    let before = rows(dir.path());
    let out = erase(
        &engine,
        Scope::Memory {
            tenant: acme,
            subject: alice,
            memory: MemoryId::new("m1").unwrap(),
            version: Some(Version::new("v2").unwrap()),
        },
        "T-3",
    );
    assert_eq!(out.state.to_string(), "COMPLETE", "{out:?}");
    assert_eq!(rows(dir.path()), before);
}

fn edges(dir: &Path) -> i64 {
    let c = rusqlite::Connection::open(dir.join("journal.db")).unwrap();
    c.query_row("SELECT count(*) FROM lineage", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn an_unknown_target_or_a_bad_locator_is_refused_and_nothing_stored() {
    let (dir, engine) = setup();
    let (acme, alice, _) = ids();
    let e = engine
        .record_lineage(&acme, &alice, "nowhere", "s-a1", &[])
        .unwrap_err();
    assert!(matches!(e, EngineError::Input(_)), "{e}");
    assert!(!e.to_string().contains("nowhere"), "{e}");
    for bad in ["", "a\nb"] {
        let e = engine
            .record_lineage(&acme, &alice, "summaries", bad, &[])
            .unwrap_err();
        assert!(matches!(e, EngineError::Input(_)), "{e}");
    }
    assert_eq!(edges(dir.path()), 0);
}

#[test]
fn an_edge_under_a_closed_fence_is_refused() {
    let (dir, engine) = setup();
    let (acme, alice, bob) = ids();
    let req = Request {
        scope: Scope::Subject {
            tenant: acme.clone(),
            subject: alice.clone(),
        },
        basis: Basis::GdprArt17,
        ticket: "T-4".into(),
        deadline: None,
        extension_reason: None,
    };
    let (job, _) = engine.request(req).unwrap();
    engine
        .gate_authority()
        .freeze("2026-12-02T10:00:00Z", &job, None)
        .unwrap();
    let e = engine
        .record_lineage(&acme, &alice, "summaries", "s-a1", &from("m1", "v1"))
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::Journal(lethe_journal::JournalError::Gate(
                lethe_gate::GateError::Fenced
            ))
        ),
        "{e}"
    );
    assert_eq!(edges(dir.path()), 0);
    // Another subject's fence is open.
    engine
        .record_lineage(&acme, &bob, "summaries", "s-b1", &[])
        .unwrap();
    assert_eq!(edges(dir.path()), 1);
}

fn links(dir: &Path) -> i64 {
    let c = rusqlite::Connection::open(dir.join("journal.db")).unwrap();
    c.query_row("SELECT count(*) FROM lineage_links", [], |r| r.get(0))
        .unwrap()
}

/// A summary of a summary (and of that one): erasing the memory the first came from takes the
/// whole chain, nothing else; the erased artifacts' edges are dropped at completion, others'
/// kept.
#[test]
fn an_artifact_derived_from_an_artifact_is_reached_transitively_and_its_edges_dropped() {
    let (dir, engine) = setup();
    record_three(&engine);
    let (acme, alice, bob) = ids();
    let c = rusqlite::Connection::open(dir.path().join("app.db")).unwrap();
    c.execute_batch(
        "INSERT INTO summaries VALUES ('s-a1x', 'acme', NULL, 'a digest of s-a1');
         INSERT INTO summaries VALUES ('s-a1xx', 'acme', NULL, 'a digest of the digest');
         INSERT INTO summaries VALUES ('s-mix', 'acme', NULL, 'a weekly digest of everyone');",
    )
    .unwrap();
    drop(c);
    let art = |l: &str| vec![("summaries".to_string(), l.to_string())];
    engine
        .record_lineage_from(&acme, &alice, "summaries", "s-a1x", &[], &art("s-a1"))
        .unwrap();
    engine
        .record_lineage_from(&acme, &alice, "summaries", "s-a1xx", &[], &art("s-a1x"))
        .unwrap();
    // Bob's weekly digest, derived from his own summary and from alice's digest of digests.
    let mix = vec![
        ("summaries".to_string(), "s-b1".to_string()),
        ("summaries".to_string(), "s-a1xx".to_string()),
    ];
    engine
        .record_lineage_from(&acme, &bob, "summaries", "s-mix", &[], &mix)
        .unwrap();
    let e = engine
        .record_lineage_from(
            &acme,
            &alice,
            "summaries",
            "s-z",
            &[],
            &[("nowhere".into(), "x".into())],
        )
        .unwrap_err();
    assert!(matches!(e, EngineError::Input(_)), "{e}");
    assert_eq!(links(dir.path()), 4);
    let before = rows(dir.path());
    let out = erase(
        &engine,
        Scope::Memory {
            tenant: acme.clone(),
            subject: alice.clone(),
            memory: MemoryId::new("m1").unwrap(),
            version: Some(Version::new("v1").unwrap()),
        },
        "T-5",
    );
    assert_eq!(out.state.to_string(), "COMPLETE", "{out:?}");
    let cert = out.certificate.unwrap();
    assert_eq!(cert["targets"]["summaries"]["count"], 4, "{cert}");
    let gone = ["s-a1", "s-a1x", "s-a1xx", "s-mix"];
    let kept: Vec<_> = before
        .iter()
        .filter(|(id, _)| !gone.contains(&id.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        rows(dir.path()),
        kept,
        "the chain goes, s-a2 and s-b1 stay byte for byte"
    );
    // The chain's edges and links are dropped; s-a2's and s-b1's edges stay.
    assert_eq!(links(dir.path()), 0);
    assert_eq!(edges(dir.path()), 2);
    // Bob's own erasure still finds his summary.
    let out = erase(
        &engine,
        Scope::Subject {
            tenant: acme,
            subject: bob,
        },
        "T-6",
    );
    assert_eq!(out.state.to_string(), "COMPLETE", "{out:?}");
    assert_eq!(rows(dir.path()).len(), 1);
    assert_eq!(edges(dir.path()), 1);
}
