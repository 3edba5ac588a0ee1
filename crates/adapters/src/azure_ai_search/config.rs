//! Config of an `azure-ai-search` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;
use ureq::http::{HeaderName, HeaderValue};

use crate::http::client::{Client, Pacing};
use crate::registry::{parse_table, read_secret};

use super::adapter::{AzureAiSearch, Fields, Settle, MAX_ACTIONS};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    endpoint: String,
    index: String,
    api_key_file: PathBuf,
    api_version: Option<String>,
    key_field: Option<String>,
    // An object only: as an array, the tenant's and the subject's fields would be named by
    // position, swapped by one misordered export.
    fields: Object<RawFields>,
    memory: Option<String>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    timeout_ms: Option<u64>,
    retries: Option<u32>,
    retry_after_max_ms: Option<u64>,
    settle_ms: Option<u64>,
    verify_timeout_ms: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFields {
    tenant: String,
    subject: String,
}

/// The REST API version sent when `api_version` is not given.
pub(crate) const DEFAULT_API_VERSION: &str = "2024-07-01";

/// A validated config.
pub struct Config {
    origin: String,
    index: String,
    api_version: String,
    fields: Fields,
    api_key: String,
    batch: usize,
    in_flight: usize,
    pacing: Pacing,
    settle: Settle,
}

/// Words OData gives a meaning where a field name stands: a field so named would read as an
/// operator or a constant.
const RESERVED: &[&str] = &[
    "and", "or", "not", "eq", "ne", "gt", "ge", "lt", "le", "any", "all", "true", "false",
    "null", "asc", "desc", "search", "geo", "INF", "NaN",
];

/// A top-level field name as OData and Azure AI Search take it: a letter, then letters, digits
/// and `_`, at most 128 characters; not an OData word, not one of Azure's own (`azureSearch*`,
/// `@search.*`). Sub-fields of complex fields (`a/b`) are not supported.
fn field(name: &str, what: &str) -> Result<String, String> {
    let ok = name.len() <= 128
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name))
        && !name.starts_with("azureSearch");
    if !ok {
        return Err(format!(
            "{what} must be a top-level field name: a letter, then letters, digits and '_' (at most 128), not an OData word (and, or, eq, true, ...) and not starting with azureSearch (sub-fields a/b are not supported)"
        ));
    }
    Ok(name.to_string())
}

/// `https://<service>.search.windows.net` (any https host: a private endpoint, a custom
/// domain), or `http://` on loopback only (a test double).
fn endpoint(url: &str) -> Result<String, String> {
    const FORM: &str = "endpoint must be https://<service>.search.windows.net (no path, query or credentials; http:// only on loopback)";
    let url = url.trim_end_matches('/');
    let (scheme, authority) = url.split_once("://").ok_or(FORM)?;
    if !matches!(scheme, "https" | "http")
        || authority.is_empty()
        || authority.contains(['/', '?', '#', '@', '{', '}'])
        || authority.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(FORM.into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if host.is_empty() || (scheme == "http" && !loopback) {
        return Err(format!(
            "{FORM}: over plain http the api key and every identifier would cross the network readable"
        ));
    }
    Ok(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

/// Milliseconds within bounds, or its default.
fn ms(key: &str, v: Option<u64>, default: u64, min: u64, max: u64) -> Result<Duration, String> {
    match v.unwrap_or(default) {
        n if (min..=max).contains(&n) => Ok(Duration::from_millis(n)),
        _ => Err(format!("`{key}` must be between {min} and {max}")),
    }
}

impl Config {
    /// Parses and validates the kind-specific keys; reads `api_key_file`. Connects to nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let origin = endpoint(&raw.endpoint)?;
        // Azure's index names: lower-case letters, digits and '-', starting with a letter or a
        // digit, at most 128: nothing in the path needs encoding.
        let index = raw.index;
        if index.is_empty()
            || index.len() > 128
            || index.starts_with('-')
            || !index
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("index must be an Azure AI Search index name: 1 to 128 lower-case letters, digits and '-', not starting with '-'".into());
        }
        let api_version = raw
            .api_version
            .unwrap_or_else(|| DEFAULT_API_VERSION.to_string());
        if api_version.is_empty()
            || api_version.len() > 32
            || !api_version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            || !api_version.bytes().next().is_some_and(|b| b.is_ascii_digit())
        {
            return Err(
                "api_version must be a REST API version such as \"2024-07-01\"".into(),
            );
        }
        let f = raw.fields.into_inner();
        let fields = Fields {
            key: field(raw.key_field.as_deref().unwrap_or("id"), "key_field")?,
            tenant: field(&f.tenant, "fields.tenant")?,
            subject: field(&f.subject, "fields.subject")?,
            memory: raw.memory.as_deref().map(|m| field(m, "memory")).transpose()?,
        };
        let mut names = vec![&fields.key, &fields.tenant, &fields.subject];
        names.extend(fields.memory.as_ref());
        names.sort();
        names.dedup();
        if names.len() != 3 + usize::from(fields.memory.is_some()) {
            return Err("key_field, fields.tenant, fields.subject and memory must be different fields".into());
        }
        let api_key = read_secret(base, &raw.api_key_file, "api_key_file")?;
        let batch = raw.batch_size.unwrap_or(MAX_ACTIONS);
        if batch == 0 || batch > MAX_ACTIONS {
            return Err(format!(
                "batch_size must be between 1 and {MAX_ACTIONS} (the service's most actions per Index Documents request)"
            ));
        }
        let pacing = Pacing {
            timeout: ms("timeout_ms", raw.timeout_ms, 30_000, 1, 600_000)?,
            retries: match raw.retries.unwrap_or(4) {
                n @ 0..=20 => n,
                _ => return Err("`retries` must be between 0 and 20".into()),
            },
            backoff: Duration::from_millis(250),
            retry_after_max: ms(
                "retry_after_max_ms",
                raw.retry_after_max_ms,
                30_000,
                0,
                3_600_000,
            )?,
            budget: Duration::from_secs(300),
        };
        let settle = Settle {
            settle: ms("settle_ms", raw.settle_ms, 2_000, 0, 600_000)?,
            timeout: ms("verify_timeout_ms", raw.verify_timeout_ms, 60_000, 1, 3_600_000)?,
        };
        if settle.timeout <= settle.settle * 2 {
            return Err("verify_timeout_ms must be more than twice settle_ms (a zero must hold for settle_ms before it counts)".into());
        }
        Ok(Self {
            origin,
            index,
            api_version,
            fields,
            api_key,
            batch,
            in_flight: crate::http::client::max_in_flight(raw.max_in_flight)?,
            pacing,
            settle,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> AzureAiSearch {
        let mut key = HeaderValue::from_str(&self.api_key).expect("checked: visible ASCII");
        key.set_sensitive(true);
        let client = Client::new(
            self.origin,
            String::new(),
            None,
            vec![(HeaderName::from_static("api-key"), key)],
            self.pacing,
        )
        .with_max_in_flight(self.in_flight);
        AzureAiSearch::new(
            name,
            client,
            self.index,
            self.api_version,
            self.fields,
            self.batch,
            self.settle,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file() -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, "s3cr3t-admin-key\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        (dir, f)
    }

    fn parse(extra: &str, key: &Path) -> Result<Config, String> {
        let text = format!(
            "endpoint = \"https://mysvc.search.windows.net\"\nindex = \"memories\"\napi_key_file = \"{}\"\n{extra}\n",
            key.display()
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    const FIELDS: &str = "fields = { tenant = \"tenant_id\", subject = \"user_id\" }";

    #[test]
    fn defaults_and_bad_values() {
        let (_d, key) = key_file();
        let c = parse(FIELDS, &key).unwrap();
        assert_eq!(c.api_version, DEFAULT_API_VERSION);
        assert_eq!(c.fields.key, "id");
        assert_eq!(c.batch, 1000);
        assert!(c.fields.memory.is_none());
        assert_eq!(c.origin, "https://mysvc.search.windows.net");
        for (extra, says) in [
            ("", "fields"),
            ("fields = [\"tenant_id\", \"user_id\"]", "object"),
            ("fields = { tenant = \"tenant id\", subject = \"user_id\" }", "fields.tenant"),
            ("fields = { tenant = \"t\", subject = \"user_id eq 'x' or true\" }", "fields.subject"),
            ("fields = { tenant = \"t\", subject = \"and\" }", "fields.subject"),
            ("fields = { tenant = \"t\", subject = \"meta/user\" }", "fields.subject"),
            ("fields = { tenant = \"t\", subject = \"1user\" }", "fields.subject"),
            ("fields = { tenant = \"t\", subject = \"t\" }", "different"),
            ("fields = { tenant = \"t\", subject = \"s\", memory = \"m\" }", "unknown field"),
            ("key_field = \"tenant_id\"", "different"),
            ("key_field = \"id'\"", "key_field"),
            ("memory = \"user_id\"", "different"),
            ("memory = \"azureSearchX\"", "memory"),
            ("api_version = \"2024-07-01&x=1\"", "api_version"),
            ("batch_size = 0", "batch_size"),
            ("batch_size = 1001", "batch_size"),
            ("timeout_ms = 0", "timeout_ms"),
            ("settle_ms = 5000\nverify_timeout_ms = 6000", "twice"),
            ("retries = 21", "retries"),
            ("api_key = \"secret\"", "unknown field"),
        ] {
            let text = if extra.starts_with("fields") || extra.is_empty() {
                extra.to_string()
            } else {
                format!("{FIELDS}\n{extra}")
            };
            let e = parse(&text, &key).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for (url, ok) in [
            ("https://mysvc.search.windows.net/", true),
            ("http://127.0.0.1:8080", true),
            ("http://[::1]:8080", true),
            ("http://localhost:1", true),
            ("http://mysvc.search.windows.net", false),
            ("ftp://h", false),
            ("https://", false),
            ("https://u:p@h", false),
            ("https://h/indexes", false),
            ("https://h?x=1", false),
        ] {
            let text = format!(
                "endpoint = \"{url}\"\nindex = \"i\"\napi_key_file = \"{}\"\n{FIELDS}\n",
                key.display()
            );
            let r = Config::parse(toml::from_str(&text).unwrap(), Path::new("."));
            assert_eq!(r.is_ok(), ok, "{url}: {:?}", r.err());
            if let Err(e) = r {
                assert!(e.contains("endpoint"), "{url}: {e}");
            }
        }
        for index in ["", "Memories", "-x", "a/b", "a b", "a'b"] {
            let text = format!(
                "endpoint = \"https://h\"\nindex = \"{index}\"\napi_key_file = \"{}\"\n{FIELDS}\n",
                key.display()
            );
            let e = Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
                .err()
                .unwrap_or_else(|| panic!("{index} accepted"));
            assert!(e.contains("index"), "{index}: {e}");
        }
    }

    #[test]
    fn the_api_key_is_read_from_a_private_file_and_never_shown() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, key) = key_file();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = parse(FIELDS, &key).err().unwrap();
        assert!(e.contains("chmod 600") && !e.contains("s3cr3t"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = parse(FIELDS, &key).unwrap();
        assert_eq!(c.api_key, "s3cr3t-admin-key");
        let a = c.build("search");
        assert!(!format!("{a:?}").contains("s3cr3t"));
        let e = parse(FIELDS, Path::new("/nonexistent/lethe-azure-key")).err().unwrap();
        assert!(e.contains("api_key_file"), "{e}");
    }
}
