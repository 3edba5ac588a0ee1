//! Config of a `backup-files` target.

use std::path::{Path, PathBuf};

use crate::backup::Retention;
use crate::registry::{parse_table, resolve};

use super::adapter::BackupFiles;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    path: PathBuf,
    pattern: Option<String>,
    retention_days: i64,
    covers: Vec<String>,
}

/// A validated config.
pub struct Config {
    path: PathBuf,
    pattern: String,
    retention: Retention,
}

impl Config {
    /// Parses and validates the kind-specific keys; reads nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let pattern = raw.pattern.unwrap_or_else(|| "*".into());
        if pattern.is_empty() || pattern.contains('/') || pattern.chars().any(char::is_control) {
            return Err(
                "pattern must be a file name pattern (`*` and `?` as wildcards), without '/'"
                    .into(),
            );
        }
        Ok(Self {
            path: resolve(base, &raw.path),
            pattern,
            retention: Retention::new(raw.retention_days, raw.covers)?,
        })
    }

    /// The adapter.
    pub fn build(self, name: &str) -> BackupFiles {
        BackupFiles {
            name: name.to_string(),
            path: self.path,
            pattern: self.pattern,
            retention: self.retention,
        }
    }
}
