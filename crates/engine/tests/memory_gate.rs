//! The engine with the in-process gate installed: a job's freeze and drain go through it, on
//! copies of the real-LangGraph SQLite fixtures.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lethe_core::clock::{Clock, ManualClock};
use lethe_core::{Basis, Scope, Subject, Tenant};
use lethe_engine::{Config, Engine, Request, RunOptions};
use lethe_gate::{GateError, Sink};

const CONFIG: &str = r#"
[control]
journal = "sqlite:journal.db"

[[target]]
name = "memories"
kind = "langgraph-sqlite-store"
class = "primary"
path = "memory/store.db"
namespace = ["{tenant}", "{subject}"]
"#;

#[test]
fn a_job_drains_the_in_process_gate_and_bumps_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/langgraph-sqlite");
    std::fs::create_dir(dir.path().join("memory")).unwrap();
    std::fs::copy(fx.join("store.db"), dir.path().join("memory/store.db")).unwrap();
    let clock = Arc::new(ManualClock::new(
        time::macros::datetime!(2026-12-02 10:00 UTC),
    ));
    let cfg = Config::parse(CONFIG, dir.path(), "test").unwrap();
    let mut engine = Engine::open(cfg, clock.clone()).unwrap();
    let gate = engine.memory_gate().unwrap();
    let (acme, alice, bob) = (
        Tenant::new("acme").unwrap(),
        Subject::new("alice").unwrap(),
        Subject::new("bob").unwrap(),
    );
    let now = clock.now();
    let lease = gate
        .take_lease(now, &acme, &alice, &[], Duration::from_secs(1))
        .unwrap();
    let held = gate.take_permit(now, lease.id, Sink::State).unwrap();
    let bobs = gate
        .take_lease(now, &acme, &bob, &[], Duration::from_secs(3600))
        .unwrap();
    let req = Request {
        scope: Scope::Subject {
            tenant: acme.clone(),
            subject: alice.clone(),
        },
        basis: Basis::GdprArt17,
        ticket: "T-1".into(),
        deadline: None,
        extension_reason: None,
    };
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(5),
        ..RunOptions::default()
    };
    let out = engine.erase(req, &opts, &mut |_| {}).unwrap();
    assert_eq!(
        out.state.to_string(),
        "BLOCKED",
        "the held permit keeps the job open"
    );
    assert_eq!(
        out.blocked_reason
            .map(|r| r.as_str().to_string())
            .as_deref(),
        Some("undrained")
    );
    assert_eq!(
        gate.take_permit(now, lease.id, Sink::Tool),
        Err(GateError::Revoked)
    );
    assert_eq!(
        gate.take_lease(now, &acme, &alice, &[], Duration::from_secs(1)),
        Err(GateError::Fenced)
    );
    assert!(
        gate.take_permit(now, bobs.id, Sink::Tool).is_ok(),
        "bob is served throughout"
    );
    gate.confirm_cancelled(held.id).unwrap();
    let out = engine.resume(&out.job_id, &opts, &mut |_| {}).unwrap();
    assert_eq!(out.state.to_string(), "COMPLETE");
    let fresh = gate
        .take_lease(now, &acme, &alice, &[], Duration::from_secs(1))
        .unwrap();
    assert_eq!(fresh.epoch, lease.epoch + 1);
    assert!(gate.take_permit(now, fresh.id, Sink::Output).is_ok());
}
