//! Lineage: the edges a runtime records from an artifact it derived (a summary, a cache entry)
//! to the memories it came from, so that an erasure of those memories reaches the artifact.
//! One table (`lineage`), one row per memory the artifact came from (`memory_id = ''`: the
//! subject's memory as a whole; `version = ''`: any version). Identifiers and locators stay in
//! the table, as a job's frozen locators do in `inventory`: never in the chain or a log line.
//!
//! An edge is refused ([`lethe_core::gate::GateError::Fenced`]) while an erasure of its subject
//! or tenant has its fence closed, checked in the insert's own write transaction, which the
//! freeze's serializes with: an artifact written after the freeze is refused like any write.

use lethe_core::gate::GateError;
use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};

use crate::chain::db;
use crate::db::V;
use crate::{Journal, Result};

/// One memory an artifact came from; `None` for the version: any version of it.
pub type Source = (MemoryId, Option<Version>);

impl Journal {
    /// Records that the artifact `locator` in `target` was derived from `from` (empty: from the
    /// subject's memory as a whole). Idempotent. Refused, storing nothing, while the subject's
    /// or the tenant's fence is closed.
    pub fn record_lineage(
        &self,
        tenant: &Tenant,
        subject: &Subject,
        target: &str,
        locator: &str,
        from: &[Source],
    ) -> Result<()> {
        let (t, s) = (tenant.as_str(), subject.as_str());
        let rows: Vec<(&str, &str)> = if from.is_empty() {
            vec![("", "")]
        } else {
            from.iter()
                .map(|(m, v)| (m.as_str(), v.as_ref().map_or("", Version::as_str)))
                .collect()
        };
        self.write(|tx| {
            if crate::gate::is_fenced(tx, t, s)? {
                return Err(GateError::Fenced.into());
            }
            for (m, v) in &rows {
                tx.exec(
                    "INSERT INTO lineage (tenant, subject, target, locator, memory_id, version) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    &[
                        t.into(),
                        s.into(),
                        target.into(),
                        locator.into(),
                        (*m).into(),
                        (*v).into(),
                    ],
                )
                .map_err(db)?;
            }
            Ok(())
        })
    }

    /// The locators recorded for `target` that `scope` reaches, distinct and sorted: a
    /// subject's every edge; a memory's edges that name it (and its version, where both the
    /// edge and the scope give one); a tenant's every edge.
    pub fn lineage_locators(&self, scope: &Scope, target: &str) -> Result<Vec<String>> {
        let t = scope.tenant().as_str();
        let (sql, params): (&str, Vec<V>) = match scope {
            Scope::Tenant { .. } => (
                "SELECT DISTINCT locator FROM lineage WHERE tenant = $1 AND target = $2 \
                 ORDER BY locator",
                vec![t.into(), target.into()],
            ),
            Scope::Subject { subject, .. } => (
                "SELECT DISTINCT locator FROM lineage WHERE tenant = $1 AND target = $2 \
                 AND subject = $3 ORDER BY locator",
                vec![t.into(), target.into(), subject.as_str().into()],
            ),
            Scope::Memory {
                subject,
                memory,
                version,
                ..
            } => (
                "SELECT DISTINCT locator FROM lineage WHERE tenant = $1 AND target = $2 \
                 AND subject = $3 AND memory_id = $4 AND ($5 = '' OR version = '' OR version = $5) \
                 ORDER BY locator",
                vec![
                    t.into(),
                    target.into(),
                    subject.as_str().into(),
                    memory.as_str().into(),
                    version.as_ref().map_or("", Version::as_str).into(),
                ],
            ),
        };
        self.read(|tx| {
            Ok(tx
                .rows(sql, &params)
                .map_err(db)?
                .iter()
                .map(|r| r[0].text())
                .collect())
        })
    }
}
