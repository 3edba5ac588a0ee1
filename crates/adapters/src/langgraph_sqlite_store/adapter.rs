//! The SQLite store adapter itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use lethe_core::{Scope, Version};
use rusqlite::{params, Connection, OptionalExtension};

use crate::namespace::{
    ambiguous, checked_items, locator, other_readings, parse_locator, selection, Label, Selection,
};
use crate::sqlite::{db, has_table, open};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Locator};

/// A `langgraph-sqlite-store` target.
#[derive(Debug)]
pub struct Store {
    name: String,
    path: PathBuf,
    /// How long to wait for the application's locks.
    busy: Duration,
    template: Vec<Label>,
}

/// Rows in scope: `prefix = ?1 OR prefix in ['?1.', '?1/')`. `.` is 0x2E and `/` is 0x2F, so
/// the half-open range holds exactly the strings that start with `ns.` (byte order: SQLite's
/// default BINARY collation compares UTF-8 with memcmp). Not `LIKE`: in SQLite it is
/// case-insensitive for ASCII and would need every `%` and `_` escaped.
const IN_NAMESPACE: &str = "(prefix = ?1 OR (prefix >= ?1 || '.' AND prefix < ?1 || '/'))";

/// An item's version: its `updated_at` in UTC with microseconds, `2026-12-02T09:58:14.000000Z`,
/// as the PostgreSQL store names it, whatever the text `SqliteStore` stored (`CURRENT_TIMESTAMP`
/// writes `2026-12-02 09:58:14`): the one format runtimes put in their leases' reads (the
/// Python client's `item_version`), so a memory scope revokes the leases that read it.
macro_rules! version_of_updated_at {
    () => {
        "strftime('%Y-%m-%dT%H:%M:%S', updated_at) || '.' || substr((SELECT \
         substr(f, 1, length(f) - length(ltrim(f, '0123456789'))) FROM (SELECT CASE \
         WHEN instr(CAST(updated_at AS TEXT), '.') > 0 \
         THEN substr(CAST(updated_at AS TEXT), instr(CAST(updated_at AS TEXT), '.') + 1) \
         ELSE '' END AS f)) || '000000', 1, 6) || 'Z'"
    };
}

const VERSION: &str = concat!(
    "SELECT ",
    version_of_updated_at!(),
    " FROM store WHERE prefix = ?1 AND key = ?2"
);

impl Store {
    pub(crate) fn new(name: &str, path: PathBuf, busy: Duration, template: Vec<Label>) -> Self {
        Self {
            name: name.to_string(),
            path,
            busy,
            template,
        }
    }

    fn err(&self, e: rusqlite::Error) -> AdapterError {
        db(&self.name, e)
    }

    fn selection(&self, scope: &Scope) -> Result<Selection, AdapterError> {
        selection(&self.name, &self.template, scope)
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
        let e = |e| self.err(e);
        match sel {
            Selection::Namespace { ns } => {
                // No `expires_at` condition: rows past their TTL are still on disk.
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT prefix, key FROM store WHERE {IN_NAMESPACE}"
                    ))
                    .map_err(e)?;
                let mut rows = stmt.query([ns]).map_err(e)?;
                while let Some(r) = rows.next().map_err(e)? {
                    *out.entry((r.get(0).map_err(e)?, r.get(1).map_err(e)?))
                        .or_insert(0) += 1;
                }
                if vectors {
                    // Counted on their own: an item deleted by LangGraph leaves its vectors
                    // behind, and those are residue too.
                    let mut stmt = conn
                        .prepare_cached(&format!("SELECT prefix, key, count(*) FROM store_vectors WHERE {IN_NAMESPACE} GROUP BY prefix, key"))
                        .map_err(e)?;
                    let mut rows = stmt.query([ns]).map_err(e)?;
                    while let Some(r) = rows.next().map_err(e)? {
                        let k = (r.get(0).map_err(e)?, r.get(1).map_err(e)?);
                        *out.entry(k).or_insert(0) += r.get::<_, i64>(2).map_err(e)? as u64;
                    }
                }
            }
            Selection::Item { ns, key, version } => {
                let current: Option<String> = conn
                    .query_row(VERSION, params![ns, key], |r| r.get(0))
                    .optional()
                    .map_err(e)?;
                // The item at another version is another memory version: not in scope, nor are
                // its vectors.
                if let (Some(cur), Some(v)) = (&current, version) {
                    if cur != v {
                        return Ok(out);
                    }
                }
                let mut n = u64::from(current.is_some());
                if vectors {
                    n += conn
                        .query_row(
                            "SELECT count(*) FROM store_vectors WHERE prefix = ?1 AND key = ?2",
                            params![ns, key],
                            |r| r.get::<_, i64>(0),
                        )
                        .map_err(e)? as u64;
                }
                if n > 0 {
                    out.insert((ns.clone(), key.clone()), n);
                }
            }
        }
        Ok(out)
    }
}

impl Adapter for Store {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::LanggraphSqliteStore,
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
        self.selection(scope)?;
        let others = other_readings(&self.name, &self.template, scope)?;
        if !others.is_empty() {
            let conn = open(&self.name, &self.path, self.busy)?;
            let mut stmt = conn
                .prepare("SELECT EXISTS (SELECT 1 FROM store WHERE prefix = ?1 AND key = ?2)")
                .map_err(|e| self.err(e))?;
            for (p, k) in &others {
                let found: bool = stmt
                    .query_row(rusqlite::params![p, k], |r| r.get(0))
                    .map_err(|e| self.err(e))?;
                if found {
                    return Err(ambiguous(&self.name));
                }
            }
        }
        Ok(Applicability::Applies)
    }

    fn files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn overlap_key(&self) -> Option<String> {
        let path = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        let literals: Vec<&str> = self
            .template
            .iter()
            .map_while(|l| match l {
                Label::Literal(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        Some(format!("{}\u{0}{}", path.display(), literals.join("\u{0}")))
    }

    fn place(&self) -> String {
        let path = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        format!("sqlite:{}", path.display())
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let conn = open(&self.name, &self.path, self.busy)?;
        if !has_table(&conn, "store").map_err(|e| self.err(e))? {
            return Err(AdapterError::Failed {
                target: self.name.clone(),
                why: format!(
                    "{} has no `store` table: is it a LangGraph SqliteStore file?",
                    self.path.display()
                ),
            });
        }
        if let Some(t) = crate::sqlite::delete_trigger(&conn, &["store", "store_vectors"])
            .map_err(|e| self.err(e))?
        {
            return Err(crate::sqlite::delete_trigger_refusal(&self.name, t));
        }
        Ok(())
    }

    fn check_version(&self, version: &Version) -> Result<(), &'static str> {
        if crate::is_updated_at_version(version.as_str()) {
            Ok(())
        } else {
            Err(crate::UPDATED_AT_FORM)
        }
    }

    fn current_version(&self, scope: &Scope) -> Result<Option<Version>, AdapterError> {
        let Selection::Item { ns, key, .. } = self.selection(scope)? else {
            return Ok(None);
        };
        let conn = open(&self.name, &self.path, self.busy)?;
        let v: Option<String> = conn
            .query_row(VERSION, params![ns, key], |r| r.get(0))
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
        let conn = open(&self.name, &self.path, self.busy)?;
        let rows = self.rows(&conn, &sel)?;
        Ok(Inventory::from_locators(
            rows.into_iter()
                .map(|((p, k), n)| (locator(&p, &k), n))
                .collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let items = checked_items(&self.name, &sel, batch)?;
        let version = sel.version();
        let mut conn = open(&self.name, &self.path, self.busy)?;
        let vectors = self.has_vectors(&conn)?;
        let e = |e| self.err(e);
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(e)?;
        let mut deleted = 0u64;
        {
            // For a memory scope, only the tombstoned version goes; its vectors go with it, or
            // when the item row is already gone. Vectors first, then the item, each counted.
            let mut other_version = tx
                .prepare_cached(concat!(
                    "SELECT EXISTS (SELECT 1 FROM store WHERE prefix = ?1 AND key = ?2 \
                         AND ?3 IS NOT NULL AND (",
                    version_of_updated_at!(),
                    ") IS NOT ?3)"
                ))
                .map_err(e)?;
            let mut del_item = tx
                .prepare_cached("DELETE FROM store WHERE prefix = ?1 AND key = ?2")
                .map_err(e)?;
            let mut del_vec = if vectors {
                Some(
                    tx.prepare_cached("DELETE FROM store_vectors WHERE prefix = ?1 AND key = ?2")
                        .map_err(e)?,
                )
            } else {
                None
            };
            for (prefix, key) in &items {
                let rewritten: bool = other_version
                    .query_row(params![prefix, key, version], |r| r.get(0))
                    .map_err(e)?;
                if rewritten {
                    // Written again at another version: not this tombstone's.
                    continue;
                }
                if let Some(del_vec) = del_vec.as_mut() {
                    deleted += del_vec.execute(params![prefix, key]).map_err(e)? as u64;
                }
                deleted += del_item.execute(params![prefix, key]).map_err(e)? as u64;
            }
        }
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        // Dropping the transaction rolls the step back.
        crate::within_inventory(&self.name, expected, deleted)?;
        tx.commit().map_err(e)?;
        Ok(deleted)
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let conn = open(&self.name, &self.path, self.busy)?;
        let mut rows = self.rows(&conn, &sel)?;
        // Anything still under a frozen locator counts too.
        for (loc, _) in frozen {
            let (p, k) = parse_locator(&self.name, loc)?;
            if !rows.contains_key(&(p.clone(), k.clone())) {
                rows.extend(self.rows(
                    &conn,
                    &Selection::Item {
                        ns: p,
                        key: k,
                        version: None,
                    },
                )?);
            }
        }
        Ok(rows.values().sum())
    }
}

#[cfg(test)]
mod tests {
    /// The version of `updated_at` texts `SqliteStore` and other writers store: UTC, six
    /// fractional digits (only the digits after the point; a suffix after them is a zone).
    #[test]
    fn a_version_is_utc_with_six_fractional_digits_whatever_the_stored_text() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE store (prefix TEXT, key TEXT, updated_at TIMESTAMP)")
            .unwrap();
        for (stored, version) in [
            ("2026-12-02 09:58:14", "2026-12-02T09:58:14.000000Z"),
            ("2026-12-02T09:58:14.5Z", "2026-12-02T09:58:14.500000Z"),
            ("2026-12-02T09:58:14.500Z", "2026-12-02T09:58:14.500000Z"),
            (
                "2026-12-02 09:58:14.123+02:00",
                "2026-12-02T07:58:14.123000Z",
            ),
            (
                "2026-12-02 09:58:14.123456789",
                "2026-12-02T09:58:14.123456Z",
            ),
            ("2026-12-02 09:58:14.654321", "2026-12-02T09:58:14.654321Z"),
        ] {
            conn.execute("DELETE FROM store", []).unwrap();
            conn.execute(
                "INSERT INTO store VALUES ('p', 'k', ?1)",
                rusqlite::params![stored],
            )
            .unwrap();
            let v: String = conn
                .query_row(super::VERSION, rusqlite::params!["p", "k"], |r| r.get(0))
                .unwrap();
            assert_eq!(v, version, "{stored}");
        }
    }
}
