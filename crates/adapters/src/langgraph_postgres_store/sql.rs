//! PostgreSQL's SQL for the store (`PostgresStore`'s `store` and, with an index,
//! `store_vectors`): the dialect table [`crate::langgraph::store`] runs. Sets of items are bound
//! as `text[]` pairs, so a statement serves a whole chunk of items.

use crate::langgraph::store::Dialect;
use crate::postgres::like_escape;
use crate::sql::{Db, Stmt};
use crate::Description;

/// The PostgreSQL store's dialect.
#[derive(Debug)]
pub(super) struct Postgres {
    /// The schema as configured.
    pub(super) schema: String,
    /// The schema, quoted.
    pub(super) quoted: String,
}

/// An item's version: `updated_at` in UTC, microseconds, whatever the session's time zone.
const VERSION: &str = "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";

/// Rows in scope: the prefix is the namespace, or starts with it and a `.`.
/// $1 = namespace, $2 = LIKE-escaped namespace followed by `.%`.
const IN_NAMESPACE: &str = "(prefix = $1 OR prefix LIKE $2 ESCAPE '\\')";

/// The batch's items as rows `b(prefix, key)`, from `$1` and `$2`.
const BATCH: &str = "b AS (SELECT * FROM unnest($1::text[], $2::text[]) AS b(prefix, key))";

impl Postgres {
    fn store(&self) -> String {
        format!("{}.\"store\"", self.quoted)
    }

    fn vectors(&self) -> String {
        format!("{}.\"store_vectors\"", self.quoted)
    }

    /// The batch's items, minus any written again at another version than `$3`, a memory
    /// scope's tombstoned one; then `delete` of them from `table`.
    fn delete(&self, table: &str) -> Stmt {
        Stmt::new(format!(
            "WITH {BATCH},
                  keep AS (SELECT s.prefix, s.key FROM {} s JOIN b USING (prefix, key)
                            WHERE $3::text IS NOT NULL AND {VERSION} IS DISTINCT FROM $3),
                  go AS (SELECT prefix, key FROM b EXCEPT SELECT prefix, key FROM keep)
             DELETE FROM {table} t USING go WHERE t.prefix = go.prefix AND t.key = go.key",
            self.store()
        ))
    }
}

impl Dialect for Postgres {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::LanggraphPostgresStore,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "scope:memory",
                "hidden:expired",
                "hidden:orphan-vectors",
                "delete:set-based",
                "guard:postgres-trigger",
            ],
        }
    }

    fn place_schema(&self) -> &str {
        &self.schema
    }

    fn store_table(&self) -> String {
        format!("{}.store", self.quoted)
    }

    fn missing_store(&self, _db: &Db, name: &str) -> String {
        format!("no table {name}: is this a LangGraph PostgresStore database?")
    }

    fn tables(&self) -> (String, String) {
        (
            format!("{}.store", self.schema),
            format!("{}.store_vectors", self.schema),
        )
    }

    fn vectors_table(&self) -> String {
        format!("{}.store_vectors", self.quoted)
    }

    fn in_namespace(&self, ns: &str) -> Vec<String> {
        vec![ns.to_string(), format!("{}.%", like_escape(ns))]
    }

    fn namespace_rows(&self, vectors: bool) -> Stmt {
        let mut sql = format!(
            "SELECT prefix, key, 1::bigint FROM {} WHERE {IN_NAMESPACE}",
            self.store()
        );
        if vectors {
            sql.push_str(&format!(" UNION ALL SELECT prefix, key, count(*) FROM {} WHERE {IN_NAMESPACE} GROUP BY prefix, key", self.vectors()));
        }
        Stmt::new(sql)
    }

    fn version(&self) -> Stmt {
        Stmt::new(format!(
            "SELECT {VERSION} FROM {} WHERE prefix = $1 AND key = $2",
            self.store()
        ))
    }

    fn vector_count(&self) -> Stmt {
        Stmt::new(format!(
            "SELECT count(*) FROM {} WHERE prefix = $1 AND key = $2",
            self.vectors()
        ))
    }

    fn other_items(&self) -> Stmt {
        Stmt::new(format!(
            "SELECT EXISTS (SELECT 1 FROM unnest($1::text[], $2::text[]) AS o(p, k) \
             JOIN {} s ON s.prefix = o.p AND s.key = o.k)",
            self.store()
        ))
    }

    fn delete_vectors(&self) -> Stmt {
        // Vectors first: the cascade from `store` then finds nothing, so every row is counted.
        self.delete(&self.vectors())
    }

    fn delete_items(&self) -> Stmt {
        self.delete(&self.store())
    }

    fn frozen_rows(&self, vectors: bool) -> Stmt {
        // One index probe per frozen item (a LATERAL subquery that `OFFSET 0` keeps from
        // being flattened into a join). As a plain join, PostgreSQL estimated the unnested
        // array at a handful of matches and hashed the whole `store` table instead: 24-31 ms
        // for 2,000 items against a 52,000-row store, 7 ms this way (bench/README.md).
        let probe = |table: &str| {
            format!(
                "SELECT x.prefix, x.key FROM b CROSS JOIN LATERAL \
                 (SELECT t.prefix, t.key FROM {table} t \
                  WHERE t.prefix = b.prefix AND t.key = b.key OFFSET 0) x"
            )
        };
        let mut sql = format!(
            "WITH {BATCH} SELECT prefix, key, count(*) FROM ({}",
            probe(&self.store())
        );
        if vectors {
            sql.push_str(&format!(" UNION ALL {}", probe(&self.vectors())));
        }
        sql.push_str(") x GROUP BY prefix, key");
        Stmt::new(sql)
    }
}
