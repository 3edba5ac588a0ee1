//! Config of a `qdrant` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;
use ureq::http::{HeaderName, HeaderValue};

use crate::http::client::{max_in_flight, millis, origin, Client, Pacing};
use crate::registry::{parse_table, read_secret};

use super::adapter::{Keys, Qdrant};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    collection: String,
    // An object only: as an array, the tenant's and the subject's keys would be named by
    // position, swapped by one misordered export.
    payload: Object<RawPayload>,
    api_key_file: Option<PathBuf>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    timeout_ms: Option<u64>,
    retries: Option<u32>,
    retry_after_max_ms: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPayload {
    tenant: String,
    subject: String,
}

/// The most points one erase batch names (one `has_id` condition) and one scroll page asks for.
pub(crate) const MAX_BATCH: usize = 10_000;

/// A validated config.
pub struct Config {
    origin: String,
    collection: String,
    keys: Keys,
    api_key: Option<String>,
    batch: usize,
    in_flight: usize,
    pacing: Pacing,
}

/// A payload key a `FieldCondition` can name: letters, digits, `_` and `-`, and `.` between the
/// parts of a nested object's path; nothing Qdrant's key syntax reads otherwise (`[]`, `"`).
fn key(name: &str, what: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        });
    if !ok {
        return Err(format!(
            "{what} must be a payload key: letters, digits, '_' and '-', parts of a nested object joined by '.' (no '[]', quotes or spaces)"
        ));
    }
    Ok(name.to_string())
}

impl Config {
    /// Parses and validates the kind-specific keys; reads `api_key_file`. Connects to nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let origin = origin(
            &raw.url,
            "url must be https://host[:port] of Qdrant's REST API (no path, query or credentials; http:// only on loopback)",
        )?;
        let collection = raw.collection;
        if collection.is_empty()
            || collection.len() > 255
            || !collection
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        {
            return Err("collection must be a collection name of letters, digits, '_' and '-'".into());
        }
        let p = raw.payload.into_inner();
        let keys = Keys {
            tenant: key(&p.tenant, "payload.tenant")?,
            subject: key(&p.subject, "payload.subject")?,
        };
        if keys.tenant == keys.subject {
            return Err("payload.tenant and payload.subject must be different keys".into());
        }
        let api_key = raw
            .api_key_file
            .map(|f| read_secret(base, &f, "api_key_file"))
            .transpose()?;
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
            retry_after_max: millis(
                "retry_after_max_ms",
                raw.retry_after_max_ms,
                30_000,
                0,
                3_600_000,
            )?,
            budget: Duration::from_secs(300),
        };
        Ok(Self {
            origin,
            collection,
            keys,
            api_key,
            batch,
            in_flight: max_in_flight(raw.max_in_flight)?,
            pacing,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Qdrant {
        let headers = match self.api_key {
            Some(k) => {
                let mut v = HeaderValue::from_str(&k).expect("checked: visible ASCII");
                v.set_sensitive(true);
                vec![(HeaderName::from_static("api-key"), v)]
            }
            None => Vec::new(),
        };
        let client = Client::new(self.origin, String::new(), None, headers, self.pacing)
            .with_max_in_flight(self.in_flight);
        Qdrant::new(name, client, self.collection, self.keys, self.batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        let text = format!(
            "url = \"https://qdrant.example.com:6333\"\ncollection = \"memories\"\npayload = {{ tenant = \"tenant_id\", subject = \"user_id\" }}\n{extra}\n"
        );
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    #[test]
    fn defaults_and_bad_values() {
        let c = parse("").unwrap();
        assert_eq!((c.batch, c.in_flight, c.api_key.is_none()), (1_000, 4, true));
        for (extra, says) in [
            ("batch_size = 0", "batch_size"),
            ("batch_size = 10001", "batch_size"),
            ("max_in_flight = 100", "max_in_flight"),
            ("api_key = \"k\"", "unknown field"),
            ("wait = false", "unknown field"),
        ] {
            let e = parse(extra).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for bad in ["", "a b", "a[]", "a..b", "\"a\"", ".a"] {
            assert!(key(bad, "k").is_err(), "{bad}");
        }
        assert!(key("meta.user_id", "k").is_ok());
        for c in ["a/b", "", "a b", "..", "a?b"] {
            let text = format!(
                "url = \"https://h\"\ncollection = \"{c}\"\npayload = {{ tenant = \"t\", subject = \"s\" }}\n"
            );
            assert!(Config::parse(toml::from_str(&text).unwrap(), Path::new(".")).is_err(), "{c}");
        }
    }
}
