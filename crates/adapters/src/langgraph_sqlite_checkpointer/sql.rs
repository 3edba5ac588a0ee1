//! SQLite's SQL for the checkpointer (`SqliteSaver`'s `checkpoints` and `writes`): the dialect
//! table [`crate::langgraph::checkpointer`] runs. Sets of threads run once per thread, by the
//! primary key's index; a registry check binds them whole, as a JSON array.

use crate::langgraph::checkpointer::{Dialect, Registry};
use crate::sql::{Db, Session, Stmt};
use crate::{AdapterError, Description};

/// The SQLite checkpointer's dialect.
#[derive(Debug)]
pub(super) struct Sqlite;

/// The metadata column as JSON text, or NULL when it is not valid JSON (so one malformed row
/// cannot fail the whole scan). Valid as JSON5 (`json_valid`'s flag 2), which SQLite's JSON
/// functions read: `SqliteSaver` writes metadata with Python's `json.dumps`, which writes a float
/// of the run config that is infinite or not a number as `Infinity` or `NaN`, outside strict
/// JSON, and such a thread was skipped by the inventory and certified gone.
const META: &str =
    "CASE WHEN json_valid(CAST(metadata AS TEXT), 2) THEN CAST(metadata AS TEXT) END";

/// A metadata value (at the JSON path in parameter `path`) as text, as PostgreSQL's `->>`
/// reads it: a string's characters, an integer's digits as written, `true` or `false`; NULL for
/// a JSON null or no such key. A number with a fraction or exponent, an object or an array is
/// marked with a leading U+0001, which no identifier holds: PostgreSQL spells those its own way
/// (`1e3` is `1000` there), so such a value names no subject here, and counts as another owner
/// when a thread is checked for one. `CAST(json_extract(..) AS TEXT)` reads an integer past i64
/// as a float (`1.84467440737096e+19`: that owner is never found, and certified gone) and
/// `true` as `1` (another owner's thread taken for subject "1").
fn owner_text(path: &str) -> String {
    format!(
        "(CASE json_type({META}, {path}) WHEN 'text' THEN json_extract({META}, {path}) \
         WHEN 'null' THEN NULL WHEN 'integer' THEN ({META}) -> {path} \
         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' \
         ELSE char(1) || (({META}) -> {path}) END)"
    )
}

/// Whether an identifier's JSON string encoding is its own bytes under every serializer
/// LangGraph uses (plain ASCII, nothing JSON or a serializer might escape). Only then may a byte
/// search pre-filter the metadata scan.
fn is_json_verbatim(s: &str) -> bool {
    s.bytes().all(|b| {
        (0x20..0x7f).contains(&b) && !matches!(b, b'"' | b'\\' | b'/' | b'<' | b'>' | b'&' | b'\'')
    })
}

/// A registry column compared byte for byte with a parameter. `{col} = ?` alone compares under
/// the column's collation (`NOCASE` makes `Bob` equal `bob`) and affinity (an INTEGER column makes
/// `007` equal `7`), and a `CAST` keeps the column's collation: both would widen the scope. The
/// plain comparison stays beside this one so an index on the column can still be used.
fn exact(col: &str) -> String {
    format!("CAST({col} AS TEXT) COLLATE BINARY")
}

/// The registry's table and its tenant, subject and thread columns, quoted.
fn names(r: &Registry) -> [String; 4] {
    let q = crate::sqlite::quote_ident;
    [q(&r.table), q(&r.tenant), q(&r.subject), q(&r.thread)]
}

impl Dialect for Sqlite {
    fn describe(&self) -> Description {
        Description {
            kind: crate::Kind::LanggraphSqliteCheckpointer,
            version: "1",
            capabilities: vec![
                "scope:subject",
                "scope:tenant",
                "threads:registry",
                "threads:metadata",
            ],
        }
    }

    fn place_schema(&self) -> &str {
        ""
    }

    fn tables(&self) -> Vec<String> {
        vec!["checkpoints".into(), "writes".into()]
    }

    fn delete_tables(&self) -> Vec<String> {
        self.tables()
    }

    fn missing_table(&self, db: &Db, table: &str) -> String {
        let path = db.file().map(|p| p.display().to_string()).unwrap_or_default();
        format!("{path} has no `{table}` table: is it a LangGraph SqliteSaver file?")
    }

    fn key_param(&self, key: &str) -> String {
        // Quoted, so dots and brackets in the key stay part of the key (config checked it).
        format!("$.\"{key}\"")
    }

    fn key_missing(&self) -> Stmt {
        Stmt::new(format!(
            "SELECT EXISTS (SELECT 1 FROM checkpoints) AND NOT EXISTS \
             (SELECT 1 FROM checkpoints WHERE json_extract({META}, ?1) IS NOT NULL)"
        ))
    }

    fn registry_threads(&self, r: &Registry) -> Stmt {
        let [table, t, s, th] = names(r);
        let (et, es) = (exact(&t), exact(&s));
        Stmt::new(format!(
            "SELECT CAST({th} AS TEXT), count(*) FROM {table} WHERE {t} = ?1 AND {et} = ?1 \
             AND (?2 IS NULL OR ({s} = ?2 AND {es} = ?2)) GROUP BY 1"
        ))
    }

    fn metadata_threads(&self, needle: &str) -> (Stmt, bool) {
        // The byte pre-filter skips JSON parsing for rows that cannot match; it is only used
        // when the identifier's JSON form is its own bytes. A row with any escape (`\u0061lice`
        // is `alice` too) is always parsed.
        let prefilter = if is_json_verbatim(needle) {
            "(instr(CAST(metadata AS BLOB), CAST(?5 AS BLOB)) > 0 OR instr(CAST(metadata AS BLOB), X'5C') > 0) AND"
        } else {
            "?5 IS NOT NULL AND"
        };
        // A plain table scan, de-duplicated by the caller: with DISTINCT, SQLite walks the
        // primary-key index and looks each row up in the table, about twice the page reads on
        // a table whose threads interleave (bench/README.md).
        // The owner's values as text, as PostgreSQL's `->>` reads them (a JSON number 7 is "7").
        let sql = format!(
            "SELECT thread_id FROM checkpoints NOT INDEXED
              WHERE {prefilter} {} = ?1
                AND (?2 IS NULL OR {} = ?2)",
            owner_text("?3"),
            owner_text("?4"),
        );
        (Stmt::new(sql), true)
    }

    fn thread_rows(&self) -> Stmt {
        Stmt::new(
            "SELECT ?1, (SELECT count(*) FROM checkpoints WHERE thread_id = ?1) + (SELECT count(*) FROM writes WHERE thread_id = ?1)",
        )
    }

    fn delete_threads(&self) -> Vec<Stmt> {
        vec![
            Stmt::new("DELETE FROM checkpoints WHERE thread_id = ?1"),
            Stmt::new("DELETE FROM writes WHERE thread_id = ?1"),
        ]
    }

    fn other_metadata_owners(&self) -> Stmt {
        Stmt::new(format!(
            "SELECT count(*) FROM checkpoints WHERE thread_id = ?1
               AND (({t} IS NOT NULL AND {t} IS NOT ?2)
                    OR (?3 IS NOT NULL AND {s} IS NOT NULL AND {s} IS NOT ?3))",
            t = owner_text("?4"),
            s = owner_text("?5"),
        ))
    }

    fn other_metadata_owners_why(&self, n: u64) -> String {
        format!(
            "a thread in scope also holds {n} checkpoints whose metadata names another owner; \
             erasing it would erase their rows: resolve the thread's ownership by hand"
        )
    }

    fn other_registry_owners(&self, r: &Registry) -> Stmt {
        let [table, t, s, th] = names(r);
        let (t, s, eth) = (exact(&t), exact(&s), exact(&th));
        // One lookup per thread, by the thread column's index if it has one.
        Stmt::whole(format!(
            "SELECT count(*) FROM json_each(?1) AS j WHERE EXISTS (
               SELECT 1 FROM {table} WHERE {th} = j.value AND {eth} = j.value
                  AND NOT ({t} IS ?2 AND (?3 IS NULL OR {s} IS ?3)))"
        ))
    }

    fn registry_check_first(&self) -> bool {
        true
    }

    fn delete_registry(&self, r: &Registry) -> Stmt {
        let [table, t, s, th] = names(r);
        Stmt::new(format!(
            "DELETE FROM {table} WHERE {th} = ?1 AND {} = ?1 AND {t} = ?2 AND {} = ?2 \
             AND (?3 IS NULL OR ({s} = ?3 AND {} = ?3))",
            exact(&th),
            exact(&t),
            exact(&s)
        ))
    }

    fn check_registry(
        &self,
        s: &mut Session<'_>,
        db: &Db,
        r: &Registry,
        target: &str,
    ) -> Result<(), AdapterError> {
        let failed = |why| AdapterError::Failed {
            target: target.to_string(),
            why,
        };
        let cols = s.columns(&r.table)?;
        if cols.is_empty() {
            let path = db.file().map(|p| p.display().to_string()).unwrap_or_default();
            return Err(failed(format!(
                "registry table `{}` not found in {path}",
                r.table
            )));
        }
        for c in [&r.tenant, &r.subject, &r.thread] {
            if !cols.contains(c) {
                return Err(failed(format!(
                    "registry table `{}` has no column `{c}`",
                    r.table
                )));
            }
        }
        Ok(())
    }
}
