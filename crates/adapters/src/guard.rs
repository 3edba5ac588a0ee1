//! The database guard contract: a sink that refuses stale and fenced writes by itself.
//!
//! docs/design.md ("The gate", sinks): a store that accepts memory writes checks the fencing
//! token, so a stale worker, an expired outbox or a recovery task cannot write around the gate.
//! An adapter whose store can hold such a guard returns one from [`crate::Adapter::guard`]; the
//! engine keeps it current during each job (close the fence at FROZEN, record what each
//! inventory found as erased as soon as it is read, open the fence at COMPLETE) and `lethe guard` installs it.
//!
//! Today only the LangGraph PostgreSQL adapters have one (`crate::postgres_guard`).

use lethe_core::{Scope, Subject, Tenant};

use crate::{AdapterError, Locator};

/// What a job fences in a guard: the owner and the epoch a new lease binds after the job.
#[derive(Debug, Clone, Copy)]
pub enum Fence<'a> {
    /// A subject scope: the subject's epoch after the freeze.
    Subject {
        /// The tenant.
        tenant: &'a Tenant,
        /// The subject.
        subject: &'a Subject,
        /// The subject epoch the job bumped to.
        epoch: u64,
    },
    /// A tenant scope: the tenant's epoch after the freeze.
    Tenant {
        /// The tenant.
        tenant: &'a Tenant,
        /// The tenant epoch the job bumped to.
        epoch: u64,
    },
    /// A memory scope: no epoch moves and no owner is fenced; erased items stay erased.
    Memory,
}

impl<'a> Fence<'a> {
    /// The fence a job with this scope and these epochs closes.
    pub fn of(scope: &'a Scope, subject_epoch: Option<u64>, tenant_epoch: Option<u64>) -> Self {
        match scope {
            Scope::Subject { tenant, subject } => Fence::Subject {
                tenant,
                subject,
                epoch: subject_epoch.unwrap_or(0),
            },
            Scope::Tenant { tenant } => Fence::Tenant {
                tenant,
                epoch: tenant_epoch.unwrap_or(0),
            },
            Scope::Memory { .. } => Fence::Memory,
        }
    }
}

/// A guard's state, for `lethe guard status`. Counts only, never an identifier.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GuardStatus {
    /// The guard's schema exists and every trigger this target needs is in place.
    pub installed: bool,
    /// The installed guard's version (`None`: not installed in this database).
    pub version: Option<String>,
    /// This target's triggers in place, of how many it needs.
    pub triggers: u64,
    /// Triggers this target needs.
    pub triggers_needed: u64,
    /// Subjects whose erasure is running now (writes refused).
    pub fenced_subjects: u64,
    /// Tenants whose erasure is running now.
    pub fenced_tenants: u64,
    /// Subjects and tenants ever erased under the guard (writes need a current token).
    pub erased_owners: u64,
    /// Erased threads (never written again).
    pub erased_threads: u64,
    /// Erased store items.
    pub erased_items: u64,
}

/// A sink's guard. Every method is idempotent. `close`, `record_erased` and `open` do nothing
/// and return `Ok(false)` when the guard is not installed in the target's database.
pub trait Guard: Send + Sync {
    /// The guard's state. Read-only.
    fn status(&self) -> Result<GuardStatus, AdapterError>;
    /// Installs (or upgrades) the guard and this target's triggers, under the deployment's
    /// guard key (tokens are checked and digests keyed with it; a guard installed under
    /// another key is refused). Idempotent.
    fn install(&self, key: &lethe_core::keys::GuardKey) -> Result<(), AdapterError>;
    /// Removes this target's triggers, and the guard's schema once no trigger uses it.
    /// Refused while a fence is closed (a job is running).
    fn uninstall(&self) -> Result<(), AdapterError>;
    /// Closes the fence: the owner's writes are refused until [`Guard::open`].
    fn close(&self, fence: &Fence<'_>) -> Result<bool, AdapterError>;
    /// [`Guard::close`] for many fences at once (a batch's jobs): one transaction, and one
    /// wait for the writers in flight. Default: one `close` each.
    fn close_many(&self, fences: &[Fence<'_>]) -> Result<bool, AdapterError> {
        let mut installed = false;
        for f in fences {
            installed |= self.close(f)?;
        }
        Ok(installed)
    }
    /// Records the frozen locators as erased, before they are erased (journal before act).
    fn record_erased(&self, fence: &Fence<'_>, frozen: &[Locator]) -> Result<bool, AdapterError>;
    /// Opens the fence again, keeping the epoch and the erased lists.
    fn open(&self, fence: &Fence<'_>) -> Result<bool, AdapterError>;
}
