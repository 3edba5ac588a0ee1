//! `lethe guard install | uninstall | status`: the database guard of LangGraph PostgreSQL
//! targets. Needs the config only (no journal, no key): the guard lives in the target's own
//! database. Output holds counts, never an identifier.

use std::path::Path;

use lethe_adapters::{GuardStatus, Target};
use lethe_engine::Config;
use serde_json::json;

use crate::args::GuardCommand;
use crate::exit::{bad, Exit};
use crate::output::{print_json, Table};

fn guardable(t: &Target) -> bool {
    t.adapter.guard().is_some()
}

fn find<'a>(cfg: &'a Config, name: &str) -> Result<&'a Target, Exit> {
    let Some(t) = cfg.targets.iter().find(|t| t.name == name) else {
        return Err(bad(format!(
            "no target named '{name}' in the config; `lethe targets` lists them"
        )));
    };
    if !guardable(t) {
        return Err(bad(format!(
            "target {name} is of kind {}, which has no database guard; the guard is built for langgraph-postgres-checkpointer and langgraph-postgres-store",
            t.kind
        )));
    }
    Ok(t)
}

/// An adapter error: an unreachable database exits 1 (retry), anything else 2.
fn target_err(e: lethe_adapters::AdapterError) -> Exit {
    let code = if e.is_retryable() { 1 } else { 2 };
    Exit(code, anyhow::anyhow!("{e}"))
}

fn print(rows: &[(String, GuardStatus)], json: bool) {
    if json {
        let map: serde_json::Map<String, serde_json::Value> =
            rows.iter().map(|(n, s)| (n.clone(), json!(s))).collect();
        print_json(&serde_json::Value::Object(map));
        return;
    }
    let mut t = Table::new(&[
        "TARGET",
        "INSTALLED",
        "VERSION",
        "TRIGGERS",
        "FENCED",
        "ERASED OWNERS",
        "ERASED THREADS",
        "ERASED ITEMS",
    ]);
    for (n, s) in rows {
        t.row(vec![
            n.clone(),
            if s.installed { "yes" } else { "no" }.into(),
            s.version.clone().unwrap_or_else(|| "-".into()),
            format!("{}/{}", s.triggers, s.triggers_needed),
            (s.fenced_subjects + s.fenced_tenants).to_string(),
            s.erased_owners.to_string(),
            s.erased_threads.to_string(),
            s.erased_items.to_string(),
        ]);
    }
    t.print();
    for (n, s) in rows {
        if let Some(v) = s
            .version
            .as_deref()
            .filter(|v| *v != lethe_adapters::GUARD_VERSION)
        {
            eprintln!(
                "Target {n}: its database has guard version {v}; this lethe installs version {}. \
                 `lethe guard install --target {n}` updates it in place (fences and erased lists kept).",
                lethe_adapters::GUARD_VERSION
            );
        }
    }
}

/// Runs one `guard` command; returns the exit code.
pub(crate) fn run(config: &Path, command: GuardCommand) -> Result<i32, Exit> {
    let cfg = Config::load(config).map_err(crate::exit::config)?;
    match command {
        GuardCommand::Install { target, json } => {
            let t = find(&cfg, &target)?;
            let g = t.adapter.guard().expect("checked by find");
            // The deployment's key, bound to its journal, as the gate that issues the tokens
            // holds it.
            let key = crate::open::open_engine(config)?.key().guard_key();
            g.install(&key).map_err(target_err)?;
            let s = g.status().map_err(target_err)?;
            if !json {
                eprintln!(
                    "Guard version {} installed for target {} ({} triggers).",
                    lethe_adapters::GUARD_VERSION,
                    t.name,
                    s.triggers
                );
            }
            print(&[(t.name.clone(), s)], json);
            Ok(0)
        }
        GuardCommand::Uninstall { target, json } => {
            let t = find(&cfg, &target)?;
            let g = t.adapter.guard().expect("checked by find");
            g.uninstall().map_err(target_err)?;
            let s = g.status().map_err(target_err)?;
            if !json {
                eprintln!("Guard removed from target {}.", t.name);
            }
            print(&[(t.name.clone(), s)], json);
            Ok(0)
        }
        GuardCommand::Status { target, json } => {
            let targets: Vec<&Target> = match &target {
                Some(name) => vec![find(&cfg, name)?],
                None => cfg.targets.iter().filter(|t| guardable(t)).collect(),
            };
            let mut rows = Vec::new();
            for t in targets {
                let g = t.adapter.guard().expect("filtered");
                rows.push((t.name.clone(), g.status().map_err(target_err)?));
            }
            print(&rows, json);
            Ok(0)
        }
    }
}
