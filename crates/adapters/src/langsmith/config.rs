//! Config of a `langsmith` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;
use ureq::http::{HeaderName, HeaderValue};

use crate::http::client::{max_in_flight, millis, origin, Client, Pacing};
use crate::registry::{parse_table, read_secret};

use super::adapter::{is_uuid, Keys, LangSmith, Timing};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: Option<String>,
    project_id: String,
    // An object only: as an array, the tenant's and the subject's keys would be named by
    // position, swapped by one misordered export.
    metadata: Object<RawMetadata>,
    api_key_file: PathBuf,
    workspace_id: Option<String>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    timeout_ms: Option<u64>,
    retries: Option<u32>,
    retry_after_max_ms: Option<u64>,
    poll_ms: Option<u64>,
    verify_timeout_ms: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    tenant: String,
    subject: String,
}

/// LangSmith's API when `url` is not given.
pub(crate) const DEFAULT_URL: &str = "https://api.smith.langchain.com";
/// The most trace ids one delete request may name.
pub(crate) const MAX_TRACES: usize = 1_000;

/// A validated config.
pub struct Config {
    origin: String,
    project: String,
    keys: Keys,
    api_key: String,
    workspace: Option<String>,
    batch: usize,
    in_flight: usize,
    pacing: Pacing,
    timing: Timing,
}

/// A metadata key as it goes, quoted, into the one filter the target sends
/// (`eq(metadata_key, "K")`): letters, digits, `_`, `-` and `.`, so nothing in it needs
/// escaping in LangSmith's filter language.
fn key(name: &str, what: &str) -> Result<String, String> {
    if name.is_empty()
        || name.len() > 255
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(format!(
            "{what} must be a metadata key of letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(name.to_string())
}

impl Config {
    /// Parses and validates the kind-specific keys; reads `api_key_file`. Connects to nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let origin = origin(
            raw.url.as_deref().unwrap_or(DEFAULT_URL),
            "url must be https://host[:port] of LangSmith's API (no path, query or credentials; http:// only on loopback)",
        )?;
        if !is_uuid(&raw.project_id) {
            return Err("project_id must be the tracing project's id (its session id), a UUID in lower case".into());
        }
        if raw.workspace_id.as_deref().is_some_and(|w| !is_uuid(w)) {
            return Err("workspace_id must be a UUID in lower case".into());
        }
        let m = raw.metadata.into_inner();
        let keys = Keys {
            tenant: key(&m.tenant, "metadata.tenant")?,
            subject: key(&m.subject, "metadata.subject")?,
        };
        if keys.tenant == keys.subject {
            return Err("metadata.tenant and metadata.subject must be different keys".into());
        }
        let api_key = read_secret(base, &raw.api_key_file, "api_key_file")?;
        let batch = raw.batch_size.unwrap_or(MAX_TRACES);
        if batch == 0 || batch > MAX_TRACES {
            return Err(format!(
                "batch_size must be between 1 and {MAX_TRACES} (LangSmith's most trace ids per delete request)"
            ));
        }
        let pacing = Pacing {
            timeout: millis("timeout_ms", raw.timeout_ms, 30_000, 1, 600_000)?,
            retries: match raw.retries.unwrap_or(4) {
                n @ 0..=20 => n,
                _ => return Err("`retries` must be between 0 and 20".into()),
            },
            backoff: Duration::from_millis(250),
            retry_after_max: millis(
                "retry_after_max_ms",
                raw.retry_after_max_ms,
                60_000,
                0,
                3_600_000,
            )?,
            budget: Duration::from_secs(600),
        };
        let timing = Timing {
            poll: millis("poll_ms", raw.poll_ms, 5_000, 1, 600_000)?,
            verify_timeout: millis(
                "verify_timeout_ms",
                raw.verify_timeout_ms,
                60_000,
                1,
                86_400_000,
            )?,
        };
        Ok(Self {
            origin,
            project: raw.project_id,
            keys,
            api_key,
            workspace: raw.workspace_id,
            batch,
            in_flight: max_in_flight(raw.max_in_flight)?,
            pacing,
            timing,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> LangSmith {
        let mut key = HeaderValue::from_str(&self.api_key).expect("checked: visible ASCII");
        key.set_sensitive(true);
        let mut headers = vec![(HeaderName::from_static("x-api-key"), key)];
        if let Some(w) = &self.workspace {
            headers.push((
                HeaderName::from_static("x-tenant-id"),
                HeaderValue::from_str(w).expect("checked: a UUID"),
            ));
        }
        let client = Client::new(self.origin, String::new(), None, headers, self.pacing)
            .with_max_in_flight(self.in_flight);
        LangSmith::new(
            name,
            client,
            self.project,
            self.keys,
            self.batch,
            self.in_flight,
            self.timing,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "lsv2_pt_x\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "project_id = \"018e4c7e-a9fb-7ef0-a5b6-6ea3a82e9327\"\napi_key_file = \"{}\"\nmetadata = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n",
            f.display()
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    #[test]
    fn defaults_and_bad_values() {
        let c = parse("").unwrap();
        assert_eq!(c.origin, DEFAULT_URL);
        assert_eq!((c.batch, c.in_flight), (1_000, 4));
        for (extra, says) in [
            ("batch_size = 1001", "batch_size"),
            ("workspace_id = \"ws\"", "workspace_id"),
            ("url = \"http://api.smith.langchain.com\"", "plain http"),
            ("api_key = \"k\"", "unknown field"),
            ("verify_timeout_ms = 0", "verify_timeout_ms"),
        ] {
            let e = parse(extra).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for bad in ["user id", "a\"b", "", "a)b", "a,b"] {
            assert!(key(bad, "k").is_err(), "{bad}");
        }
    }
}
