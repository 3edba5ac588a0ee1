//! The store adapter itself.

use std::collections::BTreeMap;
use std::path::PathBuf;

use lethe_core::{Scope, Version};
use rusqlite::{params, Connection, OptionalExtension};

use crate::sqlite::{db, has_table, open};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory};

/// One label of a namespace template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Label {
    Tenant,
    Subject,
    Literal(String),
}

/// A `langgraph-sqlite-store` target.
#[derive(Debug)]
pub struct Store {
    name: String,
    path: PathBuf,
    template: Vec<Label>,
}

/// The rows a scope names, as SQL parameters.
enum Selection {
    /// Every item whose prefix is `ns` or starts with `ns.`.
    Namespace { ns: String },
    /// One item, at one version (`None`: whatever version is current).
    Item {
        ns: String,
        key: String,
        version: Option<String>,
    },
}

/// Rows in scope: `prefix = ?1 OR prefix in ['?1.', '?1/')`. `.` is 0x2E and `/` is 0x2F, so
/// the half-open range holds exactly the strings that start with `ns.` (byte order: SQLite's
/// default BINARY collation compares UTF-8 with memcmp).
const IN_NAMESPACE: &str = "(prefix = ?1 OR (prefix >= ?1 || '.' AND prefix < ?1 || '/'))";

impl Store {
    pub(crate) fn new(name: &str, path: PathBuf, template: Vec<Label>) -> Self {
        Self {
            name: name.to_string(),
            path,
            template,
        }
    }

    fn err(&self, e: rusqlite::Error) -> AdapterError {
        db(&self.name, e)
    }

    fn inexpressible(&self, why: &str) -> AdapterError {
        AdapterError::Inexpressible {
            target: self.name.clone(),
            why: why.to_string(),
        }
    }

    fn label(&self, id: &str, what: &str) -> Result<String, AdapterError> {
        if id.contains('.') {
            return Err(self.inexpressible(&format!(
                "the {what} contains '.', which LangGraph uses to join namespace labels, so it cannot be one label"
            )));
        }
        Ok(id.to_string())
    }

    fn selection(&self, scope: &Scope) -> Result<Selection, AdapterError> {
        let (tenant, subject) = (scope.tenant().as_str(), scope.subject().map(|s| s.as_str()));
        let mut labels = Vec::new();
        for l in &self.template {
            match l {
                Label::Tenant => labels.push(self.label(tenant, "tenant")?),
                Label::Subject => match subject {
                    Some(s) => labels.push(self.label(s, "subject")?),
                    // A tenant scope is the template up to the subject's label.
                    None => break,
                },
                Label::Literal(s) => labels.push(s.clone()),
            }
        }
        let mut ns = labels.join(".");
        Ok(match scope {
            Scope::Memory {
                memory, version, ..
            } => {
                let mut parts: Vec<&str> = memory.as_str().split('/').collect();
                let key = parts.pop().unwrap_or_default().to_string();
                if key.is_empty() || parts.iter().any(|p| p.is_empty()) {
                    return Err(self.inexpressible(
                        "the memory id must be `label/.../key` with no empty part",
                    ));
                }
                for p in parts {
                    ns.push('.');
                    ns.push_str(&self.label(p, "memory id's namespace label")?);
                }
                Selection::Item {
                    ns,
                    key,
                    version: version.as_ref().map(|v| v.as_str().to_string()),
                }
            }
            _ => Selection::Namespace { ns },
        })
    }

    fn has_vectors(&self, conn: &Connection) -> Result<bool, AdapterError> {
        has_table(conn, "store_vectors").map_err(|e| self.err(e))
    }

    /// (prefix, key) -> rows, for everything the selection names, hidden rows included.
    fn rows(
        &self,
        conn: &Connection,
        sel: &Selection,
    ) -> Result<BTreeMap<(String, String), u64>, AdapterError> {
        let mut out = BTreeMap::new();
        let vectors = self.has_vectors(conn)?;
        match sel {
            Selection::Namespace { ns } => {
                // No `expires_at` condition: rows past their TTL are still on disk.
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT prefix, key FROM store WHERE {IN_NAMESPACE}"
                    ))
                    .map_err(|e| self.err(e))?;
                let mut rows = stmt.query([ns]).map_err(|e| self.err(e))?;
                while let Some(r) = rows.next().map_err(|e| self.err(e))? {
                    *out.entry((
                        r.get(0).map_err(|e| self.err(e))?,
                        r.get(1).map_err(|e| self.err(e))?,
                    ))
                    .or_insert(0) += 1;
                }
                if vectors {
                    // Vectors are counted on their own: an item deleted by LangGraph leaves its
                    // vectors behind, and those are residue too.
                    let mut stmt = conn
                        .prepare_cached(&format!(
                            "SELECT prefix, key, count(*) FROM store_vectors WHERE {IN_NAMESPACE} GROUP BY prefix, key"
                        ))
                        .map_err(|e| self.err(e))?;
                    let mut rows = stmt.query([ns]).map_err(|e| self.err(e))?;
                    while let Some(r) = rows.next().map_err(|e| self.err(e))? {
                        let k = (
                            r.get(0).map_err(|e| self.err(e))?,
                            r.get(1).map_err(|e| self.err(e))?,
                        );
                        *out.entry(k).or_insert(0) +=
                            r.get::<_, i64>(2).map_err(|e| self.err(e))? as u64;
                    }
                }
            }
            Selection::Item { ns, key, version } => {
                let current: Option<String> = conn
                    .query_row(
                        "SELECT CAST(updated_at AS TEXT) FROM store WHERE prefix = ?1 AND key = ?2",
                        params![ns, key],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(|e| self.err(e))?;
                // The item at another version is another memory version: not in scope, nor are
                // its vectors.
                let at_version = match (&current, version) {
                    (Some(cur), Some(v)) => cur == v,
                    _ => true,
                };
                if !at_version {
                    return Ok(out);
                }
                let mut n = u64::from(current.is_some());
                if vectors {
                    n += conn
                        .query_row(
                            "SELECT count(*) FROM store_vectors WHERE prefix = ?1 AND key = ?2",
                            params![ns, key],
                            |r| r.get::<_, i64>(0),
                        )
                        .map_err(|e| self.err(e))? as u64;
                }
                if n > 0 {
                    out.insert((ns.clone(), key.clone()), n);
                }
            }
        }
        Ok(out)
    }

    fn in_selection(sel: &Selection, prefix: &str, key: &str) -> bool {
        match sel {
            Selection::Namespace { ns } => {
                prefix == ns
                    || (prefix.starts_with(ns.as_str())
                        && prefix.as_bytes().get(ns.len()) == Some(&b'.'))
            }
            Selection::Item { ns, key: k, .. } => prefix == ns && key == k,
        }
    }
}

fn locator(prefix: &str, key: &str) -> String {
    serde_json::to_string(&[prefix, key]).expect("strings serialize")
}

impl Adapter for Store {
    fn describe(&self) -> Description {
        Description {
            kind: "langgraph-sqlite-store",
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "scope:memory",
                "hidden:expired",
                "hidden:orphan-vectors",
            ],
        }
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        self.selection(scope).map(|_| Applicability::Applies)
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let conn = open(&self.name, &self.path)?;
        if !has_table(&conn, "store").map_err(|e| self.err(e))? {
            return Err(AdapterError::Failed {
                target: self.name.clone(),
                why: format!(
                    "{} has no `store` table: is it a LangGraph SqliteStore file?",
                    self.path.display()
                ),
            });
        }
        Ok(())
    }

    fn current_version(&self, scope: &Scope) -> Result<Option<Version>, AdapterError> {
        let Selection::Item { ns, key, .. } = self.selection(scope)? else {
            return Ok(None);
        };
        let conn = open(&self.name, &self.path)?;
        let v: Option<String> = conn
            .query_row(
                "SELECT CAST(updated_at AS TEXT) FROM store WHERE prefix = ?1 AND key = ?2",
                params![ns, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        v.map(|v| {
            Version::new(v).map_err(|e| AdapterError::Failed {
                target: self.name.clone(),
                why: e.to_string(),
            })
        })
        .transpose()
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let sel = self.selection(scope)?;
        let conn = open(&self.name, &self.path)?;
        let rows = self.rows(&conn, &sel)?;
        Ok(Inventory::from_locators(
            rows.into_iter()
                .map(|((p, k), n)| (locator(&p, &k), n))
                .collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[(String, u64)]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let version = match &sel {
            Selection::Item { version, .. } => version.clone(),
            Selection::Namespace { .. } => None,
        };
        let mut conn = open(&self.name, &self.path)?;
        let vectors = self.has_vectors(&conn)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let mut deleted = 0u64;
        {
            // For a memory scope, only the tombstoned version goes; its vectors go with it, or
            // when the item row is already gone. Vectors first, then the item, each counted.
            let mut other_version = tx
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM store WHERE prefix = ?1 AND key = ?2
                       AND ?3 IS NOT NULL AND CAST(updated_at AS TEXT) IS NOT ?3)",
                )
                .map_err(|e| self.err(e))?;
            let mut del_item = tx
                .prepare_cached("DELETE FROM store WHERE prefix = ?1 AND key = ?2")
                .map_err(|e| self.err(e))?;
            let mut del_vec = if vectors {
                Some(
                    tx.prepare_cached("DELETE FROM store_vectors WHERE prefix = ?1 AND key = ?2")
                        .map_err(|e| self.err(e))?,
                )
            } else {
                None
            };
            for (loc, _) in batch {
                let (prefix, key): (String, String) =
                    serde_json::from_str(loc).map_err(|_| AdapterError::Failed {
                        target: self.name.clone(),
                        why: "unreadable locator in the frozen inventory".into(),
                    })?;
                // Belt and braces: a locator outside the scope is never deleted.
                if !Self::in_selection(&sel, &prefix, &key) {
                    return Err(AdapterError::Failed {
                        target: self.name.clone(),
                        why: "a frozen locator lies outside the scope".into(),
                    });
                }
                let rewritten: bool = other_version
                    .query_row(params![prefix, key, version], |r| r.get(0))
                    .map_err(|e| self.err(e))?;
                if rewritten {
                    // The item was written again at another version: not this tombstone's.
                    continue;
                }
                if let Some(del_vec) = del_vec.as_mut() {
                    deleted += del_vec
                        .execute(params![prefix, key])
                        .map_err(|e| self.err(e))? as u64;
                }
                deleted += del_item
                    .execute(params![prefix, key])
                    .map_err(|e| self.err(e))? as u64;
            }
        }
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        if deleted > expected {
            return Err(AdapterError::AnomalousVolume {
                target: self.name.clone(),
                expected,
                found: deleted,
            });
        }
        tx.commit().map_err(|e| self.err(e))?;
        Ok(deleted)
    }

    fn verify(&self, scope: &Scope, frozen: &[(String, u64)]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let conn = open(&self.name, &self.path)?;
        let mut rows = self.rows(&conn, &sel)?;
        // Anything still under a frozen locator counts too (all of it lies inside the scope, so
        // `rows` already holds it; this guards against a scope computed differently later).
        for (loc, _) in frozen {
            if let Ok((p, k)) = serde_json::from_str::<(String, String)>(loc) {
                if !rows.contains_key(&(p.clone(), k.clone())) {
                    let sub = self.rows(
                        &conn,
                        &Selection::Item {
                            ns: p.clone(),
                            key: k.clone(),
                            version: None,
                        },
                    )?;
                    rows.extend(sub);
                }
            }
        }
        Ok(rows.values().sum())
    }
}
