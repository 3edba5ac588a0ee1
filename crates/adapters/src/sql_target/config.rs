//! Config of a `sql` target: where the table is, and its declared statements.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::postgres::{conn_config, Conn, ConnConfig};
use crate::registry::{parse_table, resolve};
use crate::sql::Db;

use super::adapter::{SqlTarget, Statements};
use super::statement::{parse, Engine, Name, Parsed};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: Option<String>,
    password_file: Option<PathBuf>,
    statement_timeout_ms: Option<u64>,
    path: Option<PathBuf>,
    busy_timeout_ms: Option<u64>,
    table: String,
    locate: String,
    erase: String,
    verify: String,
    locate_memory: Option<String>,
    verify_memory: Option<String>,
    locate_tenant: Option<String>,
    verify_tenant: Option<String>,
}

/// Where the table is.
enum Place {
    Sqlite { path: PathBuf, busy: Duration },
    Postgres(Box<ConnConfig>),
}

/// A validated config.
pub struct Config {
    place: Place,
    table: String,
    statements: Statements,
}

/// Which scope kind a statement serves: the parameters it may use, and those it must.
#[derive(Clone, Copy)]
enum Serves {
    Subject,
    Memory,
    Tenant,
}

impl Serves {
    fn what(self) -> &'static str {
        match self {
            Serves::Subject => "a subject scope",
            Serves::Memory => "a memory scope",
            Serves::Tenant => "a tenant scope",
        }
    }

    fn gives(self) -> &'static [Name] {
        match self {
            Serves::Subject => &[Name::Tenant, Name::Subject],
            Serves::Memory => &[Name::Tenant, Name::Subject, Name::MemoryId, Name::Version],
            Serves::Tenant => &[Name::Tenant],
        }
    }

    /// Without one of these the statement would reach beyond its scope. `:version` may be left
    /// out (a table that keeps no versions: every version of the memory goes).
    fn needs(self) -> &'static [Name] {
        match self {
            Serves::Subject => &[Name::Tenant, Name::Subject],
            Serves::Memory => &[Name::Tenant, Name::Subject, Name::MemoryId],
            Serves::Tenant => &[Name::Tenant],
        }
    }
}

fn read(key: &str, sql: &str, engine: Engine, serves: Serves) -> Result<Parsed, String> {
    let p = parse(sql, engine).map_err(|e| format!("`{key}` {e}"))?;
    p.check_read().map_err(|e| format!("`{key}` {e}"))?;
    for n in &p.params {
        if !serves.gives().contains(n) {
            return Err(format!(
                "`{key}` uses :{}, which {} does not give (it has {})",
                n.as_str(),
                serves.what(),
                list(serves.gives())
            ));
        }
    }
    for n in serves.needs() {
        if !p.params.contains(n) {
            return Err(format!(
                "`{key}` does not use :{}: it would reach beyond {} (use {})",
                n.as_str(),
                serves.what(),
                list(serves.needs())
            ));
        }
    }
    Ok(p)
}

fn list(names: &[Name]) -> String {
    names
        .iter()
        .map(|n| format!(":{}", n.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Both keys of a pair, or neither.
fn pair(
    keys: (&str, &str),
    sqls: (Option<String>, Option<String>),
    engine: Engine,
    serves: Serves,
) -> Result<Option<(Parsed, Parsed)>, String> {
    match sqls {
        (None, None) => Ok(None),
        (Some(l), Some(v)) => Ok(Some((
            read(keys.0, &l, engine, serves)?,
            read(keys.1, &v, engine, serves)?,
        ))),
        _ => Err(format!(
            "give `{}` and `{}` together, or neither",
            keys.0, keys.1
        )),
    }
}

impl Config {
    /// Parses and validates the kind-specific keys, the statements' form included.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let place = match (&raw.url, &raw.path) {
            (Some(url), None) => {
                if raw.busy_timeout_ms.is_some() {
                    return Err("busy_timeout_ms is for a SQLite `path`; a `url` takes statement_timeout_ms".into());
                }
                Place::Postgres(Box::new(conn_config(
                    url,
                    raw.password_file.as_deref(),
                    raw.statement_timeout_ms,
                    base,
                    "",
                )?))
            }
            (None, Some(path)) => {
                if raw.password_file.is_some() || raw.statement_timeout_ms.is_some() {
                    return Err("password_file and statement_timeout_ms are for a PostgreSQL `url`, not a SQLite `path`".into());
                }
                Place::Sqlite {
                    path: resolve(base, path),
                    busy: crate::sqlite::busy_timeout(raw.busy_timeout_ms)?,
                }
            }
            _ => {
                return Err(
                    "give `url` (PostgreSQL) or `path` (an existing SQLite file), one of them"
                        .into(),
                )
            }
        };
        let engine = match place {
            Place::Sqlite { .. } => Engine::Sqlite,
            Place::Postgres(_) => Engine::Postgres,
        };
        let table = raw.table;
        let parts = table.split('.').count();
        if table.is_empty()
            || table.chars().any(char::is_control)
            || table.split('.').any(str::is_empty)
            || (engine == Engine::Postgres && parts > 2)
        {
            return Err(
                "`table` must be a table name (`schema.name` or `name` on PostgreSQL)".into(),
            );
        }
        let locate = read("locate", &raw.locate, engine, Serves::Subject)?;
        let verify = read("verify", &raw.verify, engine, Serves::Subject)?;
        let memory = pair(
            ("locate_memory", "verify_memory"),
            (raw.locate_memory, raw.verify_memory),
            engine,
            Serves::Memory,
        )?;
        let tenant = pair(
            ("locate_tenant", "verify_tenant"),
            (raw.locate_tenant, raw.verify_tenant),
            engine,
            Serves::Tenant,
        )?;
        let erase = parse(&raw.erase, engine).map_err(|e| format!("`erase` {e}"))?;
        erase
            .check_delete(&table, engine)
            .map_err(|e| format!("`erase` {e}"))?;
        // Every scope the target serves must give what the erase uses.
        let mut gives = vec![Name::Locator, Name::Tenant];
        if tenant.is_none() {
            gives.push(Name::Subject);
        }
        for n in &erase.params {
            if !gives.contains(n) {
                return Err(format!(
                    "`erase` uses :{}, which not every scope this target serves gives (it may use {})",
                    n.as_str(),
                    list(&gives)
                ));
            }
        }
        if !erase.params.contains(&Name::Locator) {
            return Err(
                "`erase` does not use :locator: it must delete by the locator `locate` returned"
                    .into(),
            );
        }
        Ok(Self {
            place,
            table,
            statements: Statements {
                locate,
                verify,
                erase,
                memory,
                tenant,
            },
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> SqlTarget {
        let db = match self.place {
            Place::Sqlite { path, busy } => Db::Sqlite {
                target: name.to_string(),
                path,
                busy,
            },
            Place::Postgres(c) => Db::Postgres(Box::new(Conn::new(name, *c))),
        };
        SqlTarget::new(name, db, self.table, self.statements)
    }
}
