//! Each command: parse identifiers, call the engine, print. Errors become exit codes here and
//! nowhere else.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lethe_core::certificate::Certificate;
use lethe_core::clock::SystemClock;
use lethe_core::{Basis, JobState, Scope};
use lethe_engine::{Config, Engine, EngineError, Outcome, Progress, Request, RunOptions};
use serde_json::json;

use crate::args::{
    Args, CertFormat, CertificateCommand, Command, HoldCommand, JobCommand, JournalCommand,
    ScopeArgs,
};
use crate::output::{self, print_json, Table};

/// A failure with its exit code.
pub struct Exit(pub i32, pub anyhow::Error);

impl From<EngineError> for Exit {
    fn from(e: EngineError) -> Self {
        Exit(e.exit_code(), e.into())
    }
}

pub(crate) fn bad(msg: impl std::fmt::Display) -> Exit {
    Exit(2, anyhow::anyhow!("{msg}"))
}

/// Runs a command; returns the exit code.
pub fn run(args: Args) -> i32 {
    match dispatch(args) {
        Ok(code) => code,
        Err(Exit(code, e)) => {
            eprintln!("error: {e:#}");
            crate::output::json_error(code, &format!("{e:#}"));
            code
        }
    }
}

/// Whether an identifier may print like another one: spaces at an end, a format character
/// (zero-width, bidirectional mark), or a combining accent (a decomposed letter).
fn looks_like_another(id: &str) -> bool {
    id.trim() != id
        || id
            .chars()
            .any(|c| lethe_core::ident::is_invisible(c) || matches!(c, '\u{0300}'..='\u{036F}'))
}

/// An identifier quoted, with every character that would not print as itself (an invisible
/// one, a combining accent, a control character) as `\u{...}`: Rust's `{:?}` leaves some
/// invisible ones as they are (U+3164, U+2800; review).
fn escaped(id: &str) -> String {
    let mut out = String::from('"');
    for c in id.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
            out.push(c);
        } else if c.is_control()
            || lethe_core::ident::is_invisible(c)
            || matches!(c, '\u{0300}'..='\u{036F}')
        {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// Warns (stderr) when an identifier of the scope may print like another one: a scope matches
/// its identifiers exactly, so such a one usually finds nobody, and an erasure of it is
/// certified with zero counts (newcomer review: `--subject 'bo\u{200b}b'` was certified so).
fn warn_if_lookalike(s: &ScopeIds, what: &str) {
    for (field, id) in [
        ("tenant", Some(s.tenant.as_str())),
        ("subject", s.subject.as_deref()),
        ("memory", s.memory.as_deref()),
    ] {
        if id.is_some_and(looks_like_another) {
            eprintln!(
                "warning: {} has spaces at an end, an invisible character or a combining \
                 accent: {what} that exact identifier, not one that prints alike",
                s.origin.name(field)
            );
        }
    }
}

/// Where a scope's identifiers came from, to name them in messages as the user wrote them.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `--tenant`, `--subject`, ...
    #[default]
    Flags,
    /// The keys of `--scope-file`'s object.
    File,
}

impl Origin {
    /// How a field of the scope is named: `--subject`, or `the --scope-file's "subject"`.
    fn name(self, field: &str) -> String {
        match self {
            Origin::Flags => format!("--{field}"),
            Origin::File => format!("the --scope-file's \"{field}\""),
        }
    }
}

/// A scope's identifiers as given, from the flags or from `--scope-file`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScopeIds {
    tenant: String,
    subject: Option<String>,
    memory: Option<String>,
    version: Option<String>,
    #[serde(skip)]
    origin: Origin,
}

/// The largest `--scope-file` read: four identifiers of at most a few KiB each.
const MAX_SCOPE_FILE: u64 = 64 * 1024;

/// The scope's identifiers: the flags' or `--scope-file`'s (whose errors quote nothing of it).
pub(crate) fn scope_ids(s: &ScopeArgs) -> Result<ScopeIds, Exit> {
    match &s.scope_file {
        Some(file) => read_scope_file(file),
        None => Ok(ScopeIds {
            tenant: s.tenant.clone().unwrap_or_default(),
            subject: s.subject.clone(),
            memory: s.memory.clone(),
            version: s.version.clone(),
            origin: Origin::Flags,
        }),
    }
}

/// A hold's tenant and subject: the flags' or `--scope-file`'s, which may not name a memory.
fn hold_ids(
    tenant: Option<String>,
    subject: Option<String>,
    file: Option<&Path>,
) -> Result<ScopeIds, Exit> {
    let Some(file) = file else {
        return Ok(ScopeIds {
            tenant: tenant.unwrap_or_default(),
            subject,
            memory: None,
            version: None,
            origin: Origin::Flags,
        });
    };
    let ids = read_scope_file(file)?;
    if ids.memory.is_some() || ids.version.is_some() {
        return Err(bad(
            "a hold covers a tenant or a subject: its --scope-file names no memory or version",
        ));
    }
    Ok(ids)
}

/// Reads a `--scope-file` (`-`: standard input); its errors quote nothing of it.
fn read_scope_file(file: &Path) -> Result<ScopeIds, Exit> {
    use std::io::Read;
    let shown = if file.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        file.display().to_string()
    };
    let mut bytes = Vec::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_SCOPE_FILE + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(MAX_SCOPE_FILE + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| bad(format!("cannot read the --scope-file ({shown}): {e}")))?;
    if bytes.len() as u64 > MAX_SCOPE_FILE {
        return Err(bad(format!(
            "the --scope-file ({shown}) is over {} KiB; it holds one scope",
            MAX_SCOPE_FILE / 1024
        )));
    }
    // One JSON object, never an array: serde reads a struct from an array of its fields in
    // order, and `["acme","bob",null,null]` from another tool's export would name a person by
    // position (lethe_core::Object). A key the file made up is never named: it may be an
    // identifier.
    let mut ids: ScopeIds = serde_json::from_slice::<lethe_core::Object<ScopeIds>>(&bytes)
        .map(lethe_core::Object::into_inner)
        .map_err(|e| {
            bad(format!(
                "the --scope-file ({shown}) is not a scope: {}; write one JSON object, as \
                 {{\"tenant\": \"acme\", \"subject\": \"u-42\"}} (with \"memory\" and \
                 \"version\" for one memory)",
                lethe_core::redact_quoted(&e.to_string())
            ))
        })?;
    ids.origin = Origin::File;
    Ok(ids)
}

/// The scope `inventory`, `erase` and `verify` act on, from the flags or `--scope-file`, with
/// a warning for an identifier that prints like another (`what`: what the command does).
fn checked_scope(args: &ScopeArgs, what: &str) -> Result<Scope, Exit> {
    let ids = scope_ids(args)?;
    let scope = parse_scope(&ids)?;
    warn_if_lookalike(&ids, what);
    Ok(scope)
}

pub(crate) fn parse_scope(s: &ScopeIds) -> Result<Scope, Exit> {
    Scope::from_parts(
        &s.tenant,
        s.subject.as_deref(),
        s.memory.as_deref(),
        s.version.as_deref(),
    )
    .map_err(|e| {
        bad(match s.origin {
            Origin::Flags => format!("--{e}"),
            Origin::File => format!("the --scope-file's {e}"),
        })
    })
}

pub(crate) fn open_engine(config: &Path) -> Result<Engine, Exit> {
    let cfg = Config::load(config).map_err(bad)?;
    Ok(Engine::open(cfg, Arc::new(SystemClock))?)
}

/// For a command that touches every target first (inventory, erase, resume, verify): the
/// targets are probed while the journal opens.
fn open_engine_probing(config: &Path) -> Result<Engine, Exit> {
    let cfg = Config::load(config).map_err(bad)?;
    Ok(Engine::open_probing(cfg, Arc::new(SystemClock))?)
}

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
        };
        match to {
            ProgressTo::Nowhere => {}
            ProgressTo::Stderr => eprintln!("{line}"),
            ProgressTo::Stdout => outln!("{line}"),
        }
    }
}

fn progress_to(json: bool) -> ProgressTo {
    if json {
        ProgressTo::Nowhere
    } else {
        ProgressTo::Stderr
    }
}

fn outcome_code(o: &Outcome) -> i32 {
    match o.state {
        JobState::Complete => 0,
        JobState::Blocked => 3,
        _ => 3,
    }
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
        print_json(&json!({
            "job_id": o.job_id,
            "continued": o.continued,
            "state": o.state,
            "blocked_reason": o.blocked_reason,
            "blocked_target": o.blocked_target,
            "certificate": o.certificate,
        }));
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

fn dispatch(args: Args) -> Result<i32, Exit> {
    let config = args.config;
    match args.command {
        Command::Demo { dir } => crate::demo::run(&dir),
        Command::Serve { listen } => crate::serve::run(&config, listen),
        Command::Targets { json } => {
            // No journal: this is the connectivity check, and must work while the journal is
            // what is down.
            let cfg = Config::load(&config).map_err(bad)?;
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
                print_json(&json!(rows
                    .iter()
                    .map(|(n, d, c, e)| json!({
                        "name": n, "kind": d.kind, "version": d.version, "class": c,
                        "capabilities": d.capabilities, "reachable": e.is_none(), "error": e,
                    }))
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
            }
            Ok(if rows.iter().any(|r| r.3.is_some()) {
                1
            } else {
                0
            })
        }
        Command::Inventory { scope: args, json } => {
            let scope = checked_scope(&args, "the inventory counts what is held for")?;
            let engine = open_engine_probing(&config)?;
            let counts = engine.inventory(&scope)?;
            if json {
                let targets: serde_json::Map<_, _> =
                    counts.iter().map(|(n, c)| (n.clone(), json!(c))).collect();
                print_json(&json!({"scope_hash": engine.scope_hash(&scope), "targets": targets}));
            } else {
                outln!("Scope {} ({})", engine.scope_hash(&scope), scope.kind());
                let mut t = Table::new(&["TARGET", "ROWS"]);
                for (n, c) in &counts {
                    t.row(vec![
                        n.clone(),
                        c.exempt
                            .as_ref()
                            .map_or(c.count.to_string(), |w| format!("exempt: {w}")),
                    ]);
                }
                t.print();
            }
            Ok(0)
        }
        Command::Erase {
            scope: args,
            basis,
            ticket,
            deadline,
            extension_reason,
            drain_timeout,
            json,
        } => {
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
            let engine = open_engine_probing(&config)?;
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
        Command::Resume {
            job_id,
            drain_timeout,
            reinventory,
            json,
        } => {
            let engine = open_engine_probing(&config)?;
            let opts = RunOptions {
                drain_timeout: Duration::from_secs(drain_timeout),
                pause_at: lethe_engine::pause_from_env(),
                reinventory,
            };
            let o = engine.resume(&job_id, &opts, &mut progress_printer(progress_to(json)))?;
            print_outcome(&o, json);
            Ok(outcome_code(&o))
        }
        Command::Work {
            drain_timeout,
            json,
        } => {
            let engine = open_engine(&config)?;
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
                    .map(|o| json!({"job_id": o.job_id, "state": o.state, "blocked_reason": o.blocked_reason,
                        "blocked_target": o.blocked_target, "certificate": o.certificate}))
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
        Command::Verify {
            scope: args,
            audit,
            json,
        } => {
            let scope = checked_scope(&args, "verification looks for")?;
            let engine = open_engine_probing(&config)?;
            let counts = engine.verify(&scope, audit)?;
            let clean = counts.iter().all(|(_, c)| c.count == 0);
            if json {
                let targets: serde_json::Map<_, _> = counts
                    .iter()
                    .map(|(n, c)| (n.clone(), json!({"residue": c.count, "exempt": c.exempt})))
                    .collect();
                print_json(&json!({"clean": clean, "targets": targets}));
            } else {
                let mut t = Table::new(&["TARGET", "RESIDUE"]);
                for (n, c) in &counts {
                    t.row(vec![
                        n.clone(),
                        c.exempt
                            .as_ref()
                            .map_or(c.count.to_string(), |w| format!("exempt: {w}")),
                    ]);
                }
                t.print();
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
        Command::Jobs { json } => {
            let engine = open_engine(&config)?;
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
        Command::Job {
            command: JobCommand::Show { job_id, json },
        } => {
            let engine = open_engine(&config)?;
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
        Command::Certificate {
            command: CertificateCommand::Show { job_id, format },
        } => {
            let engine = open_engine(&config)?;
            let o = engine
                .outcome(&job_id)
                .map_err(|e| bad(format!("{e}; `lethe jobs` lists them")))?;
            let Some(cert) = o.certificate else {
                return Err(bad(format!(
                    "job {job_id} is {} and has no certificate yet",
                    o.state
                )));
            };
            match format {
                CertFormat::Json => print_json(&cert),
                CertFormat::Md => out!("{}", output::certificate_markdown(&cert)),
            }
            Ok(0)
        }
        Command::Certificate {
            command:
                CertificateCommand::Verify {
                    file,
                    public_key,
                    tenant,
                    subject,
                    memory,
                    version,
                    scope_file,
                },
        } => {
            let ids = match &scope_file {
                Some(f) => Some(read_scope_file(f)?),
                None => tenant.map(|tenant| ScopeIds {
                    tenant,
                    subject,
                    memory,
                    version,
                    origin: Origin::Flags,
                }),
            };
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))
                .map_err(|e| Exit(2, e))?;
            let doc: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| bad(format!("{} is not JSON: {e}", file.display())))?;
            lethe_core::certificate::refuse_duplicate_keys(&text).map_err(|e| Exit(1, e.into()))?;
            let key = match (&public_key, &ids) {
                (Some(_), Some(ids)) => {
                    return Err(bad(format!(
                        "{} needs the deployment key; drop --public-key",
                        match ids.origin {
                            Origin::Flags => "--tenant",
                            Origin::File => "--scope-file",
                        }
                    )))
                }
                (Some(pk), None) => output::parse_public_key(pk).map_err(bad)?,
                (None, _) => {
                    // Someone checking a certificate they were handed has no deployment: say
                    // how to check it without one.
                    let offline = if ids.is_none() {
                        "; without the deployment's config and key, pass --public-key \
                         ed25519:<hex>, the key the issuer publishes (a certificate's \
                         `signed_by` names the key that signed it, so trust only the published one)"
                    } else {
                        ""
                    };
                    let cfg = Config::load(&config).map_err(|e| bad(format!("{e}{offline}")))?;
                    lethe_engine::keyfile::load(&cfg.key_file)
                        .map_err(|e| bad(format!("{e}{offline}")))?
                        .verifying_key()
                }
            };
            let cert = Certificate::verify(&doc, &key).map_err(|e| Exit(1, e.into()))?;
            if let Some(ids) = ids {
                let scope = parse_scope(&ids)?;
                let cfg = Config::load(&config).map_err(bad)?;
                let dk = lethe_engine::keyfile::load(&cfg.key_file).map_err(bad)?;
                if !cert.is_for(&scope.hash(&dk.scope_key())) {
                    outln!("Signature valid, but the certificate is NOT for that scope.");
                    if matches!(scope, Scope::Memory { version: None, .. }) {
                        outln!(
                            "A memory certificate binds the version it erased: give {} \
                             (`lethe job show JOB` shows it as frozen_version).",
                            match ids.origin {
                                Origin::Flags => "--version",
                                Origin::File => "\"version\" in the --scope-file",
                            }
                        );
                    }
                    return Ok(1);
                }
                outln!(
                    "Signature valid; job {} is for that {} scope.",
                    cert.job_id,
                    scope.kind()
                );
            } else {
                outln!(
                    "Signature valid: job {}, {} scope {}, completed {}.",
                    cert.job_id,
                    cert.scope,
                    cert.scope_hash,
                    cert.completed_at
                );
            }
            Ok(0)
        }
        Command::Hold { command } => {
            // The scope is read and checked before the journal opens: bad input touches
            // nothing, not even a new journal or key file (review).
            let scope = match &command {
                HoldCommand::Add {
                    tenant,
                    subject,
                    scope_file,
                    ..
                }
                | HoldCommand::Release {
                    tenant,
                    subject,
                    scope_file,
                } => {
                    let ids = hold_ids(tenant.clone(), subject.clone(), scope_file.as_deref())?;
                    let scope = parse_scope(&ids)?;
                    Some((ids, scope))
                }
                HoldCommand::List { .. } => None,
            };
            let engine = open_engine(&config)?;
            match command {
                HoldCommand::Add { reason, .. } => {
                    let (ids, scope) = scope.expect("read above");
                    // A hold matches byte for byte: an identifier that prints like another
                    // (spaces at an end, an invisible character, a letter decomposed into a
                    // combining accent) would hold nobody while it looks right in `hold list`.
                    warn_if_lookalike(&ids, "the hold covers");
                    let id = engine.add_hold(scope.tenant(), scope.subject(), reason.as_deref())?;
                    outln!(
                        "Hold {id} placed on {} scope {}.",
                        scope.kind(),
                        engine.scope_hash(&scope)
                    );
                }
                HoldCommand::Release { .. } => {
                    let (_, scope) = scope.expect("read above");
                    let ids = engine.release_holds(scope.tenant(), scope.subject())?;
                    if ids.is_empty() {
                        return Err(bad(
                            "no active hold on exactly that scope; `lethe hold list` shows them",
                        ));
                    }
                    outln!("Released {}.", ids.join(", "));
                }
                HoldCommand::List { json } => {
                    let holds = engine.journal().holds().map_err(EngineError::from)?;
                    if json {
                        print_json(&json!(holds));
                    } else {
                        // An identifier that prints like another (`bob ` and `bob`) is shown
                        // quoted, its invisible characters escaped (newcomer review: two such
                        // holds looked the same).
                        let shown = |id: String| {
                            if looks_like_another(&id) {
                                escaped(&id)
                            } else {
                                id
                            }
                        };
                        let mut t = Table::new(&["HOLD", "TENANT", "SUBJECT", "SINCE", "REASON"]);
                        for h in holds {
                            t.row(vec![
                                h.hold_id,
                                shown(h.tenant),
                                h.subject
                                    .map(shown)
                                    .unwrap_or_else(|| "(whole tenant)".into()),
                                h.created_at,
                                h.reason.unwrap_or_default(),
                            ]);
                        }
                        t.print();
                    }
                }
            }
            Ok(0)
        }
        Command::Guard { command } => crate::guard::run(&config, command),
        Command::Journal {
            command: JournalCommand::Verify { json },
        } => {
            let engine = open_engine(&config)?;
            let r = engine.journal().verify_chain().map_err(EngineError::from)?;
            if json {
                print_json(
                    &json!({"intact": r.is_intact(), "entries": r.entries, "jobs": r.jobs, "problems": r.problems}),
                );
            } else if r.is_intact() {
                outln!(
                    "Journal intact: {} entries, {} jobs replayed.",
                    r.entries,
                    r.jobs
                );
            } else {
                outln!("Journal BROKEN ({} entries read):", r.entries);
                for p in &r.problems {
                    outln!("  - {p}");
                }
            }
            Ok(if r.is_intact() { 0 } else { 1 })
        }
    }
}
