//! A job's run: the state loop (here), each state's work (`steps.rs`), the tamper checks
//! (`checks.rs`), the certificate (`certify.rs`) and targets at once (`parallel.rs`). Each step
//! is journaled before it acts and idempotent on resume.

use std::sync::Mutex;

use lethe_adapters::{AdapterError, Fence, Guard, Locator};
use lethe_core::{BlockedReason, JobState, Scope, Version};
use lethe_journal::jobs::{Claim, JobRecord};
use lethe_journal::Entry;

use crate::{input, Engine, EngineError, Outcome, RunOptions};

/// What the runner reports as it goes, for progress output. No identifiers.
#[derive(Debug, Clone)]
pub enum Progress {
    /// The job entered a state.
    State(JobState),
    /// Waiting for permits to drain.
    Draining {
        /// Permits still active.
        undrained: u64,
    },
    /// A target's inventory is journaled.
    Inventoried {
        /// Target.
        target: String,
        /// Rows.
        count: u64,
    },
    /// A target does not apply to the scope.
    Exempt {
        /// Target.
        target: String,
        /// Why.
        reason: String,
    },
    /// A batch was erased.
    Erased {
        /// Target.
        target: String,
        /// Locators done so far.
        done: usize,
        /// Locators in the inventory.
        total: usize,
    },
    /// A target was verified.
    Verified {
        /// Target.
        target: String,
        /// Rows left.
        residue: u64,
    },
    /// A batch's step, for all its jobs: how many of them are through it.
    Batch {
        /// The step: `requested`, `frozen`, `inventory`, `erased`, `verification`,
        /// `complete`.
        step: &'static str,
        /// Jobs through it.
        done: usize,
        /// Jobs in the batch's group.
        total: usize,
    },
}

/// A step's result: go on, or stop with the job BLOCKED.
enum Step {
    Next,
    Blocked,
}

/// What one target's verification found.
enum Checked {
    /// The scope does not apply to the target (the recorded reason).
    Exempt(String),
    /// The adapter failed.
    Failed(AdapterError),
    /// Rows left for the scope (0: verified gone).
    Residue(u64),
}

/// A test's pause point: the run writes `RunOptions::pause_at`'s marker file and waits while it
/// exists, so a test can kill the process exactly there. Compiled only with the `test-pause`
/// feature (the CLI's tests turn it on): a release build holds neither the points nor their
/// names.
macro_rules! pause_point {
    ($run:expr, $($point:tt)+) => {
        #[cfg(feature = "test-pause")]
        $run.pause_point(&format!($($point)+));
    };
}

/// One job's run: what every step needs besides the job itself (the engine it runs in, the
/// options it was asked with, and its claim, which each step checks still holds). A `Run` is
/// the engine to its steps (`Deref`): they read `self.journal`, `self.targets` as before.
pub(super) struct Run<'a> {
    engine: &'a Engine,
    opts: &'a RunOptions,
    /// Behind a lock: the targets' threads check it before each batch.
    claim: Mutex<&'a mut Claim>,
    /// In a batch: the inventories and verifications taken for all its jobs at once.
    shared: Option<&'a batch::Shared>,
}

impl std::ops::Deref for Run<'_> {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        self.engine
    }
}

impl Run<'_> {
    #[cfg(feature = "test-pause")]
    fn pause_point(&self, point: &str) {
        self.engine.pause_at(self.opts.pause_at.as_ref(), point);
    }
}

impl Engine {
    /// Test-only: at `point`, when `pause_at` names it, writes the marker file and hangs until
    /// a test kills the process, or removes the marker to let it go on.
    #[cfg(feature = "test-pause")]
    pub(crate) fn pause_at(&self, pause_at: Option<&(String, std::path::PathBuf)>, point: &str) {
        if let Some((at, marker)) = pause_at {
            if at == point {
                let _ = std::fs::write(marker, point);
                while std::path::Path::new(marker).exists() {
                    self.clock.sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }
}

// After the macro: the steps use it.
mod batch;
mod certify;
mod checks;
mod parallel;
mod steps;

impl Engine {
    fn block(
        &self,
        job: &str,
        reason: BlockedReason,
        target: Option<&str>,
        detail: String,
    ) -> Result<Step, EngineError> {
        tracing::warn!(job = %job, reason = %reason, target = target.unwrap_or("-"), detail = %detail, "Job blocked.");
        self.journal.record(
            &self.now_rfc3339(),
            job,
            &Entry::Blocked {
                reason,
                target: target.map(str::to_owned),
                detail,
            },
        )?;
        Ok(Step::Blocked)
    }

    fn block_on(&self, job: &str, target: &str, e: AdapterError) -> Result<Step, EngineError> {
        self.block(job, blocked_reason(&e), Some(target), e.to_string())
    }

    /// Applies `f` to the database guard of every target that has one (LangGraph on
    /// PostgreSQL), with the job's fence. A guard not installed in its database does nothing;
    /// an unreachable one blocks the job (`target_unavailable`, retryable), so a job never
    /// completes with a sink left unfenced or a fence left closed.
    fn guards(
        &self,
        job: &JobRecord,
        what: &str,
        f: impl Fn(&dyn Guard, &Fence<'_>) -> Result<bool, AdapterError>,
    ) -> Result<Step, EngineError> {
        self.guards_but(job, what, |_| false, f)
    }

    /// [`Engine::guards`], but not those of the targets `skip` names (a batch's targets whose
    /// guard was not installed when it closed its jobs' fences: none to open).
    fn guards_but(
        &self,
        job: &JobRecord,
        what: &str,
        skip: impl Fn(&str) -> bool,
        f: impl Fn(&dyn Guard, &Fence<'_>) -> Result<bool, AdapterError>,
    ) -> Result<Step, EngineError> {
        let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
        for t in &self.targets {
            let Some(g) = t.adapter.guard() else {
                continue;
            };
            if skip(&t.name) {
                continue;
            }
            match f(g, &fence) {
                Ok(true) => {
                    tracing::info!(job = %job.job_id, target = %t.name, step = what, "Database guard updated.")
                }
                Ok(false) => {}
                Err(e) => return self.block_on(&job.job_id, &t.name, e),
            }
        }
        Ok(Step::Next)
    }

    /// The scope adapters act on: a memory scope carries the version frozen in the tombstone.
    pub(crate) fn frozen_scope(job: &JobRecord) -> Scope {
        match (&job.scope, &job.tombstone_version) {
            (
                Scope::Memory {
                    tenant,
                    subject,
                    memory,
                    version: None,
                },
                Some(v),
            ) => Scope::Memory {
                tenant: tenant.clone(),
                subject: subject.clone(),
                memory: memory.clone(),
                version: Version::new(v.clone()).ok(),
            },
            (s, _) => s.clone(),
        }
    }

    /// For a memory scope: the version to freeze, the explicit one if given. Without one, the
    /// version current now, which every target holding the memory must agree on: a scope is
    /// one version, and a store holding the memory at another would be certified with 0 while
    /// it keeps it. When no target holds the memory any more, `at_request` (the version the
    /// request found, journaled with it), if any.
    pub(crate) fn resolve_version(
        &self,
        scope: &Scope,
        at_request: Option<&Version>,
    ) -> Result<Option<Version>, EngineError> {
        let Scope::Memory { version, .. } = scope else {
            return Ok(None);
        };
        if let Some(v) = version {
            // Its form was checked with the scope (`Engine::check_scope`).
            return Ok(Some(v.clone()));
        }
        let mut found: Vec<(&str, Version)> = Vec::new();
        for t in &self.targets {
            if let Some(v) = t
                .adapter
                .current_version(scope)
                .map_err(crate::target_error)?
            {
                found.push((&t.name, v));
            }
        }
        let Some((_, first)) = found.first() else {
            if let Some(v) = at_request {
                return Ok(Some(v.clone()));
            }
            return Err(input(
                "no target reports a current version of this memory (it is gone from the \
                 versioned stores, or only unversioned stores such as Redis hold it): give \
                 `version`, the version the runtimes' leases record for it (a Redis key is \
                 erased whatever it is)",
            ));
        };
        if found.iter().any(|(_, v)| v != first) {
            // Target names only: a version is a memory's timestamp, kept out of messages.
            let names: Vec<&str> = found.iter().map(|(name, _)| *name).collect();
            return Err(input(format!(
                "targets {} hold this memory at different versions, and a job erases one \
                 version: request one job per version, each with `version` (the item's \
                 updated_at in that store)",
                names.join(", ")
            )));
        }
        Ok(Some(first.clone()))
    }

    /// A memory job requested without a version: the version its request found, from its
    /// `JobRequested` entry. The memory may be gone from every target by its freeze (erased by
    /// another job while a hold kept this one waiting); the job then erases what is left of
    /// that version (an unversioned store's copy, the leases that read it). Before, it stayed
    /// REQUESTED for good.
    fn version_at_request(&self, job: &JobRecord) -> Result<Option<Version>, EngineError> {
        if !matches!(job.scope, Scope::Memory { version: None, .. }) {
            return Ok(None);
        }
        Ok(self
            .journal
            .entries(&job.job_id)?
            .into_iter()
            .find_map(|e| match e {
                lethe_journal::Entry::JobRequested {
                    version_at_request: Some(v),
                    ..
                } => Version::new(v).ok(),
                _ => None,
            }))
    }

    /// Runs a job from wherever its journal says it is, until COMPLETE, BLOCKED or held.
    pub fn run(
        &self,
        job_id: &str,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Outcome, EngineError> {
        // One runner per job: on PostgreSQL a row lock that dies with this process's connection.
        let mut claim = self
            .journal
            .claim(job_id)?
            .ok_or_else(|| EngineError::Claimed(job_id.to_string()))?;
        self.run_claimed(&mut claim, opts, progress)
    }

    /// Runs, one after another, every job another process left unfinished (REQUESTED, FROZEN,
    /// DELETING or VERIFYING: it died, or was killed). A job whose runner is alive (its claim is
    /// held) and a job a legal hold covers are skipped.
    pub fn work(
        &self,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Outcome>, EngineError> {
        let mut out = Vec::new();
        if self.journal.is_shared() {
            let mut held = Vec::new();
            while let Some(mut claim) = self.journal.claim_next(&held)? {
                if self.waits_on_a_hold(&claim.job_id)? {
                    held.push(claim.job_id.clone());
                    continue;
                }
                tracing::info!(job = %claim.job_id, "Picked up an abandoned job.");
                match self.run_claimed(&mut claim, opts, progress) {
                    Ok(o) => out.push(o),
                    // Held: it stays REQUESTED until the hold is released; not this run's to do.
                    // Claim lost: another process may run it now; the next job is still ours.
                    Err(EngineError::Held { .. } | EngineError::ClaimLost(_)) => {
                        held.push(claim.job_id.clone())
                    }
                    // One job this configuration cannot run (its memory now at two versions,
                    // a target gone) must not stop the others behind it.
                    Err(EngineError::Input(why)) => {
                        tracing::warn!(job = %claim.job_id, "Skipped: {why}");
                        held.push(claim.job_id.clone())
                    }
                    Err(e) => return Err(e),
                }
            }
        } else {
            let runnable: Vec<String> = self
                .journal
                .jobs()?
                .into_iter()
                .filter(|j| {
                    matches!(
                        j.state,
                        JobState::Requested
                            | JobState::Frozen
                            | JobState::Deleting
                            | JobState::Verifying
                    )
                })
                .map(|j| j.job_id)
                .collect();
            for id in runnable {
                if self.waits_on_a_hold(&id)? {
                    continue;
                }
                match self.run(&id, opts, progress) {
                    Ok(o) => out.push(o),
                    // A live process is running it (its claim is held): not abandoned.
                    Err(EngineError::Claimed(_)) => {
                        tracing::info!(job = %id, "Skipped: another process is running it.")
                    }
                    Err(EngineError::Held { .. }) => {}
                    Err(EngineError::Input(why)) => {
                        tracing::warn!(job = %id, "Skipped: {why}")
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        // A job killed between its COMPLETE and its certificate file has no file: it is
        // written from the journal here too, not only by a `resume` naming the job (review:
        // `work` left it missing for good).
        for job in self.journal.jobs()? {
            if job.state == JobState::Complete
                && !out.iter().any(|o: &Outcome| o.job_id == job.job_id)
                && self.certificate_file(&job)?
            {
                tracing::info!(job = %job.job_id, "Wrote a complete job's missing certificate file.");
                out.push(self.outcome(&job.job_id)?);
            }
        }
        Ok(out)
    }

    fn run_claimed(
        &self,
        claim: &mut Claim,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Outcome, EngineError> {
        self.run_shared(claim, opts, progress, None, None)
    }

    /// [`Engine::run_claimed`], in a batch: with what the batch read for all its jobs at once
    /// (`shared`), and stopping when the job reaches `stop_at` (its outcome then says where
    /// it stands) so the batch can read the stores for every job before it goes on.
    fn run_shared(
        &self,
        claim: &mut Claim,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
        shared: Option<&batch::Shared>,
        stop_at: Option<JobState>,
    ) -> Result<Outcome, EngineError> {
        let job_id = claim.job_id.clone();
        let job_id = job_id.as_str();
        // Nothing runs on a journal whose chain does not verify: its entries are the evidence
        // the certificate is built from. (A batch checks it once for all its jobs, before each
        // of its steps.)
        if shared.is_none() {
            self.journal.check_chain_sealed(&self.key.verifying_key())?;
        }
        // A hold added while the job was interrupted (killed mid-erase, say) stops it too:
        // preservation wins over erasure in every state but COMPLETE, not only before the freeze.
        // A COMPLETE job touches no target (it only rewrites its certificate file), so where
        // the targets are now does not matter to it.
        let job = self.journal.job(job_id)?;
        if job.state != JobState::Complete {
            // The runner acts on the job's row (its scope above all): one edited apart from
            // the chain would erase or verify what nobody asked for.
            self.refuse_if_projection_edited(job_id, "the job is not run")?;
            self.refuse_if_targets_missing(job_id)?;
            self.refuse_if_job_held(&job)?;
        }
        // A job picked up past its freeze: each database guard is closed again and told what
        // was erased already, before anything else runs (both idempotent). A guard installed
        // since the freeze (a run killed mid-erase, `guard install`, a resume) was never closed
        // for the job, nor told of targets erased before it: found by review, a write for the
        // person was admitted while the job ran and after it completed.
        // (A BLOCKED job does both in `step_resume`.)
        let driven = shared.is_some_and(|s| s.drives(job_id));
        if matches!(job.state, JobState::Deleting | JobState::Verifying) && !driven {
            if let Step::Blocked = self.guards(&job, "fence_closed", |g, f| g.close(f))? {
                return self.outcome(job_id);
            }
            if let Step::Blocked = self.guards_learn_erased(&job)? {
                return self.outcome(job_id);
            }
        }
        let run = Run {
            engine: self,
            opts,
            claim: Mutex::new(claim),
            shared,
        };
        loop {
            let job = self.journal.job(job_id)?;
            if stop_at == Some(job.state) {
                return self.outcome(job_id);
            }
            progress(Progress::State(job.state));
            // Each step starts under a claim that still holds; the steps are idempotent, and a
            // second runner's transitions would be refused, but its adapters' work would not.
            if job.state != JobState::Complete {
                run.refuse_if_claim_lost(job_id)?;
            }
            let step = match job.state {
                JobState::Complete => {
                    self.certificate_file(&job)?;
                    return self.outcome(job_id);
                }
                JobState::Requested => run.step_requested(&job)?,
                JobState::Frozen => run.step_frozen(&job, progress)?,
                JobState::Deleting => run.step_deleting(&job, progress)?,
                JobState::Verifying => run.step_verifying(&job, progress)?,
                JobState::Blocked => run.step_resume(&job, progress)?,
            };
            if let Step::Blocked = step {
                return self.outcome(job_id);
            }
        }
    }

    /// Tells each database guard the frozen locators of every target already erased (what
    /// `erase_target` tells it before erasing a target; a guard installed since did not hear).
    fn guards_learn_erased(&self, job: &JobRecord) -> Result<Step, EngineError> {
        let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
        for t in &self.targets {
            let Some(g) = t.adapter.guard() else {
                continue;
            };
            let (_, erased, _) = self.journal.progress(&job.job_id, &t.name)?;
            if erased.is_none() {
                continue;
            }
            let Some((_, locators)) = self.journal.inventory(&job.job_id, &t.name)? else {
                continue;
            };
            if let Err(e) = g.record_erased(&fence, &locators) {
                return self.block_on(&job.job_id, &t.name, e);
            }
        }
        Ok(Step::Next)
    }
}

/// Why an adapter's error blocks a job.
fn blocked_reason(e: &AdapterError) -> BlockedReason {
    match e {
        AdapterError::AnomalousVolume { .. } => BlockedReason::AnomalousVolume,
        AdapterError::ReadOnly { .. } => BlockedReason::TargetReadOnly,
        AdapterError::LegacyDerived { .. } => BlockedReason::LegacyDerived,
        e if e.is_retryable() => BlockedReason::TargetUnavailable,
        _ => BlockedReason::TargetFailed,
    }
}

/// Splits frozen locators, in order, into erase batches of at most `max_locators` locators and
/// `max_rows` frozen rows each; a locator with more rows than `max_rows` is a batch of its own.
/// What bounds a transaction is its rows (a checkpoint thread is tens of rows, a store item one),
/// and a batch is a transaction and a journal commit, so fewer is faster.
fn batches(locators: &[Locator], max_locators: usize, max_rows: u64) -> Vec<&[Locator]> {
    let mut out = Vec::new();
    let (mut start, mut rows) = (0, 0u64);
    for (i, (_, n)) in locators.iter().enumerate() {
        if i > start && (i - start >= max_locators || rows.saturating_add(*n) > max_rows) {
            out.push(&locators[start..i]);
            (start, rows) = (i, 0);
        }
        rows = rows.saturating_add(*n);
    }
    if start < locators.len() {
        out.push(&locators[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::batches;

    fn locs(rows: &[u64]) -> Vec<(String, u64)> {
        rows.iter()
            .enumerate()
            .map(|(i, n)| (format!("l{i}"), *n))
            .collect()
    }

    #[test]
    fn batches_keep_order_cover_every_locator_once_and_respect_both_bounds() {
        let l = locs(&[3, 3, 3, 1, 1, 1, 1, 9, 0, 0, 2]);
        let b = batches(&l, 3, 6);
        let sizes: Vec<(usize, u64)> = b
            .iter()
            .map(|b| (b.len(), b.iter().map(|(_, n)| n).sum()))
            .collect();
        // [3,3] [3,1,1] [1,1] [9] [0,0,2]
        assert_eq!(sizes, vec![(2, 6), (3, 5), (2, 2), (1, 9), (3, 2)]);
        let flat: Vec<_> = b.iter().flat_map(|b| b.iter()).cloned().collect();
        assert_eq!(flat, l, "in order, each exactly once");
        for (n, rows) in &sizes {
            assert!(*n <= 3);
            assert!(*rows <= 6 || *n == 1, "over the row bound only alone");
        }
    }

    #[test]
    fn batches_of_nothing_and_of_one_oversized_locator() {
        assert!(batches(&[], 10, 10).is_empty());
        let l = locs(&[50]);
        assert_eq!(batches(&l, 10, 10), vec![&l[..]]);
        // Row bounds off in effect: only the locator count splits.
        let l = locs(&[1; 7]);
        let b = batches(&l, 3, u64::MAX);
        assert_eq!(b.iter().map(|b| b.len()).collect::<Vec<_>>(), vec![3, 3, 1]);
    }
}
