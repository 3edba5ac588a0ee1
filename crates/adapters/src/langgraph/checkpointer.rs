//! A LangGraph checkpointer target, on either engine: which threads a scope owns, their rows,
//! and erasing them, written once over [`crate::sql`].
//!
//! Checkpointer tables have no owner column. A subject's threads come from the application's
//! thread registry (a table, possibly in another file or database), from keys inside
//! `checkpoints.metadata` (LangGraph copies the run config's metadata there), or both: both
//! means the union, so a thread missing from the registry is still found. A thread that another
//! owner also holds (in the metadata or the registry) is refused, not erased. The registry's
//! rows are erased last, after the threads they point to, so a crash never loses track of a
//! thread.
//!
//! Locators: `0:<thread_id>` for a thread's rows, `1:<thread_id>` for its registry rows;
//! sorted, the registry comes last. Memory scopes do not apply: threads are not addressed by
//! memory id.
//!
//! Not here: SQL text, messages that differ by engine, config keys. Those are the kind's
//! [`Dialect`] and `config.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use lethe_core::Scope;

use crate::guard::Guard;
use crate::postgres_guard::PgGuard;
use crate::sql::{text, Col, Db, Param, Session, Stmt};
use crate::{missing_key, Adapter, AdapterError, Applicability, Description, Inventory, Locator};

const THREAD: &str = "0:";
const REGISTRY: &str = "1:";

/// The application's thread registry: names as configured, quoted by the dialect.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    /// Where it lives; `None`: the checkpointer's own database.
    pub(crate) db: Option<Db>,
    pub(crate) table: String,
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) thread: String,
}

/// The owner keys in `checkpoints.metadata`, as configured.
#[derive(Debug, Clone)]
pub(crate) struct MetadataKeys {
    pub(crate) tenant: String,
    pub(crate) subject: String,
}

/// The owner of a scope, bound as parameters.
pub(crate) struct Owner<'a> {
    pub(crate) tenant: &'a str,
    /// `None` for a tenant scope.
    pub(crate) subject: Option<&'a str>,
}

/// What a checkpointer kind writes in its engine's SQL, and says in its own words.
///
/// Sets are thread ids ([`Param::Set`]). Parameters, in order: `registry_*` take (threads,)
/// tenant, subject; `metadata_threads` tenant, subject, tenant key, subject key, and the needle
/// if asked; `other_metadata_owners` threads, tenant, subject, tenant key, subject key.
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug {
    /// Kind, version and capabilities.
    fn describe(&self) -> Description;
    /// The schema as [`crate::Adapter::place`] shows it (unused by SQLite).
    fn place_schema(&self) -> &str;
    /// LangGraph's tables, as a probe looks them up and names them.
    fn tables(&self) -> Vec<String>;
    /// The same tables as configured names, for the hidden-effects check.
    fn delete_tables(&self) -> Vec<String>;
    /// The refusal for a missing table.
    fn missing_table(&self, db: &Db, table: &str) -> String;
    /// A metadata key as the metadata statements bind it.
    fn key_param(&self, key: &str) -> String;
    /// Rows of `checkpoints` whose metadata lacks a key (its parameter), while others exist.
    fn key_missing(&self) -> Stmt;
    /// (thread, registry rows) for the owner.
    fn registry_threads(&self, r: &Registry) -> Stmt;
    /// Threads whose checkpoints' metadata names the owner; whether it binds the needle (the
    /// subject, or the tenant for a tenant scope) last.
    fn metadata_threads(&self, needle: &str) -> (Stmt, bool);
    /// For a batch of subjects: (thread, tenant value, subject value) of every checkpoint
    /// whose metadata's subject key holds one of a set of subjects; parameters: the subjects,
    /// tenant key, subject key. The caller keeps only exact owners. `None`: the engine reads
    /// each subject alone.
    fn metadata_threads_many(&self) -> Option<Stmt> {
        None
    }
    /// (thread, rows) across LangGraph's tables.
    fn thread_rows(&self) -> Stmt;
    /// Deletes a set of threads' rows, one statement per table.
    fn delete_threads(&self) -> Vec<Stmt>;
    /// Checkpoints of the threads that name another owner: one count per run.
    fn other_metadata_owners(&self) -> Stmt;
    /// The refusal for `n` such checkpoints.
    fn other_metadata_owners_why(&self, n: u64) -> String;
    /// Threads the registry also assigns to another owner: one count per run.
    fn other_registry_owners(&self, r: &Registry) -> Stmt;
    /// Whether the registry's ownership is checked before the metadata's.
    fn registry_check_first(&self) -> bool;
    /// Deletes a set of threads' registry rows for the owner.
    fn delete_registry(&self, r: &Registry) -> Stmt;
    /// Checks the registry table has the configured columns.
    fn check_registry(
        &self,
        s: &mut Session<'_>,
        db: &Db,
        r: &Registry,
        target: &str,
    ) -> Result<(), AdapterError>;
}

/// A LangGraph checkpointer target.
#[derive(Debug)]
pub struct Checkpointer {
    name: String,
    db: Db,
    sql: Box<dyn Dialect>,
    registry: Option<Registry>,
    metadata: Option<MetadataKeys>,
    /// The database guard, where the engine has one.
    guard: Option<PgGuard>,
    /// PostgreSQL: what the certificate says of the dead row versions an erase leaves.
    dead_rows: Option<crate::postgres::DeadRows>,
}

/// A batch's locators, split by kind.
#[derive(Default)]
struct Split {
    threads: Vec<String>,
    expect_threads: u64,
    registry: Vec<String>,
    expect_registry: u64,
}

fn owner(scope: &Scope) -> Option<Owner<'_>> {
    match scope {
        Scope::Subject { tenant, subject } => Some(Owner {
            tenant: tenant.as_str(),
            subject: Some(subject.as_str()),
        }),
        Scope::Tenant { tenant } => Some(Owner {
            tenant: tenant.as_str(),
            subject: None,
        }),
        Scope::Memory { .. } => None,
    }
}

impl Checkpointer {
    pub(crate) fn new(
        name: &str,
        db: Db,
        sql: Box<dyn Dialect>,
        registry: Option<Registry>,
        metadata: Option<MetadataKeys>,
        guard: Option<PgGuard>,
    ) -> Self {
        Self {
            name: name.to_string(),
            db,
            sql,
            registry,
            metadata,
            guard,
            dead_rows: None,
        }
    }

    /// On PostgreSQL: reports (or vacuums, then reports) the dead row versions each erase
    /// leaves in LangGraph's tables, as the certificate's `physical` line.
    pub(crate) fn with_dead_rows(mut self, mode: Option<crate::postgres::DeadRows>) -> Self {
        self.dead_rows = mode;
        self
    }

    fn failed(&self, why: impl Into<String>) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why: why.into(),
        }
    }

    fn registry_db<'a>(&'a self, r: &'a Registry) -> &'a Db {
        r.db.as_ref().unwrap_or(&self.db)
    }

    /// Runs `f` on the registry: in `s` when it is the same database, else in a session of its
    /// own. `None` without a registry.
    fn on_registry<T>(
        &self,
        s: &mut Session<'_>,
        f: impl FnOnce(&mut Session<'_>, &Registry) -> Result<T, AdapterError>,
    ) -> Result<Option<T>, AdapterError> {
        let Some(r) = &self.registry else {
            return Ok(None);
        };
        let db = self.registry_db(r);
        if db.same(&self.db) {
            f(s, r).map(Some)
        } else {
            f(&mut db.session()?, r).map(Some)
        }
    }

    /// The registry's threads of the owner, with its rows per thread (none without a registry).
    fn registry_rows(
        &self,
        s: &mut Session<'_>,
        o: &Owner<'_>,
    ) -> Result<Vec<Locator>, AdapterError> {
        let owner = [Param::Text(Some(o.tenant)), Param::Text(o.subject)];
        Ok(self
            .on_registry(s, |rs, r| {
                let rows = rs.query(
                    &self.sql.registry_threads(r),
                    &owner,
                    &[Col::Text, Col::Int],
                )?;
                Ok(rows
                    .into_iter()
                    .map(|mut r| (r.string(0), r.count(1)))
                    .collect::<Vec<_>>())
            })?
            .unwrap_or_default())
    }

    /// Every thread in scope now: registry ∪ metadata, with the registry's rows per thread.
    fn resolve(
        &self,
        s: &mut Session<'_>,
        o: &Owner<'_>,
    ) -> Result<(BTreeSet<String>, Vec<Locator>), AdapterError> {
        let owner = [Param::Text(Some(o.tenant)), Param::Text(o.subject)];
        let registry = self.registry_rows(s, o)?;
        let mut threads: BTreeSet<String> = registry.iter().map(|(t, _)| t.clone()).collect();
        if let Some(m) = &self.metadata {
            // The needle is what a byte pre-filter may look for, where the dialect has one.
            let needle = o.subject.unwrap_or(o.tenant);
            let (stmt, binds_needle) = self.sql.metadata_threads(needle);
            let (tk, sk) = (
                self.sql.key_param(&m.tenant),
                self.sql.key_param(&m.subject),
            );
            let mut params = vec![owner[0], owner[1], text(&tk), text(&sk)];
            if binds_needle {
                params.push(text(needle));
            }
            s.each(&stmt, &params, &[Col::Text], |mut r| {
                threads.insert(r.string(0));
            })?;
        }
        Ok((threads, registry))
    }

    /// [`Checkpointer::resolve`] for a batch's subject scopes, the metadata read once for all
    /// of them (one statement, where the dialect has one): per scope, its threads and registry
    /// rows, or `None` for a scope the shared read does not serve (a tenant scope). `None`
    /// overall when there is nothing to share.
    #[allow(clippy::type_complexity)]
    fn resolve_many(
        &self,
        s: &mut Session<'_>,
        scopes: &[Scope],
    ) -> Result<Option<Vec<Option<(BTreeSet<String>, Vec<Locator>)>>>, AdapterError> {
        let (Some(m), Some(stmt)) = (&self.metadata, self.sql.metadata_threads_many()) else {
            return Ok(None);
        };
        let owners: Vec<Option<Owner<'_>>> = scopes
            .iter()
            .map(|sc| owner(sc).filter(|o| o.subject.is_some()))
            .collect();
        let subjects: Vec<String> = owners
            .iter()
            .flatten()
            .filter_map(|o| o.subject.map(str::to_owned))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if subjects.len() < 2 {
            return Ok(None);
        }
        // Exact owners only: (tenant, subject) as the metadata holds them, byte for byte.
        let mut by_owner: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        let (tk, sk) = (
            self.sql.key_param(&m.tenant),
            self.sql.key_param(&m.subject),
        );
        s.each(
            &stmt,
            &[Param::Set(&subjects), text(&tk), text(&sk)],
            &[Col::Text, Col::Text, Col::Text],
            |mut r| {
                let (thread, tenant, subject) = (r.string(0), r.string(1), r.string(2));
                by_owner
                    .entry((tenant, subject))
                    .or_default()
                    .insert(thread);
            },
        )?;
        let mut out = Vec::with_capacity(scopes.len());
        for o in owners {
            let Some(o) = o else {
                out.push(None);
                continue;
            };
            let registry = self.registry_rows(s, &o)?;
            let mut threads: BTreeSet<String> = registry.iter().map(|(t, _)| t.clone()).collect();
            let key = (
                o.tenant.to_string(),
                o.subject.unwrap_or_default().to_string(),
            );
            if let Some(found) = by_owner.get(&key) {
                threads.extend(found.iter().cloned());
            }
            out.push(Some((threads, registry)));
        }
        Ok(Some(out))
    }

    /// The inventories of a batch's scopes, the metadata and the rows read once for all the
    /// subject scopes (each checked for other owners alone, as `inventory` checks it). `None`:
    /// nothing to share.
    fn inventory_together(
        &self,
        scopes: &[Scope],
    ) -> Result<Option<Vec<Result<Inventory, AdapterError>>>, AdapterError> {
        let mut s = self.db.session()?;
        let Some(found) = self.resolve_many(&mut s, scopes)? else {
            return Ok(None);
        };
        let all: Vec<String> = found
            .iter()
            .flatten()
            .flat_map(|(t, _)| t.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let rows = self.thread_rows(&mut s, &all)?;
        let mut out = Vec::with_capacity(scopes.len());
        for (scope, f) in scopes.iter().zip(found) {
            let (Some((threads, registry)), Some(o)) = (f, owner(scope)) else {
                out.push(None);
                continue;
            };
            let threads: Vec<String> = threads.into_iter().collect();
            let checked = if self.sql.registry_check_first() {
                self.check_registry_owners(&mut s, &threads, &o)
                    .and_then(|()| self.check_metadata_owners(&mut s, &threads, &o))
            } else {
                self.check_metadata_owners(&mut s, &threads, &o)
                    .and_then(|()| self.check_registry_owners(&mut s, &threads, &o))
            };
            out.push(Some(checked.map(|()| {
                let mut locators: Vec<Locator> = threads
                    .iter()
                    .map(|t| (format!("{THREAD}{t}"), rows.get(t).copied().unwrap_or(0)))
                    .collect();
                locators.extend(
                    registry
                        .into_iter()
                        .map(|(t, n)| (format!("{REGISTRY}{t}"), n)),
                );
                Inventory::from_locators(locators)
            })));
        }
        drop(s);
        // The scopes the shared read did not serve, alone.
        Ok(Some(
            out.into_iter()
                .zip(scopes)
                .map(|(r, sc)| r.unwrap_or_else(|| self.inventory(sc)))
                .collect(),
        ))
    }

    /// The verifications of a batch's scopes, as [`Checkpointer::inventory_together`].
    fn verify_together(
        &self,
        work: &[(Scope, Vec<Locator>)],
    ) -> Result<Option<Vec<Result<u64, AdapterError>>>, AdapterError> {
        let scopes: Vec<Scope> = work.iter().map(|(s, _)| s.clone()).collect();
        let mut s = self.db.session()?;
        let Some(found) = self.resolve_many(&mut s, &scopes)? else {
            return Ok(None);
        };
        let mut per: Vec<Option<(BTreeSet<String>, u64)>> = Vec::with_capacity(work.len());
        for (f, (_, frozen)) in found.into_iter().zip(work) {
            per.push(f.map(|(mut threads, registry)| {
                threads.extend(
                    frozen
                        .iter()
                        .filter_map(|(l, _)| l.strip_prefix(THREAD).map(str::to_owned)),
                );
                (threads, registry.iter().map(|(_, n)| n).sum::<u64>())
            }));
        }
        let all: Vec<String> = per
            .iter()
            .flatten()
            .flat_map(|(t, _)| t.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let rows = self.thread_rows(&mut s, &all)?;
        drop(s);
        Ok(Some(
            per.into_iter()
                .zip(work)
                .map(|(p, (sc, frozen))| match p {
                    Some((threads, registry)) => Ok(threads
                        .iter()
                        .map(|t| rows.get(t).copied().unwrap_or(0))
                        .sum::<u64>()
                        + registry),
                    None => self.verify(sc, frozen),
                })
                .collect(),
        ))
    }

    /// Refuses threads whose checkpoints name another owner too: erasing them would erase
    /// someone else's rows.
    fn check_metadata_owners(
        &self,
        s: &mut Session<'_>,
        threads: &[String],
        o: &Owner<'_>,
    ) -> Result<(), AdapterError> {
        let Some(m) = &self.metadata else {
            return Ok(());
        };
        let (tk, sk) = (
            self.sql.key_param(&m.tenant),
            self.sql.key_param(&m.subject),
        );
        let params = [
            Param::Set(threads),
            text(o.tenant),
            Param::Text(o.subject),
            text(&tk),
            text(&sk),
        ];
        let stmt = self.sql.other_metadata_owners();
        for r in s.query(&stmt, &params, &[Col::Int])? {
            if r.count(0) > 0 {
                return Err(self.failed(self.sql.other_metadata_owners_why(r.count(0))));
            }
        }
        Ok(())
    }

    /// Refuses threads in scope that the registry also assigns to another owner: erasing
    /// them would erase that owner's threads.
    fn check_registry_owners(
        &self,
        s: &mut Session<'_>,
        threads: &[String],
        o: &Owner<'_>,
    ) -> Result<(), AdapterError> {
        if threads.is_empty() {
            return Ok(());
        }
        let params = [Param::Set(threads), text(o.tenant), Param::Text(o.subject)];
        self.on_registry(s, |rs, r| {
            for row in rs.query(&self.sql.other_registry_owners(r), &params, &[Col::Int])? {
                let n = row.count(0);
                if n > 0 {
                    return Err(self.failed(format!(
                        "threads in scope are also registered to another owner ({n} threads); \
                         erasing them would erase that owner's threads: resolve their ownership by hand"
                    )));
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Rows per thread across LangGraph's tables.
    fn thread_rows(
        &self,
        s: &mut Session<'_>,
        threads: &[String],
    ) -> Result<BTreeMap<String, u64>, AdapterError> {
        let mut out: BTreeMap<String, u64> = threads.iter().map(|t| (t.clone(), 0)).collect();
        let cols = [Col::Text, Col::Int];
        s.each(
            &self.sql.thread_rows(),
            &[Param::Set(threads)],
            &cols,
            |mut r| {
                *out.entry(r.string(0)).or_insert(0) += r.count(1);
            },
        )?;
        Ok(out)
    }

    /// A batch's locators: threads and registry rows, with the rows each accounts for.
    fn split(&self, batch: &[Locator]) -> Result<Split, AdapterError> {
        let mut b = Split::default();
        for (loc, n) in batch {
            if let Some(t) = loc.strip_prefix(THREAD) {
                b.threads.push(t.to_string());
                b.expect_threads += n;
            } else if let Some(t) = loc.strip_prefix(REGISTRY) {
                b.registry.push(t.to_string());
                b.expect_registry += n;
            } else {
                return Err(self.failed("unknown locator in the frozen inventory"));
            }
        }
        Ok(b)
    }

    /// Many jobs' batches: every job's threads in one transaction, then every job's registry
    /// rows in one, each job's own statements checked against its own inventory. Rows per job;
    /// `None` when a job would erase more than its inventory (that transaction rolled back).
    fn erase_together(
        &self,
        work: &[(Scope, Vec<Locator>)],
    ) -> Result<Option<Vec<u64>>, AdapterError> {
        let mut jobs: Vec<Option<(Owner<'_>, Split)>> = Vec::with_capacity(work.len());
        for (scope, batch) in work {
            jobs.push(match owner(scope) {
                Some(o) => Some((o, self.split(batch)?)),
                None => None,
            });
        }
        let mut rows = vec![0u64; work.len()];
        {
            let mut s = self.db.session()?;
            let mut tx = s.begin()?;
            for (i, (_, b)) in jobs
                .iter()
                .enumerate()
                .filter_map(|(i, j)| Some((i, j.as_ref()?)))
            {
                if b.threads.is_empty() {
                    continue;
                }
                let mut deleted = 0u64;
                for stmt in self.sql.delete_threads() {
                    deleted += tx.execute(&stmt, &[Param::Set(&b.threads)])?;
                }
                if crate::within_inventory(&self.name, b.expect_threads, deleted).is_err() {
                    return Ok(None);
                }
                rows[i] += deleted;
            }
            tx.commit()?;
        }
        let with_registry = jobs.iter().flatten().any(|(_, b)| !b.registry.is_empty());
        if with_registry {
            let Some(r) = &self.registry else {
                return Err(self.failed("registry locators but no registry configured"));
            };
            let mut s = self.registry_db(r).session()?;
            let mut tx = s.begin()?;
            for (i, (o, b)) in jobs
                .iter()
                .enumerate()
                .filter_map(|(i, j)| Some((i, j.as_ref()?)))
            {
                if b.registry.is_empty() {
                    continue;
                }
                let params = [
                    Param::Set(&b.registry),
                    text(o.tenant),
                    Param::Text(o.subject),
                ];
                let deleted = tx.execute(&self.sql.delete_registry(r), &params)?;
                if crate::within_inventory(&self.name, b.expect_registry, deleted).is_err() {
                    return Ok(None);
                }
                rows[i] += deleted;
            }
            tx.commit()?;
        }
        Ok(Some(rows))
    }

    /// Deletes the threads' rows in one transaction, within the inventory.
    fn erase_threads(&self, threads: &[String], expected: u64) -> Result<u64, AdapterError> {
        if threads.is_empty() {
            return Ok(0);
        }
        let mut s = self.db.session()?;
        let mut tx = s.begin()?;
        let mut deleted = 0u64;
        for stmt in self.sql.delete_threads() {
            deleted += tx.execute(&stmt, &[Param::Set(threads)])?;
        }
        // Dropping the transaction rolls the step back.
        crate::within_inventory(&self.name, expected, deleted)?;
        tx.commit()?;
        Ok(deleted)
    }

    /// Deletes the threads' registry rows for the owner in one transaction, within the
    /// inventory.
    fn erase_registry(
        &self,
        o: &Owner<'_>,
        threads: &[String],
        expected: u64,
    ) -> Result<u64, AdapterError> {
        if threads.is_empty() {
            return Ok(0);
        }
        let Some(r) = &self.registry else {
            return Err(self.failed("registry locators but no registry configured"));
        };
        let mut s = self.registry_db(r).session()?;
        let mut tx = s.begin()?;
        let params = [Param::Set(threads), text(o.tenant), Param::Text(o.subject)];
        let deleted = tx.execute(&self.sql.delete_registry(r), &params)?;
        // Dropping the transaction rolls the step back.
        crate::within_inventory(&self.name, expected, deleted)?;
        tx.commit()?;
        Ok(deleted)
    }

    /// Warns of a metadata key no checkpoint holds.
    fn warn_missing_keys(&self, s: &mut Session<'_>, m: &MetadataKeys) -> Result<(), AdapterError> {
        // A misspelt key matches no checkpoint, and every job would certify 0 for threads
        // only the metadata names: warned, not refused, since checkpoints none of which
        // holds the key may also be right (written before the application tagged its runs,
        // or the tagged ones all erased), and the registry still finds its threads.
        let stmt = self.sql.key_missing();
        for (what, key) in [("tenant", &m.tenant), ("subject", &m.subject)] {
            let param = self.sql.key_param(key);
            if s.one(&stmt, &[text(&param)], &[Col::Bool])?.bool(0) {
                tracing::warn!(target = %self.name, "{}", missing_key(what, key));
            }
        }
        Ok(())
    }
}

impl Adapter for Checkpointer {
    fn describe(&self) -> Description {
        self.sql.describe()
    }

    fn guard(&self) -> Option<&dyn Guard> {
        self.guard.as_ref().map(|g| g as &dyn Guard)
    }

    fn physical(&self, frozen: &[Locator]) -> Result<Option<crate::Physical>, AdapterError> {
        let Some(mode) = self.dead_rows else {
            return Ok(None);
        };
        let erased = frozen.iter().map(|(_, n)| n).sum();
        crate::postgres::dead_rows(&self.db, &self.sql.delete_tables(), erased, mode).map(Some)
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(match scope {
            Scope::Memory { .. } => Applicability::Exempt(
                "memory scope: checkpoint threads are not addressed by memory id".into(),
            ),
            // SQL parameters express any identifier exactly.
            Scope::Subject { .. } | Scope::Tenant { .. } => Applicability::Applies,
        })
    }

    fn overlap_key(&self) -> Option<String> {
        self.db.canonical_file().map(|p| p.display().to_string())
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self
            .db
            .file()
            .map(|p| p.to_path_buf())
            .into_iter()
            .collect();
        if let Some(r) = &self.registry {
            files.extend(r.db.as_ref().and_then(Db::file).map(|p| p.to_path_buf()));
        }
        files
    }

    fn place(&self) -> String {
        let mut place = self.db.place(self.sql.place_schema());
        // The registry's rows are inventoried too: where it is and its table are part of the
        // place.
        if let Some(r) = &self.registry {
            let at = self.registry_db(r).location();
            place.push_str(&format!(" registry:{at}:{}", r.table));
        }
        place
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let mut s = self.db.session()?;
        for t in self.sql.tables() {
            if !s.has_table(&t)? {
                return Err(self.failed(self.sql.missing_table(&self.db, &t)));
            }
        }
        let tables = self.sql.delete_tables();
        let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
        if let Some(why) = s.hidden_effects(&tables, &[])? {
            return Err(self.failed(why));
        }
        self.on_registry(&mut s, |rs, r| {
            // The registry's rows are erased too (last).
            if let Some(why) = rs.hidden_effects(&[r.table.as_str()], &[])? {
                return Err(self.failed(why));
            }
            self.sql
                .check_registry(rs, self.registry_db(r), r, &self.name)
        })?;
        if let Some(m) = &self.metadata {
            self.warn_missing_keys(&mut s, m)?;
        }
        Ok(())
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let Some(o) = owner(scope) else {
            return Ok(Inventory::default());
        };
        let mut s = self.db.session()?;
        let (threads, registry) = self.resolve(&mut s, &o)?;
        let threads: Vec<String> = threads.into_iter().collect();
        if self.sql.registry_check_first() {
            self.check_registry_owners(&mut s, &threads, &o)?;
            self.check_metadata_owners(&mut s, &threads, &o)?;
        } else {
            self.check_metadata_owners(&mut s, &threads, &o)?;
            self.check_registry_owners(&mut s, &threads, &o)?;
        }
        let mut locators: Vec<Locator> = self
            .thread_rows(&mut s, &threads)?
            .into_iter()
            .map(|(t, n)| (format!("{THREAD}{t}"), n))
            .collect();
        locators.extend(
            registry
                .into_iter()
                .map(|(t, n)| (format!("{REGISTRY}{t}"), n)),
        );
        Ok(Inventory::from_locators(locators))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let Some(o) = owner(scope) else { return Ok(0) };
        let b = self.split(batch)?;
        // Threads before their registry rows, whatever the batch boundaries.
        Ok(self.erase_threads(&b.threads, b.expect_threads)?
            + self.erase_registry(&o, &b.registry, b.expect_registry)?)
    }

    fn erase_many(&self, work: &[(Scope, Vec<Locator>)]) -> Vec<Result<u64, AdapterError>> {
        let alone = || work.iter().map(|(s, b)| self.erase_batch(s, b)).collect();
        match self.erase_together(work) {
            Ok(Some(rows)) => rows.into_iter().map(Ok).collect(),
            // A job over its inventory (rolled back), or the store failed: each alone, so
            // that only its own job fails, and the others go (threads already erased count 0).
            _ => alone(),
        }
    }

    fn inventory_many(&self, scopes: &[Scope]) -> Vec<Result<Inventory, AdapterError>> {
        match self.inventory_together(scopes) {
            Ok(Some(out)) => out,
            // No set statement in this engine, or the shared read failed: each alone (a store
            // that is down then fails each as it would have).
            _ => scopes.iter().map(|s| self.inventory(s)).collect(),
        }
    }

    fn verify_many(&self, work: &[(Scope, Vec<Locator>)]) -> Vec<Result<u64, AdapterError>> {
        match self.verify_together(work) {
            Ok(Some(out)) => out,
            _ => work.iter().map(|(s, f)| self.verify(s, f)).collect(),
        }
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let Some(o) = owner(scope) else { return Ok(0) };
        let mut s = self.db.session()?;
        let (mut threads, registry) = self.resolve(&mut s, &o)?;
        threads.extend(
            frozen
                .iter()
                .filter_map(|(l, _)| l.strip_prefix(THREAD).map(str::to_owned)),
        );
        let threads: Vec<String> = threads.into_iter().collect();
        let rows: u64 = self.thread_rows(&mut s, &threads)?.values().sum();
        Ok(rows + registry.iter().map(|(_, n)| n).sum::<u64>())
    }
}
