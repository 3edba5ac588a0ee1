//! The closed set of gate authorities: the in-process gate, or the control store's tables. A
//! journal has one at a time (the journal's gate-authority lock enforces it); the engine asks
//! whichever governs its journal. Not here: either authority's rules ([`crate::MemoryGate`],
//! [`crate::JournalGate`]) or the asynchronous path of `lethe serve` ([`crate::pg`]).

use std::time::Duration;

use lethe_core::{MemoryId, Subject, Tenant, Version};
use lethe_journal::{Journal, JournalError};
use time::OffsetDateTime;

use crate::{Freeze, JournalGate, Lease, MemoryGate, Permit, Sink};

/// Which authority governs a journal's gate.
#[derive(Debug, Clone, Copy)]
pub enum Authority<'a> {
    /// Leases and permits in this process; epochs, fences and tombstones written through
    /// `journal`, which [`MemoryGate::load`] made the store's gate authority.
    Memory {
        /// The in-process gate.
        gate: &'a MemoryGate,
        /// The journal it loaded from and freezes through.
        journal: &'a Journal,
    },
    /// Leases and permits as rows in the control store.
    Journal(JournalGate<'a>),
}

type Result<T> = std::result::Result<T, JournalError>;

impl<'a> Authority<'a> {
    /// The control store's own authority over `journal`.
    pub fn journal(journal: &'a Journal) -> Self {
        Authority::Journal(JournalGate::new(journal))
    }

    /// Takes a lease for a run that read `reads` of the subject's memory.
    pub fn take_lease(
        &self,
        now: OffsetDateTime,
        tenant: &Tenant,
        subject: &Subject,
        reads: &[(MemoryId, Version)],
        ttl: Duration,
    ) -> Result<Lease> {
        match self {
            Authority::Memory { gate, .. } => {
                Ok(gate.take_lease(now, tenant, subject, reads, ttl)?)
            }
            Authority::Journal(j) => j.take_lease(now, tenant, subject, reads, ttl),
        }
    }

    /// Takes a permit: one check-and-register.
    pub fn take_permit(&self, now: OffsetDateTime, lease: i64, sink: Sink) -> Result<Permit> {
        match self {
            Authority::Memory { gate, .. } => Ok(gate.take_permit(now, lease, sink)?),
            Authority::Journal(j) => j.take_permit(now, lease, sink),
        }
    }

    /// The permit's boundary ended normally.
    pub fn release_permit(&self, permit: i64) -> Result<()> {
        match self {
            Authority::Memory { gate, .. } => Ok(gate.release_permit(permit)?),
            Authority::Journal(j) => j.release_permit(permit),
        }
    }

    /// The permit's holder aborted the work it covered.
    pub fn confirm_cancelled(&self, permit: i64) -> Result<()> {
        match self {
            Authority::Memory { gate, .. } => Ok(gate.confirm_cancelled(permit)?),
            Authority::Journal(j) => j.confirm_cancelled(permit),
        }
    }

    /// Whether a lease was revoked.
    pub fn is_revoked(&self, lease: i64) -> Result<bool> {
        match self {
            Authority::Memory { gate, .. } => Ok(gate.is_revoked(lease)?),
            Authority::Journal(j) => j.is_revoked(lease),
        }
    }

    /// Closes the fence for a REQUESTED job (see [`MemoryGate::freeze`], [`Journal::freeze`]).
    pub fn freeze(&self, at: &str, job_id: &str, version: Option<&Version>) -> Result<Freeze> {
        match self {
            Authority::Memory { gate, journal } => gate.freeze(journal, at, job_id, version),
            Authority::Journal(j) => j.freeze(at, job_id, version),
        }
    }

    /// Permits recorded at the job's freeze that are still active. With the in-process gate,
    /// the journal's count too: a permit taken on the control store's tables (through the
    /// journal itself) is in the journal's drain set, not the gate's.
    pub fn undrained(&self, job_id: &str) -> Result<u64> {
        match self {
            Authority::Memory { gate, journal } => {
                Ok(journal.undrained(job_id)? + gate.undrained(job_id))
            }
            Authority::Journal(j) => j.undrained(job_id),
        }
    }

    /// The job completed (the journal removed its fence): the in-process gate opens its own.
    pub fn job_completed(&self, job_id: &str) {
        if let Authority::Memory { gate, .. } = self {
            gate.job_completed(job_id);
        }
    }
}
