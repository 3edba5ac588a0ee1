//! The command line, declared once. `lethe --help` and `lethe COMMAND --help` are generated
//! from these doc comments: they are the user's manual, so they say what each thing does.

use std::path::PathBuf;

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};

/// Erase one person's (or one memory's, or one tenant's) AI-agent memory from every registered
/// store, stop running agents from writing it back, verify nothing is left, and issue a signed
/// certificate that holds counts and a keyed hash, never the person's identifiers.
///
/// Start with `lethe demo`. Exit codes: 0 done or clean; 1 residue found (verify) or an
/// internal error; 2 bad input or config, nothing touched; 3 job BLOCKED; 4 refused by a legal
/// hold.
#[derive(Parser, Debug)]
#[command(
    name = "lethe",
    version,
    max_term_width = 100,
    after_help = "Examples:
  lethe demo                                   # a sample memory, erased end to end
  lethe targets                                # is every registered store reachable?
  lethe inventory --tenant acme --subject u-42 # what would be erased (reads only)
  lethe erase --tenant acme --subject u-42 --basis gdpr-art17 --ticket DSR-1234
  lethe jobs; lethe job show del-...           # what ran, and where each job is
  lethe certificate show del-... --format md   # the signed proof, for a DPO"
)]
pub struct Args {
    /// The config file (default ./lethe.toml).
    #[arg(
        long,
        global = true,
        env = "LETHE_CONFIG",
        default_value = "lethe.toml"
    )]
    pub config: PathBuf,

    /// More log output on stderr (-v info, -vv debug). LETHE_LOG overrides. Logs never hold
    /// identifiers: jobs are named by id, scopes by keyed hash.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Make a sample agent memory (written by real LangGraph) in a folder, register it, erase
    /// acme/alice end to end, and show what happened to every subject.
    Demo {
        /// Where to put the sample (its memory files are rewritten on each run).
        #[arg(long, default_value = "lethe-demo")]
        dir: PathBuf,
    },
    /// List the registered targets: adapter kind and version, class, reachable or not.
    Targets {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Count what each target holds for a scope (a dry run: reads only, journals nothing).
    #[command(after_help = "Examples:
  lethe inventory --tenant acme --subject u-42 --json
  jq -n '{tenant: env.TENANT, subject: env.SUBJECT}' | lethe inventory --scope-file -
  lethe inventory --tenant acme                # a whole tenant (offboarding)")]
    Inventory {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Print JSON: {"scope_hash", "targets": {NAME: {"count"}}}.
        #[arg(long)]
        json: bool,
    },
    /// Erase a scope: freeze it at the gate, wait for running work to drain, inventory, erase
    /// exactly the inventory, verify zero residue, and sign a certificate. If a job for the
    /// same scope is still open, that job is continued instead of starting another.
    #[command(after_help = "Examples:
  lethe erase --tenant acme --subject u-42 --basis gdpr-art17 --ticket DSR-1234
  lethe erase --scope-file scope.json --basis ccpa --ticket DSR-77 --json
  lethe erase --tenant acme --subject u-42 --memory memories/k42 --basis gdpr-art17 --ticket T-9
  lethe erase --tenant acme --basis tenant-offboarding --ticket OFF-3 --drain-timeout 300
  lethe erase --batch deletions.jsonl --basis account-closure --ticket BATCH-2026-12-06 --json

Exit 0 COMPLETE (certificate written), 3 BLOCKED (see `lethe job show`, then `lethe resume`),
4 held, 2 bad input (nothing touched). A --batch exits with its worst job's code (0, then 4
held, then 3 BLOCKED, then an error's own code).",
        mut_arg("tenant", |a| a.required_unless_present_any(["scope_file", "batch"]))
    )]
    Erase(EraseArgs),
    /// Count what is left for a scope in every target, hidden rows included (expired items,
    /// orphaned vectors). Exit 1 if anything is left. With --physical --job: look again in the
    /// store's own files for what a COMPLETE job erased.
    #[command(
        after_help = "Examples:
  lethe verify --tenant acme --subject u-42    # exit 0 clean, 1 residue
  lethe verify --tenant acme --subject u-42 --audit --json
  lethe verify --physical --job del-3f2a9c     # exit 0 clean, 1 the files still hold some",
        mut_arg("tenant", |a| a.required_unless_present_any(["scope_file", "job"]))
    )]
    Verify {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Also run each target's independent audit: for a Redis target in index mode, or in
        /// scan mode with `verify = "frozen"`, a scan of the keyspace, which finds keys the
        /// index or the frozen list never held (slower: it walks every key).
        #[arg(long)]
        audit: bool,
        /// Instead of asking each store's API, read each target's own files (its `path`:
        /// Chroma's chroma.sqlite3, Phoenix's phoenix.db and -wal), read-only, for what the
        /// COMPLETE job --job erased, and print per target what they still hold and the store's
        /// remedy. Changes nothing and signs nothing: the job's certificate is already signed
        /// and keeps the check made when it was issued; this prints today's. Targets without
        /// `path`, or of a kind without such a check, are left out. A target that erased
        /// something is refused for now (exit 2): completion drops the job's erased ids and no
        /// per-document digest is kept, so there would be nothing to look for.
        #[arg(long, requires = "job")]
        physical: bool,
        /// The COMPLETE job whose frozen inventories --physical looks for (`del-` and hex, as
        /// `lethe jobs` lists it).
        #[arg(
            long,
            value_name = "JOB_ID",
            value_parser = job_id,
            requires = "physical",
            conflicts_with_all = ["tenant", "subject", "memory", "version", "scope_file", "audit"]
        )]
        job: Option<String>,
        /// Print JSON: {"clean", "targets": {NAME: {"residue"}}}; with --physical: {"job_id",
        /// "clean", "targets": {NAME: {"status", "residue", "remedy", "checked_at"}}}.
        #[arg(long)]
        json: bool,
    },
    /// List jobs.
    Jobs {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// Continue a job from its journaled state (after a crash, a block or a released hold).
    #[command(after_help = "Examples:
  lethe resume del-3f2a9c                      # after a crash, a block or a released hold
  lethe resume del-3f2a9c --reinventory        # residue written around the gate: erase it too")]
    Resume {
        /// The job id (`del-` and hex, as `lethe jobs` lists it).
        #[arg(value_parser = job_id)]
        job_id: String,
        /// Seconds to wait for undrained permits.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
        drain_timeout: u64,
        /// For a job BLOCKED by residue: add the rows now in scope (written after the freeze,
        /// around the gate) to the inventory and erase them too. Find out how they got there
        /// first: a writer that bypasses the gate will write them again.
        #[arg(long)]
        reinventory: bool,
        /// Print JSON, as `erase --json`.
        #[arg(long)]
        json: bool,
    },
    /// After a store was restored from a backup: replay into it every erasure the journal
    /// completed (since the backup's time), verify each scope clean, and sign a report.
    #[command(
        after_help = "A restore must never bring an erased person back. Before the restored store
serves a business read, run this for its target (as the config names it, pointing
at the restored store). Until it has verified, the gate refuses leases and permits
for every replayed scope (runtimes get `fenced`), and a database guard installed in
the restored database refuses their writes. A memory-scope erasure replays its
tombstoned version. A run that was killed is simply run again: the fences stay
closed until a run verifies. The signed report (counts per scope hash, no
identifier) is written to the certificates folder as RECOVERY_ID.json and checks
with `lethe certificate verify`.

Examples:
  lethe recovery --target checkpoints --since 2026-12-01T02:00:00Z
  lethe recovery --target cache --json"
    )]
    Recovery {
        /// The restored store's target.
        #[arg(long)]
        target: String,
        /// The backup's time (RFC 3339, or a date for its midnight UTC): erasures completed
        /// since then are replayed. Without it, every completed erasure is.
        #[arg(long, value_parser = since_time)]
        since: Option<time::OffsetDateTime>,
        /// Print the signed report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the jobs other processes left unfinished (killed mid-job): with a PostgreSQL journal,
    /// each is claimed FOR UPDATE SKIP LOCKED, so several `lethe work` share them safely.
    Work {
        /// Seconds to wait for undrained permits.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
        drain_timeout: u64,
        /// Print JSON: a list in the `erase --json` shape.
        #[arg(long)]
        json: bool,
    },
    /// Serve the gate over HTTP for agent runtimes in other processes (leases, permits, the
    /// revocation stream) and jobs for operators. Needs `[serve]` with at least one
    /// `[[serve.token]]` in the config. Prints `Listening on http://ADDR` once bound; stops
    /// gracefully on Ctrl-C or SIGTERM. The API is described at GET /v1/openapi.json.
    Serve {
        /// Address to bind, overriding `serve.listen` (port 0 picks a free port).
        #[arg(long)]
        listen: Option<String>,
    },
    /// Show or verify a certificate.
    Certificate {
        #[command(subcommand)]
        command: CertificateCommand,
    },
    /// Erasure requests that another person approves: a requester records one with the day
    /// the person asked (the deadline counts from it); `lethe approve` starts its job.
    #[command(after_help = "Examples:
  export LETHE_TOKEN_FILE=~/.lethe/requester.token       # who you are: your token
  lethe request create --scope-file dsr-1.json --basis ccpa --ticket DSR-1 --received-at 2026-12-01
  lethe request list
  lethe request reject req-0123456789ab --reason duplicate
  lethe request intake pause                                # new requests refused; jobs go on

Who you are is the token in --token-file (or LETHE_TOKEN_FILE): one of [[serve.token]], whose
role must allow the command and whose name the journal records. The server's rules hold: the
token that made a request never approves it, and one without --identity-verified is not
approved.")]
    Request {
        #[command(subcommand)]
        command: RequestCommand,
    },
    /// Approve a pending request (never one your token made) and run its job to the end, as
    /// `erase` does; exit codes as `erase`'s.
    #[command(after_help = "Examples:
  lethe approve req-0123456789ab --token-file approver.token")]
    Approve {
        /// The request id (`req-` and 12 hex digits, as `lethe request list` shows it).
        request_id: String,
        /// The file holding your token (an `approver` or `admin` of [[serve.token]]).
        #[arg(long, env = "LETHE_TOKEN_FILE", value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Seconds to wait for undrained permits.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
        drain_timeout: u64,
        /// Print JSON, as `erase --json`.
        #[arg(long)]
        json: bool,
    },
    /// Legal holds: a held tenant or subject cannot be erased until the hold is released.
    #[command(after_help = "Examples:
  lethe hold add --tenant acme --subject u-42 --reason MATTER-7
  lethe hold list
  lethe hold release --tenant acme --subject u-42    # then `lethe resume JOB` for a held job")]
    Hold {
        #[command(subcommand)]
        command: HoldCommand,
    },
    /// Backup targets: artifacts kept past their retention, the jobs still waiting on their
    /// backups, and the final certificates of those that no longer wait.
    #[command(
        after_help = "An erasure cannot rewrite a backup: a backup target (kind backup-files or
backup-s3) is PENDING_EXPIRY on a job's certificate until the last artifact taken
before the job completed expires. Run `lethe backups check` daily (cron, a timer):
once every artifact a job waited for is deleted, it issues the job's final
certificate (same job id, backup_expiry_met, signed again; the first one is kept).

Examples:
  lethe backups check
  lethe backups check --json | jq '.waiting'"
    )]
    Backups {
        #[command(subcommand)]
        command: BackupsCommand,
    },
    /// Crypto-shredding's key material: where it lives and how much of it there is.
    #[command(
        after_help = "With [keys] kek_file in the config, runtimes fetch each subject's data key
through the gate (POST /v1/keys, under a live lease) and write payloads encrypted
with it; erasing the subject destroys its wrapped key in one journaled step, and
every copy written under it (backups included) becomes unreadable.

Example:
  lethe keys inventory --json"
    )]
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Lineage: record that an artifact (a summary, a cache entry, a row) was derived from a
    /// subject's memories or from other artifacts, so an erasure of them reaches it.
    #[command(
        after_help = "The edge is one JSON object, as POST /v1/lineage takes it, read from a file or
standard input (identifiers stay out of the process list):

  {\"tenant\": \"acme\", \"subject\": \"alice\", \"target\": \"summaries\", \"locator\": \"s-17\",
   \"from\": [{\"memory_id\": \"m1\", \"version\": \"v3\"}],
   \"from_artifacts\": [{\"target\": \"summaries\", \"locator\": \"s-9\"}]}

`from` left out or empty (and no from_artifacts): derived from the subject's memory as a whole.
Refused while an erasure of the subject or tenant has its fence closed.

Example:
  lethe lineage add edge.json"
    )]
    Lineage {
        #[command(subcommand)]
        command: LineageCommand,
    },
    /// Check the journal's hash chain.
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
    /// The database guard: triggers in a LangGraph PostgreSQL database that refuse writes to
    /// erased threads and items, writes of a subject whose erasure is running, and writes
    /// carrying a stale lease epoch. Jobs keep it current once installed.
    Guard {
        #[command(subcommand)]
        command: GuardCommand,
    },
}

/// `lethe erase`'s arguments.
#[derive(ClapArgs, Debug)]
pub struct EraseArgs {
    #[command(flatten)]
    pub scope: ScopeArgs,
    /// Legal basis.
    #[arg(long, value_parser = ["gdpr-art17", "ccpa", "account-closure", "tenant-offboarding"])]
    pub basis: String,
    /// The privacy ticket this erasure answers (e.g. DSR-1234; at most 256 bytes).
    #[arg(long)]
    pub ticket: String,
    /// Deadline, YYYY-MM-DD. Default: the basis's (GDPR one month from today, CCPA 45
    /// days, others 30 days). Past that needs --extension-reason.
    #[arg(long)]
    pub deadline: Option<String>,
    /// Why the deadline is extended (GDPR: up to two more months; CCPA: 45 more days).
    #[arg(long)]
    pub extension_reason: Option<String>,
    /// Seconds to wait for agent work that held permits before the freeze to finish.
    /// Work that does not drain leaves the job BLOCKED (undrained), never COMPLETE.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub drain_timeout: u64,
    /// Print JSON: {"job_id", "continued", "state", "blocked_reason", "blocked_target",
    /// "certificate"}; with --batch, an array of those, one per line of the file, each with
    /// its "line" (and "error" instead for a scope that failed outside its job).
    #[arg(long)]
    pub json: bool,
    /// Erase a backlog: one scope per line of FILE ("-": standard input), each a JSON object as
    /// --scope-file reads it ({"tenant": "acme", "subject": "u-42"}, with "memory" and
    /// "version" for one memory; blank lines skipped). Each scope is its own job, with its own
    /// journal entries and certificate, under the same --basis, --ticket and deadline; the
    /// file is read and every scope checked before anything is touched. One scope's BLOCKED
    /// job leaves the others to run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tenant", "subject", "memory", "version", "scope_file"])]
    pub batch: Option<PathBuf>,
}

/// `lethe guard ...`
#[derive(Subcommand, Debug)]
pub enum GuardCommand {
    /// Install (or upgrade) the guard into the target's database: schema `lethe_guard` and one
    /// trigger per LangGraph table of the target. Safe to run twice.
    Install {
        /// The target (kind langgraph-postgres-checkpointer or langgraph-postgres-store).
        #[arg(long)]
        target: String,
        /// Print JSON (the status after the install).
        #[arg(long)]
        json: bool,
    },
    /// Remove the target's triggers, and schema `lethe_guard` once no target uses it. Refused
    /// while an erasure is running.
    Uninstall {
        /// The target.
        #[arg(long)]
        target: String,
        /// Print JSON (the status after the uninstall).
        #[arg(long)]
        json: bool,
    },
    /// Whether the guard is installed, its version, and counts (fenced subjects, erased threads
    /// and items). Never an identifier.
    Status {
        /// One target (default: every target whose kind has a guard).
        #[arg(long)]
        target: Option<String>,
        /// Print JSON: {NAME: {"installed", "version", "triggers", ...}}.
        #[arg(long)]
        json: bool,
    },
}

/// The scope of a request. --tenant alone is the whole tenant; with --subject, one person;
/// with --memory, one memory of that person. Or all of them from --scope-file.
#[derive(ClapArgs, Debug, Clone)]
pub struct ScopeArgs {
    /// The tenant's stable id.
    #[arg(long, required_unless_present = "scope_file")]
    pub tenant: Option<String>,
    /// The person's stable id (never a name or e-mail). Omit it to address the whole tenant.
    #[arg(long)]
    pub subject: Option<String>,
    /// One memory's id (for a LangGraph store: namespace suffix and key, e.g. memories/k42).
    #[arg(long, requires = "subject")]
    pub memory: Option<String>,
    /// The memory's version: for a LangGraph store its updated_at in UTC with microseconds,
    /// YYYY-MM-DDTHH:MM:SS.ffffffZ. For erase, default: the one current at the freeze; for
    /// inventory and verify, default: whatever version the store holds.
    #[arg(long, requires = "memory")]
    pub version: Option<String>,
    /// Read the scope from a file instead ("-": standard input), as JSON: {"tenant": "acme",
    /// "subject": "u-42"}, with "memory" and "version" for one memory. Keeps the person's
    /// identifiers out of the process list and the shell's history; JSON also shows every
    /// space and character of an identifier exactly.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tenant", "subject", "memory", "version"])]
    pub scope_file: Option<PathBuf>,
}

/// `lethe job ...`
#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Show one job: state, per-target progress, certificate path.
    Show {
        /// The job id (`del-` and hex, as `lethe jobs` lists it).
        #[arg(value_parser = job_id)]
        job_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `lethe backups ...`
#[derive(Subcommand, Debug)]
pub enum BackupsCommand {
    /// List every backup target's artifacts and those kept past their retention (exit 1 if
    /// any), the jobs still waiting on backups, and issue the final certificate of each job
    /// that no longer waits.
    Check {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `lethe keys ...`
#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Where key material lives: the key-encryption key, the wrapped data keys in the control
    /// store (and so in its backups), runtime caches and their lifetime, the targets written
    /// encrypted. Counts only, never a key or an identifier.
    Inventory {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `lethe lineage ...`
#[derive(Subcommand, Debug)]
pub enum LineageCommand {
    /// Record one edge, read as JSON from FILE ("-": standard input).
    Add {
        /// The edge's file.
        file: PathBuf,
    },
}

/// Certificate output formats.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum CertFormat {
    /// The signed JSON document.
    Json,
    /// A Markdown summary for a DPO.
    Md,
}

/// `lethe certificate ...`
#[derive(Subcommand, Debug)]
pub enum CertificateCommand {
    /// Print a completed job's certificate.
    Show {
        /// The job id (`del-` and hex, as `lethe jobs` lists it).
        #[arg(value_parser = job_id)]
        job_id: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "json")]
        format: CertFormat,
        /// The certificate issued at completion, even when a final one (issued once the job's
        /// backups expired) replaced it.
        #[arg(long)]
        first: bool,
    },
    /// Verify a certificate file's signature offline; with --tenant/--subject also check it is
    /// for that scope (needs the deployment key, to recompute the keyed hash).
    Verify {
        /// The certificate file.
        file: PathBuf,
        /// Trust this public key (ed25519:<hex> or <hex>) instead of the deployment key's.
        #[arg(long)]
        public_key: Option<String>,
        /// The tenant the certificate should cover.
        #[arg(long)]
        tenant: Option<String>,
        /// The subject the certificate should cover.
        #[arg(long, requires = "tenant")]
        subject: Option<String>,
        /// The memory the certificate should cover.
        #[arg(long, requires = "subject")]
        memory: Option<String>,
        /// The memory version the job froze (`frozen_version` in `job show --json`): a memory
        /// certificate's hash always binds it, whether the request named it or not.
        #[arg(long, requires = "memory")]
        version: Option<String>,
        /// The scope to check against, from a file instead ("-": standard input), as
        /// `erase --scope-file` reads it.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["tenant", "subject", "memory", "version", "public_key"])]
        scope_file: Option<PathBuf>,
    },
}

/// `lethe hold ...`
#[derive(Subcommand, Debug)]
pub enum HoldCommand {
    /// Place a hold on a tenant, or on one subject.
    Add {
        /// The tenant.
        #[arg(long, required_unless_present = "scope_file")]
        tenant: Option<String>,
        /// The subject (omit to hold the whole tenant).
        #[arg(long)]
        subject: Option<String>,
        /// Read the tenant and subject from a file instead ("-": standard input), as JSON:
        /// {"tenant": "acme", "subject": "u-42"}, as `erase --scope-file`.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["tenant", "subject"])]
        scope_file: Option<PathBuf>,
        /// Why (e.g. the matter number). Do not put personal data here.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Release the holds on exactly this tenant (and subject).
    Release {
        /// The tenant.
        #[arg(long, required_unless_present = "scope_file")]
        tenant: Option<String>,
        /// The subject.
        #[arg(long)]
        subject: Option<String>,
        /// Read the tenant and subject from a file instead ("-": standard input), as JSON.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["tenant", "subject"])]
        scope_file: Option<PathBuf>,
    },
    /// List active holds.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `lethe request ...`
#[derive(Subcommand, Debug)]
pub enum RequestCommand {
    /// Record a request (PENDING): nothing is erased until another token approves it.
    Create {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Legal basis.
        #[arg(long, value_parser = ["gdpr-art17", "ccpa", "account-closure", "tenant-offboarding"])]
        basis: String,
        /// The privacy ticket (e.g. DSR-1234; at most 256 bytes).
        #[arg(long)]
        ticket: String,
        /// When the person's request was received: RFC 3339 (2026-12-01T09:30:00Z) or a day
        /// (2026-12-01); not in the future. The deadline counts from it: GDPR one month, CCPA
        /// 45 days.
        #[arg(long)]
        received_at: String,
        /// The person's identity was verified (a request without it cannot be approved).
        #[arg(long)]
        identity_verified: bool,
        /// An extended deadline, YYYY-MM-DD (GDPR up to two more months, CCPA 45 more days),
        /// with --extension-reason.
        #[arg(long, requires = "extension_reason")]
        deadline: Option<String>,
        /// Why the deadline is extended.
        #[arg(long)]
        extension_reason: Option<String>,
        /// The file holding your token (a `requester` or `admin` of [[serve.token]]).
        #[arg(long, env = "LETHE_TOKEN_FILE", value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Print JSON: {"request_id", "deadline", "state"}.
        #[arg(long)]
        json: bool,
    },
    /// List requests, newest first: state, deadline, days left, who asked and decided. Never
    /// an identifier.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reject a pending request, with a reason.
    Reject {
        /// The request id.
        request_id: String,
        /// Why (journaled; no personal data).
        #[arg(long)]
        reason: String,
        /// The file holding your token (an `approver` or `admin`).
        #[arg(long, env = "LETHE_TOKEN_FILE", value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// Pause or resume the intake of new requests (jobs in flight go on).
    Intake {
        /// `pause` or `resume`.
        #[arg(value_parser = ["pause", "resume"])]
        switch: String,
        /// The file holding your token (an `admin`).
        #[arg(long, env = "LETHE_TOKEN_FILE", value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
}

/// `lethe journal ...`
#[derive(Subcommand, Debug)]
pub enum JournalCommand {
    /// Walk the hash chain, replay every job and check the chain's seals under the deployment's
    /// public key; exit 1 if an entry was edited, reordered or removed, or rewritten after a
    /// seal signed it (even with every hash after it recomputed).
    ///
    /// Each job's completion seals the chain (signs its head with the deployment key, the
    /// certificates' key); `--seal` seals the verified head now (a journal from before seals,
    /// or before a backup of the control store).
    Verify {
        /// Print JSON: intact, entries, jobs, problems, sealed (the latest valid seal:
        /// {"entry", "covers"}, or null), sealed_now.
        #[arg(long)]
        json: bool,
        /// After verifying an intact chain, seal it: sign its head with the deployment key.
        #[arg(long, conflicts_with = "public_key")]
        seal: bool,
        /// Check the seals under this public key (ed25519:<hex>, as certificates'
        /// `signed_by`) instead of the deployment key's: for an auditor with the config's
        /// journal but not the key file.
        #[arg(long, value_name = "KEY")]
        public_key: Option<String>,
    },
}

/// A job id as Lethe makes them (`del-` and up to 64 letters or digits). Anything else is
/// refused before it is looked up, and never repeated in a message (it may hold escape
/// sequences, or be pasted from somewhere else).
fn job_id(s: &str) -> Result<String, String> {
    let ok = s.strip_prefix("del-").is_some_and(|rest| {
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if ok {
        Ok(s.to_string())
    } else {
        Err("not a job id: `lethe jobs` lists them (del- and hex)".into())
    }
}

/// `--since`: an RFC 3339 time, or a date (its midnight, UTC).
fn since_time(s: &str) -> Result<time::OffsetDateTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t);
    }
    time::Date::parse(
        s,
        &time::macros::format_description!("[year]-[month]-[day]"),
    )
    .map(|d| d.midnight().assume_utc())
    .map_err(|_| {
        "give the backup's time as RFC 3339 (2026-12-01T02:00:00Z) or a date (2026-12-01)".into()
    })
}

#[cfg(test)]
mod tests {
    use super::Args;
    use clap::{CommandFactory, Parser};

    /// Every example a `--help` shows is a command line Lethe accepts: help that teaches a
    /// command the parser refuses would be worse than none.
    #[test]
    fn every_help_example_parses() {
        fn walk(cmd: &mut clap::Command, path: &mut Vec<String>, found: &mut Vec<String>) {
            let help = cmd.render_help().to_string();
            if let Some((_, examples)) = help.split_once("Examples:") {
                for line in examples.lines().map(str::trim) {
                    // `lethe a; lethe b` is two commands; a `# comment` is not part of one.
                    let line = line.split(" #").next().unwrap_or_default();
                    for one in line.split([';', '|']).map(str::trim) {
                        if one.starts_with("lethe ") {
                            found.push(one.to_string());
                        }
                    }
                }
            }
            for sub in cmd.get_subcommands_mut() {
                path.push(sub.get_name().to_string());
                walk(sub, path, found);
                path.pop();
            }
        }
        let mut found = Vec::new();
        walk(&mut Args::command(), &mut Vec::new(), &mut found);
        assert!(found.len() >= 15, "{found:?}");
        for example in &found {
            let words = example
                .replace("del-...", "del-3f2a9c")
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>();
            if let Err(e) = Args::try_parse_from(&words) {
                panic!("`{example}` does not parse: {e}");
            }
        }
    }
}
