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
use crate::progress::{outcome_code, outcome_json, print_outcome, progress_printer, progress_to};
use crate::scope_input::{checked_scope, read_batch};

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
        batch,
    } = erase;
    let basis: Basis = basis.parse().map_err(bad)?;
    // Read and checked whole before the engine opens: a bad line touches nothing.
    let scopes = match &batch {
        Some(file) => read_batch(file)?,
        None => vec![(0, checked_scope(&args, "the erasure covers")?)],
    };
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
    let request = |scope| Request {
        scope,
        basis,
        ticket: ticket.clone(),
        deadline,
        extension_reason: extension_reason.clone(),
    };
    if batch.is_none() {
        let (_, scope) = scopes.into_iter().next().expect("one scope");
        return match engine.erase(
            request(scope),
            &opts,
            &mut progress_printer(progress_to(json)),
        ) {
            Ok(o) => {
                print_outcome(&o, json);
                Ok(outcome_code(&o))
            }
            Err(EngineError::Held {
                job_id,
                holds,
                state,
            }) if json => {
                print_json(&held_json(job_id, state, holds));
                Ok(4)
            }
            Err(e) => Err(e.into()),
        };
    }
    // One engine (its targets probed once), then the jobs side by side: each is its own job,
    // journal entries and certificate, and one that blocks or fails leaves the rest to run.
    let total = scopes.len();
    let (lines, requests): (Vec<usize>, Vec<Request>) = scopes
        .into_iter()
        .map(|(line, scope)| (line, request(scope)))
        .unzip();
    let outcomes = engine.erase_batch(requests, &opts, &mut progress_printer(progress_to(json)))?;
    let mut results = Vec::with_capacity(total);
    let mut worst = 0;
    for (line, outcome) in lines.into_iter().zip(outcomes) {
        let (code, mut shown) = match outcome {
            Ok(o) => {
                if !json {
                    outln!("line {line}:");
                    print_outcome(&o, false);
                }
                (outcome_code(&o), outcome_json(&o))
            }
            Err(EngineError::Held {
                job_id,
                holds,
                state,
            }) => {
                if !json {
                    outln!("line {line}: job {job_id} is held (legal hold): it stays {state}, nothing touched.");
                }
                (4, held_json(job_id, state, holds))
            }
            Err(e) => {
                let Exit(code, e) = e.into();
                if !json {
                    outln!("line {line}: not started: {e}");
                }
                (code, json!({"error": e.to_string()}))
            }
        };
        worst = worse(worst, code);
        shown["line"] = line.into();
        results.push(shown);
    }
    if json {
        print_json(&serde_json::Value::Array(results));
    } else {
        let done = results.iter().filter(|r| r["state"] == "COMPLETE").count();
        outln!("Batch: {done} of {total} scopes COMPLETE.");
    }
    Ok(worst)
}

/// The JSON of a job a legal hold keeps in REQUESTED, as `erase --json` prints it.
fn held_json(job_id: String, state: JobState, holds: Vec<String>) -> serde_json::Value {
    json!({"job_id": job_id, "state": state, "blocked_reason": "legal_hold", "holds": holds, "certificate": null})
}

/// The worse of two exit codes of a batch's jobs: COMPLETE (0), then held (4, waits for a
/// release), then BLOCKED (3, waits for an operator), then an error's own code.
fn worse(a: i32, b: i32) -> i32 {
    let rank = |c: i32| match c {
        0 => 0,
        4 => 1,
        3 => 2,
        _ => 3,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
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
