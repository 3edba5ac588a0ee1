//! Config of a `langgraph-postgres-checkpointer` target.

use std::path::{Path, PathBuf};

use crate::postgres::{conn_config, Conn};
use crate::registry::parse_table;
use lethe_core::Object;

use super::adapter::{Checkpointer, MetadataKeys, Registry};

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
    registry: Option<(Option<crate::postgres::ConnConfig>, Registry)>,
    metadata: Option<MetadataKeys>,
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
                    Registry {
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
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, target: &str) -> Checkpointer {
        let registry = self
            .registry
            .map(|(c, r)| (c.map(|c| Conn::new(target, c)), r));
        // The guard shares the adapter's connection: one connection a database, not two.
        let conn = Conn::new(target, self.conn);
        Checkpointer::new(
            target,
            conn.clone(),
            self.schema,
            registry,
            self.metadata,
            conn,
        )
    }
}
