//! The control plane's state: the hash-chained journal, jobs, inventories, legal holds and the
//! gate (epochs, tombstones, fences, leases, permits), all in one database so that each step
//! that must be atomic is one transaction.
//!
//! - [`Journal`] opens the store and is the only way to change it. Every change that matters
//!   appends an [`Entry`] in the same transaction, so the chain and the state cannot disagree.
//! - [`chain`]: appending and verifying the hash chain.
//! - `gate.rs`: the control store's gate, as methods of [`Journal`]: leases, permits and the
//!   freeze. The freeze is one transaction: bump the epoch or append the tombstone, close the
//!   fence, revoke the leases, journal it. The gate's types and authorities are `lethe-gate`'s.
//! - [`jobs`]: the job projection, driven by [`lethe_core::state::transition`], and claims.
//!
//! Two backends behind one API, with the logic written once (`db`): SQLite (the embedded
//! default: WAL, `BEGIN IMMEDIATE` for every write) and PostgreSQL (several Lethe processes
//! share it: every write transaction takes one advisory lock; a running job is claimed with
//! `FOR UPDATE SKIP LOCKED`, and the claim dies with its process's connection).
//!
//! What it never holds: memory content. It holds identifiers (the scope, needed to resume and
//! to replay epochs into a restored backup) and, until a job completes, the locators of the
//! frozen inventory (thread ids, store keys); at completion those are dropped and only their
//! keyed digest remains in the chain.

mod backups;
pub mod chain;
mod db;
mod entry;
mod gate;
pub mod holds;
pub mod jobs;
pub mod keys;
pub mod lineage;
pub mod observe;
pub mod recovery;
pub mod requests;
mod schema;

use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use db::{PgTx, Prepared, SqliteTx, Tx};

pub use entry::Entry;

/// Errors of the control store. Messages never carry an identifier.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The database failed (unreachable, locked past the busy timeout, disk full...).
    #[error("control database {store}: {message}")]
    Db {
        /// Which control database (a path, or a URL without its password).
        store: String,
        /// The driver's message.
        message: String,
    },
    /// The control database's file or disk failed: a folder given as the file, a read-only
    /// file or file system, a full or failing disk. Nothing past the failing step was done.
    #[error("control database {store}: {message}: an I/O fault (a folder given as the journal file, a read-only file or file system, a full or failing disk); fix it and run the command again")]
    Io {
        /// Which control database (a path).
        store: String,
        /// The driver's or the system's message.
        message: String,
    },
    /// The journal URL is not one Lethe knows. Not shown: it may hold a password.
    #[error("unsupported control.journal: use sqlite:PATH (a file, e.g. sqlite:lethe-journal.db) or postgres://...")]
    UnsupportedUrl(String),
    /// The journal URL's settings are wrong (sslmode, a CA file, ...): a configuration error.
    #[error("control.journal: {0}")]
    BadUrl(String),
    /// No job with this id.
    #[error("no job {0}")]
    NoSuchJob(String),
    /// The job is COMPLETE: nothing more is journaled for it.
    #[error("job {0} is COMPLETE: nothing more is journaled for it")]
    Final(String),
    /// The job's state does not allow the event: an engine bug or a tampered journal.
    #[error("job {job}: {source}")]
    Transition {
        /// The job.
        job: String,
        /// The refused transition.
        #[source]
        source: lethe_core::state::InvalidTransition,
    },
    /// Stored data does not parse: the database was edited by hand or by a newer Lethe.
    #[error("control database holds unreadable data ({0})")]
    Corrupt(String),
    /// The hash chain does not verify from the last entry checked ([`Journal::check_chain`]):
    /// no job starts on it. The first problem; `lethe journal verify` lists every one.
    #[error(
        "the journal's hash chain is broken ({0}): no job starts on a journal that does not verify"
    )]
    Broken(String),
    /// A gate refusal; see [`lethe_core::gate::GateError`].
    #[error(transparent)]
    Gate(#[from] lethe_core::gate::GateError),
    /// Another process's in-process gate is this journal's authority ([`Journal::hold_gate_authority`]):
    /// a freeze here would close a fence that gate never hears of.
    #[error("another process's in-process gate (Engine::memory_gate) governs this control store: its leases and permits live in that process, which would not see this erasure's fence. Run the erasure through that process, or stop it first; nothing was touched")]
    GateAuthority,
    /// An in-process gate cannot take the authority: another process's in-process gate holds
    /// it, or a `lethe serve` shares it ([`Journal::share_gate_authority`]).
    #[error("the gate authority over this control store is taken: another process's in-process gate, or a `lethe serve`, grants permits over it (one authority per journal); stop it first")]
    GateAuthorityTaken,
}

impl JournalError {
    /// A control database's failure: [`JournalError::Io`] when SQLite or the system says the
    /// file or the disk failed (SQLite's own result texts, which do not change), else
    /// [`JournalError::Db`].
    pub(crate) fn db(store: String, message: String) -> Self {
        const IO: [&str; 8] = [
            "unable to open database file",
            "disk I/O error",
            "database or disk is full",
            "attempt to write a readonly database",
            "Is a directory",
            "Read-only file system",
            "No space left on device",
            "Input/output error",
        ];
        if IO.iter().any(|m| message.contains(m)) {
            JournalError::Io { store, message }
        } else {
            JournalError::Db { store, message }
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = JournalError> = std::result::Result<T, E>;

// One Backend per Journal, made once: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Sqlite {
        conn: Mutex<rusqlite::Connection>,
        /// Shared by every `Journal` of this process on the same file (see [`file_lock`]).
        writers: Arc<Mutex<()>>,
        /// The journal file, beside which claims are lock files ([`Journal::claim`]).
        path: PathBuf,
    },
    Postgres {
        client: Mutex<postgres::Client>,
        /// Every statement, prepared once on `client` (each run saves a round trip and a
        /// parse). Locked after `client`, never before.
        prepared: Mutex<Prepared>,
        /// Kept to open a claim's own connection.
        settings: Box<lethe_postgres::Settings>,
        /// A claim's connection being opened ahead of the claim ([`Journal::prepare_claim`]).
        spare: Mutex<Option<Spare>>,
    },
}

/// A connection opening on its own thread, and when it started.
type Spare = (
    std::time::Instant,
    std::thread::JoinHandle<std::result::Result<postgres::Client, postgres::Error>>,
);

/// A spare connection older than this is closed rather than used: one left by a job that never
/// reached its claim (a target failed its probe) may sit in a long-lived `lethe serve` for
/// hours, through a server restart or an idle timeout.
const SPARE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// The control store. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Journal {
    backend: Backend,
    /// For messages: a path, or a URL without its password.
    shown: String,
    /// Held while this journal is an in-process gate's ([`Journal::hold_gate_authority`]).
    authority: Mutex<Option<Authority>>,
    /// Set once a held authority is found gone ([`Journal::gate_authority_lost`]).
    authority_lost: Arc<std::sync::atomic::AtomicBool>,
}

/// What holds a journal's gate authority: an exclusive lock on `<journal>-gate` (SQLite), or a
/// session advisory lock on a connection of its own (PostgreSQL). Either dies with the process.
enum Authority {
    File(#[allow(dead_code)] std::fs::File),
    /// `lethe serve`'s shared hold ([`Journal::share_gate_authority`]): a lock file locked
    /// shared, or a session holding the advisory lock shared.
    Shared(#[allow(dead_code)] GateLock),
    /// The lock's connection, shared with its watchdog; dropping `stop` ends the watchdog.
    /// `shared`: `lethe serve`'s hold (the watchdog takes the lock again after a loss).
    Pg {
        client: Arc<Mutex<postgres::Client>>,
        stop: Option<std::sync::mpsc::Sender<()>>,
        shared: bool,
    },
}

impl Drop for Authority {
    fn drop(&mut self) {
        // Released before the drop returns: a closed connection's backend lets its locks go
        // a moment later, and a freeze in that moment would be refused.
        if let Authority::Pg { client, stop, .. } = self {
            stop.take();
            let _ = lock(client).batch_execute("SELECT pg_advisory_unlock_all()");
        }
    }
}

/// The gate authority's lock as taken: the locked file, or the session holding it.
enum GateLock {
    File(std::fs::File),
    Pg(Box<postgres::Client>),
}

/// How long a SQLite statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the `-wal` truncation at a job's completion waits for readers.
const WAL_TRUNCATE_WAIT: Duration = Duration::from_millis(100);

/// How often a PostgreSQL gate authority's watchdog checks that its session (and so its lock)
/// is still there.
const AUTHORITY_CHECK: Duration = Duration::from_millis(200);

/// How long that check waits for the server's answer before the session counts as gone.
const AUTHORITY_TIMEOUT: Duration = Duration::from_secs(2);

/// How often `lethe serve`'s watchdog tries to take its lost hold again.
const AUTHORITY_RETRY: Duration = Duration::from_secs(1);

/// The session advisory lock an in-process gate holds on a PostgreSQL journal; every freeze
/// takes it shared for its transaction.
pub(crate) const PG_GATE_AUTHORITY: i64 = 0x006c_6574_6867;

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("store", &self.shown)
            .finish()
    }
}

/// The advisory lock every PostgreSQL write transaction takes ("lethe" in ASCII).
const PG_WRITE_LOCK: i64 = 0x006c_6574_6865;

impl Journal {
    /// Opens (creating its tables if needed) the control store named by a journal URL:
    /// `sqlite:PATH` (relative to `base`) or `postgres://...`.
    pub fn open_url(url: &str, base: &Path) -> Result<Self> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = Path::new(path);
            return Self::open(&if path.is_absolute() {
                path.to_path_buf()
            } else {
                base.join(path)
            });
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Self::open_postgres(url, base);
        }
        Err(JournalError::UnsupportedUrl(url.to_string()))
    }

    /// Opens (creating if needed) a SQLite control store.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let err = |e: rusqlite::Error| JournalError::db(shown.clone(), e.to_string());
        let writers = file_lock(path);
        // Set up under this process's write lock of the file: switching a new file to WAL needs
        // the file to itself, and SQLite answers "database is locked" at once, without its busy
        // handler, when another connection of this process is in a transaction meanwhile (seen
        // with eight threads opening one new file at once).
        let setup = lock(&writers);
        // The journal holds scopes (identifiers) and, while a job is open, its locators: a new
        // file is readable by its owner only, and SQLite gives its -wal and -shm the same mode.
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
            {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(JournalError::db(shown.clone(), e.to_string())),
            }
        }
        let conn = rusqlite::Connection::open(path).map_err(err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        // FULL: a journaled step must survive power loss before the action it records.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        // Inventory locators are dropped at completion: overwrite them, do not just unlink.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(err)?;
        // Every statement is prepared once per connection, as on PostgreSQL: rusqlite keeps 16
        // by default, fewer than one job uses, so they were prepared again and again.
        conn.set_prepared_statement_cache_capacity(256);
        drop(setup);
        let j = Self {
            backend: Backend::Sqlite {
                conn: Mutex::new(conn),
                writers,
                path: path.to_path_buf(),
            },
            shown,
            authority: Mutex::default(),
            authority_lost: Arc::default(),
        };
        j.write(|tx| schema::migrate(tx, schema::Dialect::Sqlite).map_err(|m| j.db(m)))?;
        Ok(j)
    }

    fn open_postgres(url: &str, base: &Path) -> Result<Self> {
        let mut settings = lethe_postgres::Settings::from_url(url, base)
            .map_err(|e| JournalError::BadUrl(e.to_string()))?;
        let shown = settings.shown().to_string();
        settings
            .config_mut()
            .application_name("lethe-journal")
            .connect_timeout(Duration::from_secs(10));
        let client = settings.connect().map_err(|e| {
            use postgres::error::SqlState;
            // No such database, or credentials the server refuses: the configuration is wrong
            // (exit 2), no retry mends it (newcomer review: exit 1, as for an outage).
            let config = e.code().is_some_and(|c| {
                [
                    SqlState::INVALID_CATALOG_NAME,
                    SqlState::INVALID_PASSWORD,
                    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                ]
                .contains(c)
            });
            let hint = if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) {
                "; create it first (e.g. `createdb`): Lethe makes its tables, not the database"
            } else {
                ""
            };
            let message = db::pg_err(e);
            if config {
                JournalError::BadUrl(format!("{shown}: {message}{hint}"))
            } else {
                JournalError::Db {
                    store: shown.clone(),
                    message,
                }
            }
        })?;
        let j = Self {
            backend: Backend::Postgres {
                client: Mutex::new(client),
                prepared: Mutex::default(),
                settings: Box::new(settings),
                spare: Mutex::default(),
            },
            shown,
            authority: Mutex::default(),
            authority_lost: Arc::default(),
        };
        j.write(|tx| schema::migrate(tx, schema::Dialect::Postgres).map_err(|m| j.db(m)))?;
        Ok(j)
    }

    /// Makes this journal an in-process gate's authority, for as long as it lives: from now on a
    /// freeze through any other `Journal` of this store (another process's `lethe erase`,
    /// `work` or `serve`) is refused with [`JournalError::GateAuthority`] and touches nothing,
    /// since the in-process gate would never hear of its fence. Idempotent. Refused with the
    /// same error when another journal holds it already (or, for an instant, while another
    /// process's freeze is committing: try again). Take it before loading the gate's state,
    /// so that every freeze that got past the check is in what the gate loads.
    pub fn hold_gate_authority(&self) -> Result<()> {
        let mut held = lock(&self.authority);
        match held.as_ref() {
            Some(Authority::Shared(_) | Authority::Pg { shared: true, .. }) => {
                return Err(JournalError::GateAuthorityTaken)
            }
            Some(_) => return Ok(()),
            None => {}
        }
        match self.try_gate_lock(false)? {
            None => return Err(JournalError::GateAuthorityTaken),
            Some(GateLock::File(file)) => *held = Some(Authority::File(file)),
            Some(GateLock::Pg(c)) => {
                let c = *c;
                // The lock lives as long as the session: a server that closes the connection
                // (a restart, `pg_terminate_backend`, an idle timeout) releases it, and another
                // process's freeze would no longer be refused while the in-process gate, which
                // never hears of that fence, went on granting permits (review). A watchdog
                // checks the session every AUTHORITY_CHECK; once it is gone the gate refuses
                // every new lease and permit (`gate_authority_lost`) until the process starts
                // again and takes the lock anew.
                *held = Some(self.watched(c, None)?);
            }
        }
        Ok(())
    }

    /// For `lethe serve`, which grants permits through the journal's tables: holds the gate
    /// authority's lock shared for this journal's life, so that an in-process gate cannot load
    /// over the same store while the server runs (it would never see the server's permits),
    /// and the server does not start while one runs ([`JournalError::GateAuthority`]).
    /// Freezes take the lock shared too, so they go on. On PostgreSQL the hold is a session's,
    /// watched: while it is lost ([`Journal::gate_authority_lost`]) the server grants nothing,
    /// and the watchdog takes it back (README, "The gate").
    pub fn share_gate_authority(&self) -> Result<()> {
        let mut held = lock(&self.authority);
        if held.is_some() {
            return Ok(());
        }
        *held = Some(
            match self
                .try_gate_lock(true)?
                .ok_or(JournalError::GateAuthority)?
            {
                GateLock::File(file) => Authority::Shared(GateLock::File(file)),
                // The hold is a session's: closed by the server (a restart, an idle timeout,
                // `pg_terminate_backend`), it is gone without notice, and an in-process gate
                // could load and grant permits this server's tables never see, while the server
                // went on granting its own (review). The watchdog marks it lost, which the
                // server's lease and permit calls refuse on (503), and takes it again, shared,
                // as soon as no in-process gate holds it.
                GateLock::Pg(c) => {
                    let Backend::Postgres { settings, .. } = &self.backend else {
                        unreachable!("a PostgreSQL lock comes from a PostgreSQL journal");
                    };
                    self.watched(*c, Some(settings.as_ref().clone()))?
                }
            },
        );
        Ok(())
    }

    /// A PostgreSQL hold of the gate authority's lock, with a watchdog that checks its session
    /// every AUTHORITY_CHECK. Once the session is gone the hold is lost
    /// ([`Journal::gate_authority_lost`]): an in-process gate's for good (its state may have
    /// missed another process's freeze since, so it refuses every new lease and permit until
    /// the process starts again); `lethe serve`'s (`again`: the settings to reconnect with)
    /// until the watchdog has taken the lock again, shared (the server's state is all in the
    /// journal's tables, so nothing was missed).
    fn watched(
        &self,
        c: postgres::Client,
        again: Option<lethe_postgres::Settings>,
    ) -> Result<Authority> {
        let shared = again.is_some();
        let client = Arc::new(Mutex::new(c));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (watched, lost) = (Arc::clone(&client), Arc::clone(&self.authority_lost));
        std::thread::Builder::new()
            .name("lethe-gate-authority".into())
            .spawn(move || loop {
                let is_lost = lost.load(std::sync::atomic::Ordering::SeqCst);
                // Lost, a new session is tried every AUTHORITY_RETRY, not at every check: an
                // in-process gate may hold the lock for hours.
                let wait = if is_lost {
                    AUTHORITY_RETRY
                } else {
                    AUTHORITY_CHECK
                };
                if stopped.recv_timeout(wait) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                    return;
                }
                if !is_lost {
                    // Bounded: on a network that drops packets silently, a plain query would
                    // wait for TCP to give up (minutes), the loss unnoticed meanwhile.
                    if lock(&watched).is_valid(AUTHORITY_TIMEOUT).is_ok() {
                        continue;
                    }
                    lost.store(true, std::sync::atomic::Ordering::SeqCst);
                    match again {
                        None => {
                            tracing::error!(
                                "The gate authority's PostgreSQL session is gone: the \
                                 in-process gate refuses every new lease and permit; restart \
                                 the process"
                            );
                            return;
                        }
                        Some(_) => tracing::error!(
                            "The server's hold on the gate authority (a PostgreSQL session) \
                             is gone: leases and permits are refused (503) until it is taken \
                             again"
                        ),
                    }
                }
                let Some(settings) = &again else { return };
                let Ok(mut c) = settings.connect() else {
                    continue;
                };
                let got = c
                    .query_one(
                        "SELECT pg_try_advisory_lock_shared($1)",
                        &[&PG_GATE_AUTHORITY],
                    )
                    .is_ok_and(|r| r.get::<_, bool>(0));
                if got {
                    // Under the client's lock, which the hold's drop takes after it ends this
                    // thread (`stop`): a hold dropped meanwhile lets the new lock go at once
                    // instead of leaving it to this session's close (review).
                    let mut held = lock(&watched);
                    if stopped.try_recv() == Err(std::sync::mpsc::TryRecvError::Disconnected) {
                        let _ = c.batch_execute("SELECT pg_advisory_unlock_all()");
                        return;
                    }
                    *held = c;
                    lost.store(false, std::sync::atomic::Ordering::SeqCst);
                    tracing::info!("The server holds the gate authority again.");
                }
            })
            .map_err(|e| self.db(format!("gate authority watchdog: {e}")))?;
        Ok(Authority::Pg {
            client,
            stop: Some(stop),
            shared,
        })
    }

    /// Takes the gate authority's lock without waiting, exclusive or shared; `None` while a
    /// holder in a conflicting mode has it.
    fn try_gate_lock(&self, shared: bool) -> Result<Option<GateLock>> {
        match &self.backend {
            Backend::Sqlite { path, .. } => {
                let file =
                    gate_file(path).map_err(|e| self.db(format!("gate authority file: {e}")))?;
                let got = if shared {
                    file.try_lock_shared()
                } else {
                    file.try_lock()
                };
                match got {
                    Ok(()) => Ok(Some(GateLock::File(file))),
                    Err(std::fs::TryLockError::WouldBlock) => Ok(None),
                    Err(std::fs::TryLockError::Error(e)) => {
                        Err(self.db(format!("gate authority file: {e}")))
                    }
                }
            }
            Backend::Postgres { .. } => {
                let Some(mut c) = self.pg_connect()? else {
                    unreachable!("a PostgreSQL journal connects or fails");
                };
                let sql = if shared {
                    "SELECT pg_try_advisory_lock_shared($1)"
                } else {
                    "SELECT pg_try_advisory_lock($1)"
                };
                let got: bool = c
                    .query_one(sql, &[&PG_GATE_AUTHORITY])
                    .map_err(|e| self.db(db::pg_err(e)))?
                    .get(0);
                Ok(got.then(|| GateLock::Pg(Box::new(c))))
            }
        }
    }

    /// Set once the gate authority this journal held is found gone: on PostgreSQL, its session
    /// closed by the server. An in-process gate checks it before every grant (it stays set);
    /// `lethe serve` before every lease and permit (cleared once its hold is taken again).
    pub fn gate_authority_lost(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.authority_lost)
    }

    /// Whether this journal holds the gate authority.
    pub(crate) fn holds_gate_authority(&self) -> bool {
        lock(&self.authority).is_some()
    }

    /// On SQLite, for a freeze through a journal that is not the gate authority: a shared lock
    /// on `<journal>-gate`, held until the freeze has committed, or
    /// [`JournalError::GateAuthority`] while an in-process gate holds it. `None` on PostgreSQL
    /// (the freeze's transaction checks there) and for the authority itself.
    pub(crate) fn outside_gate_authority(&self) -> Result<Option<std::fs::File>> {
        let Backend::Sqlite { path, .. } = &self.backend else {
            return Ok(None);
        };
        if self.holds_gate_authority() {
            return Ok(None);
        }
        let file = gate_file(path).map_err(|e| self.db(format!("gate authority file: {e}")))?;
        match file.try_lock_shared() {
            Ok(()) => Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::GateAuthority),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(self.db(format!("gate authority file: {e}")))
            }
        }
    }

    /// Whether several processes may share this store (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres { .. })
    }

    pub(crate) fn db(&self, message: String) -> JournalError {
        JournalError::db(self.shown.clone(), message)
    }

    /// Runs `f` in one write transaction that holds the store's write lock from its start, so
    /// the reads inside see the state the writes apply to (no check-then-act across processes).
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write_tx(false, f)
    }

    /// [`Journal::write`] for a transaction that appends a journal entry: on PostgreSQL the
    /// journal's head is read with the write lock, in the same round trip (a job appends about
    /// fifteen entries, each a transaction of its own).
    pub(crate) fn write_entry<T>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write_tx(true, f)
    }

    fn write_tx<T>(&self, with_head: bool, f: impl FnOnce(&mut dyn Tx) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, writers, .. } => {
                let _writer = lock(writers);
                let mut conn = lock(conn);
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| self.db(e.to_string()))?;
                let out = f(&mut SqliteTx(&tx))?;
                tx.commit().map_err(|e| self.db(e.to_string()))?;
                Ok(out)
            }
            Backend::Postgres { .. } => {
                let (mut client, mut prepared) = self.pg_conn()?;
                // The transaction and its write lock in one round trip (the simple protocol
                // takes both statements in one message; the key is a constant). A journal
                // entry is a handful of round trips, so this one is felt (bench/README.md).
                let mut tx = OpenTx(Some(&mut *client));
                // And the journal's head, read after the lock (its own statement, so with a
                // snapshot taken once the lock is held): most writes append an entry, which
                // needs it.
                let head = if with_head {
                    let replies = tx
                        .client()
                        .simple_query(PG_BEGIN_WRITE_HEAD)
                        .map_err(|e| self.db(db::pg_err(e)))?;
                    Some(pg_head(&replies).map_err(|e| self.db(e))?)
                } else {
                    tx.client()
                        .batch_execute(PG_BEGIN_WRITE)
                        .map_err(|e| self.db(db::pg_err(e)))?;
                    None
                };
                let out = f(&mut PgTx {
                    client: tx.client(),
                    prepared: &mut prepared,
                    head,
                })?;
                tx.commit().map_err(|e| self.db(db::pg_err(e)))?;
                Ok(out)
            }
        }
    }

    /// SQLite: copies the write-ahead log into the database and truncates it to zero bytes
    /// (`PRAGMA wal_checkpoint(TRUNCATE)`), waiting up to the busy timeout for readers.
    /// Best effort; PostgreSQL has nothing to do here (its dead tuples: README, privacy).
    pub(crate) fn truncate_wal(&self) {
        if let Backend::Sqlite { conn, writers, .. } = &self.backend {
            let _writer = lock(writers);
            let conn = lock(conn);
            // TRUNCATE waits for readers still in the log, holding the write lock meanwhile:
            // wait briefly, not the 10 s busy timeout every gate write would stall behind
            // (review). A log left is truncated at the next completion.
            let _ = conn.busy_timeout(WAL_TRUNCATE_WAIT);
            let r = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            });
            let _ = conn.busy_timeout(BUSY_TIMEOUT);
            match r {
                Ok(0) => {}
                Ok(_) => tracing::debug!(
                    "The journal's write-ahead log was not truncated: a reader is in it."
                ),
                Err(e) => tracing::debug!(
                    error = %e,
                    "The journal's write-ahead log could not be checkpointed."
                ),
            }
        }
    }

    /// Runs `f` on a plain connection (each statement sees committed state).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => f(&mut SqliteTx(&lock(conn))),
            Backend::Postgres { .. } => {
                let (mut client, mut prepared) = self.pg_conn()?;
                f(&mut PgTx {
                    client: &mut *client,
                    prepared: &mut prepared,
                    head: None,
                })
            }
        }
    }

    /// [`Journal::read`] in one snapshot: every statement of `f` sees the store as of one
    /// moment, whatever other processes append meanwhile (a read-only transaction: deferred on
    /// SQLite, whose WAL keeps the snapshot of its first read; REPEATABLE READ on PostgreSQL).
    /// For a reader that compares tables with each other, as the chain's verification does.
    pub(crate) fn read_snapshot<T>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Sqlite { conn, .. } => {
                let conn = lock(conn);
                let tx = conn
                    .unchecked_transaction()
                    .map_err(|e| self.db(e.to_string()))?;
                let out = f(&mut SqliteTx(&tx));
                // Read only: nothing to keep, so the snapshot ends however `f` ended.
                drop(tx);
                out
            }
            Backend::Postgres { .. } => {
                let (mut client, mut prepared) = self.pg_conn()?;
                client
                    .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .map_err(|e| self.db(db::pg_err(e)))?;
                let out = f(&mut PgTx {
                    client: &mut *client,
                    prepared: &mut prepared,
                    head: None,
                });
                client
                    .batch_execute("ROLLBACK")
                    .map_err(|e| self.db(db::pg_err(e)))?;
                out
            }
        }
    }

    /// The PostgreSQL connection and its prepared statements, locked in that order. A
    /// connection the server closed (restarted, the backend terminated, an idle timeout) is
    /// replaced here by a new one: the call that met the closed connection failed (a job goes
    /// BLOCKED or exits 1, `lethe serve` answered 503), the next one works again.
    fn pg_conn(&self) -> Result<(MutexGuard<'_, postgres::Client>, MutexGuard<'_, Prepared>)> {
        let Backend::Postgres {
            client,
            prepared,
            settings,
            ..
        } = &self.backend
        else {
            unreachable!("pg_conn on SQLite");
        };
        let mut client = lock(client);
        let mut prepared = lock(prepared);
        if client.is_closed() {
            *client = settings.connect().map_err(|e| self.db(db::pg_err(e)))?;
            *prepared = Prepared::default();
            tracing::info!("Reconnected to the control store.");
        }
        Ok((client, prepared))
    }

    /// On PostgreSQL, runs one statement (its own transaction) prepared once per connection;
    /// `None` on SQLite, where the caller takes the general path.
    pub(crate) fn pg_query(
        &self,
        sql: &'static str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<Vec<postgres::Row>>> {
        if !self.is_shared() {
            return Ok(None);
        }
        let (mut client, mut prepared) = self.pg_conn()?;
        let stmt = prepared
            .get(&mut *client, sql)
            .map_err(|e| self.db(db::pg_err(e)))?;
        client
            .query(&stmt, params)
            .map(Some)
            .map_err(|e| self.db(db::pg_err(e)))
    }

    /// On PostgreSQL, starts opening the connection the next claim will hold, on its own
    /// thread, so that its handshake overlaps the caller's own work (the targets' probes, the
    /// job's request) instead of delaying the fence: about 7 ms of a job's critical path on
    /// this VM (bench/README.md). A no-op on SQLite, or when one is opening already.
    pub fn prepare_claim(&self) {
        if let Backend::Postgres {
            settings, spare, ..
        } = &self.backend
        {
            let mut spare = lock(spare);
            if spare.is_none() {
                let settings = settings.clone();
                *spare = Some((
                    std::time::Instant::now(),
                    std::thread::spawn(move || settings.connect()),
                ));
            }
        }
    }

    /// A new connection to the same PostgreSQL store (for a claim), or `None` on SQLite. The
    /// one [`Journal::prepare_claim`] opened, if it is recent and answers a round trip;
    /// otherwise a fresh attempt (whose error is the one reported).
    pub(crate) fn pg_connect(&self) -> Result<Option<postgres::Client>> {
        match &self.backend {
            Backend::Sqlite { .. } => Ok(None),
            Backend::Postgres {
                settings, spare, ..
            } => {
                // Taken under the lock, waited for outside it: a slow handshake must not hold
                // up other threads' `prepare_claim`.
                let taken = lock(spare).take();
                let ready = taken
                    .filter(|(at, _)| at.elapsed() < SPARE_MAX_AGE)
                    .and_then(|(_, h)| h.join().ok()?.ok())
                    // An idle client does not notice a server that closed it: ask once.
                    .and_then(|mut c| {
                        let alive = c.is_valid(std::time::Duration::from_secs(5)).is_ok();
                        alive.then_some(c)
                    });
                match ready {
                    Some(c) => Ok(Some(c)),
                    None => settings
                        .connect()
                        .map(Some)
                        .map_err(|e| self.db(db::pg_err(e))),
                }
            }
        }
    }
}

/// One write lock per SQLite file per process. SQLite's own busy handler sleeps and retries, so
/// under steady write traffic from several connections of one process a waiter can starve past
/// any busy timeout ("database is locked"); queueing this process's writers on a mutex first
/// leaves the busy handler only other processes to wait for.
/// `<journal>-gate`, beside the journal file, readable by its owner only.
fn gate_file(journal: &Path) -> std::io::Result<std::fs::File> {
    let mut name = journal.as_os_str().to_owned();
    name.push("-gate");
    let mut o = std::fs::OpenOptions::new();
    o.create(true).truncate(false).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(PathBuf::from(name))
}

fn file_lock(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<()>>>>> = OnceLock::new();
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut locks = lock(LOCKS.get_or_init(Default::default));
    locks.retain(|_, w| w.strong_count() > 0);
    if let Some(l) = locks.get(&key).and_then(Weak::upgrade) {
        return l;
    }
    let l = Arc::new(Mutex::new(()));
    locks.insert(key, Arc::downgrade(&l));
    l
}

/// Starts a write transaction on PostgreSQL: `BEGIN`, then the write lock ([`PG_WRITE_LOCK`]).
const PG_BEGIN_WRITE: &str = "START TRANSACTION; SELECT pg_advisory_xact_lock(465558595685)";

/// [`PG_BEGIN_WRITE`], then the journal's head (as `chain::append` reads it).
const PG_BEGIN_WRITE_HEAD: &str = "START TRANSACTION; SELECT pg_advisory_xact_lock(465558595685); \
     SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1";

const _: () = assert!(PG_WRITE_LOCK == 465558595685);

/// The head from [`PG_BEGIN_WRITE_HEAD`]'s replies: the row of its third statement, if any.
fn pg_head(
    replies: &[postgres::SimpleQueryMessage],
) -> std::result::Result<Option<(i64, String)>, String> {
    use postgres::SimpleQueryMessage as M;
    // Each statement ends with a CommandComplete; the head's rows come after the second.
    let mut done = 0;
    for m in replies {
        match m {
            M::CommandComplete(_) => done += 1,
            M::Row(r) if done == 2 => {
                let seq = r.get(0).and_then(|v| v.parse::<i64>().ok());
                let hash = r.get(1);
                return match (seq, hash) {
                    (Some(seq), Some(hash)) => Ok(Some((seq, hash.to_string()))),
                    _ => Err("the journal's head row is malformed".into()),
                };
            }
            _ => {}
        }
    }
    Ok(None)
}

/// A write transaction opened by [`PG_BEGIN_WRITE`] (or [`PG_BEGIN_WRITE_HEAD`]): rolled back when dropped uncommitted (an
/// error, or a panic), as `postgres::Transaction` would be.
struct OpenTx<'a>(Option<&'a mut postgres::Client>);

impl OpenTx<'_> {
    fn client(&mut self) -> &mut postgres::Client {
        self.0.as_deref_mut().expect("open until committed")
    }

    fn commit(mut self) -> std::result::Result<(), postgres::Error> {
        let c = self.0.take().expect("open until committed");
        c.batch_execute("COMMIT")
    }
}

impl Drop for OpenTx<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            // A broken connection has no transaction left to roll back; its next use says so.
            let _ = c.batch_execute("ROLLBACK");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
