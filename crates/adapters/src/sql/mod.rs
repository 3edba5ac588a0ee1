//! The SQL engine facade the LangGraph adapters and the generic `sql` kind run on: one closed set of engines (SQLite
//! through rusqlite, PostgreSQL through `postgres`), as Garage's `garage_db` wraps its stores.
//!
//! A [`Db`] names a database; a [`Session`] holds one connection to it for several statements;
//! a [`Tx`] is a write transaction on a session. Statements take [`Param`]s, always bound,
//! never spliced into the text: identifiers (tenants, subjects, threads, namespaces) reach the
//! server only as parameters. A set of identifiers is one [`Param::Set`]: PostgreSQL binds it
//! as a `text[]` (in chunks), SQLite once per element or, for a statement marked
//! [`Stmt::whole`], as one JSON array for `json_each`.
//!
//! What the facade owns: connecting (TLS, timeouts, the SQLite pragmas), transactions and
//! their locking, binding, reading typed columns, quoting configured names, error
//! classification. What it is not: a query builder. Each adapter's dialect table writes its
//! own SQL, and the adapters' logic never branches on the engine.

mod engine;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::postgres::Conn;
use crate::AdapterError;

use engine::Engine;

/// PostgreSQL binds at most this many elements of a [`Param::Set`] per statement.
const CHUNK: usize = 5_000;

/// A statement parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    /// Text, or NULL.
    Text(Option<&'a str>),
    /// A set of texts: see the module docs for how each engine binds it. Sets of one
    /// statement are bound in lockstep (element `i` of each together) and have one length.
    Set(&'a [String]),
}

/// A non-null text parameter.
pub(crate) fn text(s: &str) -> Param<'_> {
    Param::Text(Some(s))
}

/// A statement and how SQLite binds its sets.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(crate) sql: String,
    /// SQLite binds a set as one JSON array (for `json_each`) instead of running the statement
    /// once per element. PostgreSQL ignores it.
    pub(crate) whole: bool,
}

impl Stmt {
    /// A statement SQLite runs once per element of its sets.
    pub(crate) fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            whole: false,
        }
    }

    /// A statement SQLite runs once, with each set as one JSON array.
    pub(crate) fn whole(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            whole: true,
        }
    }
}

/// The type a result column is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Col {
    Text,
    Int,
    Bool,
}

/// One value of a result row, as its [`Col`] asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Text(String),
    Int(i64),
    Bool(bool),
}

/// A result row.
#[derive(Debug)]
pub(crate) struct Row(Vec<Cell>);

impl Row {
    /// A `Col::Text` column (the engine refused a NULL), taken out of the row.
    pub(crate) fn string(&mut self, i: usize) -> String {
        match std::mem::replace(&mut self.0[i], Cell::Int(0)) {
            Cell::Text(s) => s,
            _ => String::new(),
        }
    }

    /// A `Col::Int` column that counts rows.
    pub(crate) fn count(&self, i: usize) -> u64 {
        match self.0[i] {
            Cell::Int(n) => n as u64,
            _ => 0,
        }
    }

    /// A `Col::Int` column as the engine returned it, sign included.
    pub(crate) fn int(&self, i: usize) -> i64 {
        match self.0[i] {
            Cell::Int(n) => n,
            _ => 0,
        }
    }

    /// A `Col::Bool` column.
    pub(crate) fn bool(&self, i: usize) -> bool {
        matches!(self.0[i], Cell::Bool(true))
    }
}

/// What the engine says a statement does, read from its plan without running it: what the
/// generic `sql` kind checks its declared statements with at probe.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Result columns.
    pub(crate) columns: usize,
    /// What the statement would change, as (what, table): `delete`, `insert`, `update` or
    /// `merge` (PostgreSQL's plan), `lock` (PostgreSQL's row locks, table empty), `write`
    /// (SQLite: a cursor that writes, a table cleared, a virtual table updated), `trigger`
    /// (SQLite: a trigger program runs, table empty). The table as [`Session::table_name`]
    /// names it, or a phrase for one outside the database's own tables. Empty: read-only.
    pub(crate) writes: Vec<(String, String)>,
}

/// A database one target reads and erases in.
#[derive(Debug, Clone)]
pub(crate) enum Db {
    /// An existing SQLite file, opened for each session (never created).
    Sqlite {
        target: String,
        path: PathBuf,
        busy: Duration,
    },
    /// A PostgreSQL database, through one lazily opened connection a clone shares.
    Postgres(Box<Conn>),
}

impl Db {
    /// Opens a session: a SQLite connection, or PostgreSQL's shared connection held.
    pub(crate) fn session(&self) -> Result<Session<'_>, AdapterError> {
        Ok(Session(match self {
            Db::Sqlite { target, path, busy } => {
                Engine::Sqlite(target, crate::sqlite::open(target, path, *busy)?)
            }
            Db::Postgres(conn) => Engine::Postgres(conn.lock()),
        }))
    }

    /// Whether a session of `self` can serve `other`: one file, or one shared connection.
    pub(crate) fn same(&self, other: &Db) -> bool {
        match (self, other) {
            (Db::Sqlite { path: a, .. }, Db::Sqlite { path: b, .. }) => a == b,
            (Db::Postgres(a), Db::Postgres(b)) => a.same(b),
            _ => false,
        }
    }

    /// The local file, if the engine keeps the database in one.
    pub(crate) fn file(&self) -> Option<&Path> {
        match self {
            Db::Sqlite { path, .. } => Some(path),
            Db::Postgres(_) => None,
        }
    }

    /// The file, canonical where it resolves: what two targets on one file share.
    pub(crate) fn canonical_file(&self) -> Option<PathBuf> {
        self.file()
            .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))
    }

    /// Where the data is, for [`crate::Adapter::place`]: the canonical file, or the database.
    pub(crate) fn location(&self) -> String {
        match self {
            Db::Sqlite { .. } => self
                .canonical_file()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            Db::Postgres(conn) => conn.database().to_string(),
        }
    }

    /// [`crate::Adapter::place`] of a target on this database, `schema` as the kind shows it.
    pub(crate) fn place(&self, schema: &str) -> String {
        match self {
            Db::Sqlite { .. } => format!("sqlite:{}", self.location()),
            Db::Postgres(_) => format!("postgres:{}:{schema}", self.location()),
        }
    }
}

/// One connection, held for several statements.
pub(crate) struct Session<'a>(Engine<'a>);

impl<'a> Session<'a> {
    /// Runs a query, handing each row to `f`.
    pub(crate) fn each(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
        cols: &[Col],
        f: impl FnMut(Row),
    ) -> Result<(), AdapterError> {
        self.0.each(stmt, params, cols, f)
    }

    /// Runs a query and collects its rows.
    pub(crate) fn query(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
        cols: &[Col],
    ) -> Result<Vec<Row>, AdapterError> {
        let mut rows = Vec::new();
        self.each(stmt, params, cols, |r| rows.push(r))?;
        Ok(rows)
    }

    /// The first row of a query, if any.
    pub(crate) fn opt(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
        cols: &[Col],
    ) -> Result<Option<Row>, AdapterError> {
        Ok(self.query(stmt, params, cols)?.into_iter().next())
    }

    /// The row of a query that always returns one (a count, an `EXISTS`).
    pub(crate) fn one(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
        cols: &[Col],
    ) -> Result<Row, AdapterError> {
        let target = self.0.target().to_string();
        self.opt(stmt, params, cols)?
            .ok_or_else(|| AdapterError::Failed {
                target,
                why: "a query that returns one row returned none".into(),
            })
    }

    /// Starts a write transaction (SQLite takes the write lock at once). Dropped uncommitted,
    /// it rolls back.
    pub(crate) fn begin(&mut self) -> Result<Tx<'_, 'a>, AdapterError> {
        self.0.batch(engine::Batch::Begin)?;
        Ok(Tx {
            session: self,
            done: false,
        })
    }

    /// Whether a table exists (`schema.name` on PostgreSQL, as configured).
    pub(crate) fn has_table(&mut self, name: &str) -> Result<bool, AdapterError> {
        self.0.has_table(name)
    }

    /// What would make a delete on `tables` (configured names) reach beyond them, or a count
    /// miss rows; `None` if nothing. `own` are the kind's own cascades as (child, parent).
    pub(crate) fn hidden_effects(
        &mut self,
        tables: &[&str],
        own: &[(&str, &str)],
    ) -> Result<Option<String>, AdapterError> {
        self.0.hidden_effects(tables, own)
    }

    /// A configured table's own name as the engine's plans show it (`schema.name` on
    /// PostgreSQL, the stored name on SQLite), if it exists.
    pub(crate) fn table_name(&mut self, name: &str) -> Result<Option<String>, AdapterError> {
        self.0.table_name(name)
    }

    /// What a statement would do, from its plan: checked in a read-only transaction on
    /// PostgreSQL (parameters bound NULL), nothing run. Fails when the statement does not
    /// parse.
    pub(crate) fn plan(&mut self, stmt: &Stmt) -> Result<Plan, AdapterError> {
        self.0.plan(stmt)
    }

    /// Runs `f` in a read-only transaction (PostgreSQL's `READ ONLY`: a statement that writes,
    /// through a function it calls included, fails), then rolls it back.
    pub(crate) fn read_only<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, AdapterError>,
    ) -> Result<T, AdapterError> {
        self.0.batch(engine::Batch::BeginRead)?;
        let out = f(self);
        self.0.rollback();
        out
    }

    /// The columns of a table (a configured name), none if there is no such table.
    pub(crate) fn columns(&mut self, table: &str) -> Result<Vec<String>, AdapterError> {
        self.0.columns(table)
    }
}

/// A write transaction. Commit it only within the inventory: dropped, it rolls back.
pub(crate) struct Tx<'s, 'a> {
    session: &'s mut Session<'a>,
    done: bool,
}

impl Tx<'_, '_> {
    /// Runs a write; returns the rows it changed, over every execution of a set.
    pub(crate) fn execute(
        &mut self,
        stmt: &Stmt,
        params: &[Param<'_>],
    ) -> Result<u64, AdapterError> {
        self.session.0.execute(stmt, params)
    }

    /// Commits.
    pub(crate) fn commit(mut self) -> Result<(), AdapterError> {
        self.session.0.batch(engine::Batch::Commit)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Tx<'_, '_> {
    fn drop(&mut self) {
        if !self.done {
            self.session.0.rollback();
        }
    }
}
