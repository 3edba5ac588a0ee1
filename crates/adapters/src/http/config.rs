//! Config of an `http` target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lethe_core::Object;

use crate::registry::{parse_table, read_secret};

use super::adapter::{Erase, Http, Locate, Status};
use super::client::{Client, Pacing};
use super::template::{pointer, Template, Var};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    base_url: String,
    token_file: Option<PathBuf>,
    headers: Option<BTreeMap<String, String>>,
    timeout_ms: Option<u64>,
    retries: Option<u32>,
    backoff_ms: Option<u64>,
    retry_after_max_ms: Option<u64>,
    budget_ms: Option<u64>,
    batch_size: Option<usize>,
    max_in_flight: Option<usize>,
    locate: Option<Object<RawLocate>>,
    locate_tenant: Option<Object<RawLocate>>,
    locate_memory: Option<Object<RawLocate>>,
    erase: Option<Object<RawErase>>,
    get: Option<Object<RawRequest>>,
    status: Option<Object<RawStatus>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLocate {
    method: Option<String>,
    path: String,
    query: Option<BTreeMap<String, String>>,
    body: Option<toml::Value>,
    items: String,
    id: String,
    count: Option<String>,
    empty_on_404: Option<bool>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawErase {
    method: Option<String>,
    path: String,
    query: Option<BTreeMap<String, String>>,
    body: Option<toml::Value>,
    deleted: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    method: Option<String>,
    path: String,
    query: Option<BTreeMap<String, String>>,
    body: Option<toml::Value>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatus {
    url: Option<String>,
    done: String,
    done_value: String,
    failed_value: Option<String>,
    deleted: Option<String>,
    poll_ms: Option<u64>,
    poll_timeout_ms: Option<u64>,
}

/// A validated config.
pub struct Config {
    client: Client,
    place: String,
    locate: Locate,
    locate_tenant: Option<Locate>,
    locate_memory: Option<Locate>,
    erase: Erase,
    get: Option<Template>,
    status: Option<Status>,
    batch_size: usize,
}

fn ms(key: &str, v: Option<u64>, default: u64, min: u64, max: u64) -> Result<Duration, String> {
    let v = v.unwrap_or(default);
    if !(min..=max).contains(&v) {
        return Err(format!("`{key}` must be between {min} and {max}"));
    }
    Ok(Duration::from_millis(v))
}

const SCOPE: [Var; 2] = [Var::Tenant, Var::Subject];
const MEMORY: [Var; 4] = [Var::Tenant, Var::Subject, Var::MemoryId, Var::Version];

fn locate(key: &str, raw: RawLocate, allowed: &[Var], required: &[Var]) -> Result<Locate, String> {
    let template = Template::parse(
        key,
        raw.method.as_deref().unwrap_or("GET"),
        &raw.path,
        raw.query,
        raw.body,
        allowed,
        required,
    )?;
    Ok(Locate {
        template,
        items: pointer(&format!("{key}.items"), &raw.items)?,
        id: pointer(&format!("{key}.id"), &raw.id)?,
        count: raw
            .count
            .map(|c| pointer(&format!("{key}.count"), &c))
            .transpose()?,
        empty_on_404: raw.empty_on_404.unwrap_or(false),
    })
}

/// `scheme://host[:port]` and the path of `base_url`.
fn base(url: &str) -> Result<(String, String), String> {
    if url.contains(['{', '}']) {
        return Err("`base_url` holds a brace: identifiers never go in the host or the base path, only in a template's path segments, query values or body".into());
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("`base_url` must be an absolute URL, as in https://api.vendor.example")?;
    if scheme != "https" && scheme != "http" {
        return Err("`base_url` must start with https:// (or http:// for a vendor on this machine)".into());
    }
    if rest.contains(['?', '#']) {
        return Err("`base_url` holds a query or a fragment: put query values in a template's `query`".into());
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("`base_url` holds credentials: put the token in `token_file`".into());
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.split(':').next().unwrap_or("")
    };
    if host.is_empty() {
        return Err("`base_url` names no host".into());
    }
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if scheme == "http" && !loopback {
        return Err("`base_url` must be https:// : over plain http the token and every identifier would cross the network readable (http:// is accepted for loopback only)".into());
    }
    if path.split('/').any(|s| s == "." || s == "..") || path.contains("//") {
        return Err("`base_url` has an empty, `.` or `..` path segment".into());
    }
    Ok((
        format!("{scheme}://{}", authority.to_ascii_lowercase()),
        path.trim_end_matches('/').to_string(),
    ))
}

impl Config {
    /// Parses and validates the kind-specific keys; reads `token_file`. Connects to nothing.
    pub fn parse(table: toml::Table, base_dir: &Path) -> Result<Self, String> {
        let raw: Raw = parse_table(table)?;
        let (origin, base_path) = base(&raw.base_url)?;
        let token = read_token(raw.token_file.as_deref(), base_dir)?;
        let headers = parse_headers(raw.headers.unwrap_or_default())?;
        let pacing = Pacing {
            timeout: ms("timeout_ms", raw.timeout_ms, 10_000, 1, 600_000)?,
            retries: match raw.retries.unwrap_or(4) {
                n @ 0..=20 => n,
                _ => return Err("`retries` must be between 0 and 20".into()),
            },
            backoff: ms("backoff_ms", raw.backoff_ms, 500, 0, 60_000)?,
            retry_after_max: ms(
                "retry_after_max_ms",
                raw.retry_after_max_ms,
                30_000,
                0,
                3_600_000,
            )?,
            budget: ms("budget_ms", raw.budget_ms, 120_000, 1, 3_600_000)?,
        };
        let locate_ = locate(
            "locate",
            raw.locate
                .ok_or("missing `locate`: the request that lists a subject's items")?
                .into_inner(),
            &SCOPE,
            &SCOPE,
        )?;
        let locate_tenant = raw
            .locate_tenant
            .map(|l| locate("locate_tenant", l.into_inner(), &[Var::Tenant], &[Var::Tenant]))
            .transpose()?;
        let locate_memory = raw
            .locate_memory
            .map(|l| {
                locate(
                    "locate_memory",
                    l.into_inner(),
                    &MEMORY,
                    &[Var::Tenant, Var::Subject, Var::MemoryId],
                )
            })
            .transpose()?;
        let erase = raw
            .erase
            .ok_or("missing `erase`: the request that erases one item by its {locator}")?
            .into_inner();
        let erase = Erase {
            template: Template::parse(
                "erase",
                erase.method.as_deref().unwrap_or("DELETE"),
                &erase.path,
                erase.query,
                erase.body,
                &Var::ALL,
                &[Var::Locator],
            )?,
            deleted: erase
                .deleted
                .map(|d| pointer("erase.deleted", &d))
                .transpose()?,
        };
        let get = raw
            .get
            .map(|g| {
                let g = g.into_inner();
                Template::parse(
                    "get",
                    g.method.as_deref().unwrap_or("GET"),
                    &g.path,
                    g.query,
                    g.body,
                    &Var::ALL,
                    &[Var::Locator],
                )
            })
            .transpose()?;
        if get.as_ref().is_some_and(|g| g.method != ureq::http::Method::GET) {
            return Err("`get.method` must be GET: verification only reads".into());
        }
        for l in [Some(&locate_), locate_tenant.as_ref(), locate_memory.as_ref()]
            .into_iter()
            .flatten()
        {
            if l.template.method == ureq::http::Method::DELETE {
                return Err("a `locate` request must not be a DELETE".into());
            }
        }
        let status = raw.status.map(|s| parse_status(s.into_inner())).transpose()?;
        let batch_size = raw.batch_size.unwrap_or(100);
        if !(1..=100_000).contains(&batch_size) {
            return Err("`batch_size` must be between 1 and 100000".into());
        }
        let place = format!(
            "{origin}{base_path} {} {}",
            locate_.template.method,
            raw_place(&locate_.template)
        );
        Ok(Self {
            client: Client::new(origin, base_path, token, headers, pacing)
                .with_max_in_flight(super::client::max_in_flight(raw.max_in_flight)?),
            place,
            locate: locate_,
            locate_tenant,
            locate_memory,
            erase,
            get,
            status,
            batch_size,
        })
    }

    /// Builds the adapter. Connects to nothing.
    pub fn build(self, name: &str) -> Http {
        Http {
            name: name.to_string(),
            client: self.client,
            place: self.place,
            locate: self.locate,
            locate_tenant: self.locate_tenant,
            locate_memory: self.locate_memory,
            erase: self.erase,
            get: self.get,
            status: self.status,
            batch_size: self.batch_size,
        }
    }
}

/// The locate template's path with its placeholders as written: where the items are.
fn raw_place(t: &Template) -> String {
    let v = super::template::Values {
        tenant: Some("{tenant}"),
        subject: Some("{subject}"),
        memory_id: Some("{memory_id}"),
        version: Some("{version}"),
        locator: Some("{locator}"),
    };
    t.render(&v).map(|r| r.target).unwrap_or_default()
}

/// The bearer token from `token_file`, if one is given: visible ASCII on one line.
fn read_token(token_file: Option<&Path>, base_dir: &Path) -> Result<Option<String>, String> {
    token_file
        .map(|p| read_secret(base_dir, p, "token_file"))
        .transpose()
}

/// The literal `headers`: no header Lethe sets itself, no placeholder.
fn parse_headers(
    raw: BTreeMap<String, String>,
) -> Result<Vec<(ureq::http::HeaderName, ureq::http::HeaderValue)>, String> {
    let mut headers = Vec::new();
    for (k, v) in raw {
        let name = ureq::http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| "`headers`: a name is not an HTTP header name".to_string())?;
        if matches!(
            name.as_str(),
            "authorization" | "idempotency-key" | "content-type" | "content-length" | "host"
        ) {
            return Err(format!(
                "`headers.{name}`: Lethe sets this header itself (the token comes from `token_file`)"
            ));
        }
        if v.contains(['{', '}']) {
            return Err(format!(
                "`headers.{name}`: a header holds no placeholder: identifiers go only in a template's path segments, query values or body"
            ));
        }
        let value = ureq::http::HeaderValue::from_str(&v)
            .map_err(|_| format!("`headers.{name}`: not a valid header value"))?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// The `[target.status]` table: how an accepted (202) erase is polled.
fn parse_status(s: RawStatus) -> Result<Status, String> {
    Ok(Status {
        url: s.url.map(|u| pointer("status.url", &u)).transpose()?,
        done: pointer("status.done", &s.done)?,
        done_value: s.done_value,
        failed_value: s.failed_value,
        deleted: s
            .deleted
            .map(|d| pointer("status.deleted", &d))
            .transpose()?,
        poll: ms("status.poll_ms", s.poll_ms, 1_000, 1, 600_000)?,
        timeout: ms(
            "status.poll_timeout_ms",
            s.poll_timeout_ms,
            60_000,
            1,
            3_600_000,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "base_url = \"https://api.vendor.example/api/\"\n\
        [locate]\nmethod = \"POST\"\npath = \"/v1/search\"\n\
        body = { tenant = \"{tenant}\", user = \"{subject}\" }\nitems = \"/results\"\nid = \"/id\"\n\
        [erase]\npath = \"/v1/notes/{locator}\"\n";

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(toml::from_str(text).unwrap(), Path::new("."))
    }

    #[test]
    fn a_minimal_config_and_its_defaults() {
        let c = parse(BASE).unwrap();
        assert_eq!(c.client.origin, "https://api.vendor.example");
        assert_eq!(c.erase.template.method, ureq::http::Method::DELETE);
        assert_eq!(c.locate.template.method, ureq::http::Method::POST);
        assert_eq!(c.client.pacing.retries, 4);
        assert_eq!(c.batch_size, 100);
        assert!(c.place.starts_with("https://api.vendor.example/api POST /v1/search"), "{}", c.place);
    }

    #[test]
    fn bad_keys_are_refused_naming_the_key() {
        for (extra, at_top, says) in [
            ("path_raw = \"/v1/{subject}\"", false, "unknown field"),
            ("raw_path = true", true, "unknown field"),
            ("base_url = \"https://{tenant}.vendor.example\"", true, "base_url"),
            ("base_url = \"http://api.vendor.example\"", true, "https"),
            ("base_url = \"https://u:p@api.vendor.example\"", true, "credentials"),
            ("base_url = \"https://api.vendor.example/v1?k=1\"", true, "query"),
            ("retries = 99", true, "retries"),
            ("batch_size = 0", true, "batch_size"),
            ("headers = { Authorization = \"Bearer x\" }", true, "headers.authorization"),
            ("headers = { X-User = \"{subject}\" }", true, "placeholder"),
        ] {
            let text = if at_top {
                let mut lines: Vec<&str> = BASE.lines().collect();
                if extra.starts_with("base_url") {
                    lines.remove(0);
                }
                format!("{extra}\n{}", lines.join("\n"))
            } else {
                format!("{BASE}{extra}\n")
            };
            let e = parse(&text).err().unwrap_or_else(|| panic!("{extra} accepted"));
            assert!(e.contains(says), "{extra}: {e}");
        }
        for (from, to, says) in [
            ("path = \"/v1/notes/{locator}\"", "path = \"/v1/notes/n{locator}\"", "erase.path"),
            ("path = \"/v1/notes/{locator}\"", "path = \"/v1/notes/{tenant}\"", "must use {locator}"),
            ("path = \"/v1/search\"", "path = \"/v1/search/{locator}\"", "cannot have"),
            ("user = \"{subject}\"", "user = \"x\"", "must use {subject}"),
            ("user = \"{subject}\"", "user = \"user {subject}\"", "locate.body.user"),
            ("items = \"/results\"", "items = \"results\"", "locate.items"),
        ] {
            let text = BASE.replacen(from, to, 1);
            assert_ne!(text, BASE);
            let e = parse(&text).err().unwrap_or_else(|| panic!("{to} accepted"));
            assert!(e.contains(says), "{to}: {e}");
            assert!(!e.contains("vendor.example"), "{e}");
        }
        let e = parse(&BASE.replace("[erase]\npath = \"/v1/notes/{locator}\"\n", ""))
            .err()
            .unwrap();
        assert!(e.contains("missing `erase`"), "{e}");
        let e = parse(&format!("{BASE}[status]\ndone = \"/state\"\n")).err().unwrap();
        assert!(e.contains("done_value"), "{e}");
    }

    #[test]
    fn the_token_comes_from_a_private_file_and_is_never_shown() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vendor.token");
        std::fs::write(&p, "tok-s3cret-value\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = format!("token_file = \"vendor.token\"\n{BASE}");
        let table = || toml::from_str(&text).unwrap();
        let e = Config::parse(table(), dir.path()).err().unwrap();
        assert!(e.contains("chmod 600") && !e.contains("s3cret"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Config::parse(table(), dir.path()).unwrap();
        let shown = format!("{:?}", c.client);
        assert!(!shown.contains("s3cret"), "{shown}");
        std::fs::write(&p, "tok with space\n").unwrap();
        let e = Config::parse(table(), dir.path()).err().unwrap();
        assert!(e.contains("visible ASCII") && !e.contains("space"), "{e}");
    }
}
