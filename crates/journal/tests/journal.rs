//! The journal's chain and the gate, on the SQLite backend.

use std::time::Duration;

use lethe_core::keys::DeploymentKey;
use lethe_core::{Basis, MemoryId, Scope, Subject, Tenant, Version};
use lethe_journal::gate::{GateError, Sink};
use lethe_journal::jobs::NewJob;
use lethe_journal::{Entry, Journal, JournalError};
use rusqlite::Connection;
use time::macros::datetime;
use time::OffsetDateTime;

const NOW: OffsetDateTime = datetime!(2026-12-02 10:00 UTC);
const AT: &str = "2026-12-02T10:00:00Z";

fn open() -> (tempfile::TempDir, Journal) {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(&dir.path().join("j.db")).unwrap();
    (dir, j)
}

fn t(s: &str) -> Tenant {
    Tenant::new(s).unwrap()
}
fn s(x: &str) -> Subject {
    Subject::new(x).unwrap()
}

fn job(j: &Journal, id: &str, scope: Scope) -> String {
    let new = NewJob {
        job_id: id.into(),
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
    };
    j.create_job(&new).unwrap().0.job_id
}

fn subject_scope(tn: &str, sb: &str) -> Scope {
    Scope::Subject {
        tenant: t(tn),
        subject: s(sb),
    }
}

fn run_to_blocked(j: &Journal, id: &str) {
    j.freeze(AT, id, None).unwrap();
    j.record(AT, id, &Entry::Drained).unwrap();
    j.record(
        AT,
        id,
        &Entry::Blocked {
            reason: lethe_core::BlockedReason::TargetUnavailable,
            target: Some("x".into()),
            detail: "d".into(),
        },
    )
    .unwrap();
}

#[test]
fn intact_chain_verifies_and_replays_jobs() {
    let (_d, j) = open();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    run_to_blocked(&j, &a);
    let r = j.verify_chain().unwrap();
    assert!(r.is_intact(), "{:?}", r.problems);
    assert_eq!((r.entries, r.jobs), (4, 1));
}

fn tamper(dir: &tempfile::TempDir, sql: &str) -> Vec<String> {
    let c = Connection::open(dir.path().join("j.db")).unwrap();
    c.execute_batch(sql).unwrap();
    drop(c);
    Journal::open(&dir.path().join("j.db"))
        .unwrap()
        .verify_chain()
        .unwrap()
        .problems
}

fn seeded() -> tempfile::TempDir {
    let (d, j) = open();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    run_to_blocked(&j, &a);
    job(&j, "del-b", subject_scope("acme", "bob"));
    d
}

#[test]
fn detects_an_edited_entry() {
    let d = seeded();
    let p = tamper(
        &d,
        "UPDATE journal SET body = replace(body, 'T-1', 'T-2') WHERE seq = 1",
    );
    assert!(p.iter().any(|p| p.contains("entry 1 was edited")), "{p:?}");
}

#[test]
fn detects_reordered_entries() {
    let d = seeded();
    let p = tamper(&d, "UPDATE journal SET seq = 100 WHERE seq = 2; UPDATE journal SET seq = 2 WHERE seq = 3; UPDATE journal SET seq = 3 WHERE seq = 100;");
    assert!(p.iter().any(|p| p.contains("does not follow")), "{p:?}");
}

#[test]
fn detects_a_deleted_entry_in_the_middle_and_at_the_end() {
    let d = seeded();
    let p = tamper(&d, "DELETE FROM journal WHERE seq = 2");
    assert!(p.iter().any(|p| p.contains("entry 2 is missing")), "{p:?}");
    let d = seeded();
    let p = tamper(
        &d,
        "DELETE FROM journal WHERE seq = (SELECT max(seq) FROM journal)",
    );
    assert!(
        p.iter().any(|p| p.contains("newest entries were removed")),
        "{p:?}"
    );
}

#[test]
fn detects_a_job_table_that_disagrees_with_the_chain() {
    let d = seeded();
    let p = tamper(
        &d,
        "UPDATE jobs SET state = 'COMPLETE' WHERE job_id = 'del-a'",
    );
    assert!(
        p.iter()
            .any(|p| p.contains("COMPLETE in the job table but BLOCKED in the journal")),
        "{p:?}"
    );
}

#[test]
fn an_open_job_for_the_same_scope_is_reused_not_duplicated() {
    let (_d, j) = open();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    assert_eq!(job(&j, "del-b", subject_scope("acme", "alice")), a);
    assert_eq!(j.jobs().unwrap().len(), 1);
}

#[test]
fn invalid_transitions_are_refused_and_not_journaled() {
    let (_d, j) = open();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    let before = j.verify_chain().unwrap().entries;
    assert!(matches!(
        j.record(AT, &a, &Entry::VerifiedClean),
        Err(JournalError::Transition { .. })
    ));
    assert_eq!(j.verify_chain().unwrap().entries, before);
}

#[test]
fn freeze_revokes_the_subject_and_refuses_every_new_permit_and_lease() {
    let (_d, j) = open();
    let ttl = Duration::from_secs(60);
    let alice = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[], ttl)
        .unwrap();
    let alice10 = j
        .take_lease(NOW, &t("acme"), &s("alice10"), &[], ttl)
        .unwrap();
    let held = j.take_permit(NOW, alice.id, Sink::State).unwrap();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    let f = j.freeze(AT, &a, None).unwrap();
    assert_eq!(
        (f.subject_epoch, f.revoked_leases, f.permits_to_drain),
        (Some(1), 1, 1)
    );
    assert!(j.is_revoked(alice.id).unwrap());
    assert!(matches!(
        j.take_permit(NOW, alice.id, Sink::Output),
        Err(JournalError::Gate(GateError::Revoked))
    ));
    assert!(matches!(
        j.take_lease(NOW, &t("acme"), &s("alice"), &[], ttl),
        Err(JournalError::Gate(GateError::Fenced))
    ));
    // A prefix neighbour is a different subject: untouched.
    assert!(j.take_permit(NOW, alice10.id, Sink::Tool).is_ok());
    // The permit from before the freeze must drain: released, or its cancellation confirmed.
    assert_eq!(j.undrained(&a).unwrap(), 1);
    j.confirm_cancelled(held.id).unwrap();
    assert_eq!(j.undrained(&a).unwrap(), 0);
}

#[test]
fn lease_ttl_expiry_is_not_draining() {
    let (_d, j) = open();
    let l = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[], Duration::from_secs(1))
        .unwrap();
    let p = j.take_permit(NOW, l.id, Sink::State).unwrap();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    j.freeze(AT, &a, None).unwrap();
    // Long after the TTL, the permit is still undrained.
    let later = NOW + Duration::from_secs(3600);
    assert!(matches!(
        j.take_permit(later, l.id, Sink::State),
        Err(JournalError::Gate(GateError::Revoked))
    ));
    assert_eq!(j.undrained(&a).unwrap(), 1);
    j.release_permit(p.id).unwrap();
    assert_eq!(j.undrained(&a).unwrap(), 0);
    assert!(matches!(
        j.release_permit(p.id),
        Err(JournalError::Gate(GateError::NoSuchPermit))
    ));
}

#[test]
fn an_expired_lease_takes_no_permit() {
    let (_d, j) = open();
    let l = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[], Duration::from_secs(1))
        .unwrap();
    assert!(matches!(
        j.take_permit(NOW + Duration::from_secs(2), l.id, Sink::State),
        Err(JournalError::Gate(GateError::Expired))
    ));
}

#[test]
fn memory_scope_revokes_only_leases_that_read_that_version() {
    let (_d, j) = open();
    let ttl = Duration::from_secs(60);
    let m = |id: &str, v: &str| (MemoryId::new(id).unwrap(), Version::new(v).unwrap());
    let read_it = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k1", "v1")], ttl)
        .unwrap();
    let read_other = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k2", "v1")], ttl)
        .unwrap();
    let read_old = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k1", "v0")], ttl)
        .unwrap();
    let scope = Scope::Memory {
        tenant: t("acme"),
        subject: s("alice"),
        memory: MemoryId::new("memories/k1").unwrap(),
        version: None,
    };
    let a = job(&j, "del-m", scope);
    let f = j
        .freeze(AT, &a, Some(&Version::new("v1").unwrap()))
        .unwrap();
    assert_eq!(
        (f.subject_epoch, f.revoked_leases),
        (Some(0), 1),
        "no epoch bump for a memory scope"
    );
    assert!(matches!(
        j.take_permit(NOW, read_it.id, Sink::Output),
        Err(JournalError::Gate(GateError::Revoked))
    ));
    assert!(
        j.take_permit(NOW, read_other.id, Sink::Output).is_ok(),
        "another memory keeps working"
    );
    assert!(
        j.take_permit(NOW, read_old.id, Sink::Output).is_ok(),
        "another version keeps working"
    );
    // A new lease that read the tombstoned version is refused at its first permit.
    let late = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k1", "v1")], ttl)
        .unwrap();
    assert!(matches!(
        j.take_permit(NOW, late.id, Sink::Tool),
        Err(JournalError::Gate(GateError::Tombstoned))
    ));
}

#[test]
fn a_lease_from_an_old_epoch_is_stale_after_completion() {
    let (_d, j) = open();
    let ttl = Duration::from_secs(60);
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    j.freeze(AT, &a, None).unwrap();
    j.record(AT, &a, &Entry::Drained).unwrap();
    j.record(AT, &a, &Entry::TargetsErased).unwrap();
    j.complete(AT, &a, &serde_json::json!({"test": true}))
        .unwrap();
    // The fence opens at completion; a new lease binds the new epoch and works.
    let fresh = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[], ttl)
        .unwrap();
    assert_eq!(fresh.epoch, 1);
    assert!(j.take_permit(NOW, fresh.id, Sink::State).is_ok());
    assert!(j.verify_chain().unwrap().is_intact());
}

#[test]
fn tenant_scope_fences_every_subject_of_the_tenant_only() {
    let (_d, j) = open();
    let ttl = Duration::from_secs(60);
    let in_t = j.take_lease(NOW, &t("a"), &s("u1"), &[], ttl).unwrap();
    let neighbour = j.take_lease(NOW, &t("ab"), &s("u1"), &[], ttl).unwrap();
    let a = job(&j, "del-t", Scope::Tenant { tenant: t("a") });
    let f = j.freeze(AT, &a, None).unwrap();
    assert_eq!((f.tenant_epoch, f.revoked_leases), (Some(1), 1));
    assert!(j.take_permit(NOW, in_t.id, Sink::State).is_err());
    assert!(matches!(
        j.take_lease(NOW, &t("a"), &s("u2"), &[], ttl),
        Err(JournalError::Gate(GateError::Fenced))
    ));
    assert!(j.take_permit(NOW, neighbour.id, Sink::State).is_ok());
}

#[test]
fn holds_cover_their_tenant_or_subject_and_are_journaled() {
    let (_d, j) = open();
    j.add_hold(
        AT,
        "hold-1",
        &t("acme"),
        Some(&s("alice")),
        Some("matter 7"),
        "hmac:x",
    )
    .unwrap();
    assert_eq!(
        j.holds_covering(&t("acme"), Some(&s("alice"))).unwrap(),
        vec!["hold-1"]
    );
    assert!(j
        .holds_covering(&t("acme"), Some(&s("bob")))
        .unwrap()
        .is_empty());
    assert_eq!(
        j.holds_covering(&t("acme"), None).unwrap(),
        vec!["hold-1"],
        "a tenant scope is held by a subject's hold"
    );
    j.add_hold(AT, "hold-2", &t("globex"), None, None, "hmac:y")
        .unwrap();
    assert_eq!(
        j.holds_covering(&t("globex"), Some(&s("carol"))).unwrap(),
        vec!["hold-2"]
    );
    assert_eq!(
        j.release_holds(AT, &t("acme"), Some(&s("alice"))).unwrap(),
        vec!["hold-1"]
    );
    assert!(j
        .holds_covering(&t("acme"), Some(&s("alice")))
        .unwrap()
        .is_empty());
    assert!(j.verify_chain().unwrap().is_intact());
}

#[test]
fn concurrent_permit_traffic_never_sees_a_permit_after_the_freeze() {
    // Eight threads take and release permits in a loop on their own connections while the
    // freeze commits. Once a worker has been refused, it must never be granted again, and no
    // permit row may appear after the freeze: the freeze is one transaction under the write
    // lock, the permit one check-and-register.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    let (d, j) = open();
    let path = d.path().join("j.db");
    let lease = j
        .take_lease(NOW, &t("acme"), &s("alice"), &[], Duration::from_secs(600))
        .unwrap();
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    let stop = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicUsize::new(0));
    let refused_workers = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (path, stop, granted, refused_workers) = (
                path.clone(),
                stop.clone(),
                granted.clone(),
                refused_workers.clone(),
            );
            std::thread::spawn(move || {
                let j = Journal::open(&path).unwrap();
                let (mut granted_after_refusal, mut refused) = (0, 0);
                while !stop.load(SeqCst) {
                    match j.take_permit(NOW, lease.id, Sink::State) {
                        Ok(p) => {
                            granted.fetch_add(1, SeqCst);
                            if refused > 0 {
                                granted_after_refusal += 1;
                            }
                            j.release_permit(p.id).unwrap();
                        }
                        Err(JournalError::Gate(GateError::Revoked)) => {
                            if refused == 0 {
                                refused_workers.fetch_add(1, SeqCst);
                            }
                            refused += 1;
                        }
                        Err(e) => panic!("unexpected: {e}"),
                    }
                }
                granted_after_refusal
            })
        })
        .collect();
    let bounded = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            std::thread::yield_now();
        }
    };
    bounded("permits before the freeze", &|| granted.load(SeqCst) >= 16);
    j.freeze(AT, &a, None).unwrap();
    let count = || -> i64 {
        Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM permits", [], |r| r.get(0))
            .unwrap()
    };
    let after_freeze = count();
    bounded("every worker to be refused", &|| {
        refused_workers.load(SeqCst) == 8
    });
    stop.store(true, SeqCst);
    for w in workers {
        assert_eq!(
            w.join().unwrap(),
            0,
            "a permit was granted after the gate refused"
        );
    }
    assert_eq!(
        count(),
        after_freeze,
        "no permit row was registered after the freeze committed"
    );
    assert_eq!(j.undrained(&a).unwrap(), 0, "every permit was released");
}
