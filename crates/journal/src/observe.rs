//! What `lethe serve`'s metrics and alerts read from the control store: journal entries of
//! some kinds after a sequence number (so a reader goes on from where it stopped), and the
//! count of active permits. Reads only.

use crate::chain::db;
use crate::entry::Entry;
use crate::{Journal, JournalError, Result};

/// One journal entry as a reader of the chain sees it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Its sequence number.
    pub seq: i64,
    /// When it was written (RFC 3339).
    pub at: String,
    /// The job it belongs to, if one.
    pub job_id: Option<String>,
    /// The entry.
    pub entry: Entry,
}

impl Journal {
    /// Entries with a sequence number above `after` whose kind is one of `kinds`, oldest
    /// first, at most `limit`.
    pub fn entries_after(&self, after: i64, kinds: &[&str], limit: i64) -> Result<Vec<Seen>> {
        if kinds.is_empty() {
            return Ok(Vec::new());
        }
        let any: Vec<String> = (0..kinds.len())
            .map(|i| format!("kind = ${}", i + 3))
            .collect();
        let sql = format!(
            "SELECT seq, at, job_id, body FROM journal WHERE seq > $1 AND ({}) ORDER BY seq LIMIT $2",
            any.join(" OR ")
        );
        let mut params: Vec<crate::db::V> = vec![after.into(), limit.into()];
        params.extend(kinds.iter().map(|k| (*k).into()));
        self.read(|tx| {
            tx.rows(&sql, &params)
                .map_err(db)?
                .iter()
                .map(|r| {
                    Ok(Seen {
                        seq: r[0].i().unwrap_or(0),
                        at: r[1].text(),
                        job_id: r[2].t().map(str::to_owned),
                        entry: serde_json::from_str(&r[3].text())
                            .map_err(|_| JournalError::Corrupt("journal entry".into()))?,
                    })
                })
                .collect()
        })
    }

    /// A job's entries with their times, oldest first (a timeline).
    pub fn timeline(&self, job_id: &str) -> Result<Vec<Seen>> {
        self.read(|tx| {
            tx.rows(
                "SELECT seq, at, job_id, body FROM journal WHERE job_id = $1 ORDER BY seq",
                &[job_id.into()],
            )
            .map_err(db)?
            .iter()
            .map(|r| {
                Ok(Seen {
                    seq: r[0].i().unwrap_or(0),
                    at: r[1].text(),
                    job_id: r[2].t().map(str::to_owned),
                    entry: serde_json::from_str(&r[3].text())
                        .map_err(|_| JournalError::Corrupt("journal entry".into()))?,
                })
            })
            .collect()
        })
    }

    /// Journals an alert (`Entry::AlertRaised`); returns its sequence number.
    pub fn record_alert(
        &self,
        at: &str,
        alert: &str,
        job_id: &str,
        condition: &str,
    ) -> Result<i64> {
        self.write_entry(|tx| {
            crate::chain::append(
                tx,
                at,
                None,
                &Entry::AlertRaised {
                    alert: alert.into(),
                    job_id: job_id.into(),
                    condition: condition.into(),
                },
            )
        })
    }

    /// How many permits are active now.
    pub fn active_permits(&self) -> Result<u64> {
        self.read(|tx| {
            Ok(tx
                .one("SELECT count(*) FROM permits WHERE state = 'active'", &[])
                .map_err(db)?
                .i()
                .unwrap_or(0) as u64)
        })
    }
}
