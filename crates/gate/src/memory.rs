//! The in-process gate, [`MemoryGate`]: the authority for agent runtimes that run in the same
//! process as the Lethe engine (a Rust agent runtime linking `lethe-engine`). Not here: the
//! control store's authority ([`crate::JournalGate`]), which `lethe serve` uses.
//!
//! Leases and permits live in memory, behind one mutex: a permit is one check-and-register
//! under the lock, with no I/O, so the hot path costs a few hash lookups. Epochs, fences and
//! tombstones are the journal's: [`MemoryGate::freeze`] writes them (and `FenceClosed`) through
//! the journal while holding the same lock, so the freeze is linearized with every permit.
//!
//! Why memory is enough here, and only here: a permit's holder runs in this process. If the
//! process dies, every permit and lease dies with the runs that held them, so there is nothing
//! left to drain; what must survive (epochs, open fences, tombstones) is in the journal and is
//! loaded back by [`MemoryGate::load`]. Runtimes in *other* processes must use `lethe serve`,
//! whose permits are rows in the control store, because they outlive a gate restart.
//!
//! One authority per journal: do not run `lethe serve` and a `MemoryGate` over the same
//! journal at once (each would miss the other's permits).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lethe_core::{MemoryId, Subject, Tenant, Version};
use lethe_journal::{Journal, JournalError};
use time::OffsetDateTime;

use crate::{Freeze, GateError, Lease, Permit, Sink};

/// `tenant US subject`; subject `""` keys the tenant itself (identifiers are never empty and
/// hold no control character, so the key is unambiguous).
fn key(tenant: &str, subject: &str) -> String {
    let mut k = String::with_capacity(tenant.len() + subject.len() + 1);
    k.push_str(tenant);
    k.push('\u{1f}');
    k.push_str(subject);
    k
}

fn millis(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Which leases a freeze affects.
type Affects = Box<dyn Fn(&LeaseRec) -> bool>;

struct LeaseRec {
    /// `key(tenant, subject)`.
    subject_key: String,
    /// `key(tenant, "")`.
    tenant_key: String,
    epoch: u64,
    tenant_epoch: u64,
    expires_ms: i64,
    revoked: bool,
    /// `(memory_id, version)` read.
    reads: Vec<(String, String)>,
    /// Active permits.
    active: u32,
}

#[derive(Default)]
struct State {
    next_lease: i64,
    next_permit: i64,
    leases: HashMap<i64, LeaseRec>,
    /// Active permits and their lease.
    permits: HashMap<i64, i64>,
    /// Current epochs by key.
    epochs: HashMap<String, u64>,
    /// Open fences: job -> key (a subject's key, or a tenant's key for a tenant scope).
    fences: HashMap<String, String>,
    /// How many open fences cover each key.
    fenced: HashMap<String, u32>,
    /// Tombstoned `(memory_id, version)` by subject key.
    tombstones: HashMap<String, HashSet<(String, String)>>,
    /// The permits each frozen job waits for.
    drains: HashMap<String, HashSet<i64>>,
}

impl State {
    fn epoch(&self, key: &str) -> u64 {
        self.epochs.get(key).copied().unwrap_or(0)
    }

    fn is_fenced(&self, subject_key: &str, tenant_key: &str) -> bool {
        self.fenced.contains_key(subject_key) || self.fenced.contains_key(tenant_key)
    }

    fn fence(&mut self, job: &str, key: String) {
        if self.fences.insert(job.to_string(), key.clone()).is_none() {
            *self.fenced.entry(key).or_default() += 1;
        }
    }

    /// Drops leases that expired with no active permit (they can take no permit again).
    fn sweep(&mut self, now_ms: i64) {
        self.leases
            .retain(|_, l| l.active > 0 || l.expires_ms > now_ms);
    }
}

/// The in-process gate. Share it behind an `Arc`; every method takes `&self`.
pub struct MemoryGate {
    state: Mutex<State>,
    /// The journal's authority gone ([`Journal::gate_authority_lost`]): nothing is granted.
    lost: Arc<AtomicBool>,
}

impl std::fmt::Debug for MemoryGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("MemoryGate")
            .field("leases", &s.leases.len())
            .field("active_permits", &s.permits.len())
            .field("open_fences", &s.fences.len())
            .finish()
    }
}

impl MemoryGate {
    /// Starts from the journal's epochs, open fences and tombstones, with no lease. First makes
    /// `journal` the store's gate authority ([`Journal::hold_gate_authority`]): from then on a
    /// freeze through any other journal of the store (another process's `lethe erase`) is
    /// refused, since this gate would never hear of its fence; freeze through `journal`, with
    /// [`MemoryGate::freeze`]. Refused with [`JournalError::GateAuthorityTaken`] while another
    /// gate holds the authority or a `lethe serve` shares it.
    pub fn load(journal: &Journal) -> Result<Self, JournalError> {
        journal.hold_gate_authority()?;
        let g = journal.gate_state()?;
        let mut s = State {
            next_lease: 1,
            next_permit: 1,
            ..State::default()
        };
        for (t, sub, e) in g.epochs {
            s.epochs.insert(key(&t, &sub), e);
        }
        for (job, t, sub) in g.fences {
            s.fence(&job, key(&t, &sub));
        }
        for (t, sub, m, v) in g.tombstones {
            s.tombstones
                .entry(key(&t, &sub))
                .or_default()
                .insert((m, v));
        }
        Ok(Self {
            state: Mutex::new(s),
            lost: journal.gate_authority_lost(),
        })
    }

    /// Refuses while the journal's authority is gone: another process's fence could be closed
    /// and this gate would not know (a PostgreSQL journal whose session the server closed).
    fn authority(&self) -> Result<(), GateError> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(GateError::AuthorityLost);
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a lease for a run that read the subject's memory. Refused while an erasure of the
    /// subject or tenant is open.
    pub fn take_lease(
        &self,
        now: OffsetDateTime,
        tenant: &Tenant,
        subject: &Subject,
        reads: &[(MemoryId, Version)],
        ttl: Duration,
    ) -> Result<Lease, GateError> {
        self.authority()?;
        let subject_key = key(tenant.as_str(), subject.as_str());
        let tenant_key = key(tenant.as_str(), "");
        let now_ms = millis(now);
        let mut s = self.lock();
        if s.is_fenced(&subject_key, &tenant_key) {
            return Err(GateError::Fenced);
        }
        let (epoch, tenant_epoch) = (s.epoch(&subject_key), s.epoch(&tenant_key));
        let id = s.next_lease;
        s.next_lease += 1;
        if id % 1024 == 0 {
            s.sweep(now_ms);
        }
        s.leases.insert(
            id,
            LeaseRec {
                subject_key,
                tenant_key,
                epoch,
                tenant_epoch,
                expires_ms: now_ms + ttl.as_millis() as i64,
                revoked: false,
                reads: reads
                    .iter()
                    .map(|(m, v)| (m.as_str().to_string(), v.as_str().to_string()))
                    .collect(),
                active: 0,
            },
        );
        Ok(Lease {
            id,
            epoch,
            tenant_epoch,
        })
    }

    /// Takes a permit: one check-and-register under the gate's lock.
    pub fn take_permit(
        &self,
        now: OffsetDateTime,
        lease: i64,
        _sink: Sink,
    ) -> Result<Permit, GateError> {
        self.authority()?;
        let mut s = self.lock();
        let s = &mut *s;
        let l = s.leases.get(&lease).ok_or(GateError::NoSuchLease)?;
        if l.revoked {
            return Err(GateError::Revoked);
        }
        if l.expires_ms <= millis(now) {
            return Err(GateError::Expired);
        }
        let epochs = |k: &str| s.epochs.get(k).copied().unwrap_or(0);
        if l.epoch != epochs(&l.subject_key) || l.tenant_epoch != epochs(&l.tenant_key) {
            return Err(GateError::StaleEpoch);
        }
        if s.fenced.contains_key(&l.subject_key) || s.fenced.contains_key(&l.tenant_key) {
            return Err(GateError::Fenced);
        }
        if !l.reads.is_empty() {
            if let Some(t) = s.tombstones.get(&l.subject_key) {
                if l.reads.iter().any(|r| t.contains(r)) {
                    return Err(GateError::Tombstoned);
                }
            }
        }
        let id = s.next_permit;
        s.next_permit += 1;
        s.permits.insert(id, lease);
        if let Some(l) = s.leases.get_mut(&lease) {
            l.active += 1;
        }
        Ok(Permit { id })
    }

    fn end_permit(&self, permit: i64) -> Result<(), GateError> {
        let mut s = self.lock();
        let lease = s.permits.remove(&permit).ok_or(GateError::NoSuchPermit)?;
        if let Some(l) = s.leases.get_mut(&lease) {
            l.active = l.active.saturating_sub(1);
        }
        Ok(())
    }

    /// The boundary ended normally.
    pub fn release_permit(&self, permit: i64) -> Result<(), GateError> {
        self.end_permit(permit)
    }

    /// The holder aborted the work the permit covered.
    pub fn confirm_cancelled(&self, permit: i64) -> Result<(), GateError> {
        self.end_permit(permit)
    }

    /// Whether a lease was revoked. Refused, as every grant is, once the journal's authority
    /// is lost ([`GateError::AuthorityLost`]).
    pub fn is_revoked(&self, lease: i64) -> Result<bool, GateError> {
        // A run polling its lease stops too: it cannot be told of a fence this gate misses.
        self.authority()?;
        self.lock()
            .leases
            .get(&lease)
            .map(|l| l.revoked)
            .ok_or(GateError::NoSuchLease)
    }

    /// Closes the fence for a REQUESTED job, here and in the journal, while this gate's lock is
    /// held: leases revoked, the active permits they hold recorded as the job's drain set, then
    /// the journal's freeze (epoch or tombstone, fence, `FenceClosed`).
    ///
    /// Here first: a freeze whose commit failed, or committed with its answer lost (a
    /// PostgreSQL connection cut at the `COMMIT`), leaves this gate closed all the same, so
    /// nothing is admitted while the journal may say FROZEN (found by review: the gate stayed
    /// open, and the job went on to erase with permits and leases still granted). The job is
    /// then run again: its freeze is tried again if the journal says REQUESTED, and applying
    /// it here again changes nothing. If it never runs again, the scope stays closed in this
    /// process until it restarts ([`MemoryGate::load`] reads the journal's fences).
    pub fn freeze(
        &self,
        journal: &Journal,
        at: &str,
        job_id: &str,
        version: Option<&Version>,
    ) -> Result<Freeze, JournalError> {
        let mut s = self.lock();
        let job = journal.job(job_id)?;
        let tenant = job.scope.tenant().as_str();
        let tenant_key = key(tenant, "");
        // The epoch the journal's freeze will bump, bumped here first (its next value: this
        // gate holds the journal's epochs, and it is the journal's one authority); once a job,
        // so a freeze tried again does not bump twice. The journal's answer then overrides it.
        let again = s.fences.contains_key(job_id);
        let bump = |s: &mut State, k: &str| {
            if !again {
                let e = s.epoch(k) + 1;
                s.epochs.insert(k.to_string(), e);
            }
        };
        // Which leases the freeze affects.
        let (epoch_key, affected): (Option<String>, Affects) = match &job.scope {
            lethe_core::Scope::Tenant { .. } => {
                bump(&mut s, &tenant_key);
                s.fence(job_id, tenant_key.clone());
                let k = tenant_key.clone();
                (
                    Some(tenant_key.clone()),
                    Box::new(move |l: &LeaseRec| l.tenant_key == k),
                )
            }
            lethe_core::Scope::Subject { subject, .. } => {
                let k = key(tenant, subject.as_str());
                bump(&mut s, &k);
                s.fence(job_id, k.clone());
                let k2 = k.clone();
                (Some(k), Box::new(move |l: &LeaseRec| l.subject_key == k2))
            }
            lethe_core::Scope::Memory {
                subject, memory, ..
            } => {
                let k = key(tenant, subject.as_str());
                let read = (
                    memory.as_str().to_string(),
                    version.map(|v| v.as_str().to_string()).unwrap_or_default(),
                );
                s.tombstones
                    .entry(k.clone())
                    .or_default()
                    .insert(read.clone());
                (
                    None,
                    Box::new(move |l: &LeaseRec| l.subject_key == k && l.reads.contains(&read)),
                )
            }
        };
        let mut revoked = 0;
        let mut hit = HashSet::new();
        for (id, l) in s.leases.iter_mut() {
            if affected(l) {
                hit.insert(*id);
                if !l.revoked {
                    l.revoked = true;
                    revoked += 1;
                }
            }
        }
        drop(affected);
        let drain: Vec<i64> = s
            .permits
            .iter()
            .filter(|(_, lease)| hit.contains(lease))
            .map(|(p, _)| *p)
            .collect();
        let drains = s.drains.entry(job_id.to_string()).or_default();
        let before = drains.len();
        drains.extend(drain);
        let drained_here = (drains.len() - before) as u64;
        let mut f = journal.freeze(at, job_id, version)?;
        if let (Some(k), Some(e)) = (epoch_key, f.subject_epoch.or(f.tenant_epoch)) {
            s.epochs.insert(k, e);
        }
        // The journal counted none of these: they are not in its tables.
        f.revoked_leases += revoked;
        f.permits_to_drain += drained_here;
        Ok(f)
    }

    /// Permits recorded at the job's freeze that are still active.
    pub fn undrained(&self, job_id: &str) -> u64 {
        let s = self.lock();
        s.drains.get(job_id).map_or(0, |d| {
            d.iter().filter(|p| s.permits.contains_key(p)).count() as u64
        })
    }

    /// The job completed (the journal removed its fence): open the fence here too.
    pub fn job_completed(&self, job_id: &str) {
        let mut s = self.lock();
        s.drains.remove(job_id);
        if let Some(k) = s.fences.remove(job_id) {
            if let Some(n) = s.fenced.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    s.fenced.remove(&k);
                }
            }
        }
    }
}
