//! `lethe inventory` and `lethe verify`: what every target holds, or still holds, for a scope.

use std::path::Path;

use lethe_engine::TargetCount;
use serde_json::json;

use crate::args::ScopeArgs;
use crate::exit::Exit;
use crate::open::{open_engine, open_engine_probing};
use crate::output::{print_json, Table};
use crate::scope_input::checked_scope;

/// Counts what each target holds for the scope (a dry run).
pub(crate) fn inventory(config: &Path, args: ScopeArgs, json: bool) -> Result<i32, Exit> {
    let scope = checked_scope(&args, "the inventory counts what is held for")?;
    let engine = open_engine_probing(config)?;
    let counts = engine.inventory(&scope)?;
    if json {
        let targets: serde_json::Map<_, _> =
            counts.iter().map(|(n, c)| (n.clone(), json!(c))).collect();
        print_json(&json!({"scope_hash": engine.scope_hash(&scope), "targets": targets}));
    } else {
        outln!("Scope {} ({})", engine.scope_hash(&scope), scope.kind());
        print_counts("ROWS", &counts);
    }
    Ok(0)
}

/// Counts what is left for the scope, hidden rows included; exit 1 on residue.
pub(crate) fn verify(config: &Path, args: ScopeArgs, audit: bool, json: bool) -> Result<i32, Exit> {
    let scope = checked_scope(&args, "verification looks for")?;
    let engine = open_engine_probing(config)?;
    let counts = engine.verify(&scope, audit)?;
    let clean = counts.iter().all(|(_, c)| c.count == 0);
    if json {
        let targets: serde_json::Map<_, _> = counts
            .iter()
            .map(|(n, c)| (n.clone(), json!({"residue": c.count, "exempt": c.exempt})))
            .collect();
        print_json(&json!({"clean": clean, "targets": targets}));
    } else {
        print_counts("RESIDUE", &counts);
        outln!(
            "{}",
            if clean {
                "Clean: nothing left for this scope."
            } else {
                "RESIDUE: rows are left for this scope."
            }
        );
    }
    Ok(if clean { 0 } else { 1 })
}

/// `verify --physical --job`: what each target's own files still hold of what a COMPLETE job
/// erased, read-only; exit 1 if any still holds some. Changes nothing and signs nothing.
pub(crate) fn verify_physical(config: &Path, job_id: &str, json: bool) -> Result<i32, Exit> {
    // Not probing: the check reads the stores' files, never their servers.
    let engine = open_engine(config)?;
    let checks = engine.verify_physical(job_id)?;
    let clean = checks.iter().all(|(_, r)| r.residue == Some(0));
    if json {
        let targets: serde_json::Map<_, _> =
            checks.iter().map(|(n, r)| (n.clone(), json!(r))).collect();
        print_json(&json!({"job_id": job_id, "clean": clean, "targets": targets}));
        return Ok(if clean { 0 } else { 1 });
    }
    if checks.is_empty() {
        outln!("No target of job {job_id} has a physical check (a `path` on a chroma or phoenix target).");
        return Ok(0);
    }
    let mut t = Table::new(&["TARGET", "PHYSICAL", "RESIDUE"]);
    for (n, r) in &checks {
        t.row(vec![
            n.clone(),
            serde_json::to_value(r.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            r.residue.map_or("-".into(), |n| n.to_string()),
        ]);
    }
    t.print();
    for (n, r) in &checks {
        if let Some(remedy) = &r.remedy {
            outln!("{n}: its files still hold erased data. Remedy: {remedy}.");
        }
    }
    outln!(
        "{}",
        if clean {
            "Clean: the targets' files hold nothing of what this job erased."
        } else {
            "PENDING: a target's files still hold some of what this job erased (nothing was changed; the certificate stays as signed)."
        }
    );
    Ok(if clean { 0 } else { 1 })
}

/// Each target's count, or why the scope does not apply to it, under `what`.
fn print_counts(what: &str, counts: &[(String, TargetCount)]) {
    let mut t = Table::new(&["TARGET", what]);
    for (n, c) in counts {
        t.row(vec![
            n.clone(),
            c.exempt
                .as_ref()
                .map_or(c.count.to_string(), |w| format!("exempt: {w}")),
        ]);
    }
    t.print();
}
