//! `lethe.toml`: parsed into raw structs that refuse unknown keys, then validated once into
//! typed values. Relative paths are relative to the config file.
//!
//! ```toml
//! [control]
//! journal = "sqlite:lethe-journal.db"   # the journal and the gate's state
//! key_file = "lethe.key"                # created 0600 on first use
//! policy_version = "2026-12"            # goes on every certificate
//! certificates = "certificates"         # where signed certificates are written
//! batch_size = 5000                     # at most this many locators per erase transaction
//! batch_rows = 10000                    # and at most this many frozen rows (at least one locator)
//! batch_group = 500                     # `erase --batch`: at most this many jobs side by side
//!
//! [[target]]
//! name = "memories"
//! kind = "langgraph-sqlite-store"
//! class = "primary"
//! path = "memory/store.db"
//! namespace = ["{tenant}", "{subject}"]
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use lethe_adapters::Target;
use lethe_core::Object;

/// Why a config does not load. Each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown key, a wrong type.
    #[error("config {path}: {message}")]
    Parse {
        /// The path.
        path: String,
        /// The parser's message, naming the key.
        message: String,
    },
    /// A target table is wrong.
    #[error("config {path}: {source}")]
    Target {
        /// The path.
        path: String,
        /// What is wrong.
        #[source]
        source: lethe_adapters::TargetConfigError,
    },
    /// Anything else that is invalid.
    #[error("config {path}: {message}")]
    Invalid {
        /// The path.
        path: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    control: Option<Object<RawControl>>,
    #[serde(default)]
    target: Vec<toml::Table>,
    serve: Option<Object<RawServe>>,
    #[serde(default)]
    asset: Vec<Object<RawAsset>>,
    keys: Option<Object<RawKeys>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeys {
    kek_file: PathBuf,
    #[serde(default)]
    encrypted: Vec<String>,
}

/// `[keys]`: crypto-shredding.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The key-encryption key's file (64 hex digits, 0600; made on first use).
    pub kek_file: PathBuf,
    /// The targets whose payloads runtimes write under subject data keys: a backup target
    /// covering only these is `SHREDDED` once the subject's key is destroyed.
    pub encrypted: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAsset {
    name: String,
    class: String,
    exempt: String,
}

/// A store the deployment declares but Lethe does not erase (`[[asset]]`): its name, class,
/// and the reason it is exempt. Listed on every certificate, so what was not checked is said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    /// Its name, unique among targets and assets.
    pub name: String,
    /// What it holds: one of the target classes.
    pub class: String,
    /// Why no target erases it, in words an auditor reads on the certificate.
    pub exempt: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServe {
    listen: Option<String>,
    pool: Option<usize>,
    allow_plain_http: Option<bool>,
    require_approval: Option<bool>,
    tls: Option<Object<RawTls>>,
    #[serde(default)]
    token: Vec<Object<RawToken>>,
    #[serde(default)]
    alert: Vec<Object<RawAlert>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    role: String,
    token_file: PathBuf,
    name: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: PathBuf,
    key_file: PathBuf,
}

/// `[serve] tls`: the PEM files `lethe serve` speaks HTTPS with.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain, the server's certificate first.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlert {
    url: String,
    secret_file: PathBuf,
}

/// A webhook that `lethe serve` sends alerts to (`[[serve.alert]]`).
#[derive(Debug, Clone)]
pub struct AlertSpec {
    /// Where to POST (`http://` or `https://`).
    pub url: String,
    /// The file holding the HMAC-SHA256 key the body is signed with (one line); read when the
    /// server starts.
    pub secret_file: PathBuf,
}

/// What a bearer token may do at `lethe serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An agent runtime: the gate's endpoints only.
    Runtime,
    /// An operator: the gate and jobs.
    Operator,
    /// Makes erasure requests (`POST /v1/requests`) and follows them.
    Requester,
    /// Approves or rejects requests (never its own), places and releases legal holds, reads
    /// and resumes jobs.
    Approver,
    /// Everything, and the intake switch.
    Admin,
}

impl Role {
    /// The name `[[serve.token]] role` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Runtime => "runtime",
            Role::Operator => "operator",
            Role::Requester => "requester",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }

    /// Every role, in the order messages list them.
    pub const ALL: [Role; 5] = [
        Role::Runtime,
        Role::Operator,
        Role::Requester,
        Role::Approver,
        Role::Admin,
    ];
}

/// One bearer token of `[serve]`: its role and the file holding it.
#[derive(Debug, Clone)]
pub struct TokenSpec {
    /// What the token may do.
    pub role: Role,
    /// Who holds it, as the journal records who requested and who approved (unique among the
    /// tokens; `<role>-<n>` when not given, n its place among the tokens, from 1).
    pub name: String,
    /// The file holding the token (one line); read when the server starts.
    pub token_file: PathBuf,
}

/// The `[serve]` section: how `lethe serve` listens and whom it lets in.
#[derive(Debug, Clone)]
pub struct Serve {
    /// Address to bind, e.g. `127.0.0.1:7400`.
    pub listen: String,
    /// Connections to the control store for gate requests.
    pub pool: usize,
    /// The bearer tokens.
    pub tokens: Vec<TokenSpec>,
    /// Whether `lethe serve` may listen on an address other than loopback over plain HTTP,
    /// where its bearer tokens cross the network readable. Off by default.
    pub allow_plain_http: bool,
    /// Whether every job must come from an approved request: `POST /v1/jobs` is refused (403).
    pub require_approval: bool,
    /// Webhooks alerts are sent to.
    pub alerts: Vec<AlertSpec>,
    /// HTTPS instead of plain HTTP.
    pub tls: Option<TlsFiles>,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawControl {
    journal: Option<String>,
    key_file: Option<PathBuf>,
    policy_version: Option<String>,
    certificates: Option<PathBuf>,
    batch_size: Option<usize>,
    batch_rows: Option<u64>,
    batch_group: Option<usize>,
}

/// A loaded, validated config.
#[derive(Debug)]
pub struct Config {
    /// The config file's folder; relative paths resolve against it.
    pub base: PathBuf,
    /// Journal URL, `sqlite:PATH`.
    pub journal: String,
    /// The deployment key file.
    pub key_file: PathBuf,
    /// Policy version for certificates.
    pub policy_version: String,
    /// Folder for signed certificates.
    pub certificates: PathBuf,
    /// At most this many locators per erase transaction.
    pub batch_size: usize,
    /// At most this many frozen rows per erase transaction (a batch always takes at least one
    /// locator, however many rows it has).
    pub batch_rows: u64,
    /// A batch's jobs run side by side in groups of at most this many: each group reads each
    /// store once per step, and its inventories are what a batch holds in memory.
    pub batch_group: usize,
    /// The targets, in file order.
    pub targets: Vec<Target>,
    /// Declared assets without a target, in file order.
    pub assets: Vec<Asset>,
    /// `[serve]`, for `lethe serve`.
    pub serve: Serve,
    /// `[keys]`: crypto-shredding, when configured.
    pub keys: Option<Keys>,
}

/// `[[serve.token]]` tables: roles known, names well-formed and unique.
fn tokens(
    raw: Vec<Object<RawToken>>,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<Vec<TokenSpec>, String> {
    let mut out: Vec<TokenSpec> = Vec::new();
    for (i, Object(t)) in raw.into_iter().enumerate() {
        let role = Role::ALL
            .into_iter()
            .find(|r| r.as_str() == t.role)
            .ok_or_else(|| {
                format!(
                    "serve.token role '{}' is unknown; use one of {}",
                    t.role,
                    Role::ALL.map(Role::as_str).join(", ")
                )
            })?;
        let name = t
            .name
            .unwrap_or_else(|| format!("{}-{}", role.as_str(), i + 1));
        if !crate::requests::is_token_name(&name) {
            return Err(format!(
                "serve.token name must be 1 to {} letters, digits, '.', '_', '-' or '@' \
                 (it goes in the journal as who requested or approved)",
                crate::requests::MAX_NAME
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(format!(
                "serve.token name '{name}' is given twice: each token names one holder, so \
                 that the one who approves is never the one who asked"
            ));
        }
        out.push(TokenSpec {
            role,
            name,
            token_file: resolve(t.token_file),
        });
    }
    Ok(out)
}

/// A TOML error as "line L, column C: what", without the line's text (toml's own message
/// quotes it) and without the values the message quotes: the line may hold a URL with its
/// password, and a value given the wrong type may be an identifier.
fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let what = lethe_core::redact_quoted(e.message().trim_end());
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}

/// A file as the file system names it, whether it exists yet or not (its folder resolved).
fn same_file(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
        .map(|d| d.join(name))
        .unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    }
}

/// Refuses a SQLite journal in a target's file (Lethe's tables, identifiers included, would be
/// written into the application's database), and two targets of one kind on the same file
/// (each would inventory and certify the same rows).
fn check_files(
    journal: &str,
    base: &Path,
    targets: &[lethe_adapters::Target],
) -> Result<(), String> {
    let journal = journal.strip_prefix("sqlite:").map(|p| {
        let p = Path::new(p);
        same_file(&if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        })
    });
    let mut seen: Vec<(String, &lethe_adapters::Target)> = Vec::new();
    for t in targets {
        let files: Vec<PathBuf> = t.adapter.files().iter().map(|f| same_file(f)).collect();
        if journal.as_ref().is_some_and(|j| files.contains(j)) {
            return Err(format!(
                "control.journal is a file target {} erases in: give the journal its own file",
                t.name
            ));
        }
        if let Some(key) = t.adapter.overlap_key() {
            if let Some((_, other)) = seen.iter().find(|(k, o)| *k == key && o.kind == t.kind) {
                return Err(format!(
                    "targets {} and {} are the same {} file and layout: each would \
                     inventory and certify the same rows; keep one",
                    other.name,
                    t.name,
                    t.kind.as_str()
                ));
            }
            seen.push((key, t));
        }
    }
    Ok(())
}

/// Refuses a backup target whose `covers` names no target, or another backup target (a backup
/// of backups is governed by its own retention: give it its own backup target).
fn check_covers(targets: &[lethe_adapters::Target]) -> Result<(), String> {
    for t in targets {
        for c in t.adapter.covers() {
            match targets.iter().find(|o| &o.name == c) {
                None => {
                    return Err(format!(
                        "target {} covers `{c}`, which is not a target of this file; \
                         covers names the targets whose data the backups hold",
                        t.name
                    ))
                }
                Some(o) if !o.adapter.covers().is_empty() => {
                    return Err(format!(
                        "target {} covers {c}, which is itself a backup target: covers names \
                         the stores a backup copies",
                        t.name
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Validates the `[[asset]]` tables; `names` holds the targets' names, and gets the assets'.
fn parse_assets(
    raw: Vec<Object<RawAsset>>,
    names: &mut BTreeSet<String>,
) -> Result<Vec<Asset>, String> {
    let mut assets = Vec::new();
    for (i, Object(a)) in raw.into_iter().enumerate() {
        if a.name.is_empty()
            || a.name
                .chars()
                .any(|c| c.is_control() || c.is_whitespace() || lethe_core::ident::is_invisible(c))
        {
            return Err(format!(
                "asset #{}: name must be non-empty, without spaces, control or invisible \
                 characters",
                i + 1
            ));
        }
        if !names.insert(a.name.clone()) {
            return Err(format!(
                "asset '{}': a target or another asset has that name",
                a.name
            ));
        }
        if !lethe_adapters::registry::CLASSES.contains(&a.class.as_str()) {
            return Err(format!(
                "asset '{}': unknown class; known: {}",
                a.name,
                lethe_adapters::registry::CLASSES.join(", ")
            ));
        }
        if a.exempt.trim().is_empty() || a.exempt.chars().any(char::is_control) {
            return Err(format!(
                "asset '{}': `exempt` must say why, on one line: it is written on every \
                 certificate (and so must name no person)",
                a.name
            ));
        }
        assets.push(Asset {
            name: a.name,
            class: a.class,
            exempt: a.exempt,
        });
    }
    Ok(assets)
}

impl Config {
    /// Reads and validates a config file. Touches no store.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base = if base.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base
        };
        Self::parse(&text, &base, &shown)
    }

    /// Validates config text; `shown` names it in errors.
    pub fn parse(text: &str, base: &Path, shown: &str) -> Result<Self, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: shown.into(),
            message: parse_message(text, &e),
        })?;
        let c = raw.control.map(Object::into_inner).unwrap_or_default();
        let invalid = |message: String| ConfigError::Invalid {
            path: shown.into(),
            message,
        };
        let batch_size = c.batch_size.unwrap_or(5_000);
        if batch_size == 0 || batch_size > 100_000 {
            return Err(invalid(
                "control.batch_size must be between 1 and 100000".into(),
            ));
        }
        let batch_rows = c.batch_rows.unwrap_or(10_000);
        if batch_rows == 0 || batch_rows > 10_000_000 {
            return Err(invalid(
                "control.batch_rows must be between 1 and 10000000".into(),
            ));
        }
        let batch_group = c.batch_group.unwrap_or(500);
        if batch_group == 0 || batch_group > 10_000 {
            return Err(invalid(
                "control.batch_group must be between 1 and 10000".into(),
            ));
        }
        let mut names = BTreeSet::new();
        let mut targets = Vec::new();
        for (i, t) in raw.target.into_iter().enumerate() {
            let t =
                lethe_adapters::build(i + 1, t, base).map_err(|source| ConfigError::Target {
                    path: shown.into(),
                    source,
                })?;
            // Format characters (a zero-width space, a bidi mark) would make two names that
            // print alike.
            if t.name.is_empty()
                || t.name.chars().any(|c| {
                    c.is_control() || c.is_whitespace() || lethe_core::ident::is_invisible(c)
                })
            {
                return Err(invalid(format!(
                    "target #{}: name must be non-empty, without spaces, control or invisible \
                     characters",
                    i + 1
                )));
            }
            if !names.insert(t.name.clone()) {
                return Err(invalid(format!("two targets are named '{}'", t.name)));
            }
            targets.push(t);
        }
        if targets.is_empty() {
            return Err(invalid(
                "no [[target]]: register at least one store to erase".into(),
            ));
        }
        let assets = parse_assets(raw.asset, &mut names).map_err(invalid)?;
        let policy_version = c.policy_version.unwrap_or_else(|| "1".into());
        if policy_version.trim().is_empty() || policy_version.chars().any(char::is_control) {
            return Err(invalid(
                "control.policy_version must be non-empty, one line: it is written on every \
                 certificate"
                    .into(),
            ));
        }
        let journal = c
            .journal
            .unwrap_or_else(|| "sqlite:lethe-journal.db".into());
        if journal.starts_with("sqlite://") {
            return Err(invalid(
                "control.journal: write sqlite:PATH (relative to this file's folder) or \
                 sqlite:/absolute/path; sqlite://... is neither"
                    .into(),
            ));
        }
        check_files(&journal, base, &targets).map_err(invalid)?;
        check_covers(&targets).map_err(invalid)?;
        let keys = match raw.keys.map(Object::into_inner) {
            None => None,
            Some(k) => {
                for name in &k.encrypted {
                    match targets.iter().find(|t| &t.name == name) {
                        None => {
                            return Err(invalid(format!(
                                "keys.encrypted names `{name}`, which is not a target of this file"
                            )))
                        }
                        Some(t) if !t.adapter.covers().is_empty() => {
                            return Err(invalid(format!(
                                "keys.encrypted names {name}, a backup target: name the stores \
                                 whose payloads are written encrypted"
                            )))
                        }
                        Some(_) => {}
                    }
                }
                let kek_file = if k.kek_file.is_absolute() {
                    k.kek_file
                } else {
                    base.join(k.kek_file)
                };
                if same_file(&kek_file)
                    == same_file(&{
                        let k = c.key_file.clone().unwrap_or_else(|| "lethe.key".into());
                        if k.is_absolute() {
                            k
                        } else {
                            base.join(k)
                        }
                    })
                {
                    return Err(invalid(
                        "keys.kek_file is the deployment key's file (control.key_file): give \
                         the key-encryption key its own file"
                            .into(),
                    ));
                }
                Some(Keys {
                    kek_file,
                    encrypted: k.encrypted,
                })
            }
        };
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let serve = match raw.serve.map(Object::into_inner) {
            None => Serve {
                listen: "127.0.0.1:7400".into(),
                pool: 8,
                tokens: Vec::new(),
                allow_plain_http: false,
                require_approval: false,
                alerts: Vec::new(),
                tls: None,
            },
            Some(s) => {
                let pool = s.pool.unwrap_or(8);
                if pool == 0 || pool > 256 {
                    return Err(invalid("serve.pool must be between 1 and 256".into()));
                }
                let tokens = tokens(s.token, &resolve).map_err(invalid)?;
                let alerts = s
                    .alert
                    .into_iter()
                    .map(|Object(a)| {
                        if !(a.url.starts_with("http://") || a.url.starts_with("https://")) {
                            return Err(invalid(
                                "serve.alert url must start with http:// or https://".into(),
                            ));
                        }
                        Ok(AlertSpec {
                            url: a.url,
                            secret_file: resolve(a.secret_file),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Serve {
                    listen: s.listen.unwrap_or_else(|| "127.0.0.1:7400".into()),
                    pool,
                    tokens,
                    allow_plain_http: s.allow_plain_http.unwrap_or(false),
                    require_approval: s.require_approval.unwrap_or(false),
                    alerts,
                    tls: s.tls.map(|Object(t)| TlsFiles {
                        cert_file: resolve(t.cert_file),
                        key_file: resolve(t.key_file),
                    }),
                }
            }
        };
        Ok(Self {
            base: base.to_path_buf(),
            journal,
            key_file: resolve(c.key_file.unwrap_or_else(|| "lethe.key".into())),
            policy_version,
            certificates: resolve(c.certificates.unwrap_or_else(|| "certificates".into())),
            batch_size,
            batch_rows,
            batch_group,
            targets,
            assets,
            serve,
            keys,
        })
    }
}
