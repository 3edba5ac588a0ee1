//! PostgreSQL at the driver level, under the [`crate::sql`] facade and for the database guard:
//! connection settings from config, one cached connection per target, error classification,
//! identifier quoting, LIKE escaping and the hidden-effects check. Not a query layer.
//!
//! The URL, `sslmode`/`sslrootcert` (TLS as libpq means it) and `password_file` are read by
//! `lethe-postgres`, which the journal uses too, so both connect the same way.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lethe_postgres::Settings;
use postgres::Client;

use crate::AdapterError;

/// Validated connection settings.
#[derive(Clone)]
pub(crate) struct ConnConfig {
    settings: Settings,
    statement_timeout: Duration,
}

impl std::fmt::Debug for ConnConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.settings.shown())
    }
}

/// Parses a URL and its options. Errors say what to fix and never echo a password.
pub(crate) fn conn_config(
    url: &str,
    password_file: Option<&Path>,
    timeout_ms: Option<u64>,
    base: &Path,
    what: &str,
) -> Result<ConnConfig, String> {
    let mut settings = Settings::from_url(url, base).map_err(|e| format!("{what}{e}"))?;
    if let Some(p) = password_file {
        settings
            .read_password_file(p, base)
            .map_err(|e| format!("{what}{e}"))?;
    }
    settings
        .config_mut()
        .application_name("lethe")
        .connect_timeout(Duration::from_secs(10));
    let ms = timeout_ms.unwrap_or(30_000);
    if ms == 0 || ms > 3_600_000 {
        return Err(format!(
            "{what}statement_timeout_ms must be between 1 and 3600000"
        ));
    }
    Ok(ConnConfig {
        settings,
        statement_timeout: Duration::from_millis(ms),
    })
}

/// One lazily opened connection, reopened after an error. A clone shares the connection (an
/// adapter and its guard use one; calls take turns on its lock).
#[derive(Clone)]
pub(crate) struct Conn {
    target: String,
    config: ConnConfig,
    client: Arc<Mutex<Option<Client>>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("target", &self.target)
            .field("url", &self.config)
            .finish()
    }
}

impl Conn {
    /// The target this connection serves, for errors.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// The database this connection opens.
    pub(crate) fn database(&self) -> &str {
        self.config.settings.database()
    }

    pub(crate) fn new(target: &str, config: ConnConfig) -> Self {
        Self {
            target: target.to_string(),
            config,
            client: Arc::new(Mutex::new(None)),
        }
    }

    /// Runs `f` with a live connection. A connection-level error drops the connection so the
    /// next call reconnects.
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, AdapterError> {
        self.lock().run(f)
    }

    /// Holds the connection for several statements (a session of the SQL facade); other users
    /// of this connection (the guard) wait until it is dropped.
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked {
            conn: self,
            client: self.client.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Whether two handles share one connection.
    pub(crate) fn same(&self, other: &Conn) -> bool {
        Arc::ptr_eq(&self.client, &other.client)
    }

    /// Classifies a driver error: connection failures, timeouts, lock and serialization
    /// conflicts are worth retrying; the rest is not.
    pub(crate) fn err(&self, e: postgres::Error) -> AdapterError {
        let retryable = match e.code() {
            None => true, // connection refused, reset, closed: the server may come back
            Some(c) => {
                let s = c.code();
                s.starts_with("08") // connection exception
                    || s.starts_with("53") // insufficient resources
                    || s.starts_with("57") // operator intervention: query_canceled (statement timeout), admin shutdown
                    || s == "40001" || s == "40P01" || s == "55P03"
            }
        };
        let why = match e.as_db_error() {
            Some(_) => lethe_postgres::describe(&e),
            None => format!("{} at {:?}", lethe_postgres::describe(&e), self.config),
        };
        // 25006 read_only_sql_transaction: a standby, or default_transaction_read_only.
        if e.code().is_some_and(|c| c.code() == "25006") {
            return AdapterError::ReadOnly {
                target: self.target.clone(),
                why,
            };
        }
        if retryable {
            AdapterError::Unavailable {
                target: self.target.clone(),
                why,
            }
        } else {
            AdapterError::Failed {
                target: self.target.clone(),
                why,
            }
        }
    }
}

/// A connection held by one caller: [`Conn::lock`].
pub(crate) struct Locked<'a> {
    conn: &'a Conn,
    client: MutexGuard<'a, Option<Client>>,
}

impl Locked<'_> {
    /// Runs `f` with a live connection, connecting first if needed. A connection-level error
    /// drops the connection so the next call reconnects.
    pub(crate) fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, AdapterError> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            let config = &self.conn.config;
            let mut client = config.settings.connect().map_err(|e| self.conn.err(e))?;
            client
                .batch_execute(&format!(
                    "SET statement_timeout = {}",
                    config.statement_timeout.as_millis()
                ))
                .map_err(|e| self.conn.err(e))?;
            *self.client = Some(client);
        }
        let client = self.client.as_mut().expect("connected above");
        let out = f(client);
        if let Err(e) = &out {
            if e.is_closed() || e.as_db_error().is_none() {
                *self.client = None;
            }
        }
        out.map_err(|e| self.conn.err(e))
    }

    /// Whether a live connection is held (a rollback needs one; a lost one has none to undo).
    pub(crate) fn is_live(&self) -> bool {
        self.client.as_ref().is_some_and(|c| !c.is_closed())
    }

    /// The connection's target name, for errors.
    pub(crate) fn conn(&self) -> &Conn {
        self.conn
    }
}

/// Quotes an identifier from config: `name` or `schema.name`, each part in double quotes with
/// quotes doubled. A name holding a dot cannot be given.
pub(crate) fn quote_qualified(name: &str) -> String {
    name.split('.')
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// Escapes `\`, `%` and `_` for a LIKE pattern with `ESCAPE '\'`, so each matches only itself.
pub(crate) fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// What would make an erase or a count on `tables` (quoted, qualified names) reach beyond
/// them, or miss rows, checked before anything is read or deleted; `None` if nothing does.
/// `own_cascades` are `(child, parent)` foreign keys LangGraph itself declares (the store's
/// vectors), whose cascade is part of the target.
///
/// - A foreign key from another table with `ON DELETE CASCADE`, `SET NULL` or `SET DEFAULT`:
///   deleting a row of the scope would change a row of the application's, which may be another
///   person's, and no count would show it (`RESTRICT` and `NO ACTION` make the delete fail,
///   which changes nothing).
/// - A `DELETE` trigger or rule: it may do the same (the guard's triggers are on writes).
/// - Row-level security that applies to this connection's role: its reads would miss rows,
///   and a verify would certify them gone.
pub(crate) fn hidden_effects(
    c: &mut Client,
    tables: &[String],
    own_cascades: &[(String, String)],
) -> Result<Option<String>, postgres::Error> {
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    let (children, parents): (Vec<&str>, Vec<&str>) = own_cascades
        .iter()
        .map(|(ch, pa)| (ch.as_str(), pa.as_str()))
        .unzip();
    // Every check in one statement (one round trip and one plan, run about three times a
    // job), the first problem found in the order of the arms.
    let Some(r) = c.query_opt(HIDDEN_EFFECTS, &[&tables, &children, &parents])? else {
        return Ok(None);
    };
    let (kind, name): (i32, String) = (r.get(0), r.get(1));
    let (on, parent): (Option<String>, Option<String>) = (r.get(2), r.get(3));
    let on = on.unwrap_or_default();
    Ok(Some(match kind {
        1 => format!(
            "{name} is not a table (a view or a foreign table): an erase would delete through \
             it from tables Lethe cannot check. Point the target at the table itself"
        ),
        2 => format!(
            "foreign key {name} on {on} changes its rows when a row of {} is \
             deleted (ON DELETE CASCADE, SET NULL or SET DEFAULT): an erase would reach \
             rows outside the scope, uncounted. Make it RESTRICT or NO ACTION, or erase \
             that table as a target of its own",
            parent.unwrap_or_default()
        ),
        3 => format!(
            "trigger {name} on {on} runs on DELETE: an erase would run it, and what it \
             changes is not counted. Drop or disable it for Lethe's role, or erase what it \
             writes as a target of its own"
        ),
        4 => format!(
            "rule {name} on {on} rewrites DELETE: an erase would run it, and what it \
             changes is not counted. Drop it, or erase what it writes as a target of its own"
        ),
        _ => format!(
            "row-level security on {name} applies to this connection's role: its reads \
             would miss rows, and a verify would certify them gone. Connect as a role with \
             BYPASSRLS (or the table's owner, if the policy is not forced)"
        ),
    }))
}

/// [`hidden_effects`]' checks. `$1`: the tables; `$2`, `$3`: the (child, parent) pairs of the
/// target's own cascades. `tree` is the tables and every partition or inheritance child below
/// them: a DELETE on a parent deletes there too, and runs their triggers and their foreign
/// keys' actions. Each arm yields its first finding (kind, name, table,
/// parent); the statement, the first arm's.
const HIDDEN_EFFECTS: &str = "
WITH RECURSIVE tree(oid) AS (
        SELECT to_regclass(t)::oid FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NOT NULL
        UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid),
    found AS (
        -- A view (or a foreign table) deletes from tables its definition names, whose
        -- cascades and triggers these checks cannot see: only plain and partitioned tables.
        (SELECT 1 AS kind, to_regclass(t)::text AS name, NULL::text AS tbl, NULL::text AS parent
           FROM unnest($1::text[]) AS t JOIN pg_class c ON c.oid = to_regclass(t)
          WHERE c.relkind NOT IN ('r', 'p') ORDER BY 2 LIMIT 1)
        UNION ALL
        -- A foreign key that changes another table's rows on delete (not one of the target's own).
        (SELECT 2, con.conname::text, con.conrelid::regclass::text, con.confrelid::regclass::text
           FROM pg_constraint con
          WHERE con.contype = 'f' AND con.confdeltype IN ('c', 'n', 'd')
            AND con.confrelid IN (SELECT oid FROM tree)
            AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) AS o(ch, pa)
                             WHERE to_regclass(o.ch) = con.conrelid AND to_regclass(o.pa) = con.confrelid)
          ORDER BY con.conname LIMIT 1)
        UNION ALL
        -- A DELETE trigger.
        (SELECT 3, t.tgname::text, t.tgrelid::regclass::text, NULL
           FROM pg_trigger t
          WHERE NOT t.tgisinternal AND t.tgenabled <> 'D' AND (t.tgtype & 8) <> 0
            AND t.tgrelid IN (SELECT oid FROM tree)
          ORDER BY t.tgname LIMIT 1)
        UNION ALL
        -- A DELETE rule.
        (SELECT 4, r.rulename::text, r.ev_class::regclass::text, NULL
           FROM pg_rewrite r
          WHERE r.ev_type = '4' AND r.ev_class IN (SELECT oid FROM tree)
          ORDER BY r.rulename LIMIT 1)
        UNION ALL
        -- Row-level security that applies to this connection's role.
        (SELECT 5, c.oid::regclass::text, NULL, NULL
           FROM pg_class c, pg_roles me
          WHERE me.rolname = current_user AND c.oid IN (SELECT oid FROM tree) AND c.relrowsecurity
            AND NOT (me.rolsuper OR me.rolbypassrls)
            AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))
          ORDER BY 2 LIMIT 1))
SELECT kind, name, tbl, parent FROM found ORDER BY kind LIMIT 1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_escape_makes_metacharacters_literal() {
        assert_eq!(like_escape(r"a_b%c\d"), r"a\_b\%c\\d");
    }

    #[test]
    fn quoting_doubles_quotes_per_part() {
        assert_eq!(
            quote_qualified("public.thread_registry"),
            "\"public\".\"thread_registry\""
        );
        assert_eq!(quote_qualified("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn config_errors_name_the_field_and_hide_passwords() {
        let base = Path::new(".");
        let e = conn_config(
            "postgres://u@h/db?sslmode=allow",
            None,
            None,
            base,
            "registry.",
        )
        .unwrap_err();
        assert!(
            e.starts_with("registry.") && e.contains("sslmode=allow"),
            "{e}"
        );
        assert!(conn_config("mysql://h/db", None, None, base, "").is_err());
        let c = conn_config(
            "postgres://u:secret@h:5432/db?sslmode=verify-full",
            None,
            None,
            base,
            "",
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("secret"));
    }
}

/// What a LangGraph PostgreSQL target does about the dead row versions its erase leaves
/// (`dead_rows`): a deleted row's bytes stay in the table's pages (and its TOAST table's) until
/// VACUUM, or until a later access prunes the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadRows {
    /// Report them on the certificate's `physical` line: `PENDING`, at most the rows erased.
    Report,
    /// `VACUUM` the target's tables after the erase, then report the dead row versions the
    /// server's statistics still count in them (others' included).
    Vacuum,
}

impl DeadRows {
    /// `dead_rows = "report" | "vacuum"`.
    pub(crate) fn parse(s: Option<&str>) -> Result<Option<Self>, String> {
        match s {
            None => Ok(None),
            Some("report") => Ok(Some(DeadRows::Report)),
            Some("vacuum") => Ok(Some(DeadRows::Vacuum)),
            Some(_) => Err("dead_rows must be \"report\" or \"vacuum\"".into()),
        }
    }
}

/// The remedy a `PENDING` dead-rows line names.
const VACUUM_REMEDY: &str = "VACUUM the target's tables: until then, or until a later access \
     prunes their pages, the deleted rows' bytes stay in the table files as dead row versions \
     (autovacuum does it in time; dead_rows = \"vacuum\" does it after each erase)";

/// The physical line of a LangGraph PostgreSQL target over `tables` (`schema.table`, as
/// configured), after a job erased `erased` rows there. `Vacuum` runs `VACUUM` on each first:
/// a table Lethe's role may not vacuum is skipped by the server with a warning, and its dead
/// rows are then reported.
pub(crate) fn dead_rows(
    db: &crate::sql::Db,
    tables: &[String],
    erased: u64,
    mode: DeadRows,
) -> Result<crate::Physical, AdapterError> {
    use crate::sql::{Col, Param, Stmt};
    if erased == 0 {
        return Ok(crate::Physical {
            residue: 0,
            remedy: VACUUM_REMEDY,
        });
    }
    if mode == DeadRows::Report {
        return Ok(crate::Physical {
            residue: erased,
            remedy: VACUUM_REMEDY,
        });
    }
    let mut s = db.session()?;
    for t in tables {
        s.each(
            &Stmt::new(format!("VACUUM {}", quote_qualified(t))),
            &[],
            &[],
            |_| {},
        )?;
    }
    let names: Vec<String> = tables.to_vec();
    let row = s.one(
        &Stmt::new(
            "SELECT CAST(coalesce(sum(n_dead_tup), 0) AS BIGINT) FROM pg_stat_user_tables \
             WHERE schemaname || '.' || relname = ANY($1)",
        ),
        &[Param::Set(&names)],
        &[Col::Int],
    )?;
    Ok(crate::Physical {
        residue: row.count(0),
        remedy: VACUUM_REMEDY,
    })
}
