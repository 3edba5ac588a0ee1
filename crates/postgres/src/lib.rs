//! How Lethe connects to PostgreSQL, written once for the journal and the adapters: a
//! `postgres://` URL with libpq's `sslmode` and `sslrootcert`, TLS over OpenSSL, and a URL
//! that can be shown without its password.
//!
//! What it is not: a pool, a retry loop or an error classifier (the adapters classify errors
//! for their targets, the journal for its store). Start at [`Settings::from_url`].
//!
//! `sslmode` means what it means to libpq, with one deliberate difference (no fallback to
//! plain text after a failed handshake under `prefer`):
//!
//! | sslmode | TLS | certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | when the server offers it, else plain text | only with `sslrootcert` (chain, as `verify-ca`) |
//! | `require` | always: a server without TLS is refused | only with `sslrootcert` (chain, as `verify-ca`) |
//! | `verify-ca` | always | chain against `sslrootcert` |
//! | `verify-full` | always | chain and host name (or IP address) |
//!
//! `sslrootcert=PATH` (PEM, relative to the config file's folder) is the only set of trusted
//! roots when given; `sslrootcert=system`, or no `sslrootcert` under `verify-ca`/`verify-full`,
//! trusts the system's roots (OpenSSL's default paths). As in libpq 16, `sslrootcert=system`
//! makes `verify-full` the default and refuses a weaker `sslmode`: any public CA can sign a
//! certificate for some name, so system roots mean something only with the host name checked
//! (or, explicitly, `verify-ca`). Under `require`, `verify-ca` and `verify-full` a server that
//! does not speak TLS is refused: nothing is ever downgraded.
//!
//! As with libpq, `sslmode` is ignored on a Unix-domain socket (PostgreSQL never offers TLS
//! there): a URL whose every host is a socket folder connects in plain text. In a list that
//! also names TCP hosts the mode applies to each host, so `require` and above skip a socket.

mod tls;

pub use tls::POLL_BEFORE_SLEEP;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::x509::X509;
use postgres::config::SslMode as DriverSslMode;
use postgres::{Client, NoTls};

/// What is wrong with a connection URL or its TLS settings. Messages never hold a password.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Not a `postgres://` or `postgresql://` URL.
    #[error("url must start with postgres:// or postgresql://")]
    NotPostgres,
    /// The driver refused the URL (an unknown option, a bad port...).
    #[error("url does not parse: {0}")]
    Parse(String),
    /// `sslmode` has a value libpq does not know, or one Lethe cannot honour.
    #[error("url asks sslmode={0}, which is not one of disable, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    /// `sslrootcert=system` with a mode that would not check the chain against those roots.
    #[error("url asks sslrootcert=system with sslmode={0}: the system's roots are trusted only under verify-full (the default with sslrootcert=system) or verify-ca, as libpq does")]
    SystemRootsNeedVerify(String),
    /// A TLS option Lethe does not implement (client certificates, revocation lists...).
    #[error(
        "url option {0} is not supported (of the TLS options, Lethe reads sslmode and sslrootcert)"
    )]
    Unsupported(String),
    /// The root certificate file cannot be read or holds no PEM certificate.
    #[error("url's sslrootcert {path}: {why}")]
    RootCert {
        /// The file, resolved.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// The password file cannot be read.
    #[error("password_file {path}: {why}")]
    PasswordFile {
        /// The file, resolved.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// A password in the URL and a password file: which one wins would be a guess.
    #[error("url has a password and password_file is set: keep one")]
    TwoPasswords,
    /// OpenSSL could not build a TLS context.
    #[error("TLS setup failed: {0}")]
    Tls(String),
}

/// libpq's `sslmode`, all five values that make sense without `allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, plain text when it does not.
    Prefer,
    /// TLS or nothing; the certificate is checked only when `sslrootcert` is given.
    Require,
    /// TLS, with the server's chain checked against the trusted roots.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, SettingsError> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(SettingsError::SslMode(other.to_string())),
        })
    }
}

/// Validated connection settings: everything needed to open a connection, any number of
/// times. Its `Debug` shows the URL without a password.
#[derive(Clone)]
pub struct Settings {
    config: postgres::Config,
    /// The URL the driver parses (without `sslmode`/`sslrootcert`), for async connections.
    driver_url: String,
    mode: SslMode,
    /// `None` under `disable`.
    tls: Option<tls::Tls>,
    shown: String,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Settings {
    /// Parses a `postgres://` URL. `sslmode` and `sslrootcert` are taken out of its query and
    /// applied here (the driver knows neither `verify-*` nor `sslrootcert`); the rest goes to
    /// the driver. A relative `sslrootcert` is resolved against `base`. The root certificates
    /// are read now, so a missing file is a configuration error, not a connection error.
    pub fn from_url(url: &str, base: &Path) -> Result<Self, SettingsError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(SettingsError::NotPostgres);
        }
        let (head, query) = split_query(url);
        let mut mode: Option<(SslMode, String)> = None;
        let mut root: Option<String> = None;
        let mut rest = Vec::new();
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "sslmode" => {
                    let v = percent_decode(v);
                    mode = Some((SslMode::parse(&v)?, v));
                }
                "sslrootcert" => root = Some(percent_decode(v)),
                // Left to the driver: it knows these.
                "sslnegotiation" => rest.push(kv),
                k if k.starts_with("ssl") || k == "requiressl" => {
                    return Err(SettingsError::Unsupported(k.to_string()))
                }
                _ => rest.push(kv),
            }
        }
        let mode = match (mode, root.as_deref()) {
            (None, Some("system")) => SslMode::VerifyFull,
            (None, _) => SslMode::Prefer,
            (Some((m @ (SslMode::VerifyCa | SslMode::VerifyFull), _)), _) => m,
            (Some((_, given)), Some("system")) => {
                return Err(SettingsError::SystemRootsNeedVerify(given))
            }
            (Some((m, _)), _) => m,
        };
        let driver_url = if rest.is_empty() {
            head.to_string()
        } else {
            format!("{head}?{}", rest.join("&"))
        };
        let mut config: postgres::Config = driver_url
            .parse()
            .map_err(|e: postgres::Error| SettingsError::Parse(e.to_string()))?;
        // libpq ignores `sslmode` on a Unix-domain socket, and PostgreSQL never offers TLS
        // there: a URL whose every host is a socket folder connects in plain text whatever it
        // asks, where the driver would try a handshake with no server name and fail.
        let mode = if unix_sockets_only(&config) {
            SslMode::Disable
        } else {
            mode
        };
        config.ssl_mode(match mode {
            SslMode::Disable => DriverSslMode::Disable,
            SslMode::Prefer => DriverSslMode::Prefer,
            // The driver refuses a server that answers "no TLS" to Require: never a downgrade.
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => DriverSslMode::Require,
        });
        let tls = match mode {
            SslMode::Disable => None,
            _ => Some(connector(mode, root.as_deref(), base)?),
        };
        Ok(Self {
            config,
            driver_url,
            mode,
            tls,
            shown: hide_password(url),
        })
    }

    /// Sets the password from the first line of a file (relative to `base`), for a URL that
    /// has none.
    pub fn read_password_file(&mut self, file: &Path, base: &Path) -> Result<(), SettingsError> {
        if self.config.get_password().is_some() {
            return Err(SettingsError::TwoPasswords);
        }
        let path = if file.is_absolute() {
            file.to_path_buf()
        } else {
            base.join(file)
        };
        let password = read_password_file(&path).map_err(|why| SettingsError::PasswordFile {
            path: path.clone(),
            why,
        })?;
        self.config.password(password.as_bytes());
        Ok(())
    }

    /// The driver's settings, for the caller's own options (application name, timeouts).
    pub fn config_mut(&mut self) -> &mut postgres::Config {
        &mut self.config
    }

    /// The `sslmode` in force.
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// The database the connection opens (the user's name when the URL names none, as libpq).
    pub fn database(&self) -> &str {
        self.config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or("")
    }

    /// The URL without its password, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Opens a connection with these settings, within `connect_timeout` when one is set.
    ///
    /// The driver's `connect_timeout` bounds only the TCP connect; libpq's bounds the whole
    /// connection, TLS handshake, startup and authentication included. A server that accepts
    /// and then says nothing (a hung backend behind a proxy, a black hole) would otherwise hang
    /// the job, so the connection opens on a thread of its own and the caller stops waiting at
    /// the deadline with a timeout error (retryable: the job blocks). That thread is left to
    /// finish or fail on its own; what it opens late is closed.
    pub fn connect(&self) -> Result<Client, postgres::Error> {
        let Some(limit) = self.config.get_connect_timeout().copied() else {
            return self.connect_now();
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let this = self.clone();
        std::thread::Builder::new()
            .name("lethe-pg-connect".into())
            .spawn(move || {
                let _ = tx.send(this.connect_now());
            })
            .map_err(|_| postgres::Error::__private_api_timeout())?;
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| Err(postgres::Error::__private_api_timeout()))
    }

    fn connect_now(&self) -> Result<Client, postgres::Error> {
        let mut client = match &self.tls {
            None => self.config.connect(NoTls),
            Some(tls) => self.config.connect(tls.polling()),
        }?;
        client.batch_execute(SESSION)?;
        Ok(client)
    }
}

/// A connection's driving future, to be spawned on the caller's runtime.
pub type Connection =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

impl Settings {
    /// Opens an asynchronous connection with these settings (same TLS, password and modes),
    /// for callers on a tokio runtime; spawn the returned [`Connection`] there.
    pub async fn connect_async(
        &self,
        application_name: &str,
    ) -> Result<(tokio_postgres::Client, Connection), tokio_postgres::Error> {
        let mut c: tokio_postgres::Config = self.driver_url.parse()?;
        c.ssl_mode(self.config.get_ssl_mode());
        if let Some(pw) = self.config.get_password() {
            c.password(pw);
        }
        c.application_name(application_name);
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(std::time::Duration::from_secs(10));
        c.connect_timeout(limit);
        // As in `connect`: the whole connection within the limit, not only its TCP connect.
        let opened = async {
            Ok::<_, tokio_postgres::Error>(match &self.tls {
                None => {
                    let (client, conn) = c.connect(tokio_postgres::NoTls).await?;
                    (client, Box::pin(conn) as Connection)
                }
                Some(tls) => {
                    let (client, conn) = c.connect(tls.clone()).await?;
                    (client, Box::pin(conn) as Connection)
                }
            })
        };
        tokio::time::timeout(limit, opened)
            .await
            .unwrap_or_else(|_| Err(tokio_postgres::Error::__private_api_timeout()))
    }
}

/// Whether every host of a URL is a Unix-domain socket folder (`host=/run/postgresql`, or a
/// percent-encoded path in the authority) and no `hostaddr` sends a host over TCP instead.
fn unix_sockets_only(config: &postgres::Config) -> bool {
    #[cfg(unix)]
    {
        let hosts = config.get_hosts();
        !hosts.is_empty()
            && config.get_hostaddrs().is_empty()
            && hosts
                .iter()
                .all(|h| matches!(h, postgres::config::Host::Unix(_)))
    }
    #[cfg(not(unix))]
    {
        let _ = config;
        false
    }
}

/// A driver error as one line: the server's message and SQLSTATE, or the client-side error
/// with its causes (the driver's own text for a TLS failure is only "error performing TLS
/// handshake"; the cause says which certificate check failed). Never holds a password, and
/// never a message that may quote row data (`row_data_may_show`): its SQLSTATE stands alone.
pub fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        if row_data_may_show(code, db.file(), db.routine()) {
            return format!(
                "the database refused with SQLSTATE {code} (its message is not shown: it may quote row data)"
            );
        }
        return format!("{} ({code})", db.message());
    }
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// Whether a server error's message may quote the data of a row. DETAIL, HINT and CONTEXT are
/// never shown; the message itself is PostgreSQL's own sentence, which names objects (tables,
/// columns, constraints) but no values, except in two cases: a data exception (class `22`:
/// `invalid input syntax for type integer: "..."`), and a message a function or trigger wrote
/// itself (`RAISE` in PL/pgSQL or another procedural language, an application's audit trigger
/// refusing a delete "of" a row), which may say anything.
fn row_data_may_show(code: &str, file: Option<&str>, routine: Option<&str>) -> bool {
    code.starts_with("22")
        || code.starts_with("P0")
        || routine == Some("exec_stmt_raise")
        || file.is_some_and(|f| f.starts_with("pl"))
}

/// The TLS set-up for a mode: which roots are trusted (a `sslrootcert` file's, and no others,
/// as libpq), and whether the chain and the host name are checked (`tls.rs`).
fn connector(mode: SslMode, root: Option<&str>, base: &Path) -> Result<tls::Tls, SettingsError> {
    let tls = |e: openssl::error::ErrorStack| SettingsError::Tls(e.to_string());
    let own_roots: Option<Arc<Vec<X509>>> = match root {
        None | Some("system") => None,
        Some(file) => {
            let path = if Path::new(file).is_absolute() {
                PathBuf::from(file)
            } else {
                base.join(file)
            };
            let bad = |why: String| SettingsError::RootCert {
                path: path.clone(),
                why,
            };
            let pem = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
            let certs = X509::stack_from_pem(&pem).map_err(|e| bad(e.to_string()))?;
            if certs.is_empty() {
                return Err(bad("no PEM certificate in it".into()));
            }
            Some(Arc::new(certs))
        }
    };
    let (check_chain, check_host) = match mode {
        SslMode::Disable => (false, false),
        // libpq: with a root certificate at hand, prefer and require check the chain.
        SslMode::Prefer | SslMode::Require => (own_roots.is_some(), false),
        SslMode::VerifyCa => (true, false),
        SslMode::VerifyFull => (true, true),
    };
    tls::Tls::new(check_chain, check_host, own_roots).map_err(tls)
}

/// `%XX` escapes decoded (a path with a space is written `%20` in a URL); anything else kept.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Run on every connection once it is open. Every statement Lethe sends is written for READ
/// COMMITTED: each sees what committed before it began (the gate's checks after its locks, the
/// freeze's drain set after the scope's lock). A database or role may default to another level,
/// so each connection sets its own. A statement, not a startup option: a connection pooler
/// (PgBouncer) refuses the `options` startup parameter in its default configuration.
pub const SESSION: &str = "SET default_transaction_isolation = 'read committed'";

/// A URL's part before its query and the query, split where the driver splits them: at the
/// first `?` after the user part (which runs to the first `@` after the scheme, if any).
fn split_query(url: &str) -> (&str, &str) {
    let from = url
        .find("://")
        .map(|i| i + 3)
        .and_then(|s| url[s..].find('@').map(|at| s + at + 1))
        .unwrap_or(0);
    match url[from..].find('?') {
        Some(q) => (&url[..from + q], &url[from + q + 1..]),
        None => (url, ""),
    }
}

/// The URL with the password taken out of its user part and of its query. The user part ends
/// where the driver ends it: at the first `@` after the scheme, wherever that is, so a password
/// holding `?` or `/` (which the driver accepts unencoded) is taken out too.
fn hide_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = match rest.split_once('@') {
        Some((cred, host)) => format!("{}@{host}", cred.split(':').next().unwrap_or("")),
        None => rest.to_string(),
    };
    let (head, query) = split_query(&rest);
    let head = if scheme.is_empty() {
        head.to_string()
    } else {
        format!("{scheme}://{head}")
    };
    let query: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("password="))
        .collect();
    if query.is_empty() {
        head
    } else {
        format!("{head}?{}", query.join("&"))
    }
}

/// A password file's first line: refused when group or others can read the file (as the key
/// file and the server's token files are) or when that line is empty.
pub fn read_password_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| e.to_string())?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "readable by group or others (mode {:o}); chmod 600 it",
                mode & 0o777
            ));
        }
    }
    let first = text.lines().next().unwrap_or("");
    if first.is_empty() {
        return Err("its first line (the password) is empty".into());
    }
    Ok(first.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_password_file_others_can_read_or_without_a_password_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "s3cret\nignored\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = super::read_password_file(&p).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        assert!(!e.contains("s3cret"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(super::read_password_file(&p).unwrap(), "s3cret");
        std::fs::write(&p, "\n").unwrap();
        assert!(super::read_password_file(&p).unwrap_err().contains("empty"));
    }

    use super::*;

    fn parse(url: &str) -> Result<Settings, SettingsError> {
        Settings::from_url(url, Path::new("."))
    }

    #[test]
    fn sslmode_defaults_to_prefer_and_maps_to_the_driver() {
        let s = parse("postgres://u@h/db").unwrap();
        assert_eq!(s.ssl_mode(), SslMode::Prefer);
        assert_eq!(s.config.get_ssl_mode(), DriverSslMode::Prefer);
        let s = parse("postgres://u@h/db?sslmode=disable").unwrap();
        assert!(s.tls.is_none());
        assert_eq!(s.config.get_ssl_mode(), DriverSslMode::Disable);
        for m in ["require", "verify-ca", "verify-full"] {
            let s = parse(&format!("postgres://u@h/db?sslmode={m}")).unwrap();
            // Never Prefer: a server without TLS must be refused, not used in plain text.
            assert_eq!(s.config.get_ssl_mode(), DriverSslMode::Require, "{m}");
            assert!(s.tls.is_some());
        }
    }

    /// As libpq: `sslmode` means nothing on a Unix-domain socket, whatever it asks; a list
    /// that also names a TCP host keeps its mode (the socket's host then connects only where
    /// the mode allows plain text).
    #[test]
    fn a_unix_socket_ignores_sslmode_as_libpq_does() {
        for url in [
            "postgres://u@%2Frun%2Fpostgresql/db",
            "postgres://u@%2Frun%2Fpostgresql:5433/db?sslmode=require",
            "postgres:///db?host=/run/postgresql&user=u&sslmode=verify-full",
        ] {
            let s = parse(url).unwrap();
            assert_eq!(s.ssl_mode(), SslMode::Disable, "{url}");
            assert_eq!(s.config.get_ssl_mode(), DriverSslMode::Disable, "{url}");
            assert!(s.tls.is_none(), "{url}");
        }
        for url in [
            "postgres://u@%2Frun%2Fpostgresql,db.internal/db?sslmode=require",
            "postgres:///db?host=/run/postgresql&hostaddr=10.0.0.5&sslmode=require",
        ] {
            let s = parse(url).unwrap();
            assert_eq!(s.ssl_mode(), SslMode::Require, "{url}");
            assert_eq!(s.config.get_ssl_mode(), DriverSslMode::Require, "{url}");
        }
        // The TCP form of the same URL is untouched.
        assert_eq!(
            parse("postgres://u@localhost/db?sslmode=require")
                .unwrap()
                .ssl_mode(),
            SslMode::Require
        );
    }

    /// Over the Unix socket of the TLS-only server (`scripts/pg start-tls`, which trusts local
    /// connections): every mode connects, in plain text, synchronously and asynchronously. A
    /// list with the socket first and the TCP host second falls through to TCP under `require`.
    #[test]
    fn a_unix_socket_connects_in_plain_text_under_every_sslmode() {
        let dir = std::env::var("LETHE_PG_TLS_SOCKET_DIR")
            .unwrap_or_else(|_| "/var/tmp/lethe-pgtls".into());
        let url = std::env::var("LETHE_PG_TLS_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54319/postgres".into());
        let port = url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .unwrap()
            .to_string();
        let ca = std::env::var("LETHE_PG_TLS_CA")
            .unwrap_or_else(|_| "/var/tmp/lethe-pgtls.certs/ca.pem".into());
        let ssl_in_use = |c: &mut Client| -> (bool, bool) {
            let row = c
                .query_one(
                    "SELECT ssl, inet_server_addr() IS NULL FROM pg_stat_ssl \
                     WHERE pid = pg_backend_pid()",
                    &[],
                )
                .unwrap();
            (row.get(0), row.get(1))
        };
        for q in [
            String::new(),
            "&sslmode=prefer".into(),
            "&sslmode=require".into(),
            format!("&sslmode=verify-full&sslrootcert={ca}"),
        ] {
            let u = format!("postgres:///postgres?host={dir}&port={port}&user=postgres{q}");
            let s = parse(&u).unwrap();
            let mut c = s
                .connect()
                .unwrap_or_else(|e| panic!("{q}: {}", describe(&e)));
            assert_eq!(
                ssl_in_use(&mut c),
                (false, true),
                "{q}: plain text, over the socket"
            );
        }
        let s = parse(&format!(
            "postgres:///postgres?host={dir}&port={port}&user=postgres&sslmode=require"
        ))
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (c, conn) = s.connect_async("lethe-test").await.expect("async, socket");
            tokio::spawn(conn);
            let row = c
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap();
            assert!(!row.get::<_, bool>(0));
        });
        // Socket first, then TCP: `require` skips the socket (no TLS there) and uses TCP, with
        // TLS; `prefer` takes the socket.
        let hosts = format!(
            "postgres://postgres@{}:{port},127.0.0.1:{port}/postgres",
            dir.replace('/', "%2F")
        );
        let mut c = parse(&format!("{hosts}?sslmode=require"))
            .unwrap()
            .connect()
            .unwrap_or_else(|e| panic!("require, two hosts: {}", describe(&e)));
        assert_eq!(ssl_in_use(&mut c), (true, false), "require: TLS over TCP");
        let mut c = parse(&format!("{hosts}?sslmode=prefer"))
            .unwrap()
            .connect()
            .unwrap_or_else(|e| panic!("prefer, two hosts: {}", describe(&e)));
        assert_eq!(ssl_in_use(&mut c), (false, true), "prefer: the socket");
    }

    /// The number of trusted roots a mode's connections start from.
    fn roots(url: &str) -> usize {
        let s = parse(url).unwrap();
        s.tls.unwrap().context_roots()
    }

    /// The system's bundle is loaded only for a mode that trusts it: `prefer` and `require`
    /// never look at a root, and a `sslrootcert` file replaces them (it is added per
    /// connection). Loading it took 26-45 ms of every process's start-up (`tls.rs`).
    #[test]
    fn system_roots_are_loaded_only_where_they_are_trusted() {
        for q in ["", "?sslmode=prefer", "?sslmode=require"] {
            assert_eq!(roots(&format!("postgres://u@h/db{q}")), 0, "{q}");
        }
        for q in [
            "?sslmode=verify-full",
            "?sslmode=verify-ca",
            "?sslmode=verify-full&sslrootcert=system",
        ] {
            assert!(
                roots(&format!("postgres://u@h/db{q}")) > 0,
                "{q}: this machine has a system bundle (ca-certificates), so it must be loaded"
            );
        }
    }

    /// Over TLS, a synchronous connection polls for a while before it sleeps. A reply slower
    /// than that is still read, by the sleep that follows, and the connection goes on: on the
    /// TLS-only server `scripts/pg start-tls` runs (LETHE_PG_TLS_URL, LETHE_PG_TLS_CA).
    #[test]
    fn over_tls_a_reply_slower_than_the_poll_is_read_and_the_connection_goes_on() {
        let url = std::env::var("LETHE_PG_TLS_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54319/postgres".into());
        let ca = std::env::var("LETHE_PG_TLS_CA")
            .unwrap_or_else(|_| "/var/tmp/lethe-pgtls.certs/ca.pem".into());
        let s = parse(&format!("{url}?sslmode=verify-full&sslrootcert={ca}")).unwrap();
        let mut c = s
            .connect()
            .expect("the TLS server (scripts/test starts it: scripts/pg start-tls)");
        let tls: bool = c
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(
            tls,
            "the connection must be TLS for this test to mean anything"
        );
        let start = std::time::Instant::now();
        let n: i32 = c
            .query_one("SELECT 7 FROM pg_sleep(0.02)", &[])
            .unwrap()
            .get(0);
        assert!(
            start.elapsed() > POLL_BEFORE_SLEEP * 10,
            "the reply outlasted the poll"
        );
        assert_eq!(n, 7);
        for i in 0..50i32 {
            let back: i32 = c.query_one("SELECT $1::int4", &[&i]).unwrap().get(0);
            assert_eq!(back, i);
        }
    }

    /// A server that accepts the TCP connection and never answers: the connection fails at
    /// `connect_timeout`, whether it waits on the TLS request (`prefer`) or on the startup
    /// (`disable`), where the driver alone would wait for ever.
    #[test]
    fn connect_timeout_bounds_the_whole_connection_not_only_tcp() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let held = std::thread::spawn(move || {
            // Accept three connections and keep them open, saying nothing.
            let a = silent.accept().unwrap();
            let b = silent.accept().unwrap();
            let c = silent.accept().unwrap();
            (a, b, c)
        });
        for mode in ["prefer", "disable"] {
            let s = parse(&format!(
                "postgres://u@127.0.0.1:{port}/db?sslmode={mode}&connect_timeout=1"
            ))
            .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let r = s.connect().map(|_| ());
                let _ = tx.send((r, started.elapsed()));
            });
            let (r, took) = rx
                .recv_timeout(std::time::Duration::from_secs(15))
                .unwrap_or_else(|_| panic!("{mode}: still waiting after 15 s"));
            let e = r.expect_err("nothing answered");
            assert!(describe(&e).contains("timeout"), "{mode}: {}", describe(&e));
            assert!(took < std::time::Duration::from_secs(5), "{mode}: {took:?}");
        }
        // The asynchronous connections (`lethe serve`) too.
        let s = parse(&format!(
            "postgres://u@127.0.0.1:{port}/db?sslmode=prefer&connect_timeout=1"
        ))
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let r = rt.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(15),
                s.connect_async("lethe-test"),
            )
            .await
        });
        let e = r
            .expect("gave up by itself, not after 15 s")
            .err()
            .expect("nothing answered");
        assert!(e.to_string().contains("timeout"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        drop(held);
    }

    #[test]
    fn sslrootcert_system_means_verify_full_and_refuses_weaker_modes() {
        // As libpq 16: system roots are only worth trusting with the chain checked.
        let s = parse("postgres://u@h/db?sslrootcert=system").unwrap();
        assert_eq!(s.ssl_mode(), SslMode::VerifyFull);
        assert_eq!(s.config.get_ssl_mode(), DriverSslMode::Require);
        let s = parse("postgres://u@h/db?sslrootcert=system&sslmode=verify-ca").unwrap();
        assert_eq!(s.ssl_mode(), SslMode::VerifyCa);
        for m in ["disable", "prefer", "require"] {
            // Either order of the options.
            for url in [
                format!("postgres://u@h/db?sslmode={m}&sslrootcert=system"),
                format!("postgres://u@h/db?sslrootcert=system&sslmode={m}"),
            ] {
                match parse(&url) {
                    Err(e @ SettingsError::SystemRootsNeedVerify(_)) => {
                        assert!(e.to_string().contains(&format!("sslmode={m}")), "{e}")
                    }
                    other => panic!("{url}: expected a refusal, got {other:?}"),
                }
            }
        }
        // Without sslrootcert the default is still prefer.
        assert_eq!(
            parse("postgres://u@h/db").unwrap().ssl_mode(),
            SslMode::Prefer
        );
    }

    #[test]
    fn refuses_unknown_modes_client_certs_and_missing_roots() {
        assert!(matches!(
            parse("postgres://u@h/db?sslmode=allow"),
            Err(SettingsError::SslMode(_))
        ));
        assert!(matches!(
            parse("postgres://u@h/db?sslcert=c.pem"),
            Err(SettingsError::Unsupported(_))
        ));
        let e = parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("empty.pem"), "not a certificate\n").unwrap();
        assert!(matches!(
            Settings::from_url("postgres://u@h/db?sslrootcert=empty.pem", dir.path()),
            Err(SettingsError::RootCert { .. })
        ));
        assert!(matches!(
            parse("mysql://h/db"),
            Err(SettingsError::NotPostgres)
        ));
    }

    #[test]
    fn other_options_still_reach_the_driver() {
        let s = parse("postgres://u@h:1/db?sslmode=require&connect_timeout=7").unwrap();
        assert_eq!(
            s.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(7))
        );
        assert!(matches!(
            parse("postgres://u@h/db?sslmode=require&bogus=1"),
            Err(SettingsError::Parse(_))
        ));
    }

    /// A message a trigger raised (an application's audit trigger quoting the row) and a data
    /// exception quoting a value are shown by their SQLSTATE alone; PostgreSQL's own messages
    /// about objects stay readable. Against the PostgreSQL at LETHE_PG15_URL.
    #[test]
    fn messages_that_may_quote_row_data_are_not_shown() {
        let url = std::env::var("LETHE_PG15_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let mut c = parse(&url).unwrap().connect().unwrap();
        let raised = c
            .batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION 'audit refuses delete of %', 'ROWZQX'; END $$",
            )
            .unwrap_err();
        let raised_with_code = c
            .batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'ROWZQX'; END $$",
            )
            .unwrap_err();
        let bad_value = c.query("SELECT 'ROWZQX'::int", &[]).unwrap_err();
        for (e, code) in [
            (&raised, "P0001"),
            (&raised_with_code, "42501"),
            (&bad_value, "22P02"),
        ] {
            let text = describe(e);
            assert!(!text.contains("ROWZQX"), "{text}");
            assert!(text.contains(code), "{text}");
        }
        let missing = c
            .query("SELECT 1 FROM lethe_no_such_table", &[])
            .unwrap_err();
        assert_eq!(
            describe(&missing),
            "relation \"lethe_no_such_table\" does not exist (42P01)"
        );
    }

    #[test]
    fn passwords_are_never_shown() {
        let s = parse("postgres://u:secret@h:5432/db?sslmode=prefer&password=other").unwrap();
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("other"),
            "{shown}"
        );
        assert!(
            shown.starts_with("postgres://u@h:5432/db?sslmode=prefer"),
            "{shown}"
        );
        // The driver takes a password up to the first `@`, `?` and `/` included.
        for (url, password) in [
            (
                "postgres://app:s3cret?PWZQ@127.0.0.1:5999/db",
                &b"s3cret?PWZQ"[..],
            ),
            ("postgres://app:a/b?c@h/db?sslmode=disable", &b"a/b?c"[..]),
        ] {
            let s = parse(url).unwrap();
            if url.ends_with("disable") {
                assert_eq!(
                    s.ssl_mode(),
                    SslMode::Disable,
                    "the query after the user part"
                );
            }
            assert_eq!(s.config.get_password(), Some(password), "{url}");
            let shown = s.shown();
            let secret = std::str::from_utf8(password).unwrap();
            assert!(!shown.contains(secret), "{shown}");
            assert!(
                shown.starts_with("postgres://app@h")
                    || shown.starts_with("postgres://app@127.0.0.1:5999/db"),
                "{shown}"
            );
        }
    }

    #[test]
    fn password_file_is_read_and_conflicts_with_a_url_password() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "s3cret\nignored\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.path().join("pw"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let mut s = parse("postgres://u@h/db").unwrap();
        s.read_password_file(Path::new("pw"), dir.path()).unwrap();
        assert_eq!(s.config.get_password(), Some(&b"s3cret"[..]));
        let mut s = parse("postgres://u:x@h/db").unwrap();
        assert!(matches!(
            s.read_password_file(Path::new("pw"), dir.path()),
            Err(SettingsError::TwoPasswords)
        ));
    }

    #[test]
    fn percent_escapes_are_decoded() {
        assert_eq!(percent_decode("/a%20b/c.pem"), "/a b/c.pem");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
