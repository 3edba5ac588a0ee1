//! The state loop: each state's work, journaled before it acts, idempotent on resume.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use lethe_adapters::{AdapterError, Applicability, Fence, Guard, Locator, Target};
use lethe_core::certificate::{self, Certificate, TargetRecord, TargetStatus};
use lethe_core::{BlockedReason, JobState, Scope, Version};
use lethe_journal::jobs::{Claim, JobRecord};
use lethe_journal::Entry;

use crate::{at_once, input, rfc3339, short, Engine, EngineError, Outcome, RunOptions};

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
    ($engine:expr, $opts:expr, $($point:tt)+) => {
        #[cfg(feature = "test-pause")]
        $engine.pause_point($opts, &format!($($point)+));
        #[cfg(not(feature = "test-pause"))]
        let _ = &$opts;
    };
}

impl Engine {
    #[cfg(feature = "test-pause")]
    fn pause_point(&self, opts: &RunOptions, point: &str) {
        if let Some((at, marker)) = &opts.pause_at {
            if at == point {
                // Hangs until a test kills the process, or removes the marker to let it go on.
                let _ = std::fs::write(marker, point);
                while std::path::Path::new(marker).exists() {
                    self.clock.sleep(Duration::from_millis(10));
                }
            }
        }
    }

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
        let reason = match &e {
            AdapterError::AnomalousVolume { .. } => BlockedReason::AnomalousVolume,
            AdapterError::ReadOnly { .. } => BlockedReason::TargetReadOnly,
            e if e.is_retryable() => BlockedReason::TargetUnavailable,
            _ => BlockedReason::TargetFailed,
        };
        self.block(job, reason, Some(target), e.to_string())
    }

    /// Runs `work` on each of `targets` at once, one thread a target, and passes their
    /// progress to `progress` on this thread as it comes. Returns the results in configuration
    /// order. Targets are independent stores, so their inventories, erasures and verifications
    /// overlap; each still journals before it acts, and a run killed mid-way resumes per target
    /// (what one finished is journaled as finished). The journal serializes its own writes.
    fn each_target<'t, T: Send>(
        &self,
        targets: Vec<&'t Target>,
        progress: &mut dyn FnMut(Progress),
        work: impl Fn(&'t Target, &dyn Fn(Progress)) -> T + Sync,
    ) -> Vec<(&'t Target, T)> {
        // `at_once` runs the targets on a thread of its own while this one passes their progress
        // on; the channel closes when the last target's sender is dropped.
        let (tx, rx) = std::sync::mpsc::channel::<Progress>();
        let (work, all) = (&work, &targets);
        let results = std::thread::scope(|s| {
            let running = s.spawn(move || {
                at_once(all, |t| {
                    let tx = tx.clone();
                    work(t, &move |p| drop(tx.send(p)))
                })
            });
            for p in rx {
                progress(p);
            }
            running
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        targets.into_iter().zip(results).collect()
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
        let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
        for t in &self.targets {
            let Some(g) = t.adapter.guard() else {
                continue;
            };
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
    fn frozen_scope(job: &JobRecord) -> Scope {
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
        let job_id = claim.job_id.clone();
        let job_id = job_id.as_str();
        // Nothing runs on a journal whose chain does not verify: its entries are the evidence
        // the certificate is built from.
        self.journal.check_chain()?;
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
        if matches!(job.state, JobState::Deleting | JobState::Verifying) {
            if let Step::Blocked = self.guards(&job, "fence_closed", |g, f| g.close(f))? {
                return self.outcome(job_id);
            }
            if let Step::Blocked = self.guards_learn_erased(&job)? {
                return self.outcome(job_id);
            }
        }
        let claim = Mutex::new(claim);
        loop {
            let job = self.journal.job(job_id)?;
            progress(Progress::State(job.state));
            // Each step starts under a claim that still holds; the steps are idempotent, and a
            // second runner's transitions would be refused, but its adapters' work would not.
            if job.state != JobState::Complete {
                self.refuse_if_claim_lost(job_id, &claim)?;
            }
            let step = match job.state {
                JobState::Complete => {
                    self.certificate_file(&job)?;
                    return self.outcome(job_id);
                }
                JobState::Requested => self.step_requested(&job)?,
                JobState::Frozen => self.step_frozen(&job, opts, progress)?,
                JobState::Deleting => self.step_deleting(&job, opts, progress, &claim)?,
                JobState::Verifying => self.step_verifying(&job, opts, progress)?,
                JobState::Blocked => self.step_resume(&job, opts, progress)?,
            };
            if let Step::Blocked = step {
                return self.outcome(job_id);
            }
        }
    }

    /// Refuses to erase a target whose stored frozen locators differ from the keyed digest
    /// journaled with its inventory (`inventory_taken`): an edit of the journal's locator
    /// table apart from the chain, say one subject's thread swapped for another's, would
    /// otherwise be erased (review: 20 rows of another subject went; the anomaly guard counts
    /// rows, not owners). A target whose inventory was extended (`--reinventory`) keeps its
    /// locators summed over the parts, which no one digest covers: not checked.
    fn refuse_if_locators_edited(
        &self,
        job: &JobRecord,
        t: &Target,
        locators: &[Locator],
    ) -> Result<(), EngineError> {
        let mut taken = None;
        for e in self.journal.entries(&job.job_id)? {
            match e {
                Entry::InventoryTaken { target, digest, .. } if target == t.name => {
                    taken = Some(digest)
                }
                Entry::InventoryExtended { target, .. } if target == t.name => return Ok(()),
                _ => {}
            }
        }
        let Some(journaled) = taken else {
            return Ok(());
        };
        let key = self.key.locator_key();
        if lethe_journal::jobs::inventory_digest(key.as_bytes(), locators) == journaled {
            return Ok(());
        }
        tracing::error!(job = %job.job_id, target = %t.name, "Frozen locators differ from their journaled digest; nothing erased.");
        Err(EngineError::Journal(lethe_journal::JournalError::Corrupt(
            format!(
                "job {}: target {}'s frozen locators differ from the digest journaled with its \
             inventory (the journal's locator table was edited apart from the chain); nothing \
             is erased",
                job.job_id, t.name
            ),
        )))
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

    /// [`EngineError::ClaimLost`] once this process's claim on the job no longer holds.
    fn refuse_if_claim_lost(
        &self,
        job_id: &str,
        claim: &Mutex<&mut Claim>,
    ) -> Result<(), EngineError> {
        if claim.lock().unwrap_or_else(|p| p.into_inner()).holds() {
            return Ok(());
        }
        tracing::warn!(job = %job_id, "Lost the claim on the job; stopping.");
        Err(EngineError::ClaimLost(job_id.to_string()))
    }

    /// Before each batch a target erases: the claim still holds, and no legal hold covers the
    /// job now. Found by review: a hold placed while a job ran (after its last check, at the
    /// start of the run) did not stop it, and its held rows were erased; a runner whose claim
    /// was lost mid-erase (its connection cut, another process resuming the job) kept erasing,
    /// after that process completed the job too. Either stops the run where it is, touching
    /// nothing more: a hold until it is released (exit 4), a lost claim for the process that
    /// holds it now.
    fn may_erase(&self, job: &JobRecord, claim: &Mutex<&mut Claim>) -> Result<(), EngineError> {
        self.refuse_if_claim_lost(&job.job_id, claim)?;
        self.refuse_if_job_held(job)
    }

    /// Refuses a job whose row or progress differs from what its chain entries record.
    fn refuse_if_projection_edited(&self, job_id: &str, outcome: &str) -> Result<(), EngineError> {
        let mut problems = self.journal.projection_problems(job_id)?;
        let job = self.journal.job(job_id)?;
        for hold in self
            .journal
            .holds_released_outside_the_chain(job.scope.tenant(), job.scope.subject())?
        {
            problems.push(format!(
                "hold {hold} is released in the hold table but not in the journal"
            ));
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(EngineError::Journal(lethe_journal::JournalError::Corrupt(
            format!("{}; {outcome}", problems.join("; ")),
        )))
    }

    /// Adds what each target with residue holds for the scope now to its inventory.
    fn reinventory(&self, job: &JobRecord) -> Result<Step, EngineError> {
        let scope = Self::frozen_scope(job);
        for t in &self.targets {
            let (_, _, residue) = self.journal.progress(&job.job_id, &t.name)?;
            if residue.unwrap_or(0) == 0 {
                continue;
            }
            let inv = match t.adapter.inventory(&scope) {
                Ok(inv) => inv,
                Err(e) => return self.block_on(&job.job_id, &t.name, e),
            };
            let added = self.journal.extend_inventory(
                &self.now_rfc3339(),
                &job.job_id,
                &t.name,
                &inv.locators,
                self.key.locator_key().as_bytes(),
            )?;
            tracing::warn!(job = %job.job_id, target = %t.name, added, "Inventory extended by the operator after a residue block.");
        }
        Ok(Step::Next)
    }

    /// Refuses (exit 2, nothing touched) a job that inventoried a target this configuration
    /// does not have (removed or renamed since): the job would otherwise erase, verify and
    /// certify the others and never look at that target's frozen rows again.
    fn refuse_if_targets_missing(&self, job_id: &str) -> Result<(), EngineError> {
        let missing: Vec<String> = self
            .journal
            .job_targets(job_id)?
            .into_iter()
            .filter(|name| !self.targets.iter().any(|t| &t.name == name))
            .collect();
        if !missing.is_empty() {
            return Err(input(format!(
                "job {job_id} froze an inventory on target(s) {} that this configuration does \
                 not have: nothing was touched; run it with the configuration it started with \
                 (each target under the same name)",
                missing.join(", ")
            )));
        }
        // A target still under its name may point elsewhere now (another database, file or
        // key layout): the job would erase and verify there, certify that, and leave the rows
        // it froze where they were.
        let key = self.key.locator_key();
        let moved: Vec<String> = self
            .journal
            .job_target_places(job_id)?
            .into_iter()
            .filter_map(|(name, place)| {
                let t = self.targets.iter().find(|t| t.name == name)?;
                let then = place?;
                let now = lethe_journal::jobs::place_digest(key.as_bytes(), &t.adapter.place());
                (then != now).then_some(name)
            })
            .collect();
        if moved.is_empty() {
            return Ok(());
        }
        Err(input(format!(
            "job {job_id} froze an inventory on target(s) {} where this configuration no longer \
             points (another database, file or key layout under the same name): nothing was \
             touched; point each target back where it was while the job is unfinished",
            moved.join(", ")
        )))
    }

    /// An unfinished job that a legal hold covers now: `work` leaves it (no new refusal
    /// journaled each time it runs); a resume after the release runs it.
    fn waits_on_a_hold(&self, job_id: &str) -> Result<bool, EngineError> {
        let job = self.journal.job(job_id)?;
        Ok(job.state != JobState::Complete
            && !self
                .journal
                .holds_covering(job.scope.tenant(), job.scope.subject())?
                .is_empty())
    }

    /// [`EngineError::Held`] (journaled) if a legal hold covers the job's scope now: for a
    /// caller that answers before it runs the job elsewhere (`lethe serve`).
    pub fn refuse_if_held(&self, job_id: &str) -> Result<(), EngineError> {
        self.refuse_if_job_held(&self.journal.job(job_id)?)
    }

    /// Refuses (exit 4) while a legal hold covers the job's scope; journals the refusal.
    fn refuse_if_job_held(&self, job: &JobRecord) -> Result<(), EngineError> {
        let holds = self
            .journal
            .holds_covering(job.scope.tenant(), job.scope.subject())?;
        if !holds.is_empty() {
            self.journal
                .record_hold_refusal(&self.now_rfc3339(), &job.job_id, &holds)?;
            tracing::warn!(job = %job.job_id, holds = holds.len(), "Job refused by a legal hold.");
            return Err(EngineError::Held {
                job_id: job.job_id.clone(),
                holds,
                state: job.state,
            });
        }
        Ok(())
    }

    fn step_requested(&self, job: &JobRecord) -> Result<Step, EngineError> {
        self.refuse_if_job_held(job)?;
        let version = self.resolve_version(&job.scope, self.version_at_request(job)?.as_ref())?;
        let at = self.now_rfc3339();
        let f = match &self.gate {
            Some(g) => g.freeze(&self.journal, &at, &job.job_id, version.as_ref())?,
            None => self.journal.freeze(&at, &job.job_id, version.as_ref())?,
        };
        tracing::info!(
            job = %job.job_id, scope_hash = %short(&job.scope_hash), revoked = f.revoked_leases,
            to_drain = f.permits_to_drain, "Fence closed."
        );
        Ok(Step::Next)
    }

    /// Waits for the permits found active at the freeze to be released or cancelled.
    fn drain(
        &self,
        job: &str,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<u64, EngineError> {
        let deadline = self.clock.now() + opts.drain_timeout;
        loop {
            let n =
                self.journal.undrained(job)? + self.gate.as_ref().map_or(0, |g| g.undrained(job));
            if n == 0 || self.clock.now() >= deadline {
                return Ok(n);
            }
            progress(Progress::Draining { undrained: n });
            self.clock.sleep(Duration::from_millis(50));
        }
    }

    /// Takes and journals the inventory of every applicable target not yet inventoried, all
    /// targets at once. An adapter error blocks the job on the first such target in
    /// configuration order; the others' inventories are journaled and kept.
    fn take_inventories(
        &self,
        job: &JobRecord,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        let scope = Self::frozen_scope(job);
        let mut todo = Vec::new();
        for t in &self.targets {
            if self.journal.progress(&job.job_id, &t.name)?.0.is_none() {
                todo.push(t);
            }
        }
        let done = self.each_target(todo, progress, |t, report| {
            self.inventory_target(job, &scope, t, opts, report)
        });
        for (t, r) in done {
            if let Some(e) = r? {
                return self.block_on(&job.job_id, &t.name, e);
            }
        }
        Ok(Step::Next)
    }

    /// A target's inventory. Where a database guard is installed, what the inventory found is
    /// recorded in it as erased at once (it is what the job will erase), and the inventory is
    /// taken again: from the record on, no write to those threads or items is admitted
    /// whoever it names, so the second reading is final for them. Before, the guard learnt
    /// them only when their target's erase began, and a write between the inventory and then
    /// that names no owner (LangGraph's `update_state()` without run metadata writes
    /// `{"source": "update"}`) was admitted on the person's thread; its erase then took more
    /// rows than inventoried and the job blocked on `anomalous_volume` (found by review,
    /// 2026-12-04). Locators that appear in the second reading (a thread registered meanwhile)
    /// are recorded in turn, for a few rounds; the anomaly guard covers anything later.
    fn inventory_guarded(
        &self,
        job: &JobRecord,
        scope: &Scope,
        t: &Target,
        opts: &RunOptions,
    ) -> Result<lethe_adapters::Inventory, AdapterError> {
        let mut inv = t.adapter.inventory(scope)?;
        pause_point!(self, opts, "after-inventory-read:{}", t.name);
        let Some(g) = t.adapter.guard() else {
            return Ok(inv);
        };
        let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
        let mut recorded = std::collections::HashSet::new();
        for _ in 0..3 {
            if !g.record_erased(&fence, &inv.locators)? {
                return Ok(inv);
            }
            recorded.extend(inv.locators.iter().map(|(l, _)| l.clone()));
            let again = t.adapter.inventory(scope)?;
            let settled = again.locators.iter().all(|(l, _)| recorded.contains(l));
            if again.count != inv.count {
                tracing::warn!(job = %job.job_id, target = %t.name, before = inv.count, after = again.count, "Rows of the scope were written while the inventory was taken; the guard refuses more.");
            }
            inv = again;
            if settled {
                break;
            }
        }
        Ok(inv)
    }

    /// One target's inventory, journaled. `Ok(Some(e))`: the adapter failed (not journaled).
    fn inventory_target(
        &self,
        job: &JobRecord,
        scope: &Scope,
        t: &Target,
        opts: &RunOptions,
        report: &dyn Fn(Progress),
    ) -> Result<Option<AdapterError>, EngineError> {
        let (count, locators, event) = match t.adapter.check_scope(scope).map_err(input)? {
            Applicability::Exempt(reason) => {
                self.journal.record(
                    &self.now_rfc3339(),
                    &job.job_id,
                    &Entry::TargetExempt {
                        target: t.name.clone(),
                        reason: reason.clone(),
                    },
                )?;
                let event = Progress::Exempt {
                    target: t.name.clone(),
                    reason,
                };
                (0, Vec::new(), event)
            }
            Applicability::Applies => match self.inventory_guarded(job, scope, t, opts) {
                Ok(inv) => {
                    tracing::info!(job = %job.job_id, target = %t.name, rows = inv.count, locators = inv.locators.len(), "Inventory taken.");
                    let event = Progress::Inventoried {
                        target: t.name.clone(),
                        count: inv.count,
                    };
                    (inv.count, inv.locators, event)
                }
                Err(e) => return Ok(Some(e)),
            },
        };
        self.journal.put_inventory(
            &self.now_rfc3339(),
            &job.job_id,
            &t.name,
            count,
            &locators,
            self.key.locator_key().as_bytes(),
            &t.adapter.place(),
        )?;
        report(event);
        Ok(None)
    }

    fn step_frozen(
        &self,
        job: &JobRecord,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        // The sinks' own fence first (FROZEN to COMPLETE): from here a writer that bypasses the
        // gate is refused by the database itself, so the inventory below cannot be outgrown.
        if let Step::Blocked = self.guards(job, "fence_closed", |g, f| g.close(f))? {
            return Ok(Step::Blocked);
        }
        // Inventory after the drain: once earlier permits are done, nothing can add rows.
        let undrained = self.drain(&job.job_id, opts, progress)?;
        if undrained > 0 {
            return self.block(&job.job_id, BlockedReason::Undrained, None, format!("{undrained} permits issued before the freeze are neither released nor confirmed cancelled"));
        }
        if let Step::Blocked = self.take_inventories(job, opts, progress)? {
            return Ok(Step::Blocked);
        }
        pause_point!(self, opts, "after-inventory");
        self.journal
            .record(&self.now_rfc3339(), &job.job_id, &Entry::Drained)?;
        Ok(Step::Next)
    }

    /// One target's erasure, journaled batch by batch. `Ok(Some(e))`: the adapter failed; what
    /// it erased before is journaled.
    fn erase_target(
        &self,
        job: &JobRecord,
        t: &Target,
        opts: &RunOptions,
        report: &dyn Fn(Progress),
        claim: &Mutex<&mut Claim>,
    ) -> Result<Option<AdapterError>, EngineError> {
        let (inventoried, erased, _) = self.journal.progress(&job.job_id, &t.name)?;
        if erased.is_some() {
            return Ok(None);
        }
        let Some((count, locators)) = self.journal.inventory(&job.job_id, &t.name)? else {
            return Err(EngineError::Journal(lethe_journal::JournalError::Corrupt(
                format!("target {} has no inventory", t.name),
            )));
        };
        debug_assert_eq!(inventoried, Some(count));
        self.refuse_if_locators_edited(job, t, &locators)?;
        let scope = Self::frozen_scope(job);
        // The guard learns what is erased before it is erased: a late write to an erased
        // thread or item is refused from the first deleted row on (LangGraph issue 7206).
        if let Some(g) = t.adapter.guard() {
            let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
            match g.record_erased(&fence, &locators) {
                Ok(true) => {
                    tracing::info!(job = %job.job_id, target = %t.name, locators = locators.len(), "Erased locators recorded in the database guard.")
                }
                Ok(false) => {}
                Err(e) => return Ok(Some(e)),
            }
        }
        self.journal.record(
            &self.now_rfc3339(),
            &job.job_id,
            &Entry::EraseStarted {
                target: t.name.clone(),
            },
        )?;
        let mut done = 0;
        // A target may erase more per call than a SQL transaction should hold (Redis: one
        // pipelined UNLINK per key, no transaction); each batch is still journaled after it.
        let batches = match t.adapter.batch_size() {
            Some(n) => locators.chunks(n).collect(),
            None => batches(&locators, self.batch_size, self.batch_rows),
        };
        let batches_len = batches.len();
        for (i, batch) in batches.into_iter().enumerate() {
            self.may_erase(job, claim)?;
            let rows = match t.adapter.erase_batch(&scope, batch) {
                Ok(n) => n,
                Err(e) => return Ok(Some(e)),
            };
            pause_point!(self, opts, "after-batch-commit:{}:{}", t.name, i + 1);
            let entry = Entry::BatchErased {
                target: t.name.clone(),
                locators: batch.len() as u64,
                rows,
            };
            if i + 1 == batches_len {
                // The last batch and the target's erased mark: one commit.
                self.journal.record_with_progress(
                    &self.now_rfc3339(),
                    &job.job_id,
                    &entry,
                    &t.name,
                    Some(count),
                    None,
                )?;
            } else {
                self.journal
                    .record(&self.now_rfc3339(), &job.job_id, &entry)?;
            }
            done += batch.len();
            report(Progress::Erased {
                target: t.name.clone(),
                done,
                total: locators.len(),
            });
            pause_point!(self, opts, "after-batch-journal:{}:{}", t.name, i + 1);
        }
        if batches_len == 0 {
            self.journal
                .set_progress(&job.job_id, &t.name, Some(count), None)?;
        }
        tracing::info!(job = %job.job_id, target = %t.name, erased = count, "Target erased.");
        Ok(None)
    }

    fn step_deleting(
        &self,
        job: &JobRecord,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
        claim: &Mutex<&mut Claim>,
    ) -> Result<Step, EngineError> {
        // A job resumed from a block in FROZEN may not have every inventory yet.
        if let Step::Blocked = self.take_inventories(job, opts, progress)? {
            return Ok(Step::Blocked);
        }
        // All targets at once; an adapter error blocks the job on the first such target in
        // configuration order, and what the others erased stays journaled.
        let targets = self.targets.iter().collect();
        let done = self.each_target(targets, progress, |t, report| {
            self.erase_target(job, t, opts, report, claim)
        });
        for (t, r) in done {
            if let Some(e) = r? {
                return self.block_on(&job.job_id, &t.name, e);
            }
        }
        pause_point!(self, opts, "before-verify");
        self.journal
            .record(&self.now_rfc3339(), &job.job_id, &Entry::TargetsErased)?;
        Ok(Step::Next)
    }

    fn step_verifying(
        &self,
        job: &JobRecord,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        let scope = Self::frozen_scope(job);
        // All targets at once, then, in configuration order, the first failure or residue
        // blocks the job.
        let targets = self.targets.iter().collect();
        let done = self.each_target(targets, progress, |t, report| {
            self.verify_target(job, &scope, t, report)
        });
        let mut records = BTreeMap::new();
        for (t, r) in done {
            let (count, checked) = r?;
            let (status, reason) = match checked {
                Checked::Exempt(reason) => (TargetStatus::Exempt, Some(reason)),
                Checked::Failed(e) => return self.block_on(&job.job_id, &t.name, e),
                Checked::Residue(residue) if residue > 0 => {
                    return self.block(
                        &job.job_id,
                        BlockedReason::Residue,
                        Some(&t.name),
                        format!("{residue} rows left for the scope after the erase"),
                    );
                }
                Checked::Residue(_) => (TargetStatus::Done, None),
            };
            let d = t.adapter.describe();
            records.insert(
                t.name.clone(),
                TargetRecord {
                    status,
                    count,
                    class: t.class.clone(),
                    adapter: d.kind.to_string(),
                    adapter_version: d.version.to_string(),
                    error_codes: self.error_codes(&job.job_id, &t.name)?,
                    reason,
                    expires: None,
                },
            );
        }
        // Everything is verified gone: open the sinks' fence (epoch and erased lists stay, so
        // only writes under a lease taken after this job are admitted for the owner). Opened
        // before COMPLETE so an unreachable guard blocks the job instead of leaving it closed.
        if let Step::Blocked = self.guards(job, "fence_opened", |g, f| g.open(f))? {
            return Ok(Step::Blocked);
        }
        pause_point!(self, opts, "before-complete");
        // The certificate is built from the job's row and progress: they must say what the
        // chain recorded, or an edit of those tables would be signed.
        self.refuse_if_projection_edited(&job.job_id, "no certificate is signed")?;
        let cert = Certificate {
            format: certificate::FORMAT.to_string(),
            job_id: job.job_id.clone(),
            scope: job.scope.kind(),
            // A memory scope's hash binds the version frozen, which a request without one
            // did not name: the certificate says which version is gone.
            scope_hash: self.scope_hash(&Self::frozen_scope(job)),
            subject_epoch: job.subject_epoch,
            tenant_epoch: job.tenant_epoch,
            basis: job.basis,
            policy_version: job.policy_version.clone(),
            requested_at: job.requested_at.clone(),
            completed_at: self.now_rfc3339(),
            deadline: time::Date::parse(
                &job.deadline,
                &time::macros::format_description!("[year]-[month]-[day]"),
            )
            .map_err(|_| lethe_journal::JournalError::Corrupt("deadline".into()))?,
            targets: records,
            backup_expiry: None,
            signed_by: String::new(),
        };
        let signed = cert.sign(&self.key);
        // The journal first, then the file: a signed file exists only for a COMPLETE job. If
        // the process dies in between, running the COMPLETE job again writes the file from the
        // journal (`certificate_file`).
        self.journal
            .complete(&rfc3339(self.clock.now()), &job.job_id, &signed)?;
        pause_point!(self, opts, "before-certificate-file");
        self.write_certificate(&job.job_id, &signed)?;
        if let Some(g) = &self.gate {
            g.job_completed(&job.job_id);
        }
        tracing::info!(job = %job.job_id, scope_hash = %short(&job.scope_hash), "Job complete; certificate issued.");
        Ok(Step::Next)
    }

    /// Writes a COMPLETE job's certificate file from the journal if it is missing (the process
    /// died between the journal's commit and the file).
    /// Writes a COMPLETE job's certificate file if it is missing; whether it did.
    fn certificate_file(&self, job: &JobRecord) -> Result<bool, EngineError> {
        let path = self.certificates.join(format!("{}.json", job.job_id));
        match &job.certificate {
            Some(signed) if !path.exists() => {
                self.write_certificate(&job.job_id, signed)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Writes `certificates/JOB.json` whole (a temporary file renamed over it).
    fn write_certificate(
        &self,
        job_id: &str,
        signed: &impl serde::Serialize,
    ) -> Result<(), EngineError> {
        let path = self.certificates.join(format!("{job_id}.json"));
        let failed = |cause| EngineError::CertificateFile {
            path: path.display().to_string(),
            cause,
        };
        std::fs::create_dir_all(&self.certificates).map_err(failed)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_string_pretty(signed).unwrap_or_default() + "\n",
        )
        .map_err(failed)?;
        std::fs::rename(&tmp, &path).map_err(failed)?;
        Ok(())
    }

    /// One target's verification, journaled (`TargetVerified`); returns its inventoried count
    /// and what the check found.
    fn verify_target(
        &self,
        job: &JobRecord,
        scope: &Scope,
        t: &Target,
        report: &dyn Fn(Progress),
    ) -> Result<(u64, Checked), EngineError> {
        let applies = t.adapter.check_scope(scope).map_err(input)?;
        let (count, frozen) = self
            .journal
            .inventory(&job.job_id, &t.name)?
            .unwrap_or_default();
        let residue = match applies {
            Applicability::Exempt(reason) => return Ok((count, Checked::Exempt(reason))),
            Applicability::Applies => match t.adapter.verify(scope, &frozen) {
                Ok(n) => n,
                Err(e) => return Ok((count, Checked::Failed(e))),
            },
        };
        self.journal.record_with_progress(
            &self.now_rfc3339(),
            &job.job_id,
            &Entry::TargetVerified {
                target: t.name.clone(),
                residue,
            },
            &t.name,
            None,
            Some(residue),
        )?;
        report(Progress::Verified {
            target: t.name.clone(),
            residue,
        });
        Ok((count, Checked::Residue(residue)))
    }

    fn error_codes(&self, job: &str, target: &str) -> Result<Vec<String>, EngineError> {
        let mut codes: Vec<String> = self
            .journal
            .entries(job)?
            .into_iter()
            .filter_map(|e| match e {
                Entry::Blocked {
                    reason,
                    target: Some(t),
                    ..
                } if t == target => Some(reason.as_str().to_string()),
                _ => None,
            })
            .collect();
        // Each reason once, in the order first met (a job may block on it again later).
        let mut seen = std::collections::HashSet::new();
        codes.retain(|c| seen.insert(c.clone()));
        Ok(codes)
    }

    fn step_resume(
        &self,
        job: &JobRecord,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        // A hold placed while the job was blocked stops it here: preservation wins over
        // erasure until the hold is released.
        self.refuse_if_job_held(job)?;
        // A BLOCKED job keeps its fence closed; closing again is idempotent and covers a guard
        // installed since. An unreachable guard leaves the job BLOCKED as it is (no new entry:
        // BLOCKED has no transition to itself).
        let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
        for t in &self.targets {
            if let Some(Err(e)) = t.adapter.guard().map(|g| g.close(&fence)) {
                tracing::warn!(job = %job.job_id, target = %t.name, error = %e, "Database guard unreachable; the job stays blocked.");
                return Ok(Step::Blocked);
            }
        }
        // And it learns what was erased before it was installed.
        for t in &self.targets {
            let Some(g) = t.adapter.guard() else {
                continue;
            };
            if self.journal.progress(&job.job_id, &t.name)?.1.is_none() {
                continue;
            }
            if let Some((_, locators)) = self.journal.inventory(&job.job_id, &t.name)? {
                if let Err(e) = g.record_erased(&fence, &locators) {
                    tracing::warn!(job = %job.job_id, target = %t.name, error = %e, "Database guard unreachable; the job stays blocked.");
                    return Ok(Step::Blocked);
                }
            }
        }
        // Nothing is erased while a permit from before the freeze may still write.
        let undrained = self.drain(&job.job_id, opts, progress)?;
        if undrained > 0 {
            tracing::warn!(job = %job.job_id, undrained, "Still undrained; the job stays blocked.");
            return Ok(Step::Blocked);
        }
        if opts.reinventory && job.blocked_reason == Some(BlockedReason::Residue) {
            if let Step::Blocked = self.reinventory(job)? {
                return Ok(Step::Blocked);
            }
        }
        tracing::info!(job = %job.job_id, "Job resumed.");
        self.journal
            .record(&self.now_rfc3339(), &job.job_id, &Entry::Resumed)?;
        // Targets already erased are not erased again, only re-verified: a job blocked on
        // `residue` (rows written after the freeze, outside the frozen inventory) stays blocked
        // unless the operator chose `--reinventory` above.
        Ok(Step::Next)
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
