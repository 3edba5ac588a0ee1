//! A batch: many requests (a day's account deletions, a queue after an outage), each still its
//! own job with its own journal entries, states and certificate, run together so that each
//! store is read once for all of them where it can be ([`Adapter::inventory_many`],
//! [`Adapter::verify_many`]: one Redis keyspace pass for every pattern of the batch instead of
//! one a job).
//!
//! The jobs go through their states side by side, in groups of at most `batch_group` jobs (the
//! memory a group's inventories take is what bounds a batch): every job of the group is
//! requested, claimed, frozen and drained; then each target's inventory is read for all of
//! them at once; then each job is inventoried (from that reading), erased and brought to
//! VERIFYING by the usual runner; then each target is verified for all of them at once; then
//! each job is verified (from that reading) and certified. A job that blocks or fails on the
//! way stops there, and the others go on.
//!
//! [`Adapter::inventory_many`]: lethe_adapters::Adapter::inventory_many
//! [`Adapter::verify_many`]: lethe_adapters::Adapter::verify_many

use std::collections::HashMap;
use std::sync::Mutex;

use lethe_adapters::{AdapterError, Applicability, Fence, Inventory, Locator};
use lethe_core::{JobState, Scope};
use lethe_journal::jobs::Claim;

use crate::{Engine, EngineError, Outcome, Request, RunOptions};

use super::{Progress, Run, Step};

/// What a batch read for all its jobs at once, per job and target, each taken once by the
/// job's own step (a job that blocked before using it leaves it unused, and it dies with the
/// group).
#[derive(Default)]
pub(crate) struct Shared {
    inventories: Mutex<HashMap<(String, String), Result<Inventory, AdapterError>>>,
    residues: Mutex<HashMap<(String, String), Result<u64, AdapterError>>>,
    /// Jobs this batch froze, fenced and drained itself, and has driven since, under its
    /// claim: their runner does not fence and drain them again before their inventory, nor
    /// redo a picked-up job's guard updates when it goes on to verify them (what it did is
    /// what one runner does between its steps).
    driven: Mutex<std::collections::HashSet<String>>,
    /// Targets whose database guard was not installed when the batch closed its jobs' fences:
    /// no fence of theirs to open, nothing to record before an inventory (as for one job whose
    /// guard is installed after its freeze; the erase still tells a guard installed since).
    unguarded: Mutex<std::collections::HashSet<String>>,
}

impl Shared {
    /// Whether the target's guard was not installed when the batch closed its fences.
    pub(super) fn unguarded(&self, target: &str) -> bool {
        lock(&self.unguarded).contains(target)
    }

    /// Whether this batch froze, fenced and drained the job itself, and drives it.
    pub(super) fn drives(&self, job: &str) -> bool {
        lock(&self.driven).contains(job)
    }

    /// The inventory the batch read for this job and target, if it did.
    pub(super) fn inventory(
        &self,
        job: &str,
        target: &str,
    ) -> Option<Result<Inventory, AdapterError>> {
        lock(&self.inventories).remove(&(job.to_string(), target.to_string()))
    }

    /// The residue the batch counted for this job and target, if it did.
    pub(super) fn residue(&self, job: &str, target: &str) -> Option<Result<u64, AdapterError>> {
        lock(&self.residues).remove(&(job.to_string(), target.to_string()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One job of a group, as it goes.
struct Member {
    /// Its request's place in the batch.
    index: usize,
    job_id: String,
    /// Whether this request created the job (not an open job for the same scope).
    created: bool,
    claim: Claim,
}

impl Engine {
    /// Runs a batch of requests: each its own job (an open job for the same scope is continued,
    /// as `erase` continues it), the stores read once per step for all of them where the
    /// target can. One result per request, in order: the job's outcome, or why it was not
    /// started or stopped ([`EngineError::Held`] for one a legal hold covers). The targets are
    /// probed once. An error that is not one job's (the targets unreachable at the start, a
    /// journal unreachable or whose chain no longer verifies) stops the whole batch; the jobs
    /// it requested stay in the journal, for `lethe work` or `lethe resume`.
    pub fn erase_batch(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Result<Outcome, EngineError>>, EngineError> {
        self.probe_all()?;
        self.journal.prepare_claim();
        let mut out = Vec::with_capacity(requests.len());
        let mut requests = requests.into_iter().peekable();
        while requests.peek().is_some() {
            let group: Vec<Request> = requests.by_ref().take(self.batch_group).collect();
            let first = out.len();
            out.extend(self.erase_group(group, first, opts, progress)?);
        }
        Ok(out)
    }

    fn erase_group(
        &self,
        requests: Vec<Request>,
        first: usize,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Result<Outcome, EngineError>>, EngineError> {
        let total = requests.len();
        let mut out: Vec<Option<Result<Outcome, EngineError>>> = (0..total).map(|_| None).collect();
        // No job is added to a journal whose chain does not verify.
        self.journal.check_chain_sealed(&self.key.verifying_key())?;
        // Requested: each checked and journaled as `erase` does it, without probing again.
        let mut requested = Vec::with_capacity(total);
        for (i, req) in requests.into_iter().enumerate() {
            match self.request_probed(req, self.clock.now()) {
                Ok((job_id, created)) => requested.push((i, job_id, created)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        progress(Progress::Batch {
            step: "requested",
            done: requested.len(),
            total,
        });
        self.run_group(requested, out, first, opts, progress)
    }

    /// Runs jobs already requested (`POST /v1/jobs/batch` answers with their ids first) as a
    /// batch: in groups of at most `batch_group`, each store read once per step for a group.
    /// One result per job, in order.
    pub fn run_batch(
        &self,
        job_ids: Vec<String>,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Result<Outcome, EngineError>>, EngineError> {
        self.probe_all()?;
        self.journal.prepare_claim();
        let mut out = Vec::with_capacity(job_ids.len());
        for group in job_ids.chunks(self.batch_group) {
            let requested = group
                .iter()
                .enumerate()
                .map(|(i, id)| (i, id.clone(), true))
                .collect();
            let none = (0..group.len()).map(|_| None).collect();
            let first = out.len();
            out.extend(self.run_group(requested, none, first, opts, progress)?);
        }
        Ok(out)
    }

    /// A group's jobs, side by side from their claim to their end (`out`: the results known
    /// already, by the requests' places; `requested`: each job's place, id and whether its
    /// request created it).
    fn run_group(
        &self,
        requested: Vec<(usize, String, bool)>,
        mut out: Vec<Option<Result<Outcome, EngineError>>>,
        first: usize,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Result<Outcome, EngineError>>, EngineError> {
        let total = out.len();
        // One job runs once: an entry that names a job an earlier entry names (the same scope
        // twice; the CLI and the service refuse such a batch) is told so.
        let mut seen = HashMap::new();
        let requested: Vec<_> = requested
            .into_iter()
            .filter(|(i, id, _)| match seen.insert(id.clone(), *i) {
                Some(earlier) => {
                    out[*i] = Some(Err(EngineError::Input(format!(
                        "batch entry {} is the same job as entry {}: it runs once",
                        first + i + 1,
                        first + earlier + 1
                    ))));
                    false
                }
                None => true,
            })
            .collect();
        // Claimed: all at once (on PostgreSQL, one connection holds every claim).
        let ids: Vec<String> = requested.iter().map(|(_, id, _)| id.clone()).collect();
        let claims = self.journal.claim_many(&ids)?;
        let mut members = Vec::with_capacity(requested.len());
        for ((index, job_id, created), claim) in requested.into_iter().zip(claims) {
            match claim {
                Some(claim) => members.push(Member {
                    index,
                    job_id,
                    created,
                    claim,
                }),
                None => out[index] = Some(Err(EngineError::Claimed(job_id))),
            }
        }
        let shared = Shared::default();
        let quiet = &mut |_: Progress| {};
        // Nothing runs on a journal whose chain does not verify: checked before each step of
        // the group (each job's own runner checks it when it runs alone).
        let chain = || {
            self.journal
                .check_chain_sealed(&self.key.verifying_key())
                .map_err(EngineError::from)
        };
        chain()?;
        // Frozen, each job by its own step; a job already further along (an open job
        // continued) is left to the runner.
        let mut frozen = Vec::new();
        for m in &mut members {
            match self.freeze_member(m, opts) {
                Ok(Some(Step::Next)) => frozen.push(m.job_id.clone()),
                // Blocked by its freeze: it stays BLOCKED, for an operator.
                Ok(Some(Step::Blocked)) => {
                    out[m.index] = Some(self.outcome(&m.job_id).map(|o| continued(o, m.created)))
                }
                Ok(None) => {}
                Err(e) => out[m.index] = Some(Err(e)),
            }
        }
        // The sinks' fences, closed for all of them at once; then each drained.
        let jobs: Vec<_> = frozen
            .iter()
            .map(|id| self.journal.job(id))
            .collect::<Result<_, _>>()?;
        let blocked = self.close_guards(&jobs, &shared)?;
        let mut ready = Vec::new();
        for m in &mut members {
            let Some(job) = jobs.iter().find(|j| j.job_id == m.job_id) else {
                continue;
            };
            if blocked.contains(&m.job_id) {
                out[m.index] = Some(self.outcome(&m.job_id).map(|o| continued(o, m.created)));
                continue;
            }
            let run = Run {
                engine: self,
                opts,
                claim: Mutex::new(&mut m.claim),
                shared: None,
            };
            match run.drain(&m.job_id, quiet) {
                Ok(0) => {
                    lock(&shared.driven).insert(m.job_id.clone());
                    ready.push(m.job_id.clone());
                }
                Ok(undrained) => {
                    let blocked = self.block(
                        &job.job_id,
                        lethe_core::BlockedReason::Undrained,
                        None,
                        format!("{undrained} permits issued before the freeze are neither released nor confirmed cancelled"),
                    );
                    out[m.index] = Some(
                        blocked
                            .and_then(|_| self.outcome(&m.job_id))
                            .map(|o| continued(o, m.created)),
                    );
                }
                Err(e) => out[m.index] = Some(Err(e)),
            }
        }
        let frozen = ready;
        progress(Progress::Batch {
            step: "frozen",
            done: frozen.len(),
            total,
        });
        // Every target's inventory of every frozen job, read at once.
        self.read_inventories(&frozen, &shared)?;
        progress(Progress::Batch {
            step: "inventory",
            done: frozen.len(),
            total,
        });
        // Each job inventoried (from that reading) and brought to DELETING.
        chain()?;
        let mut deleting = Vec::new();
        for m in &mut members {
            if out[m.index].is_some() {
                continue;
            }
            match self.run_shared(
                &mut m.claim,
                opts,
                quiet,
                Some(&shared),
                Some(JobState::Deleting),
            ) {
                Ok(o) if o.state == JobState::Deleting => {
                    if shared.drives(&m.job_id) && m.claim.holds() {
                        deleting.push(self.journal.job(&m.job_id)?);
                    }
                }
                Ok(o) => out[m.index] = Some(Ok(continued(o, m.created))),
                Err(e) => out[m.index] = Some(Err(e)),
            }
        }
        // The transactional targets erase many jobs' batches in one transaction each.
        self.erase_shared(&deleting)?;
        // Each job erased (what the shared erase did is journaled; the rest by its own steps)
        // and brought to VERIFYING.
        let mut erased = 0;
        for m in &mut members {
            if out[m.index].is_some() {
                continue;
            }
            match self.run_shared(
                &mut m.claim,
                opts,
                quiet,
                Some(&shared),
                Some(JobState::Verifying),
            ) {
                Ok(o) if o.state == JobState::Verifying => erased += 1,
                Ok(o) => out[m.index] = Some(Ok(continued(o, m.created))),
                Err(e) => out[m.index] = Some(Err(e)),
            }
        }
        progress(Progress::Batch {
            step: "erased",
            done: erased,
            total,
        });
        // Every target verified for every job now VERIFYING, at once.
        let verifying: Vec<String> = members
            .iter()
            .filter(|m| out[m.index].is_none())
            .map(|m| m.job_id.clone())
            .collect();
        self.read_residues(&verifying, &shared)?;
        progress(Progress::Batch {
            step: "verification",
            done: verifying.len(),
            total,
        });
        // Each job verified (from that reading) and certified.
        chain()?;
        let mut complete = 0;
        for m in &mut members {
            if out[m.index].is_some() {
                continue;
            }
            let r = self.run_shared(&mut m.claim, opts, quiet, Some(&shared), None);
            if matches!(&r, Ok(o) if o.state == JobState::Complete) {
                complete += 1;
            }
            out[m.index] = Some(r.map(|o| continued(o, m.created)));
        }
        progress(Progress::Batch {
            step: "complete",
            done: complete,
            total,
        });
        Ok(finish(out, first))
    }

    /// A member's freeze, as its runner would do it (the same checks first): `Step::Next`
    /// when it is FROZEN, `Step::Blocked` when its freeze blocked it. A job not REQUESTED or
    /// FROZEN (an open job the request continued) is `None`: the runner takes it as it is.
    fn freeze_member(
        &self,
        m: &mut Member,
        opts: &RunOptions,
    ) -> Result<Option<Step>, EngineError> {
        let job = self.journal.job(&m.job_id)?;
        if !matches!(job.state, JobState::Requested | JobState::Frozen) {
            return Ok(None);
        }
        self.refuse_if_projection_edited(&m.job_id, "the job is not run")?;
        self.refuse_if_targets_missing(&m.job_id)?;
        self.refuse_if_job_held(&job)?;
        let run = Run {
            engine: self,
            opts,
            claim: Mutex::new(&mut m.claim),
            shared: None,
        };
        run.refuse_if_claim_lost(&m.job_id)?;
        if job.state == JobState::Requested {
            return run.step_requested(&job).map(Some);
        }
        Ok(Some(Step::Next))
    }

    /// Closes every database guard's fence for all of `jobs` at once (what each job's FROZEN
    /// step does alone). A guard that fails blocks each of them on its target, as it would
    /// have blocked each alone; their ids are returned.
    fn close_guards(
        &self,
        jobs: &[lethe_journal::jobs::JobRecord],
        shared: &Shared,
    ) -> Result<std::collections::HashSet<String>, EngineError> {
        let mut blocked = std::collections::HashSet::new();
        if jobs.is_empty() {
            return Ok(blocked);
        }
        let fences: Vec<Fence<'_>> = jobs
            .iter()
            .map(|j| Fence::of(&j.scope, j.subject_epoch, j.tenant_epoch))
            .collect();
        for t in &self.targets {
            let Some(g) = t.adapter.guard() else {
                continue;
            };
            match g.close_many(&fences) {
                Ok(true) => {
                    tracing::info!(target = %t.name, jobs = jobs.len(), step = "fence_closed", "Database guard updated.")
                }
                Ok(false) => {
                    lock(&shared.unguarded).insert(t.name.clone());
                }
                Err(e) => {
                    let (reason, why) = (super::blocked_reason(&e), e.to_string());
                    for j in jobs {
                        if blocked.insert(j.job_id.clone()) {
                            self.block(&j.job_id, reason, Some(&t.name), why.clone())?;
                        }
                    }
                }
            }
        }
        Ok(blocked)
    }

    /// Each job with the scope its adapters act on.
    fn frozen_scopes(&self, jobs: &[String]) -> Result<Vec<(String, Scope)>, EngineError> {
        jobs.iter()
            .map(|id| Ok((id.clone(), Engine::frozen_scope(&self.journal.job(id)?))))
            .collect()
    }

    /// Each target's inventory of every job in `jobs` it applies to, read at once into
    /// `shared`. A target that takes lineage reads each job's inventory in its own step (it
    /// needs the recorded locators).
    fn read_inventories(&self, jobs: &[String], shared: &Shared) -> Result<(), EngineError> {
        let scopes = self.frozen_scopes(jobs)?;
        let targets: Vec<_> = self
            .targets
            .iter()
            .filter(|t| !t.adapter.takes_lineage())
            .collect();
        let read = crate::at_once(&targets, |t| {
            let mine: Vec<&(String, Scope)> = scopes
                .iter()
                .filter(|(_, s)| matches!(t.adapter.check_scope(s), Ok(Applicability::Applies)))
                .collect();
            let just: Vec<Scope> = mine.iter().map(|(_, s)| s.clone()).collect();
            let found = t.adapter.inventory_many(&just);
            mine.into_iter()
                .map(|(id, _)| id.clone())
                .zip(found)
                .collect::<Vec<_>>()
        });
        let mut map = lock(&shared.inventories);
        for (t, found) in targets.iter().zip(read) {
            for (id, inv) in found {
                map.insert((id, t.name.clone()), inv);
            }
        }
        Ok(())
    }

    /// The erase of every job in `jobs` (DELETING, driven by the batch) on each transactional
    /// target (one without its own `batch_size`), many jobs' batches in one transaction
    /// ([`lethe_adapters::Adapter::erase_many`]), each journaled as its job's erase step would
    /// journal it: `erase_started` before, its `batch_erased` with the target's erased mark
    /// after. A job this cannot serve (its rows over one batch, its locators edited, a hold
    /// placed meanwhile, a guard or store that failed it) is left to its own step, which
    /// erases or blocks it as it would alone.
    fn erase_shared(&self, jobs: &[lethe_journal::jobs::JobRecord]) -> Result<(), EngineError> {
        if jobs.len() < 2 {
            return Ok(());
        }
        let targets: Vec<_> = self
            .targets
            .iter()
            .filter(|t| t.adapter.batch_size().is_none())
            .collect();
        for r in crate::at_once(&targets, |t| self.erase_target_shared(t, jobs)) {
            r?;
        }
        Ok(())
    }

    fn erase_target_shared(
        &self,
        t: &lethe_adapters::Target,
        jobs: &[lethe_journal::jobs::JobRecord],
    ) -> Result<(), EngineError> {
        let mut items = Vec::new();
        for job in jobs {
            if self.journal.progress(&job.job_id, &t.name)?.1.is_some() {
                continue;
            }
            let Some((count, locators)) = self.journal.inventory(&job.job_id, &t.name)? else {
                continue;
            };
            let rows: u64 = locators.iter().map(|(_, n)| n).sum();
            if locators.is_empty()
                || locators.len() > self.batch_size
                || rows > self.batch_rows
                || self.refuse_if_locators_edited(job, t, &locators).is_err()
            {
                continue;
            }
            items.push((job, count, locators, rows));
        }
        // The guard learns what is erased before it is erased.
        if let Some(g) = t.adapter.guard() {
            let mut kept = Vec::with_capacity(items.len());
            let mut installed = true;
            for item in items {
                let job = item.0;
                let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
                // Not installed at the first job: none to tell for the others either (as a
                // guard installed after a job's own step told it nothing).
                if !installed {
                    kept.push(item);
                    continue;
                }
                // A guard that fails leaves the job to its own step, which blocks on it.
                if let Ok(told) = g.record_erased(&fence, &item.2) {
                    installed = told;
                    kept.push(item);
                }
            }
            items = kept;
        }
        let (mut start, mut rows, mut locs) = (0, 0u64, 0usize);
        let mut chunks = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if i > start
                && (rows + item.3 > self.batch_rows || locs + item.2.len() > self.batch_size)
            {
                chunks.push(&items[start..i]);
                (start, rows, locs) = (i, 0, 0);
            }
            rows += item.3;
            locs += item.2.len();
        }
        if start < items.len() {
            chunks.push(&items[start..]);
        }
        for chunk in chunks {
            let mut work = Vec::with_capacity(chunk.len());
            let mut going = Vec::with_capacity(chunk.len());
            for (job, count, locators, _) in chunk {
                // A hold placed since the job's last check stops it before it erases.
                if self.refuse_if_job_held(job).is_err() {
                    continue;
                }
                work.push((Engine::frozen_scope(job), locators.clone()));
                going.push((*job, *count, locators.len()));
            }
            // Every job's `erase_started` in one commit, before anything is erased.
            let started: Vec<_> = going
                .iter()
                .map(|(job, _, _)| {
                    let entry = lethe_journal::Entry::EraseStarted {
                        target: t.name.clone(),
                    };
                    (job.job_id.as_str(), entry, None)
                })
                .collect();
            self.journal.record_many(&self.now_rfc3339(), &started)?;
            let done = t.adapter.erase_many(&work);
            // And every erased job's `batch_erased` with its erased mark in one commit after;
            // a job whose erase failed is left to its own step.
            let mut erased = Vec::with_capacity(going.len());
            for ((job, count, n), r) in going.into_iter().zip(done) {
                if let Ok(rows) = r {
                    let entry = lethe_journal::Entry::BatchErased {
                        target: t.name.clone(),
                        locators: n as u64,
                        rows,
                    };
                    erased.push((job.job_id.as_str(), entry, Some((t.name.as_str(), count))));
                }
            }
            self.journal.record_many(&self.now_rfc3339(), &erased)?;
            for (job, _, _) in &erased {
                tracing::info!(job = %job, target = %t.name, "Target erased.");
            }
        }
        Ok(())
    }

    /// Each target's verification of every job in `jobs` it applies to, with its frozen
    /// locators, read at once into `shared`.
    fn read_residues(&self, jobs: &[String], shared: &Shared) -> Result<(), EngineError> {
        let scopes = self.frozen_scopes(jobs)?;
        let targets: Vec<_> = self.targets.iter().collect();
        let read = crate::at_once(&targets, |t| -> Result<_, EngineError> {
            let mut work: Vec<(Scope, Vec<Locator>)> = Vec::new();
            let mut ids = Vec::new();
            for (id, s) in &scopes {
                if !matches!(t.adapter.check_scope(s), Ok(Applicability::Applies)) {
                    continue;
                }
                let (_, frozen) = self.journal.inventory(id, &t.name)?.unwrap_or_default();
                work.push((s.clone(), frozen));
                ids.push(id.clone());
            }
            let found = t.adapter.verify_many(&work);
            Ok(ids.into_iter().zip(found).collect::<Vec<_>>())
        });
        let mut map = lock(&shared.residues);
        for (t, found) in targets.iter().zip(read) {
            for (id, residue) in found? {
                map.insert((id, t.name.clone()), residue);
            }
        }
        Ok(())
    }
}

/// An outcome as `erase` reports it: `continued` when the request found an open job.
fn continued(mut o: Outcome, created: bool) -> Outcome {
    o.continued = !created;
    o
}

/// The group's results, in order; a request left without one (none should be) says so.
fn finish(
    out: Vec<Option<Result<Outcome, EngineError>>>,
    first: usize,
) -> Vec<Result<Outcome, EngineError>> {
    out.into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| {
                Err(EngineError::Input(format!(
                    "batch entry {} was not run",
                    first + i + 1
                )))
            })
        })
        .collect()
}
