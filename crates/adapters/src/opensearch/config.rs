//! Config of an `opensearch` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;
use ureq::http::{HeaderName, HeaderValue};

use crate::http::client::{max_in_flight, millis, origin, Client, Pacing};
use crate::registry::{parse_table, read_secret};

use super::adapter::{Fields, OpenSearch, Timing};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    index: String,
    // An object only: as an array, the tenant's and the subject's fields would be named by
    // position, swapped by one misordered export.
    fields: Object<RawFields>,
    api_key_file: Option<PathBuf>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    timeout_ms: Option<u64>,
    retries: Option<u32>,
    retry_after_max_ms: Option<u64>,
    task_timeout_ms: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFields {
    tenant: String,
    subject: String,
}

/// The most documents one erase batch names (one `ids` clause, one `max_docs`), and the most
/// one search page asks for (the index's `max_result_window` defaults to 10,000).
pub(crate) const MAX_BATCH: usize = 10_000;

/// A validated config.
pub struct Config {
    origin: String,
    index: String,
    fields: Fields,
    auth: Option<String>,
    batch: usize,
    in_flight: usize,
    pacing: Pacing,
    timing: Timing,
}

/// A field a `term` query can name: letters, digits, `_`, `-`, and `.` between parts (an
/// object's sub-field, `metadata.user_id`); not a metadata field (`_id`, `_source`, ...).
fn field(name: &str, what: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('_')
        && name
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')));
    if !ok {
        return Err(format!(
            "{what} must be a keyword field's name: letters, digits, '_' and '-', parts of an object joined by '.', not starting with '_' (a metadata field)"
        ));
    }
    Ok(name.to_string())
}

/// An index (or alias) name as OpenSearch and Elasticsearch take them: lower case, none of
/// `\ / * ? " < > | , # :` or a space, not starting with `-`, `_` or `+`, not `.` or `..`,
/// at most 255 bytes. Nothing in it needs encoding in a path, and no wildcard or list can widen
/// it to other indexes.
fn index(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.starts_with(['-', '_', '+'])
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        return Err("index must be one index or alias name: lower-case letters, digits, '-', '_' and '.', not starting with '-', '_' or '+' (no wildcard, no list)".into());
    }
    Ok(name.to_string())
}

/// [`base64`], for the tests' own requests to the double.
#[cfg(test)]
pub(crate) fn tests_base64(text: &str) -> String {
    base64(text.as_bytes())
}

/// Standard base64, for HTTP Basic credentials.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Config {
    /// Parses and validates the kind-specific keys; reads the secret file. Connects to nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let origin = origin(
            &raw.url,
            "url must be https://host[:port] (no path, query or credentials; http:// only on loopback)",
        )?;
        let index = index(&raw.index)?;
        let f = raw.fields.into_inner();
        let fields = Fields {
            tenant: field(&f.tenant, "fields.tenant")?,
            subject: field(&f.subject, "fields.subject")?,
        };
        if fields.tenant == fields.subject {
            return Err("fields.tenant and fields.subject must be different fields".into());
        }
        let auth = match (raw.api_key_file, raw.username, raw.password_file) {
            (None, None, None) => None,
            (Some(k), None, None) => Some(format!(
                "ApiKey {}",
                read_secret(base, &k, "api_key_file")?
            )),
            (None, Some(user), Some(p)) => {
                if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                    return Err("username must be non-empty, without ':' or control characters".into());
                }
                let pw = read_secret(base, &p, "password_file")?;
                Some(format!("Basic {}", base64(format!("{user}:{pw}").as_bytes())))
            }
            _ => {
                return Err("give either api_key_file (Elasticsearch's ApiKey), or username with password_file (HTTP Basic), or neither".into())
            }
        };
        let batch = raw.batch_size.unwrap_or(1_000);
        if batch == 0 || batch > MAX_BATCH {
            return Err(format!("batch_size must be between 1 and {MAX_BATCH}"));
        }
        let pacing = Pacing {
            timeout: millis("timeout_ms", raw.timeout_ms, 30_000, 1, 600_000)?,
            retries: match raw.retries.unwrap_or(4) {
                n @ 0..=20 => n,
                _ => return Err("`retries` must be between 0 and 20".into()),
            },
            backoff: Duration::from_millis(250),
            retry_after_max: millis("retry_after_max_ms", raw.retry_after_max_ms, 30_000, 0, 3_600_000)?,
            budget: Duration::from_secs(300),
        };
        let timing = Timing {
            task_timeout: millis("task_timeout_ms", raw.task_timeout_ms, 600_000, 1, 86_400_000)?,
        };
        Ok(Self {
            origin,
            index,
            fields,
            auth,
            batch,
            in_flight: max_in_flight(raw.max_in_flight)?,
            pacing,
            timing,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> OpenSearch {
        let headers = match self.auth {
            Some(a) => {
                let mut v = HeaderValue::from_str(&a).expect("checked: visible ASCII");
                v.set_sensitive(true);
                vec![(HeaderName::from_static("authorization"), v)]
            }
            None => Vec::new(),
        };
        let client = Client::new(self.origin, String::new(), None, headers, self.pacing)
            .with_max_in_flight(self.in_flight);
        OpenSearch::new(name, client, self.index, self.fields, self.batch, self.timing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        let text = format!(
            "url = \"https://search.example.com:9200\"\nindex = \"memories\"\nfields = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n"
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    #[test]
    fn defaults_and_bad_values() {
        let c = parse("").unwrap();
        assert_eq!((c.batch, c.in_flight, c.auth.is_none()), (1_000, 4, true));
        assert_eq!(c.origin, "https://search.example.com:9200");
        for (extra, says) in [
            ("batch_size = 0", "batch_size"),
            ("batch_size = 10001", "batch_size"),
            ("max_in_flight = 0", "max_in_flight"),
            ("max_in_flight = 65", "max_in_flight"),
            ("username = \"u\"", "either"),
            ("password = \"pw\"", "unknown field"),
            ("task_timeout_ms = 0", "task_timeout_ms"),
        ] {
            let e = parse(extra).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for bad in ["mem*", "a,b", "_all", "-x", "Memories", "..", "a b", "a/b", "a:b", ""] {
            assert!(index(bad).is_err(), "{bad}");
        }
        for ok in ["memories", "mem-2026.12", "a_b"] {
            assert!(index(ok).is_ok(), "{ok}");
        }
        for bad in ["_id", "user id", "a..b", "a.", "user\"", "*", "a:b"] {
            assert!(field(bad, "f").is_err(), "{bad}");
        }
        assert!(field("metadata.user_id", "f").is_ok());
        for url in ["http://search.example.com", "https://u:p@h", "https://h/path", "ftp://h"] {
            let text = format!("url = \"{url}\"\nindex = \"m\"\nfields = {{ tenant = \"t\", subject = \"s\" }}\n");
            assert!(Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).is_err(), "{url}");
        }
    }

    #[test]
    fn basic_credentials_are_base64() {
        assert_eq!(base64(b"Aladdin:open sesame"), "QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
    }
}
