//! The certificate: built from the job's projection, signed, journaled, then written to its
//! file.

use lethe_adapters::{Applicability, Locator, Target};
use lethe_core::certificate::PhysicalRecord;
use lethe_core::JobState;
use lethe_journal::jobs::JobRecord;
use lethe_journal::Entry;

use crate::{input, target_error, Engine, EngineError};

impl Engine {
    /// Writes a COMPLETE job's certificate file from the journal if it is missing (the process
    /// died between the journal's commit and the file).
    /// Writes a COMPLETE job's certificate file if it is missing; whether it did.
    pub(super) fn certificate_file(&self, job: &JobRecord) -> Result<bool, EngineError> {
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
    pub(crate) fn write_certificate(
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

    /// How many data keys the job destroyed (its `keys_destroyed` entries).
    pub(super) fn keys_destroyed(&self, job: &str) -> Result<u64, EngineError> {
        Ok(self
            .journal
            .entries(job)?
            .into_iter()
            .map(|e| match e {
                Entry::KeysDestroyed { count } => count,
                _ => 0,
            })
            .sum())
    }

    pub(super) fn error_codes(&self, job: &str, target: &str) -> Result<Vec<String>, EngineError> {
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

    /// A target's physical check for its frozen inventory, as its certificate line records it:
    /// `None` when its kind has none or it has no `path`. A check that cannot run is recorded
    /// `UNCHECKED` with the reason: the logical erase is verified, and does not wait for it.
    pub(super) fn physical_record(&self, t: &Target, frozen: &[Locator]) -> Option<PhysicalRecord> {
        let checked_at = self.now_rfc3339();
        match t.adapter.physical(frozen) {
            Ok(None) => None,
            Ok(Some(p)) => {
                tracing::info!(target = %t.name, residue = p.residue, "Physical check ran.");
                Some(PhysicalRecord::found(p.residue, p.remedy, checked_at))
            }
            Err(e) => {
                tracing::warn!(target = %t.name, code = e.code(), "Physical check could not run; the certificate says UNCHECKED.");
                Some(PhysicalRecord::unchecked(e.to_string(), checked_at))
            }
        }
    }

    /// `lethe verify --physical`: looks again, read-only, in the files of each target of a
    /// COMPLETE job that has a physical check, for what the job's frozen inventories name.
    /// Changes nothing, journals nothing and signs nothing. Targets without a check (no
    /// `path`, or a kind without one) and targets the scope exempted are left out.
    pub fn verify_physical(
        &self,
        job_id: &str,
    ) -> Result<Vec<(String, PhysicalRecord)>, EngineError> {
        let job = self.journal.job(job_id)?;
        if job.state != JobState::Complete {
            return Err(input(format!(
                "job {job_id} is {}, not COMPLETE: the physical check looks for what a finished \
                 erase removed; finish it first (`lethe resume {job_id}`)",
                job.state
            )));
        }
        self.refuse_if_targets_missing(job_id)?;
        let scope = Engine::frozen_scope(&job);
        let inventoried = self.journal.job_targets(job_id)?;
        let (mut out, mut dropped) = (Vec::new(), Vec::new());
        for t in self
            .targets
            .iter()
            .filter(|t| inventoried.contains(&t.name))
        {
            if let Applicability::Exempt(_) = t.adapter.check_scope(&scope).map_err(input)? {
                continue;
            }
            let (count, frozen) = self.journal.inventory(job_id, &t.name)?.unwrap_or_default();
            if count > 0 && frozen.is_empty() {
                // Completion dropped the locators (Lethe keeps no identifier past it): with
                // nothing to look for, the check would say CLEAN whatever the files hold.
                if t.adapter.physical(&[]).map_err(target_error)?.is_some() {
                    dropped.push(t.name.clone());
                }
                continue;
            }
            let checked_at = self.now_rfc3339();
            if let Some(p) = t.adapter.physical(&frozen).map_err(target_error)? {
                out.push((
                    t.name.clone(),
                    PhysicalRecord::found(p.residue, p.remedy, checked_at),
                ));
            }
        }
        if !dropped.is_empty() {
            return Err(input(format!(
                "job {job_id}'s erased ids on target(s) {} are no longer kept (completion drops \
                 the inventory's locators, and no per-document digest is kept yet), so their \
                 files cannot be looked in again without reporting a false CLEAN; the \
                 certificate's `physical` line holds the check made at completion",
                dropped.join(", ")
            )));
        }
        Ok(out)
    }
}
