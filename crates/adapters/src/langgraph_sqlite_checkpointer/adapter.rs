//! The checkpointer adapter itself.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use lethe_core::Scope;
use rusqlite::{params, Connection};

use crate::sqlite::{columns, db, has_table, open, quote_ident};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Locator};

/// The application's thread registry.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    pub(crate) path: PathBuf,
    pub(crate) table: String,
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) thread: String,
}

/// JSON paths (already quoted) of the owner keys in `checkpoints.metadata`.
#[derive(Debug, Clone)]
pub(crate) struct MetadataKeys {
    pub(crate) tenant_path: String,
    pub(crate) subject_path: String,
}

/// A `langgraph-sqlite-checkpointer` target.
#[derive(Debug)]
pub struct Checkpointer {
    name: String,
    path: PathBuf,
    /// How long to wait for the application's locks.
    busy: Duration,
    registry: Option<Registry>,
    metadata: Option<MetadataKeys>,
}

const THREAD: &str = "0:";
const REGISTRY: &str = "1:";

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
/// when a thread is checked for one. `CAST(json_extract(..) AS TEXT)` read an integer past i64
/// as a float (`1.84467440737096e+19`: that owner was never found, and certified gone) and
/// `true` as `1` (another owner's thread taken for subject "1"; found by review, 2026-12-04).
fn owner_text(path: &str) -> String {
    format!(
        "(CASE json_type({META}, {path}) WHEN 'text' THEN json_extract({META}, {path}) \
         WHEN 'null' THEN NULL WHEN 'integer' THEN ({META}) -> {path} \
         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' \
         ELSE char(1) || (({META}) -> {path}) END)"
    )
}

/// The owner of a scope, as SQL parameters.
struct Owner<'a> {
    tenant: &'a str,
    /// `None` for a tenant scope.
    subject: Option<&'a str>,
}

fn owner(scope: &Scope) -> Option<Owner<'_>> {
    match scope {
        Scope::Subject { tenant, subject } => Some(Owner {
            tenant: tenant.as_str(),
            subject: Some(subject.as_str()),
        }),
        Scope::Tenant { tenant } => Some(Owner {
            tenant: tenant.as_str(),
            subject: None,
        }),
        Scope::Memory { .. } => None,
    }
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

impl Checkpointer {
    pub(crate) fn new(
        name: &str,
        path: PathBuf,
        busy: Duration,
        registry: Option<Registry>,
        metadata: Option<MetadataKeys>,
    ) -> Self {
        Self {
            name: name.to_string(),
            path,
            busy,
            registry,
            metadata,
        }
    }

    fn err(&self, e: rusqlite::Error) -> AdapterError {
        db(&self.name, e)
    }

    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    fn open_registry(&self, r: &Registry) -> Result<Connection, AdapterError> {
        open(&self.name, &r.path, self.busy)
    }

    /// Registry rows for the owner: (thread id, rows).
    fn registry_threads(
        &self,
        conn: &Connection,
        r: &Registry,
        o: &Owner<'_>,
    ) -> Result<Vec<(String, u64)>, AdapterError> {
        let (t, s, th) = (
            quote_ident(&r.tenant),
            quote_ident(&r.subject),
            quote_ident(&r.thread),
        );
        let table = quote_ident(&r.table);
        let (et, es) = (exact(&t), exact(&s));
        let sql = format!(
            "SELECT CAST({th} AS TEXT), count(*) FROM {table} WHERE {t} = ?1 AND {et} = ?1 \
             AND (?2 IS NULL OR ({s} = ?2 AND {es} = ?2)) GROUP BY 1"
        );
        let mut stmt = conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![o.tenant, o.subject], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(|e| self.err(e))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e));
        rows
    }

    /// Threads whose checkpoint metadata names the owner.
    fn metadata_threads(
        &self,
        conn: &Connection,
        m: &MetadataKeys,
        o: &Owner<'_>,
    ) -> Result<Vec<String>, AdapterError> {
        // The byte pre-filter skips JSON parsing for rows that cannot match; it is only used
        // when the identifier's JSON form is its own bytes.
        let needle = o.subject.unwrap_or(o.tenant);
        // A row with any escape (`\u0061lice` is `alice` too) is always parsed.
        let prefilter = if is_json_verbatim(needle) {
            "(instr(CAST(metadata AS BLOB), CAST(?5 AS BLOB)) > 0 OR instr(CAST(metadata AS BLOB), X'5C') > 0) AND"
        } else {
            "?5 IS NOT NULL AND"
        };
        // A plain table scan, de-duplicated here: with DISTINCT, SQLite walks the primary-key
        // index and looks each row up in the table, about twice the page reads on a table
        // whose threads interleave (bench/README.md).
        // The owner's values as text, as PostgreSQL's `->>` reads them (a JSON number 7 is "7").
        let sql = format!(
            "SELECT thread_id FROM checkpoints NOT INDEXED
              WHERE {prefilter} {} = ?1
                AND (?2 IS NULL OR {} = ?2)",
            owner_text("?3"),
            owner_text("?4"),
        );
        let mut stmt = conn.prepare(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt
            .query(params![
                o.tenant,
                o.subject,
                m.tenant_path,
                m.subject_path,
                needle
            ])
            .map_err(|e| self.err(e))?;
        let mut threads = BTreeSet::new();
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            threads.insert(r.get::<_, String>(0).map_err(|e| self.err(e))?);
        }
        Ok(threads.into_iter().collect())
    }

    /// Rows a thread holds in `checkpoints` and `writes`.
    fn thread_rows(&self, conn: &Connection, thread: &str) -> Result<u64, AdapterError> {
        conn.query_row(
            "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = ?1) + (SELECT count(*) FROM writes WHERE thread_id = ?1)",
            [thread],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n as u64)
        .map_err(|e| self.err(e))
    }

    /// Refuses a thread whose checkpoints name another owner too: erasing it would erase
    /// someone else's rows.
    fn check_single_owner(
        &self,
        conn: &Connection,
        thread: &str,
        o: &Owner<'_>,
    ) -> Result<(), AdapterError> {
        let Some(m) = &self.metadata else {
            return Ok(());
        };
        let others: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM checkpoints WHERE thread_id = ?1
                       AND (({t} IS NOT NULL AND {t} IS NOT ?2)
                            OR (?3 IS NOT NULL AND {s} IS NOT NULL AND {s} IS NOT ?3))",
                    t = owner_text("?4"),
                    s = owner_text("?5"),
                ),
                params![thread, o.tenant, o.subject, m.tenant_path, m.subject_path],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        if others > 0 {
            return Err(self.failed(format!(
                "a thread in scope also holds {others} checkpoints whose metadata names another owner; \
                 erasing it would erase their rows: resolve the thread's ownership by hand"
            )));
        }
        Ok(())
    }

    /// Refuses threads in scope that the registry also assigns to another owner: erasing
    /// them would erase that owner's thread. One query for all the threads.
    fn check_registry_owners(
        &self,
        conn: &Connection,
        threads: &BTreeSet<String>,
        o: &Owner<'_>,
    ) -> Result<(), AdapterError> {
        let Some(r) = &self.registry else {
            return Ok(());
        };
        if threads.is_empty() {
            return Ok(());
        }
        let rconn = if r.path == self.path {
            None
        } else {
            Some(self.open_registry(r)?)
        };
        let (t, s, th) = (
            exact(&quote_ident(&r.tenant)),
            exact(&quote_ident(&r.subject)),
            quote_ident(&r.thread),
        );
        let eth = exact(&th);
        // One lookup per thread, by the thread column's index if it has one.
        let sql = format!(
            "SELECT count(*) FROM json_each(?1) AS j WHERE EXISTS (
               SELECT 1 FROM {} WHERE {th} = j.value AND {eth} = j.value
                  AND NOT ({t} IS ?2 AND (?3 IS NULL OR {s} IS ?3)))",
            quote_ident(&r.table)
        );
        let list = serde_json::to_string(threads).map_err(|e| self.failed(e.to_string()))?;
        let others: i64 = rconn
            .as_ref()
            .unwrap_or(conn)
            .query_row(&sql, params![list, o.tenant, o.subject], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        if others > 0 {
            return Err(self.failed(format!(
                "threads in scope are also registered to another owner ({others} threads); \
                 erasing them would erase that owner's threads: resolve their ownership by hand"
            )));
        }
        Ok(())
    }

    /// Every thread in scope now: registry ∪ metadata, with registry row counts.
    fn resolve(
        &self,
        conn: &Connection,
        o: &Owner<'_>,
    ) -> Result<(BTreeSet<String>, Vec<Locator>), AdapterError> {
        let mut threads = BTreeSet::new();
        let mut registry_rows = Vec::new();
        if let Some(r) = &self.registry {
            let rconn = if r.path == self.path {
                None
            } else {
                Some(self.open_registry(r)?)
            };
            registry_rows = self.registry_threads(rconn.as_ref().unwrap_or(conn), r, o)?;
            threads.extend(registry_rows.iter().map(|(t, _)| t.clone()));
        }
        if let Some(m) = &self.metadata {
            threads.extend(self.metadata_threads(conn, m, o)?);
        }
        Ok((threads, registry_rows))
    }

    fn erase_threads(&self, threads: &[(&str, u64)]) -> Result<u64, AdapterError> {
        if threads.is_empty() {
            return Ok(0);
        }
        let mut conn = open(&self.name, &self.path, self.busy)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let mut deleted = 0u64;
        {
            let mut del_c = tx
                .prepare_cached("DELETE FROM checkpoints WHERE thread_id = ?1")
                .map_err(|e| self.err(e))?;
            let mut del_w = tx
                .prepare_cached("DELETE FROM writes WHERE thread_id = ?1")
                .map_err(|e| self.err(e))?;
            for (t, _) in threads {
                deleted += del_c.execute([t]).map_err(|e| self.err(e))? as u64;
                deleted += del_w.execute([t]).map_err(|e| self.err(e))? as u64;
            }
        }
        let expected: u64 = threads.iter().map(|(_, n)| n).sum();
        // Dropping the transaction rolls the step back.
        crate::within_inventory(&self.name, expected, deleted)?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(deleted)
    }

    fn erase_registry(&self, o: &Owner<'_>, threads: &[(&str, u64)]) -> Result<u64, AdapterError> {
        let Some(r) = &self.registry else {
            return if threads.is_empty() {
                Ok(0)
            } else {
                Err(self.failed("registry locators but no registry configured"))
            };
        };
        if threads.is_empty() {
            return Ok(0);
        }
        let mut conn = self.open_registry(r)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let (th, t, s) = (
            quote_ident(&r.thread),
            quote_ident(&r.tenant),
            quote_ident(&r.subject),
        );
        let sql = format!(
            "DELETE FROM {} WHERE {th} = ?1 AND {} = ?1 AND {t} = ?2 AND {} = ?2 \
             AND (?3 IS NULL OR ({s} = ?3 AND {} = ?3))",
            quote_ident(&r.table),
            exact(&th),
            exact(&t),
            exact(&s)
        );
        let mut deleted = 0u64;
        {
            let mut del = tx.prepare(&sql).map_err(|e| self.err(e))?;
            for (t, _) in threads {
                deleted += del
                    .execute(params![t, o.tenant, o.subject])
                    .map_err(|e| self.err(e))? as u64;
            }
        }
        let expected: u64 = threads.iter().map(|(_, n)| n).sum();
        // Dropping the transaction rolls the step back.
        crate::within_inventory(&self.name, expected, deleted)?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(deleted)
    }
}

impl Adapter for Checkpointer {
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

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(match scope {
            Scope::Memory { .. } => Applicability::Exempt(
                "memory scope: checkpoint threads are not addressed by memory id".into(),
            ),
            // SQL parameters express any identifier exactly.
            Scope::Subject { .. } | Scope::Tenant { .. } => Applicability::Applies,
        })
    }

    fn overlap_key(&self) -> Option<String> {
        let path = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        Some(path.display().to_string())
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.path.clone()];
        files.extend(self.registry.as_ref().map(|r| r.path.clone()));
        files
    }

    fn place(&self) -> String {
        let file = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        let mut place = format!("sqlite:{}", file(&self.path).display());
        // The registry's rows are inventoried too: its file and table are part of the place.
        if let Some(r) = &self.registry {
            place.push_str(&format!(
                " registry:{}:{}",
                file(&r.path).display(),
                r.table
            ));
        }
        place
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let conn = open(&self.name, &self.path, self.busy)?;
        for t in ["checkpoints", "writes"] {
            if !has_table(&conn, t).map_err(|e| self.err(e))? {
                return Err(self.failed(format!(
                    "{} has no `{t}` table: is it a LangGraph SqliteSaver file?",
                    self.path.display()
                )));
            }
        }
        if let Some(t) = crate::sqlite::delete_trigger(&conn, &["checkpoints", "writes"])
            .map_err(|e| self.err(e))?
        {
            return Err(crate::sqlite::delete_trigger_refusal(&self.name, t));
        }
        if let Some(r) = &self.registry {
            let rconn = self.open_registry(r)?;
            if let Some(t) = crate::sqlite::delete_trigger(&rconn, &[r.table.as_str()])
                .map_err(|e| self.err(e))?
            {
                return Err(crate::sqlite::delete_trigger_refusal(&self.name, t));
            }
            let cols = columns(&rconn, &r.table).map_err(|e| self.err(e))?;
            if cols.is_empty() {
                return Err(self.failed(format!(
                    "registry table `{}` not found in {}",
                    r.table,
                    r.path.display()
                )));
            }
            for c in [&r.tenant, &r.subject, &r.thread] {
                if !cols.contains(c) {
                    return Err(
                        self.failed(format!("registry table `{}` has no column `{c}`", r.table))
                    );
                }
            }
        }
        if let Some(m) = &self.metadata {
            // A misspelt key matches no checkpoint, and every job would certify 0 for threads
            // only the metadata names: warned, not refused, since checkpoints none of which
            // holds the key may also be right (written before the application tagged its runs,
            // or the tagged ones all erased), and the registry still finds its threads.
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM checkpoints) AND NOT EXISTS \
                 (SELECT 1 FROM checkpoints WHERE json_extract({META}, ?1) IS NOT NULL)"
            );
            for (what, path) in [("tenant", &m.tenant_path), ("subject", &m.subject_path)] {
                let missing: bool = conn
                    .query_row(&sql, [path], |r| r.get(0))
                    .map_err(|e| self.err(e))?;
                if missing {
                    let key = path.trim_start_matches("$.\"").trim_end_matches('"');
                    tracing::warn!(target = %self.name, "{}", crate::missing_key(what, key));
                }
            }
        }
        Ok(())
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let Some(o) = owner(scope) else {
            return Ok(Inventory::default());
        };
        let conn = open(&self.name, &self.path, self.busy)?;
        let (threads, registry_rows) = self.resolve(&conn, &o)?;
        self.check_registry_owners(&conn, &threads, &o)?;
        let mut locators = Vec::with_capacity(threads.len() + registry_rows.len());
        for t in &threads {
            self.check_single_owner(&conn, t, &o)?;
            locators.push((format!("{THREAD}{t}"), self.thread_rows(&conn, t)?));
        }
        locators.extend(
            registry_rows
                .into_iter()
                .map(|(t, n)| (format!("{REGISTRY}{t}"), n)),
        );
        Ok(Inventory::from_locators(locators))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[(String, u64)]) -> Result<u64, AdapterError> {
        let Some(o) = owner(scope) else { return Ok(0) };
        let mut threads = Vec::new();
        let mut registry = Vec::new();
        for (loc, n) in batch {
            if let Some(t) = loc.strip_prefix(THREAD) {
                threads.push((t, *n));
            } else if let Some(t) = loc.strip_prefix(REGISTRY) {
                registry.push((t, *n));
            } else {
                return Err(self.failed("unknown locator in the frozen inventory"));
            }
        }
        // Threads before their registry rows, whatever the batch boundaries.
        Ok(self.erase_threads(&threads)? + self.erase_registry(&o, &registry)?)
    }

    fn verify(&self, scope: &Scope, frozen: &[(String, u64)]) -> Result<u64, AdapterError> {
        let Some(o) = owner(scope) else { return Ok(0) };
        let conn = open(&self.name, &self.path, self.busy)?;
        let (mut threads, registry_rows) = self.resolve(&conn, &o)?;
        threads.extend(
            frozen
                .iter()
                .filter_map(|(l, _)| l.strip_prefix(THREAD).map(str::to_owned)),
        );
        let mut residue: u64 = registry_rows.iter().map(|(_, n)| n).sum();
        for t in &threads {
            residue += self.thread_rows(&conn, t)?;
        }
        Ok(residue)
    }
}
