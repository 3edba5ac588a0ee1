//! Config of a `chroma` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;

use crate::registry::{parse_table, read_secret, resolve};

use super::adapter::{Chroma, Keys};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    tenant: Option<String>,
    database: Option<String>,
    collection: String,
    // An object only: given as an array, the tenant's and the subject's keys would be named by
    // position, swapped by one misordered export.
    metadata: Object<RawMetadata>,
    memory: Option<String>,
    api_key_file: Option<PathBuf>,
    path: Option<PathBuf>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    timeout_ms: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    tenant: String,
    subject: String,
}

/// Chroma's default tenant and database.
pub(crate) const DEFAULT_TENANT: &str = "default_tenant";
pub(crate) const DEFAULT_DATABASE: &str = "default_database";
/// The most ids one request carries (Chroma's own `max_batch_size` is larger).
const MAX_BATCH: usize = 5_000;

/// A validated config.
pub struct Config {
    url: String,
    tenant: String,
    database: String,
    collection: String,
    keys: Keys,
    token: Option<String>,
    path: Option<PathBuf>,
    batch: usize,
    in_flight: usize,
    timeout: Duration,
}

/// A metadata key Chroma filters by as a plain key: not an operator (`$...`), not one of its
/// own keys (`#document`, `chroma:document`).
fn metadata_key(key: &str, what: &str) -> Result<String, String> {
    if key.is_empty()
        || key.starts_with('$')
        || key.starts_with('#')
        || key.starts_with("chroma:")
        || key.chars().any(char::is_control)
    {
        return Err(format!(
            "{what} must be a non-empty metadata key that does not start with '$' (an operator), '#' or \"chroma:\" (Chroma's own keys)"
        ));
    }
    Ok(key.to_string())
}

/// A tenant, database or collection name as it goes into the URL's path: Chroma's own name
/// characters only, so nothing needs escaping.
fn path_name(name: &str, what: &str) -> Result<String, String> {
    if name.is_empty()
        || name.len() > 512
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "{what} must be 1 to 512 characters of A-Z, a-z, 0-9, '.', '_' and '-' (Chroma's name characters)"
        ));
    }
    Ok(name.to_string())
}

impl Config {
    /// Parses and validates the kind-specific keys; reads `api_key_file`, connects to nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let url = raw.url.trim_end_matches('/').to_string();
        let Some(rest) = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
        else {
            return Err("url must be http://host:port or https://host:port".into());
        };
        if rest.is_empty() || rest.contains(['/', '?', '#', '@']) || rest.chars().any(char::is_whitespace) {
            return Err("url must be http://host:port or https://host:port, without a path, a query or credentials (the token goes in api_key_file)".into());
        }
        let tenant = path_name(raw.tenant.as_deref().unwrap_or(DEFAULT_TENANT), "tenant")?;
        let database = path_name(raw.database.as_deref().unwrap_or(DEFAULT_DATABASE), "database")?;
        let collection = path_name(&raw.collection, "collection")?;
        let m = raw.metadata.into_inner();
        let keys = Keys {
            tenant: metadata_key(&m.tenant, "metadata.tenant")?,
            subject: metadata_key(&m.subject, "metadata.subject")?,
            memory: raw
                .memory
                .as_deref()
                .map(|k| metadata_key(k, "memory"))
                .transpose()?,
        };
        if keys.tenant == keys.subject || keys.memory.as_ref().is_some_and(|k| *k == keys.tenant || *k == keys.subject) {
            return Err("metadata.tenant, metadata.subject and memory must be three different keys".into());
        }
        let token = raw
            .api_key_file
            .map(|p| read_secret(base, &p, "api_key_file"))
            .transpose()?;
        let batch = raw.batch_size.unwrap_or(1_000);
        if batch == 0 || batch > MAX_BATCH {
            return Err(format!("batch_size must be between 1 and {MAX_BATCH}"));
        }
        let timeout = Duration::from_millis(raw.timeout_ms.unwrap_or(30_000));
        if timeout.is_zero() {
            return Err("timeout_ms must be more than 0".into());
        }
        Ok(Self {
            url,
            tenant,
            database,
            collection,
            keys,
            token,
            path: raw.path.map(|p| resolve(base, &p)),
            batch,
            in_flight: crate::http::client::max_in_flight(raw.max_in_flight)?,
            timeout,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Chroma {
        Chroma::new(
            name,
            &self.url,
            self.tenant,
            self.database,
            self.collection,
            self.keys,
            self.token,
            self.path,
            self.batch,
            self.timeout,
        )
        .with_max_in_flight(self.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        let text = format!(
            "url = \"http://127.0.0.1:8765\"\ncollection = \"memories\"\n{extra}\n"
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    const META: &str = "metadata = { tenant = \"tenant_id\", subject = \"user_id\" }";

    #[test]
    fn defaults_and_bad_values() {
        let c = parse(META).unwrap();
        assert_eq!((c.tenant.as_str(), c.database.as_str()), (DEFAULT_TENANT, DEFAULT_DATABASE));
        assert_eq!(c.batch, 1_000);
        assert!(c.keys.memory.is_none() && c.token.is_none() && c.path.is_none());
        for (extra, says) in [
            ("", "metadata"),
            ("metadata = [\"tenant_id\", \"user_id\"]", "object"),
            ("metadata = { tenant = \"$and\", subject = \"user_id\" }", "metadata.tenant"),
            ("metadata = { tenant = \"t\", subject = \"#document\" }", "metadata.subject"),
            ("metadata = { tenant = \"t\", subject = \"chroma:document\" }", "metadata.subject"),
            ("metadata = { tenant = \"t\", subject = \"t\" }", "different"),
            ("metadata = { tenant = \"t\", subject = \"s\", memory = \"m\" }", "unknown field"),
            ("memory = \"tenant_id\"", "different"),
            ("memory = \"$in\"", "memory"),
            ("tenant = \"a/b\"", "tenant"),
            ("database = \"\"", "database"),
            ("batch_size = 0", "batch_size"),
            ("batch_size = 5001", "batch_size"),
            ("timeout_ms = 0", "timeout_ms"),
            ("api_key = \"secret\"", "unknown field"),
            ("api_key_file = \"/nonexistent/lethe-chroma-token\"", "api_key_file"),
        ] {
            let text = if extra.starts_with("metadata") || extra.is_empty() {
                extra.to_string()
            } else {
                format!("{META}\n{extra}")
            };
            let e = parse(&text).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for url in ["ftp://h:1", "http://", "http://u:p@h:1", "http://h:1/api", "http://h:1?x=1"] {
            let text = format!("url = \"{url}\"\ncollection = \"c\"\n{META}\n");
            let e = Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(e.contains("url"), "{url}: {e}");
        }
        let e = parse(&format!("{META}\ncollection2 = \"x\"")).err().unwrap();
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn the_token_is_read_from_a_private_file_and_never_shown() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "s3cr3t-token\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = format!("{META}\napi_key_file = \"{}\"", f.display());
        let e = parse(&text).err().unwrap();
        assert!(e.contains("chmod 600") && !e.contains("s3cr3t"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = parse(&text).unwrap();
        assert_eq!(c.token.as_deref(), Some("s3cr3t-token"));
    }
}
