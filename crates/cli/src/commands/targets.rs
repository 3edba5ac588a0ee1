//! `lethe targets`: every target, its kind and class, and whether it answers; then every
//! declared asset no target erases, with its reason.

use std::path::Path;

use lethe_engine::Config;
use serde_json::json;

use crate::exit::Exit;
use crate::output::{print_json, Table};

/// Lists the targets and probes each; exit 1 if one does not answer.
pub(crate) fn run(config: &Path, json: bool) -> Result<i32, Exit> {
    // No journal: this is the connectivity check, and must work while the journal is
    // what is down.
    let cfg = Config::load(config).map_err(crate::exit::config)?;
    let mut rows = Vec::new();
    for t in &cfg.targets {
        let d = t.adapter.describe();
        let probe = t.adapter.probe();
        rows.push((
            t.name.clone(),
            d,
            t.class.clone(),
            probe.err().map(|e| e.to_string()),
        ));
    }
    if json {
        // Assets follow the targets in the same list: `kind` null, `exempt` their reason.
        let assets = cfg
            .assets
            .iter()
            .map(|a| json!({"name": a.name, "kind": null, "class": a.class, "exempt": a.exempt}));
        print_json(&json!(rows
            .iter()
            .map(|(n, d, c, e)| json!({
                "name": n, "kind": d.kind, "version": d.version, "class": c,
                "capabilities": d.capabilities, "reachable": e.is_none(), "error": e,
            }))
            .chain(assets)
            .collect::<Vec<_>>()));
    } else {
        let mut t = Table::new(&["TARGET", "KIND", "VERSION", "CLASS", "REACHABLE"]);
        for (n, d, c, e) in &rows {
            t.row(vec![
                n.clone(),
                d.kind.to_string(),
                d.version.into(),
                c.clone(),
                e.clone().map_or("yes".into(), |e| format!("no: {e}")),
            ]);
        }
        t.print();
        if !cfg.assets.is_empty() {
            println!();
            let mut t = Table::new(&["ASSET", "CLASS", "NOT ERASED BECAUSE"]);
            for a in &cfg.assets {
                t.row(vec![a.name.clone(), a.class.clone(), a.exempt.clone()]);
            }
            t.print();
        }
    }
    Ok(if rows.iter().any(|r| r.3.is_some()) {
        1
    } else {
        0
    })
}
