//! SQLite at the driver level, under the [`crate::sql`] facade: opening a store without
//! creating it, the trigger check, names and error classification. Not a query layer: the
//! facade binds and runs statements.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::AdapterError;

/// How long a target waits for the application's locks by default.
pub(crate) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// `busy_timeout_ms` from a target's config: how long to wait for the application's locks
/// before the step fails as retryable (the job is then BLOCKED `target_unavailable`).
pub(crate) fn busy_timeout(ms: Option<u64>) -> Result<Duration, String> {
    match ms {
        None => Ok(DEFAULT_BUSY_TIMEOUT),
        Some(ms @ 1..=3_600_000) => Ok(Duration::from_millis(ms)),
        Some(_) => Err("busy_timeout_ms must be between 1 and 3600000".into()),
    }
}

/// Opens an existing SQLite file read-write. Never creates one: a wrong path is an error, not a
/// new empty store that verifies clean.
pub(crate) fn open(target: &str, path: &Path, busy: Duration) -> Result<Connection, AdapterError> {
    if !path.is_file() {
        return Err(AdapterError::Failed {
            target: target.to_string(),
            why: format!("no SQLite file at {}", path.display()),
        });
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| db(target, e))?;
    // The application may be writing: wait for its locks rather than fail at once.
    conn.busy_timeout(busy).map_err(|e| db(target, e))?;
    // Text compares as UTF-8 bytes in every query (namespace ranges, metadata read as JSON
    // text). A UTF-16 file compares 16-bit units: a namespace range took in another subject's
    // label, and SqliteSaver's UTF-8 metadata blobs read as UTF-16 matched no one.
    // LangGraph's own files are UTF-8.
    let encoding: String = conn
        .pragma_query_value(None, "encoding", |r| r.get(0))
        .map_err(|e| db(target, e))?;
    if encoding != "UTF-8" {
        return Err(AdapterError::Failed {
            target: target.to_string(),
            why: format!(
                "{} is a {encoding} SQLite file; Lethe reads UTF-8 files only (LangGraph writes UTF-8)",
                path.display()
            ),
        });
    }
    // Foreign keys off, as LangGraph's own connections have them. The bundled SQLite defaults
    // them on, and a cascade deletes rows that `changes()` does not count, which would blind
    // the anomaly guard: every row Lethe deletes, it deletes by an explicit statement and counts.
    conn.pragma_update(None, "foreign_keys", "OFF")
        .map_err(|e| db(target, e))?;
    // Erased rows are overwritten with zeros in the file, not left readable in free pages.
    conn.pragma_update(None, "secure_delete", "ON")
        .map_err(|e| db(target, e))?;
    Ok(conn)
}

/// The first of `tables` on which a `DELETE` runs a trigger, with that trigger's name if one
/// spells it plainly: an erase would run it, and what it changes is not counted (foreign keys
/// are off on Lethe's connections; triggers are not). SQLite itself decides: the plan of
/// `DELETE FROM table` calls a trigger program (`Program`) only when a trigger fires on it,
/// however its text is spelt (reading the text misses `DELETE ON"store"`, comments between the
/// words, and brackets). Nothing is executed.
pub(crate) fn delete_trigger(
    conn: &Connection,
    tables: &[&str],
) -> Result<Option<(String, String)>, rusqlite::Error> {
    for table in tables {
        let exists: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE)",
            [table],
            |r| r.get(0),
        )?;
        if !exists {
            continue;
        }
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        let mut stmt = conn.prepare(&format!("EXPLAIN DELETE FROM {quoted}"))?;
        let mut rows = stmt.query([])?;
        let mut fires = false;
        while let Some(r) = rows.next()? {
            if r.get::<_, String>(1)? == "Program" {
                fires = true;
                break;
            }
        }
        if fires {
            let name: Option<String> = conn
                .query_row(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE ORDER BY name LIMIT 1",
                    [table],
                    |r| r.get(0),
                )
                .ok();
            return Ok(Some((
                name.unwrap_or_else(|| "(unnamed)".into()),
                table.to_string(),
            )));
        }
    }
    Ok(None)
}

/// Why a trigger [`delete_trigger`] found is refused.
pub(crate) fn delete_trigger_why((name, table): (String, String)) -> String {
    format!(
        "trigger {name} on {table} runs on DELETE: an erase would run it, and what it \
         changes is not counted. Drop it, or erase what it writes as a target of its own"
    )
}

/// Maps a driver error: busy and locked are worth retrying, a read-only file is the operator's
/// to make writable, the rest is not worth retrying.
pub(crate) fn db(target: &str, e: rusqlite::Error) -> AdapterError {
    use rusqlite::ErrorCode::{CannotOpen, DatabaseBusy, DatabaseLocked, ReadOnly};
    match e.sqlite_error_code() {
        Some(ReadOnly) => AdapterError::ReadOnly {
            target: target.to_string(),
            why: e.to_string(),
        },
        Some(DatabaseBusy | DatabaseLocked | CannotOpen) => AdapterError::Unavailable {
            target: target.to_string(),
            why: e.to_string(),
        },
        _ => AdapterError::Failed {
            target: target.to_string(),
            why: e.to_string(),
        },
    }
}

/// Whether a table exists.
pub(crate) fn has_table(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [table],
        |r| r.get(0),
    )
}

/// The columns of a table.
pub(crate) fn columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    let cols = stmt.query_map([table], |r| r.get(0))?.collect();
    cols
}

/// Quotes an SQL identifier (table or column name from config) for SQLite: doubled quotes.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
