//! Legal holds: a hold on a tenant, or on one subject of a tenant, keeps every job over it in
//! REQUESTED, touching nothing, until it is released.

use lethe_core::{Subject, Tenant};
use rusqlite::params;

use crate::chain::append;
use crate::entry::Entry;
use crate::{sql, Journal, Result};

/// A legal hold.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Hold {
    /// Its id.
    pub hold_id: String,
    /// The held tenant (an identifier: printed to the operator, never logged).
    pub tenant: String,
    /// The held subject, or none for the whole tenant.
    pub subject: Option<String>,
    /// Why, as the operator wrote it.
    pub reason: Option<String>,
    /// When it was placed.
    pub created_at: String,
}

impl Journal {
    /// Places a hold. Returns its id.
    pub fn add_hold(
        &self,
        at: &str,
        hold_id: &str,
        tenant: &Tenant,
        subject: Option<&Subject>,
        reason: Option<&str>,
        scope_hash: &str,
    ) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO holds (hold_id, tenant, subject, reason, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![hold_id, tenant.as_str(), subject.map(|s| s.as_str()), reason, at],
            )
            .map_err(sql)?;
            append(tx, at, None, &Entry::HoldAdded { hold_id: hold_id.into(), scope_hash: scope_hash.into() })?;
            Ok(())
        })
    }

    /// Releases every active hold on exactly this tenant (and subject). Returns the ids released.
    pub fn release_holds(
        &self,
        at: &str,
        tenant: &Tenant,
        subject: Option<&Subject>,
    ) -> Result<Vec<String>> {
        self.write(|tx| {
            let mut stmt = tx
                .prepare(
                    "UPDATE holds SET released_at = ?3 WHERE released_at IS NULL AND tenant = ?1
                       AND subject IS ?2 RETURNING hold_id",
                )
                .map_err(sql)?;
            let ids: Vec<String> = stmt
                .query_map(
                    params![tenant.as_str(), subject.map(|s| s.as_str()), at],
                    |r| r.get(0),
                )
                .map_err(sql)?
                .collect::<rusqlite::Result<_>>()
                .map_err(sql)?;
            for id in &ids {
                append(
                    tx,
                    at,
                    None,
                    &Entry::HoldReleased {
                        hold_id: id.clone(),
                    },
                )?;
            }
            Ok(ids)
        })
    }

    /// Active holds, oldest first.
    pub fn holds(&self) -> Result<Vec<Hold>> {
        self.read(|c| {
            let mut stmt = c
                .prepare(
                    "SELECT hold_id, tenant, subject, reason, created_at FROM holds
                      WHERE released_at IS NULL ORDER BY created_at, hold_id",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(Hold {
                        hold_id: r.get(0)?,
                        tenant: r.get(1)?,
                        subject: r.get(2)?,
                        reason: r.get(3)?,
                        created_at: r.get(4)?,
                    })
                })
                .map_err(sql)?
                .collect::<rusqlite::Result<_>>()
                .map_err(sql)?;
            Ok(rows)
        })
    }

    /// Active holds that cover a scope: on its tenant, or on its subject. A tenant scope is also
    /// held by a hold on any one of its subjects.
    pub fn holds_covering(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
    ) -> Result<Vec<String>> {
        self.read(|c| {
            let mut stmt = c
                .prepare(
                    "SELECT hold_id FROM holds WHERE released_at IS NULL AND tenant = ?1
                       AND (subject IS NULL OR ?2 IS NULL OR subject = ?2) ORDER BY hold_id",
                )
                .map_err(sql)?;
            let ids = stmt
                .query_map(params![tenant.as_str(), subject.map(|s| s.as_str())], |r| {
                    r.get(0)
                })
                .map_err(sql)?
                .collect::<rusqlite::Result<_>>()
                .map_err(sql)?;
            Ok(ids)
        })
    }

    /// Journals that a hold refused a job (the job stays REQUESTED).
    pub fn record_hold_refusal(&self, at: &str, job_id: &str, hold_ids: &[String]) -> Result<()> {
        self.record(
            at,
            job_id,
            &Entry::HoldRefused {
                hold_ids: hold_ids.to_vec(),
            },
        )
        .map(|_| ())
    }
}
