//! The control store's authority: leases and permits as rows in the journal's tables, on SQLite
//! or PostgreSQL, as `lethe serve` and `lethe erase` without an in-process gate use them.
//!
//! The rules and their SQL are the journal's (`lethe_journal`'s gate.rs and schema.rs), because
//! a freeze commits in the same transaction as its `FenceClosed` entry; this is the gate's face
//! of them, one blocking call each. Not here: the asynchronous path of `lethe serve` on
//! PostgreSQL ([`crate::pg`]).

use std::time::Duration;

use lethe_core::{MemoryId, Subject, Tenant, Version};
use lethe_journal::{Journal, JournalError};
use time::OffsetDateTime;

use crate::{Freeze, GateState, Lease, Permit, Sink};

/// The journal-backed gate over a borrowed journal. Every call is one transaction on the
/// control store; refusals are [`JournalError::Gate`].
#[derive(Debug, Clone, Copy)]
pub struct JournalGate<'a> {
    journal: &'a Journal,
}

type Result<T> = std::result::Result<T, JournalError>;

impl<'a> JournalGate<'a> {
    /// The gate of `journal`'s control store.
    pub fn new(journal: &'a Journal) -> Self {
        Self { journal }
    }

    /// The journal it writes through.
    pub fn journal(&self) -> &'a Journal {
        self.journal
    }

    /// Takes a lease for a run that read `reads` of the subject's memory; refused while an
    /// erasure of the subject or tenant is in progress.
    pub fn take_lease(
        &self,
        now: OffsetDateTime,
        tenant: &Tenant,
        subject: &Subject,
        reads: &[(MemoryId, Version)],
        ttl: Duration,
    ) -> Result<Lease> {
        self.journal.take_lease(now, tenant, subject, reads, ttl)
    }

    /// Takes a permit without a key: one atomic check-and-register.
    pub fn take_permit(&self, now: OffsetDateTime, lease: i64, sink: Sink) -> Result<Permit> {
        self.journal.take_permit(now, lease, sink)
    }

    /// Takes a permit named by the client's `key` (see [`Journal::take_permit_keyed`]).
    pub fn take_permit_keyed(
        &self,
        now: OffsetDateTime,
        lease: i64,
        sink: Sink,
        key: Option<&str>,
    ) -> Result<Permit> {
        self.journal.take_permit_keyed(now, lease, sink, key)
    }

    /// Releases a permit taken without a key.
    pub fn release_permit(&self, permit: i64) -> Result<()> {
        self.journal.release_permit(permit)
    }

    /// Releases a permit showing its take's key (see [`Journal::release_permit_keyed`]).
    pub fn release_permit_keyed(&self, permit: i64, key: Option<&str>) -> Result<()> {
        self.journal.release_permit_keyed(permit, key)
    }

    /// The holder of a permit taken without a key aborted its work.
    pub fn confirm_cancelled(&self, permit: i64) -> Result<()> {
        self.journal.confirm_cancelled(permit)
    }

    /// [`JournalGate::confirm_cancelled`] showing the take's key.
    pub fn confirm_cancelled_keyed(&self, permit: i64, key: Option<&str>) -> Result<()> {
        self.journal.confirm_cancelled_keyed(permit, key)
    }

    /// Extends a lease's TTL; returns its new expiry (see [`Journal::renew_lease`]).
    pub fn renew_lease(&self, now: OffsetDateTime, lease: i64, ttl: Duration) -> Result<i64> {
        self.journal.renew_lease(now, lease, ttl)
    }

    /// Whether a lease was revoked.
    pub fn is_revoked(&self, lease: i64) -> Result<bool> {
        self.journal.is_revoked(lease)
    }

    /// Which of these leases are revoked or gone (see [`Journal::revoked_among`]).
    pub fn revoked_among(&self, leases: &[i64]) -> Result<Vec<i64>> {
        self.journal.revoked_among(leases)
    }

    /// Deletes what the gate no longer needs, at most `limit` rows of each kind; returns
    /// `(permits, leases)` deleted (see [`Journal::sweep_gate`]).
    pub fn sweep(&self, now: OffsetDateTime, limit: i64) -> Result<(u64, u64)> {
        self.journal.sweep_gate(now, limit)
    }

    /// Closes the fence for a REQUESTED job, atomically with its `FenceClosed` entry.
    pub fn freeze(&self, at: &str, job_id: &str, version: Option<&Version>) -> Result<Freeze> {
        self.journal.freeze(at, job_id, version)
    }

    /// Permits recorded at the job's freeze that are still active.
    pub fn undrained(&self, job_id: &str) -> Result<u64> {
        self.journal.undrained(job_id)
    }

    /// The current epochs of a subject: (subject epoch, tenant epoch).
    pub fn epochs(&self, tenant: &Tenant, subject: &Subject) -> Result<(u64, u64)> {
        self.journal.epochs(tenant, subject)
    }

    /// Epochs, open fences and tombstones, as committed.
    pub fn gate_state(&self) -> Result<GateState> {
        self.journal.gate_state()
    }
}
