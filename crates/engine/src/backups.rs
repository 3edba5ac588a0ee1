//! Backups: what a backup target leaves pending at a job's completion, and `lethe backups
//! check`, which reports artifacts kept past their retention and issues a job's final
//! certificate once every artifact it waited for is gone.

use lethe_adapters::{Artifact, Target};
use lethe_core::certificate::{Certificate, TargetStatus};
use lethe_core::JobState;
use time::{Date, OffsetDateTime};

use crate::{rfc3339, target_error, Engine, EngineError};

/// A backup target's artifacts that may hold a job's scope: those taken until the job's
/// completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    /// How many.
    pub artifacts: u64,
    /// The day the last of them expires (`None`: none).
    pub expires: Option<Date>,
}

impl Pending {
    /// The artifacts of `list` taken at or before `until`.
    pub(crate) fn at(list: &[Artifact], until: OffsetDateTime) -> Self {
        let held: Vec<&Artifact> = list.iter().filter(|a| a.taken_at <= until).collect();
        Self {
            artifacts: held.len() as u64,
            expires: held.iter().map(|a| a.expires).max(),
        }
    }
}

/// What `lethe backups check` found and did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupsReport {
    /// When it looked (RFC 3339, UTC).
    pub checked_at: String,
    /// Each backup target: its artifacts, and those kept past their retention.
    pub targets: Vec<BackupTarget>,
    /// COMPLETE jobs still waiting on a backup target's artifacts.
    pub waiting: Vec<Waiting>,
    /// Jobs whose final certificate this check issued.
    pub settled: Vec<String>,
}

/// One backup target as it stands.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupTarget {
    /// The target.
    pub name: String,
    /// Its artifacts now.
    pub artifacts: u64,
    /// Artifacts still there after the day their retention ended.
    pub overdue: Vec<Overdue>,
}

/// An artifact kept past its retention.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Overdue {
    /// Its name in the target.
    pub name: String,
    /// When it was taken (RFC 3339, UTC).
    pub taken_at: String,
    /// The day its retention ended.
    pub expired_on: String,
}

/// A job waiting on one backup target.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Waiting {
    /// The job.
    pub job_id: String,
    /// The backup target.
    pub target: String,
    /// Artifacts taken before the job completed that still exist (`None`: the target is no
    /// longer configured, so they cannot be looked at).
    pub artifacts: Option<u64>,
    /// The day the last of them expires.
    pub expires: Option<String>,
}

impl BackupsReport {
    /// Whether an artifact is kept past its retention.
    pub fn overdue(&self) -> bool {
        self.targets.iter().any(|t| !t.overdue.is_empty())
    }
}

impl Engine {
    /// Whether backup target `t`'s artifacts are made unreadable for `scope` by crypto-shredding:
    /// every target it covers is written under subject data keys (`keys.encrypted`), and the
    /// scope is a subject's or a tenant's, whose keys the job destroyed (a memory scope keeps
    /// the subject's key).
    pub(crate) fn shreds(&self, t: &Target, scope: &lethe_core::Scope) -> bool {
        self.kek.is_some()
            && !matches!(scope, lethe_core::Scope::Memory { .. })
            && !t.adapter.covers().is_empty()
            && t.adapter
                .covers()
                .iter()
                .all(|c| self.encrypted.contains(c))
    }

    /// `lethe backups check`: lists every backup target's artifacts, reports those kept past
    /// their retention, and for each COMPLETE job whose certificate waits on backup targets,
    /// the artifacts it still waits for; a job that waits for none any more gets its final
    /// certificate (journaled, signed, written beside the first, which is kept). Reads the
    /// backup targets only; an unreadable one fails the check, settling nothing.
    pub fn check_backups(&self) -> Result<BackupsReport, EngineError> {
        let now = self.clock.now();
        let mut listed: Vec<(&Target, Vec<Artifact>)> = Vec::new();
        for t in &self.targets {
            if let Some(list) = t.adapter.backups().map_err(target_error)? {
                listed.push((t, list));
            }
        }
        let today = now.to_offset(time::UtcOffset::UTC).date();
        let targets = listed
            .iter()
            .map(|(t, list)| BackupTarget {
                name: t.name.clone(),
                artifacts: list.len() as u64,
                overdue: list
                    .iter()
                    .filter(|a| a.expires < today)
                    .map(|a| Overdue {
                        name: a.name.clone(),
                        taken_at: rfc3339(a.taken_at),
                        expired_on: a.expires.to_string(),
                    })
                    .collect(),
            })
            .collect();
        let mut report = BackupsReport {
            checked_at: rfc3339(now),
            targets,
            waiting: Vec::new(),
            settled: Vec::new(),
        };
        for job in self.journal.jobs()? {
            if job.state != JobState::Complete {
                continue;
            }
            let Some(doc) = &job.certificate else {
                continue;
            };
            if self.journal.final_certificate(&job.job_id)?.is_some() {
                continue;
            }
            self.settle_job(&job.job_id, doc, &listed, &mut report)?;
        }
        Ok(report)
    }

    /// One COMPLETE job: what it still waits for; its final certificate when that is nothing.
    fn settle_job(
        &self,
        job_id: &str,
        doc: &serde_json::Value,
        listed: &[(&Target, Vec<Artifact>)],
        report: &mut BackupsReport,
    ) -> Result<(), EngineError> {
        let mut cert: Certificate = serde_json::from_value(
            doc.as_object()
                .map(|m| {
                    let mut m = m.clone();
                    m.remove("signature");
                    serde_json::Value::Object(m)
                })
                .unwrap_or_default(),
        )
        .map_err(|_| lethe_journal::JournalError::Corrupt(format!("job {job_id}'s certificate")))?;
        // The completion's second: an artifact taken within it may hold the scope.
        let completed = OffsetDateTime::parse(
            &cert.completed_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|_| lethe_journal::JournalError::Corrupt(format!("job {job_id}'s certificate")))?
            + time::Duration::seconds(1);
        let mut pending_backups = 0;
        let mut all_gone = true;
        for (name, line) in &cert.targets {
            if line.status != TargetStatus::PendingExpiry || line.artifacts.is_none() {
                continue;
            }
            pending_backups += 1;
            let Some((_, list)) = listed.iter().find(|(t, _)| &t.name == name) else {
                all_gone = false;
                report.waiting.push(Waiting {
                    job_id: job_id.to_string(),
                    target: name.clone(),
                    artifacts: None,
                    expires: line.expires.map(|d| d.to_string()),
                });
                continue;
            };
            let left = Pending::at(list, completed);
            if left.artifacts > 0 {
                all_gone = false;
                report.waiting.push(Waiting {
                    job_id: job_id.to_string(),
                    target: name.clone(),
                    artifacts: Some(left.artifacts),
                    expires: left.expires.map(|d| d.to_string()),
                });
            }
        }
        if pending_backups == 0 || !all_gone {
            return Ok(());
        }
        for line in cert.targets.values_mut() {
            if line.status == TargetStatus::PendingExpiry && line.artifacts.is_some() {
                line.status = TargetStatus::Done;
            }
        }
        cert.backup_expiry_met = Some(self.now_rfc3339());
        let signed = cert.sign(&self.key);
        if self
            .journal
            .settle_backups(&self.now_rfc3339(), job_id, &signed)?
        {
            self.write_certificate(&format!("{job_id}.final"), &signed)?;
            tracing::info!(job = %job_id, "Backups expired; final certificate issued.");
            report.settled.push(job_id.to_string());
        }
        Ok(())
    }

    /// A job's final certificate, once its backups expired (`lethe backups check`).
    pub fn final_certificate(
        &self,
        job_id: &str,
    ) -> Result<Option<serde_json::Value>, EngineError> {
        self.journal.job(job_id)?;
        Ok(self.journal.final_certificate(job_id)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_counts_only_what_was_taken_until_the_completion() {
        let t = |h| time::macros::datetime!(2026-12-01 00:00 UTC) + time::Duration::hours(h);
        let list = vec![
            Artifact::new("old".into(), t(0), 30),
            Artifact::new("newer".into(), t(24), 30),
            Artifact::new("after".into(), t(48), 30),
        ];
        let p = Pending::at(&list, t(30));
        assert_eq!(p.artifacts, 2);
        assert_eq!(p.expires, Some(time::macros::date!(2027 - 01 - 01)));
        assert_eq!(
            Pending::at(&list, t(-1)),
            Pending {
                artifacts: 0,
                expires: None
            }
        );
    }
}
