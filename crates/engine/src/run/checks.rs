//! The runner's tamper checks: a job's row, its frozen locators, its targets, its claim and
//! the holds are checked against the chain before the work they would steer.

use lethe_adapters::{Locator, Target};
use lethe_core::JobState;
use lethe_journal::jobs::JobRecord;
use lethe_journal::Entry;

use crate::{input, Engine, EngineError};

use super::Run;

impl Engine {
    /// Refuses to erase a target whose stored frozen locators differ from the keyed digest
    /// journaled with its inventory (`inventory_taken`): an edit of the journal's locator
    /// table apart from the chain, say one subject's thread swapped for another's, would
    /// otherwise be erased (review: 20 rows of another subject went; the anomaly guard counts
    /// rows, not owners). A target whose inventory was extended (`--reinventory`) keeps its
    /// locators summed over the parts, which no one digest covers: not checked.
    pub(super) fn refuse_if_locators_edited(
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

    /// Refuses a job whose row or progress differs from what its chain entries record.
    pub(super) fn refuse_if_projection_edited(
        &self,
        job_id: &str,
        outcome: &str,
    ) -> Result<(), EngineError> {
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

    /// Refuses (exit 2, nothing touched) a job that inventoried a target this configuration
    /// does not have (removed or renamed since): the job would otherwise erase, verify and
    /// certify the others and never look at that target's frozen rows again.
    pub(super) fn refuse_if_targets_missing(&self, job_id: &str) -> Result<(), EngineError> {
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
    pub(super) fn waits_on_a_hold(&self, job_id: &str) -> Result<bool, EngineError> {
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
    pub(super) fn refuse_if_job_held(&self, job: &JobRecord) -> Result<(), EngineError> {
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
}

impl Run<'_> {
    /// [`EngineError::ClaimLost`] once this process's claim on the job no longer holds.
    pub(super) fn refuse_if_claim_lost(&self, job_id: &str) -> Result<(), EngineError> {
        if self.claim.lock().unwrap_or_else(|p| p.into_inner()).holds() {
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
    pub(super) fn may_erase(&self, job: &JobRecord) -> Result<(), EngineError> {
        self.refuse_if_claim_lost(&job.job_id)?;
        self.refuse_if_job_held(job)
    }
}
