//! The two engines behind the facade: binding, typed reads, transactions and schema checks,
//! each in its driver's terms. Not reachable outside [`crate::sql`].

use postgres::types::ToSql;
use rusqlite::types::Value;
use rusqlite::Connection;

use super::{Cell, Col, Param, Plan, Row, Stmt, CHUNK};
use crate::postgres::Locked;
use crate::AdapterError;

/// A live connection of one engine.
pub(super) enum Engine<'a> {
    Sqlite(&'a str, Connection),
    Postgres(Locked<'a>),
}

/// The transaction statements.
#[derive(Clone, Copy)]
pub(super) enum Batch {
    Begin,
    /// A transaction that only reads (PostgreSQL refuses any write in it).
    BeginRead,
    Commit,
}

/// The length every set of a statement has, if it has sets.
fn set_len(params: &[Param<'_>]) -> Option<usize> {
    let mut len = None;
    for p in params {
        if let Param::Set(s) = p {
            assert!(
                len.is_none_or(|l| l == s.len()),
                "sets bound in lockstep have one length"
            );
            len = Some(s.len());
        }
    }
    len
}

/// SQLite's values for one execution: element `i` of each set, or each set as a JSON array.
fn sqlite_values(params: &[Param<'_>], i: Option<usize>) -> Vec<Value> {
    params
        .iter()
        .map(|p| match (p, i) {
            (Param::Text(t), _) => t.map_or(Value::Null, |t| Value::Text(t.to_string())),
            (Param::Set(s), Some(i)) => Value::Text(s[i].clone()),
            (Param::Set(s), None) => {
                Value::Text(serde_json::to_string(s).expect("strings serialize"))
            }
        })
        .collect()
}

/// SQLite's executions of a statement: once, or once per element of its sets.
fn sqlite_runs(stmt: &Stmt, params: &[Param<'_>]) -> Vec<Vec<Value>> {
    match set_len(params) {
        Some(n) if !stmt.whole => (0..n).map(|i| sqlite_values(params, Some(i))).collect(),
        _ => vec![sqlite_values(params, None)],
    }
}

/// PostgreSQL's executions of a statement: once, or once per chunk of its sets.
fn postgres_runs<'p>(params: &[Param<'p>]) -> Vec<Vec<Param<'p>>> {
    match set_len(params) {
        None => vec![params.to_vec()],
        Some(n) => (0..n)
            .step_by(CHUNK)
            .map(|at| {
                params
                    .iter()
                    .map(|p| match p {
                        Param::Set(s) => Param::Set(&s[at..(at + CHUNK).min(n)]),
                        p => *p,
                    })
                    .collect()
            })
            .collect(),
    }
}

fn postgres_refs<'a>(params: &'a [Param<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| match p {
            Param::Text(t) => t as &(dyn ToSql + Sync),
            Param::Set(s) => s as &(dyn ToSql + Sync),
        })
        .collect()
}

fn sqlite_row(r: &rusqlite::Row<'_>, cols: &[Col]) -> rusqlite::Result<Row> {
    let mut cells = Vec::with_capacity(cols.len());
    for (i, c) in cols.iter().enumerate() {
        cells.push(match c {
            Col::Text => Cell::Text(r.get(i)?),
            Col::Int => Cell::Int(r.get(i)?),
            Col::Bool => Cell::Bool(r.get(i)?),
        });
    }
    Ok(Row(cells))
}

fn postgres_row(r: &postgres::Row, cols: &[Col]) -> Result<Row, postgres::Error> {
    let mut cells = Vec::with_capacity(cols.len());
    for (i, c) in cols.iter().enumerate() {
        cells.push(match c {
            Col::Text => Cell::Text(r.try_get(i)?),
            Col::Int => Cell::Int(r.try_get(i)?),
            Col::Bool => Cell::Bool(r.try_get(i)?),
        });
    }
    Ok(Row(cells))
}

impl Engine<'_> {
    pub(super) fn target(&self) -> &str {
        match self {
            Engine::Sqlite(target, _) => target,
            Engine::Postgres(l) => l.conn().target(),
        }
    }

    fn sqlite_err(target: &str) -> impl Fn(rusqlite::Error) -> AdapterError + '_ {
        move |e| crate::sqlite::db(target, e)
    }

    pub(super) fn each(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
        cols: &[Col],
        mut f: impl FnMut(Row),
    ) -> Result<(), AdapterError> {
        match self {
            Engine::Sqlite(target, conn) => {
                let e = Self::sqlite_err(target);
                let mut prepared = conn.prepare_cached(&stmt.sql).map_err(&e)?;
                for values in sqlite_runs(stmt, params) {
                    let mut rows = prepared
                        .query(rusqlite::params_from_iter(values))
                        .map_err(&e)?;
                    while let Some(r) = rows.next().map_err(&e)? {
                        f(sqlite_row(r, cols).map_err(&e)?);
                    }
                }
                Ok(())
            }
            Engine::Postgres(l) => {
                for run in postgres_runs(params) {
                    let refs = postgres_refs(&run);
                    let rows = l.run(|c| c.query(stmt.sql.as_str(), &refs))?;
                    for r in &rows {
                        // A value of another type or a NULL: the data, not the connection, is
                        // wrong, and retrying will not help.
                        f(postgres_row(r, cols).map_err(|e| AdapterError::Failed {
                            target: l.conn().target().to_string(),
                            why: e.to_string(),
                        })?);
                    }
                }
                Ok(())
            }
        }
    }

    pub(super) fn execute(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
    ) -> Result<u64, AdapterError> {
        let mut n = 0u64;
        match self {
            Engine::Sqlite(target, conn) => {
                let e = Self::sqlite_err(target);
                let mut prepared = conn.prepare_cached(&stmt.sql).map_err(&e)?;
                for values in sqlite_runs(stmt, params) {
                    n += prepared
                        .execute(rusqlite::params_from_iter(values))
                        .map_err(&e)? as u64;
                }
            }
            Engine::Postgres(l) => {
                for run in postgres_runs(params) {
                    let refs = postgres_refs(&run);
                    n += l.run(|c| c.execute(stmt.sql.as_str(), &refs))?;
                }
            }
        }
        Ok(n)
    }

    /// `BEGIN` (SQLite: `IMMEDIATE`, the write lock taken before anything is read) or `COMMIT`.
    pub(super) fn batch(&mut self, b: Batch) -> Result<(), AdapterError> {
        match (self, b) {
            (Engine::Sqlite(target, conn), b) => conn
                .execute_batch(match b {
                    Batch::Begin => "BEGIN IMMEDIATE",
                    Batch::BeginRead => "BEGIN",
                    Batch::Commit => "COMMIT",
                })
                .map_err(Self::sqlite_err(target)),
            (Engine::Postgres(l), b) => l.run(|c| {
                c.batch_execute(match b {
                    Batch::Begin => "BEGIN",
                    Batch::BeginRead => "BEGIN READ ONLY",
                    Batch::Commit => "COMMIT",
                })
            }),
        }
    }

    /// Rolls back an open transaction, if the connection still holds one. Errors are moot:
    /// a connection that cannot roll back is lost, and its transaction with it.
    pub(super) fn rollback(&mut self) {
        match self {
            Engine::Sqlite(_, conn) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
            Engine::Postgres(l) => {
                if l.is_live() {
                    let _ = l.run(|c| c.batch_execute("ROLLBACK"));
                }
            }
        }
    }

    pub(super) fn has_table(&mut self, name: &str) -> Result<bool, AdapterError> {
        match self {
            Engine::Sqlite(target, conn) => {
                crate::sqlite::has_table(conn, name).map_err(Self::sqlite_err(target))
            }
            Engine::Postgres(l) => l.run(|c| {
                Ok(c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])?
                    .get(0))
            }),
        }
    }

    pub(super) fn hidden_effects(
        &mut self,
        tables: &[&str],
        own: &[(&str, &str)],
    ) -> Result<Option<String>, AdapterError> {
        match self {
            Engine::Sqlite(target, conn) => Ok(crate::sqlite::delete_trigger(conn, tables)
                .map_err(Self::sqlite_err(target))?
                .map(crate::sqlite::delete_trigger_why)),
            Engine::Postgres(l) => {
                let q = crate::postgres::quote_qualified;
                let tables: Vec<String> = tables.iter().map(|t| q(t)).collect();
                let own: Vec<(String, String)> = own.iter().map(|(c, p)| (q(c), q(p))).collect();
                l.run(|c| crate::postgres::hidden_effects(c, &tables, &own))
            }
        }
    }

    pub(super) fn columns(&mut self, table: &str) -> Result<Vec<String>, AdapterError> {
        match self {
            Engine::Sqlite(target, conn) => {
                crate::sqlite::columns(conn, table).map_err(Self::sqlite_err(target))
            }
            Engine::Postgres(l) => {
                let name = crate::postgres::quote_qualified(table);
                l.run(|c| {
                    Ok(c.query(
                        "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) \
                         AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                        &[&name],
                    )?
                    .iter()
                    .map(|r| r.get(0))
                    .collect())
                })
            }
        }
    }

    pub(super) fn table_name(&mut self, name: &str) -> Result<Option<String>, AdapterError> {
        match self {
            Engine::Sqlite(target, conn) => {
                use rusqlite::OptionalExtension;
                conn.query_row(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
                    [name],
                    |r| r.get(0),
                )
                .optional()
                .map_err(Self::sqlite_err(target))
            }
            Engine::Postgres(l) => {
                let name = crate::postgres::quote_qualified(name);
                l.run(|c| {
                    Ok(c.query_opt(
                        "SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c \
                         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
                        &[&name],
                    )?
                    .map(|r| r.get(0)))
                })
            }
        }
    }

    pub(super) fn plan(&mut self, stmt: &Stmt) -> Result<Plan, AdapterError> {
        match self {
            Engine::Sqlite(target, conn) => {
                sqlite_plan(conn, &stmt.sql).map_err(Self::sqlite_err(target))
            }
            Engine::Postgres(l) => {
                let target = l.conn().target().to_string();
                let (columns, json) = l.run(|c| {
                    let prepared = c.prepare(&stmt.sql)?;
                    let nulls: Vec<Option<&str>> = vec![None; prepared.params().len()];
                    let refs: Vec<&(dyn ToSql + Sync)> =
                        nulls.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                    c.batch_execute("BEGIN READ ONLY")?;
                    let explained = c.query_one(
                        format!("EXPLAIN (VERBOSE, FORMAT JSON) {}", stmt.sql).as_str(),
                        &refs,
                    );
                    let rolled = c.batch_execute("ROLLBACK");
                    let json: AnyText = explained?.get(0);
                    rolled?;
                    Ok((prepared.columns().len(), json.0))
                })?;
                let plan: serde_json::Value =
                    serde_json::from_str(&json).map_err(|e| AdapterError::Failed {
                        target,
                        why: format!("PostgreSQL's plan did not read as JSON: {e}"),
                    })?;
                let mut writes = Vec::new();
                postgres_writes(&plan, &mut writes);
                Ok(Plan { columns, writes })
            }
        }
    }
}

/// Any value as its text: EXPLAIN's `json` (whose binary form is its text).
struct AnyText(String);

impl<'a> postgres::types::FromSql<'a> for AnyText {
    fn from_sql(
        _: &postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(AnyText(String::from_utf8(raw.to_vec())?))
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }
}

/// The writes and row locks in a PostgreSQL plan (`EXPLAIN (VERBOSE, FORMAT JSON)`), its
/// subplans and CTEs included.
fn postgres_writes(v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default();
            match s("Node Type") {
                "ModifyTable" => {
                    // The table the statement names. A partitioned or inherited table's plan
                    // also lists its partitions ("Target Tables"): they are part of it (the
                    // hidden-effects check covers its whole tree).
                    let table = format!("{}.{}", s("Schema"), s("Relation Name"));
                    out.push((s("Operation").to_lowercase(), table));
                }
                "LockRows" => out.push(("lock".into(), String::new())),
                _ => {}
            }
            for v in m.values() {
                postgres_writes(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| postgres_writes(v, out)),
        _ => {}
    }
}

/// SQLite's own account of a statement: `sqlite3_stmt_readonly`, its columns, and from its
/// bytecode (`EXPLAIN`) every b-tree it opens for writing or clears, each trigger program and
/// virtual-table update. Nothing is run.
fn sqlite_plan(conn: &Connection, sql: &str) -> rusqlite::Result<Plan> {
    let prepared = conn.prepare(sql)?;
    let (read_only, columns) = (prepared.readonly(), prepared.column_count());
    drop(prepared);
    let mut writes = Vec::new();
    let mut pages = Vec::new();
    let mut explain = conn.prepare(&format!("EXPLAIN {sql}"))?;
    let nulls = vec![Value::Null; explain.parameter_count()];
    let mut rows = explain.query(rusqlite::params_from_iter(nulls))?;
    while let Some(r) = rows.next()? {
        let (op, p1, p2, p3): (String, i64, i64, i64) =
            (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
        match op.as_str() {
            // P2 the root page, P3 the database (0: main).
            "OpenWrite" => pages.push((p2, p3)),
            // P1 the root page, P2 the database.
            "Clear" => pages.push((p1, p2)),
            "VUpdate" => writes.push(("write".into(), "a virtual table".into())),
            "Program" => writes.push(("trigger".into(), String::new())),
            _ => {}
        }
    }
    drop(rows);
    for (page, db) in pages {
        let table = if db == 0 {
            use rusqlite::OptionalExtension;
            conn.query_row(
                "SELECT tbl_name FROM sqlite_master WHERE rootpage = ?1",
                [page],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or_else(|| "a table outside the schema".into())
        } else {
            "a table of another database (temp or attached)".into()
        };
        writes.push(("write".into(), table));
    }
    if !read_only && writes.is_empty() {
        writes.push((
            "write".into(),
            "something its bytecode does not name".into(),
        ));
    }
    Ok(Plan { columns, writes })
}
