//! Lineage: the edges a runtime records from an artifact it derived (a summary, a cache entry)
//! to the memories it came from, so that an erasure of those memories reaches the artifact.
//! One table (`lineage`), one row per memory the artifact came from (`memory_id = ''`: the
//! subject's memory as a whole; `version = ''`: any version). Identifiers and locators stay in
//! the table, as a job's frozen locators do in `inventory`: never in the chain or a log line.
//!
//! An edge is refused ([`lethe_core::gate::GateError::Fenced`]) while an erasure of its subject
//! or tenant has its fence closed, checked in the insert's own write transaction, which the
//! freeze's serializes with: an artifact written after the freeze is refused like any write.

use std::collections::BTreeSet;

use lethe_core::gate::GateError;
use lethe_core::{MemoryId, Scope, Subject, Tenant, Version};

use crate::chain::db;
use crate::db::V;
use crate::{Journal, Result};

/// One memory an artifact came from; `None` for the version: any version of it.
pub type Source = (MemoryId, Option<Version>);

/// An artifact another came from: its target and locator (a summary of a summary).
pub type Artifact = (String, String);

/// How deep a chain of artifacts derived from artifacts is followed.
const MAX_DEPTH: usize = 64;

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
        from_artifacts: &[Artifact],
    ) -> Result<()> {
        let (t, s) = (tenant.as_str(), subject.as_str());
        let rows: Vec<(&str, &str)> = if from.is_empty() && from_artifacts.is_empty() {
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
            for (ft, fl) in from_artifacts {
                tx.exec(
                    "INSERT INTO lineage_links (tenant, subject, target, locator, from_target, \
                     from_locator) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    &[
                        t.into(),
                        s.into(),
                        target.into(),
                        locator.into(),
                        ft.as_str().into(),
                        fl.as_str().into(),
                    ],
                )
                .map_err(db)?;
            }
            Ok(())
        })
    }

    /// The locators recorded for `target` that `scope` reaches, distinct and sorted: from the
    /// edges the scope names (a subject's every edge, and its links; a memory's edges that name
    /// it and its version, where both the edge and the scope give one; a tenant's every edge),
    /// then every artifact derived from one reached, transitively (up to 64 links deep).
    pub fn lineage_locators(&self, scope: &Scope, target: &str) -> Result<Vec<String>> {
        Ok(self
            .read(|tx| reached(tx, scope))?
            .into_iter()
            .filter(|(t, _)| t == target)
            .map(|(_, l)| l)
            .collect())
    }

    /// Every locator recorded for `target`, whoever's: what a derived store counts as owned.
    pub fn lineage_target_locators(&self, target: &str) -> Result<Vec<String>> {
        self.read(|tx| {
            Ok(tx
                .rows(
                    "SELECT locator FROM lineage WHERE target = $1 \
                     UNION SELECT locator FROM lineage_links WHERE target = $1",
                    &[target.into()],
                )
                .map_err(db)?
                .iter()
                .map(|r| r[0].text())
                .collect())
        })
    }

    /// Drops the edges and links of every artifact `scope` reaches, after a job erased them:
    /// what they name is gone, and their identifiers need not stay. Returns edges dropped.
    pub fn drop_lineage(&self, scope: &Scope) -> Result<u64> {
        // Most jobs reach no edge: a read, and no write transaction on their path.
        if self.read(|tx| reached(tx, scope))?.is_empty() {
            return Ok(0);
        }
        self.write(|tx| {
            let t = scope.tenant().as_str();
            let mut n = 0;
            for (target, locator) in reached(tx, scope)? {
                n += tx
                    .exec(
                        "DELETE FROM lineage WHERE tenant = $1 AND target = $2 AND locator = $3",
                        &[t.into(), target.as_str().into(), locator.as_str().into()],
                    )
                    .map_err(db)?;
                n += tx
                    .exec(
                        "DELETE FROM lineage_links WHERE tenant = $1 AND ((target = $2 AND \
                         locator = $3) OR (from_target = $2 AND from_locator = $3))",
                        &[t.into(), target.as_str().into(), locator.as_str().into()],
                    )
                    .map_err(db)?;
            }
            Ok(n)
        })
    }
}

/// Every artifact `scope` reaches, as (target, locator), sorted.
fn reached(tx: &mut dyn crate::db::Tx, scope: &Scope) -> Result<BTreeSet<(String, String)>> {
    let t = scope.tenant().as_str();
    let (edges, links): (&str, Option<&str>) = match scope {
        Scope::Tenant { .. } => (
            "SELECT DISTINCT target, locator FROM lineage WHERE tenant = $1",
            Some("SELECT DISTINCT target, locator FROM lineage_links WHERE tenant = $1"),
        ),
        Scope::Subject { .. } => (
            "SELECT DISTINCT target, locator FROM lineage WHERE tenant = $1 AND subject = $2",
            Some(
                "SELECT DISTINCT target, locator FROM lineage_links WHERE tenant = $1 \
                 AND subject = $2",
            ),
        ),
        Scope::Memory { .. } => (
            "SELECT DISTINCT target, locator FROM lineage WHERE tenant = $1 AND subject = $2 \
             AND memory_id = $3 AND ($4 = '' OR version = '' OR version = $4)",
            None,
        ),
    };
    let params: Vec<V> = match scope {
        Scope::Tenant { .. } => vec![t.into()],
        Scope::Subject { subject, .. } => vec![t.into(), subject.as_str().into()],
        Scope::Memory {
            subject,
            memory,
            version,
            ..
        } => vec![
            t.into(),
            subject.as_str().into(),
            memory.as_str().into(),
            version.as_ref().map_or("", Version::as_str).into(),
        ],
    };
    let pair = |r: &Vec<V>| (r[0].text(), r[1].text());
    let mut out: BTreeSet<(String, String)> = tx
        .rows(edges, &params)
        .map_err(db)?
        .iter()
        .map(pair)
        .collect();
    if let Some(links) = links {
        out.extend(
            tx.rows(links, &params[..2.min(params.len())])
                .map_err(db)?
                .iter()
                .map(pair),
        );
    }
    // Artifacts derived from those, level by level.
    let mut frontier: Vec<(String, String)> = out.iter().cloned().collect();
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for (ft, fl) in &frontier {
            for r in tx
                .rows(
                    "SELECT target, locator FROM lineage_links WHERE tenant = $1 \
                     AND from_target = $2 AND from_locator = $3",
                    &[t.into(), ft.as_str().into(), fl.as_str().into()],
                )
                .map_err(db)?
                .iter()
            {
                let p = pair(r);
                if out.insert(p.clone()) {
                    next.push(p);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    Ok(out)
}
