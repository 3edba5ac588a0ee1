//! The API's errors: a stable code, a sentence without identifiers, and the HTTP status, all
//! decided here and nowhere else.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lethe_gate::GateError;
use lethe_journal::JournalError;

/// An error answered to a client.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine code.
    pub code: &'static str,
    /// A sentence for humans; never an identifier or any memory content.
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the control store did not answer; retry (the server log has the cause)",
        )
    }
}

impl From<GateError> for ApiError {
    fn from(e: GateError) -> Self {
        let (status, code) = match e {
            GateError::Fenced => (StatusCode::CONFLICT, "fenced"),
            GateError::Revoked => (StatusCode::CONFLICT, "revoked"),
            GateError::StaleEpoch => (StatusCode::CONFLICT, "stale_epoch"),
            GateError::Tombstoned => (StatusCode::CONFLICT, "tombstoned"),
            GateError::Expired => (StatusCode::CONFLICT, "expired"),
            GateError::NoSuchLease => (StatusCode::NOT_FOUND, "no_such_lease"),
            GateError::NoSuchPermit => (StatusCode::NOT_FOUND, "no_such_permit"),
            GateError::KeyUsed => (StatusCode::CONFLICT, "key_used"),
            // Only an in-process gate refuses so; mapped for completeness.
            GateError::AuthorityLost => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        };
        Self::new(status, code, e.to_string())
    }
}

impl From<lethe_gate::pg::Error> for ApiError {
    fn from(e: lethe_gate::pg::Error) -> Self {
        match e {
            lethe_gate::pg::Error::Refused(g) => g.into(),
            lethe_gate::pg::Error::Unavailable => Self::unavailable(),
        }
    }
}

impl From<JournalError> for ApiError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Gate(g) => g.into(),
            JournalError::Broken(_) => {
                // The first problem stays in the server's log: its text names entries and jobs.
                tracing::error!(error = %e, "The journal does not verify; no job starts.");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "journal_broken",
                    "the journal's hash chain does not verify: no job starts until it is \
                     restored (the server log has the first problem)",
                )
            }
            JournalError::NoSuchJob(_) => {
                Self::new(StatusCode::NOT_FOUND, "no_such_job", "no such job")
            }
            JournalError::Corrupt(_) => {
                // What is unreadable or edited, by a column's or a record's name and id only.
                tracing::error!(error = %e, "The control store holds unreadable or edited data.");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "corrupt",
                    format!("{e}; nothing was done (`lethe journal verify` checks the chain)"),
                )
            }
            e => {
                // The store's message can name a file or SQL; it stays in the server's log.
                tracing::error!(error = %e, "Control store failed during a request.");
                Self::unavailable()
            }
        }
    }
}

/// An error answer's code, on the response's extensions: the metrics count refusals by it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ErrorCode(pub(crate) &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.code, "message": self.message});
        let mut res = (self.status, axum::Json(body)).into_response();
        res.extensions_mut().insert(ErrorCode(self.code));
        res
    }
}
