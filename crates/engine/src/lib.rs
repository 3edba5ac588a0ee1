//! The job runner: it carries one erasure request from REQUESTED to COMPLETE (or BLOCKED),
//! journaling each step before it acts.
//!
//! - [`config`]: `lethe.toml`, raw then validated.
//! - [`keyfile`]: the deployment key.
//! - [`Engine`]: `inventory`, `erase`, `resume`, `verify`, holds; start at [`Engine::run`].
//!
//! The engine is the only place that does I/O across stores; the state machine itself is the
//! pure [`lethe_core::state::transition`], applied inside the journal's transactions.

mod backups;
pub mod config;
pub mod keyfile;
pub mod keys;
mod recovery;
pub mod requests;
mod run;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lethe_adapters::{AdapterError, Applicability, Target};
use lethe_core::clock::Clock;
use lethe_core::keys::DeploymentKey;
use lethe_core::{Basis, BlockedReason, JobState, Scope};
use lethe_journal::Journal;

pub use backups::{BackupTarget, BackupsReport, Overdue, Waiting};
pub use config::Config;
pub use recovery::{RecoveryOptions, RecoveryProgress, REPORT_FORMAT};
pub use run::Progress;

/// Engine errors. None carries an identifier, and none a caller's wording: a field of the
/// request is named as the API names it, in backticks (`ticket`, `extension_reason`); the CLI
/// words it as its flag, and decides the exit codes.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad input or config; nothing was touched (exit 2).
    #[error("{0}")]
    Input(String),
    /// A legal hold refused the job; it stays where it is, touching nothing more (exit 4).
    #[error("job {job_id} is held by legal hold {}: nothing more was touched; it stays {state} until the hold is released", holds.join(", "))]
    Held {
        /// The job.
        job_id: String,
        /// The holds.
        holds: Vec<String>,
        /// Where the job stays: REQUESTED, or wherever an interrupted job stopped.
        state: JobState,
    },
    /// The control store failed.
    #[error(transparent)]
    Journal(#[from] lethe_journal::JournalError),
    /// The key file.
    #[error(transparent)]
    Key(#[from] keyfile::KeyError),
    /// A target could not be read (unreachable, locked, failing): worth retrying (exit 1).
    #[error("{0}; retry when the store is reachable")]
    Target(lethe_adapters::AdapterError),
    /// Another Lethe process is running this job (exit 3).
    #[error("job {0} is being run by another Lethe process")]
    Claimed(String),
    /// This process lost its claim on the job mid-run (its control-store connection was
    /// closed): it stops, so two processes never run one job; `lethe work` or `resume` goes on.
    #[error("job {0}: this process lost its claim on the job (the control store closed its connection) and stopped; resuming it goes on")]
    ClaimLost(String),
    /// Writing the certificate file failed (the job is COMPLETE in the journal; `resume`
    /// writes the file again).
    #[error("writing the certificate file {path}: {cause}")]
    CertificateFile {
        /// The file.
        path: String,
        /// Why (in the message, not a chained source: shown once).
        cause: std::io::Error,
    },
    /// A request's decision or intake was refused (`requests`).
    #[error(transparent)]
    Request(#[from] requests::RequestError),
    /// The operating system refused something else (a thread for a job, say).
    #[error("{0}")]
    Io(std::io::Error),
}

/// A validated erasure request.
#[derive(Debug, Clone)]
pub struct Request {
    /// What to erase.
    pub scope: Scope,
    /// Why.
    pub basis: Basis,
    /// The privacy ticket.
    pub ticket: String,
    /// An explicit deadline.
    pub deadline: Option<time::Date>,
    /// Why the deadline is extended past the basis's normal one.
    pub extension_reason: Option<String>,
}

/// Knobs that are not part of the request.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How long to wait for earlier permits to drain before blocking.
    pub drain_timeout: Duration,
    /// Test-only fault injection: pause forever at this named point after writing the marker
    /// file, so a test can SIGKILL the process exactly there. Honoured only in a build with the
    /// `test-pause` feature ([`pause_from_env`]).
    pub pause_at: Option<(String, PathBuf)>,
    /// On resume of a job blocked by `residue`: add the rows now in scope to the inventory of
    /// each target that found residue, and erase them too. An operator's decision, journaled.
    pub reinventory: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(30),
            pause_at: None,
            reinventory: false,
        }
    }
}

/// The pause point a test asks for through `LETHE_TEST_PAUSE_AT` and `LETHE_TEST_PAUSE_FILE`,
/// in a build with the `test-pause` feature (the CLI's tests turn it on through a
/// dev-dependency); always `None` otherwise, and neither name is in such a build.
pub fn pause_from_env() -> Option<(String, PathBuf)> {
    #[cfg(feature = "test-pause")]
    {
        let at = std::env::var("LETHE_TEST_PAUSE_AT").ok()?;
        let file = std::env::var("LETHE_TEST_PAUSE_FILE").ok()?;
        Some((at, file.into()))
    }
    #[cfg(not(feature = "test-pause"))]
    None
}

/// Where a job ended up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// The job.
    pub job_id: String,
    /// Its state.
    pub state: JobState,
    /// Why it is blocked.
    pub blocked_reason: Option<BlockedReason>,
    /// Which target blocked it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_target: Option<String>,
    /// The signed certificate, once complete.
    pub certificate: Option<serde_json::Value>,
    /// Where the certificate file is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate_path: Option<PathBuf>,
    /// Whether `erase` continued a job already open for the scope (whose basis, ticket and
    /// deadline stand) instead of starting one.
    pub continued: bool,
}

/// One target's count for a scope.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetCount {
    /// Rows (inventory) or residue (verify).
    pub count: u64,
    /// Why the target does not apply, if it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exempt: Option<String>,
}

/// The longest locator a lineage edge may name.
pub const MAX_LOCATOR: usize = 4096;

/// The engine: a journal, the targets, the key and a clock.
pub struct Engine {
    journal: Journal,
    targets: Vec<Target>,
    /// Declared stores no target erases: listed on every certificate.
    assets: Vec<config::Asset>,
    key: DeploymentKey,
    clock: Arc<dyn Clock>,
    policy_version: String,
    certificates: PathBuf,
    batch_size: usize,
    batch_rows: u64,
    /// The most jobs of a batch run side by side (`control.batch_group`).
    batch_group: usize,
    /// The in-process gate, once [`Engine::memory_gate`] installed it: freezes and drains then
    /// go through it, so they linearize with its permits.
    gate: Option<Arc<lethe_gate::MemoryGate>>,
    /// Probes taken while the journal opened ([`Engine::open_probing`]), each target's result;
    /// the first [`Engine::probe_all`] uses them instead of probing again.
    probed: std::sync::Mutex<Option<Vec<Result<(), AdapterError>>>>,
    /// Whether the journal records this key (else the next request binds it).
    key_bound: std::sync::atomic::AtomicBool,
    /// Crypto-shredding's key-encryption key (`[keys]`); `None`: off.
    kek: Option<Box<dyn keys::Kek>>,
    /// The targets whose payloads runtimes write under subject data keys (`keys.encrypted`).
    encrypted: Vec<String>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("journal", &self.journal)
            .field("targets", &self.targets)
            .finish()
    }
}

/// An adapter error outside a job: a scope or schema problem is bad input (exit 2); an
/// unreachable store is not.
pub(crate) fn target_error(e: AdapterError) -> EngineError {
    if e.is_retryable() {
        EngineError::Target(e)
    } else {
        input(e)
    }
}

/// Opens the control store the config names: a folder that does not exist or a URL Lethe does
/// not know is the configuration's mistake.
pub fn open_journal(config: &Config) -> Result<Journal, EngineError> {
    // A SQLite journal in a folder that does not exist is the configuration's mistake (exit 2),
    // not the database failing (newcomer review: it exited 1, "internal error").
    if let Some(path) = config.journal.strip_prefix("sqlite:") {
        let path = config.base.join(path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                return Err(input(format!(
                    "control.journal: the folder {} does not exist; create it, or point \
                     journal at a file in an existing folder",
                    dir.display()
                )));
            }
        }
    }
    Journal::open_url(&config.journal, &config.base).map_err(|e| match e {
        lethe_journal::JournalError::UnsupportedUrl(_) | lethe_journal::JournalError::BadUrl(_) => {
            input(e)
        }
        e => EngineError::Journal(e),
    })
}

/// The longest `--ticket`: a reference into the privacy team's tracker, journaled with the job.
pub const MAX_TICKET: usize = 256;

/// The longest `--extension-reason` or hold `--reason`: one line, journaled as typed.
pub const MAX_NOTE: usize = 1024;

/// Text a person reads on one line as it was written: not blank, no control character, no
/// line or paragraph separator, no bidirectional override or isolate (which would show it
/// reordered).
fn one_line(s: &str) -> bool {
    !s.trim().is_empty()
        && !s.chars().any(|c| {
            c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        })
}

fn input(e: impl std::fmt::Display) -> EngineError {
    EngineError::Input(e.to_string())
}

impl Engine {
    /// Opens the journal and the key named by the config. Touches no target.
    pub fn open(config: Config, clock: Arc<dyn Clock>) -> Result<Self, EngineError> {
        let journal = open_journal(&config);
        Self::with_journal(config, journal?, clock)
    }

    /// As [`Engine::open`], and probes every target while the journal opens, for a command
    /// that runs a job: each probe opens its target's connection (a TCP and often a TLS
    /// handshake), and the journal's is the same kind of wait, so the two overlap instead of
    /// following each other. Measured on the PostgreSQL benchmark: the journal's connection
    /// and schema check took about 5-10 ms and the targets' probes about as long again. A
    /// journal that cannot be opened is reported once the probes end (at most the targets'
    /// `connect_timeout`).
    pub fn open_probing(config: Config, clock: Arc<dyn Clock>) -> Result<Self, EngineError> {
        // A target the configuration gets wrong (a missing file, a wrong table) is exit 2 with
        // nothing touched: found before the key file is made, and on SQLite before the
        // journal's file is (newcomer review: both were left beside the config). A PostgreSQL
        // journal, whose database exists anyway, still opens while the targets are probed.
        let config_error = |probes: &[Result<(), AdapterError>]| {
            probes.iter().find_map(|p| match p {
                Ok(()) | Err(AdapterError::Unavailable { .. }) => None,
                Err(e) => Some(input(e)),
            })
        };
        let (journal, probes) = if config.journal.starts_with("sqlite:") {
            let probes = at_once(&config.targets, |t| t.adapter.probe());
            if let Some(e) = config_error(&probes) {
                return Err(e);
            }
            (open_journal(&config), probes)
        } else {
            std::thread::scope(|s| {
                let probes = s.spawn(|| at_once(&config.targets, |t| t.adapter.probe()));
                let journal = open_journal(&config);
                let probes = probes
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p));
                (journal, probes)
            })
        };
        if let Some(e) = config_error(&probes) {
            return Err(e);
        }
        let engine = Self::with_journal(config, journal?, clock)?;
        *engine.probed.lock().unwrap_or_else(|p| p.into_inner()) = Some(probes);
        Ok(engine)
    }

    fn with_journal(
        config: Config,
        journal: Journal,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, EngineError> {
        let (key, bound) = Self::journal_key(&config.key_file, &journal)?;
        let kek: Option<Box<dyn keys::Kek>> = match &config.keys {
            None => None,
            Some(k) => {
                // A new KEK over wrapped keys would shred every subject at once.
                if !k.kek_file.exists() && journal.data_key_count()? > 0 {
                    return Err(input(format!(
                        "keys.kek_file {} is missing, but the control store holds data keys \
                         wrapped by it: restore the file from your backup (a new key-encryption \
                         key would make every subject's encrypted data unreadable)",
                        k.kek_file.display()
                    )));
                }
                Some(Box::new(keys::FileKek::load_or_create(&k.kek_file)?))
            }
        };
        Ok(Self {
            kek,
            encrypted: config.keys.map(|k| k.encrypted).unwrap_or_default(),
            journal,
            targets: config.targets,
            assets: config.assets,
            key,
            clock,
            policy_version: config.policy_version,
            certificates: config.certificates,
            batch_size: config.batch_size,
            batch_rows: config.batch_rows,
            batch_group: config.batch_group,
            gate: None,
            probed: std::sync::Mutex::new(None),
            key_bound: std::sync::atomic::AtomicBool::new(bound),
        })
    }

    /// The deployment key, bound to the journal: created only for a journal without jobs,
    /// and refused when it is not the key the journal's jobs were made with.
    fn journal_key(
        path: &std::path::Path,
        journal: &Journal,
    ) -> Result<(lethe_core::keys::DeploymentKey, bool), EngineError> {
        let shown = path.display().to_string();
        let recorded = journal.signing_key()?;
        // Only jobs need the key they were made with; a journal without any takes a new one.
        if !path.exists() && journal.has_jobs()? {
            return Err(keyfile::KeyError::Lost {
                path: shown,
                recorded: recorded
                    .unwrap_or_else(|| "(not recorded by the Lethe that made them)".into()),
            }
            .into());
        }
        let key = keyfile::load_or_create(path)?;
        let mine = lethe_core::certificate::key_name(&key.verifying_key());
        let mismatch = |recorded: String| -> EngineError {
            keyfile::KeyError::Mismatch {
                path: shown.clone(),
                found: mine.clone(),
                recorded,
            }
            .into()
        };
        match recorded {
            // Every open but the first: one read.
            Some(r) if r == mine => {}
            Some(r) if journal.has_jobs()? => return Err(mismatch(r)),
            Some(_) => journal.set_signing_key(&mine)?,
            // A journal an older Lethe made: its certificates say which key signed them.
            None if journal.has_jobs()? => {
                if let Some(signer) = journal.certificate_signer()? {
                    if signer != mine {
                        return Err(mismatch(signer));
                    }
                }
                journal.bind_signing_key(&mine)?;
            }
            // No job yet: bound by the first request.
            None => return Ok((key, false)),
        }
        Ok((key, true))
    }

    /// The journal, for listings and the gate's library API.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The folder certificates and recovery reports are written to.
    pub fn certificates_dir(&self) -> &std::path::Path {
        &self.certificates
    }

    /// Installs (once) and returns the in-process gate, for agent runtimes running in this
    /// process: leases and permits in memory, at memory speed; the fences, epochs and
    /// tombstones it starts from and writes through are the journal's. Runtimes in other
    /// processes use `lethe serve` instead; never both over one journal.
    pub fn memory_gate(&mut self) -> Result<Arc<lethe_gate::MemoryGate>, EngineError> {
        if self.gate.is_none() {
            self.gate = Some(Arc::new(lethe_gate::MemoryGate::load(&self.journal)?));
        }
        Ok(Arc::clone(self.gate.as_ref().expect("installed above")))
    }

    /// The gate authority that governs this engine's journal: the in-process gate once
    /// [`Engine::memory_gate`] installed it, the control store's otherwise.
    pub fn gate_authority(&self) -> lethe_gate::Authority<'_> {
        match &self.gate {
            Some(g) => lethe_gate::Authority::Memory {
                gate: g,
                journal: &self.journal,
            },
            None => lethe_gate::Authority::journal(&self.journal),
        }
    }

    /// Records that the artifact `locator` in the target named `target` was derived from the
    /// subject's memories `from` (empty: from the subject's memory as a whole), for an erasure
    /// of them to reach it (`POST /v1/lineage`). Refused, storing nothing: a target not
    /// configured, one whose kind takes no lineage, a malformed locator ([`EngineError::Input`]),
    /// and while an erasure of the subject or tenant has its fence closed
    /// (`GateError::Fenced`). The locator is never logged or quoted.
    pub fn record_lineage(
        &self,
        tenant: &lethe_core::Tenant,
        subject: &lethe_core::Subject,
        target: &str,
        locator: &str,
        from: &[lethe_journal::lineage::Source],
    ) -> Result<(), EngineError> {
        self.record_lineage_from(tenant, subject, target, locator, from, &[])
    }

    /// As [`Engine::record_lineage`], the artifact derived also (or only) from other artifacts
    /// (`from_artifacts`: their target and locator, a summary of a summary): an erasure that
    /// reaches one of them reaches it too, transitively. Each named target must be configured.
    pub fn record_lineage_from(
        &self,
        tenant: &lethe_core::Tenant,
        subject: &lethe_core::Subject,
        target: &str,
        locator: &str,
        from: &[lethe_journal::lineage::Source],
        from_artifacts: &[lethe_journal::lineage::Artifact],
    ) -> Result<(), EngineError> {
        let t = self
            .targets
            .iter()
            .find(|t| t.name == target)
            .ok_or_else(|| EngineError::Input("`target` names no configured target".to_string()))?;
        if !t.adapter.takes_lineage() {
            return Err(EngineError::Input(format!(
                "`target`: a target of kind {} takes no lineage (kinds that do: sql, \
                 langgraph-redis-cache)",
                t.kind.as_str()
            )));
        }
        if locator.is_empty()
            || locator.len() > MAX_LOCATOR
            || locator.chars().any(char::is_control)
        {
            return Err(EngineError::Input(format!(
                "`locator` must be 1 to {MAX_LOCATOR} bytes, no control characters"
            )));
        }
        if from_artifacts.len() > 10_000 {
            return Err(EngineError::Input(
                "`from_artifacts` may list at most 10000 artifacts".into(),
            ));
        }
        for (ft, fl) in from_artifacts {
            if !self.targets.iter().any(|t| &t.name == ft) {
                return Err(EngineError::Input(
                    "`from_artifacts`: a `target` names no configured target".to_string(),
                ));
            }
            if fl.is_empty() || fl.len() > MAX_LOCATOR || fl.chars().any(char::is_control) {
                return Err(EngineError::Input(format!(
                    "`from_artifacts`: a `locator` must be 1 to {MAX_LOCATOR} bytes, no control \
                     characters"
                )));
            }
        }
        self.journal
            .record_lineage(tenant, subject, &t.name, locator, from, from_artifacts)?;
        Ok(())
    }

    /// The targets.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// The deployment key.
    pub fn key(&self) -> &DeploymentKey {
        &self.key
    }

    /// The keyed hash of a scope, as `hmac:<hex>`.
    pub fn scope_hash(&self, scope: &Scope) -> String {
        scope.hash(&self.key.scope_key()).to_string()
    }

    fn now_rfc3339(&self) -> String {
        rfc3339(self.clock.now())
    }

    /// Checks every target can express the scope exactly. Touches nothing.
    pub fn check_scope(&self, scope: &Scope) -> Result<Vec<Applicability>, EngineError> {
        // An explicit version of a form a target cannot hold would match nothing there: an
        // erasure would certify 0 and a verification say "clean" while the memory stays.
        if let Scope::Memory {
            version: Some(v), ..
        } = scope
        {
            for t in &self.targets {
                if let Err(form) = t.adapter.check_version(v) {
                    return Err(input(format!(
                        "the version (`version`) is not one target {} can hold: a memory's \
                         version there is {form}",
                        t.name
                    )));
                }
            }
        }
        self.targets
            .iter()
            .map(|t| t.adapter.check_scope(scope).map_err(target_error))
            .collect()
    }

    /// Probes every target; a store that is missing or of the wrong schema is an input error.
    /// An unreachable one is not: the job will block on it and can be resumed.
    fn probe_all(&self) -> Result<(), EngineError> {
        // All at once: each probe opens its target's connection (a TLS handshake and a
        // catalog query or two), which is most of a small job's start-up when done one after
        // another. The first failure in configuration order is the one reported. Probes
        // taken while the journal opened (`open_probing`) stand for the first call.
        let taken = self.probed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let probes = taken.unwrap_or_else(|| at_once(&self.targets, |t| t.adapter.probe()));
        for p in probes {
            match p {
                Ok(()) | Err(AdapterError::Unavailable { .. }) => {}
                Err(e) => return Err(input(e)),
            }
        }
        Ok(())
    }

    /// Counts what each target holds for a scope. Read-only; journals nothing.
    pub fn inventory(&self, scope: &Scope) -> Result<Vec<(String, TargetCount)>, EngineError> {
        let applies = self.check_scope(scope)?;
        self.probe_all()?;
        // Every applicable target at once; the first failure in configuration order is the
        // one reported.
        let work: Vec<_> = self.targets.iter().zip(applies).collect();
        // What lineage records for each target that takes it: owned, not legacy.
        let mut owned = std::collections::HashMap::new();
        for t in self.targets.iter().filter(|t| t.adapter.takes_lineage()) {
            owned.insert(
                t.name.clone(),
                self.journal.lineage_target_locators(&t.name)?,
            );
        }
        let counts = at_once(&work, |(t, a)| match a {
            Applicability::Exempt(why) => Ok(TargetCount {
                count: 0,
                exempt: Some(why.clone()),
            }),
            Applicability::Applies => t
                .adapter
                .inventory_owned(scope, owned.get(&t.name).map_or(&[][..], Vec::as_slice))
                .map(|i| TargetCount {
                    count: i.count,
                    exempt: None,
                }),
        });
        let mut out = Vec::new();
        for ((t, _), c) in work.iter().zip(counts) {
            out.push((t.name.clone(), c.map_err(target_error)?));
        }
        Ok(out)
    }

    /// Counts what is left for a scope in each target, hidden rows included; with `audit`, also
    /// runs each target's independent audit (a keyspace scan for an indexed Redis target) and
    /// counts the larger. Read-only.
    pub fn verify(
        &self,
        scope: &Scope,
        audit: bool,
    ) -> Result<Vec<(String, TargetCount)>, EngineError> {
        let applies = self.check_scope(scope)?;
        self.probe_all()?;
        // Every applicable target at once, as for `inventory`.
        let work: Vec<_> = self.targets.iter().zip(applies).collect();
        let counts = at_once(&work, |(t, a)| match a {
            Applicability::Exempt(why) => Ok(TargetCount {
                count: 0,
                exempt: Some(why.clone()),
            }),
            Applicability::Applies => {
                let mut count = t.adapter.verify(scope, &[])?;
                if audit {
                    count = count.max(t.adapter.audit(scope)?.unwrap_or(0));
                }
                Ok(TargetCount {
                    count,
                    exempt: None,
                })
            }
        });
        let mut out = Vec::new();
        for ((t, _), c) in work.iter().zip(counts) {
            out.push((t.name.clone(), c.map_err(target_error)?));
        }
        Ok(out)
    }

    /// Places a legal hold on a tenant or one subject. Returns the hold id.
    pub fn add_hold(
        &self,
        tenant: &lethe_core::Tenant,
        subject: Option<&lethe_core::Subject>,
        reason: Option<&str>,
    ) -> Result<String, EngineError> {
        if reason.is_some_and(|r| !one_line(r)) {
            return Err(input(
                "`reason` must be non-empty and one line without control characters",
            ));
        }
        if reason.is_some_and(|r| r.len() > MAX_NOTE) {
            return Err(input(format!(
                "`reason` is over {MAX_NOTE} bytes: give the matter's reference, not its file"
            )));
        }
        let id = format!("hold-{}", random_hex(4)?);
        let scope = match subject {
            Some(s) => Scope::Subject {
                tenant: tenant.clone(),
                subject: s.clone(),
            },
            None => Scope::Tenant {
                tenant: tenant.clone(),
            },
        };
        self.journal.add_hold(
            &self.now_rfc3339(),
            &id,
            tenant,
            subject,
            reason,
            &self.scope_hash(&scope),
        )?;
        Ok(id)
    }

    /// Releases the holds on exactly this tenant (and subject).
    pub fn release_holds(
        &self,
        tenant: &lethe_core::Tenant,
        subject: Option<&lethe_core::Subject>,
    ) -> Result<Vec<String>, EngineError> {
        Ok(self
            .journal
            .release_holds(&self.now_rfc3339(), tenant, subject)?)
    }

    /// Validates a request and journals its job (REQUESTED), or finds the job already open for
    /// the scope; runs nothing. Returns the job id and whether it was created. Bad input fails
    /// before anything is journaled or touched. [`Engine::resume`] then runs it.
    pub fn request(&self, req: Request) -> Result<(String, bool), EngineError> {
        self.request_received(req, self.clock.now())
    }

    /// [`Engine::request`] for a request received at `received` (an approved request's): its
    /// deadline and the job's `requested_at` count from then, not from now.
    pub fn request_received(
        &self,
        req: Request,
        received: time::OffsetDateTime,
    ) -> Result<(String, bool), EngineError> {
        self.check_scope(&req.scope)?;
        self.probe_all()?;
        // No job is added to a journal whose chain does not verify.
        self.journal.check_chain_sealed(&self.key.verifying_key())?;
        self.request_probed(req, received)
    }

    /// [`Engine::request_received`] with the targets probed and the journal's chain checked
    /// (a batch does both once).
    fn request_probed(
        &self,
        req: Request,
        received: time::OffsetDateTime,
    ) -> Result<(String, bool), EngineError> {
        self.check_scope(&req.scope)?;
        if !one_line(&req.ticket) {
            return Err(input(
                "`ticket` must be a non-empty reference without control characters",
            ));
        }
        if req.ticket.len() > MAX_TICKET {
            return Err(input(format!(
                "`ticket` is over {MAX_TICKET} bytes: give the ticket's reference (DSR-1234), \
                 not the request itself"
            )));
        }
        if req
            .extension_reason
            .as_ref()
            .is_some_and(|r| r.len() > MAX_NOTE)
        {
            return Err(input(format!(
                "`extension_reason` is over {MAX_NOTE} bytes: one line saying why"
            )));
        }
        if let Some(r) = &req.extension_reason {
            if !one_line(r) {
                return Err(input(
                    "`extension_reason` must be non-empty and one line without control characters",
                ));
            }
            if req.deadline.is_none() {
                return Err(input(
                    "`extension_reason` goes with the `deadline` it justifies (a date past the \
                     basis's first period); without one it would be recorded and do nothing",
                ));
            }
        }
        // The key the job will be hashed and signed with is the journal's from now on.
        if !self.key_bound.load(std::sync::atomic::Ordering::Relaxed) {
            let mine = lethe_core::certificate::key_name(&self.key.verifying_key());
            let bound = self.journal.bind_signing_key(&mine)?;
            if bound != mine {
                return Err(keyfile::KeyError::Mismatch {
                    path: "(this process's key file)".into(),
                    found: mine,
                    recorded: bound,
                }
                .into());
            }
            self.key_bound
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // The certificate is written last, after the erasure: a folder it cannot go in is
        // found now, before anything is touched.
        // A path that is no folder, or one Lethe may not write in, is the configuration's
        // (exit 2); a disk that fails, is full or read-only is an I/O fault (exit 5).
        let unwritable = |e: std::io::Error| {
            use std::io::ErrorKind::{AlreadyExists, NotADirectory, NotFound, PermissionDenied};
            let shown = format!(
                "control.certificates {} is not a folder Lethe can write in ({e})",
                self.certificates.display()
            );
            match e.kind() {
                PermissionDenied | NotADirectory | AlreadyExists | NotFound => input(shown),
                _ => EngineError::Io(std::io::Error::new(e.kind(), shown)),
            }
        };
        std::fs::create_dir_all(&self.certificates).map_err(unwritable)?;
        let probe = self
            .certificates
            .join(format!(".lethe-write-check-{}", random_hex(4)?));
        std::fs::write(&probe, b"").map_err(unwritable)?;
        std::fs::remove_file(&probe).map_err(unwritable)?;
        // A memory scope must name a version some target holds (or an explicit one) before a
        // job exists: a request that cannot be frozen creates nothing. Without an explicit
        // one, the version found is journaled for the freeze to fall back to.
        let at_request = self.resolve_version(&req.scope, None)?;
        let version_at_request = match &req.scope {
            Scope::Memory { version: None, .. } => at_request.map(|v| v.as_str().to_string()),
            _ => None,
        };
        let now = received;
        let deadline = req
            .basis
            .deadline(now.date(), req.deadline, req.extension_reason.is_some())
            .map_err(input)?;
        let new = lethe_journal::jobs::NewJob {
            job_id: format!("del-{}", random_hex(6)?),
            scope_hash: self.scope_hash(&req.scope),
            scope: req.scope,
            basis: req.basis,
            ticket: req.ticket,
            policy_version: self.policy_version.clone(),
            deadline,
            extension_reason: req.extension_reason,
            requested_at: rfc3339(now),
            version_at_request,
        };
        let (job, created) = self.journal.create_job(&new)?;
        tracing::info!(job = %job.job_id, scope_hash = %short(&job.scope_hash), created, "Job requested.");
        Ok((job.job_id, created))
    }

    /// Starts (or, for a scope with an open job, continues) an erasure and runs it as far as
    /// it goes. Bad input fails before anything is journaled or touched.
    pub fn erase(
        &self,
        req: Request,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Outcome, EngineError> {
        // The claim's connection opens while the targets are probed and the job requested.
        self.journal.prepare_claim();
        let (job_id, created) = self.request(req)?;
        let mut out = self.run(&job_id, opts, progress)?;
        out.continued = !created;
        Ok(out)
    }

    /// Resumes a job from its journaled state.
    pub fn resume(
        &self,
        job_id: &str,
        opts: &RunOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Outcome, EngineError> {
        let job = self.journal.job(job_id)?;
        self.check_scope(&job.scope)?;
        self.journal.prepare_claim();
        self.probe_all()?;
        self.run(job_id, opts, progress)
    }

    /// Where a job stands, as an [`Outcome`].
    pub fn outcome(&self, job_id: &str) -> Result<Outcome, EngineError> {
        let job = self.journal.job(job_id)?;
        let path = self.certificates.join(format!("{job_id}.json"));
        Ok(Outcome {
            job_id: job.job_id,
            state: job.state,
            blocked_reason: job.blocked_reason,
            blocked_target: job.blocked_target,
            certificate_path: job.certificate.as_ref().map(|_| path),
            certificate: job.certificate,
            continued: false,
        })
    }
}

/// Formats a time as RFC 3339 UTC with second precision.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    let t = t
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn short(hash: &str) -> &str {
    hash.get(5..17).unwrap_or(hash)
}

fn random_hex(bytes: usize) -> Result<String, EngineError> {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b)
        .map_err(|e| EngineError::Input(format!("no OS randomness: {e}")))?;
    Ok(hex::encode(b))
}

/// `f` on every item at once, one thread an item; the results in the items' order.
fn at_once<I: Sync, T: Send>(items: &[I], f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    let f = &f;
    std::thread::scope(|s| {
        let running: Vec<_> = items.iter().map(|i| s.spawn(move || f(i))).collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}
