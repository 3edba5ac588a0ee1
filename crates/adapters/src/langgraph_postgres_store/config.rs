//! Config of a `langgraph-postgres-store` target.

use std::path::{Path, PathBuf};

use crate::namespace::{parse_template, Label};
use crate::postgres::{conn_config, quote_qualified, Conn, ConnConfig};
use crate::postgres_guard::PgGuard;
use crate::sql::Db;
use crate::registry::parse_table;

use crate::langgraph::store::Store;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    password_file: Option<PathBuf>,
    statement_timeout_ms: Option<u64>,
    /// Schema of LangGraph's tables (default `public`).
    schema: Option<String>,
    namespace: Vec<String>,
    dead_rows: Option<String>,
}

/// A validated config.
pub struct Config {
    conn: ConnConfig,
    schema: String,
    template: Vec<Label>,
    dead_rows: Option<crate::postgres::DeadRows>,
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
            dead_rows: crate::postgres::DeadRows::parse(raw.dead_rows.as_deref())?,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Store {
        // The guard shares the adapter's connection: one connection a database, not two.
        let conn = Conn::new(name, self.conn);
        // Trigger arguments: the template's labels, as the trigger reads `prefix` with them.
        let args = self
            .template
            .iter()
            .map(|l| match l {
                Label::Tenant => "{tenant}".to_string(),
                Label::Subject => "{subject}".to_string(),
                Label::Literal(s) => s.clone(),
            })
            .collect();
        let guard = PgGuard::new(
            name,
            conn.clone(),
            &self.schema,
            vec![("store", "store_guard", args)],
            true,
        );
        let sql = super::sql::Postgres {
            quoted: quote_qualified(&self.schema),
            schema: self.schema,
        };
        Store::new(
            name,
            Db::Postgres(Box::new(conn)),
            Box::new(sql),
            self.template,
            Some(guard),
        )
        .with_dead_rows(self.dead_rows)
    }
}
