//! `lethe recovery`: after a target was restored from a backup, replays into it every erasure
//! the journal completed (since the backup's time, when given), verifies each scope clean, and
//! signs a report. Until it has verified, the gate refuses leases and permits for every scope
//! it replays (runtimes get `fenced`), and a target's database guard refuses their writes.
//!
//! Crash-safe as a job is: the recovery and its fences are journaled before anything is
//! erased; each replay is an inventory, an erase of exactly that inventory (the anomaly guard
//! applies) and a verification, so running it again after a kill replays what is left and
//! erases nothing twice.

use std::path::PathBuf;

use lethe_adapters::{Applicability, Fence, Target};
use lethe_core::certificate::sign_document;
use lethe_core::{JobState, Scope};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::{input, random_hex, rfc3339, target_error, Engine, EngineError};

/// The format tag of a recovery report.
pub const REPORT_FORMAT: &str = "lethe-recovery/1";

/// What `lethe recovery` is asked.
#[derive(Debug, Clone, Default)]
pub struct RecoveryOptions {
    /// The backup's time: erasures completed since then are replayed. `None`: all of them.
    pub since: Option<OffsetDateTime>,
    /// Test-only fault injection, as [`crate::RunOptions::pause_at`].
    pub pause_at: Option<(String, PathBuf)>,
}

/// A recovery's progress, for the CLI's lines.
#[derive(Debug, Clone)]
pub enum RecoveryProgress {
    /// The fences are closed over this many scopes (`resumed`: a run killed earlier closed
    /// them).
    Fenced {
        /// Scopes replayed.
        scopes: usize,
        /// Whether an earlier run of this recovery was found RUNNING.
        resumed: bool,
    },
    /// One scope replayed and verified.
    Replayed {
        /// Scopes done.
        done: usize,
        /// Scopes in all.
        total: usize,
    },
}

/// One completed job to replay.
struct Replay {
    job_id: String,
    scope: Scope,
    scope_hash: String,
    subject_epoch: Option<u64>,
    tenant_epoch: Option<u64>,
}

impl Engine {
    /// Replays every completed erasure (since `opts.since`) into `target` as it now stands,
    /// verifies each, and returns the signed report (also journaled and written to
    /// `certificates/<recovery id>.json`). Bad input and an unreachable target fail before
    /// anything is journaled or touched.
    pub fn recover(
        &self,
        target: &str,
        opts: &RecoveryOptions,
        progress: &mut dyn FnMut(RecoveryProgress),
    ) -> Result<Value, EngineError> {
        let t = self.recovery_target(target)?;
        let began = std::time::Instant::now();
        t.adapter.probe().map_err(target_error)?;
        self.journal.check_chain()?;
        let started = self.clock.now();
        let replays = self.replays(t, opts.since)?;
        let fenced: Vec<(&str, Option<&str>)> = replays
            .iter()
            .map(|r| match &r.scope {
                Scope::Tenant { tenant } => (tenant.as_str(), None),
                Scope::Subject { tenant, subject }
                | Scope::Memory {
                    tenant, subject, ..
                } => (tenant.as_str(), Some(subject.as_str())),
            })
            .collect();
        let since = opts.since.map(rfc3339);
        let (recovery_id, resumed) = self.journal.start_recovery(
            &rfc3339(started),
            &format!("rcv-{}", random_hex(6)?),
            &t.name,
            since.as_deref(),
            &fenced,
        )?;
        tracing::info!(recovery = %recovery_id, target = %t.name, scopes = replays.len(), resumed, "Recovery fenced its scopes.");
        progress(RecoveryProgress::Fenced {
            scopes: replays.len(),
            resumed,
        });
        #[cfg(feature = "test-pause")]
        self.pause_at(opts.pause_at.as_ref(), "recovery-fenced");
        let mut lines = Vec::with_capacity(replays.len());
        let mut erased_total = 0;
        // Time spent in the target's calls, to tell Lethe's own work from the store's.
        let mut in_store = std::time::Duration::ZERO;
        for (n, r) in replays.iter().enumerate() {
            let (erased, spent) = self.replay(t, r)?;
            in_store += spent;
            erased_total += erased;
            lines.push(json!({
                "job_id": r.job_id,
                "scope": r.scope.kind(),
                "scope_hash": r.scope_hash,
                "erased": erased,
                "residue": 0,
            }));
            progress(RecoveryProgress::Replayed {
                done: n + 1,
                total: replays.len(),
            });
            if n == 0 {
                #[cfg(feature = "test-pause")]
                self.pause_at(opts.pause_at.as_ref(), "recovery-after-first-scope");
            }
        }
        let d = t.adapter.describe();
        let report = sign_document(
            json!({
                "format": REPORT_FORMAT,
                "recovery_id": recovery_id,
                "target": t.name,
                "adapter": d.kind.as_str(),
                "adapter_version": d.version,
                "since": since,
                "started_at": rfc3339(started),
                "completed_at": self.now_rfc3339(),
                "scopes": lines,
                "erased": erased_total,
                "signed_by": "",
            }),
            &self.key,
        );
        self.journal.finish_recovery(
            &self.now_rfc3339(),
            &recovery_id,
            replays.len() as u64,
            erased_total,
            &report,
        )?;
        self.write_certificate(&recovery_id, &report)?;
        let total = began.elapsed();
        tracing::info!(
            recovery = %recovery_id,
            target = %t.name,
            scopes = replays.len(),
            erased = erased_total,
            total_ms = total.as_millis() as u64,
            store_ms = in_store.as_millis() as u64,
            own_ms = total.saturating_sub(in_store).as_millis() as u64,
            "Recovery verified; fences open."
        );
        Ok(report)
    }

    /// The target to recover: configured, and a store rather than a backup.
    fn recovery_target(&self, name: &str) -> Result<&Target, EngineError> {
        let t = self
            .targets
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| {
                input(format!(
                    "no target named {name} in this configuration; `lethe targets` lists them"
                ))
            })?;
        if !t.adapter.covers().is_empty() {
            return Err(input(format!(
                "target {name} is a backup target: recovery replays erasures into a store \
                 restored from a backup; name that store's target"
            )));
        }
        Ok(t)
    }

    /// The completed jobs to replay into `t`, oldest first: completed at or after `since`, and
    /// of a scope `t` applies to.
    fn replays(
        &self,
        t: &Target,
        since: Option<OffsetDateTime>,
    ) -> Result<Vec<Replay>, EngineError> {
        let mut out = Vec::new();
        for job in self.journal.jobs()? {
            if job.state != JobState::Complete {
                continue;
            }
            let completed = job
                .certificate
                .as_ref()
                .and_then(|c| c["completed_at"].as_str())
                .and_then(|c| {
                    OffsetDateTime::parse(c, &time::format_description::well_known::Rfc3339).ok()
                })
                .ok_or_else(|| {
                    lethe_journal::JournalError::Corrupt(format!(
                        "job {}'s certificate",
                        job.job_id
                    ))
                })?;
            // A job completed in the backup's second may not be in it: replayed.
            if since.is_some_and(|s| completed + time::Duration::seconds(1) < s) {
                continue;
            }
            let scope = Engine::frozen_scope(&job);
            match t.adapter.check_scope(&scope).map_err(input)? {
                Applicability::Exempt(_) => continue,
                Applicability::Applies => {}
            }
            out.push((
                completed,
                Replay {
                    job_id: job.job_id.clone(),
                    scope_hash: self.scope_hash(&scope),
                    scope,
                    subject_epoch: job.subject_epoch,
                    tenant_epoch: job.tenant_epoch,
                },
            ));
        }
        out.sort_by(|a, b| (a.0, &a.1.job_id).cmp(&(b.0, &b.1.job_id)));
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    /// One scope into `t`: the guard's fence closed and the erased locators recorded, then an
    /// inventory, its erase (in batches, each within its locators) and a verification that
    /// finds nothing left. Returns rows erased.
    fn replay(&self, t: &Target, r: &Replay) -> Result<(u64, std::time::Duration), EngineError> {
        let fence = Fence::of(&r.scope, r.subject_epoch, r.tenant_epoch);
        let guard = t.adapter.guard();
        let mut spent = std::time::Duration::ZERO;
        let mut timed = |f: &mut dyn FnMut() -> Result<u64, lethe_adapters::AdapterError>| {
            let at = std::time::Instant::now();
            let out = f();
            spent += at.elapsed();
            out.map_err(target_error)
        };
        if let Some(g) = guard {
            timed(&mut || g.close(&fence).map(u64::from))?;
        }
        let mut inv = lethe_adapters::Inventory::default();
        timed(&mut || {
            inv = t.adapter.inventory(&r.scope)?;
            Ok(0)
        })?;
        if let Some(g) = guard {
            timed(&mut || g.record_erased(&fence, &inv.locators).map(u64::from))?;
        }
        let size = t.adapter.batch_size().unwrap_or(self.batch_size).max(1);
        let mut erased = 0;
        for batch in inv.locators.chunks(size) {
            erased += timed(&mut || t.adapter.erase_batch(&r.scope, batch))?;
        }
        let residue = timed(&mut || t.adapter.verify(&r.scope, &inv.locators))?;
        if residue > 0 {
            return Err(EngineError::Input(format!(
                "recovery of target {}: job {}'s scope still has {residue} rows after its replay \
                 (something writes them around the gate); its fences stay closed: find the \
                 writer, then run `lethe recovery --target {}` again",
                t.name, r.job_id, t.name
            )));
        }
        if let Some(g) = guard {
            timed(&mut || g.open(&fence).map(u64::from))?;
        }
        Ok((erased, spent))
    }
}
