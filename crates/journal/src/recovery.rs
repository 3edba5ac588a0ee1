//! Recoveries: replays of every completed erasure into a target restored from a backup. While
//! one runs, the gate's fences keep each replayed scope closed (leases and permits refused
//! `fenced`), in the fences table the freeze uses, so every gate (SQLite, PostgreSQL, `lethe
//! serve`) refuses them without knowing of recoveries.

use sha2::{Digest, Sha256};

use crate::chain::{append, db};
use crate::db::V;
use crate::{Entry, Journal, JournalError, Result};

/// A scope a recovery fences: its tenant, and its subject (`None`: the whole tenant).
pub type Fenced<'a> = (&'a str, Option<&'a str>);

/// One recovery, as the table holds it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecoveryRecord {
    /// Its id.
    pub recovery_id: String,
    /// The restored target.
    pub target: String,
    /// The backup's time, if given.
    pub since: Option<String>,
    /// `RUNNING` (fences closed) or `VERIFIED`.
    pub state: String,
    /// When it began.
    pub started_at: String,
    /// When it verified.
    pub finished_at: Option<String>,
    /// The signed report, once verified.
    pub report: Option<serde_json::Value>,
}

impl Journal {
    /// Starts a recovery of `target`, or returns the one still RUNNING for it (a run killed
    /// before it verified: its fences are still closed). For a new one, in one transaction:
    /// the row, a fence per scope, and `recovery_started`. Returns its id and whether it was
    /// already running.
    pub fn start_recovery(
        &self,
        at: &str,
        recovery_id: &str,
        target: &str,
        since: Option<&str>,
        scopes: &[Fenced<'_>],
    ) -> Result<(String, bool)> {
        // As a freeze: not while another process's in-process gate is the authority, which
        // would never hear of these fences (its own process's erasures go through it).
        let _outside = self.outside_gate_authority()?;
        let authority = self.holds_gate_authority();
        self.write_entry(|tx| {
            if tx.is_postgres() && !authority {
                let free = tx
                    .row(
                        "SELECT CAST(pg_try_advisory_xact_lock_shared($1) AS TEXT)",
                        &[crate::PG_GATE_AUTHORITY.into()],
                    )
                    .map_err(db)?;
                if free.as_ref().and_then(|r| r.first()).and_then(V::t) != Some("true") {
                    return Err(JournalError::GateAuthority);
                }
            }
            if let Some(r) = tx
                .row(
                    "SELECT recovery_id FROM recoveries WHERE target = $1 AND state = 'RUNNING'",
                    &[target.into()],
                )
                .map_err(db)?
            {
                return Ok((r[0].text(), true));
            }
            tx.exec(
                "INSERT INTO recoveries (recovery_id, target, since, state, started_at) \
                 VALUES ($1, $2, $3, 'RUNNING', $4)",
                &[recovery_id.into(), target.into(), since.into(), at.into()],
            )
            .map_err(db)?;
            for (n, (tenant, subject)) in scopes.iter().enumerate() {
                tx.exec(
                    "INSERT INTO fences (job_id, tenant, subject) VALUES ($1, $2, $3)",
                    &[
                        format!("{recovery_id}:{n}").into(),
                        (*tenant).into(),
                        subject.unwrap_or("").into(),
                    ],
                )
                .map_err(db)?;
            }
            append(
                tx,
                at,
                None,
                &Entry::RecoveryStarted {
                    recovery_id: recovery_id.to_string(),
                    target: target.to_string(),
                    since: since.map(str::to_owned),
                    scopes: scopes.len() as u64,
                },
            )?;
            Ok((recovery_id.to_string(), false))
        })
    }

    /// Records a RUNNING recovery verified: its report, `recovery_verified`, and its fences
    /// opened, in one transaction.
    pub fn finish_recovery(
        &self,
        at: &str,
        recovery_id: &str,
        scopes: u64,
        erased: u64,
        report: &serde_json::Value,
    ) -> Result<()> {
        self.write_entry(|tx| {
            let canonical = lethe_core::certificate::canonical_json(report);
            let digest = hex::encode(Sha256::digest(canonical.as_bytes()));
            let n = tx
                .exec(
                    "UPDATE recoveries SET state = 'VERIFIED', finished_at = $2, report = $3 \
                     WHERE recovery_id = $1 AND state = 'RUNNING'",
                    &[recovery_id.into(), at.into(), report.to_string().into()],
                )
                .map_err(db)?;
            if n != 1 {
                return Err(JournalError::Corrupt(format!(
                    "recovery {recovery_id} is not running"
                )));
            }
            tx.exec(
                "DELETE FROM fences WHERE substr(job_id, 1, length($1) + 1) = $1 || ':'",
                &[recovery_id.into()],
            )
            .map_err(db)?;
            append(
                tx,
                at,
                None,
                &Entry::RecoveryVerified {
                    recovery_id: recovery_id.to_string(),
                    scopes,
                    erased,
                    report_sha256: digest,
                },
            )?;
            Ok(())
        })
    }

    /// Every recovery, oldest first.
    pub fn recoveries(&self) -> Result<Vec<RecoveryRecord>> {
        self.read(|tx| {
            let rows = tx
                .rows(
                    "SELECT recovery_id, target, since, state, started_at, finished_at, report \
                     FROM recoveries ORDER BY started_at, recovery_id",
                    &[],
                )
                .map_err(db)?;
            Ok(rows
                .iter()
                .map(|r| RecoveryRecord {
                    recovery_id: r[0].text(),
                    target: r[1].text(),
                    since: r[2].t().map(str::to_owned),
                    state: r[3].text(),
                    started_at: r[4].text(),
                    finished_at: r[5].t().map(str::to_owned),
                    report: r[6].t().and_then(|t| serde_json::from_str(t).ok()),
                })
                .collect())
        })
    }
}
