//! Config of a `langgraph-redis-cache` target.

use std::path::{Path, PathBuf};

use crate::redis::config::{Connection, ConnectionKeys};
use crate::redis::layout::{prefixes_overlap, Template};
use crate::registry::parse_table;

use super::adapter::{Legacy, NodeCache};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: Option<String>,
    nodes: Option<Vec<String>>,
    password_file: Option<PathBuf>,
    tls_ca_file: Option<PathBuf>,
    db: Option<u32>,
    timeout_ms: Option<u64>,
    /// `RedisCache(prefix=...)`.
    prefix: Option<String>,
    index: Option<String>,
    legacy: Option<String>,
    scan_count: Option<u32>,
}

/// LangGraph's default `RedisCache` prefix.
pub(crate) const DEFAULT_PREFIX: &str = "langgraph:cache:";
/// The subject index `Gate.cache(...)` of the Python package writes by default.
pub(crate) const DEFAULT_INDEX: &str = "lethe:lg-cache:{tenant}:{subject}";

/// A validated config.
pub struct Config {
    connection: Connection,
    prefix: String,
    index: Template,
    legacy: Legacy,
    scan_count: u32,
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let connection = Connection::parse(
            ConnectionKeys {
                url: raw.url,
                nodes: raw.nodes,
                password_file: raw.password_file,
                tls_ca_file: raw.tls_ca_file,
                db: raw.db,
                timeout_ms: raw.timeout_ms,
            },
            base,
        )?;
        let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_string());
        if prefix.is_empty() {
            return Err("`prefix` must not be empty: it is what tells cache entries from every other key".into());
        }
        let index = Template::parse(
            raw.index.as_deref().unwrap_or(DEFAULT_INDEX),
            "index",
            false,
            &["tenant", "subject"],
        )?;
        if index.literal_prefix().is_empty() {
            return Err("`index` must start with literal text (as lethe:lg-cache:{tenant}:{subject} does): every index set is found by it".into());
        }
        if prefixes_overlap(index.literal_prefix(), &prefix) {
            return Err(format!(
                "`index` ({}) and `prefix` ({prefix}) overlap: an index set would look like a cache entry",
                index.text()
            ));
        }
        let legacy = match raw.legacy.as_deref().unwrap_or("refuse") {
            "refuse" => Legacy::Refuse,
            "flush" => Legacy::Flush,
            "expire" => Legacy::Expire,
            other => {
                return Err(format!(
                    "legacy must be \"refuse\" (block the job, the default), \"flush\" (erase every legacy entry) or \"expire\" (wait for their TTL), not \"{other}\""
                ))
            }
        };
        let scan_count = raw.scan_count.unwrap_or(100);
        if scan_count == 0 || scan_count > 100_000 {
            return Err("scan_count must be between 1 and 100000".into());
        }
        Ok(Self {
            connection,
            prefix,
            index,
            legacy,
            scan_count,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> NodeCache {
        NodeCache::new(
            name,
            self.connection,
            self.prefix,
            self.index,
            self.legacy,
            self.scan_count,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        let text = format!("url = \"redis://127.0.0.1\"\n{extra}");
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    #[test]
    fn defaults_and_bad_values() {
        let c = parse("").unwrap();
        assert_eq!(c.prefix, DEFAULT_PREFIX);
        assert_eq!(c.legacy, Legacy::Refuse, "refuse is the default");
        assert_eq!(parse("legacy = \"flush\"").unwrap().legacy, Legacy::Flush);
        assert_eq!(parse("legacy = \"expire\"").unwrap().legacy, Legacy::Expire);
        for (extra, says) in [
            ("legacy = \"guess\"", "refuse"),
            ("prefix = \"\"", "empty"),
            ("index = \"{tenant}:{subject}\"", "literal"),
            ("index = \"langgraph:cache:idx:{tenant}:{subject}\"", "overlap"),
            ("index = \"idx:{tenant}\"", "subject"),
            ("index = \"idx:{tenant}:{subject}:*\"", "glob"),
            ("scan_count = 0", "scan_count"),
            ("pattern = \"{tenant}:*\"", "unknown field"),
        ] {
            let e = parse(extra).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
    }
}
