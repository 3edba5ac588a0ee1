//! Erasure requests waiting for a second person: received (`PENDING`), then `APPROVED` (with
//! the job it started) or `REJECTED` (with a reason), and the intake switch that pauses new
//! ones. The scope's identifiers stay in the `requests` table, as a job's do in `jobs`; the
//! chain records the request's id, its scope hash and the names of the tokens that asked and
//! decided, never an identifier. The rules (who may decide, what a deadline may be) are the
//! engine's (`lethe_engine::requests`); this module stores and journals.

use lethe_core::Scope;

use crate::chain::{append, db};
use crate::db::Row;
use crate::entry::Entry;
use crate::{Journal, JournalError, Result};

/// A request as the engine validated it, to store.
#[derive(Clone, Debug)]
pub struct NewRequest {
    /// Its id, `req-<hex>`.
    pub request_id: String,
    /// What to erase.
    pub scope: Scope,
    /// Its keyed hash.
    pub scope_hash: String,
    /// Legal basis.
    pub basis: lethe_core::Basis,
    /// The privacy ticket.
    pub ticket: String,
    /// When the person's request was received, RFC 3339.
    pub received_at: String,
    /// The deadline, counted from receipt.
    pub deadline: time::Date,
    /// Why the deadline is extended, if it is.
    pub extension_reason: Option<String>,
    /// Whether the requester verified the person's identity.
    pub identity_verified: bool,
    /// The asking token's name.
    pub requested_by: String,
    /// When it was stored, RFC 3339.
    pub created_at: String,
}

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RequestState {
    /// Waiting for an approver.
    Pending,
    /// Approved: its job runs.
    Approved,
    /// Rejected, with a reason.
    Rejected,
}

impl RequestState {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => Self::Pending,
            "APPROVED" => Self::Approved,
            "REJECTED" => Self::Rejected,
            _ => return None,
        })
    }
}

/// A stored request.
#[derive(Clone, serde::Serialize)]
pub struct RequestRecord {
    /// Its id.
    pub request_id: String,
    /// The scope (identifiers: shown only to who may see them, never logged).
    #[serde(skip)]
    pub scope: Scope,
    /// Keyed hash of the scope.
    pub scope_hash: String,
    /// Legal basis.
    pub basis: lethe_core::Basis,
    /// The privacy ticket.
    pub ticket: String,
    /// When the person's request was received.
    pub received_at: String,
    /// Deadline, `YYYY-MM-DD`.
    pub deadline: String,
    /// Why the deadline is extended.
    pub extension_reason: Option<String>,
    /// Whether the requester verified the person's identity.
    pub identity_verified: bool,
    /// The asking token's name.
    pub requested_by: String,
    /// When it was stored.
    pub created_at: String,
    /// Where it stands.
    pub state: RequestState,
    /// The deciding token's name.
    pub decided_by: Option<String>,
    /// When it was decided.
    pub decided_at: Option<String>,
    /// Why it was rejected.
    pub reject_reason: Option<String>,
    /// The job its approval started.
    pub job_id: Option<String>,
}

/// Without the scope: a `{:?}` in a log line must not print identifiers.
impl std::fmt::Debug for RequestRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestRecord")
            .field("request_id", &self.request_id)
            .field("scope_hash", &self.scope_hash)
            .field("state", &self.state)
            .field("job_id", &self.job_id)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "request_id, scope, scope_hash, basis, ticket, received_at, deadline, \
     extension_reason, identity_verified, requested_by, created_at, state, decided_by, \
     decided_at, reject_reason, job_id";

fn from_row(r: &Row) -> Result<RequestRecord> {
    let corrupt = |what: &str| JournalError::Corrupt(format!("request column {what}"));
    Ok(RequestRecord {
        request_id: r[0].text(),
        scope: serde_json::from_str(&r[1].text()).map_err(|_| corrupt("scope"))?,
        scope_hash: r[2].text(),
        basis: r[3].text().parse().map_err(|_| corrupt("basis"))?,
        ticket: r[4].text(),
        received_at: r[5].text(),
        deadline: r[6].text(),
        extension_reason: r[7].t().map(str::to_owned),
        identity_verified: r[8].i() == Some(1),
        requested_by: r[9].text(),
        created_at: r[10].text(),
        state: RequestState::parse(&r[11].text()).ok_or_else(|| corrupt("state"))?,
        decided_by: r[12].t().map(str::to_owned),
        decided_at: r[13].t().map(str::to_owned),
        reject_reason: r[14].t().map(str::to_owned),
        job_id: r[15].t().map(str::to_owned),
    })
}

/// A decision on a pending request.
#[derive(Clone, Debug)]
pub enum Decision {
    /// Approved; the job it started.
    Approved {
        /// The job.
        job_id: String,
    },
    /// Rejected.
    Rejected {
        /// Why.
        reason: String,
    },
}

impl Journal {
    /// Stores a request and journals its receipt, in one transaction.
    pub fn add_request(&self, new: &NewRequest) -> Result<RequestRecord> {
        self.write_entry(|tx| {
            let scope = serde_json::to_string(&new.scope)
                .map_err(|e| JournalError::Corrupt(e.to_string()))?;
            let seq = append(tx, &new.created_at, None, &receipt(new))?;
            tx.exec(
                &format!(
                    "INSERT INTO requests ({COLUMNS}, received_seq) VALUES ($1, $2, $3, $4, $5, \
                     $6, $7, $8, $9, $10, $11, 'PENDING', NULL, NULL, NULL, NULL, $12)"
                ),
                &[
                    new.request_id.as_str().into(),
                    scope.into(),
                    new.scope_hash.as_str().into(),
                    new.basis.as_str().into(),
                    new.ticket.as_str().into(),
                    new.received_at.as_str().into(),
                    new.deadline.to_string().into(),
                    new.extension_reason.as_deref().into(),
                    i64::from(new.identity_verified).into(),
                    new.requested_by.as_str().into(),
                    new.created_at.as_str().into(),
                    seq.into(),
                ],
            )
            .map_err(db)?;
            load(tx, &new.request_id)?.ok_or_else(|| JournalError::Corrupt("request".into()))
        })
    }

    /// Checks a request's row against the chain's entry of its receipt: who asked, the scope's
    /// hash, the basis, the ticket, the receipt, the deadline and the identity check. The
    /// approval reads the row, the chain holds the truth: a row edited by hand (another
    /// requester's name, so the same person could approve) is refused here.
    pub fn check_request(&self, rec: &RequestRecord) -> Result<()> {
        let body = self.read(|tx| {
            tx.row(
                "SELECT j.body FROM requests r JOIN journal j ON j.seq = r.received_seq \
                 WHERE r.request_id = $1",
                &[rec.request_id.as_str().into()],
            )
            .map_err(db)
        })?;
        let entry: Option<Entry> = body.and_then(|r| serde_json::from_str(&r[0].text()).ok());
        let expected = receipt(&NewRequest {
            request_id: rec.request_id.clone(),
            scope: rec.scope.clone(),
            scope_hash: rec.scope_hash.clone(),
            basis: rec.basis,
            ticket: rec.ticket.clone(),
            received_at: rec.received_at.clone(),
            deadline: time::Date::parse(
                &rec.deadline,
                &time::macros::format_description!("[year]-[month]-[day]"),
            )
            .map_err(|_| JournalError::Corrupt("request deadline".into()))?,
            extension_reason: rec.extension_reason.clone(),
            identity_verified: rec.identity_verified,
            requested_by: rec.requested_by.clone(),
            created_at: rec.created_at.clone(),
        });
        if entry.as_ref() != Some(&expected) {
            return Err(JournalError::Corrupt(format!(
                "request {} differs from the journal's entry of its receipt (the requests \
                 table was edited)",
                rec.request_id
            )));
        }
        Ok(())
    }

    /// One request, if it exists.
    pub fn request(&self, request_id: &str) -> Result<Option<RequestRecord>> {
        self.read(|tx| load(tx, request_id))
    }

    /// Every request, newest first.
    pub fn requests(&self) -> Result<Vec<RequestRecord>> {
        self.read(|tx| {
            tx.rows(
                &format!("SELECT {COLUMNS} FROM requests ORDER BY created_at DESC, request_id"),
                &[],
            )
            .map_err(db)?
            .iter()
            .map(from_row)
            .collect()
        })
    }

    /// Records a decision on a request that is still `PENDING`, with its journal entry, in one
    /// transaction. `Ok(false)`: it was decided meanwhile (nothing written).
    pub fn decide_request(
        &self,
        at: &str,
        request_id: &str,
        by: &str,
        decision: &Decision,
    ) -> Result<bool> {
        self.write_entry(|tx| {
            let (state, reason, job, entry) = match decision {
                Decision::Approved { job_id } => (
                    "APPROVED",
                    None,
                    Some(job_id.as_str()),
                    Entry::RequestApproved {
                        request_id: request_id.into(),
                        job_id: job_id.clone(),
                        approved_by: by.into(),
                    },
                ),
                Decision::Rejected { reason } => (
                    "REJECTED",
                    Some(reason.as_str()),
                    None,
                    Entry::RequestRejected {
                        request_id: request_id.into(),
                        rejected_by: by.into(),
                        reason: reason.clone(),
                    },
                ),
            };
            let changed = tx
                .rows(
                    "UPDATE requests SET state = $2, decided_by = $3, decided_at = $4, \
                     reject_reason = $5, job_id = $6 WHERE request_id = $1 AND state = 'PENDING' \
                     RETURNING request_id",
                    &[
                        request_id.into(),
                        state.into(),
                        by.into(),
                        at.into(),
                        reason.into(),
                        job.into(),
                    ],
                )
                .map_err(db)?;
            if changed.is_empty() {
                return Ok(false);
            }
            append(tx, at, None, &entry)?;
            Ok(true)
        })
    }

    /// Whether new requests are refused (`lethe_meta` `intake = paused`).
    pub fn is_intake_paused(&self) -> Result<bool> {
        self.read(|tx| {
            Ok(tx
                .row("SELECT v FROM lethe_meta WHERE k = 'intake'", &[])
                .map_err(db)?
                .is_some_and(|r| r[0].text() == "paused"))
        })
    }

    /// Pauses or resumes the intake, journaled with the token's name. `Ok(false)`: it already
    /// stood so (nothing written).
    pub fn set_intake_paused(&self, at: &str, paused: bool, by: &str) -> Result<bool> {
        self.write_entry(|tx| {
            let now = tx
                .row("SELECT v FROM lethe_meta WHERE k = 'intake'", &[])
                .map_err(db)?
                .is_some_and(|r| r[0].text() == "paused");
            if now == paused {
                return Ok(false);
            }
            let v = if paused { "paused" } else { "open" };
            tx.exec(
                "INSERT INTO lethe_meta (k, v) VALUES ('intake', $1) \
                 ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                &[v.into()],
            )
            .map_err(db)?;
            let entry = if paused {
                Entry::IntakePaused { by: by.into() }
            } else {
                Entry::IntakeResumed { by: by.into() }
            };
            append(tx, at, None, &entry)?;
            Ok(true)
        })
    }
}

/// The chain's entry of a request's receipt.
fn receipt(new: &NewRequest) -> Entry {
    Entry::RequestReceived {
        request_id: new.request_id.clone(),
        scope_hash: new.scope_hash.clone(),
        basis: new.basis,
        ticket: new.ticket.clone(),
        received_at: new.received_at.clone(),
        deadline: new.deadline.to_string(),
        identity_verified: new.identity_verified,
        requested_by: new.requested_by.clone(),
    }
}

fn load(tx: &mut dyn crate::db::Tx, request_id: &str) -> Result<Option<RequestRecord>> {
    tx.row(
        &format!("SELECT {COLUMNS} FROM requests WHERE request_id = $1"),
        &[request_id.into()],
    )
    .map_err(db)?
    .as_ref()
    .map(from_row)
    .transpose()
}
