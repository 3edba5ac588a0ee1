//! The closed set of authorities: each variant routes to its own gate, so one sequence (lease,
//! permit, freeze, drain, completion) gives the same answers through either. The rules
//! themselves are pinned per authority (memory_gate.rs, crates/journal/tests).

use std::time::Duration;

use lethe_core::keys::DeploymentKey;
use lethe_core::{Basis, Scope, Subject, Tenant};
use lethe_gate::{Authority, GateError, MemoryGate, Sink};
use lethe_journal::jobs::NewJob;
use lethe_journal::{Entry, Journal, JournalError};
use time::macros::datetime;
use time::OffsetDateTime;

const NOW: OffsetDateTime = datetime!(2026-12-02 10:00 UTC);
const AT: &str = "2026-12-02T10:00:00Z";
const TTL: Duration = Duration::from_secs(60);

fn fence_drain_and_reopen(a: Authority<'_>, j: &Journal) {
    let (acme, alice) = (Tenant::new("acme").unwrap(), Subject::new("alice").unwrap());
    let lease = a.take_lease(NOW, &acme, &alice, &[], TTL).unwrap();
    let held = a.take_permit(NOW, lease.id, Sink::Tool).unwrap();
    let done = a.take_permit(NOW, lease.id, Sink::State).unwrap();
    a.release_permit(done.id).unwrap();
    let scope = Scope::Subject {
        tenant: acme.clone(),
        subject: alice.clone(),
    };
    let new = NewJob {
        job_id: "job-1".into(),
        scope_hash: scope
            .hash(&DeploymentKey::from_bytes([1; 32]).scope_key())
            .to_string(),
        scope,
        basis: Basis::GdprArt17,
        ticket: "T-1".into(),
        policy_version: "1".into(),
        deadline: time::macros::date!(2027 - 01 - 02),
        extension_reason: None,
        requested_at: AT.into(),
        version_at_request: None,
    };
    let id = j.create_job(&new).unwrap().0.job_id;
    let f = a.freeze(AT, &id, None).unwrap();
    assert_eq!(
        (f.subject_epoch, f.revoked_leases, f.permits_to_drain),
        (Some(1), 1, 1)
    );
    assert!(a.is_revoked(lease.id).unwrap());
    assert!(matches!(
        a.take_lease(NOW, &acme, &alice, &[], TTL),
        Err(JournalError::Gate(GateError::Fenced))
    ));
    assert_eq!(a.undrained(&id).unwrap(), 1);
    a.confirm_cancelled(held.id).unwrap();
    assert_eq!(a.undrained(&id).unwrap(), 0);
    j.record(AT, &id, &Entry::Drained).unwrap();
    j.record(AT, &id, &Entry::TargetsErased).unwrap();
    j.complete(
        AT,
        &id,
        &serde_json::json!({"test": true}),
        &lethe_core::keys::DeploymentKey::from_bytes([1; 32]).signing_key(),
    )
    .unwrap();
    a.job_completed(&id);
    let fresh = a.take_lease(NOW, &acme, &alice, &[], TTL).unwrap();
    assert_eq!(fresh.epoch, 1);
    assert!(a.take_permit(NOW, fresh.id, Sink::Output).is_ok());
}

fn open() -> (tempfile::TempDir, Journal) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("j.db").display());
    let j = Journal::open_url(&url, dir.path()).unwrap();
    (dir, j)
}

#[test]
fn the_in_process_authority_fences_drains_and_reopens() {
    let (_dir, j) = open();
    let gate = MemoryGate::load(&j).unwrap();
    fence_drain_and_reopen(
        Authority::Memory {
            gate: &gate,
            journal: &j,
        },
        &j,
    );
}

#[test]
fn the_control_stores_authority_fences_drains_and_reopens() {
    let (_dir, j) = open();
    fence_drain_and_reopen(Authority::journal(&j), &j);
}
