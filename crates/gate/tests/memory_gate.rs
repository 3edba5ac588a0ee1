//! The in-process gate: the same rules as the journal's gate (see crates/journal/tests), with
//! leases and permits in memory and the durable part (epochs, fences, tombstones) in a real
//! journal, on both control stores.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use lethe_core::keys::DeploymentKey;
use lethe_core::{Basis, MemoryId, Scope, Subject, Tenant, Version};
use lethe_gate::MemoryGate;
use lethe_gate::{GateError, Sink};
use lethe_journal::jobs::NewJob;
use lethe_journal::{Entry, Journal};
use time::macros::datetime;
use time::OffsetDateTime;

const NOW: OffsetDateTime = datetime!(2026-12-02 10:00 UTC);
const AT: &str = "2026-12-02T10:00:00Z";
const TTL: Duration = Duration::from_secs(60);

static N: AtomicUsize = AtomicUsize::new(0);

/// A journal location for one test: a SQLite file, or a PostgreSQL database dropped afterwards.
struct TestDb {
    url: String,
    _dir: tempfile::TempDir,
    admin: Option<(String, String)>,
}

impl TestDb {
    fn new(pg: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        if !pg {
            let url = format!("sqlite:{}", dir.path().join("j.db").display());
            return Self {
                url,
                _dir: dir,
                admin: None,
            };
        }
        let admin = std::env::var("LETHE_PG15_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let name = format!("lethe_g_{}_{}", std::process::id(), N.fetch_add(1, SeqCst));
        postgres_client(&admin)
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
        Self {
            url,
            _dir: dir,
            admin: Some((admin, name)),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some((admin, name)) = &self.admin {
            let _ = postgres_client(admin)
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

fn postgres_client(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("PostgreSQL reachable (scripts/test)")
}

fn t(s: &str) -> Tenant {
    Tenant::new(s).unwrap()
}
fn s(x: &str) -> Subject {
    Subject::new(x).unwrap()
}
fn m(id: &str, v: &str) -> (MemoryId, Version) {
    (MemoryId::new(id).unwrap(), Version::new(v).unwrap())
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
        version_at_request: None,
    };
    j.create_job(&new).unwrap().0.job_id
}

fn subject_scope(tn: &str, sb: &str) -> Scope {
    Scope::Subject {
        tenant: t(tn),
        subject: s(sb),
    }
}

fn complete(j: &Journal, g: &MemoryGate, id: &str) {
    j.record(AT, id, &Entry::Drained).unwrap();
    j.record(AT, id, &Entry::TargetsErased).unwrap();
    j.complete(
        AT,
        id,
        &serde_json::json!({"test": true}),
        &lethe_core::keys::DeploymentKey::from_bytes([1; 32]).signing_key(),
    )
    .unwrap();
    g.job_completed(id);
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() {
                let db = super::TestDb::new(false);
                super::$name(&db.url)
            } )*
        }
        mod postgres_backend {
            $( #[test] fn $name() {
                let db = super::TestDb::new(true);
                super::$name(&db.url)
            } )*
        }
    };
}

both!(
    freeze_revokes_the_subject_and_refuses_new_permits_and_leases,
    lease_ttl_expiry_is_not_draining,
    memory_scope_revokes_only_leases_that_read_that_version,
    tenant_scope_fences_the_tenant_only,
    a_restart_keeps_fences_epochs_and_tombstones,
    concurrent_permit_traffic_never_sees_a_permit_after_the_freeze,
);

fn open(url: &str) -> Journal {
    Journal::open_url(url, std::path::Path::new(".")).unwrap()
}

fn freeze_revokes_the_subject_and_refuses_new_permits_and_leases(url: &str) {
    let j = open(url);
    let g = MemoryGate::load(&j).unwrap();
    let alice = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
        .unwrap();
    let alice10 = g
        .take_lease(NOW, &t("acme"), &s("alice10"), &[], TTL)
        .unwrap();
    let held = g.take_permit(NOW, alice.id, Sink::State).unwrap();
    let p = g.take_permit(NOW, alice.id, Sink::Tool).unwrap();
    g.release_permit(p.id).unwrap();
    assert_eq!(g.release_permit(p.id), Err(GateError::NoSuchPermit));
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    let f = g.freeze(&j, AT, &a, None).unwrap();
    assert_eq!(
        (f.subject_epoch, f.revoked_leases, f.permits_to_drain),
        (Some(1), 1, 1)
    );
    assert_eq!(g.is_revoked(alice.id), Ok(true));
    assert_eq!(
        g.take_permit(NOW, alice.id, Sink::Output),
        Err(GateError::Revoked)
    );
    assert_eq!(
        g.take_lease(NOW, &t("acme"), &s("alice"), &[], TTL),
        Err(GateError::Fenced)
    );
    assert!(
        g.take_permit(NOW, alice10.id, Sink::Tool).is_ok(),
        "a prefix neighbour is untouched"
    );
    assert_eq!(g.undrained(&a), 1);
    g.confirm_cancelled(held.id).unwrap();
    assert_eq!(g.undrained(&a), 0);
    // The journal holds the durable half.
    assert_eq!(j.epochs(&t("acme"), &s("alice")).unwrap(), (1, 0));
    complete(&j, &g, &a);
    let fresh = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
        .unwrap();
    assert_eq!(fresh.epoch, 1);
    assert!(g.take_permit(NOW, fresh.id, Sink::State).is_ok());
    assert!(j.verify_chain().unwrap().is_intact());
}

fn lease_ttl_expiry_is_not_draining(url: &str) {
    let j = open(url);
    let g = MemoryGate::load(&j).unwrap();
    let l = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[], Duration::from_secs(1))
        .unwrap();
    let p = g.take_permit(NOW, l.id, Sink::State).unwrap();
    let later = NOW + Duration::from_secs(3600);
    assert_eq!(
        g.take_permit(later, l.id, Sink::State),
        Err(GateError::Expired)
    );
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    g.freeze(&j, AT, &a, None).unwrap();
    assert_eq!(
        g.undrained(&a),
        1,
        "an expired lease's permit still has to drain"
    );
    g.release_permit(p.id).unwrap();
    assert_eq!(g.undrained(&a), 0);
}

fn memory_scope_revokes_only_leases_that_read_that_version(url: &str) {
    let j = open(url);
    let g = MemoryGate::load(&j).unwrap();
    let read_it = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k1", "v1")], TTL)
        .unwrap();
    let read_other = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k2", "v1")], TTL)
        .unwrap();
    let read_old = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k1", "v0")], TTL)
        .unwrap();
    let scope = Scope::Memory {
        tenant: t("acme"),
        subject: s("alice"),
        memory: MemoryId::new("memories/k1").unwrap(),
        version: None,
    };
    let a = job(&j, "del-m", scope);
    let f = g
        .freeze(&j, AT, &a, Some(&Version::new("v1").unwrap()))
        .unwrap();
    assert_eq!(
        (f.subject_epoch, f.revoked_leases),
        (Some(0), 1),
        "no epoch bump"
    );
    assert_eq!(
        g.take_permit(NOW, read_it.id, Sink::Output),
        Err(GateError::Revoked)
    );
    assert!(g.take_permit(NOW, read_other.id, Sink::Output).is_ok());
    assert!(g.take_permit(NOW, read_old.id, Sink::Output).is_ok());
    let late = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[m("memories/k1", "v1")], TTL)
        .unwrap();
    assert_eq!(
        g.take_permit(NOW, late.id, Sink::Tool),
        Err(GateError::Tombstoned)
    );
}

fn tenant_scope_fences_the_tenant_only(url: &str) {
    let j = open(url);
    let g = MemoryGate::load(&j).unwrap();
    let in_t = g.take_lease(NOW, &t("a"), &s("u1"), &[], TTL).unwrap();
    let neighbour = g.take_lease(NOW, &t("ab"), &s("u1"), &[], TTL).unwrap();
    let a = job(&j, "del-t", Scope::Tenant { tenant: t("a") });
    let f = g.freeze(&j, AT, &a, None).unwrap();
    assert_eq!((f.tenant_epoch, f.revoked_leases), (Some(1), 1));
    assert_eq!(
        g.take_permit(NOW, in_t.id, Sink::State),
        Err(GateError::Revoked)
    );
    assert_eq!(
        g.take_lease(NOW, &t("a"), &s("u2"), &[], TTL),
        Err(GateError::Fenced)
    );
    assert!(g.take_permit(NOW, neighbour.id, Sink::State).is_ok());
    complete(&j, &g, &a);
    let fresh = g.take_lease(NOW, &t("a"), &s("u2"), &[], TTL).unwrap();
    assert_eq!(fresh.tenant_epoch, 1);
    assert!(g.take_permit(NOW, fresh.id, Sink::State).is_ok());
}

fn a_restart_keeps_fences_epochs_and_tombstones(url: &str) {
    let before = {
        let j = open(url);
        let g = MemoryGate::load(&j).unwrap();
        let dave = g.take_lease(NOW, &t("acme"), &s("dave"), &[], TTL).unwrap();
        let a = job(&j, "del-a", subject_scope("acme", "alice"));
        g.freeze(&j, AT, &a, None).unwrap();
        let b = job(&j, "del-b", subject_scope("acme", "bob"));
        g.freeze(&j, AT, &b, None).unwrap();
        complete(&j, &g, &b);
        let scope = Scope::Memory {
            tenant: t("acme"),
            subject: s("carol"),
            memory: MemoryId::new("memories/k1").unwrap(),
            version: None,
        };
        let c = job(&j, "del-c", scope);
        g.freeze(&j, AT, &c, Some(&Version::new("v1").unwrap()))
            .unwrap();
        complete(&j, &g, &c);
        dave.id
    }; // the process "dies": its leases and permits die with the runs that held them
    let j = open(url);
    let g = MemoryGate::load(&j).unwrap();
    assert_eq!(
        g.take_lease(NOW, &t("acme"), &s("alice"), &[], TTL),
        Err(GateError::Fenced),
        "fence kept"
    );
    let bob = g.take_lease(NOW, &t("acme"), &s("bob"), &[], TTL).unwrap();
    assert_eq!(bob.epoch, 1, "epoch kept");
    let carol = g
        .take_lease(NOW, &t("acme"), &s("carol"), &[m("memories/k1", "v1")], TTL)
        .unwrap();
    assert_eq!(
        g.take_permit(NOW, carol.id, Sink::State),
        Err(GateError::Tombstoned),
        "tombstone kept"
    );
    // Leases from before are gone with their runs; a run takes a new one (at the new epoch).
    let _ = before;
    assert!(g.take_permit(NOW, bob.id, Sink::State).is_ok());
}

fn concurrent_permit_traffic_never_sees_a_permit_after_the_freeze(url: &str) {
    let j = open(url);
    let g = Arc::new(MemoryGate::load(&j).unwrap());
    let a = job(&j, "del-a", subject_scope("acme", "alice"));
    let stop = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicUsize::new(0));
    let refused_workers = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (g, stop, granted, refused_workers) = (
                Arc::clone(&g),
                Arc::clone(&stop),
                Arc::clone(&granted),
                Arc::clone(&refused_workers),
            );
            // Taken before the freeze, whatever the threads' scheduling.
            let lease = g
                .take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
                .unwrap();
            std::thread::spawn(move || {
                let (mut after_refusal, mut refused) = (0, 0);
                while !stop.load(SeqCst) {
                    match g.take_permit(NOW, lease.id, Sink::State) {
                        Ok(p) => {
                            granted.fetch_add(1, SeqCst);
                            if refused > 0 {
                                after_refusal += 1;
                            }
                            g.release_permit(p.id).unwrap();
                        }
                        Err(e) => {
                            assert_eq!(e, GateError::Revoked);
                            if refused == 0 {
                                refused_workers.fetch_add(1, SeqCst);
                            }
                            refused += 1;
                        }
                    }
                }
                (after_refusal, refused)
            })
        })
        .collect();
    while granted.load(SeqCst) < 10_000 {
        std::thread::yield_now();
    }
    g.freeze(&j, AT, &a, None).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Every permit from before the freeze drains and every worker has met the closed fence.
    while g.undrained(&a) > 0 || refused_workers.load(SeqCst) < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "permits never drained"
        );
        std::thread::yield_now();
    }
    stop.store(true, SeqCst);
    for w in workers {
        let (after_refusal, refused) = w.join().unwrap();
        assert_eq!(after_refusal, 0, "a permit was granted after a refusal");
        assert!(refused > 0);
    }
}

/// A TCP proxy to the server at `upstream` (`host:port`) that, once `armed`, cuts the
/// connection at the next simple-query `COMMIT`: passed through first when `deliver` (a commit
/// that happened, whose answer was lost), or never sent (the transaction rolls back).
fn commit_cutter(upstream: String, armed: Arc<AtomicBool>, deliver: bool) -> u16 {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let client = client.unwrap();
            let server = TcpStream::connect(&upstream).unwrap();
            let cut = Arc::new(AtomicBool::new(false));
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (armed, cut_set) = (armed.clone(), cut.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let commit = b"Q\0\0\0\x0bCOMMIT\0";
                loop {
                    let n = match c_in.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let hit =
                        armed.load(SeqCst) && buf[..n].windows(commit.len()).any(|w| w == commit);
                    if hit && !deliver {
                        armed.store(false, SeqCst);
                        let _ = s_out.shutdown(Shutdown::Both);
                        let _ = c_in.shutdown(Shutdown::Both);
                        break;
                    }
                    if s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if hit {
                        armed.store(false, SeqCst);
                        cut_set.store(true, SeqCst);
                    }
                }
            });
            let (mut c_out, mut s_in) = (client, server);
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                loop {
                    let n = match s_in.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if cut.load(SeqCst) {
                        let _ = c_out.shutdown(Shutdown::Both);
                        let _ = s_in.shutdown(Shutdown::Both);
                        break;
                    }
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A PostgreSQL test database, a journal on it directly, and one through [`commit_cutter`]
/// (`deliver` as there), with the switch that arms the cut.
fn behind_a_commit_cutter(deliver: bool) -> (TestDb, Journal, Journal, Arc<AtomicBool>) {
    let db = TestDb::new(true);
    let upstream = db
        .url
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(hostport, _)| hostport.to_string())
        .unwrap();
    let name = db.url.rsplit_once('/').unwrap().1.to_string();
    let direct = open(&db.url);
    let armed = Arc::new(AtomicBool::new(false));
    let port = commit_cutter(upstream, armed.clone(), deliver);
    let cut = open(&format!(
        "postgres://postgres@127.0.0.1:{port}/{name}?sslmode=disable"
    ));
    (db, direct, cut, armed)
}

/// A job of acme/alice, an in-process gate over a journal behind [`commit_cutter`] with a lease
/// of alice's holding a permit, and the job's freeze, its connection cut at the `COMMIT`.
struct CutFreeze {
    _db: TestDb,
    setup: Journal,
    j: Journal,
    g: MemoryGate,
    id: String,
    lease: lethe_gate::Lease,
    held: lethe_gate::Permit,
}

fn freeze_cut_at_commit(deliver: bool) -> CutFreeze {
    let (_db, setup, j, armed) = behind_a_commit_cutter(deliver);
    let id = job(&setup, "del-a", subject_scope("acme", "alice"));
    let g = MemoryGate::load(&j).unwrap();
    let lease = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
        .unwrap();
    let held = g.take_permit(NOW, lease.id, Sink::Tool).unwrap();
    armed.store(true, SeqCst);
    assert!(
        g.freeze(&j, AT, &id, None).is_err(),
        "the connection was not cut at the commit"
    );
    CutFreeze {
        _db,
        setup,
        j,
        g,
        id,
        lease,
        held,
    }
}

/// The journal's freeze commits but its answer is lost (the connection cut at the `COMMIT`):
/// the gate must be closed all the same, with the permit held from before in the job's drain
/// set, and the job, run again from FROZEN, completes with the journal's epoch (found by
/// review: the gate stayed open, granting permits and leases, and counted nothing to drain).
#[test]
fn postgres_a_freeze_whose_commit_answer_is_lost_leaves_the_gate_closed() {
    let CutFreeze {
        _db,
        setup,
        j,
        g,
        id,
        lease,
        held,
    } = freeze_cut_at_commit(true);
    assert_eq!(
        setup.job(&id).unwrap().state,
        lethe_core::JobState::Frozen,
        "the journal committed the freeze"
    );
    assert_eq!(
        g.take_permit(NOW, lease.id, Sink::Tool),
        Err(GateError::Revoked)
    );
    assert_eq!(
        g.take_lease(NOW, &t("acme"), &s("alice"), &[], TTL).err(),
        Some(GateError::Fenced)
    );
    assert_eq!(
        g.undrained(&id),
        1,
        "the permit held from before the freeze"
    );
    // Another subject is untouched.
    let bob = g.take_lease(NOW, &t("acme"), &s("bob"), &[], TTL).unwrap();
    assert!(g.take_permit(NOW, bob.id, Sink::Tool).is_ok());

    g.release_permit(held.id).unwrap();
    assert_eq!(g.undrained(&id), 0);
    complete(&j, &g, &id);
    let after = g
        .take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
        .unwrap();
    assert_eq!(after.epoch, 1, "the journal's epoch after the erasure");
    assert_eq!(
        MemoryGate::load(&j)
            .unwrap()
            .take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
            .unwrap()
            .epoch,
        1
    );
}

/// The journal's freeze fails before its commit (the connection cut as `COMMIT` leaves): the
/// gate is closed all the same, and the job's freeze tried again commits, with the epoch bumped
/// once, not twice.
#[test]
fn postgres_a_freeze_that_failed_before_its_commit_is_tried_again_once() {
    let CutFreeze {
        _db,
        setup,
        j,
        g,
        id,
        lease: _,
        held,
    } = freeze_cut_at_commit(false);
    assert_eq!(
        setup.job(&id).unwrap().state,
        lethe_core::JobState::Requested,
        "the journal rolled the freeze back"
    );
    assert_eq!(
        g.take_lease(NOW, &t("acme"), &s("alice"), &[], TTL).err(),
        Some(GateError::Fenced),
        "closed here while the journal's freeze is unsure"
    );
    let f = g.freeze(&j, AT, &id, None).unwrap();
    assert_eq!(f.subject_epoch, Some(1));
    assert_eq!(g.undrained(&id), 1);
    g.release_permit(held.id).unwrap();
    complete(&j, &g, &id);
    assert_eq!(
        g.take_lease(NOW, &t("acme"), &s("alice"), &[], TTL)
            .unwrap()
            .epoch,
        1,
        "bumped once"
    );
}

/// On PostgreSQL the gate's authority is a session lock: when the server closes that session
/// (here `pg_terminate_backend`, as a restart or an idle timeout would), another process's
/// freeze is no longer refused, and this gate would never hear of its fence. So the gate then
/// refuses every new lease and permit, and a run's lease check, until the process starts
/// again (review: it went on granting).
#[test]
fn postgres_a_gate_whose_authority_session_is_closed_grants_nothing() {
    let db = TestDb::new(true);
    let j = open(&db.url);
    let g = MemoryGate::load(&j).unwrap();
    let bob = g.take_lease(NOW, &t("acme"), &s("bob"), &[], TTL).unwrap();
    assert!(g.take_permit(NOW, bob.id, Sink::Tool).is_ok());
    // Another process's freeze is refused while the authority holds.
    let other = open(&db.url);
    let a = job(&other, "del-a", subject_scope("acme", "alice"));
    assert!(other.freeze(AT, &a, None).is_err());
    let (admin, name) = db.admin.as_ref().unwrap();
    // Advisory locks are per database: this test's, not a parallel test's.
    let ended: i64 = postgres_client(admin)
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
             WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted \
               AND database = (SELECT oid FROM pg_database WHERE datname = $2) \
               AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&0x006c_6574_6867i64, name],
        )
        .unwrap()
        .get(0);
    assert_eq!(ended, 1, "the authority's session was found and ended");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while g.take_lease(NOW, &t("acme"), &s("carol"), &[], TTL).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the gate still grants leases 10 s after its authority's session ended"
        );
        std::thread::yield_now();
    }
    assert_eq!(
        g.take_lease(NOW, &t("acme"), &s("carol"), &[], TTL),
        Err(GateError::AuthorityLost)
    );
    assert_eq!(
        g.take_permit(NOW, bob.id, Sink::Tool),
        Err(GateError::AuthorityLost)
    );
    assert_eq!(g.is_revoked(bob.id), Err(GateError::AuthorityLost));
    // The freeze the authority kept out now goes through: what the gate refuses for.
    other.freeze(AT, &a, None).unwrap();
}
