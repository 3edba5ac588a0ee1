//! Config of a `phoenix` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;

use crate::registry::{parse_table, read_secret, resolve};

use super::adapter::{Keys, Phoenix};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    project: String,
    // An object only: given as an array, the tenant's and the subject's keys would be named by
    // position, swapped by one misordered export.
    metadata: Object<RawMetadata>,
    api_key_file: Option<PathBuf>,
    path: Option<PathBuf>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    timeout_ms: Option<u64>,
    verify_timeout_ms: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    tenant: String,
    subject: String,
}

/// Phoenix's largest page of spans.
const MAX_BATCH: usize = 1_000;

/// A validated config.
pub struct Config {
    url: String,
    project: String,
    keys: Keys,
    token: Option<String>,
    path: Option<PathBuf>,
    batch: usize,
    in_flight: usize,
    timeout: Duration,
    verify_timeout: Duration,
}

/// A key inside the `metadata` attribute. Phoenix answers a span's attributes flattened with
/// dots (`metadata.user_id`), so a key holding a dot would be ambiguous with a nested one.
fn metadata_key(key: &str, what: &str) -> Result<String, String> {
    if key.is_empty() || key.contains('.') || key.chars().any(char::is_control) {
        return Err(format!(
            "{what} must be a non-empty key of the spans' `metadata` attribute, without '.' (Phoenix shows nested keys with dots)"
        ));
    }
    Ok(key.to_string())
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
        if rest.is_empty()
            || rest.contains(['/', '?', '#', '@'])
            || rest.chars().any(char::is_whitespace)
        {
            return Err("url must be http://host:port or https://host:port, without a path, a query or credentials (the key goes in api_key_file)".into());
        }
        // Phoenix takes a project by name in the path, and refuses names with these.
        if raw.project.is_empty()
            || raw.project.contains(['/', '?', '#'])
            || raw.project.chars().any(char::is_control)
        {
            return Err(
                "project must be a Phoenix project's name: non-empty, without '/', '?', '#' or control characters".into(),
            );
        }
        let m = raw.metadata.into_inner();
        let keys = Keys {
            tenant: metadata_key(&m.tenant, "metadata.tenant")?,
            subject: metadata_key(&m.subject, "metadata.subject")?,
        };
        if keys.tenant == keys.subject {
            return Err("metadata.tenant and metadata.subject must be two different keys".into());
        }
        let token = raw
            .api_key_file
            .map(|p| read_secret(base, &p, "api_key_file"))
            .transpose()?;
        let batch = raw.batch_size.unwrap_or(500);
        if batch == 0 || batch > MAX_BATCH {
            return Err(format!("batch_size must be between 1 and {MAX_BATCH}"));
        }
        let timeout = Duration::from_millis(raw.timeout_ms.unwrap_or(30_000));
        if timeout.is_zero() {
            return Err("timeout_ms must be more than 0".into());
        }
        let verify_timeout = Duration::from_millis(raw.verify_timeout_ms.unwrap_or(10_000));
        Ok(Self {
            url,
            project: raw.project,
            keys,
            token,
            path: raw.path.map(|p| resolve(base, &p)),
            batch,
            in_flight: crate::http::client::max_in_flight(raw.max_in_flight)?,
            timeout,
            verify_timeout,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Phoenix {
        Phoenix::new(
            name,
            &self.url,
            self.project,
            self.keys,
            self.token,
            self.path,
            self.batch,
            self.timeout,
            self.verify_timeout,
        )
        .with_max_in_flight(self.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        let text = format!("url = \"http://127.0.0.1:6007\"\nproject = \"agents\"\n{extra}\n");
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    const META: &str = "metadata = { tenant = \"tenant_id\", subject = \"user_id\" }";

    #[test]
    fn defaults_and_bad_values() {
        let c = parse(META).unwrap();
        assert_eq!(c.batch, 500);
        assert_eq!(c.verify_timeout, Duration::from_secs(10));
        assert!(c.token.is_none() && c.path.is_none());
        for (extra, says) in [
            ("", "metadata"),
            ("metadata = [\"tenant_id\", \"user_id\"]", "object"),
            ("metadata = { tenant = \"a.b\", subject = \"user_id\" }", "metadata.tenant"),
            ("metadata = { tenant = \"t\", subject = \"\" }", "metadata.subject"),
            ("metadata = { tenant = \"t\", subject = \"t\" }", "different"),
            ("metadata = { tenant = \"t\", subject = \"s\", memory = \"m\" }", "unknown field"),
            ("batch_size = 0", "batch_size"),
            ("batch_size = 1001", "batch_size"),
            ("timeout_ms = 0", "timeout_ms"),
            ("api_key = \"secret\"", "unknown field"),
            ("api_key_file = \"/nonexistent/lethe-phoenix-key\"", "api_key_file"),
        ] {
            let text = if extra.starts_with("metadata") || extra.is_empty() {
                extra.to_string()
            } else {
                format!("{META}\n{extra}")
            };
            let e = parse(&text).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for url in ["ftp://h:1", "http://", "http://u:p@h:1", "http://h:1/v1", "http://h:1?x=1"] {
            let text = format!("url = \"{url}\"\nproject = \"p\"\n{META}\n");
            let e = Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(e.contains("url"), "{url}: {e}");
        }
        for project in ["", "a/b", "a?b", "a#b"] {
            let text = format!("url = \"http://h:1\"\nproject = \"{project}\"\n{META}\n");
            let e = Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
                .err()
                .unwrap_or_else(|| panic!("{project} accepted"));
            assert!(e.contains("project"), "{project}: {e}");
        }
    }

    #[test]
    fn the_key_is_read_from_a_private_file_and_never_shown() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, "s3cr3t-key\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = format!("{META}\napi_key_file = \"{}\"", f.display());
        let e = parse(&text).err().unwrap();
        assert!(e.contains("chmod 600") && !e.contains("s3cr3t"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = parse(&text).unwrap();
        assert_eq!(c.token.as_deref(), Some("s3cr3t-key"));
    }
}
