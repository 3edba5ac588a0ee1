//! Alerts: a job within [`DUE_SOON_DAYS`] of its deadline and not COMPLETE, a job BLOCKED
//! (`residue` and `anomaly` for those two reasons), a COMPLETE job whose certificate's
//! `backup_expiry` has passed with no final certificate (`backup_overdue`: a backup is kept past
//! its retention, or `lethe backups check` has not run since), each raised once per condition
//! and again when the condition changes (due soon, then overdue; blocked again after a resume).
//!
//! An alert is journaled (`Entry::AlertRaised`) before it is sent, and the alerts already
//! journaled are read back when the server starts: a restart neither repeats nor loses one.
//! It is logged, then POSTed to every `[[serve.alert]]` webhook as JSON signed with
//! HMAC-SHA256 (`X-Lethe-Signature: sha256=<hex>` over `<X-Lethe-Timestamp>.<body>`), retried
//! five times with a doubling wait. The body names the job, its scope hash, state, reason,
//! target and deadline: never an identifier of the subject.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac};
use lethe_core::{BlockedReason, JobState};
use lethe_engine::requests::{days_left, DUE_SOON_DAYS};
use lethe_engine::Engine;
use lethe_journal::jobs::JobRecord;
use lethe_journal::Entry;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::Webhook;

/// Tries per delivery.
const TRIES: u32 = 5;

/// One alert to raise.
struct Alert {
    /// `deadline`, `blocked`, `residue`, `anomaly` or `backup_overdue`.
    alert: &'static str,
    /// What is compared with the last alert raised for the job and family.
    condition: String,
    job: JobRecord,
}

impl Alert {
    /// Alerts of one family replace each other: a job due soon, then overdue; blocked, then
    /// blocked again for another reason.
    fn key(&self) -> String {
        key(self.alert, &self.job.job_id)
    }
}

fn key(alert: &str, job_id: &str) -> String {
    let family = match alert {
        "deadline" => "deadline",
        "backup_overdue" => "backup",
        _ => "block",
    };
    format!("{family}:{job_id}")
}

/// The alerts raised so far (by the journal) and where they go.
pub(crate) struct Alerts {
    webhooks: Vec<Webhook>,
    backoff: Duration,
    /// Family and job to the last condition raised; `None` until read from the journal.
    raised: Mutex<Option<HashMap<String, String>>>,
}

impl Alerts {
    pub(crate) fn new(webhooks: Vec<Webhook>, backoff: Duration) -> Self {
        Self {
            webhooks,
            backoff,
            raised: Mutex::new(None),
        }
    }

    /// Raises what the jobs call for and was not raised yet. Blocking; the deliveries go on in
    /// a thread of their own. Returns the kinds raised.
    pub(crate) fn check(
        &self,
        engine: &Engine,
        jobs: &[JobRecord],
        now: time::OffsetDateTime,
    ) -> Result<Vec<&'static str>, lethe_journal::JournalError> {
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        if raised.is_none() {
            *raised = Some(journaled(engine)?);
        }
        let raised = raised.as_mut().expect("read above");
        let mut out = Vec::new();
        let mut bodies = Vec::new();
        let settled = engine.journal().settled_jobs()?;
        for a in conditions(jobs, now.date(), &settled) {
            let k = a.key();
            if raised.get(&k) == Some(&a.condition) {
                continue;
            }
            let at = lethe_engine::rfc3339(now);
            let seq = engine
                .journal()
                .record_alert(&at, a.alert, &a.job.job_id, &a.condition)?;
            raised.insert(k, a.condition.clone());
            tracing::warn!(alert = a.alert, job = %a.job.job_id, condition = %a.condition, "Alert raised.");
            out.push(a.alert);
            bodies.push(body(&a, now.date(), &at, seq));
        }
        // One thread delivers this round's alerts, one after the other: a thousand jobs due at
        // once make one thread, not a thousand.
        if !self.webhooks.is_empty() && !bodies.is_empty() {
            let (hooks, backoff) = (self.webhooks.clone(), self.backoff);
            let spawned = std::thread::Builder::new()
                .name("lethe-alert".into())
                .spawn(move || {
                    for body in bodies {
                        deliver(&hooks, &body, backoff);
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "Alerts not sent: no thread for their delivery.");
            }
        }
        Ok(out)
    }
}

/// The last condition journaled per family and job.
fn journaled(engine: &Engine) -> Result<HashMap<String, String>, lethe_journal::JournalError> {
    let mut out = HashMap::new();
    let mut after = 0;
    loop {
        let seen = engine
            .journal()
            .entries_after(after, &["alert_raised"], 10_000)?;
        let Some(last) = seen.last() else {
            return Ok(out);
        };
        after = last.seq;
        for s in seen {
            if let Entry::AlertRaised {
                alert,
                job_id,
                condition,
            } = s.entry
            {
                out.insert(key(&alert, &job_id), condition);
            }
        }
    }
}

/// What the jobs call for now. `settled`: the jobs whose backups expired (final certificate).
fn conditions(
    jobs: &[JobRecord],
    today: time::Date,
    settled: &std::collections::HashSet<String>,
) -> Vec<Alert> {
    let mut out = Vec::new();
    for j in jobs.iter().filter(|j| j.state == JobState::Complete) {
        if let Some(expiry) = backup_overdue(j, today).filter(|_| !settled.contains(&j.job_id)) {
            out.push(Alert {
                alert: "backup_overdue",
                condition: format!("expired:{expiry}"),
                job: j.clone(),
            });
        }
    }
    for j in jobs.iter().filter(|j| j.state != JobState::Complete) {
        if let Some(left) = days_left(&j.deadline, today).filter(|d| *d <= DUE_SOON_DAYS) {
            out.push(Alert {
                alert: "deadline",
                condition: if left < 0 { "overdue" } else { "due_soon" }.into(),
                job: j.clone(),
            });
        }
        if j.state == JobState::Blocked {
            let alert = match j.blocked_reason {
                Some(BlockedReason::Residue) => "residue",
                Some(BlockedReason::AnomalousVolume) => "anomaly",
                _ => "blocked",
            };
            out.push(Alert {
                alert,
                condition: format!(
                    "{}:{}:{}",
                    j.blocked_reason.map_or("", BlockedReason::as_str),
                    j.blocked_target.as_deref().unwrap_or(""),
                    j.updated_at
                ),
                job: j.clone(),
            });
        }
    }
    out
}

/// A COMPLETE job's backup expiry, when it has passed while a backup target still says
/// `PENDING_EXPIRY` on its certificate (`artifacts` set: a backup target's line).
fn backup_overdue(j: &JobRecord, today: time::Date) -> Option<String> {
    let c = j.certificate.as_ref()?;
    let expiry = c["backup_expiry"].as_str()?;
    let day = time::Date::parse(
        expiry,
        &time::macros::format_description!("[year]-[month]-[day]"),
    )
    .ok()?;
    let waiting = c["targets"]
        .as_object()?
        .values()
        .any(|t| t["status"] == "PENDING_EXPIRY" && t["artifacts"].is_u64());
    (waiting && day < today).then(|| expiry.to_string())
}

/// The webhook's body: ids, hashes, states and reasons only.
fn body(a: &Alert, today: time::Date, at: &str, seq: i64) -> Vec<u8> {
    let j = &a.job;
    let v: Value = json!({
        "alert_id": format!("alert-{seq}"),
        "alert": a.alert,
        "job_id": j.job_id,
        "scope_hash": j.scope_hash,
        "state": j.state,
        "reason": j.blocked_reason,
        "target": j.blocked_target,
        "deadline": j.deadline,
        "days_left": days_left(&j.deadline, today),
        "condition": a.condition,
        "backup_expiry": j.certificate.as_ref().map(|c| c["backup_expiry"].clone()),
        "raised_at": at,
    });
    serde_json::to_vec(&v).expect("JSON of plain values")
}

/// `sha256=<hex>` of HMAC-SHA256 over `<timestamp>.<body>` under `secret`.
pub(crate) fn signature(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let mut h = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    h.update(timestamp.as_bytes());
    h.update(b".");
    h.update(body);
    format!("sha256={}", hex::encode(h.finalize().into_bytes()))
}

/// POSTs the body to every webhook, each tried up to [`TRIES`] times.
fn deliver(hooks: &[Webhook], body: &[u8], backoff: Duration) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .user_agent(concat!("lethe/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    for hook in hooks {
        let mut wait = backoff;
        for attempt in 1..=TRIES {
            // The sending's own time (each retry's), which a receiver checks for freshness.
            let ts = time::OffsetDateTime::now_utc().unix_timestamp().to_string();
            let sent = agent
                .post(&hook.url)
                .header("content-type", "application/json")
                .header("x-lethe-timestamp", &ts)
                .header("x-lethe-signature", signature(&hook.secret, &ts, body))
                .send(body);
            let why = match sent {
                Ok(r) if r.status().is_success() => {
                    tracing::info!(url = %hook.url, attempt, "Alert delivered.");
                    break;
                }
                Ok(r) => format!("status {}", r.status().as_u16()),
                Err(e) => e.to_string(),
            };
            if attempt == TRIES {
                tracing::error!(url = %hook.url, error = %why, "Alert not delivered after {TRIES} tries; it stays in the journal (alert_raised).");
            } else {
                tracing::warn!(url = %hook.url, attempt, error = %why, "Alert delivery failed; retrying.");
                // Pacing a real receiver, not a clock a test controls: no result depends on
                // how long the wait lasted, only that it was not shorter.
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(wait);
                wait *= 2;
            }
        }
    }
}
