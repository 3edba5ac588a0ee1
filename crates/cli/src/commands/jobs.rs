//! `lethe jobs` and `lethe job show`: what the journal says of each job.

use std::path::Path;

use lethe_core::JobState;
use lethe_engine::EngineError;
use serde_json::json;

use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::{self, print_json, Table};

/// Lists every job: ids, states, scope kinds and hashes.
pub(crate) fn list(config: &Path, json: bool) -> Result<i32, Exit> {
    let engine = open_engine(config)?;
    let jobs = engine.journal().jobs().map_err(EngineError::from)?;
    if json {
        print_json(&json!(jobs
            .iter()
            .map(lethe_journal::jobs::JobRecord::summary)
            .collect::<Vec<_>>()));
    } else {
        let mut t = Table::new(&[
            "JOB",
            "STATE",
            "SCOPE",
            "SCOPE HASH",
            "REQUESTED",
            "DEADLINE",
        ]);
        for j in &jobs {
            let state = match j.blocked_reason {
                Some(r) if j.state == JobState::Blocked => format!("BLOCKED ({r})"),
                _ => j.state.to_string(),
            };
            t.row(vec![
                j.job_id.clone(),
                state,
                j.scope.kind().to_string(),
                output::short_hash(&j.scope_hash),
                j.requested_at.clone(),
                j.deadline.clone(),
            ]);
        }
        t.print();
    }
    Ok(0)
}

/// One job, target by target.
pub(crate) fn show(config: &Path, job_id: String, json: bool) -> Result<i32, Exit> {
    let engine = open_engine(config)?;
    let job = engine
        .journal()
        .job(&job_id)
        .map_err(|e| bad(format!("{e}; `lethe jobs` lists them")))?;
    // The configuration's targets, then any the job inventoried that it no longer has
    // (the job refuses to run until they are back).
    let mut names: Vec<String> = engine.targets().iter().map(|t| t.name.clone()).collect();
    let job_targets = engine
        .journal()
        .job_targets(&job_id)
        .map_err(EngineError::from)?;
    for n in &job_targets {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    let mut targets = serde_json::Map::new();
    for name in names {
        let (inv, erased, residue) = engine
            .journal()
            .progress(&job_id, &name)
            .map_err(EngineError::from)?;
        let configured = engine.targets().iter().any(|t| t.name == name);
        targets.insert(
            name,
            json!({"inventoried": inv, "erased": erased, "residue": residue, "configured": configured}),
        );
    }
    let out = engine.outcome(&job_id)?;
    if json {
        print_json(&json!({
            "job_id": job.job_id, "state": job.state, "scope": job.scope.kind(), "scope_hash": job.scope_hash,
            "basis": job.basis, "policy_version": job.policy_version, "requested_at": job.requested_at,
            "updated_at": job.updated_at, "deadline": job.deadline, "subject_epoch": job.subject_epoch,
            "tenant_epoch": job.tenant_epoch, "blocked_reason": job.blocked_reason,
            "blocked_target": job.blocked_target, "targets": targets, "certificate_path": out.certificate_path,
            "frozen_version": job.tombstone_version,
        }));
    } else {
        outln!(
            "Job {}  {}  {} {}",
            job.job_id,
            job.state,
            job.scope.kind(),
            job.scope_hash
        );
        outln!(
            "basis {}  policy {}  requested {}  deadline {}",
            job.basis,
            job.policy_version,
            job.requested_at,
            job.deadline
        );
        // The version a memory certificate's scope hash binds (`certificate verify
        // --version`); a timestamp, not an identifier.
        if let Some(v) = &job.tombstone_version {
            outln!("frozen version {v}");
        }
        if let Some(r) = job.blocked_reason {
            outln!(
                "blocked: {r}{}",
                job.blocked_target
                    .map(|t| format!(" (target {t})"))
                    .unwrap_or_default()
            );
        }
        let mut t = Table::new(&["TARGET", "INVENTORIED", "ERASED", "RESIDUE"]);
        for (name, v) in &targets {
            let f = |k: &str| v[k].as_u64().map_or("-".to_string(), |n| n.to_string());
            t.row(vec![
                if v["configured"] == true {
                    name.clone()
                } else {
                    format!("{name} (not in this config)")
                },
                f("inventoried"),
                f("erased"),
                f("residue"),
            ]);
        }
        t.print();
        if let Some(p) = out.certificate_path {
            outln!("certificate: {}", p.display());
        }
    }
    Ok(0)
}
