//! PostgreSQL's SQL for the checkpointer (`PostgresSaver`'s `checkpoints`, `checkpoint_blobs`
//! and `checkpoint_writes`): the dialect table [`crate::langgraph::checkpointer`] runs. Sets of
//! threads are bound as `text[]`, so a statement serves a whole chunk of threads.

use crate::langgraph::checkpointer::{Dialect, Registry};
use crate::postgres::quote_qualified;
use crate::sql::{Db, Session, Stmt};
use crate::{AdapterError, Description};

const TABLES: [&str; 3] = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"];

/// The PostgreSQL checkpointer's dialect.
#[derive(Debug)]
pub(super) struct Postgres {
    /// The schema as configured.
    pub(super) schema: String,
    /// The schema, quoted.
    pub(super) quoted: String,
}

/// The registry's table and its tenant, subject and thread columns, quoted.
fn names(r: &Registry) -> [String; 4] {
    let q = quote_qualified;
    [q(&r.table), q(&r.tenant), q(&r.subject), q(&r.thread)]
}

impl Postgres {
    fn t(&self, table: &str) -> String {
        format!("{}.\"{table}\"", self.quoted)
    }
}

impl Dialect for Postgres {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::LanggraphPostgresCheckpointer,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "threads:registry",
                "threads:metadata",
                "delete:set-based",
                "guard:postgres-trigger",
            ],
        }
    }

    fn place_schema(&self) -> &str {
        &self.quoted
    }

    fn tables(&self) -> Vec<String> {
        TABLES.iter().map(|t| self.t(t)).collect()
    }

    fn delete_tables(&self) -> Vec<String> {
        TABLES.iter().map(|t| format!("{}.{t}", self.schema)).collect()
    }

    fn missing_table(&self, _db: &Db, table: &str) -> String {
        format!("no table {table}: is this a LangGraph PostgresSaver database?")
    }

    fn key_param(&self, key: &str) -> String {
        key.to_string()
    }

    fn key_missing(&self) -> Stmt {
        Stmt::new(format!(
            "SELECT EXISTS (SELECT 1 FROM {t}) AND NOT EXISTS (SELECT 1 FROM {t} WHERE metadata ? $1::text)",
            t = self.t("checkpoints")
        ))
    }

    fn registry_threads(&self, r: &Registry) -> Stmt {
        let [table, t, s, th] = names(r);
        // `{col}::text = $1` keeps the column's collation (a nondeterministic one makes `Bob`
        // equal `bob`): the `COLLATE "C"` comparison beside it is the exact one, the plain one
        // lets an index on the column be used.
        Stmt::new(format!(
            "SELECT {th}::text, count(*) FROM {table} WHERE {t}::text = $1 AND {t}::text COLLATE \"C\" = $1 \
             AND ($2::text IS NULL OR ({s}::text = $2 AND {s}::text COLLATE \"C\" = $2)) GROUP BY 1"
        ))
    }

    fn metadata_threads(&self, _needle: &str) -> (Stmt, bool) {
        // A sequential scan unless the index in the module docs exists.
        let sql = format!(
            "SELECT DISTINCT thread_id FROM {} WHERE metadata ->> $3::text = $1 AND ($2::text IS NULL OR metadata ->> $4::text = $2)",
            self.t("checkpoints")
        );
        (Stmt::new(sql), false)
    }

    fn metadata_threads_many(&self) -> Option<Stmt> {
        // One scan (or one walk of the recommended index) for the whole batch; exactness is the
        // caller's, on the values read back.
        Some(Stmt::new(format!(
            "SELECT DISTINCT thread_id, metadata ->> $2::text, metadata ->> $3::text FROM {}              WHERE metadata ->> $3::text = ANY($1)",
            self.t("checkpoints")
        )))
    }

    fn thread_rows(&self) -> Stmt {
        Stmt::new(
            TABLES
                .iter()
                .map(|t| format!("SELECT thread_id, count(*) FROM {} WHERE thread_id = ANY($1) GROUP BY thread_id", self.t(t)))
                .collect::<Vec<_>>()
                .join(" UNION ALL "),
        )
    }

    fn delete_threads(&self) -> Vec<Stmt> {
        TABLES
            .iter()
            .map(|t| Stmt::new(format!("DELETE FROM {} WHERE thread_id = ANY($1)", self.t(t))))
            .collect()
    }

    fn other_metadata_owners(&self) -> Stmt {
        // Either key present and naming someone else: a checkpoint that names another subject
        // without naming a tenant is another owner's too.
        Stmt::new(format!(
            "SELECT count(*) FROM {} WHERE thread_id = ANY($1)
               AND ((metadata ? $4::text AND metadata ->> $4::text IS DISTINCT FROM $2)
                    OR ($3::text IS NOT NULL AND metadata ? $5::text AND metadata ->> $5::text IS DISTINCT FROM $3))",
            self.t("checkpoints")
        ))
    }

    fn other_metadata_owners_why(&self, n: u64) -> String {
        format!(
            "threads in scope also hold {n} checkpoints whose metadata names another owner; \
             erasing them would erase their rows: resolve the threads' ownership by hand"
        )
    }

    fn other_registry_owners(&self, r: &Registry) -> Stmt {
        let [table, t, s, th] = names(r);
        // One index probe per thread (`OFFSET 0` keeps the planner from turning it into a
        // scan of the whole registry: 1.6 against 3.8 ms for 200 threads of 20,180 rows).
        Stmt::new(format!(
            "SELECT count(*) FROM unnest($1::text[]) AS x(t) WHERE EXISTS (
               SELECT 1 FROM {table} WHERE {th}::text = x.t
                  AND NOT ({t}::text COLLATE \"C\" IS NOT DISTINCT FROM $2
                           AND ($3::text IS NULL OR {s}::text COLLATE \"C\" IS NOT DISTINCT FROM $3))
               OFFSET 0)"
        ))
    }

    fn registry_check_first(&self) -> bool {
        false
    }

    fn delete_registry(&self, r: &Registry) -> Stmt {
        let [table, t, s, th] = names(r);
        Stmt::new(format!(
            "DELETE FROM {table} WHERE {th}::text = ANY($1) AND {th}::text COLLATE \"C\" = ANY($1) \
             AND {t}::text = $2 AND {t}::text COLLATE \"C\" = $2 \
             AND ($3::text IS NULL OR ({s}::text = $3 AND {s}::text COLLATE \"C\" = $3))"
        ))
    }

    fn check_registry(
        &self,
        s: &mut Session<'_>,
        _db: &Db,
        r: &Registry,
        _target: &str,
    ) -> Result<(), AdapterError> {
        let [table, t, sub, th] = names(r);
        let stmt = Stmt::new(format!("SELECT {t}, {sub}, {th} FROM {table} LIMIT 0"));
        s.query(&stmt, &[], &[]).map(|_| ()).map_err(|e| match e {
            AdapterError::Failed { target, why } => AdapterError::Failed {
                target,
                why: format!("registry table `{}`: {why}", r.table),
            },
            e => e,
        })
    }
}
