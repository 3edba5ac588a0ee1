//! What the PostgreSQL adapters share: connection settings from config, one cached connection
//! per target, error classification, identifier quoting and LIKE escaping.
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
        let mut guard: MutexGuard<'_, Option<Client>> =
            self.client.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            let mut client = self.config.settings.connect().map_err(|e| self.err(e))?;
            client
                .batch_execute(&format!(
                    "SET statement_timeout = {}",
                    self.config.statement_timeout.as_millis()
                ))
                .map_err(|e| self.err(e))?;
            *guard = Some(client);
        }
        let client = guard.as_mut().expect("connected above");
        let out = f(client);
        if let Err(e) = &out {
            if e.is_closed() || e.as_db_error().is_none() {
                *guard = None;
            }
        }
        out.map_err(|e| self.err(e))
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
    // The tables and every partition or inheritance child below them: a DELETE on a parent
    // deletes there too, and runs their triggers and their foreign keys' actions (review,
    // 2026-12-04).
    const OIDS: &str = "WITH RECURSIVE tree(oid) AS (
            SELECT to_regclass(t)::oid FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NOT NULL
            UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid)
        SELECT oid FROM tree";
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    // A view (or a foreign table) deletes from tables its definition names, whose cascades and
    // triggers these checks cannot see: only plain and partitioned tables are erased.
    if let Some(r) = c
        .query(
            "SELECT to_regclass(t)::text FROM unnest($1::text[]) AS t
              JOIN pg_class c ON c.oid = to_regclass(t)
             WHERE c.relkind NOT IN ('r', 'p') ORDER BY 1 LIMIT 1",
            &[&tables],
        )?
        .first()
    {
        let name: String = r.get(0);
        return Ok(Some(format!(
            "{name} is not a table (a view or a foreign table): an erase would delete through \
             it from tables Lethe cannot check. Point the target at the table itself"
        )));
    }
    for r in c.query(
        &format!(
            "SELECT con.conname, con.conrelid::regclass::text, con.confrelid::regclass::text
               FROM pg_constraint con
              WHERE con.contype = 'f' AND con.confdeltype IN ('c', 'n', 'd')
                AND con.confrelid IN ({OIDS})
              ORDER BY 1"
        ),
        &[&tables],
    )? {
        let (name, child, parent): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        let own = own_cascades.iter().any(|(ch, pa)| {
            c.query_one(
                "SELECT to_regclass($1) = to_regclass($3) AND to_regclass($2) = to_regclass($4)",
                &[ch, pa, &child, &parent],
            )
            .map(|r| r.get::<_, Option<bool>>(0) == Some(true))
            .unwrap_or(false)
        });
        if !own {
            return Ok(Some(format!(
                "foreign key {name} on {child} changes its rows when a row of {parent} is \
                 deleted (ON DELETE CASCADE, SET NULL or SET DEFAULT): an erase would reach \
                 rows outside the scope, uncounted. Make it RESTRICT or NO ACTION, or erase \
                 that table as a target of its own"
            )));
        }
    }
    if let Some(r) = c
        .query(
            &format!(
                "SELECT t.tgname, t.tgrelid::regclass::text FROM pg_trigger t
                  WHERE NOT t.tgisinternal AND t.tgenabled <> 'D' AND (t.tgtype & 8) <> 0
                    AND t.tgrelid IN ({OIDS})
                  ORDER BY 1 LIMIT 1"
            ),
            &[&tables],
        )?
        .first()
    {
        let (name, table): (String, String) = (r.get(0), r.get(1));
        return Ok(Some(format!(
            "trigger {name} on {table} runs on DELETE: an erase would run it, and what it \
             changes is not counted. Drop or disable it for Lethe's role, or erase what it \
             writes as a target of its own"
        )));
    }
    if let Some(r) = c
        .query(
            &format!(
                "SELECT r.rulename, r.ev_class::regclass::text FROM pg_rewrite r
                  WHERE r.ev_type = '4' AND r.ev_class IN ({OIDS})
                  ORDER BY 1 LIMIT 1"
            ),
            &[&tables],
        )?
        .first()
    {
        let (name, table): (String, String) = (r.get(0), r.get(1));
        return Ok(Some(format!(
            "rule {name} on {table} rewrites DELETE: an erase would run it, and what it \
             changes is not counted. Drop it, or erase what it writes as a target of its own"
        )));
    }
    if let Some(r) = c
        .query(
            &format!(
                "SELECT c.oid::regclass::text FROM pg_class c, pg_roles me
                  WHERE me.rolname = current_user AND c.oid IN ({OIDS}) AND c.relrowsecurity
                    AND NOT (me.rolsuper OR me.rolbypassrls)
                    AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))
                  ORDER BY 1 LIMIT 1"
            ),
            &[&tables],
        )?
        .first()
    {
        let table: String = r.get(0);
        return Ok(Some(format!(
            "row-level security on {table} applies to this connection's role: its reads \
             would miss rows, and a verify would certify them gone. Connect as a role with \
             BYPASSRLS (or the table's owner, if the policy is not forced)"
        )));
    }
    Ok(None)
}

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
