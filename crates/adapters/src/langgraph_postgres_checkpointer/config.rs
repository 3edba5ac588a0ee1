//! Config of a `langgraph-postgres-checkpointer` target.

use std::path::{Path, PathBuf};

use crate::postgres::{conn_config, quote_qualified, Conn};
use crate::registry::parse_table;
use lethe_core::Object;

use crate::langgraph::checkpointer::{Checkpointer, MetadataKeys, Registry};
use crate::postgres_guard::PgGuard;
use crate::sql::Db;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    password_file: Option<PathBuf>,
    statement_timeout_ms: Option<u64>,
    /// Schema of LangGraph's tables (default `public`).
    schema: Option<String>,
    // Objects only: a registry or metadata given as an array would name its columns by
    // position, the tenant's and the subject's swapped by one misordered export.
    registry: Option<Object<RawRegistry>>,
    metadata: Option<Object<RawMetadata>>,
    dead_rows: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    /// Defaults to the checkpointer's own database.
    url: Option<String>,
    password_file: Option<PathBuf>,
    table: String,
    tenant: String,
    subject: String,
    thread: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    tenant: String,
    subject: String,
}

/// A validated config.
pub struct Config {
    conn: crate::postgres::ConnConfig,
    schema: String,
    registry: Option<(Option<crate::postgres::ConnConfig>, RegistryNames)>,
    metadata: Option<MetadataKeys>,
    dead_rows: Option<crate::postgres::DeadRows>,
}

/// The registry's table and columns, as configured.
struct RegistryNames {
    table: String,
    tenant: String,
    subject: String,
    thread: String,
}

fn name(s: &str, what: &str) -> Result<String, String> {
    if s.is_empty() || s.chars().any(char::is_control) {
        return Err(format!("{what} must be a non-empty name"));
    }
    Ok(s.to_string())
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        if raw.registry.is_none() && raw.metadata.is_none() {
            return Err("give `registry`, `metadata` or both: without either, a subject's threads cannot be found".into());
        }
        let conn = conn_config(
            &raw.url,
            raw.password_file.as_deref(),
            raw.statement_timeout_ms,
            base,
            "",
        )?;
        let schema = name(raw.schema.as_deref().unwrap_or("public"), "schema")?;
        if schema.contains('.') {
            return Err("schema must not contain '.'".into());
        }
        let registry = match raw.registry.map(Object::into_inner) {
            Some(r) => {
                let rconn = match &r.url {
                    Some(u) => Some(conn_config(
                        u,
                        r.password_file.as_deref(),
                        raw.statement_timeout_ms,
                        base,
                        "registry.",
                    )?),
                    None if r.password_file.is_some() => {
                        return Err("registry.password_file needs registry.url".into())
                    }
                    None => None,
                };
                Some((
                    rconn,
                    RegistryNames {
                        table: name(&r.table, "registry.table")?,
                        tenant: name(&r.tenant, "registry.tenant")?,
                        subject: name(&r.subject, "registry.subject")?,
                        thread: name(&r.thread, "registry.thread")?,
                    },
                ))
            }
            None => None,
        };
        let metadata = match raw.metadata.map(Object::into_inner) {
            Some(m) => Some(MetadataKeys {
                tenant: name(&m.tenant, "metadata.tenant")?,
                subject: name(&m.subject, "metadata.subject")?,
            }),
            None => None,
        };
        Ok(Self {
            conn,
            schema,
            registry,
            metadata,
            dead_rows: crate::postgres::DeadRows::parse(raw.dead_rows.as_deref())?,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, target: &str) -> Checkpointer {
        let registry = self.registry.map(|(c, r)| Registry {
            db: c.map(|c| Db::Postgres(Box::new(Conn::new(target, c)))),
            table: r.table,
            tenant: r.tenant,
            subject: r.subject,
            thread: r.thread,
        });
        // The guard shares the adapter's connection: one connection a database, not two.
        let conn = Conn::new(target, self.conn);
        let guard = guard(target, conn.clone(), &self.schema, self.metadata.as_ref());
        let sql = super::sql::Postgres {
            quoted: quote_qualified(&self.schema),
            schema: self.schema,
        };
        Checkpointer::new(
            target,
            Db::Postgres(Box::new(conn)),
            Box::new(sql),
            registry,
            self.metadata,
            Some(guard),
        )
        .with_dead_rows(self.dead_rows)
    }
}

/// The database guard on LangGraph's tables.
fn guard(target: &str, conn: Conn, schema: &str, metadata: Option<&MetadataKeys>) -> PgGuard {
    // Trigger arguments: the metadata keys that hold the owner ('' when the target finds
    // threads through its registry only: erased threads are still refused).
    let (tk, sk) = metadata
        .map(|m| (m.tenant.clone(), m.subject.clone()))
        .unwrap_or_default();
    let args = vec![tk, sk];
    PgGuard::new(
        target,
        conn,
        schema,
        vec![
            ("checkpoints", "checkpoints_guard", args.clone()),
            ("checkpoint_blobs", "thread_rows_guard", args.clone()),
            ("checkpoint_writes", "thread_rows_guard", args),
        ],
        false,
    )
}
