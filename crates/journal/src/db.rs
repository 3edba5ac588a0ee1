//! One small SQL surface over both backends, so the journal's logic is written once.
//!
//! Statements use `$1`-style parameters (rewritten to `?1` for SQLite) and only SQL both
//! dialects accept: `CAST(x AS TEXT)` rather than `::text`, `IS NOT DISTINCT FROM`,
//! `ON CONFLICT`, `RETURNING`. Values are [`V`]: integers, text and typed nulls (PostgreSQL
//! checks a parameter's type even when it is null).
//!
//! Write transactions serialize: SQLite's `BEGIN IMMEDIATE` takes the database's one write lock;
//! on PostgreSQL every write transaction first takes one advisory lock. That keeps the gate's
//! check-and-register and the freeze linearizable on both, and the hash chain single-file.

/// A frozen locator and the rows it accounts for.
pub type Locator = (String, u64);

/// A parameter or a column value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum V {
    /// An integer (SQLite INTEGER, PostgreSQL BIGINT or a boolean as 0/1).
    I(i64),
    /// Text.
    T(String),
    /// A null integer.
    NullI,
    /// A null text.
    NullT,
}

impl V {
    pub(crate) fn i(&self) -> Option<i64> {
        match self {
            V::I(n) => Some(*n),
            _ => None,
        }
    }
    pub(crate) fn t(&self) -> Option<&str> {
        match self {
            V::T(s) => Some(s),
            _ => None,
        }
    }
    pub(crate) fn text(&self) -> String {
        self.t().unwrap_or_default().to_string()
    }
}

impl From<&str> for V {
    fn from(s: &str) -> Self {
        V::T(s.to_string())
    }
}
impl From<String> for V {
    fn from(s: String) -> Self {
        V::T(s)
    }
}
impl From<&String> for V {
    fn from(s: &String) -> Self {
        V::T(s.clone())
    }
}
impl From<i64> for V {
    fn from(n: i64) -> Self {
        V::I(n)
    }
}
impl From<u64> for V {
    fn from(n: u64) -> Self {
        V::I(n as i64)
    }
}
impl From<Option<&str>> for V {
    fn from(s: Option<&str>) -> Self {
        s.map_or(V::NullT, V::from)
    }
}
impl From<Option<String>> for V {
    fn from(s: Option<String>) -> Self {
        s.map_or(V::NullT, V::T)
    }
}
impl From<Option<u64>> for V {
    fn from(n: Option<u64>) -> Self {
        n.map_or(V::NullI, V::from)
    }
}

/// A row: its values in column order.
pub(crate) type Row = Vec<V>;

/// What a transaction (or a plain read connection) can do.
pub(crate) trait Tx {
    /// Runs a statement; returns the rows it changed.
    fn exec(&mut self, sql: &str, params: &[V]) -> Result<u64, String>;
    /// Runs a query; returns every row.
    fn rows(&mut self, sql: &str, params: &[V]) -> Result<Vec<Row>, String>;
    /// Whether this is PostgreSQL (for the gate's advisory locks, which SQLite does not need:
    /// its write transactions already serialize).
    fn is_postgres(&self) -> bool {
        false
    }
    /// The journal's head (`seq`, `hash`; `Some(None)`: no entry yet) if this transaction
    /// read it when it began and nothing has been appended since without telling it; `None`:
    /// not known here, read it.
    fn head(&mut self) -> Option<Option<(i64, String)>> {
        None
    }
    /// Tells the transaction the head it has just appended.
    fn set_head(&mut self, _seq: i64, _hash: &str) {}
    /// Inserts a target's frozen locators (unique, as an inventory's are) into `inventory`.
    /// Multi-row `INSERT`s here; PostgreSQL overrides it with one row of two arrays in
    /// `inventory_parts`.
    fn insert_locators(
        &mut self,
        job_id: &str,
        target: &str,
        locators: &[Locator],
    ) -> Result<(), String> {
        use std::fmt::Write as _;
        for chunk in locators.chunks(INSERT_CHUNK) {
            let mut sql =
                String::from("INSERT INTO inventory (job_id, target, locator, rows) VALUES ");
            let mut params: Vec<V> = Vec::with_capacity(2 + 2 * chunk.len());
            params.push(job_id.into());
            params.push(target.into());
            for (i, (loc, rows)) in chunk.iter().enumerate() {
                let n = 3 + 2 * i;
                let sep = if i == 0 { "" } else { ", " };
                let _ = write!(sql, "{sep}($1, $2, ${n}, ${})", n + 1);
                params.push(loc.as_str().into());
                params.push((*rows).into());
            }
            self.exec(&sql, &params)?;
        }
        Ok(())
    }
    /// Adds locators to a target's frozen inventory (`InventoryExtended`): a locator already
    /// there gets the new rows added to its allowance.
    fn add_locators(
        &mut self,
        job_id: &str,
        target: &str,
        locators: &[Locator],
    ) -> Result<(), String> {
        for (loc, rows) in locators {
            self.exec(
                "INSERT INTO inventory (job_id, target, locator, rows) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (job_id, target, locator) DO UPDATE SET rows = inventory.rows + excluded.rows",
                &[job_id.into(), target.into(), loc.as_str().into(), (*rows).into()],
            )?;
        }
        Ok(())
    }
    /// A target's frozen locators, each once, in byte order of the locator.
    fn locators(&mut self, job_id: &str, target: &str) -> Result<Vec<Locator>, String> {
        let mut out: Vec<Locator> = self
            .rows(
                "SELECT locator, rows FROM inventory WHERE job_id = $1 AND target = $2",
                &[job_id.into(), target.into()],
            )?
            .into_iter()
            .map(|r| (r[0].text(), r[1].i().unwrap_or(0) as u64))
            .collect();
        out.sort_unstable();
        Ok(out)
    }
    /// Drops a job's frozen locators (at completion).
    fn drop_locators(&mut self, job_id: &str) -> Result<(), String> {
        self.exec("DELETE FROM inventory WHERE job_id = $1", &[job_id.into()])?;
        Ok(())
    }
    /// The first row, if any.
    fn row(&mut self, sql: &str, params: &[V]) -> Result<Option<Row>, String> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }
    /// The first column of the first row.
    fn one(&mut self, sql: &str, params: &[V]) -> Result<V, String> {
        self.row(sql, params)?
            .and_then(|r| r.into_iter().next())
            .ok_or_else(|| "no row".to_string())
    }
}

/// Locators per multi-row `INSERT` of a frozen inventory (SQLite): two parameters a row plus
/// two, far below SQLite's 32,766 parameters. One statement per chunk instead of one per
/// locator.
const INSERT_CHUNK: usize = 1_000;

/// `$12` -> `?12`, outside string literals.
pub(crate) fn to_sqlite(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_str = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_str = !in_str;
                out.push(c);
            }
            '$' if !in_str && chars.peek().is_some_and(char::is_ascii_digit) => out.push('?'),
            _ => out.push(c),
        }
    }
    out
}

// ------------------------------------------------------------------ SQLite

pub(crate) struct SqliteTx<'a>(pub(crate) &'a rusqlite::Connection);

fn sqlite_params(params: &[V]) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    params
        .iter()
        .map(|v| match v {
            V::I(n) => Value::Integer(*n),
            V::T(s) => Value::Text(s.clone()),
            V::NullI | V::NullT => Value::Null,
        })
        .collect()
}

impl Tx for SqliteTx<'_> {
    fn exec(&mut self, sql: &str, params: &[V]) -> Result<u64, String> {
        let mut stmt = self
            .0
            .prepare_cached(&to_sqlite(sql))
            .map_err(|e| e.to_string())?;
        stmt.execute(rusqlite::params_from_iter(sqlite_params(params)))
            .map(|n| n as u64)
            .map_err(|e| e.to_string())
    }

    fn rows(&mut self, sql: &str, params: &[V]) -> Result<Vec<Row>, String> {
        use rusqlite::types::ValueRef;
        let mut stmt = self
            .0
            .prepare_cached(&to_sqlite(sql))
            .map_err(|e| e.to_string())?;
        let n = stmt.column_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(sqlite_params(params)))
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(|e| e.to_string())? {
            let mut row = Vec::with_capacity(n);
            for i in 0..n {
                row.push(match r.get_ref(i).map_err(|e| e.to_string())? {
                    ValueRef::Null => V::NullT,
                    ValueRef::Integer(n) => V::I(n),
                    ValueRef::Real(f) => V::I(f as i64),
                    ValueRef::Text(t) | ValueRef::Blob(t) => {
                        V::T(String::from_utf8_lossy(t).into_owned())
                    }
                });
            }
            out.push(row);
        }
        Ok(out)
    }
}

// ------------------------------------------------------------------ PostgreSQL

/// A transaction (or a plain connection) and the connection's prepared statements: each
/// statement is parsed and planned once per connection, and then runs in one round trip
/// instead of two (prepare, execute).
pub(crate) struct PgTx<'a, C: postgres::GenericClient> {
    pub(crate) client: &'a mut C,
    pub(crate) prepared: &'a mut Prepared,
    /// See [`Tx::head`]: read with the write lock, in the same round trip.
    pub(crate) head: Option<Option<(i64, String)>>,
}

/// A connection's prepared statements, by their SQL text. The journal's statements are a fixed
/// set (identifiers and values are always parameters), so this stays small; the bound is a
/// guard only.
#[derive(Default)]
pub(crate) struct Prepared(
    std::collections::HashMap<String, postgres::Statement>,
    /// Statements run once, unprepared (see [`Prepared::again`]).
    std::collections::HashSet<String>,
);

impl Prepared {
    const MAX: usize = 512;

    /// The statement prepared, from its second run on this connection; `None` on its first,
    /// which is run unprepared with its parameters' types given (one round trip instead of
    /// two). A `lethe erase` process runs most of its statements once; `lethe serve` runs the
    /// gate's thousands of times.
    pub(crate) fn again<C: postgres::GenericClient>(
        &mut self,
        client: &mut C,
        sql: &str,
    ) -> Result<Option<postgres::Statement>, postgres::Error> {
        if self.1.remove(sql) || self.0.contains_key(sql) {
            return self.get(client, sql).map(Some);
        }
        if self.1.len() >= Self::MAX {
            self.1.clear();
        }
        self.1.insert(sql.to_string());
        Ok(None)
    }

    pub(crate) fn get<C: postgres::GenericClient>(
        &mut self,
        client: &mut C,
        sql: &str,
    ) -> Result<postgres::Statement, postgres::Error> {
        if let Some(s) = self.0.get(sql) {
            return Ok(s.clone());
        }
        let s = client.prepare(sql)?;
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

/// The parameters with their types, for a statement run unprepared: the types a prepared
/// statement's would have to be for these values to bind at all (`i64` binds only to `int8`).
/// The unprepared run is the more lenient one (a `$1` PostgreSQL would infer as `int4` binds
/// here and fails once prepared, on its second run): a journal statement casts a parameter
/// whose type PostgreSQL would infer as anything but `int8` or `text`.
fn pg_typed<'a>(
    params: &[V],
    boxed: &'a [Box<dyn postgres::types::ToSql + Sync>],
) -> Vec<(
    &'a (dyn postgres::types::ToSql + Sync),
    postgres::types::Type,
)> {
    use postgres::types::Type;
    params
        .iter()
        .zip(boxed)
        .map(|(v, b)| {
            let t = match v {
                V::I(_) | V::NullI => Type::INT8,
                V::T(_) | V::NullT => Type::TEXT,
            };
            (b.as_ref(), t)
        })
        .collect()
}

fn pg_params(params: &[V]) -> Vec<Box<dyn postgres::types::ToSql + Sync>> {
    params
        .iter()
        .map(|v| -> Box<dyn postgres::types::ToSql + Sync> {
            match v {
                V::I(n) => Box::new(*n),
                V::T(s) => Box::new(s.clone()),
                V::NullI => Box::new(None::<i64>),
                V::NullT => Box::new(None::<String>),
            }
        })
        .collect()
}

/// The server's message and SQLSTATE only: PostgreSQL's DETAIL can quote key values
/// (`Key (tenant, subject)=(...)`), which are identifiers and must not reach an error or a log.
pub(crate) fn pg_err(e: postgres::Error) -> String {
    lethe_postgres::describe(&e)
}

impl<C: postgres::GenericClient> Tx for PgTx<'_, C> {
    fn is_postgres(&self) -> bool {
        true
    }

    fn head(&mut self) -> Option<Option<(i64, String)>> {
        self.head.clone()
    }

    fn set_head(&mut self, seq: i64, hash: &str) {
        self.head = Some(Some((seq, hash.to_string())));
    }

    fn exec(&mut self, sql: &str, params: &[V]) -> Result<u64, String> {
        let p = pg_params(params);
        match self.prepared.again(self.client, sql).map_err(pg_err)? {
            Some(stmt) => {
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    p.iter().map(|b| b.as_ref()).collect();
                self.client.execute(&stmt, &refs)
            }
            None => self.client.execute_typed(sql, &pg_typed(params, &p)),
        }
        .map_err(pg_err)
    }

    /// One row whatever the inventory's size: the locators and their rows as two arrays in
    /// `inventory_parts`, stored out of line and uncompressed. Measured on the PostgreSQL
    /// benchmark (2,000 store items): one row per locator in `inventory`, with its key's
    /// index, took 6-11 ms to insert; one row of two arrays takes about 0.5 ms.
    fn insert_locators(
        &mut self,
        job_id: &str,
        target: &str,
        locators: &[Locator],
    ) -> Result<(), String> {
        self.add_locators(job_id, target, locators)
    }

    /// Another part: [`Tx::locators`] sums a locator's rows over the parts.
    fn add_locators(
        &mut self,
        job_id: &str,
        target: &str,
        locators: &[Locator],
    ) -> Result<(), String> {
        if locators.is_empty() {
            return Ok(());
        }
        let (locs, rows): (Vec<&str>, Vec<i64>) = locators
            .iter()
            .map(|(l, n)| (l.as_str(), i64::try_from(*n).unwrap_or(i64::MAX)))
            .unzip();
        let stmt = self
            .prepared
            .get(
                self.client,
                "INSERT INTO inventory_parts (job_id, target, locators, rows) VALUES ($1, $2, $3, $4)",
            )
            .map_err(pg_err)?;
        self.client
            .execute(&stmt, &[&job_id, &target, &locs, &rows])
            .map_err(pg_err)?;
        Ok(())
    }

    /// The parts, and the rows of `inventory` that a job frozen before the parts existed has.
    fn locators(&mut self, job_id: &str, target: &str) -> Result<Vec<Locator>, String> {
        let stmt = self
            .prepared
            .get(
                self.client,
                "SELECT locators, rows FROM inventory_parts WHERE job_id = $1 AND target = $2 \
                 UNION ALL SELECT ARRAY[locator], ARRAY[rows] FROM inventory WHERE job_id = $1 AND target = $2",
            )
            .map_err(pg_err)?;
        let mut all: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for r in self
            .client
            .query(&stmt, &[&job_id, &target])
            .map_err(pg_err)?
        {
            let locs: Vec<String> = r.try_get(0).map_err(pg_err)?;
            let rows: Vec<i64> = r.try_get(1).map_err(pg_err)?;
            if locs.len() != rows.len() {
                return Err("inventory part with unequal arrays".into());
            }
            for (l, n) in locs.into_iter().zip(rows) {
                let e = all.entry(l).or_insert(0);
                *e = e.saturating_add(n.max(0) as u64);
            }
        }
        Ok(all.into_iter().collect())
    }

    fn drop_locators(&mut self, job_id: &str) -> Result<(), String> {
        self.exec(
            "DELETE FROM inventory_parts WHERE job_id = $1",
            &[job_id.into()],
        )?;
        self.exec("DELETE FROM inventory WHERE job_id = $1", &[job_id.into()])?;
        Ok(())
    }

    fn rows(&mut self, sql: &str, params: &[V]) -> Result<Vec<Row>, String> {
        use postgres::types::Type;
        let p = pg_params(params);
        let rows = match self.prepared.again(self.client, sql).map_err(pg_err)? {
            Some(stmt) => {
                let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    p.iter().map(|b| b.as_ref()).collect();
                self.client.query(&stmt, &refs)
            }
            None => self.client.query_typed(sql, &pg_typed(params, &p)),
        }
        .map_err(pg_err)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mut row = Vec::with_capacity(r.len());
            for (i, c) in r.columns().iter().enumerate() {
                let t = c.type_();
                row.push(if *t == Type::INT8 {
                    r.get::<_, Option<i64>>(i).map_or(V::NullI, V::I)
                } else if *t == Type::INT4 {
                    r.get::<_, Option<i32>>(i)
                        .map_or(V::NullI, |n| V::I(n as i64))
                } else if *t == Type::BOOL {
                    r.get::<_, Option<bool>>(i)
                        .map_or(V::NullI, |b| V::I(b as i64))
                } else {
                    r.get::<_, Option<String>>(i).map_or(V::NullT, V::T)
                });
            }
            out.push(row);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_parameters_outside_literals_only() {
        assert_eq!(
            to_sqlite("SELECT $1, '$2', $10 WHERE x = '$'"),
            "SELECT ?1, '$2', ?10 WHERE x = '$'"
        );
    }

    /// A statement's first run on a connection is unprepared (one round trip), its second and
    /// later runs prepared once and reused; both bind the same values to the same result.
    #[test]
    fn a_statement_is_prepared_from_its_second_run() {
        let url = std::env::var("LETHE_PG15_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("PostgreSQL 15");
        let mut prepared = Prepared::default();
        let count = |c: &mut postgres::Client| -> i64 {
            // A simple query: not itself a prepared statement.
            let msgs = c
                .simple_query("SELECT count(*) FROM pg_prepared_statements")
                .unwrap();
            msgs.iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
                    _ => None,
                })
                .expect("a count")
        };
        let sql = "SELECT $1::bigint + 1, $2::text || 'x', $3::text IS NULL";
        let params = [V::I(41), V::T("a".into()), V::NullT];
        let mut runs = Vec::new();
        for _ in 0..3 {
            let rows = PgTx {
                client: &mut client,
                prepared: &mut prepared,
                head: None,
            }
            .rows(sql, &params)
            .unwrap();
            runs.push((format!("{rows:?}"), count(&mut client)));
        }
        let expected = format!("{:?}", vec![vec![V::I(42), V::T("ax".into()), V::I(1)]]);
        assert_eq!(
            runs,
            vec![(expected.clone(), 0), (expected.clone(), 1), (expected, 1)]
        );
        let n = PgTx {
            client: &mut client,
            prepared: &mut prepared,
            head: None,
        }
        .exec(
            "SELECT $1::bigint WHERE $2::text IS NOT NULL",
            &[V::I(1), V::T("y".into())],
        )
        .unwrap();
        assert_eq!((n, count(&mut client)), (1, 1));
    }
}
