//! Config of a `langgraph-sqlite-checkpointer` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::registry::{parse_table, resolve};
use lethe_core::Object;

use crate::langgraph::checkpointer::{Checkpointer, MetadataKeys, Registry};
use crate::sql::Db;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    path: PathBuf,
    busy_timeout_ms: Option<u64>,
    // Objects only: a registry or metadata given as an array would name its columns by
    // position, the tenant's and the subject's swapped by one misordered export.
    registry: Option<Object<RawRegistry>>,
    metadata: Option<Object<RawMetadata>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    /// Defaults to the checkpointer's own file.
    path: Option<PathBuf>,
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
#[derive(Debug, Clone)]
pub struct Config {
    path: PathBuf,
    busy: Duration,
    registry: Option<RegistryConfig>,
    metadata: Option<MetadataKeys>,
}

/// The registry's file and names.
#[derive(Debug, Clone)]
struct RegistryConfig {
    path: PathBuf,
    table: String,
    tenant: String,
    subject: String,
    thread: String,
}

/// Checks a key can be one top-level key of a JSON path, quoted so dots and brackets in the key
/// stay part of the key.
fn json_path(key: &str, what: &str) -> Result<(), String> {
    if key.is_empty() || key.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        return Err(format!(
            "metadata.{what} must be a non-empty key without '\"', '\\' or control characters"
        ));
    }
    Ok(())
}

fn sql_name(name: &str, what: &str) -> Result<String, String> {
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(format!("registry.{what} must be a non-empty name"));
    }
    Ok(name.to_string())
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        if raw.registry.is_none() && raw.metadata.is_none() {
            return Err("give `registry`, `metadata` or both: without either, a subject's threads cannot be found".into());
        }
        let path = resolve(base, &raw.path);
        let registry = match raw.registry.map(Object::into_inner) {
            Some(r) => Some(RegistryConfig {
                path: r
                    .path
                    .map(|p| resolve(base, &p))
                    .unwrap_or_else(|| path.clone()),
                table: sql_name(&r.table, "table")?,
                tenant: sql_name(&r.tenant, "tenant")?,
                subject: sql_name(&r.subject, "subject")?,
                thread: sql_name(&r.thread, "thread")?,
            }),
            None => None,
        };
        let metadata = match raw.metadata.map(Object::into_inner) {
            Some(m) => {
                json_path(&m.tenant, "tenant")?;
                json_path(&m.subject, "subject")?;
                Some(MetadataKeys {
                    tenant: m.tenant,
                    subject: m.subject,
                })
            }
            None => None,
        };
        Ok(Self {
            path,
            busy: crate::sqlite::busy_timeout(raw.busy_timeout_ms)?,
            registry,
            metadata,
        })
    }

    /// Builds the adapter. Touches no file.
    pub fn build(self, name: &str) -> Checkpointer {
        let db = |path| Db::Sqlite {
            target: name.to_string(),
            path,
            busy: self.busy,
        };
        // The registry always has a file of its own (maybe the checkpointer's): its rows are
        // erased in a transaction of their own, and the file is one the journal must not share.
        let registry = self.registry.map(|r| Registry {
            db: Some(db(r.path)),
            table: r.table,
            tenant: r.tenant,
            subject: r.subject,
            thread: r.thread,
        });
        Checkpointer::new(
            name,
            db(self.path),
            Box::new(super::sql::Sqlite),
            registry,
            self.metadata,
            None,
        )
    }
}
