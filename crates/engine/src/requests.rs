//! Requests with a second pair of eyes: a `requester` records an erasure request with the day
//! the person's request was received; an `approver`, never the same token, approves it (its
//! job is created then, its deadline counted from receipt) or rejects it with a reason. An
//! intake switch pauses new requests while jobs in flight finish. `lethe serve` and the CLI
//! both call these, so one set of rules holds for both.
//!
//! Who asked and who decided are tokens' names (`[[serve.token]] name`), journaled as such;
//! the subject's identifiers stay in the `requests` table, never in the chain or a log.

use lethe_core::{Basis, Scope};
use lethe_journal::requests::{Decision, NewRequest, RequestRecord, RequestState};

use crate::{input, one_line, random_hex, rfc3339, Engine, EngineError, Request, MAX_NOTE};

/// Why a request or a decision was refused. None carries an identifier.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The token that made the request tried to approve it.
    #[error("request {0} was made by this token's holder: a second person (another approver token) must approve it")]
    SamePerson(String),
    /// No request with this id.
    #[error("no request {0}")]
    NoSuchRequest(String),
    /// The request was decided already.
    #[error("request {request_id} is {state:?} already: a decision is made once")]
    Decided {
        /// The request.
        request_id: String,
        /// Its state.
        state: RequestState,
    },
    /// The request says the person's identity was not verified.
    #[error("request {0} says the person's identity is not verified: verify it and make a new request with `identity_verified` true, or reject this one")]
    Unverified(String),
    /// The intake is paused.
    #[error("the intake is paused: new requests are refused until an admin resumes it (jobs in flight go on)")]
    IntakePaused,
}

/// A request as a requester gives it.
#[derive(Debug, Clone)]
pub struct RequestInput {
    /// What to erase.
    pub scope: Scope,
    /// Why.
    pub basis: Basis,
    /// The privacy ticket.
    pub ticket: String,
    /// When the person's request was received; not in the future.
    pub received_at: time::OffsetDateTime,
    /// An extended deadline (past the basis's normal one), with `extension_reason`.
    pub deadline: Option<time::Date>,
    /// Why the deadline is extended.
    pub extension_reason: Option<String>,
    /// Whether the person's identity was verified.
    pub identity_verified: bool,
}

/// The longest token name.
pub const MAX_NAME: usize = 64;

/// Whether `name` is a token name: 1 to 64 of letters, digits, `.`, `_`, `-`, `@`.
pub fn is_token_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

/// How many days before its deadline an open job or request counts as due soon.
pub const DUE_SOON_DAYS: i64 = 5;

impl Engine {
    /// Validates and stores a request (PENDING) made by the token named `by`, journaled.
    /// Creates no job and touches no target. Bad input (a receipt in the future, a deadline
    /// the basis does not allow, an extension without a reason) stores nothing.
    pub fn submit_request(
        &self,
        req: RequestInput,
        by: &str,
    ) -> Result<RequestRecord, EngineError> {
        if self.journal.is_intake_paused()? {
            return Err(RequestError::IntakePaused.into());
        }
        let now = self.clock.now();
        if req.received_at > now {
            return Err(input(
                "`received_at` is in the future: give the time the person's request was received",
            ));
        }
        self.check_scope(&req.scope)?;
        if !one_line(&req.ticket) || req.ticket.len() > crate::MAX_TICKET {
            return Err(input(format!(
                "`ticket` must be a one-line reference of at most {} bytes (DSR-1234)",
                crate::MAX_TICKET
            )));
        }
        if let Some(r) = &req.extension_reason {
            if !one_line(r) || r.len() > MAX_NOTE {
                return Err(input(format!(
                    "`extension_reason` must be one line of at most {MAX_NOTE} bytes"
                )));
            }
            if req.deadline.is_none() {
                return Err(input(
                    "`extension_reason` goes with the `deadline` it justifies (a date past the \
                     basis's first period)",
                ));
            }
        }
        let deadline = req
            .basis
            .deadline(
                req.received_at.date(),
                req.deadline,
                req.extension_reason.is_some(),
            )
            .map_err(input)?;
        self.journal.check_chain()?;
        let new = NewRequest {
            request_id: format!("req-{}", random_hex(6)?),
            scope_hash: self.scope_hash(&req.scope),
            scope: req.scope,
            basis: req.basis,
            ticket: req.ticket,
            received_at: rfc3339(req.received_at),
            deadline,
            extension_reason: req.extension_reason,
            identity_verified: req.identity_verified,
            requested_by: by.to_string(),
            created_at: rfc3339(now),
        };
        let rec = self.journal.add_request(&new)?;
        tracing::info!(request = %rec.request_id, scope_hash = %crate::short(&rec.scope_hash), by, "Request received.");
        Ok(rec)
    }

    /// Approves a pending request as the token named `by`: never the token that made it. The
    /// job is created (or the open one for the scope continued) with the request's deadline
    /// and receipt time, then the approval is journaled with the job's id. Runs nothing: the
    /// caller resumes the job. Returns the job id.
    pub fn approve_request(&self, request_id: &str, by: &str) -> Result<String, EngineError> {
        let rec = self.pending(request_id)?;
        // The row as the chain recorded it, and its identifiers as its hash says.
        self.journal.check_request(&rec)?;
        if self.scope_hash(&rec.scope) != rec.scope_hash {
            return Err(lethe_journal::JournalError::Corrupt(format!(
                "request {request_id}'s scope does not match its hash (the requests table was edited)"
            ))
            .into());
        }
        if rec.requested_by == by {
            return Err(RequestError::SamePerson(rec.request_id).into());
        }
        if !rec.identity_verified {
            return Err(RequestError::Unverified(rec.request_id).into());
        }
        let received = time::OffsetDateTime::parse(
            &rec.received_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|_| lethe_journal::JournalError::Corrupt("request received_at".into()))?;
        let deadline = time::Date::parse(
            &rec.deadline,
            &time::macros::format_description!("[year]-[month]-[day]"),
        )
        .map_err(|_| lethe_journal::JournalError::Corrupt("request deadline".into()))?;
        // The deadline is passed whole: the job's is the request's, checked against the same
        // receipt day and reason (it was computed from them).
        let (job_id, _) = self.request_received(
            Request {
                scope: rec.scope.clone(),
                basis: rec.basis,
                ticket: rec.ticket.clone(),
                deadline: Some(deadline),
                extension_reason: rec.extension_reason.clone(),
            },
            received,
        )?;
        // A crash here leaves the job REQUESTED and the request PENDING: approving again finds
        // the same open job (one per scope) and records the approval.
        let decided = self.journal.decide_request(
            &self.now_rfc3339(),
            request_id,
            by,
            &Decision::Approved {
                job_id: job_id.clone(),
            },
        )?;
        if !decided {
            return Err(self.decided(request_id));
        }
        tracing::info!(request = %request_id, job = %job_id, by, "Request approved.");
        Ok(job_id)
    }

    /// Rejects a pending request as the token named `by`, with a reason (one line).
    pub fn reject_request(
        &self,
        request_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<(), EngineError> {
        if !one_line(reason) || reason.len() > MAX_NOTE {
            return Err(input(format!(
                "`reason` is required: one line of at most {MAX_NOTE} bytes saying why"
            )));
        }
        self.pending(request_id)?;
        let decided = self.journal.decide_request(
            &self.now_rfc3339(),
            request_id,
            by,
            &Decision::Rejected {
                reason: reason.to_string(),
            },
        )?;
        if !decided {
            return Err(self.decided(request_id));
        }
        tracing::info!(request = %request_id, by, "Request rejected.");
        Ok(())
    }

    /// Pauses (`true`) or resumes the intake of new requests, as the token named `by`.
    /// Returns whether it changed.
    pub fn set_intake_paused(&self, paused: bool, by: &str) -> Result<bool, EngineError> {
        let changed = self
            .journal
            .set_intake_paused(&self.now_rfc3339(), paused, by)?;
        if changed {
            tracing::info!(paused, by, "Intake switched.");
        }
        Ok(changed)
    }

    fn pending(&self, request_id: &str) -> Result<RequestRecord, EngineError> {
        // Checked before it is looked up or repeated in a message: a caller's typo may be
        // anything, an identifier included.
        if !is_request_id(request_id) {
            return Err(input("a request id is `req-` and 12 hex digits"));
        }
        let rec = self
            .journal
            .request(request_id)?
            .ok_or_else(|| RequestError::NoSuchRequest(request_id.to_string()))?;
        if rec.state != RequestState::Pending {
            return Err(RequestError::Decided {
                request_id: rec.request_id,
                state: rec.state,
            }
            .into());
        }
        Ok(rec)
    }

    fn decided(&self, request_id: &str) -> EngineError {
        match self.pending(request_id) {
            Err(e) => e,
            Ok(_) => lethe_journal::JournalError::Corrupt("request decision".into()).into(),
        }
    }
}

/// A request's receipt: an RFC 3339 time with its offset (`2026-12-01T09:30:00Z`), or a day
/// (`2026-12-01`, its start in UTC).
pub fn parse_received(s: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .or_else(|| {
            time::Date::parse(
                s,
                &time::macros::format_description!("[year]-[month]-[day]"),
            )
            .ok()
            .map(|d| d.midnight().assume_utc())
        })
}

/// Whether `s` has the form of a request id (`req-` and 12 lowercase hex digits).
pub fn is_request_id(s: &str) -> bool {
    s.strip_prefix("req-").is_some_and(|h| {
        h.len() == 12
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Whole days from `today` to `deadline` (negative once past).
pub fn days_left(deadline: &str, today: time::Date) -> Option<i64> {
    let d = time::Date::parse(
        deadline,
        &time::macros::format_description!("[year]-[month]-[day]"),
    )
    .ok()?;
    Some((d - today).whole_days())
}
