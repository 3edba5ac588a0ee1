//! SQLite's SQL for the store (`SqliteStore`'s `store` and `store_vectors`): the dialect table
//! [`crate::langgraph::store`] runs. Sets of items run once per item, by the primary key's
//! index.

use crate::langgraph::store::Dialect;
use crate::sql::{Db, Stmt};
use crate::Description;

/// The SQLite store's dialect.
#[derive(Debug)]
pub(super) struct Sqlite;

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

/// Whether the item `?1`, `?2` was written again at another version than `?3`, a memory
/// scope's tombstoned one: then neither it nor its vectors are this tombstone's.
const REWRITTEN: &str = concat!(
    "EXISTS (SELECT 1 FROM store WHERE prefix = ?1 AND key = ?2 AND ?3 IS NOT NULL AND (",
    version_of_updated_at!(),
    ") IS NOT ?3)"
);

impl Dialect for Sqlite {
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

    fn place_schema(&self) -> &str {
        ""
    }

    fn store_table(&self) -> String {
        "store".into()
    }

    fn missing_store(&self, db: &Db, _name: &str) -> String {
        let path = db.file().map(|p| p.display().to_string()).unwrap_or_default();
        format!("{path} has no `store` table: is it a LangGraph SqliteStore file?")
    }

    fn tables(&self) -> (String, String) {
        ("store".into(), "store_vectors".into())
    }

    fn vectors_table(&self) -> String {
        "store_vectors".into()
    }

    fn in_namespace(&self, ns: &str) -> Vec<String> {
        vec![ns.to_string()]
    }

    fn namespace_rows(&self, vectors: bool) -> Stmt {
        let mut sql = format!("SELECT prefix, key, 1 FROM store WHERE {IN_NAMESPACE}");
        if vectors {
            // Counted on their own: an item deleted by LangGraph leaves its vectors behind,
            // and those are residue too.
            sql.push_str(&format!(" UNION ALL SELECT prefix, key, count(*) FROM store_vectors WHERE {IN_NAMESPACE} GROUP BY prefix, key"));
        }
        Stmt::new(sql)
    }

    fn version(&self) -> Stmt {
        Stmt::new(VERSION)
    }

    fn vector_count(&self) -> Stmt {
        Stmt::new("SELECT count(*) FROM store_vectors WHERE prefix = ?1 AND key = ?2")
    }

    fn other_items(&self) -> Stmt {
        Stmt::new("SELECT EXISTS (SELECT 1 FROM store WHERE prefix = ?1 AND key = ?2)")
    }

    fn delete_vectors(&self) -> Stmt {
        Stmt::new(format!(
            "DELETE FROM store_vectors WHERE prefix = ?1 AND key = ?2 AND NOT {REWRITTEN}"
        ))
    }

    fn delete_items(&self) -> Stmt {
        Stmt::new(format!(
            "DELETE FROM store WHERE prefix = ?1 AND key = ?2 AND NOT {REWRITTEN}"
        ))
    }

    fn frozen_rows(&self, vectors: bool) -> Stmt {
        let vectors = if vectors {
            " + (SELECT count(*) FROM store_vectors WHERE prefix = ?1 AND key = ?2)"
        } else {
            ""
        };
        Stmt::new(format!(
            "SELECT ?1, ?2, (SELECT count(*) FROM store WHERE prefix = ?1 AND key = ?2){vectors}"
        ))
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
