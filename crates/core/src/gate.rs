//! The gate's vocabulary as plain data: the refusals with their stable codes, the sinks, and
//! what a lease, a permit and a freeze return. `lethe-gate` is their home and re-exports them;
//! they are defined here, with no I/O, because the journal's gate (whose freeze commits in the
//! journal's own transaction) and `lethe-gate` (which depends on the journal) both name them.
//!
//! Not here: any rule of the gate. The in-memory authority is `lethe-gate`'s `MemoryGate`, the
//! control store's is the journal's gate, and the closed set of both is `lethe_gate::Authority`.

/// Why the gate refused. Stable codes; no identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// A deletion job holds the subject's or tenant's fence closed.
    #[error("fenced: an erasure of this scope is in progress")]
    Fenced,
    /// The lease was revoked by a freeze.
    #[error("revoked: the lease was revoked by an erasure")]
    Revoked,
    /// The lease's epoch is older than the subject's or tenant's current epoch.
    #[error("stale epoch: the lease read memory that has since been erased")]
    StaleEpoch,
    /// The lease read a memory version that was tombstoned.
    #[error("tombstoned: the lease read a memory version that was erased")]
    Tombstoned,
    /// The lease's TTL passed.
    #[error("expired: the lease's TTL passed; take a new lease")]
    Expired,
    /// No such lease.
    #[error("no such lease")]
    NoSuchLease,
    /// No such permit, or it is no longer active.
    #[error("no such active permit")]
    NoSuchPermit,
    /// A take's key names a permit of the lease that has ended, or was taken for another
    /// sink: a key is one take's, never reused.
    #[error("key used: this key named another take of the lease; use a new key for each take")]
    KeyUsed,
    /// The in-process gate's authority over the journal is gone (its PostgreSQL session was
    /// closed): it could not hear of another process's fence, so it grants nothing.
    #[error("unavailable: the in-process gate lost its authority over the journal (its PostgreSQL session was closed); restart the process")]
    AuthorityLost,
}

impl GateError {
    /// The refusal a gate function's negative result stands for on PostgreSQL (the journal's
    /// schema.rs): `None` for a non-negative result, which is an id.
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            -1 => Some(GateError::NoSuchLease),
            -2 => Some(GateError::Revoked),
            -3 => Some(GateError::Expired),
            -4 => Some(GateError::StaleEpoch),
            -5 => Some(GateError::Fenced),
            -6 => Some(GateError::Tombstoned),
            -7 => Some(GateError::KeyUsed),
            c if c < 0 => Some(GateError::NoSuchLease),
            _ => None,
        }
    }
}

/// Where a permit is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Emitting model output.
    Output,
    /// Dispatching a tool.
    Tool,
    /// Writing state.
    State,
}

impl Sink {
    /// The name stored and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Sink::Output => "output",
            Sink::Tool => "tool",
            Sink::State => "state",
        }
    }
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Its id.
    pub id: i64,
    /// The subject's epoch it is bound to.
    pub epoch: u64,
    /// The tenant's epoch it is bound to.
    pub tenant_epoch: u64,
}

/// A granted permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    /// Its id.
    pub id: i64,
}

/// The gate's durable state, for an in-memory authority to start from (`MemoryGate::load`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GateState {
    /// `(tenant, subject, epoch)`; subject `""` is the tenant's own epoch.
    pub epochs: Vec<(String, String, u64)>,
    /// Open fences: `(job_id, tenant, subject)`; subject `""` fences the whole tenant.
    pub fences: Vec<(String, String, String)>,
    /// `(tenant, subject, memory_id, version)`.
    pub tombstones: Vec<(String, String, String, String)>,
}

/// Counts only: every entry names a tenant and subject.
impl std::fmt::Debug for GateState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateState")
            .field("epochs", &self.epochs.len())
            .field("fences", &self.fences.len())
            .field("tombstones", &self.tombstones.len())
            .finish()
    }
}

/// What a freeze did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeze {
    /// Subject epoch after the freeze.
    pub subject_epoch: Option<u64>,
    /// Tenant epoch after the freeze.
    pub tenant_epoch: Option<u64>,
    /// Leases revoked.
    pub revoked_leases: u64,
    /// Active permits that must drain.
    pub permits_to_drain: u64,
}
