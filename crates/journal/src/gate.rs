//! The control store's gate: leases, permits and the freeze, each one transaction on the
//! control store. The gate's types are `lethe_core::gate`'s, used from `lethe-gate`, which
//! also holds the closed set of authorities (`lethe_gate::JournalGate` is this one's face) and
//! the asynchronous PostgreSQL path of `lethe serve`. Here because the freeze commits in the
//! same transaction as its journal entry.
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

use lethe_core::gate::{Freeze, GateError, GateState, Lease, Permit, Sink};
use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};
use time::OffsetDateTime;

use crate::chain::db;
use crate::db::{Tx, V};
use crate::entry::Entry;
use crate::jobs::{apply, load_job};
use crate::{Journal, Result};

/// The gate's statements on PostgreSQL: one call each of the functions in schema.rs, whose
/// version fixes their signatures (`lethe_gate::pg` calls `lethe_gate_batch` and
/// `lethe_take_lease` the same way, asynchronously).
mod pg {
    /// `(lease_id BIGINT, sink TEXT, now_ms BIGINT, request_key TEXT or NULL) -> permit id or
    /// refusal code`: a batch of one.
    pub(super) const TAKE_PERMIT: &str =
        "SELECT (lethe_gate_batch(ARRAY[$1::BIGINT], ARRAY[$2::TEXT], ARRAY[$4::TEXT], $3, '{}', '{}', '{}'))[1]";
    /// `(permit_id BIGINT, state TEXT 'released' | 'cancelled', request_key TEXT or NULL) -> 1,
    /// or 0 if not active, or keyed with another key`.
    pub(super) const END_PERMIT: &str = "SELECT lethe_end_permit($1, $2, $3)";
    /// `(tenant, subject, expires_ms BIGINT, reads JSON [[memory, version], ...])` ->
    /// `(lease_id, epoch, tenant_epoch)`, lease_id -5 when fenced.
    pub(super) const TAKE_LEASE: &str =
        "SELECT lease_id, epoch, tenant_epoch FROM lethe_take_lease($1, $2, $3, $4)";
}

fn millis(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn epoch_of(tx: &mut dyn Tx, tenant: &str, subject: &str) -> Result<u64> {
    Ok(tx
        .row(
            "SELECT epoch FROM epochs WHERE tenant = $1 AND subject = $2",
            &[tenant.into(), subject.into()],
        )
        .map_err(db)?
        .and_then(|r| r[0].i())
        .unwrap_or(0) as u64)
}

fn bump(tx: &mut dyn Tx, tenant: &str, subject: &str) -> Result<u64> {
    Ok(tx
        .one(
            "INSERT INTO epochs (tenant, subject, epoch) VALUES ($1, $2, 1)
             ON CONFLICT (tenant, subject) DO UPDATE SET epoch = epochs.epoch + 1
             RETURNING epoch",
            &[tenant.into(), subject.into()],
        )
        .map_err(db)?
        .i()
        .unwrap_or(0) as u64)
}

pub(crate) fn is_fenced(tx: &mut dyn Tx, tenant: &str, subject: &str) -> Result<bool> {
    Ok(tx
        .one(
            "SELECT EXISTS (SELECT 1 FROM fences WHERE tenant = $1 AND subject IN ($2, ''))",
            &[tenant.into(), subject.into()],
        )
        .map_err(db)?
        .i()
        == Some(1))
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
        let expires = millis(now) + ttl.as_millis() as i64;
        let pairs: Vec<[&str; 2]> = reads
            .iter()
            .map(|(m, v)| [m.as_str(), v.as_str()])
            .collect();
        let reads_json = serde_json::to_string(&pairs).map_err(|e| self.db(e.to_string()))?;
        if let Some(rows) = self.pg_query(pg::TAKE_LEASE, &[&t, &s, &expires, &reads_json])? {
            let r = rows
                .first()
                .ok_or_else(|| self.db("lethe_take_lease returned no row".into()))?;
            let id: i64 = r.get(0);
            if id == -5 {
                return Err(GateError::Fenced.into());
            }
            return Ok(Lease {
                id,
                epoch: r.get::<_, i64>(1) as u64,
                tenant_epoch: r.get::<_, i64>(2) as u64,
            });
        }
        self.write(|tx| {
            if is_fenced(tx, t, s)? {
                return Err(GateError::Fenced.into());
            }
            let epoch = epoch_of(tx, t, s)?;
            let tenant_epoch = epoch_of(tx, t, "")?;
            let id = tx
                .one(
                    "INSERT INTO leases (tenant, subject, epoch, tenant_epoch, expires_ms) VALUES ($1, $2, $3, $4, $5) RETURNING lease_id",
                    &[t.into(), s.into(), epoch.into(), tenant_epoch.into(), V::I(expires)],
                )
                .map_err(db)?
                .i()
                .unwrap_or(0);
            for (m, v) in reads {
                tx.exec(
                    "INSERT INTO lease_reads (lease_id, memory_id, version) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[V::I(id), m.as_str().into(), v.as_str().into()],
                )
                .map_err(db)?;
            }
            Ok(Lease { id, epoch, tenant_epoch })
        })
    }

    /// Takes a permit at an acceptance point: one atomic check-and-register. Hold it until the
    /// boundary ends, then [`Journal::release_permit`].
    pub fn take_permit(&self, now: OffsetDateTime, lease: i64, sink: Sink) -> Result<Permit> {
        self.take_permit_keyed(now, lease, sink, None)
    }

    /// [`Journal::take_permit`] with the client's name for this take (`key`, unique within the
    /// lease): a take sent again with the key of one that registered a permit gets that permit
    /// back while it is active, whatever the gate now says (its answer was lost; the permit was
    /// issued, and a freeze since has it in its drain set). Without this, a runtime whose
    /// answer was lost could never release the permit, and an erasure would stay BLOCKED on it.
    /// A key whose permit has ended, or was for another sink, is [`GateError::KeyUsed`].
    pub fn take_permit_keyed(
        &self,
        now: OffsetDateTime,
        lease: i64,
        sink: Sink,
        key: Option<&str>,
    ) -> Result<Permit> {
        if let Some(rows) = self.pg_query(
            pg::TAKE_PERMIT,
            &[&lease, &sink.as_str(), &millis(now), &key],
        )? {
            let id: i64 = rows.first().map(|r| r.get(0)).unwrap_or(-1);
            return match GateError::from_code(id) {
                Some(e) => Err(e.into()),
                None => Ok(Permit { id }),
            };
        }
        self.write(|tx| {
            if let Some(key) = key {
                let prior = tx
                    .row(
                        "SELECT permit_id, state, sink FROM permits WHERE lease_id = $1 AND request_key = $2",
                        &[V::I(lease), key.into()],
                    )
                    .map_err(db)?;
                if let Some(r) = prior {
                    // The same take sent again: its permit, still held. Anything else is a key
                    // reused, which must not grant a permit no drain set tracks.
                    if r[1].text() != "active" || r[2].text() != sink.as_str() {
                        return Err(GateError::KeyUsed.into());
                    }
                    return Ok(Permit {
                        id: r[0].i().unwrap_or(0),
                    });
                }
            }
            let row = tx
                .row("SELECT tenant, subject, epoch, tenant_epoch, expires_ms, revoked_by FROM leases WHERE lease_id = $1", &[V::I(lease)])
                .map_err(db)?;
            let Some(r) = row else { return Err(GateError::NoSuchLease.into()) };
            let (t, s) = (r[0].text(), r[1].text());
            if r[5].t().is_some() {
                return Err(GateError::Revoked.into());
            }
            if r[4].i().unwrap_or(0) <= millis(now) {
                return Err(GateError::Expired.into());
            }
            if r[2].i().unwrap_or(-1) as u64 != epoch_of(tx, &t, &s)? || r[3].i().unwrap_or(-1) as u64 != epoch_of(tx, &t, "")? {
                return Err(GateError::StaleEpoch.into());
            }
            if is_fenced(tx, &t, &s)? {
                return Err(GateError::Fenced.into());
            }
            let tombstoned = tx
                .one(
                    "SELECT EXISTS (SELECT 1 FROM lease_reads r JOIN tombstones t
                       ON t.memory_id = r.memory_id AND t.version = r.version
                      WHERE r.lease_id = $1 AND t.tenant = $2 AND t.subject = $3)",
                    &[V::I(lease), t.as_str().into(), s.as_str().into()],
                )
                .map_err(db)?
                .i()
                == Some(1);
            if tombstoned {
                return Err(GateError::Tombstoned.into());
            }
            let id = tx
                .one(
                    "INSERT INTO permits (lease_id, sink, state, issued_ms, request_key) VALUES ($1, $2, 'active', $3, $4) RETURNING permit_id",
                    &[V::I(lease), sink.as_str().into(), V::I(millis(now)), key.into()],
                )
                .map_err(db)?
                .i()
                .unwrap_or(0);
            Ok(Permit { id })
        })
    }

    fn end_permit(&self, permit: i64, state: &'static str, key: Option<&str>) -> Result<()> {
        // One statement: no lock beyond the row's. A freeze racing it records the permit in
        // its drain set either way; only an `active` permit counts as undrained. Committed
        // without waiting for the WAL flush (see schema.rs): losing it can only keep a job
        // BLOCKED.
        if let Some(rows) = self.pg_query(pg::END_PERMIT, &[&permit, &state, &key])? {
            let n: i64 = rows.first().map(|r| r.get(0)).unwrap_or(0);
            return if n == 0 {
                Err(GateError::NoSuchPermit.into())
            } else {
                Ok(())
            };
        }
        self.write(|tx| {
            let n = tx
                .exec(
                    "UPDATE permits SET state = $2
                      WHERE permit_id = $1 AND state = 'active' AND request_key IS $3",
                    &[V::I(permit), state.into(), key.into()],
                )
                .map_err(db)?;
            if n == 0 {
                return Err(GateError::NoSuchPermit.into());
            }
            Ok(())
        })
    }

    /// The boundary ended normally, for a permit taken without a key (in-process,
    /// [`Journal::take_permit`]). A permit taken with a key ends only with it
    /// ([`Journal::release_permit_keyed`]), and one taken without only without.
    pub fn release_permit(&self, permit: i64) -> Result<()> {
        self.end_permit(permit, "released", None)
    }

    /// The holder confirms it aborted the work the permit covered (stream aborted, buffered
    /// tokens discarded, undispatched tools revoked).
    pub fn confirm_cancelled(&self, permit: i64) -> Result<()> {
        self.end_permit(permit, "cancelled", None)
    }

    /// [`Journal::release_permit`] showing the key the permit's take carried: a keyed permit
    /// is ended only by its holder, so a runtime that names another run's permit (a stale id,
    /// a bug) gets [`GateError::NoSuchPermit`] instead of marking it drained while that run is
    /// still inside its boundary. The key must match exactly: a permit taken without a key
    /// is not ended by one shown with a key, nor a keyed one without (review, 2026-12-04:
    /// before, any key ended a permit taken without one).
    pub fn release_permit_keyed(&self, permit: i64, key: Option<&str>) -> Result<()> {
        self.end_permit(permit, "released", key)
    }

    /// [`Journal::confirm_cancelled`] showing the take's key (see
    /// [`Journal::release_permit_keyed`]).
    pub fn confirm_cancelled_keyed(&self, permit: i64, key: Option<&str>) -> Result<()> {
        self.end_permit(permit, "cancelled", key)
    }

    /// Extends a lease's TTL to at least `now + ttl`, for a run still working: returns its new
    /// expiry (milliseconds since the epoch; never earlier than before). Refused for a lease
    /// revoked, or already expired, whose ownership was reclaimed: the run reads the memory
    /// again and takes a new lease. One statement on the lease's row, which a freeze revoking
    /// it also writes: a renewal either commits before the revocation or sees it.
    pub fn renew_lease(
        &self,
        now: OffsetDateTime,
        lease: i64,
        ttl: std::time::Duration,
    ) -> Result<i64> {
        let now_ms = millis(now);
        let until = now_ms.saturating_add(ttl.as_millis() as i64);
        self.write(|tx| {
            let renewed = tx
                .row(
                    "UPDATE leases SET expires_ms = CASE WHEN expires_ms > $2 THEN expires_ms ELSE $2 END
                      WHERE lease_id = $1 AND revoked_by IS NULL AND expires_ms > $3
                      RETURNING expires_ms",
                    &[V::I(lease), V::I(until), V::I(now_ms)],
                )
                .map_err(db)?;
            if let Some(r) = renewed {
                return Ok(r[0].i().unwrap_or(until));
            }
            let r = tx
                .row(
                    "SELECT revoked_by FROM leases WHERE lease_id = $1",
                    &[V::I(lease)],
                )
                .map_err(db)?;
            Err(match r {
                None => GateError::NoSuchLease,
                Some(r) if r[0].t().is_some() => GateError::Revoked,
                Some(_) => GateError::Expired,
            }
            .into())
        })
    }

    /// Whether a lease was revoked. Runtimes poll this (the push stream comes with the HTTP gate).
    pub fn is_revoked(&self, lease: i64) -> Result<bool> {
        self.read(|tx| {
            let r = tx
                .row(
                    "SELECT revoked_by FROM leases WHERE lease_id = $1",
                    &[V::I(lease)],
                )
                .map_err(db)?;
            match r {
                Some(r) => Ok(r[0].t().is_some()),
                None => Err(GateError::NoSuchLease.into()),
            }
        })
    }

    /// Epochs, open fences and tombstones, as committed.
    pub fn gate_state(&self) -> Result<GateState> {
        self.read(|tx| {
            let epochs = tx
                .rows("SELECT tenant, subject, epoch FROM epochs", &[])
                .map_err(db)?
                .into_iter()
                .map(|r| (r[0].text(), r[1].text(), r[2].i().unwrap_or(0) as u64))
                .collect();
            let fences = tx
                .rows("SELECT job_id, tenant, subject FROM fences", &[])
                .map_err(db)?
                .into_iter()
                .map(|r| (r[0].text(), r[1].text(), r[2].text()))
                .collect();
            let tombstones = tx
                .rows(
                    "SELECT tenant, subject, memory_id, version FROM tombstones",
                    &[],
                )
                .map_err(db)?
                .into_iter()
                .map(|r| (r[0].text(), r[1].text(), r[2].text(), r[3].text()))
                .collect();
            Ok(GateState {
                epochs,
                fences,
                tombstones,
            })
        })
    }

    /// Deletes what the gate no longer needs, at most `limit` rows of each kind, and returns
    /// `(permits, leases)` deleted: the drain sets of completed jobs; ended permits that no
    /// open job's drain set names; leases past their TTL that hold no permit row. Without it the
    /// permit table grows by one row per boundary forever. Ids are never reused (identity /
    /// AUTOINCREMENT), so a runtime that still holds a swept id gets `no_such_permit` or
    /// `no_such_lease`, never someone else's.
    pub fn sweep_gate(&self, now: OffsetDateTime, limit: i64) -> Result<(u64, u64)> {
        let now = millis(now);
        self.write(|tx| {
            tx.exec(
                "DELETE FROM drain WHERE job_id IN (SELECT j.job_id FROM jobs j WHERE j.state = 'COMPLETE')",
                &[],
            )
            .map_err(db)?;
            let permits = tx
                .exec(
                    "DELETE FROM permits WHERE permit_id IN (
                       SELECT p.permit_id FROM permits p
                        WHERE p.state <> 'active'
                          AND NOT EXISTS (SELECT 1 FROM drain d WHERE d.permit_id = p.permit_id)
                        LIMIT $1)",
                    &[V::I(limit)],
                )
                .map_err(db)?;
            // A lease goes with its reads; it must hold no permit row (its permits went first).
            let gone = "SELECT l.lease_id FROM leases l
                         WHERE l.expires_ms < $1
                           AND NOT EXISTS (SELECT 1 FROM permits p WHERE p.lease_id = l.lease_id)
                         LIMIT $2";
            tx.exec(
                &format!("DELETE FROM lease_reads WHERE lease_id IN ({gone})"),
                &[V::I(now), V::I(limit)],
            )
            .map_err(db)?;
            let leases = tx
                .exec(
                    &format!(
                        "DELETE FROM leases WHERE lease_id IN ({gone})
                           AND NOT EXISTS (SELECT 1 FROM lease_reads r WHERE r.lease_id = leases.lease_id)"
                    ),
                    &[V::I(now), V::I(limit)],
                )
                .map_err(db)?;
            Ok((permits, leases))
        })
    }

    /// Which of these leases are revoked, or gone: never taken, or swept once expired (maybe
    /// revoked before). For the revocation stream, which reports either as revoked: the lease
    /// takes no permit, and a runtime that reconnects after the sweep still hears of it.
    pub fn revoked_among(&self, leases: &[i64]) -> Result<Vec<i64>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        // Bounded statements: SQLite allows 32,766 parameters, PostgreSQL 65,535.
        for chunk in leases.chunks(1000) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let params: Vec<V> = chunk.iter().map(|&id| V::I(id)).collect();
            let sql = format!(
                "SELECT lease_id FROM leases WHERE revoked_by IS NULL AND lease_id IN ({})",
                marks.join(", ")
            );
            let rows = self.read(|tx| tx.rows(&sql, &params).map_err(db))?;
            let live: std::collections::HashSet<i64> =
                rows.iter().filter_map(|r| r[0].i()).collect();
            out.extend(chunk.iter().filter(|id| !live.contains(id)));
        }
        Ok(out)
    }

    /// Closes the fence for a REQUESTED job, atomically with the `FenceClosed` entry.
    /// `version` is the memory version to tombstone (memory scope; resolved by the engine).
    pub fn freeze(&self, at: &str, job_id: &str, version: Option<&Version>) -> Result<Freeze> {
        // Not while another process's in-process gate is the authority: it would never hear
        // of this fence and keep admitting permits (SQLite: a shared lock held to the commit).
        let _outside = self.outside_gate_authority()?;
        let authority = self.holds_gate_authority();
        self.write(|tx| {
            if tx.is_postgres() && !authority {
                // The same on PostgreSQL, in the freeze's transaction: the gate authority's
                // session lock is exclusive, and waits for this one to commit before its gate
                // loads the fences.
                let free = tx
                    .row(
                        "SELECT CAST(pg_try_advisory_xact_lock_shared($1) AS TEXT)",
                        &[crate::PG_GATE_AUTHORITY.into()],
                    )
                    .map_err(db)?;
                if free.as_ref().and_then(|r| r.first()).and_then(V::t) != Some("true") {
                    return Err(crate::JournalError::GateAuthority);
                }
            }
            let job = load_job(tx, job_id)?;
            let t = job.scope.tenant().as_str().to_string();
            if tx.is_postgres() {
                // Exclusive on the scope: waits out every permit and lease transaction of the
                // scope in flight, and holds new ones until this commits (see schema.rs).
                let s = match &job.scope {
                    Scope::Tenant { .. } => "",
                    Scope::Subject { subject, .. } | Scope::Memory { subject, .. } => subject.as_str(),
                };
                tx.exec("SELECT CAST(lethe_gate_lock($1, $2, true) AS TEXT)", &[t.as_str().into(), s.into()])
                    .map_err(db)?;
            }
            // The leases the freeze affects, as a condition on `leases l` with $1 = tenant,
            // $2 = subject, $3 = memory, $4 = version.
            let (subject_epoch, tenant_epoch, affected, s, m, v) = match &job.scope {
                Scope::Subject { subject, .. } => {
                    let s = subject.as_str().to_string();
                    let e = bump(tx, &t, &s)?;
                    tx.exec("INSERT INTO fences (job_id, tenant, subject) VALUES ($1, $2, $3)", &[job_id.into(), t.as_str().into(), s.as_str().into()])
                        .map_err(db)?;
                    (Some(e), None, "l.tenant = $1 AND l.subject = $2", s, String::new(), String::new())
                }
                Scope::Tenant { .. } => {
                    let e = bump(tx, &t, "")?;
                    tx.exec("INSERT INTO fences (job_id, tenant, subject) VALUES ($1, $2, '')", &[job_id.into(), t.as_str().into()])
                        .map_err(db)?;
                    (None, Some(e), "l.tenant = $1", String::new(), String::new(), String::new())
                }
                Scope::Memory { subject, memory, .. } => {
                    let s = subject.as_str().to_string();
                    let v = version.map(|v| v.as_str().to_string()).unwrap_or_default();
                    tx.exec(
                        "INSERT INTO tombstones (tenant, subject, memory_id, version, job_id) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                        &[t.as_str().into(), s.as_str().into(), memory.as_str().into(), v.as_str().into(), job_id.into()],
                    )
                    .map_err(db)?;
                    let e = epoch_of(tx, &t, &s)?;
                    (
                        Some(e),
                        None,
                        "l.tenant = $1 AND l.subject = $2 AND EXISTS (SELECT 1 FROM lease_reads r
                           WHERE r.lease_id = l.lease_id AND r.memory_id = $3 AND r.version = $4)",
                        s,
                        memory.as_str().to_string(),
                        v,
                    )
                }
            };
            // Every statement binds all four, whichever the condition uses; an unused one is
            // referenced harmlessly so both dialects see every parameter.
            let bind = "CAST($1 AS TEXT) IS NOT NULL AND CAST($2 AS TEXT) IS NOT NULL AND CAST($3 AS TEXT) IS NOT NULL AND CAST($4 AS TEXT) IS NOT NULL";
            let params = [t.as_str().into(), s.as_str().into(), m.as_str().into(), v.as_str().into(), job_id.into()];
            let permits_to_drain = tx
                .exec(
                    &format!(
                        "INSERT INTO drain (job_id, permit_id)
                         SELECT $5, pm.permit_id FROM permits pm JOIN leases l ON l.lease_id = pm.lease_id
                          WHERE pm.state = 'active' AND {bind} AND {affected}
                         ON CONFLICT DO NOTHING"
                    ),
                    &params,
                )
                .map_err(db)?;
            let revoked_leases = tx
                .exec(&format!("UPDATE leases AS l SET revoked_by = $5 WHERE l.revoked_by IS NULL AND {bind} AND {affected}"), &params)
                .map_err(db)?;
            tx.exec(
                "UPDATE jobs SET subject_epoch = $2, tenant_epoch = $3, tombstone_version = $4 WHERE job_id = $1",
                &[job_id.into(), subject_epoch.into(), tenant_epoch.into(), version.map(|v| v.as_str()).into()],
            )
            .map_err(db)?;
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
        self.read(|tx| {
            Ok(tx
                .one(
                    "SELECT count(*) FROM drain d JOIN permits p ON p.permit_id = d.permit_id WHERE d.job_id = $1 AND p.state = 'active'",
                    &[job_id.into()],
                )
                .map_err(db)?
                .i()
                .unwrap_or(0) as u64)
        })
    }

    /// The current epochs of a subject: (subject epoch, tenant epoch).
    pub fn epochs(&self, tenant: &Tenant, subject: &Subject) -> Result<(u64, u64)> {
        self.read(|tx| {
            Ok((
                epoch_of(tx, tenant.as_str(), subject.as_str())?,
                epoch_of(tx, tenant.as_str(), "")?,
            ))
        })
    }
}
