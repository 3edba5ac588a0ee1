//! The gate: leases, permits and the freeze, each one transaction on the control store.
//!
//! - A **lease** binds a run to the subject's and tenant's epochs at read time and to every
//!   `(memory, version)` it read. Its TTL only reclaims ownership: an expired lease takes no new
//!   permits, but its active permits still have to drain.
//! - A **permit** is taken at an acceptance point (output, tool, state write). Taking it is one
//!   check-and-register under the write lock: lease not revoked, not expired, epochs current,
//!   no fence closed on the subject or tenant, none of its reads tombstoned.
//! - The **freeze** bumps the epoch (subject, tenant scopes) or appends the tombstone (memory
//!   scope), closes the fence, revokes the matching leases, records which active permits must
//!   drain, and journals `FenceClosed`, all in one transaction. From its commit on, no permit is
//!   issued for the scope.

use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};
use rusqlite::{params, OptionalExtension, Transaction};
use time::OffsetDateTime;

use crate::entry::Entry;
use crate::jobs::{apply, load_job};
use crate::{sql, Journal, Result};

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
    fn as_str(self) -> &'static str {
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

fn millis(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn epoch_of(tx: &rusqlite::Connection, tenant: &str, subject: &str) -> rusqlite::Result<u64> {
    tx.query_row(
        "SELECT epoch FROM epochs WHERE tenant = ?1 AND subject = ?2",
        params![tenant, subject],
        |r| r.get::<_, i64>(0),
    )
    .optional()
    .map(|e| e.unwrap_or(0) as u64)
}

fn bump(tx: &Transaction<'_>, tenant: &str, subject: &str) -> rusqlite::Result<u64> {
    tx.query_row(
        "INSERT INTO epochs (tenant, subject, epoch) VALUES (?1, ?2, 1)
         ON CONFLICT (tenant, subject) DO UPDATE SET epoch = epoch + 1
         RETURNING epoch",
        params![tenant, subject],
        |r| r.get::<_, i64>(0),
    )
    .map(|e| e as u64)
}

fn is_fenced(tx: &rusqlite::Connection, tenant: &str, subject: &str) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM fences WHERE tenant = ?1 AND subject IN (?2, ''))",
        params![tenant, subject],
        |r| r.get(0),
    )
}

impl Journal {
    /// Takes a lease for a run that read the subject's memory (`reads`: each memory and
    /// version it read). Refused while an erasure of the subject or tenant is in progress.
    pub fn take_lease(
        &self,
        now: OffsetDateTime,
        tenant: &Tenant,
        subject: &Subject,
        reads: &[(MemoryId, Version)],
        ttl: std::time::Duration,
    ) -> Result<Lease> {
        let (t, s) = (tenant.as_str(), subject.as_str());
        self.write(|tx| {
            if is_fenced(tx, t, s).map_err(sql)? {
                return Err(GateError::Fenced.into());
            }
            let epoch = epoch_of(tx, t, s).map_err(sql)?;
            let tenant_epoch = epoch_of(tx, t, "").map_err(sql)?;
            let expires = millis(now) + ttl.as_millis() as i64;
            tx.execute(
                "INSERT INTO leases (tenant, subject, epoch, tenant_epoch, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![t, s, epoch as i64, tenant_epoch as i64, expires],
            )
            .map_err(sql)?;
            let id = tx.last_insert_rowid();
            let mut ins = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO lease_reads (lease_id, memory_id, version) VALUES (?1, ?2, ?3)",
                )
                .map_err(sql)?;
            for (m, v) in reads {
                ins.execute(params![id, m.as_str(), v.as_str()]).map_err(sql)?;
            }
            Ok(Lease { id, epoch, tenant_epoch })
        })
    }

    /// Takes a permit at an acceptance point: one atomic check-and-register. Hold it until the
    /// boundary ends, then [`Journal::release_permit`].
    pub fn take_permit(&self, now: OffsetDateTime, lease: i64, sink: Sink) -> Result<Permit> {
        self.write(|tx| {
            let row: Option<(String, String, i64, i64, i64, Option<String>)> = tx
                .query_row(
                    "SELECT tenant, subject, epoch, tenant_epoch, expires_ms, revoked_by FROM leases WHERE lease_id = ?1",
                    [lease],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
                )
                .optional()
                .map_err(sql)?;
            let Some((t, s, epoch, tenant_epoch, expires, revoked)) = row else {
                return Err(GateError::NoSuchLease.into());
            };
            if revoked.is_some() {
                return Err(GateError::Revoked.into());
            }
            if expires <= millis(now) {
                return Err(GateError::Expired.into());
            }
            if epoch as u64 != epoch_of(tx, &t, &s).map_err(sql)?
                || tenant_epoch as u64 != epoch_of(tx, &t, "").map_err(sql)?
            {
                return Err(GateError::StaleEpoch.into());
            }
            if is_fenced(tx, &t, &s).map_err(sql)? {
                return Err(GateError::Fenced.into());
            }
            let tombstoned: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM lease_reads r JOIN tombstones t
                       ON t.memory_id = r.memory_id AND t.version = r.version
                      WHERE r.lease_id = ?1 AND t.tenant = ?2 AND t.subject = ?3)",
                    params![lease, t, s],
                    |r| r.get(0),
                )
                .map_err(sql)?;
            if tombstoned {
                return Err(GateError::Tombstoned.into());
            }
            tx.execute(
                "INSERT INTO permits (lease_id, sink, state, issued_ms) VALUES (?1, ?2, 'active', ?3)",
                params![lease, sink.as_str(), millis(now)],
            )
            .map_err(sql)?;
            Ok(Permit { id: tx.last_insert_rowid() })
        })
    }

    fn end_permit(&self, permit: i64, state: &str) -> Result<()> {
        self.write(|tx| {
            let n = tx
                .execute(
                    "UPDATE permits SET state = ?2 WHERE permit_id = ?1 AND state = 'active'",
                    params![permit, state],
                )
                .map_err(sql)?;
            if n == 0 {
                return Err(GateError::NoSuchPermit.into());
            }
            Ok(())
        })
    }

    /// The boundary ended normally.
    pub fn release_permit(&self, permit: i64) -> Result<()> {
        self.end_permit(permit, "released")
    }

    /// The holder confirms it aborted the work the permit covered (stream aborted, buffered
    /// tokens discarded, undispatched tools revoked).
    pub fn confirm_cancelled(&self, permit: i64) -> Result<()> {
        self.end_permit(permit, "cancelled")
    }

    /// Whether a lease was revoked. Runtimes poll this (the push stream comes with the HTTP gate).
    pub fn is_revoked(&self, lease: i64) -> Result<bool> {
        self.read(|c| {
            c.query_row(
                "SELECT revoked_by IS NOT NULL FROM leases WHERE lease_id = ?1",
                [lease],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql)?
            .ok_or_else(|| GateError::NoSuchLease.into())
        })
    }

    /// Closes the fence for a REQUESTED job, atomically with the `FenceClosed` entry.
    /// `version` is the memory version to tombstone (memory scope; resolved by the engine).
    pub fn freeze(&self, at: &str, job_id: &str, version: Option<&Version>) -> Result<Freeze> {
        self.write(|tx| {
            let job = load_job(tx, job_id)?;
            let t = job.scope.tenant().as_str().to_string();
            // Leases affected, as a SQL condition on `leases l` over the CTE `p`:
            // p.a = tenant, p.b = subject, p.c = memory, p.d = version.
            let (subject_epoch, tenant_epoch, affected, s, m, v) = match &job.scope {
                Scope::Subject { subject, .. } => {
                    let s = subject.as_str().to_string();
                    let e = bump(tx, &t, &s).map_err(sql)?;
                    tx.execute("INSERT INTO fences (job_id, tenant, subject) VALUES (?1, ?2, ?3)", params![job_id, t, s])
                        .map_err(sql)?;
                    (Some(e), None, "l.tenant = (SELECT a FROM p) AND l.subject = (SELECT b FROM p)", s, String::new(), String::new())
                }
                Scope::Tenant { .. } => {
                    let e = bump(tx, &t, "").map_err(sql)?;
                    tx.execute("INSERT INTO fences (job_id, tenant, subject) VALUES (?1, ?2, '')", params![job_id, t])
                        .map_err(sql)?;
                    (None, Some(e), "l.tenant = (SELECT a FROM p)", String::new(), String::new(), String::new())
                }
                Scope::Memory { subject, memory, .. } => {
                    let s = subject.as_str().to_string();
                    let v = version.map(|v| v.as_str().to_string()).unwrap_or_default();
                    tx.execute(
                        "INSERT INTO tombstones (tenant, subject, memory_id, version, job_id) VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT DO NOTHING",
                        params![t, s, memory.as_str(), v, job_id],
                    )
                    .map_err(sql)?;
                    let e = epoch_of(tx, &t, &s).map_err(sql)?;
                    (
                        Some(e),
                        None,
                        "l.tenant = (SELECT a FROM p) AND l.subject = (SELECT b FROM p)
                         AND EXISTS (SELECT 1 FROM lease_reads r WHERE r.lease_id = l.lease_id
                           AND r.memory_id = (SELECT c FROM p) AND r.version = (SELECT d FROM p))",
                        s,
                        memory.as_str().to_string(),
                        v,
                    )
                }
            };
            // The four parameters are bound once through a CTE, whichever the condition uses.
            let cond = affected;
            let permits_to_drain = tx
                .execute(
                    &format!(
                        "WITH p(a, b, c, d) AS (SELECT ?1, ?2, ?3, ?4)
                         INSERT OR IGNORE INTO drain (job_id, permit_id)
                         SELECT ?5, pm.permit_id FROM permits pm JOIN leases l ON l.lease_id = pm.lease_id
                          WHERE pm.state = 'active' AND {cond}"
                    ),
                    params![t, s, m, v, job_id],
                )
                .map_err(sql)? as u64;
            let revoked_leases = tx
                .execute(
                    &format!(
                        "WITH p(a, b, c, d) AS (SELECT ?1, ?2, ?3, ?4)
                         UPDATE leases AS l SET revoked_by = ?5 WHERE l.revoked_by IS NULL AND {cond}"
                    ),
                    params![t, s, m, v, job_id],
                )
                .map_err(sql)? as u64;
            tx.execute(
                "UPDATE jobs SET subject_epoch = ?2, tenant_epoch = ?3, tombstone_version = ?4 WHERE job_id = ?1",
                params![
                    job_id,
                    subject_epoch.map(|e| e as i64),
                    tenant_epoch.map(|e| e as i64),
                    version.map(|v| v.as_str())
                ],
            )
            .map_err(sql)?;
            let freeze = Freeze { subject_epoch, tenant_epoch, revoked_leases, permits_to_drain };
            apply(
                tx,
                at,
                job_id,
                &Entry::FenceClosed {
                    subject_epoch,
                    tenant_epoch,
                    tombstone_version: version.map(|v| v.as_str().to_string()),
                    revoked_leases,
                    permits_to_drain,
                },
            )?;
            Ok(freeze)
        })
    }

    /// Permits found active at the job's freeze that are still neither released nor
    /// confirmed cancelled. Zero means drained.
    pub fn undrained(&self, job_id: &str) -> Result<u64> {
        self.read(|c| {
            c.query_row(
                "SELECT count(*) FROM drain d JOIN permits p ON p.permit_id = d.permit_id
                  WHERE d.job_id = ?1 AND p.state = 'active'",
                [job_id],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(sql)
        })
    }

    /// The current epochs of a subject: (subject epoch, tenant epoch).
    pub fn epochs(&self, tenant: &Tenant, subject: &Subject) -> Result<(u64, u64)> {
        self.read(|c| {
            Ok((
                epoch_of(c, tenant.as_str(), subject.as_str()).map_err(sql)?,
                epoch_of(c, tenant.as_str(), "").map_err(sql)?,
            ))
        })
    }
}
