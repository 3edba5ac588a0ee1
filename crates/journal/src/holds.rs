//! Legal holds: a hold on a tenant, or on one subject of a tenant, keeps every job over it in
//! REQUESTED, touching nothing, until it is released.

use lethe_core::{Subject, Tenant};

use crate::chain::{append, db};
use crate::entry::Entry;
use crate::{Journal, Result};

/// A legal hold.
#[derive(Clone, serde::Serialize)]
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

/// Without the held identifiers or the reason: a `{:?}` in a log line must not print them.
impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("hold_id", &self.hold_id)
            .field("whole_tenant", &self.subject.is_none())
            .field("created_at", &self.created_at)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Places a hold.
    pub fn add_hold(
        &self,
        at: &str,
        hold_id: &str,
        tenant: &Tenant,
        subject: Option<&Subject>,
        reason: Option<&str>,
        scope_hash: &str,
    ) -> Result<()> {
        self.write_entry(|tx| {
            tx.exec(
                "INSERT INTO holds (hold_id, tenant, subject, reason, created_at) VALUES ($1, $2, $3, $4, $5)",
                &[hold_id.into(), tenant.as_str().into(), subject.map(|s| s.as_str()).into(), reason.into(), at.into()],
            )
            .map_err(db)?;
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
        self.write_entry(|tx| {
            let ids: Vec<String> = tx
                .rows(
                    "UPDATE holds SET released_at = $3 WHERE released_at IS NULL AND tenant = $1
                       AND subject IS NOT DISTINCT FROM CAST($2 AS TEXT) RETURNING hold_id",
                    &[
                        tenant.as_str().into(),
                        subject.map(|s| s.as_str()).into(),
                        at.into(),
                    ],
                )
                .map_err(db)?
                .into_iter()
                .map(|r| r[0].text())
                .collect();
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
        self.read(|tx| {
            Ok(tx
                .rows("SELECT hold_id, tenant, subject, reason, created_at FROM holds WHERE released_at IS NULL ORDER BY created_at, hold_id", &[])
                .map_err(db)?
                .into_iter()
                .map(|r| Hold {
                    hold_id: r[0].text(),
                    tenant: r[1].text(),
                    subject: r[2].t().map(str::to_owned),
                    reason: r[3].t().map(str::to_owned),
                    created_at: r[4].text(),
                })
                .collect())
        })
    }

    /// Active holds that cover a scope: on its tenant, or on its subject. A tenant scope is also
    /// held by a hold on any one of its subjects.
    pub fn holds_covering(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
    ) -> Result<Vec<String>> {
        self.read(|tx| {
            Ok(tx
                .rows(
                    "SELECT hold_id FROM holds WHERE released_at IS NULL AND tenant = $1
                       AND (subject IS NULL OR CAST($2 AS TEXT) IS NULL OR subject = CAST($2 AS TEXT)) ORDER BY hold_id",
                    &[tenant.as_str().into(), subject.map(|s| s.as_str()).into()],
                )
                .map_err(db)?
                .into_iter()
                .map(|r| r[0].text())
                .collect())
        })
    }

    /// Holds covering a scope that the hold table says are released while the chain holds no
    /// release of them: the table was edited apart from the chain (review: such a hold let its
    /// job run). One look at the chain per released covering hold.
    pub fn holds_released_outside_the_chain(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
    ) -> Result<Vec<String>> {
        self.read(|tx| {
            let released: Vec<String> = tx
                .rows(
                    "SELECT hold_id FROM holds WHERE released_at IS NOT NULL AND tenant = $1
                       AND (subject IS NULL OR CAST($2 AS TEXT) IS NULL OR subject = CAST($2 AS TEXT)) ORDER BY hold_id",
                    &[tenant.as_str().into(), subject.map(|s| s.as_str()).into()],
                )
                .map_err(db)?
                .into_iter()
                .map(|r| r[0].text())
                .collect();
            let mut out = Vec::new();
            for hold_id in released {
                let body = serde_json::to_string(&Entry::HoldReleased {
                    hold_id: hold_id.clone(),
                })
                .map_err(|e| crate::JournalError::Corrupt(crate::chain::unreadable(&e)))?;
                let n = tx
                    .one(
                        "SELECT count(*) FROM journal WHERE kind = 'hold_released' AND job_id IS NULL AND body = $1",
                        &[body.into()],
                    )
                    .map_err(db)?
                    .i()
                    .unwrap_or(0);
                if n == 0 {
                    out.push(hold_id);
                }
            }
            Ok(out)
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
