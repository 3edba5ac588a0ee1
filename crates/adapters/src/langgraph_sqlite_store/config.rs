//! Config of a `langgraph-sqlite-store` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::namespace::{parse_template, Label};
use crate::registry::{parse_table, resolve};

use crate::langgraph::store::Store;
use crate::sql::Db;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    path: PathBuf,
    busy_timeout_ms: Option<u64>,
    namespace: Vec<String>,
}

/// A validated config.
#[derive(Debug, Clone)]
pub struct Config {
    path: PathBuf,
    busy: Duration,
    template: Vec<Label>,
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        Ok(Self {
            path: resolve(base, &raw.path),
            busy: crate::sqlite::busy_timeout(raw.busy_timeout_ms)?,
            template: parse_template(&raw.namespace)?,
        })
    }

    /// Builds the adapter. Touches no file.
    pub fn build(self, name: &str) -> Store {
        let db = Db::Sqlite {
            target: name.to_string(),
            path: self.path,
            busy: self.busy,
        };
        Store::new(name, db, Box::new(super::sql::Sqlite), self.template, None)
    }
}
