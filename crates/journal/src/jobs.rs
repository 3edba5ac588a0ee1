//! Jobs: created once per open scope, moved only by journaled events.

use hmac::{Hmac, Mac};
use lethe_core::state::{transition, JobState};
use lethe_core::{BlockedReason, Scope};
use rusqlite::{params, OptionalExtension, Row, Transaction};
use sha2::{Digest, Sha256};

use crate::chain::append;
use crate::entry::Entry;
use crate::{sql, Journal, JournalError, Result};

/// A new job's request, as validated by the engine.
#[derive(Clone, Debug)]
pub struct NewJob {
    /// The id to give it.
    pub job_id: String,
    /// The scope.
    pub scope: Scope,
    /// Its keyed hash, `hmac:<hex>`.
    pub scope_hash: String,
    /// Legal basis.
    pub basis: lethe_core::Basis,
    /// Ticket reference.
    pub ticket: String,
    /// Policy version.
    pub policy_version: String,
    /// Deadline.
    pub deadline: time::Date,
    /// Reason for an extended deadline.
    pub extension_reason: Option<String>,
    /// Time of receipt, RFC 3339.
    pub requested_at: String,
}

/// A job as the projection holds it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JobRecord {
    /// The job id.
    pub job_id: String,
    /// Keyed hash of the scope.
    pub scope_hash: String,
    /// The scope (identifiers: never print or log it).
    #[serde(skip)]
    pub scope: Scope,
    /// Current state.
    pub state: JobState,
    /// Why it is blocked.
    pub blocked_reason: Option<BlockedReason>,
    /// Which target blocked it.
    pub blocked_target: Option<String>,
    /// Legal basis.
    pub basis: lethe_core::Basis,
    /// Policy version.
    pub policy_version: String,
    /// Deadline, `YYYY-MM-DD`.
    pub deadline: String,
    /// When the request was received.
    pub requested_at: String,
    /// When the job last changed.
    pub updated_at: String,
    /// Subject epoch after the freeze.
    pub subject_epoch: Option<u64>,
    /// Tenant epoch after the freeze.
    pub tenant_epoch: Option<u64>,
    /// The tombstoned version, for a memory scope.
    pub tombstone_version: Option<String>,
    /// The signed certificate, once complete.
    #[serde(skip)]
    pub certificate: Option<serde_json::Value>,
}

const JOB_COLUMNS: &str =
    "job_id, scope_hash, scope, state, blocked_reason, blocked_target, basis, \
     policy_version, deadline, requested_at, updated_at, subject_epoch, tenant_epoch, \
     tombstone_version, certificate";

fn job_from_row(r: &Row<'_>) -> rusqlite::Result<Result<JobRecord>> {
    let corrupt = |what: &str| JournalError::Corrupt(format!("job column {what}"));
    let scope: String = r.get(2)?;
    let state: String = r.get(3)?;
    let reason: Option<String> = r.get(4)?;
    let basis: String = r.get(6)?;
    let cert: Option<String> = r.get(14)?;
    Ok((|| {
        Ok(JobRecord {
            job_id: r.get(0).map_err(sql)?,
            scope_hash: r.get(1).map_err(sql)?,
            scope: serde_json::from_str(&scope).map_err(|_| corrupt("scope"))?,
            state: JobState::parse(&state).ok_or_else(|| corrupt("state"))?,
            blocked_reason: match reason {
                Some(s) => Some(
                    serde_json::from_value(serde_json::Value::String(s))
                        .map_err(|_| corrupt("blocked_reason"))?,
                ),
                None => None,
            },
            blocked_target: r.get(5).map_err(sql)?,
            basis: basis.parse().map_err(|_| corrupt("basis"))?,
            policy_version: r.get(7).map_err(sql)?,
            deadline: r.get(8).map_err(sql)?,
            requested_at: r.get(9).map_err(sql)?,
            updated_at: r.get(10).map_err(sql)?,
            subject_epoch: r.get::<_, Option<i64>>(11).map_err(sql)?.map(|v| v as u64),
            tenant_epoch: r.get::<_, Option<i64>>(12).map_err(sql)?.map(|v| v as u64),
            tombstone_version: r.get(13).map_err(sql)?,
            certificate: match cert {
                Some(c) => Some(serde_json::from_str(&c).map_err(|_| corrupt("certificate"))?),
                None => None,
            },
        })
    })())
}

pub(crate) fn load_job(tx: &rusqlite::Connection, job_id: &str) -> Result<JobRecord> {
    tx.query_row(
        &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?1"),
        [job_id],
        job_from_row,
    )
    .optional()
    .map_err(sql)?
    .ok_or_else(|| JournalError::NoSuchJob(job_id.to_string()))?
}

/// Applies a transition entry to the job row and appends it, inside `tx`.
pub(crate) fn apply(
    tx: &Transaction<'_>,
    at: &str,
    job_id: &str,
    entry: &Entry,
) -> Result<JobState> {
    let job = load_job(tx, job_id)?;
    let mut state = job.state;
    if let Some(ev) = entry.event() {
        state = transition(job.state, ev).map_err(|source| JournalError::Transition {
            job: job_id.to_string(),
            source,
        })?;
        let (reason, target) = match entry {
            Entry::Blocked { reason, target, .. } => (Some(reason.as_str()), target.as_deref()),
            _ => (None, None),
        };
        tx.execute(
            "UPDATE jobs SET state = ?2, blocked_reason = ?3, blocked_target = ?4, updated_at = ?5
             WHERE job_id = ?1",
            params![job_id, state.as_str(), reason, target, at],
        )
        .map_err(sql)?;
    }
    append(tx, at, Some(job_id), entry)?;
    Ok(state)
}

/// A frozen locator and the rows it accounts for.
pub type Locator = (String, u64);

/// A digest of an inventory's locators, keyed so that it cannot be used to test a guess.
pub fn inventory_digest(key: &[u8; 32], locators: &[(String, u64)]) -> String {
    let mut sorted: Vec<_> = locators.iter().collect();
    sorted.sort();
    let mut h = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for (loc, rows) in sorted {
        h.update(&(loc.len() as u64).to_be_bytes());
        h.update(loc.as_bytes());
        h.update(&rows.to_be_bytes());
    }
    format!("hmac:{}", hex::encode(h.finalize().into_bytes()))
}

impl Journal {
    /// Creates a job, unless a job for the same scope is still open: then returns that one and
    /// `false`. One transaction, so two operators asking at once get one job.
    pub fn create_job(&self, new: &NewJob) -> Result<(JobRecord, bool)> {
        self.write(|tx| {
            let open: Option<String> = tx
                .query_row(
                    "SELECT job_id FROM jobs WHERE scope_hash = ?1 AND state <> 'COMPLETE'
                     ORDER BY requested_at LIMIT 1",
                    [&new.scope_hash],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?;
            if let Some(id) = open {
                return Ok((load_job(tx, &id)?, false));
            }
            let scope = serde_json::to_string(&new.scope).map_err(|e| JournalError::Corrupt(e.to_string()))?;
            tx.execute(
                &format!(
                    "INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?1, ?2, ?3, 'REQUESTED', NULL, NULL, ?4, ?5, ?6, ?7, ?7, NULL, NULL, NULL, NULL)"
                ),
                params![
                    new.job_id,
                    new.scope_hash,
                    scope,
                    new.basis.as_str(),
                    new.policy_version,
                    new.deadline.to_string(),
                    new.requested_at
                ],
            )
            .map_err(sql)?;
            append(
                tx,
                &new.requested_at,
                Some(&new.job_id),
                &Entry::JobRequested {
                    scope: new.scope.clone(),
                    scope_hash: new.scope_hash.clone(),
                    basis: new.basis,
                    ticket: new.ticket.clone(),
                    policy_version: new.policy_version.clone(),
                    deadline: new.deadline.to_string(),
                    extension_reason: new.extension_reason.clone(),
                },
            )?;
            Ok((load_job(tx, &new.job_id)?, true))
        })
    }

    /// Records an entry for a job; a transition entry moves the job through
    /// [`lethe_core::state::transition`] in the same transaction.
    pub fn record(&self, at: &str, job_id: &str, entry: &Entry) -> Result<JobState> {
        self.write(|tx| apply(tx, at, job_id, entry))
    }

    /// One job.
    pub fn job(&self, job_id: &str) -> Result<JobRecord> {
        self.read(|c| load_job(c, job_id))
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<JobRecord>> {
        self.read(|c| {
            let mut stmt = c
                .prepare(&format!(
                    "SELECT {JOB_COLUMNS} FROM jobs ORDER BY requested_at, job_id"
                ))
                .map_err(sql)?;
            let rows = stmt.query_map([], job_from_row).map_err(sql)?;
            let mut out = Vec::new();
            for r in rows {
                out.push(r.map_err(sql)??);
            }
            Ok(out)
        })
    }

    /// Journals a target's frozen inventory and stores its locators, in one transaction.
    /// Idempotent: a second call for the same target keeps the first inventory.
    pub fn put_inventory(
        &self,
        at: &str,
        job_id: &str,
        target: &str,
        count: u64,
        locators: &[(String, u64)],
        digest_key: &[u8; 32],
    ) -> Result<()> {
        self.write(|tx| {
            let done: Option<i64> = tx
                .query_row(
                    "SELECT inventoried FROM target_progress WHERE job_id = ?1 AND target = ?2",
                    params![job_id, target],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?
                .flatten();
            if done.is_some() {
                return Ok(());
            }
            let mut ins = tx
                .prepare_cached(
                    "INSERT INTO inventory (job_id, target, locator, rows) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(sql)?;
            for (loc, rows) in locators {
                ins.execute(params![job_id, target, loc, *rows as i64])
                    .map_err(sql)?;
            }
            tx.execute(
                "INSERT INTO target_progress (job_id, target, inventoried) VALUES (?1, ?2, ?3)
                 ON CONFLICT (job_id, target) DO UPDATE SET inventoried = ?3",
                params![job_id, target, count as i64],
            )
            .map_err(sql)?;
            let entry = Entry::InventoryTaken {
                target: target.to_string(),
                count,
                locators: locators.len() as u64,
                digest: inventory_digest(digest_key, locators),
            };
            apply(tx, at, job_id, &entry)?;
            Ok(())
        })
    }

    /// Adds rows found in scope after a `residue` block to a target's inventory, and marks the
    /// target to be erased and verified again. A locator already frozen gets the new rows added
    /// to its allowance. One transaction, journaled as `InventoryExtended`.
    pub fn extend_inventory(
        &self,
        at: &str,
        job_id: &str,
        target: &str,
        locators: &[Locator],
        digest_key: &[u8; 32],
    ) -> Result<u64> {
        self.write(|tx| {
            let mut ins = tx
                .prepare_cached(
                    "INSERT INTO inventory (job_id, target, locator, rows) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (job_id, target, locator) DO UPDATE SET rows = rows + excluded.rows",
                )
                .map_err(sql)?;
            for (loc, rows) in locators {
                ins.execute(params![job_id, target, loc, *rows as i64]).map_err(sql)?;
            }
            let count: u64 = locators.iter().map(|(_, n)| n).sum();
            tx.execute(
                "UPDATE target_progress SET inventoried = inventoried + ?3, erased = NULL, residue = NULL
                 WHERE job_id = ?1 AND target = ?2",
                params![job_id, target, count as i64],
            )
            .map_err(sql)?;
            let entry = Entry::InventoryExtended {
                target: target.to_string(),
                count,
                locators: locators.len() as u64,
                digest: inventory_digest(digest_key, locators),
            };
            apply(tx, at, job_id, &entry)?;
            Ok(count)
        })
    }

    /// A target's frozen inventory: its count and its locators, if taken.
    pub fn inventory(&self, job_id: &str, target: &str) -> Result<Option<(u64, Vec<Locator>)>> {
        self.read(|c| {
            let count: Option<i64> = c
                .query_row(
                    "SELECT inventoried FROM target_progress WHERE job_id = ?1 AND target = ?2",
                    params![job_id, target],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?
                .flatten();
            let Some(count) = count else { return Ok(None) };
            let mut stmt = c
                .prepare("SELECT locator, rows FROM inventory WHERE job_id = ?1 AND target = ?2 ORDER BY locator")
                .map_err(sql)?;
            let locs = stmt
                .query_map(params![job_id, target], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
                .map_err(sql)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(sql)?;
            Ok(Some((count as u64, locs)))
        })
    }

    /// Marks a target erased (or verified, with its residue).
    pub fn set_progress(
        &self,
        job_id: &str,
        target: &str,
        erased: Option<u64>,
        residue: Option<u64>,
    ) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO target_progress (job_id, target, erased, residue) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (job_id, target) DO UPDATE SET
                   erased = coalesce(?3, erased), residue = coalesce(?4, residue)",
                params![job_id, target, erased.map(|v| v as i64), residue.map(|v| v as i64)],
            )
            .map_err(sql)?;
            Ok(())
        })
    }

    /// A target's progress: (inventoried count, erased, residue).
    pub fn progress(
        &self,
        job_id: &str,
        target: &str,
    ) -> Result<(Option<u64>, Option<u64>, Option<u64>)> {
        self.read(|c| {
            c.query_row(
                "SELECT inventoried, erased, residue FROM target_progress WHERE job_id = ?1 AND target = ?2",
                params![job_id, target],
                |r| {
                    let g = |i| r.get::<_, Option<i64>>(i).map(|v| v.map(|v| v as u64));
                    Ok((g(0)?, g(1)?, g(2)?))
                },
            )
            .optional()
            .map_err(sql)
            .map(|o| o.unwrap_or((None, None, None)))
        })
    }

    /// Completes a job: journals `VerifiedClean` and `Completed`, stores the certificate,
    /// opens the job's fence and drops its inventory locators, all in one transaction.
    pub fn complete(&self, at: &str, job_id: &str, certificate: &serde_json::Value) -> Result<()> {
        self.write(|tx| {
            apply(tx, at, job_id, &Entry::VerifiedClean)?;
            let canonical = lethe_core::certificate::canonical_json(certificate);
            let digest = hex::encode(Sha256::digest(canonical.as_bytes()));
            tx.execute(
                "UPDATE jobs SET certificate = ?2 WHERE job_id = ?1",
                params![job_id, certificate.to_string()],
            )
            .map_err(sql)?;
            tx.execute("DELETE FROM fences WHERE job_id = ?1", [job_id])
                .map_err(sql)?;
            tx.execute("DELETE FROM inventory WHERE job_id = ?1", [job_id])
                .map_err(sql)?;
            apply(
                tx,
                at,
                job_id,
                &Entry::Completed {
                    certificate_sha256: digest,
                },
            )?;
            Ok(())
        })
    }
}
