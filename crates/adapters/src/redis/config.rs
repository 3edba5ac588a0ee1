//! Config of a `redis` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::registry::{parse_table, resolve};

use super::adapter::{Mode, Pacing, Redis, Verify};
use super::layout::Template;
use super::resp::{Addr, Auth};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    /// One server: `redis://[user[:password]@]host[:port][/db]`.
    url: Option<String>,
    /// Cluster seed nodes.
    nodes: Option<Vec<String>>,
    password_file: Option<PathBuf>,
    tls_ca_file: Option<PathBuf>,
    db: Option<u32>,
    pattern: String,
    mode: Option<String>,
    index: Option<String>,
    memory: Option<String>,
    scan_count: Option<u32>,
    scan_pause_ms: Option<u64>,
    pipeline: Option<usize>,
    batch_size: Option<usize>,
    verify: Option<String>,
    timeout_ms: Option<u64>,
}

/// A validated config.
pub struct Config {
    seeds: Vec<Addr>,
    cluster: bool,
    auth: Auth,
    pattern: Template,
    mode: Mode,
    memory: Option<Template>,
    verify: Verify,
    pacing: Pacing,
    batch_size: usize,
    timeout: Duration,
}

/// What one URL gives: address, username, password, db, and whether it is `rediss://` (TLS).
type ParsedUrl = (Addr, Option<String>, Option<String>, Option<u32>, bool);

/// Parses one `redis://` or `rediss://` URL into its address and credentials.
fn parse_url(url: &str) -> Result<ParsedUrl, String> {
    let (rest, tls) = match (url.strip_prefix("redis://"), url.strip_prefix("rediss://")) {
        (Some(r), _) => (r, false),
        (_, Some(r)) => (r, true),
        _ => return Err("a Redis URL must start with redis:// or rediss:// (TLS)".into()),
    };
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((a, r)) => (Some(a), r),
        None => (None, rest),
    };
    let (hostport, db) = match rest.split_once('/') {
        Some((h, d)) if !d.is_empty() => (
            h,
            Some(
                d.parse::<u32>()
                    .map_err(|_| "the URL's /db must be a number")?,
            ),
        ),
        Some((h, _)) => (h, None),
        None => (rest, None),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| "the URL's port must be a number")?,
        ),
        None => (hostport, 6379),
    };
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    let (user, pass) = match auth {
        Some(a) => match a.split_once(':') {
            Some((u, p)) => ((!u.is_empty()).then(|| u.to_string()), Some(p.to_string())),
            None => (None, Some(a.to_string())),
        },
        None => (None, None),
    };
    Ok(((host.to_string(), port), user, pass, db, tls))
}

/// The TLS client for `rediss://`: the system's trusted CAs plus `ca_file`, TLS 1.2 or later,
/// the peer's certificate verified (OpenSSL's default for a connector, never turned off).
fn tls_connector(ca_file: Option<&Path>) -> Result<openssl::ssl::SslConnector, String> {
    use openssl::ssl::{SslConnector, SslMethod, SslVersion};
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| format!("TLS: {e}"))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(|e| format!("TLS: {e}"))?;
    if let Some(ca) = ca_file {
        if !ca.is_file() {
            return Err(format!("tls_ca_file {}: no such file", ca.display()));
        }
        b.set_ca_file(ca).map_err(|e| {
            format!(
                "tls_ca_file {}: not a PEM certificate file ({e})",
                ca.display()
            )
        })?;
    }
    Ok(b.build())
}

/// The keys that say how to reach a Redis server or cluster, shared by every kind that reads
/// Redis (`redis`, `langgraph-redis-cache`).
pub(crate) struct ConnectionKeys {
    /// One server: `redis://[user[:password]@]host[:port][/db]`.
    pub(crate) url: Option<String>,
    /// Cluster seed nodes.
    pub(crate) nodes: Option<Vec<String>>,
    pub(crate) password_file: Option<PathBuf>,
    pub(crate) tls_ca_file: Option<PathBuf>,
    pub(crate) db: Option<u32>,
    pub(crate) timeout_ms: Option<u64>,
}

/// How to reach a Redis server or cluster, validated.
pub(crate) struct Connection {
    pub(crate) seeds: Vec<Addr>,
    pub(crate) cluster: bool,
    pub(crate) auth: Auth,
    pub(crate) timeout: Duration,
}

impl Connection {
    /// Validates the connection keys; reads `password_file`, connects to nothing.
    pub(crate) fn parse(keys: ConnectionKeys, base: &Path) -> Result<Self, String> {
        let urls = match (&keys.url, &keys.nodes) {
            (Some(u), None) => vec![u.clone()],
            (None, Some(n)) if !n.is_empty() => n.clone(),
            _ => {
                return Err(
                    "give `url` (one server) or `nodes` (cluster seed nodes), not both".into(),
                )
            }
        };
        let cluster = keys.nodes.is_some();
        let mut seeds = Vec::new();
        let (mut username, mut password, mut db) = (None, None, None);
        let mut schemes = std::collections::BTreeSet::new();
        for u in &urls {
            let (addr, user, pass, d, tls) = parse_url(u)?;
            schemes.insert(tls);
            seeds.push(addr);
            username = username.or(user);
            password = password.or(pass);
            db = db.or(d);
        }
        if schemes.len() > 1 {
            return Err(
                "mix of redis:// and rediss:// URLs: every node is reached the same way".into(),
            );
        }
        let tls = match (schemes.contains(&true), &keys.tls_ca_file) {
            (true, ca) => Some(tls_connector(
                ca.as_ref().map(|p| resolve(base, p)).as_deref(),
            )?),
            (false, Some(_)) => {
                return Err(
                    "tls_ca_file is set but the URL is redis://: use rediss:// for TLS".into(),
                )
            }
            (false, None) => None,
        };
        if let Some(p) = &keys.password_file {
            if password.is_some() {
                return Err("the URL has a password and password_file is set: keep one".into());
            }
            let p = resolve(base, p);
            password = Some(
                lethe_postgres::read_password_file(&p)
                    .map_err(|e| format!("password_file {}: {e}", p.display()))?,
            );
        }
        if keys.db.is_some() && db.is_some() && keys.db != db {
            return Err("`db` and the URL's /db disagree".into());
        }
        let db = keys.db.or(db).unwrap_or(0);
        if cluster && db != 0 {
            return Err("a Redis Cluster has only db 0".into());
        }
        let timeout_ms = keys.timeout_ms.unwrap_or(5000);
        if !(1..=600_000).contains(&timeout_ms) {
            return Err("timeout_ms must be between 1 and 600000".into());
        }
        Ok(Connection {
            seeds,
            cluster,
            auth: Auth {
                username,
                password,
                db,
                tls,
            },
            timeout: Duration::from_millis(timeout_ms),
        })
    }
}

impl Config {
    /// Parses and validates the kind-specific keys.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let Connection {
            seeds,
            cluster,
            auth,
            timeout,
        } = Connection::parse(
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
        let pattern = Template::parse(&raw.pattern, "pattern", true, &["tenant", "subject"])?;
        let mode = match raw.mode.as_deref().unwrap_or("scan") {
            "scan" => {
                if raw.index.is_some() {
                    return Err("`index` is for mode = \"index\"".into());
                }
                Mode::Scan
            }
            "index" => {
                let text = raw
                    .index
                    .as_deref()
                    .ok_or("mode = \"index\" needs `index`, e.g. \"idx:{tenant}:{subject}\"")?;
                Mode::Index(Template::parse(
                    text,
                    "index",
                    false,
                    &["tenant", "subject"],
                )?)
            }
            other => {
                return Err(format!(
                    "mode must be \"scan\" or \"index\", not \"{other}\""
                ))
            }
        };
        let memory = raw
            .memory
            .as_deref()
            .map(|m| Template::parse(m, "memory", false, &["tenant", "subject", "memory"]))
            .transpose()?;
        // 100, not Redis's 10 (100,000 round trips for a million keys) nor 1,000: a SCAN COUNT
        // 1000 holds Redis ~0.8 ms, and other clients' p99 rose 3-6x under it (bench/README.md).
        let scan_count = raw.scan_count.unwrap_or(100);
        if scan_count == 0 || scan_count > 100_000 {
            return Err("scan_count must be between 1 and 100000".into());
        }
        let scan_pause_ms = raw.scan_pause_ms.unwrap_or(0);
        if scan_pause_ms > 1000 {
            return Err("scan_pause_ms must be between 0 and 1000".into());
        }
        let pipeline = raw.pipeline.unwrap_or(1000);
        if pipeline == 0 || pipeline > 100_000 {
            return Err("pipeline must be between 1 and 100000".into());
        }
        let batch_size = raw.batch_size.unwrap_or(10_000);
        if batch_size == 0 || batch_size > 1_000_000 {
            return Err("batch_size must be between 1 and 1000000".into());
        }
        let verify = match (raw.verify.as_deref(), &mode) {
            (None | Some("scan"), Mode::Scan) => Verify::Scan,
            (Some("frozen"), Mode::Scan) => Verify::Frozen,
            (Some(_), Mode::Index(_)) => {
                return Err("`verify` is for mode = \"scan\": index mode verifies through the index set (`lethe verify --audit` adds a keyspace scan)".into())
            }
            (None, Mode::Index(_)) => Verify::Frozen,
            (Some(other), _) => {
                return Err(format!(
                    "verify must be \"scan\" (a keyspace scan after the erase, the default) or \"frozen\" (only the frozen keys), not \"{other}\""
                ))
            }
        };
        Ok(Self {
            seeds,
            cluster,
            auth,
            pattern,
            mode,
            memory,
            verify,
            pacing: Pacing {
                scan_count,
                scan_pause: Duration::from_millis(scan_pause_ms),
                pipeline,
            },
            batch_size,
            timeout,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Redis {
        Redis::new(
            name,
            self.seeds,
            self.cluster,
            self.auth,
            self.timeout,
            self.pattern,
            self.mode,
            self.memory,
            self.verify,
            self.pacing,
            self.batch_size,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let (a, u, p, d, tls) = parse_url("redis://me:s3cret@cache.local:6380/2").unwrap();
        assert_eq!(
            (a, u.as_deref(), p.as_deref(), d, tls),
            (
                ("cache.local".into(), 6380),
                Some("me"),
                Some("s3cret"),
                Some(2),
                false
            )
        );
        let (a, u, p, d, tls) = parse_url("redis://127.0.0.1").unwrap();
        assert_eq!((a.1, u, p, d, tls), (6379, None, None, None, false));
        let (a, .., tls) = parse_url("rediss://h:7110").unwrap();
        assert_eq!((a.1, tls), (7110, true));
        assert!(parse_url("http://h").is_err());
    }

    fn parse_text(extra: &str) -> Result<Config, String> {
        let text =
            format!("url = \"redis://127.0.0.1\"\npattern = \"{{tenant}}:{{subject}}:*\"\n{extra}");
        Config::parse(toml::from_str(&text).unwrap(), Path::new("."))
    }

    #[test]
    fn verify_and_pacing_options_are_checked() {
        let c = parse_text("").unwrap();
        assert_eq!(c.verify, Verify::Scan, "the keyspace scan is the default");
        assert_eq!(
            (c.pacing.scan_count, c.pacing.scan_pause, c.pacing.pipeline),
            (100, Duration::ZERO, 1000)
        );
        assert_eq!(
            parse_text("verify = \"frozen\"").unwrap().verify,
            Verify::Frozen
        );
        assert!(parse_text("verify = \"none\"")
            .err()
            .unwrap()
            .contains("frozen"));
        assert!(parse_text(
            "mode = \"index\"\nindex = \"i:{tenant}:{subject}\"\nverify = \"scan\""
        )
        .err()
        .unwrap()
        .contains("--audit"));
        let c = parse_text("scan_pause_ms = 2\npipeline = 64").unwrap();
        assert_eq!(
            (c.pacing.scan_pause, c.pacing.pipeline),
            (Duration::from_millis(2), 64)
        );
        assert!(parse_text("pipeline = 0").is_err());
        assert!(parse_text("scan_pause_ms = 5000").is_err());
        assert!(parse_text("tls_ca_file = \"ca.crt\"")
            .err()
            .unwrap()
            .contains("rediss://"));
    }

    #[test]
    fn tls_options_are_checked() {
        let tls = |url: &str, extra: &str| {
            let text = format!("url = \"{url}\"\npattern = \"{{tenant}}:{{subject}}:*\"\n{extra}");
            Config::parse(toml::from_str(&text).unwrap(), Path::new("/nonexistent"))
        };
        assert!(tls("rediss://127.0.0.1:7110", "")
            .unwrap()
            .auth
            .tls
            .is_some());
        assert!(tls("redis://127.0.0.1", "").unwrap().auth.tls.is_none());
        assert!(tls("rediss://h", "tls_ca_file = \"ca.crt\"")
            .err()
            .unwrap()
            .contains("no such file"));
        let text =
            "nodes = [\"redis://a:1\", \"rediss://b:2\"]\npattern = \"{tenant}:{subject}:*\"";
        assert!(Config::parse(toml::from_str(text).unwrap(), Path::new("."))
            .err()
            .unwrap()
            .contains("mix"));
    }
}
