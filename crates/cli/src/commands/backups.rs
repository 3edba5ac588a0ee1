//! `lethe backups check`: backup artifacts past their retention, jobs waiting on backups, and
//! the final certificates of jobs that no longer wait.

use std::path::Path;

use crate::exit::Exit;
use crate::open::open_engine;
use crate::output::{print_json, Table};

/// Exit 0: nothing kept past its retention; 1: an artifact is (the report says which).
pub(crate) fn check(config: &Path, json: bool) -> Result<i32, Exit> {
    let engine = open_engine(config)?;
    let r = engine.check_backups()?;
    let code = i32::from(r.overdue());
    if json {
        print_json(&serde_json::to_value(&r).unwrap_or_default());
        return Ok(code);
    }
    if r.targets.is_empty() {
        outln!("No backup target is configured (kind backup-files or backup-s3).");
        return Ok(0);
    }
    let mut t = Table::new(&["TARGET", "ARTIFACTS", "PAST RETENTION"]);
    for b in &r.targets {
        t.row(vec![
            b.name.clone(),
            b.artifacts.to_string(),
            b.overdue.len().to_string(),
        ]);
    }
    t.print();
    for b in r.targets.iter().filter(|b| !b.overdue.is_empty()) {
        outln!(
            "\nTarget {} keeps {} artifact(s) past their retention: delete them, or fix the \
             retention setting if it is wrong:",
            b.name,
            b.overdue.len()
        );
        for o in &b.overdue {
            outln!(
                "  {}  taken {}, expired on {}",
                o.name,
                o.taken_at,
                o.expired_on
            );
        }
    }
    if r.waiting.is_empty() {
        outln!("\nNo completed job waits on a backup.");
    } else {
        outln!("\nJobs waiting on backups:");
        let mut w = Table::new(&["JOB", "TARGET", "ARTIFACTS LEFT", "LAST EXPIRES"]);
        for j in &r.waiting {
            w.row(vec![
                j.job_id.clone(),
                j.target.clone(),
                j.artifacts
                    .map_or("target not configured".into(), |n| n.to_string()),
                j.expires.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        w.print();
    }
    for job in &r.settled {
        outln!(
            "\nJob {job}: every backup it waited for is gone; final certificate issued \
             (`lethe certificate show {job}`; the first: --first)."
        );
    }
    Ok(code)
}
