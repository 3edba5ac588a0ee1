//! Config of a `backup-s3` target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backup::Retention;
use crate::registry::{parse_table, read_secret};

use super::adapter::BackupS3;
use super::sigv4::Credentials;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    endpoint: String,
    region: Option<String>,
    bucket: String,
    prefix: Option<String>,
    pattern: Option<String>,
    retention_days: i64,
    covers: Vec<String>,
    access_key_id_file: PathBuf,
    secret_access_key_file: PathBuf,
    timeout_ms: Option<u64>,
}

/// Keys that would put a secret in the config file: refused, naming the file key to use.
const SECRETS: &[(&str, &str)] = &[
    ("access_key_id", "access_key_id_file"),
    ("secret_access_key", "secret_access_key_file"),
    ("aws_access_key_id", "access_key_id_file"),
    ("aws_secret_access_key", "secret_access_key_file"),
    ("session_token", "access_key_id_file and secret_access_key_file (a long-lived key)"),
];

/// A validated config.
pub struct Config {
    /// `http` or `https`.
    scheme: &'static str,
    /// `host[:port]`, as the `Host` header and the signature carry it.
    authority: String,
    region: String,
    bucket: String,
    prefix: String,
    pattern: String,
    retention: Retention,
    credentials: Credentials,
    timeout: Duration,
}

impl Config {
    /// Parses and validates the kind-specific keys; reads the two key files, connects to
    /// nothing.
    pub fn parse(table: toml::Table, base: &Path) -> Result<Self, String> {
        for (key, instead) in SECRETS {
            if table.contains_key(*key) {
                return Err(format!(
                    "`{key}` puts a secret in the config file: write it to a file readable by \
                     Lethe alone (chmod 600) and name that file with {instead}"
                ));
            }
        }
        let raw: Raw = parse_table(table)?;
        let endpoint = raw.endpoint.trim_end_matches('/');
        let (scheme, authority) = if let Some(a) = endpoint.strip_prefix("http://") {
            ("http", a)
        } else if let Some(a) = endpoint.strip_prefix("https://") {
            ("https", a)
        } else {
            return Err("endpoint must be http://host:port or https://host[:port] (path-style addressing: the bucket goes in `bucket`)".into());
        };
        if authority.is_empty()
            || authority.contains(['/', '?', '#', '@'])
            || authority.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err("endpoint must be http://host:port or https://host[:port], without a path, a query or credentials (path-style addressing: the bucket goes in `bucket`, the key in the two key files)".into());
        }
        let region = raw.region.unwrap_or_else(|| "us-east-1".into());
        if region.is_empty()
            || region.len() > 64
            || !region
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        {
            return Err("region must be 1 to 64 characters of a-z, A-Z, 0-9, '-' and '_' (us-east-1, eu-west-3, garage)".into());
        }
        if !is_bucket_name(&raw.bucket) {
            return Err("bucket must be an S3 bucket name: 3 to 63 characters of a-z, 0-9, '.' and '-', starting and ending with a letter or digit".into());
        }
        let prefix = raw.prefix.unwrap_or_default();
        if prefix.len() > 1024 || prefix.chars().any(char::is_control) {
            return Err("prefix must be at most 1024 bytes, without control characters".into());
        }
        let pattern = raw.pattern.unwrap_or_else(|| "*".into());
        if pattern.is_empty() || pattern.chars().any(char::is_control) {
            return Err("pattern must be a key pattern (`*` and `?` as wildcards) matched against the key after the prefix".into());
        }
        let timeout = Duration::from_millis(raw.timeout_ms.unwrap_or(30_000));
        if timeout.is_zero() {
            return Err("timeout_ms must be more than 0".into());
        }
        let retention = Retention::new(raw.retention_days, raw.covers)?;
        let credentials = Credentials {
            access_key_id: read_secret(base, &raw.access_key_id_file, "access_key_id_file")?,
            secret_access_key: read_secret(
                base,
                &raw.secret_access_key_file,
                "secret_access_key_file",
            )?,
        };
        Ok(Self {
            scheme,
            authority: authority.to_ascii_lowercase(),
            region,
            bucket: raw.bucket,
            prefix,
            pattern,
            retention,
            credentials,
            timeout,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> BackupS3 {
        BackupS3::new(
            name,
            self.scheme,
            self.authority,
            self.region,
            self.bucket,
            self.prefix,
            self.pattern,
            self.retention,
            self.credentials,
            self.timeout,
        )
    }
}

/// S3's bucket naming rules (path-style): 3 to 63 of `a-z 0-9 . -`, a letter or digit at
/// each end.
fn is_bucket_name(b: &str) -> bool {
    let ends = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&b.len())
        && b
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && ends(b.bytes().next())
        && ends(b.bytes().last())
        && !b.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn keys(dir: &Path) {
        for (f, v) in [("ak", "AKIDTEST\n"), ("sk", "s3cr3t-key\n")] {
            let p = dir.join(f);
            std::fs::write(&p, v).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }

    /// A valid table with `lines` put over its keys.
    fn parse(dir: &Path, lines: &str) -> Result<Config, String> {
        let mut t: toml::Table = toml::from_str(
            "endpoint = \"http://127.0.0.1:8014\"\nbucket = \"backups\"\nretention_days = 30\n\
             covers = [\"checkpoints\"]\naccess_key_id_file = \"ak\"\nsecret_access_key_file = \"sk\"\n",
        )
        .unwrap();
        t.extend(toml::from_str::<toml::Table>(lines).unwrap());
        Config::parse(t, dir)
    }

    #[test]
    fn defaults_and_the_secrets_from_their_files() {
        let dir = tempfile::tempdir().unwrap();
        keys(dir.path());
        let c = parse(dir.path(), "").unwrap();
        assert_eq!((c.scheme, c.authority.as_str()), ("http", "127.0.0.1:8014"));
        assert_eq!(c.region, "us-east-1");
        assert_eq!((c.prefix.as_str(), c.pattern.as_str()), ("", "*"));
        assert_eq!(c.credentials.access_key_id, "AKIDTEST");
        assert_eq!(c.credentials.secret_access_key, "s3cr3t-key");
        assert_eq!(c.timeout, Duration::from_secs(30));
        let c = parse(
            dir.path(),
            "endpoint = \"https://S3.Example.com/\"\nregion = \"eu-west-3\"\nprefix = \"nightly/\"\n\
             pattern = \"*.dump\"\ntimeout_ms = 500",
        )
        .unwrap();
        assert_eq!((c.scheme, c.authority.as_str()), ("https", "s3.example.com"));
        assert_eq!((c.region.as_str(), c.prefix.as_str()), ("eu-west-3", "nightly/"));
        // A file others can read is refused, and the secret is never shown.
        std::fs::set_permissions(
            dir.path().join("sk"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = parse(dir.path(), "").err().unwrap();
        assert!(e.contains("secret_access_key_file") && e.contains("chmod 600"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        keys(dir.path());
        for (lines, says) in [
            ("secret_access_key = \"s3cr3t-key\"", "secret_access_key_file"),
            ("access_key_id = \"AKIDTEST\"", "access_key_id_file"),
            ("bucket_name = \"x\"", "unknown field"),
            ("region = \"us east\"", "region"),
            ("region = \"\"", "region"),
            ("prefix = \"a\\nb\"", "prefix"),
            ("pattern = \"\"", "pattern"),
            ("timeout_ms = 0", "timeout_ms"),
            ("retention_days = 0", "retention_days"),
            ("covers = []", "covers"),
            ("access_key_id_file = \"missing\"", "access_key_id_file"),
            ("endpoint = \"s3.amazonaws.com\"", "endpoint"),
            ("endpoint = \"ftp://h:1\"", "endpoint"),
            ("endpoint = \"http://\"", "endpoint"),
            ("endpoint = \"http://u:p@h:1\"", "endpoint"),
            ("endpoint = \"http://h:1/backups\"", "endpoint"),
            ("endpoint = \"http://h:1?x\"", "endpoint"),
            ("bucket = \"ab\"", "bucket"),
            ("bucket = \"Backups\"", "bucket"),
            ("bucket = \"a_b\"", "bucket"),
            ("bucket = \"-ab\"", "bucket"),
            ("bucket = \"ab-\"", "bucket"),
            ("bucket = \"a..b\"", "bucket"),
            ("bucket = \"a/b\"", "bucket"),
        ] {
            let e = parse(dir.path(), lines)
                .err()
                .unwrap_or_else(|| panic!("{lines} accepted"));
            assert!(e.contains(says), "{lines}: {e}");
            assert!(!e.contains("s3cr3t") && !e.contains("AKIDTEST"), "{e}");
        }
        let long = format!("bucket = \"{}\"", "a".repeat(64));
        assert!(parse(dir.path(), &long).err().unwrap().contains("bucket"));
        assert!(parse(dir.path(), &format!("bucket = \"{}\"", "a".repeat(63))).is_ok());
    }
}
