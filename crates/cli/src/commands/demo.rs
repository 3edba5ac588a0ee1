//! `lethe demo`: a sample agent memory written by real LangGraph (SqliteSaver, SqliteStore
//! with a sqlite-vec index, and a thread registry), registered in a `lethe.toml`, then
//! acme/alice erased end to end. The sample files are the test fixtures, embedded at build time
//! (tests/fixtures/regenerate.sh rewrites them with LangGraph itself).

use std::path::Path;
use std::time::Duration;

use lethe_core::{Basis, Scope, Subject, Tenant};
use lethe_engine::{Request, RunOptions};

use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::Table;
use crate::progress::{print_outcome, progress_printer, ProgressTo};

const CHECKPOINTS: &[u8] =
    include_bytes!("../../../../tests/fixtures/langgraph-sqlite/checkpoints.db");
const STORE: &[u8] = include_bytes!("../../../../tests/fixtures/langgraph-sqlite/store.db");
const APP: &[u8] = include_bytes!("../../../../tests/fixtures/langgraph-sqlite/app.db");

/// The demo's config: its `[control]`, then the two targets over the fixture files
/// (`targets.toml` beside them, which the test suites and the SQLite benchmark read too).
const CONFIG: &str = concat!(
    r#"# Written by `lethe demo`. Every key is documented in Lethe's README (config reference).
[control]
journal = "sqlite:lethe-journal.db"
key_file = "lethe.key"
policy_version = "demo-1"
certificates = "certificates"

"#,
    include_str!("../../../../tests/fixtures/langgraph-sqlite/targets.toml")
);

const SUBJECTS: [(&str, &str); 3] = [("acme", "alice"), ("acme", "bob"), ("globex", "carol")];

fn io(e: std::io::Error) -> Exit {
    Exit(1, e.into())
}

/// Runs the demo in `dir`; returns the exit code.
pub fn run(dir: &Path) -> Result<i32, Exit> {
    let mem = dir.join("memory");
    let config = dir.join("lethe.toml");
    // Only a folder the demo made is rewritten: never someone's own config or stores.
    match std::fs::read_to_string(&config) {
        Ok(text) if text != CONFIG => {
            return Err(bad(format!(
                "{} exists and is not the one the demo writes; the demo would overwrite it and \
                 the stores beside it: give --dir a new folder (or remove that file to start \
                 the demo afresh there)",
                config.display()
            )))
        }
        Ok(_) => {}
        Err(_) => {
            if let Some(f) = ["checkpoints.db", "store.db", "app.db"]
                .iter()
                .map(|n| mem.join(n))
                .chain(
                    ["lethe-journal.db", "lethe.key"]
                        .iter()
                        .map(|n| dir.join(n)),
                )
                .find(|p| p.exists())
            {
                return Err(bad(format!(
                    "{} exists and the demo did not write it (no demo config beside it): give \
                     --dir a new folder",
                    f.display()
                )));
            }
        }
    }
    // A folder that cannot be made (under a file, or where this user may not write) is bad
    // input, named: nothing was written.
    std::fs::create_dir_all(&mem).map_err(|e| {
        bad(format!(
            "--dir {}: cannot make the demo's folders there ({e}); give a folder you can write in",
            dir.display()
        ))
    })?;
    // Fresh memory on every run; the journal and key persist, so runs accumulate jobs.
    for (name, bytes) in [
        ("checkpoints.db", CHECKPOINTS),
        ("store.db", STORE),
        ("app.db", APP),
    ] {
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(mem.join(format!("{name}{suffix}")));
        }
        std::fs::write(mem.join(name), bytes).map_err(io)?;
    }
    std::fs::write(&config, CONFIG).map_err(io)?;
    outln!(
        "Sample agent memory (written by real LangGraph) in {}",
        mem.display()
    );
    outln!("Config: {}\n", config.display());

    let engine = open_engine(&config)?;
    let scopes: Vec<Scope> = SUBJECTS
        .iter()
        .map(|(t, s)| Scope::Subject {
            tenant: Tenant::new(*t).expect("valid"),
            subject: Subject::new(*s).expect("valid"),
        })
        .collect();
    let count_all = || -> Result<Vec<Vec<u64>>, Exit> {
        scopes
            .iter()
            .map(|s| {
                Ok(engine
                    .inventory(s)?
                    .into_iter()
                    .map(|(_, c)| c.count)
                    .collect())
            })
            .collect()
    };
    let before = count_all()?;
    outln!("Inventory of acme/alice (a dry run; erasing is next):");
    let mut t = Table::new(&["TARGET", "ROWS"]);
    for (target, n) in engine.targets().iter().zip(&before[0]) {
        t.row(vec![target.name.clone(), n.to_string()]);
    }
    t.print();

    outln!("\nErasing acme/alice (gdpr-art17, ticket DEMO-1):");
    let req = Request {
        scope: scopes[0].clone(),
        basis: Basis::GdprArt17,
        ticket: "DEMO-1".into(),
        deadline: None,
        extension_reason: None,
    };
    let opts = RunOptions {
        drain_timeout: Duration::from_secs(5),
        pause_at: None,
        reinventory: false,
    };
    let outcome = engine.erase(req, &opts, &mut progress_printer(ProgressTo::Stdout))?;
    let after = count_all()?;

    outln!("\nRows per subject and target, before -> after:");
    let mut head = vec!["SUBJECT".to_string()];
    head.extend(engine.targets().iter().map(|t| t.name.clone()));
    let head_refs: Vec<&str> = head.iter().map(String::as_str).collect();
    let mut t = Table::new(&head_refs);
    for (i, (tenant, subject)) in SUBJECTS.iter().enumerate() {
        let mut row = vec![format!("{tenant}/{subject}")];
        row.extend(
            before[i]
                .iter()
                .zip(&after[i])
                .map(|(b, a)| format!("{b} -> {a}")),
        );
        t.row(row);
    }
    t.print();
    outln!();
    print_outcome(&outcome, false);
    outln!("\nNext: `lethe --config {} certificate show {} --format md`, `lethe --config {} journal verify`.", config.display(), outcome.job_id, config.display());
    Ok(if outcome.state == lethe_core::JobState::Complete {
        0
    } else {
        3
    })
}
