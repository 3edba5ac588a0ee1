//! Config of a `langgraph-postgres-store` target.

use std::path::{Path, PathBuf};

use crate::namespace::{parse_template, Label};
use crate::postgres::{conn_config, Conn, ConnConfig};
use crate::registry::parse_table;

use super::adapter::Store;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    password_file: Option<PathBuf>,
    statement_timeout_ms: Option<u64>,
    /// Schema of LangGraph's tables (default `public`).
    schema: Option<String>,
    namespace: Vec<String>,
}

/// A validated config.
pub struct Config {
    conn: ConnConfig,
    schema: String,
    template: Vec<Label>,
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let schema = raw.schema.unwrap_or_else(|| "public".into());
        if schema.is_empty() || schema.contains('.') || schema.chars().any(char::is_control) {
            return Err("schema must be a non-empty name without '.'".into());
        }
        Ok(Self {
            conn: conn_config(
                &raw.url,
                raw.password_file.as_deref(),
                raw.statement_timeout_ms,
                base,
                "",
            )?,
            schema,
            template: parse_template(&raw.namespace)?,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Store {
        // The guard shares the adapter's connection: one connection a database, not two.
        let conn = Conn::new(name, self.conn);
        Store::new(name, conn.clone(), &self.schema, self.template, conn)
    }
}
