//! What a running job prints: its progress, one line a step, and its outcome.

use lethe_core::JobState;
use lethe_engine::{Outcome, Progress};
use serde_json::json;

use crate::output::print_json;

/// Where progress lines go.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProgressTo {
    /// Nowhere (JSON output).
    Nowhere,
    /// stderr, so stdout stays the result.
    Stderr,
    /// stdout, in order with the rest (the demo).
    Stdout,
}

/// Prints progress, one line per step.
pub(crate) fn progress_printer(to: ProgressTo) -> impl FnMut(Progress) {
    let mut last_state = None;
    // The engine reports the drain on every poll (every 50 ms): a line only when the count
    // changes, or a 30-second wait would print 600 of them.
    let mut last_undrained = None;
    move |p| {
        let line = match p {
            Progress::State(s) if last_state != Some(s) => {
                last_state = Some(s);
                last_undrained = None;
                format!("  -> {s}")
            }
            Progress::State(_) => return,
            Progress::Draining { undrained } if last_undrained == Some(undrained) => return,
            Progress::Draining { undrained } => {
                last_undrained = Some(undrained);
                let s = if undrained == 1 { "" } else { "s" };
                format!("     waiting for {undrained} permit{s} issued before the freeze to drain")
            }
            Progress::Inventoried { target, count } => {
                format!("     inventory  {target}: {count} rows")
            }
            Progress::Exempt { target, reason } => format!("     exempt     {target}: {reason}"),
            Progress::Erased {
                target,
                done,
                total,
            } => format!("     erased     {target}: {done}/{total} locators"),
            Progress::Verified { target, residue } => {
                format!("     verified   {target}: {residue} left")
            }
            Progress::Batch { step, done, total } => {
                format!("  batch: {step:<12} {done}/{total} jobs")
            }
        };
        match to {
            ProgressTo::Nowhere => {}
            ProgressTo::Stderr => eprintln!("{line}"),
            ProgressTo::Stdout => outln!("{line}"),
        }
    }
}

pub(crate) fn progress_to(json: bool) -> ProgressTo {
    if json {
        ProgressTo::Nowhere
    } else {
        ProgressTo::Stderr
    }
}

pub(crate) fn outcome_code(o: &Outcome) -> i32 {
    match o.state {
        JobState::Complete => 0,
        JobState::Blocked => 3,
        _ => 3,
    }
}

/// A job's outcome as `erase --json` prints it.
pub(crate) fn outcome_json(o: &Outcome) -> serde_json::Value {
    json!({
        "job_id": o.job_id,
        "continued": o.continued,
        "state": o.state,
        "blocked_reason": o.blocked_reason,
        "blocked_target": o.blocked_target,
        "certificate": o.certificate,
    })
}

pub(crate) fn print_outcome(o: &Outcome, json: bool) {
    // A certificate of nothing is valid, but a mistyped identifier (another case, a stray
    // space) produces exactly that, and the certificate only holds a hash: say so, on stderr.
    if let Some(targets) = o
        .certificate
        .as_ref()
        .and_then(|c| c["targets"].as_object())
    {
        let counts: Vec<u64> = targets
            .values()
            .filter_map(|t| t["count"].as_u64())
            .collect();
        if !counts.is_empty() && counts.iter().all(|&n| n == 0) {
            eprintln!(
                "warning: no target held anything for this scope; the job is complete, but check \
                 the identifiers (they match exactly: case, spaces and all)"
            );
        }
    }
    if json {
        print_json(&outcome_json(o));
        return;
    }
    if o.continued {
        outln!(
            "A job for this scope was already open: continued {} (its basis, ticket and deadline stand).",
            o.job_id
        );
    }
    match o.state {
        JobState::Complete => {
            outln!("Job {} COMPLETE.", o.job_id);
            if let Some(p) = &o.certificate_path {
                outln!("Certificate: {}", p.display());
            }
        }
        s => {
            let reason = o.blocked_reason.map(|r| r.to_string()).unwrap_or_default();
            let target = o
                .blocked_target
                .as_deref()
                .map(|t| format!(" (target {t})"))
                .unwrap_or_default();
            outln!(
                "Job {} {s}: {reason}{target}. Fix the cause, then `lethe resume {}`.",
                o.job_id,
                o.job_id
            );
        }
    }
}
