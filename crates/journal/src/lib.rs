//! The control plane's state: the hash-chained journal, jobs, inventories, legal holds and the
//! gate (epochs, tombstones, fences, leases, permits), all in one database so that each step
//! that must be atomic is one transaction.
//!
//! - [`Journal`] opens the store and is the only way to change it. Every change that matters
//!   appends an [`Entry`] in the same transaction, so the chain and the state cannot disagree.
//! - [`chain`]: appending and verifying the hash chain.
//! - [`gate`]: leases, permits and the freeze. The freeze is one transaction: bump the epoch or
//!   append the tombstone, close the fence, revoke the leases, journal it.
//! - [`jobs`]: the job projection, driven by [`lethe_core::state::transition`].
//!
//! The embedded backend is SQLite (WAL, `BEGIN IMMEDIATE` for every write, so several
//! processes on one machine serialize correctly). PostgreSQL comes next behind the same API.
//!
//! What it never holds: memory content. It holds identifiers (the scope, needed to resume and
//! to replay epochs into a restored backup) and, until a job completes, the locators of the
//! frozen inventory (thread ids, store keys); at completion those are dropped and only their
//! keyed digest remains in the chain.

pub mod chain;
mod entry;
pub mod gate;
pub mod holds;
pub mod jobs;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

pub use entry::Entry;

/// Errors of the control store. Messages never carry an identifier.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The database failed (locked past the busy timeout, disk full, corrupt...).
    #[error("control database {path}: {source}")]
    Db {
        /// The database file.
        path: String,
        /// The driver's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The journal URL is not one Lethe knows.
    #[error("unsupported journal '{0}': use sqlite:PATH (postgres:// is not built yet)")]
    UnsupportedUrl(String),
    /// No job with this id.
    #[error("no job {0}")]
    NoSuchJob(String),
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
    #[error("control database holds unreadable data ({0}); run `lethe journal verify`")]
    Corrupt(String),
    /// A gate refusal; see [`gate::GateError`].
    #[error(transparent)]
    Gate(#[from] gate::GateError),
}

/// Shorthand for this crate's results.
pub type Result<T, E = JournalError> = std::result::Result<T, E>;

/// The control store. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Journal {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

impl Journal {
    /// Opens (creating if needed) the control store named by a journal URL, `sqlite:PATH`.
    /// A relative path is taken relative to `base`.
    pub fn open_url(url: &str, base: &Path) -> Result<Self> {
        let path = url
            .strip_prefix("sqlite:")
            .ok_or_else(|| JournalError::UnsupportedUrl(url.to_string()))?;
        let path = Path::new(path);
        Self::open(&if path.is_absolute() {
            path.to_path_buf()
        } else {
            base.join(path)
        })
    }

    /// Opens (creating if needed) a SQLite control store.
    pub fn open(path: &Path) -> Result<Self> {
        let err = |source| JournalError::Db {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
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
        schema::migrate(&conn).map_err(err)?;
        Ok(Self {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn db(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Db {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction: the write lock is taken at the start, so
    /// the reads inside see the state the writes apply to (no check-then-act across processes).
    fn write<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.db(e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| self.db(e))?;
        Ok(out)
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.lock();
        f(&conn)
    }
}

/// Maps a driver error inside a closure that has no access to the path.
pub(crate) fn sql(e: rusqlite::Error) -> JournalError {
    JournalError::Db {
        path: String::from("(control database)"),
        source: e,
    }
}
