//! The hash chain: append inside a transaction, verify from the start.
//!
//! Each entry's hash is SHA-256 over its format, sequence number, time, job, kind, body and the
//! previous entry's hash. `lethe_meta.head` holds the last sequence number and hash, written in
//! the same transaction as the entry, so deleting the newest entries is caught too. Verification
//! also replays every job's transitions and compares them with the job table.
//!
//! What it does not stop: someone with write access who recomputes the whole chain. Signed
//! certificates, kept elsewhere, are the anchor against that.

use std::collections::HashMap;

use lethe_core::state::{transition, JobState};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use sha2::{Digest, Sha256};

use crate::entry::Entry;
use crate::{sql, Journal, JournalError, Result};

/// The entry format written now.
pub const FORMAT: i64 = 1;
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn entry_hash(
    prev: &str,
    seq: i64,
    format: i64,
    at: &str,
    job: Option<&str>,
    kind: &str,
    body: &str,
) -> String {
    let mut h = Sha256::new();
    for part in [
        prev,
        &seq.to_string(),
        &format.to_string(),
        at,
        job.unwrap_or(""),
        kind,
        body,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Appends `entry` inside `tx`. Returns its sequence number.
pub(crate) fn append(
    tx: &Transaction<'_>,
    at: &str,
    job: Option<&str>,
    entry: &Entry,
) -> Result<i64> {
    let head: Option<(i64, String)> = tx
        .query_row(
            "SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql)?;
    let (prev_seq, prev_hash) = head.unwrap_or((0, GENESIS.to_string()));
    let seq = prev_seq + 1;
    let kind = entry.kind();
    let body = serde_json::to_string(entry).map_err(|e| JournalError::Corrupt(e.to_string()))?;
    let hash = entry_hash(&prev_hash, seq, FORMAT, at, job, &kind, &body);
    tx.execute(
        "INSERT INTO journal (seq, format, at, job_id, kind, body, prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![seq, FORMAT, at, job, kind, body, prev_hash, hash],
    )
    .map_err(sql)?;
    tx.execute(
        "INSERT INTO lethe_meta (k, v) VALUES ('head', ?1) ON CONFLICT (k) DO UPDATE SET v = ?1",
        [format!("{seq}:{hash}")],
    )
    .map_err(sql)?;
    Ok(seq)
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChainReport {
    /// Entries checked.
    pub entries: u64,
    /// Jobs replayed.
    pub jobs: u64,
    /// Problems, first one first. Empty means the chain is intact.
    pub problems: Vec<String>,
}

impl ChainReport {
    /// Whether nothing was wrong.
    pub fn is_intact(&self) -> bool {
        self.problems.is_empty()
    }
}

fn verify_conn(conn: &Connection) -> Result<ChainReport> {
    let mut problems = Vec::new();
    let mut stmt = conn
        .prepare(
            "SELECT seq, format, at, job_id, kind, body, prev_hash, hash FROM journal ORDER BY seq",
        )
        .map_err(sql)?;
    let mut rows = stmt.query([]).map_err(sql)?;
    let mut expected_seq = 1i64;
    let mut prev = GENESIS.to_string();
    let mut states: HashMap<String, JobState> = HashMap::new();
    let mut entries = 0u64;
    while let Some(r) = rows.next().map_err(sql)? {
        let seq: i64 = r.get(0).map_err(sql)?;
        let format: i64 = r.get(1).map_err(sql)?;
        let at: String = r.get(2).map_err(sql)?;
        let job: Option<String> = r.get(3).map_err(sql)?;
        let kind: String = r.get(4).map_err(sql)?;
        let body: String = r.get(5).map_err(sql)?;
        let prev_hash: String = r.get(6).map_err(sql)?;
        let hash: String = r.get(7).map_err(sql)?;
        entries += 1;
        if seq != expected_seq {
            problems.push(format!(
                "entry {expected_seq} is missing (next found is {seq})"
            ));
        }
        if prev_hash != prev {
            problems.push(format!("entry {seq} does not follow the entry before it (reordered or a deletion before it)"));
        }
        if entry_hash(&prev_hash, seq, format, &at, job.as_deref(), &kind, &body) != hash {
            problems.push(format!(
                "entry {seq} was edited: its hash does not match its content"
            ));
        }
        match serde_json::from_str::<Entry>(&body) {
            Ok(entry) => {
                if let (Some(job), true) = (&job, matches!(entry, Entry::JobRequested { .. })) {
                    states.insert(job.clone(), JobState::Requested);
                } else if let (Some(job), Some(ev)) = (&job, entry.event()) {
                    match states.get(job).copied().map(|s| transition(s, ev)) {
                        Some(Ok(next)) => {
                            states.insert(job.clone(), next);
                        }
                        Some(Err(e)) => problems.push(format!("entry {seq}: job {job}: {e}")),
                        None => {
                            problems.push(format!("entry {seq}: job {job} was never requested"))
                        }
                    }
                } else if let (Some(job), Entry::Completed { .. }) = (&job, &entry) {
                    if states.get(job) != Some(&JobState::Complete) {
                        problems.push(format!(
                            "entry {seq}: job {job} completed without verifying clean"
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!("entry {seq} does not parse: {e}")),
        }
        prev = hash;
        expected_seq = seq + 1;
    }
    let head: Option<String> = conn
        .query_row("SELECT v FROM lethe_meta WHERE k = 'head'", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(sql)?;
    let last = format!("{}:{}", expected_seq - 1, prev);
    match head {
        Some(h) if h != last => problems.push(format!(
            "the newest entries were removed: the head records {}, the chain ends at entry {}",
            h.split(':').next().unwrap_or("?"),
            expected_seq - 1
        )),
        None if entries > 0 => problems.push("the head record is missing".into()),
        _ => {}
    }
    let mut stmt = conn
        .prepare("SELECT job_id, state FROM jobs ORDER BY job_id")
        .map_err(sql)?;
    let jobs: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(sql)?
        .collect::<rusqlite::Result<_>>()
        .map_err(sql)?;
    for (job, state) in &jobs {
        match states.get(job) {
            Some(s) if s.as_str() == state => {}
            Some(s) => problems.push(format!(
                "job {job} is {state} in the job table but {s} in the journal"
            )),
            None => problems.push(format!(
                "job {job} is in the job table but not in the journal"
            )),
        }
    }
    Ok(ChainReport {
        entries,
        jobs: jobs.len() as u64,
        problems,
    })
}

impl Journal {
    /// Walks the whole chain and replays every job. Read-only.
    pub fn verify_chain(&self) -> Result<ChainReport> {
        self.read(verify_conn)
    }
}

impl Journal {
    /// A job's entries, oldest first.
    pub fn entries(&self, job_id: &str) -> Result<Vec<Entry>> {
        self.read(|c| {
            let mut stmt = c
                .prepare("SELECT body FROM journal WHERE job_id = ?1 ORDER BY seq")
                .map_err(sql)?;
            let bodies = stmt
                .query_map([job_id], |r| r.get::<_, String>(0))
                .map_err(sql)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(sql)?;
            bodies
                .iter()
                .map(|b| serde_json::from_str(b).map_err(|e| JournalError::Corrupt(e.to_string())))
                .collect()
        })
    }
}
