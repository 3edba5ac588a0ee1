//! Each state's work: the freeze, the drain and the inventories (FROZEN), the erasure
//! (DELETING), the verification (VERIFYING) and the resume of a BLOCKED job.

use std::collections::BTreeMap;
use std::time::Duration;

use lethe_adapters::{AdapterError, Applicability, Fence, Target};
use lethe_core::certificate::{
    self, Certificate, ExemptAsset, LegacyRecord, TargetRecord, TargetStatus,
};
use lethe_core::{BlockedReason, Scope};
use lethe_journal::jobs::JobRecord;
use lethe_journal::Entry;

use crate::{input, rfc3339, short, Engine, EngineError};

use super::*;

impl Run<'_> {
    /// Adds what each target with residue holds for the scope now to its inventory.
    pub(super) fn reinventory(&self, job: &JobRecord) -> Result<Step, EngineError> {
        let scope = Engine::frozen_scope(job);
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

    pub(super) fn step_requested(&self, job: &JobRecord) -> Result<Step, EngineError> {
        self.refuse_if_job_held(job)?;
        let version = self.resolve_version(&job.scope, self.version_at_request(job)?.as_ref())?;
        let at = self.now_rfc3339();
        let f = self
            .gate_authority()
            .freeze(&at, &job.job_id, version.as_ref())?;
        tracing::info!(
            job = %job.job_id, scope_hash = %short(&job.scope_hash), revoked = f.revoked_leases,
            to_drain = f.permits_to_drain, "Fence closed."
        );
        Ok(Step::Next)
    }

    /// Waits for the permits found active at the freeze to be released or cancelled.
    pub(super) fn drain(
        &self,
        job: &str,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<u64, EngineError> {
        let deadline = self.clock.now() + self.opts.drain_timeout;
        loop {
            let n = self.gate_authority().undrained(job)?;
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
    pub(super) fn take_inventories(
        &self,
        job: &JobRecord,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        let scope = Engine::frozen_scope(job);
        let mut todo = Vec::new();
        for t in &self.targets {
            if self.journal.progress(&job.job_id, &t.name)?.0.is_none() {
                todo.push(t);
            }
        }
        let done = self.each_target(todo, progress, |t, report| {
            self.inventory_target(job, &scope, t, report)
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
    /// rows than inventoried and the job blocked on `anomalous_volume`. Locators that appear in the second reading (a thread registered meanwhile)
    /// are recorded in turn, for a few rounds; the anomaly guard covers anything later.
    pub(super) fn inventory_guarded(
        &self,
        job: &JobRecord,
        scope: &Scope,
        t: &Target,
        owned: &[String],
    ) -> Result<lethe_adapters::Inventory, AdapterError> {
        let mut inv = match self.shared.and_then(|s| s.inventory(&job.job_id, &t.name)) {
            Some(read) => read?,
            None => t.adapter.inventory_owned(scope, owned)?,
        };
        pause_point!(self, "after-inventory-read:{}", t.name);
        let Some(g) = t.adapter.guard() else {
            return Ok(inv);
        };
        // A batch found no guard installed there when it closed its jobs' fences.
        if self.shared.is_some_and(|s| s.unguarded(&t.name)) {
            return Ok(inv);
        }
        let fence = Fence::of(&job.scope, job.subject_epoch, job.tenant_epoch);
        let mut recorded = std::collections::HashSet::new();
        for _ in 0..3 {
            if !g.record_erased(&fence, &inv.locators)? {
                return Ok(inv);
            }
            recorded.extend(inv.locators.iter().map(|(l, _)| l.clone()));
            let again = t.adapter.inventory_owned(scope, owned)?;
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

    /// Adds to a target's inventory the artifacts runtimes recorded as derived from the scope
    /// (lineage), transitively (an artifact derived from an artifact), each as the adapter
    /// resolves it now; one gone already adds nothing. `Ok(Some(e))`: the adapter failed.
    fn add_lineage(
        &self,
        scope: &Scope,
        t: &Target,
        inv: &mut lethe_adapters::Inventory,
    ) -> Result<Option<AdapterError>, EngineError> {
        if !t.adapter.takes_lineage() {
            return Ok(None);
        }
        let mut have: std::collections::HashSet<String> =
            inv.locators.iter().map(|(l, _)| l.clone()).collect();
        let mut added = 0usize;
        for recorded in self.journal.lineage_locators(scope, &t.name)? {
            match t.adapter.artifact(scope, &recorded) {
                Ok(Some((l, n))) => {
                    if have.insert(l.clone()) {
                        inv.locators.push((l, n));
                        inv.count += n;
                        added += 1;
                    }
                }
                Ok(None) => {}
                Err(e) => return Ok(Some(e)),
            }
        }
        if added > 0 {
            inv.locators.sort();
            tracing::info!(target = %t.name, added, "Lineage artifacts added to the inventory.");
        }
        Ok(None)
    }

    /// One target's inventory, journaled. `Ok(Some(e))`: the adapter failed (not journaled).
    pub(super) fn inventory_target(
        &self,
        job: &JobRecord,
        scope: &Scope,
        t: &Target,
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
            Applicability::Applies => match self.inventory_guarded(job, scope, t, &{
                if t.adapter.takes_lineage() {
                    self.journal.lineage_target_locators(&t.name)?
                } else {
                    Vec::new()
                }
            }) {
                Ok(mut inv) => {
                    if let Some(e) = self.add_lineage(scope, t, &mut inv)? {
                        return Ok(Some(e));
                    }
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

    /// A frozen job's sinks fenced and its earlier permits drained: what must hold before
    /// any inventory is taken (both idempotent).
    pub(super) fn fence_and_drain(
        &self,
        job: &JobRecord,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        // The sinks' own fence first (FROZEN to COMPLETE): from here a writer that bypasses the
        // gate is refused by the database itself, so the inventory below cannot be outgrown.
        if let Step::Blocked = self.guards(job, "fence_closed", |g, f| g.close(f))? {
            return Ok(Step::Blocked);
        }
        // Inventory after the drain: once earlier permits are done, nothing can add rows.
        let undrained = self.drain(&job.job_id, progress)?;
        if undrained > 0 {
            return self.block(&job.job_id, BlockedReason::Undrained, None, format!("{undrained} permits issued before the freeze are neither released nor confirmed cancelled"));
        }
        Ok(Step::Next)
    }

    pub(super) fn step_frozen(
        &self,
        job: &JobRecord,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        // A batch fenced and drained the jobs it drives just before it read their inventories.
        let driven = self.shared.is_some_and(|s| s.drives(&job.job_id));
        if !driven {
            if let Step::Blocked = self.fence_and_drain(job, progress)? {
                return Ok(Step::Blocked);
            }
        }
        if let Step::Blocked = self.take_inventories(job, progress)? {
            return Ok(Step::Blocked);
        }
        pause_point!(self, "after-inventory");
        self.journal
            .record(&self.now_rfc3339(), &job.job_id, &Entry::Drained)?;
        Ok(Step::Next)
    }

    /// One target's erasure, journaled batch by batch. `Ok(Some(e))`: the adapter failed; what
    /// it erased before is journaled.
    pub(super) fn erase_target(
        &self,
        job: &JobRecord,
        t: &Target,
        report: &dyn Fn(Progress),
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
        let scope = Engine::frozen_scope(job);
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
            self.may_erase(job)?;
            let rows = match t.adapter.erase_batch(&scope, batch) {
                Ok(n) => n,
                Err(e) => return Ok(Some(e)),
            };
            pause_point!(self, "after-batch-commit:{}:{}", t.name, i + 1);
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
            pause_point!(self, "after-batch-journal:{}:{}", t.name, i + 1);
        }
        if batches_len == 0 {
            self.journal
                .set_progress(&job.job_id, &t.name, Some(count), None)?;
        }
        tracing::info!(job = %job.job_id, target = %t.name, erased = count, "Target erased.");
        Ok(None)
    }

    pub(super) fn step_deleting(
        &self,
        job: &JobRecord,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        // A job resumed from a block in FROZEN may not have every inventory yet.
        if let Step::Blocked = self.take_inventories(job, progress)? {
            return Ok(Step::Blocked);
        }
        // Crypto-shredding: the scope's data keys go first, in one journaled step, so every
        // copy written under them (backups included) is unreadable before any target is
        // erased. Idempotent: a resumed job finds none left.
        // Without `[keys]` no key is given out: no write transaction on every job's path.
        let destroyed = match self.kek {
            Some(_) => self
                .journal
                .destroy_keys(&self.now_rfc3339(), &job.job_id, &job.scope)?,
            None => 0,
        };
        if destroyed > 0 {
            tracing::info!(job = %job.job_id, keys = destroyed, "Data keys destroyed (crypto-shredding).");
        }
        // All targets at once; an adapter error blocks the job on the first such target in
        // configuration order, and what the others erased stays journaled.
        let targets = self.targets.iter().collect();
        let done = self.each_target(targets, progress, |t, report| {
            self.erase_target(job, t, report)
        });
        for (t, r) in done {
            if let Some(e) = r? {
                return self.block_on(&job.job_id, &t.name, e);
            }
        }
        pause_point!(self, "before-verify");
        self.journal
            .record(&self.now_rfc3339(), &job.job_id, &Entry::TargetsErased)?;
        Ok(Step::Next)
    }

    pub(super) fn step_verifying(
        &self,
        job: &JobRecord,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Step, EngineError> {
        let scope = Engine::frozen_scope(job);
        // All targets at once, then, in configuration order, the first failure or residue
        // blocks the job.
        let targets = self.targets.iter().collect();
        let done = self.each_target(targets, progress, |t, report| {
            self.verify_target(job, &scope, t, report)
        });
        let mut records = BTreeMap::new();
        for (t, r) in done {
            let (count, checked, frozen) = r?;
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
            let (settled, physical) = match status {
                TargetStatus::Exempt => (lethe_adapters::Settlement::default(), None),
                _ => (
                    t.adapter.settlement(&frozen),
                    self.physical_record(t, &frozen),
                ),
            };
            // A backup target: what its artifacts taken until now may still hold.
            let pending = match t.adapter.backups() {
                Ok(None) => None,
                Ok(Some(list)) => Some(crate::backups::Pending::at(&list, self.clock.now())),
                Err(e) => return self.block_on(&job.job_id, &t.name, e),
            };
            let expires = pending.as_ref().and_then(|p| p.expires).or(settled.expires);
            let status = match expires {
                Some(_) if self.shreds(t, &job.scope) => TargetStatus::Shredded,
                Some(_) => TargetStatus::PendingExpiry,
                None => status,
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
                    expires,
                    artifacts: pending.map(|p| p.artifacts),
                    legacy: settled.legacy.map(|(policy, count)| LegacyRecord {
                        policy: policy.to_string(),
                        count,
                    }),
                    physical,
                },
            );
        }
        // Everything is verified gone: open the sinks' fence (epoch and erased lists stay, so
        // only writes under a lease taken after this job are admitted for the owner). Opened
        // before COMPLETE so an unreachable guard blocks the job instead of leaving it closed.
        let unguarded = |t: &str| self.shared.is_some_and(|s| s.unguarded(t));
        if let Step::Blocked = self.guards_but(job, "fence_opened", unguarded, |g, f| g.open(f))? {
            return Ok(Step::Blocked);
        }
        pause_point!(self, "before-complete");
        // The certificate is built from the job's row and progress: they must say what the
        // chain recorded, or an edit of those tables would be signed.
        self.refuse_if_projection_edited(&job.job_id, "no certificate is signed")?;
        let cert = Certificate {
            format: certificate::FORMAT.to_string(),
            job_id: job.job_id.clone(),
            scope: job.scope.kind(),
            // A memory scope's hash binds the version frozen, which a request without one
            // did not name: the certificate says which version is gone.
            scope_hash: self.scope_hash(&Engine::frozen_scope(job)),
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
            backup_expiry: records.values().filter_map(|r| r.expires).max(),
            backup_expiry_met: None,
            keys_destroyed: Some(self.keys_destroyed(&job.job_id)?).filter(|n| *n > 0),
            exempt_assets: self
                .assets
                .iter()
                .map(|a| {
                    let asset = ExemptAsset {
                        class: a.class.clone(),
                        reason: a.exempt.clone(),
                    };
                    (a.name.clone(), asset)
                })
                .collect(),
            targets: records,
            signed_by: String::new(),
        };
        let signed = cert.sign(&self.key);
        // The journal first, then the file: a signed file exists only for a COMPLETE job. If
        // the process dies in between, running the COMPLETE job again writes the file from the
        // journal (`certificate_file`).
        self.journal.complete(
            &rfc3339(self.clock.now()),
            &job.job_id,
            &signed,
            &self.key.signing_key(),
        )?;
        pause_point!(self, "before-certificate-file");
        self.write_certificate(&job.job_id, &signed)?;
        self.gate_authority().job_completed(&job.job_id);
        // The erased artifacts' lineage names what is gone: dropped, identifiers with it. A
        // crash before this leaves edges that resolve to nothing.
        let dropped = self.journal.drop_lineage(&Engine::frozen_scope(job))?;
        if dropped > 0 {
            tracing::info!(job = %job.job_id, edges = dropped, "Lineage of erased artifacts dropped.");
        }
        tracing::info!(job = %job.job_id, scope_hash = %short(&job.scope_hash), "Job complete; certificate issued.");
        Ok(Step::Next)
    }

    /// One target's verification, journaled (`TargetVerified`); returns its inventoried count,
    /// what the check found and the frozen locators (read once, for the certificate's line).
    pub(super) fn verify_target(
        &self,
        job: &JobRecord,
        scope: &Scope,
        t: &Target,
        report: &dyn Fn(Progress),
    ) -> Result<(u64, Checked, Vec<Locator>), EngineError> {
        let applies = t.adapter.check_scope(scope).map_err(input)?;
        let (count, frozen) = self
            .journal
            .inventory(&job.job_id, &t.name)?
            .unwrap_or_default();
        let residue = match applies {
            Applicability::Exempt(reason) => return Ok((count, Checked::Exempt(reason), frozen)),
            Applicability::Applies => match self
                .shared
                .and_then(|s| s.residue(&job.job_id, &t.name))
                .unwrap_or_else(|| t.adapter.verify(scope, &frozen))
            {
                Ok(n) => n,
                Err(e) => return Ok((count, Checked::Failed(e), frozen)),
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
        Ok((count, Checked::Residue(residue), frozen))
    }

    pub(super) fn step_resume(
        &self,
        job: &JobRecord,
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
        let undrained = self.drain(&job.job_id, progress)?;
        if undrained > 0 {
            tracing::warn!(job = %job.job_id, undrained, "Still undrained; the job stays blocked.");
            return Ok(Step::Blocked);
        }
        if self.opts.reinventory && job.blocked_reason == Some(BlockedReason::Residue) {
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
