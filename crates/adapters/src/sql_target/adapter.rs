//! The `sql` target: declared statements run over [`crate::sql`], checked before first use.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use lethe_core::Scope;

use super::statement::{Name, Parsed};
use crate::sql::{Col, Db, Param, Session, Stmt};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Kind, Locator};

/// The declared statements, rewritten for the engine.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) locate: Parsed,
    pub(crate) verify: Parsed,
    pub(crate) erase: Parsed,
    /// `locate_memory`, `verify_memory`.
    pub(crate) memory: Option<(Parsed, Parsed)>,
    /// `locate_tenant`, `verify_tenant`.
    pub(crate) tenant: Option<(Parsed, Parsed)>,
}

/// A `locate` statement as run: its rows read as (text, integer) whatever the columns' types.
fn locate_stmt(p: &Parsed) -> Stmt {
    // The newlines keep a trailing `--` comment from swallowing the parenthesis. On
    // PostgreSQL a data-modifying WITH inside this one is refused by the server as well.
    Stmt::new(format!(
        "WITH lethe_q(l, n) AS (\n{}\n) SELECT CAST(l AS TEXT), CAST(n AS BIGINT) FROM lethe_q",
        p.sql
    ))
}

/// A `verify` statement as run: its rows' counts as integers (NULL as 0), summed.
fn verify_stmt(p: &Parsed) -> Stmt {
    Stmt::new(format!(
        "WITH lethe_q(n) AS (\n{}\n) SELECT CAST(COALESCE(n, 0) AS BIGINT) FROM lethe_q",
        p.sql
    ))
}

/// `erase` as a count of the rows it would delete: `DELETE FROM <rest>` read as
/// `SELECT count(*) FROM <rest>`, the same placeholders in the same order. `None` where the
/// statement has a clause a `SELECT` lacks (`RETURNING`, `USING`, `ORDER BY`, `LIMIT`; any
/// such word anywhere, a literal's included, is enough to give up): the caller then counts 1.
fn count_stmt(erase: &Parsed) -> Option<Stmt> {
    let sql = erase.sql.trim_start();
    if !sql.get(..6)?.eq_ignore_ascii_case("DELETE") {
        return None;
    }
    let rest = sql.get(6..)?.trim_start();
    if !rest.get(..4)?.eq_ignore_ascii_case("FROM") {
        return None;
    }
    let words = sql.to_ascii_lowercase();
    let blocked = words
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .any(|w| matches!(w, "returning" | "using" | "order" | "limit"));
    if blocked {
        return None;
    }
    Some(Stmt::new(format!(
        "WITH lethe_q(n) AS (\nSELECT count(*) FROM{}\n) SELECT CAST(COALESCE(n, 0) AS BIGINT) FROM lethe_q",
        rest.get(4..)?
    )))
}

/// A generic SQL table target.
#[derive(Debug)]
pub struct SqlTarget {
    name: String,
    db: Db,
    table: String,
    st: Statements,
    /// Whether the statements passed [`SqlTarget::check`] in this process: each operation
    /// checks first, so nothing runs unchecked even without a probe.
    checked: Mutex<bool>,
}

/// Which statements a scope takes.
enum Pick<'a> {
    Run(&'a Parsed, &'a Parsed),
    Exempt(String),
}

impl SqlTarget {
    pub(crate) fn new(name: &str, db: Db, table: String, st: Statements) -> Self {
        Self {
            name: name.to_string(),
            db,
            table,
            st,
            checked: Mutex::new(false),
        }
    }

    fn failed(&self, why: String) -> AdapterError {
        AdapterError::Failed {
            target: self.name.clone(),
            why,
        }
    }

    fn pick(&self, scope: &Scope) -> Result<Pick<'_>, AdapterError> {
        Ok(match scope {
            Scope::Subject { .. } => Pick::Run(&self.st.locate, &self.st.verify),
            Scope::Memory { .. } => match &self.st.memory {
                Some((l, v)) => Pick::Run(l, v),
                None => Pick::Exempt(
                    "no locate_memory / verify_memory declared: this table's rows are erased \
                     with their subject, not one memory at a time"
                        .into(),
                ),
            },
            Scope::Tenant { .. } => match &self.st.tenant {
                Some((l, v)) => Pick::Run(l, v),
                None => {
                    return Err(AdapterError::Inexpressible {
                        target: self.name.clone(),
                        why: "no locate_tenant / verify_tenant declared, and a table of \
                              subjects' rows holds the tenant's: declare them to offboard a \
                              tenant (a tenant scope is never exempt here)"
                            .into(),
                    })
                }
            },
        })
    }

    /// The values of `p`'s parameters for `scope` (and a locator), in placeholder order.
    fn values(
        &self,
        p: &Parsed,
        scope: &Scope,
        locator: Option<&str>,
    ) -> Result<Vec<String>, AdapterError> {
        let cannot = |why: &str| AdapterError::Inexpressible {
            target: self.name.clone(),
            why: why.to_string(),
        };
        p.params
            .iter()
            .map(|n| {
                Ok(match (n, scope) {
                    (Name::Tenant, s) => s.tenant().as_str().to_string(),
                    (Name::Subject, s) => s
                        .subject()
                        .ok_or_else(|| cannot("a statement uses :subject and the scope names no subject"))?
                        .as_str()
                        .to_string(),
                    (Name::MemoryId, Scope::Memory { memory, .. }) => memory.as_str().to_string(),
                    (Name::Version, Scope::Memory { version: Some(v), .. }) => {
                        v.as_str().to_string()
                    }
                    (Name::Version, Scope::Memory { version: None, .. }) => {
                        return Err(cannot(
                            "`locate_memory`/`verify_memory` use :version and the memory scope \
                             names none: give the version",
                        ))
                    }
                    (Name::Locator, _) => locator.unwrap_or_default().to_string(),
                    (n, _) => {
                        return Err(cannot(&format!(
                            "a statement uses :{} and the scope does not give it",
                            n.as_str()
                        )))
                    }
                })
            })
            .collect()
    }

    /// Names the statement in an error the engine returned for it; a read's write refused by
    /// its read-only transaction is the statement's fault, not the database's mode.
    fn about(&self, key: &str, e: AdapterError) -> AdapterError {
        match e {
            AdapterError::Failed { target, why } => AdapterError::Failed {
                target,
                why: format!("`{key}`: {why}"),
            },
            // An erase refused by a read-only database stays `ReadOnly`: the operator's to fix.
            AdapterError::ReadOnly { target, why } if key != "erase" => AdapterError::Failed {
                target,
                why: format!("`{key}` tried to write ({why}): it must only read"),
            },
            e => e,
        }
    }

    /// The checks at probe, in the engine's own terms: the table exists and nothing hidden
    /// acts on a delete from it; each read statement parses, writes nothing and has its
    /// columns; the erase parses and deletes from the declared table only.
    fn check(&self, s: &mut Session<'_>) -> Result<(), AdapterError> {
        let Some(table) = s.table_name(&self.table)? else {
            return Err(self.failed(format!(
                "no table `{}` in the database: `table` names the table `erase` deletes from",
                self.table
            )));
        };
        if let Some(why) = s.hidden_effects(&[&self.table], &[])? {
            return Err(self.failed(why));
        }
        let mut reads = vec![("locate", &self.st.locate, 2), ("verify", &self.st.verify, 1)];
        if let Some((l, v)) = &self.st.memory {
            reads.extend([("locate_memory", l, 2), ("verify_memory", v, 1)]);
        }
        if let Some((l, v)) = &self.st.tenant {
            reads.extend([("locate_tenant", l, 2), ("verify_tenant", v, 1)]);
        }
        for (key, p, columns) in reads {
            let plan = s
                .plan(&Stmt::new(p.sql.clone()))
                .map_err(|e| self.about(key, e))?;
            if let Some((what, on)) = plan.writes.first() {
                return Err(self.failed(format!(
                    "`{key}` is not read-only (its plan has a {what}{}{on}): locate and verify \
                     statements must only read",
                    if on.is_empty() { "" } else { " on " }
                )));
            }
            if plan.columns != columns {
                return Err(self.failed(format!(
                    "`{key}` returns {} columns; it must return {}",
                    plan.columns,
                    if columns == 2 {
                        "2: the locator, then the rows it accounts for"
                    } else {
                        "1: the rows left"
                    }
                )));
            }
        }
        let plan = s
            .plan(&Stmt::new(self.st.erase.sql.clone()))
            .map_err(|e| self.about("erase", e))?;
        if plan.writes.is_empty() {
            return Err(self.failed("`erase` deletes nothing: it must be a DELETE".into()));
        }
        for (what, on) in &plan.writes {
            if !matches!(what.as_str(), "delete" | "write") || *on != table {
                return Err(self.failed(format!(
                    "`erase` must delete from `{}` only; its plan has a {what}{}{on}",
                    self.table,
                    if on.is_empty() { "" } else { " on " }
                )));
            }
        }
        Ok(())
    }

    /// A session whose statements have been checked.
    fn session(&self) -> Result<Session<'_>, AdapterError> {
        let mut s = self.db.session()?;
        let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        if !*checked {
            self.check(&mut s)?;
            *checked = true;
        }
        drop(checked);
        Ok(s)
    }

    /// Locator -> rows, as `locate` finds them now.
    fn located(
        &self,
        s: &mut Session<'_>,
        key: &str,
        locate: &Parsed,
        scope: &Scope,
    ) -> Result<BTreeMap<String, u64>, AdapterError> {
        let values = self.values(locate, scope, None)?;
        let params: Vec<Param<'_>> = values.iter().map(|v| crate::sql::text(v)).collect();
        let rows = s
            .read_only(|s| s.query(&locate_stmt(locate), &params, &[Col::Text, Col::Int]))
            .map_err(|e| self.about(key, e))?;
        let mut out = BTreeMap::new();
        for mut r in rows {
            let n = r.int(1);
            if n < 1 {
                return Err(self.failed(format!(
                    "`{key}` returned a row count below 1: its second column is the number of \
                     rows each locator accounts for"
                )));
            }
            *out.entry(r.string(0)).or_insert(0) += n as u64;
        }
        Ok(out)
    }

    /// The rows `erase` would delete for this locator now, counted read-only; `None` where
    /// `erase` cannot be read as a count ([`count_stmt`]).
    fn rows_at(
        &self,
        s: &mut Session<'_>,
        scope: &Scope,
        locator: &str,
    ) -> Result<Option<u64>, AdapterError> {
        let Some(stmt) = count_stmt(&self.st.erase) else {
            return Ok(None);
        };
        let values = self.values(&self.st.erase, scope, Some(locator))?;
        let params: Vec<Param<'_>> = values.iter().map(|v| crate::sql::text(v)).collect();
        let n: i64 = s
            .read_only(|s| s.query(&stmt, &params, &[Col::Int]))
            .map_err(|e| self.about("erase (read as a count)", e))?
            .iter()
            .map(|r| r.int(0))
            .sum();
        Ok(Some(n.max(0) as u64))
    }

    fn locate_key(scope: &Scope) -> (&'static str, &'static str) {
        match scope {
            Scope::Subject { .. } => ("locate", "verify"),
            Scope::Memory { .. } => ("locate_memory", "verify_memory"),
            Scope::Tenant { .. } => ("locate_tenant", "verify_tenant"),
        }
    }
}

impl Adapter for SqlTarget {
    fn describe(&self) -> Description {
        let mut capabilities = vec!["scope:subject"];
        if self.st.tenant.is_some() {
            capabilities.push("scope:tenant");
        }
        if self.st.memory.is_some() {
            capabilities.push("scope:memory");
        }
        capabilities.push("declared-statements");
        Description {
            kind: Kind::Sql,
            version: "1",
            capabilities,
        }
    }

    fn check_scope(&self, scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(match self.pick(scope)? {
            Pick::Run(..) => Applicability::Applies,
            Pick::Exempt(why) => Applicability::Exempt(why),
        })
    }

    fn probe(&self) -> Result<(), AdapterError> {
        let mut s = self.db.session()?;
        self.check(&mut s)?;
        *self.checked.lock().unwrap_or_else(|p| p.into_inner()) = true;
        Ok(())
    }

    fn place(&self) -> String {
        // The erase statement is what a locator means: another one is another layout.
        format!("{}|{}|{}", self.db.place(""), self.table, self.st.erase.sql)
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
        Some(format!(
            "{}\u{0}{}\u{0}{}",
            path.display(),
            self.table.to_lowercase(),
            self.st.locate.sql
        ))
    }

    fn takes_lineage(&self) -> bool {
        true
    }

    /// A recorded artifact's locator is what `erase` takes as `:locator`. Its rows: `erase`
    /// read as a count (`SELECT count(*) FROM` the rest of the `DELETE`), `None` at 0; where
    /// `erase` cannot be read so, 1 while it is recorded (the anomaly guard then holds the
    /// erase to one row).
    fn artifact(&self, scope: &Scope, locator: &str) -> Result<Option<Locator>, AdapterError> {
        if let Pick::Exempt(_) = self.pick(scope)? {
            return Ok(None);
        }
        let mut s = self.session()?;
        Ok(match self.rows_at(&mut s, scope, locator)? {
            Some(0) => None,
            Some(n) => Some((locator.to_string(), n)),
            None => Some((locator.to_string(), 1)),
        })
    }

    fn inventory(&self, scope: &Scope) -> Result<Inventory, AdapterError> {
        let Pick::Run(locate, _) = self.pick(scope)? else {
            return Ok(Inventory::default());
        };
        let mut s = self.session()?;
        let found = self.located(&mut s, Self::locate_key(scope).0, locate, scope)?;
        Ok(Inventory::from_locators(found.into_iter().collect()))
    }

    fn erase_batch(&self, scope: &Scope, batch: &[Locator]) -> Result<u64, AdapterError> {
        if let Pick::Exempt(_) = self.pick(scope)? {
            return Ok(0);
        }
        let expected: u64 = batch.iter().map(|(_, n)| n).sum();
        let stmt = Stmt::new(self.st.erase.sql.clone());
        let mut s = self.session()?;
        let mut tx = s.begin()?;
        let mut deleted = 0u64;
        for (locator, _) in batch {
            let values = self.values(&self.st.erase, scope, Some(locator))?;
            let params: Vec<Param<'_>> = values.iter().map(|v| crate::sql::text(v)).collect();
            deleted += tx
                .execute(&stmt, &params)
                .map_err(|e| self.about("erase", e))?;
            // Stop at the first step past the allowance; dropping the transaction rolls the
            // whole batch back.
            crate::within_inventory(&self.name, expected, deleted)?;
        }
        tx.commit()?;
        Ok(deleted)
    }

    fn verify(&self, scope: &Scope, frozen: &[Locator]) -> Result<u64, AdapterError> {
        let Pick::Run(locate, verify) = self.pick(scope)? else {
            return Ok(0);
        };
        let (lkey, vkey) = Self::locate_key(scope);
        let mut s = self.session()?;
        let values = self.values(verify, scope, None)?;
        let params: Vec<Param<'_>> = values.iter().map(|v| crate::sql::text(v)).collect();
        let counted: i64 = s
            .read_only(|s| s.query(&verify_stmt(verify), &params, &[Col::Int]))
            .map_err(|e| self.about(vkey, e))?
            .iter()
            .map(|r| r.int(0))
            .sum();
        if counted < 0 {
            return Err(self.failed(format!("`{vkey}` returned a negative count")));
        }
        // Two readings, the larger: the declared count, and the rows `locate` still finds
        // (a frozen locator still there is found by it, as is one written since).
        let located = self.located(&mut s, lkey, locate, scope)?;
        // A frozen locator `locate` no longer finds (a lineage artifact, which no `locate`
        // finds) is counted by `erase` read as a count: what the erase left under it.
        let mut left = 0;
        for (l, _) in frozen.iter().filter(|(l, _)| !located.contains_key(l)) {
            left += self.rows_at(&mut s, scope, l)?.unwrap_or(0);
        }
        Ok((counted as u64).max(located.values().sum()) + left)
    }
}
