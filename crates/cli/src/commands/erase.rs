//! `lethe erase`, `lethe resume` and `lethe work`: the commands that run jobs.

use std::path::Path;
use std::time::Duration;

use lethe_core::{Basis, JobState};
use lethe_engine::{EngineError, Request, RunOptions};
use serde_json::json;

use crate::args::EraseArgs;
use crate::exit::{bad, Exit};
use crate::open::{open_engine, open_engine_probing};
use crate::output::print_json;
use crate::progress::{outcome_code, print_outcome, progress_printer, progress_to};
use crate::scope_input::checked_scope;

/// Starts (or continues) the erasure of a scope and runs it as far as it goes.
pub(crate) fn erase(config: &Path, erase: EraseArgs) -> Result<i32, Exit> {
    let EraseArgs {
        scope: args,
        basis,
        ticket,
        deadline,
        extension_reason,
        drain_timeout,
        json,
    } = erase;
    let scope = checked_scope(&args, "the erasure covers")?;
    let basis: Basis = basis.parse().map_err(bad)?;
    let deadline = deadline
        .map(|d| {
            time::Date::parse(
                &d,
                &time::macros::format_description!("[year]-[month]-[day]"),
            )
        })
        .transpose()
        .map_err(|_| bad("--deadline must be YYYY-MM-DD"))?;
    let engine = open_engine_probing(config)?;
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(drain_timeout),
        pause_at: lethe_engine::pause_from_env(),
        reinventory: false,
    };
    let req = Request {
        scope,
        basis,
        ticket,
        deadline,
        extension_reason,
    };
    match engine.erase(req, &opts, &mut progress_printer(progress_to(json))) {
        Ok(o) => {
            print_outcome(&o, json);
            Ok(outcome_code(&o))
        }
        Err(EngineError::Held {
            job_id,
            holds,
            state,
        }) if json => {
            print_json(
                &json!({"job_id": job_id, "state": state, "blocked_reason": "legal_hold", "holds": holds, "certificate": null}),
            );
            Ok(4)
        }
        Err(e) => Err(e.into()),
    }
}

/// Resumes a job from its journaled state.
pub(crate) fn resume(
    config: &Path,
    job_id: String,
    drain_timeout: u64,
    reinventory: bool,
    json: bool,
) -> Result<i32, Exit> {
    let engine = open_engine_probing(config)?;
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(drain_timeout),
        pause_at: lethe_engine::pause_from_env(),
        reinventory,
    };
    let o = engine.resume(&job_id, &opts, &mut progress_printer(progress_to(json)))?;
    print_outcome(&o, json);
    Ok(outcome_code(&o))
}

/// Approves a pending request as the holder of `token_file` (never the token that made it),
/// then runs its job as `erase` does.
pub(crate) fn approve(
    config: &Path,
    request_id: &str,
    token_file: Option<&Path>,
    drain_timeout: u64,
    json: bool,
) -> Result<i32, Exit> {
    let by = crate::secret::holder(config, token_file, &[lethe_engine::config::Role::Approver])?;
    let engine = open_engine_probing(config)?;
    let job_id = engine.approve_request(request_id, &by)?;
    if !json {
        outln!("Request {request_id} approved: job {job_id}.");
    }
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(drain_timeout),
        pause_at: lethe_engine::pause_from_env(),
        reinventory: false,
    };
    let o = engine.resume(&job_id, &opts, &mut progress_printer(progress_to(json)))?;
    print_outcome(&o, json);
    Ok(outcome_code(&o))
}

/// Runs the jobs other processes left unfinished.
pub(crate) fn work(config: &Path, drain_timeout: u64, json: bool) -> Result<i32, Exit> {
    let engine = open_engine(config)?;
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(drain_timeout),
        pause_at: lethe_engine::pause_from_env(),
        reinventory: false,
    };
    let outs = engine.work(&opts, &mut progress_printer(progress_to(json)))?;
    // `work` picks up jobs a killed process left; a BLOCKED job waits for an operator
    // (newcomer review: a scheduled `work` said nothing of them).
    let blocked = engine
        .journal()
        .jobs()
        .map_err(EngineError::from)?
        .iter()
        .filter(|j| j.state == lethe_core::JobState::Blocked)
        .count();
    if blocked > 0 {
        eprintln!(
            "note: {blocked} BLOCKED job{} wait{} for an operator (`work` does not retry \
             them): fix the cause (`lethe jobs` shows each one's reason), then `lethe \
             resume JOB_ID`",
            if blocked == 1 { "" } else { "s" },
            if blocked == 1 { "s" } else { "" },
        );
    }
    if json {
        print_json(&json!(outs
            .iter()
            .map(
                |o| json!({"job_id": o.job_id, "state": o.state, "blocked_reason": o.blocked_reason,
                "blocked_target": o.blocked_target, "certificate": o.certificate})
            )
            .collect::<Vec<_>>()));
    } else if outs.is_empty() {
        // Jobs another live process runs, or a hold covers, are skipped without a line
        // (`-v` names them): "nothing" would claim too much.
        outln!("No unfinished job to pick up here (a job another live process runs, or a legal hold covers, is left; `lethe jobs` lists every job).");
    } else {
        for o in &outs {
            print_outcome(o, false);
        }
    }
    Ok(if outs.iter().all(|o| o.state == JobState::Complete) {
        0
    } else {
        3
    })
}
