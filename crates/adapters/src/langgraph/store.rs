//! A LangGraph store target, on either engine: the items and vectors under a scope's
//! namespace (or one item, at one version), counted and erased, written once over
//! [`crate::sql`].
//!
//! Namespaces are matched label-exactly (see `namespace`): the prefix equals the scope's
//! namespace, or starts with it followed by `.`. No listing limit; rows past their TTL are
//! counted and erased (normal reads hide them; they are still on disk). An item's vectors are
//! counted on their own (an item LangGraph deleted leaves them behind) and deleted explicitly,
//! before the item, so every deleted row is counted whether or not the engine cascades.
//!
//! Memory scope: the memory id is `label/.../key`; the version is the item's `updated_at` in
//! UTC as `YYYY-MM-DDTHH:MM:SS.ffffffZ`. Locators: the JSON array `[prefix, key]`.
//!
//! Not here: SQL text and the engine's spelling of a namespace match; those are the kind's
//! [`Dialect`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use lethe_core::{Scope, Version};

use crate::guard::Guard;
use crate::namespace::{
    ambiguous, checked_items, locator, other_readings, parse_locator, selection, Label, Selection,
};
use crate::postgres_guard::PgGuard;
use crate::sql::{text, Col, Db, Param, Session, Stmt};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Locator};

/// What a store kind writes in its engine's SQL.
///
/// Parameters: `namespace_rows` takes [`Dialect::in_namespace`]'s; `version` and
/// `vector_count` take prefix, key; `other_items` and `frozen_rows` sets of prefixes and keys;
/// the deletes sets of prefixes and keys, then the version a memory scope is frozen at.
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug {
    /// Kind, version and capabilities.
    fn describe(&self) -> Description;
    /// The schema as [`crate::Adapter::place`] shows it (unused by SQLite).
    fn place_schema(&self) -> &str;
    /// The `store` table, as a probe looks it up and names it; the refusal when it is missing.
    fn store_table(&self) -> String;
    fn missing_store(&self, db: &Db, name: &str) -> String;
    /// `store` and `store_vectors` as configured names, for the hidden-effects check.
    fn tables(&self) -> (String, String);
    /// The `store_vectors` table, as `has_table` looks it up.
    fn vectors_table(&self) -> String;
    /// The parameters of a namespace match.
    fn in_namespace(&self, ns: &str) -> Vec<String>;
    /// (prefix, key, rows) under a namespace, vectors included if `vectors`.
    fn namespace_rows(&self, vectors: bool) -> Stmt;
    /// An item's version.
    fn version(&self) -> Stmt;
    /// An item's vectors.
    fn vector_count(&self) -> Stmt;
    /// Whether any of the items exists: one answer per run.
    fn other_items(&self) -> Stmt;
    /// Deletes the items' vectors, and the items, except items written again at another
    /// version than a memory scope's.
    fn delete_vectors(&self) -> Stmt;
    fn delete_items(&self) -> Stmt;
    /// (prefix, key, rows) of the items that still hold rows, vectors included if `vectors`.
    fn frozen_rows(&self, vectors: bool) -> Stmt;
}

/// A LangGraph store target.
#[derive(Debug)]
pub struct Store {
    name: String,
    db: Db,
    sql: Box<dyn Dialect>,
    template: Vec<Label>,
    /// The database guard, where the engine has one.
    guard: Option<PgGuard>,
    /// PostgreSQL: what the certificate says of the dead row versions an erase leaves.
    dead_rows: Option<crate::postgres::DeadRows>,
}

impl Store {
    pub(crate) fn new(
        name: &str,
        db: Db,
        sql: Box<dyn Dialect>,
        template: Vec<Label>,
        guard: Option<PgGuard>,
    ) -> Self {
        Self {
            name: name.to_string(),
            db,
            sql,
            template,
            guard,
            dead_rows: None,
        }
    }

    /// On PostgreSQL: reports (or vacuums, then reports) the dead row versions each erase
    /// leaves in `store` and `store_vectors`, as the certificate's `physical` line.
    pub(crate) fn with_dead_rows(mut self, mode: Option<crate::postgres::DeadRows>) -> Self {
        self.dead_rows = mode;
        self
    }

    fn selection(&self, scope: &Scope) -> Result<Selection, AdapterError> {
        selection(&self.name, &self.template, scope)
    }

    fn has_vectors(&self, s: &mut Session<'_>) -> Result<bool, AdapterError> {
        s.has_table(&self.sql.vectors_table())
    }

    fn version(
        &self,
        s: &mut Session<'_>,
        ns: &str,
        key: &str,
    ) -> Result<Option<String>, AdapterError> {
        Ok(
            s.opt(&self.sql.version(), &[text(ns), text(key)], &[Col::Text])?
                .map(|mut r| r.string(0)),
        )
    }

    /// (prefix, key) -> rows, for everything the selection names, hidden rows included.
    fn rows(
        &self,
        s: &mut Session<'_>,
        sel: &Selection,
    ) -> Result<BTreeMap<(String, String), u64>, AdapterError> {
        let mut out = BTreeMap::new();
        let vectors = self.has_vectors(s)?;
        match sel {
            Selection::Namespace { ns } => {
                let params = self.sql.in_namespace(ns);
                let params: Vec<Param<'_>> = params.iter().map(|p| text(p)).collect();
                // No `expires_at` condition: rows past their TTL are still on disk.
                let cols = [Col::Text, Col::Text, Col::Int];
                s.each(
                    &self.sql.namespace_rows(vectors),
                    &params,
                    &cols,
                    |mut r| {
                        *out.entry((r.string(0), r.string(1))).or_insert(0) += r.count(2);
                    },
                )?;
            }
            Selection::Item { ns, key, version } => {
                let current = self.version(s, ns, key)?;
                // The item at another version is another memory version: not in scope, nor are
                // its vectors.
                if let (Some(cur), Some(v)) = (&current, version) {
                    if cur != v {
                        return Ok(out);
                    }
                }
                let mut n = u64::from(current.is_some());
                if vectors {
                    let params = [text(ns), text(key)];
                    n += s
                        .one(&self.sql.vector_count(), &params, &[Col::Int])?
                        .count(0);
                }
                if n > 0 {
                    out.insert((ns.clone(), key.clone()), n);
                }
            }
        }
        Ok(out)
    }
}

impl Store {
    /// Many jobs' batches in one transaction, each job's own statements checked against its
    /// own inventory, as `erase_batch` does alone. Rows per job; `None` when a job would erase
    /// more than its inventory (all rolled back).
    fn erase_together(
        &self,
        work: &[(Scope, Vec<Locator>)],
    ) -> Result<Option<Vec<u64>>, AdapterError> {
        let mut jobs = Vec::with_capacity(work.len());
        for (scope, batch) in work {
            let sel = self.selection(scope)?;
            let items = checked_items(&self.name, &sel, batch)?;
            let (prefixes, keys): (Vec<String>, Vec<String>) = items.into_iter().unzip();
            let expected: u64 = batch.iter().map(|(_, n)| n).sum();
            jobs.push((sel, prefixes, keys, expected));
        }
        let mut s = self.db.session()?;
        let vectors = self.has_vectors(&mut s)?;
        let mut tx = s.begin()?;
        let mut rows = Vec::with_capacity(jobs.len());
        for (sel, prefixes, keys, expected) in &jobs {
            if prefixes.is_empty() {
                rows.push(0);
                continue;
            }
            let params = [
                Param::Set(prefixes),
                Param::Set(keys),
                Param::Text(sel.version()),
            ];
            let mut deleted = 0u64;
            if vectors {
                deleted += tx.execute(&self.sql.delete_vectors(), &params)?;
            }
            deleted += tx.execute(&self.sql.delete_items(), &params)?;
            if crate::within_inventory(&self.name, *expected, deleted).is_err() {
                return Ok(None);
            }
            rows.push(deleted);
        }
        tx.commit()?;
        Ok(Some(rows))
    }
}

impl Adapter for Store {
    fn describe(&self) -> Description {
        self.sql.describe()
    }

    fn guard(&self) -> Option<&dyn Guard> {
        self.guard.as_ref().map(|g| g as &dyn Guard)
    }

    fn physical(&self, frozen: &[crate::Locator]) -> Result<Option<crate::Physical>, AdapterError> {
        let Some(mode) = self.dead_rows else {
            return Ok(None);
        };
        let erased = frozen.iter().map(|(_, n)| n).sum();
        let (store, vectors) = self.sql.tables();
        crate::postgres::dead_rows(&self.db, &[store, vectors], erased, mode).map(Some)
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        self.selection(scope)?;
        let others = other_readings(&self.name, &self.template, scope)?;
        if !others.is_empty() {
            let (prefixes, keys): (Vec<String>, Vec<String>) = others.into_iter().unzip();
            let mut s = self.db.session()?;
            let params = [Param::Set(&prefixes), Param::Set(&keys)];
            let found = s.query(&self.sql.other_items(), &params, &[Col::Bool])?;
            if found.iter().any(|r| r.bool(0)) {
                return Err(ambiguous(&self.name));
            }
        }
        Ok(Applicability::Applies)
    }

    fn files(&self) -> Vec<PathBuf> {
        self.db
            .file()
            .map(|p| p.to_path_buf())
            .into_iter()
            .collect()
    }

    fn overlap_key(&self) -> Option<String> {
        let path = self.db.canonical_file()?;
        let literals: Vec<&str> = self
            .template
            .iter()
            .map_while(|l| match l {
                Label::Literal(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        Some(format!("{}\u{0}{}", path.display(), literals.join("\u{0}")))
    }

    fn place(&self) -> String {
        self.db.place(self.sql.place_schema())
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let mut s = self.db.session()?;
        let failed = |why| AdapterError::Failed {
            target: self.name.clone(),
            why,
        };
        let store = self.sql.store_table();
        if !s.has_table(&store)? {
            return Err(failed(self.sql.missing_store(&self.db, &store)));
        }
        let (items, vectors) = self.sql.tables();
        // LangGraph's own: a vector row goes with its item, and is counted with it.
        let own = [(vectors.as_str(), items.as_str())];
        if let Some(why) = s.hidden_effects(&[&items, &vectors], &own)? {
            return Err(failed(why));
        }
        Ok(())
    }

    fn check_version(&self, version: &Version) -> Result<(), &'static str> {
        if crate::is_updated_at_version(version.as_str()) {
            Ok(())
        } else {
            Err(crate::UPDATED_AT_FORM)
        }
    }

    fn current_version(&self, scope: &Scope) -> Result<Option<Version>, AdapterError> {
        let Selection::Item { ns, key, .. } = self.selection(scope)? else {
            return Ok(None);
        };
        let v = self.version(&mut self.db.session()?, &ns, &key)?;
        v.map(|v| {
            Version::new(v).map_err(|e| AdapterError::Failed {
                target: self.name.clone(),
                why: e.to_string(),
            })
        })
        .transpose()
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let sel = self.selection(scope)?;
        let rows = self.rows(&mut self.db.session()?, &sel)?;
        Ok(Inventory::from_locators(
            rows.into_iter()
                .map(|((p, k), n)| (locator(&p, &k), n))
                .collect(),
        ))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let items = checked_items(&self.name, &sel, batch)?;
        let (prefixes, keys): (Vec<String>, Vec<String>) = items.into_iter().unzip();
        let mut s = self.db.session()?;
        let vectors = self.has_vectors(&mut s)?;
        let mut tx = s.begin()?;
        // For a memory scope, only the tombstoned version goes; its vectors go with it, or
        // when the item row is already gone. Vectors first, then the items, each counted.
        let params = [
            Param::Set(&prefixes),
            Param::Set(&keys),
            Param::Text(sel.version()),
        ];
        let mut deleted = 0u64;
        if vectors {
            deleted += tx.execute(&self.sql.delete_vectors(), &params)?;
        }
        deleted += tx.execute(&self.sql.delete_items(), &params)?;
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        // Dropping the transaction rolls the step back.
        crate::within_inventory(&self.name, expected, deleted)?;
        tx.commit()?;
        Ok(deleted)
    }

    fn erase_many(&self, work: &[(Scope, Vec<Locator>)]) -> Vec<Result<u64, AdapterError>> {
        let alone = || work.iter().map(|(s, b)| self.erase_batch(s, b)).collect();
        match self.erase_together(work) {
            Ok(Some(rows)) => rows.into_iter().map(Ok).collect(),
            // A job over its inventory (rolled back), or the store failed: each alone, so
            // that only its own job fails.
            _ => alone(),
        }
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let sel = self.selection(scope)?;
        let mut s = self.db.session()?;
        let mut rows = self.rows(&mut s, &sel)?;
        // Anything still under a frozen locator the scope query did not see counts too.
        let (prefixes, keys): (Vec<String>, Vec<String>) = frozen
            .iter()
            .map(|(loc, _)| parse_locator(&self.name, loc))
            .collect::<Result<BTreeSet<_>, _>>()?
            .into_iter()
            .filter(|pk| !rows.contains_key(pk))
            .unzip();
        if !prefixes.is_empty() {
            let vectors = self.has_vectors(&mut s)?;
            let params = [Param::Set(&prefixes), Param::Set(&keys)];
            let cols = [Col::Text, Col::Text, Col::Int];
            s.each(&self.sql.frozen_rows(vectors), &params, &cols, |mut r| {
                let n = r.count(2);
                if n > 0 {
                    rows.insert((r.string(0), r.string(1)), n);
                }
            })?;
        }
        Ok(rows.values().sum())
    }
}
