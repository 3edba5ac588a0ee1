//! The adapter contract, the closed registry of adapter kinds, and one module per store kind.
//!
//! Start with [`Adapter`]: every store kind answers `describe`, `inventory`, `erase_batch` and
//! `verify`, exactly for a frozen [`Scope`], with counts and opaque locators, never content.
//! [`registry`] builds adapters from `[[target]]` config tables; [`conformance`] is the suite
//! every adapter must pass.
//!
//! What this crate is not: the job runner. It never journals, never decides a job's state,
//! and never sees more than one target at a time. The engine drives it.

mod backup;
pub mod conformance;
/// Test plumbing of the contract doubles (feature `test-doubles`, for other crates' tests).
#[cfg(any(test, feature = "test-doubles"))]
#[allow(missing_docs)]
pub mod doubles;
pub mod guard;
mod langgraph;
mod namespace;
mod postgres;
mod postgres_guard;
pub mod registry;
mod sql;
mod sqlite;

/// The closed table of adapter kinds; [`kinds!`] makes the rest of it.
///
/// A kind is one folder `src/<module>/` (its `mod.rs` exposes `Config` with
/// `Config::parse(toml::Table, &Path) -> Result<Config, String>` and
/// `Config::build(self, name: &str) -> impl Adapter`) and one line here: its variant, the kind
/// string config names it by, its module, and the asset classes it can honestly claim.
macro_rules! kinds {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, $module:ident, $classes:expr; )+) => {
        $( pub mod $module; )+

        /// Every adapter kind Lethe has.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Kind {
            $( $(#[doc = $doc])* $variant, )+
        }

        impl Kind {
            /// Every kind, for help and error messages.
            pub const ALL: &'static [Kind] = &[$( Kind::$variant ),+];

            /// The kind string config uses.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Kind::$variant => $name, )+
                }
            }

            /// The asset classes a target of this kind may be configured as: what its store
            /// can honestly be said to hold.
            pub fn classes(self) -> &'static [&'static str] {
                match self {
                    $( Kind::$variant => $classes, )+
                }
            }

            /// Parses a target's kind-specific keys and builds its adapter. Touches no store.
            pub(crate) fn build(
                self,
                table: toml::Table,
                base: &std::path::Path,
                name: &str,
            ) -> Result<Box<dyn Adapter>, String> {
                Ok(match self {
                    $( Kind::$variant => Box::new($module::Config::parse(table, base)?.build(name)), )+
                })
            }
        }
    };
}

/// Classes a store of agent state can be: the memory itself, or a copy derived from it.
const STATE: &[&str] = &["primary", "projection", "summary", "prompt-snapshot"];
/// [`STATE`], and the vectors a LangGraph store indexes its items by.
const STORE: &[&str] = &[
    "primary",
    "projection",
    "summary",
    "prompt-snapshot",
    "vector-index",
];
/// A key-value server: agent state, a cache, a queue, or an index kept in keys.
const KEYS: &[&str] = &[
    "primary",
    "projection",
    "summary",
    "prompt-snapshot",
    "cache",
    "queue",
    "vector-index",
    "keyword-index",
];

/// A table of the application's own database can hold any copy an application keeps in rows;
/// not a vendor's copy, a backup or a key, which live outside the table and go otherwise.
const TABLE: &[&str] = &[
    "primary",
    "projection",
    "summary",
    "prompt-snapshot",
    "vector-index",
    "keyword-index",
    "cache",
    "queue",
    "export",
    "analytics",
    "trace",
];
/// A vector database's collection: the index itself, or the memories an application keeps
/// there as documents (its primary store, or copies and summaries of it).
const VECTORS: &[&str] = &["vector-index", "primary", "projection", "summary"];

/// A search index: its keyword (full-text) and vector fields, often both in one index, over
/// documents an application writes there (its memories themselves, or chunks and summaries of
/// them).
const SEARCH: &[&str] = &[
    "keyword-index",
    "vector-index",
    "primary",
    "projection",
    "summary",
];

kinds! {
    /// LangGraph `SqliteSaver` tables: `checkpoints`, `writes`.
    LanggraphSqliteCheckpointer = "langgraph-sqlite-checkpointer", langgraph_sqlite_checkpointer, STATE;
    /// LangGraph `SqliteStore` tables: `store`, `store_vectors`.
    LanggraphSqliteStore = "langgraph-sqlite-store", langgraph_sqlite_store, STORE;
    /// LangGraph `PostgresSaver` tables: `checkpoints`, `checkpoint_blobs`, `checkpoint_writes`.
    LanggraphPostgresCheckpointer = "langgraph-postgres-checkpointer", langgraph_postgres_checkpointer, STATE;
    /// LangGraph `PostgresStore` tables: `store`, `store_vectors`.
    LanggraphPostgresStore = "langgraph-postgres-store", langgraph_postgres_store, STORE;
    /// Keys on a Redis server or every primary of a Redis Cluster.
    Redis = "redis", redis, KEYS;
    /// LangGraph's `RedisCache` node cache (`langgraph:cache:*`), with Lethe's subject index.
    LanggraphRedisCache = "langgraph-redis-cache", langgraph_redis_cache, &["cache"];
    /// Any table in PostgreSQL or SQLite, through declared statements.
    Sql = "sql", sql_target, TABLE;
    /// A vendor's HTTP API, through request templates (locate, erase, status, get).
    Http = "http", http, &["vendor", "export", "analytics", "trace"];
    /// A Chroma collection (REST API v2): documents, their metadata and their vectors.
    Chroma = "chroma", chroma, VECTORS;
    /// An Arize Phoenix project's traces (OpenInference spans), erased whole by trace id.
    Phoenix = "phoenix", phoenix, &["trace"];
    /// An Azure AI Search index (REST API): documents found by OData filter, deleted by key.
    AzureAiSearch = "azure-ai-search", azure_ai_search, SEARCH;
    /// A folder of backup artifacts (dumps, RDB files, copies): pending their expiry.
    BackupFiles = "backup-files", backup_files, &["backup"];
    /// An OpenSearch or Elasticsearch index: documents found by `term` filters on keyword
    /// fields, deleted by `_delete_by_query` of their ids, run as a task.
    Opensearch = "opensearch", opensearch, SEARCH;
    /// A Qdrant collection: points found by payload `match` filters, deleted by filter with
    /// `wait=true`, verified by exact count.
    Qdrant = "qdrant", qdrant, VECTORS;
    /// LangSmith traces: runs matched by their metadata, traces deleted whole, verified by
    /// reading back.
    Langsmith = "langsmith", langsmith, &["trace"];
    /// Backup artifacts as objects in an S3 bucket under a prefix: pending their expiry.
    BackupS3 = "backup-s3", backup_s3, &["backup"];
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The anomaly guard, one rule for every adapter: an erase step that deleted more than the
/// frozen inventory allows for it fails with [`AdapterError::AnomalousVolume`]. Each adapter
/// calls it before it commits the step (dropping the transaction rolls it back); the engine
/// then blocks the job (`anomalous_volume`). That is how a scope wider than its inventory is
/// caught before it spreads.
pub(crate) fn within_inventory(
    target: &str,
    expected: u64,
    found: u64,
) -> Result<(), AdapterError> {
    if found > expected {
        return Err(AdapterError::AnomalousVolume {
            target: target.to_string(),
            expected,
            found,
        });
    }
    Ok(())
}

use lethe_core::{Scope, Version};

/// Whether a record (a document, a span) carries `scope` exactly: `value(field)` is the record's
/// string under a field, and each identifier the scope names must equal it byte for byte under
/// its field: `tenant`, `subject`, and `memory` where the record has a memory field (without
/// one, the caller matches the memory some other way, or the scope is exempt).
pub(crate) fn carries<'v>(
    value: impl Fn(&str) -> Option<&'v str>,
    tenant: &str,
    subject: &str,
    memory: Option<&str>,
    scope: &Scope,
) -> bool {
    let is = |field: &str, want: &str| value(field) == Some(want);
    match scope {
        Scope::Tenant { tenant: t } => is(tenant, t.as_str()),
        Scope::Subject {
            tenant: t,
            subject: s,
        } => is(tenant, t.as_str()) && is(subject, s.as_str()),
        Scope::Memory {
            tenant: t,
            subject: s,
            memory: m,
            ..
        } => {
            is(tenant, t.as_str())
                && is(subject, s.as_str())
                && memory.is_none_or(|field| is(field, m.as_str()))
        }
    }
}

pub use backup::Artifact;
pub use guard::{Fence, Guard, GuardStatus};
pub use postgres_guard::VERSION as GUARD_VERSION;
pub use registry::{build, Target, TargetConfigError};

/// What an adapter says about itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Description {
    /// The adapter kind.
    pub kind: Kind,
    /// The adapter's version: changes when what it erases or how it counts changes.
    pub version: &'static str,
    /// What it can do: scope kinds it expresses, hidden rows it counts.
    pub capabilities: Vec<&'static str>,
}

/// Whether a target holds anything a scope can name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applicability {
    /// The target erases this scope.
    Applies,
    /// The target holds nothing this kind of scope names; the reason goes on the certificate.
    Exempt(String),
}

/// What a target's certificate line says beyond its count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Entries left to expire by themselves: the target is `PENDING_EXPIRY` until this date.
    pub expires: Option<time::Date>,
    /// Entries no lineage ties to a subject: the policy applied (`flush`, `expire`) and how
    /// many there were.
    pub legacy: Option<(&'static str, u64)>,
}

/// What a target's own files (its `path`) still hold of what its erase removed through the
/// store's API: a count, and what the store offers against it. Never an identifier or content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    /// How much of the erased data the files still hold, counted as the kind counts it (Chroma:
    /// rows of `chroma.sqlite3` that name an erased document; Phoenix: occurrences of an erased
    /// trace id's bytes in `phoenix.db` and its `-wal`). 0: nothing found.
    pub residue: u64,
    /// What the store itself offers against what is left, in words.
    pub remedy: &'static str,
}

/// An opaque locator and the number of rows it accounts for.
pub type Locator = (String, u64);

/// A target's inventory for a scope: counts and locators, never content.
///
/// A locator is an opaque string the adapter alone interprets (a thread id, a store key). Each
/// carries the number of rows it accounts for, which is the most its erase may delete. The
/// engine erases locators in their sorted order, so adapters name them so that sorting puts
/// what must go last (a thread registry) last.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Rows in scope, hidden rows included.
    pub count: u64,
    /// Locators and the rows each accounts for, sorted.
    pub locators: Vec<(String, u64)>,
}

/// Counts only: a locator holds identifiers (a thread id, a namespace), and a `{:?}` in a log
/// line or a panic message must not print them.
impl std::fmt::Debug for Inventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("count", &self.count)
            .field("locators", &self.locators.len())
            .finish_non_exhaustive()
    }
}

impl Inventory {
    /// Builds an inventory from locators, sorting them and summing the count.
    pub fn from_locators(mut locators: Vec<(String, u64)>) -> Self {
        locators.sort();
        locators.dedup();
        Self {
            count: locators.iter().map(|(_, n)| n).sum(),
            locators,
        }
    }
}

/// Adapter errors. Messages name the target and never an identifier or content.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// The target's key layout cannot express the scope exactly. Refused before anything is
    /// touched (exit 2).
    #[error("target {target} cannot express this scope: {why}")]
    Inexpressible {
        /// Target name.
        target: String,
        /// What to fix.
        why: String,
    },
    /// The store is unreachable or busy: worth retrying. The job goes BLOCKED.
    #[error("target {target} is unavailable: {why}")]
    Unavailable {
        /// Target name.
        target: String,
        /// The driver's message.
        why: String,
    },
    /// Erasing a batch would delete more rows than its frozen inventory. Nothing of the batch
    /// was committed.
    #[error("target {target} would erase {found} rows where the frozen inventory holds {expected}: stopped, nothing of this batch committed")]
    AnomalousVolume {
        /// Target name.
        target: String,
        /// Rows the inventory allows for the batch.
        expected: u64,
        /// Rows the delete found.
        found: u64,
    },
    /// The store refused a write because it is read-only (the file, the database, a replica,
    /// the user's grants): not worth retrying as it is, but an operator who makes it writable
    /// resumes the job.
    #[error("target {target} is read-only: {why}; make it writable (the file's mode, the database's or the server's read-only setting), then resume the job")]
    ReadOnly {
        /// Target name.
        target: String,
        /// The driver's message.
        why: String,
    },
    /// A derived store holds entries no lineage ties to any subject, and the target's `legacy`
    /// setting is `refuse` (or `expire`, for entries that never expire). Nothing was touched.
    #[error("target {target} holds {count} derived entries that no lineage ties to a subject (legacy entries, written without Lethe's index): its `legacy` setting {why}. Set `legacy = \"flush\"` (erase every legacy entry: a cache is recomputable) or `legacy = \"expire\"` (wait for their TTL), then resume the job")]
    LegacyDerived {
        /// Target name.
        target: String,
        /// Legacy entries found.
        count: u64,
        /// Which setting refused, in words.
        why: String,
    },
    /// The store is not what the adapter expects (missing table, wrong schema): retrying will
    /// not help.
    #[error("target {target}: {why}")]
    Failed {
        /// Target name.
        target: String,
        /// What is wrong.
        why: String,
    },
}

impl AdapterError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, AdapterError::Unavailable { .. })
    }

    /// A stable code for the journal and the certificate.
    pub fn code(&self) -> &'static str {
        match self {
            AdapterError::Inexpressible { .. } => "inexpressible",
            AdapterError::Unavailable { .. } => "unavailable",
            AdapterError::ReadOnly { .. } => "read_only",
            AdapterError::AnomalousVolume { .. } => "anomalous_volume",
            AdapterError::LegacyDerived { .. } => "legacy_derived",
            AdapterError::Failed { .. } => "failed",
        }
    }
}

/// One store kind's erasure logic. Implementations are read-only outside `erase_batch`.
pub trait Adapter: Send + Sync {
    /// Kind, version, capabilities.
    fn describe(&self) -> Description;

    /// Decides, touching nothing, whether the scope applies and can be expressed exactly.
    /// Errors with [`AdapterError::Inexpressible`] when an identifier cannot be matched
    /// exactly by the target's layout.
    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError>;

    /// Checks the store is reachable and has the expected schema. Read-only.
    fn probe(&self) -> Result<(), AdapterError>;

    /// Where the target's data is, for a job to notice its configuration now points elsewhere
    /// (another database, file or key layout) than when it froze the inventory: the database
    /// and schema, the file, the Redis database and pattern. Not the host, which a failover may
    /// change. Kept in the journal only as a keyed digest.
    fn place(&self) -> String {
        String::new()
    }

    /// The local files the target reads and erases in (a SQLite database, its registry's),
    /// the target's own first: what a journal must not share.
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// What two targets of this kind on the same file must not share, or they would inventory
    /// and certify the same rows (a tenant scope included): for a store, the literal labels
    /// before the tenant; a checkpointer's threads are all one table's. `None`: no such check.
    fn overlap_key(&self) -> Option<String> {
        None
    }

    /// For a memory scope without an explicit version: the version current now, if this
    /// target holds the memory.
    fn current_version(&self, _scope: &Scope) -> Result<Option<Version>, AdapterError> {
        Ok(None)
    }

    /// For a memory scope with an explicit version: `Err(what a version looks like here)` when
    /// this target names versions in a form `version` cannot have, so a mistyped `--version`
    /// is refused instead of matching nothing. Targets without versions accept any.
    fn check_version(&self, _version: &Version) -> Result<(), &'static str> {
        Ok(())
    }

    /// Counts what the target holds for the scope, hidden rows included. Read-only.
    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError>;

    /// As [`Adapter::inventory`], knowing the locators runtimes recorded by lineage for this
    /// target (every subject's, as recorded): a derived store whose other entries have no owner
    /// (a node cache's legacy entries) counts these as owned. The engine adds the scope's own
    /// among them afterwards ([`Adapter::artifact`]). Default: `inventory`.
    fn inventory_owned(
        &self,
        scope: &Scope,
        _recorded: &[String],
    ) -> Result<Inventory, AdapterError> {
        self.inventory(scope)
    }

    /// [`Adapter::inventory`] of many scopes at once (a batch's), in their order, where the
    /// store can serve them together: a Redis keyspace scan reads the keyspace once for every
    /// scope's pattern instead of once each. Each result is what `inventory` would give for its
    /// scope alone. Default: one `inventory` each.
    fn inventory_many(&self, scopes: &[Scope]) -> Vec<Result<Inventory, AdapterError>> {
        scopes.iter().map(|s| self.inventory(s)).collect()
    }

    /// [`Adapter::verify`] of many scopes at once, each with its frozen locators, in their
    /// order, as [`Adapter::inventory_many`]. Default: one `verify` each.
    fn verify_many(&self, work: &[(Scope, Vec<Locator>)]) -> Vec<Result<u64, AdapterError>> {
        work.iter().map(|(s, f)| self.verify(s, f)).collect()
    }

    /// Erases the rows of these frozen locators, in one transaction where the store has them.
    /// Deletes nothing outside the locators; if the deletes would remove more rows than the
    /// locators account for, rolls back and returns [`AdapterError::AnomalousVolume`].
    /// Idempotent: rows already gone count zero. Returns rows deleted.
    fn erase_batch(&self, scope: &Scope, batch: &[(String, u64)]) -> Result<u64, AdapterError>;

    /// [`Adapter::erase_batch`] of many jobs' batches at once (a batch's), in their order,
    /// where the store saves by it: one transaction for all of them, each job's rows still
    /// checked against its own inventory. A job whose batch would erase more than its
    /// inventory fails alone (its result is [`AdapterError::AnomalousVolume`]) and the others'
    /// go as they would alone. Default: one `erase_batch` each.
    fn erase_many(&self, work: &[(Scope, Vec<Locator>)]) -> Vec<Result<u64, AdapterError>> {
        work.iter().map(|(s, b)| self.erase_batch(s, b)).collect()
    }

    /// How many locators to hand `erase_batch` at once, if this target sets its own number
    /// instead of `control.batch_size` (a store without transactions, where a batch is only the
    /// unit of journaling and of the anomaly guard). `None`: the control's number.
    fn batch_size(&self) -> Option<usize> {
        None
    }

    /// Counts what is left for the scope, hidden rows included, plus anything left under the
    /// frozen locators. Read-only.
    fn verify(&self, scope: &Scope, frozen: &[(String, u64)]) -> Result<u64, AdapterError>;

    /// A second, independent count of what is left, where the adapter has one (for a Redis
    /// target in index mode: a scan of the keyspace, which finds keys the index never listed).
    /// `None`: this adapter's `verify` is already exhaustive. Read-only.
    fn audit(&self, _scope: &Scope) -> Result<Option<u64>, AdapterError> {
        Ok(None)
    }

    /// How the target ends on the certificate, read from its frozen inventory: erased
    /// (the default), or pending the expiry of what it left, and what it did with legacy
    /// entries. Pure: no store is read.
    fn settlement(&self, _frozen: &[(String, u64)]) -> Settlement {
        Settlement::default()
    }

    /// Looks in the store's own files (the target's `path`), read-only, for what the frozen
    /// locators name and the erase removed through the API: the physical residue, which the
    /// certificate reports beside the logical erase and `lethe verify --physical` re-checks.
    /// `None`: this kind has no such check, or the target has no `path`. Never writes.
    fn physical(&self, _frozen: &[Locator]) -> Result<Option<Physical>, AdapterError> {
        Ok(None)
    }

    /// Whether this kind takes lineage: artifacts a runtime records (`POST /v1/lineage`) as
    /// derived from a subject's memory, which an erasure of that memory then reaches. `false`
    /// (the default): this kind takes no lineage, and an edge naming a target of it is refused.
    fn takes_lineage(&self) -> bool {
        false
    }

    /// A recorded artifact, resolved for the scope: its frozen locator and the rows it accounts
    /// for now, or `None` when it no longer exists. Read-only. Only called where
    /// [`Adapter::takes_lineage`]; the default finds nothing.
    fn artifact(&self, _scope: &Scope, _locator: &str) -> Result<Option<Locator>, AdapterError> {
        Ok(None)
    }

    /// For a backup target: its artifacts as they stand now, each with when it was taken and
    /// when its retention ends. `None` (the default): not a backup. Read-only.
    fn backups(&self) -> Result<Option<Vec<Artifact>>, AdapterError> {
        Ok(None)
    }

    /// For a backup target: the targets whose data its artifacts hold (`covers`).
    fn covers(&self) -> &[String] {
        &[]
    }

    /// The store's database guard, where its kind has one (LangGraph on PostgreSQL): the sink
    /// side of the fence. `None`: this kind cannot refuse writes by itself.
    fn guard(&self) -> Option<&dyn guard::Guard> {
        None
    }
}

/// A checkpointer's `metadata` key that no checkpoint holds, although checkpoints exist.
pub(crate) fn missing_key(what: &str, key: &str) -> String {
    format!(
        "no checkpoint's metadata has the key `{key}` (metadata.{what}), so only the registry \
         finds threads: if the application does tag its runs, check the key's spelling against \
         the run config's metadata it writes"
    )
}

/// The form both LangGraph stores give a memory's version (its `updated_at` in UTC with
/// microseconds): `YYYY-MM-DDTHH:MM:SS.ffffffZ`, as the Python client's `item_version` writes it.
pub(crate) const UPDATED_AT_FORM: &str =
    "its updated_at in UTC with microseconds, YYYY-MM-DDTHH:MM:SS.ffffffZ \
     (for example 2026-12-04T09:30:00.123456Z)";

/// Whether `v` has the form [`UPDATED_AT_FORM`] describes, at a date and time that exist (no
/// 30 February, no second 60: the stores never write one).
pub(crate) fn is_updated_at_version(v: &str) -> bool {
    // `[year]` would also take a sign or a fifth digit: the length pins the form.
    v.len() == 27
        && v.is_ascii()
        && time::PrimitiveDateTime::parse(
            v,
            time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
            ),
        )
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::is_updated_at_version;

    /// `{:?}` of an inventory shows counts, never a locator (a thread id, a namespace).
    #[test]
    fn an_inventory_debug_shows_no_locator() {
        let inv = super::Inventory::from_locators(vec![("acme:alice:t1".into(), 3)]);
        let shown = format!("{inv:?}");
        assert!(
            !shown.contains("alice") && shown.contains("count: 3"),
            "{shown}"
        );
    }

    #[test]
    fn a_version_is_updated_at_in_utc_with_microseconds() {
        for ok in ["2026-12-04T09:30:00.123456Z", "1999-01-31T23:59:59.000000Z"] {
            assert!(is_updated_at_version(ok), "{ok}");
        }
        for bad in [
            "",
            "2026-12-04T09:30:00Z",
            "2026-12-04 09:30:00.123456Z",
            "2026-12-04T09:30:00.123456",
            "2026-12-04T09:30:00.123456+00:00",
            "2026-12-04T09:30:00.1234567Z",
            "2026-00-04T09:30:00.123456Z",
            "2026-12-32T09:30:00.123456Z",
            "2026-12-04T24:30:00.123456Z",
            "2026-12-04T09:60:00.123456Z",
            "2026-02-30T09:30:00.123456Z",
            "2026-12-04T09:30:60.000000Z",
            "2026-1２-04T09:30:00.123456Z",
            "+026-12-04T09:30:00.123456Z",
        ] {
            assert!(!is_updated_at_version(bad), "{bad}");
        }
    }
}
