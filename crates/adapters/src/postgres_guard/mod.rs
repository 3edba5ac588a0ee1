//! The database guard for LangGraph on PostgreSQL: schema `lethe_guard` and `BEFORE INSERT OR
//! UPDATE` triggers on `checkpoints`, `checkpoint_blobs`, `checkpoint_writes` and `store`.
//!
//! The triggers and their rules are in `install.sql` (read it first). In short, a write is
//! refused when:
//! - it goes to a thread or a store item a job erased (LangGraph issue 7206: a late `put` or
//!   `put_writes` after `delete_thread` recreates the thread) — `LT003`, `LT004`;
//! - its owner's erasure is running (FROZEN to COMPLETE) — `LT001`;
//! - its owner was erased and it carries no token, or a token older than the erasure — `LT002`.
//!
//! An UPDATE that moves a row to another owner, thread or item is judged for the row it leaves
//! as well, by the same rules and codes (a second trigger, `lethe_guard_reown`, version 5).
//!
//! Owners are found the way the adapters find them: for checkpoints, the target's `metadata`
//! keys in `checkpoints.metadata`; for task writes, the checkpoint they name; for blobs, one
//! checkpoint of their thread (only while a fence is closed); for store items, the namespace template's labels in `prefix`.
//! Tokens: `lethe_epoch` (and `lethe_tenant_epoch`) in the run config's metadata, which
//! LangGraph copies into `checkpoints.metadata`; for the store, the same top-level keys in the
//! item's value. `store_vectors` needs no trigger: its foreign key to `store` admits a vector
//! only for an admitted item.
//!
//! Tokens are the gate's: `lethe_token`, a MAC under the guard's key over the lease, its epochs
//! and its owner (`GuardKey::token`), checked in SQL (`lethe_guard.issued`) for every write of
//! an erased owner or item; a writer that never held a lease cannot make one (version 7).
//!
//! Identifiers never reach SQL text: values are parameters, table names are quoted by
//! `format('%I')` (`lethe_guard.attach`, and the `DROP TRIGGER` uninstall builds), and the owner and item columns hold
//! keyed digests (HMAC-SHA256 under the guard's key), never identifiers.

use lethe_core::keys::GuardKey;

use crate::guard::{Fence, Guard, GuardStatus};
use crate::postgres::Conn;
use crate::{AdapterError, Locator};

/// The guard's version, stored in `lethe_guard.meta`. 2: every digest computed once, before
/// any lookup (the same rules as 1, at a third of its cost a write). 3: one probe of
/// `lethe_guard.known` first, so a write the guard knows nothing of runs one statement (the
/// same rules; about 60% of 2's cost a store write). 4: a write whose transaction's snapshot
/// predates a fence change is refused (`40001`, retry) instead of judged on old state
/// (`lethe_guard.gen`). 5: an UPDATE that moves a row to another owner, thread or item is
/// judged for the row it leaves too (a second trigger, `lethe_guard_reown`, on UPDATEs that
/// change those columns only). 6: a snapshot older than the guard's install (or than its
/// upgrade to 4), which sees no `gen_seen` row, is never fresh (it went through on the fence
/// state it saw, none); a generation drawn by a change whose transaction died is repaired by
/// the next REPEATABLE READ or SERIALIZABLE write (every such write was refused until the next
/// change). 7: the fencing token is the gate's MAC (`lethe_token`) over the lease, its epoch
/// and owner, checked under the guard's key (`lethe_guard.key`, from the deployment key), and
/// the digests are keyed under it. `lethe guard install` brings a database from 1 to 6 up to 7
/// in place, its fences and erased lists kept (their digests keyed in place).
pub const VERSION: &str = "7";

const INSTALL: &str = include_str!("install.sql");

/// Objects the guard owns, dropped by uninstall in this order, then the schema (RESTRICT, so
/// anything else someone put there stops the uninstall instead of being dropped).
const UNINSTALL: &str = "
DROP FUNCTION IF EXISTS lethe_guard.attach(text, text, text, text[]);
DROP FUNCTION IF EXISTS lethe_guard.reown_guard();
DROP FUNCTION IF EXISTS lethe_guard.namespace_owner(text, text[]);
DROP FUNCTION IF EXISTS lethe_guard.store_guard();
DROP FUNCTION IF EXISTS lethe_guard.thread_rows_guard();
DROP FUNCTION IF EXISTS lethe_guard.checkpoints_guard();
DROP FUNCTION IF EXISTS lethe_guard.refuse_erased_thread(text);
DROP FUNCTION IF EXISTS lethe_guard.check_owner(text, text, jsonb, jsonb, jsonb, boolean);
DROP FUNCTION IF EXISTS lethe_guard.decide(bigint, boolean, bigint, boolean, jsonb, jsonb, jsonb, text, text, boolean);
DROP FUNCTION IF EXISTS lethe_guard.token(jsonb);
DROP FUNCTION IF EXISTS lethe_guard.issued(jsonb, text, bigint, text, text);
DROP FUNCTION IF EXISTS lethe_guard.set_key(bytea, bytea);
DROP FUNCTION IF EXISTS lethe_guard.item_digest(lethe_guard.key, text, text);
DROP FUNCTION IF EXISTS lethe_guard.thread_digest(lethe_guard.key, text);
DROP FUNCTION IF EXISTS lethe_guard.subject_owner(lethe_guard.key, text, text);
DROP FUNCTION IF EXISTS lethe_guard.tenant_owner(lethe_guard.key, text);
DROP FUNCTION IF EXISTS lethe_guard.mac(lethe_guard.key, bytea);
DROP FUNCTION IF EXISTS lethe_guard.the_key();
DROP TABLE IF EXISTS lethe_guard.key;
DROP FUNCTION IF EXISTS lethe_guard.check_owner(text, text, jsonb, jsonb, boolean);
DROP FUNCTION IF EXISTS lethe_guard.decide(bigint, boolean, bigint, boolean, jsonb, jsonb, boolean);
DROP FUNCTION IF EXISTS lethe_guard.item_digest(text, text);
DROP FUNCTION IF EXISTS lethe_guard.thread_digest(text);
DROP FUNCTION IF EXISTS lethe_guard.subject_owner(text, text);
DROP FUNCTION IF EXISTS lethe_guard.tenant_owner(text);
DROP TABLE IF EXISTS lethe_guard.erased_item;
DROP TABLE IF EXISTS lethe_guard.erased_thread;
DROP TABLE IF EXISTS lethe_guard.tenant_fence;
DROP TABLE IF EXISTS lethe_guard.subject_fence;
DROP TABLE IF EXISTS lethe_guard.meta;
DROP TABLE IF EXISTS lethe_guard.known;
DROP FUNCTION IF EXISTS lethe_guard.catch_up();
DROP FUNCTION IF EXISTS lethe_guard.fresh();
DROP TABLE IF EXISTS lethe_guard.gen_seen;
DROP SEQUENCE IF EXISTS lethe_guard.gen;
DROP FUNCTION IF EXISTS lethe_guard.remember();
DROP SCHEMA IF EXISTS lethe_guard RESTRICT;
";

/// Serializes installs, uninstalls and fence changes of one database (any value; the guard's).
const LOCK: i64 = 0x6c65_7468_6567_7264; // "lethegrd"

/// One trigger: table, guard function, trigger arguments.
pub(crate) type Attach = (&'static str, &'static str, Vec<String>);

/// A PostgreSQL target's guard.
/// First statement of every change that adds fence state (install.sql, "Snapshots older than a
/// fence change"): the draw is seen by every session at once, its record once committed.
const NEW_GENERATION: &str = "UPDATE lethe_guard.gen_seen SET g = nextval('lethe_guard.gen')";

/// How long closing a fence waits, in all, for transactions that wrote before it.
const WAIT_WRITERS: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug)]
pub(crate) struct PgGuard {
    target: String,
    conn: Conn,
    /// LangGraph's schema (unquoted; quoted by `format('%I')`).
    schema: String,
    /// This target's triggers.
    attach: Vec<Attach>,
    /// Store items (true) or threads (false).
    items: bool,
}

fn installed_sql() -> &'static str {
    "SELECT to_regnamespace('lethe_guard') IS NOT NULL"
}

/// Whether the last row of a simple query's replies holds `true` in its first column.
fn last_row_is_true(replies: &[postgres::SimpleQueryMessage]) -> bool {
    replies
        .iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => Some(r.get(0) == Some("t")),
            _ => None,
        })
        .last()
        .unwrap_or(false)
}

impl PgGuard {
    pub(crate) fn new(
        target: &str,
        conn: Conn,
        schema: &str,
        attach: Vec<Attach>,
        items: bool,
    ) -> Self {
        Self {
            target: target.to_string(),
            conn,
            schema: schema.to_string(),
            attach,
            items,
        }
    }

    fn failed(&self, why: &str) -> AdapterError {
        AdapterError::Failed {
            target: self.target.clone(),
            why: why.to_string(),
        }
    }

    fn tables(&self) -> Vec<String> {
        self.attach
            .iter()
            .map(|(t, _, _)| (*t).to_string())
            .collect()
    }

    /// Waits until every transaction that wrote to the guarded tables before the fence
    /// committed has ended. Its trigger ran before the fence, so it was admitted; if it
    /// committed after the inventory, its rows would escape the erasure (found by a guard
    /// review: an application transaction that wrote a new thread before the erasure and
    /// committed after COMPLETE). A `SHARE` lock waits for every holder of `ROW EXCLUSIVE`,
    /// the lock each write takes until its transaction ends, and is released at once; writers
    /// that arrive meanwhile queue behind it. At most [`WAIT_WRITERS`] in all: then the job
    /// blocks (retryable) and its resume waits again.
    ///
    /// One table at a time, each in its own transaction. Locking them all in one transaction
    /// held the first table's lock while waiting for the next: LangGraph's `put` (blobs, then
    /// its checkpoint, in one transaction) for any subject, in flight at that moment, then
    /// waited for us while we waited for it, and one of the two died of a deadlock (guard
    /// review). Holding at most one lock, and waiting while holding none, we cannot be part of
    /// a cycle. Waiting per table is enough: the fence committed before the first lock, so a
    /// write that takes a table's `ROW EXCLUSIVE` after we released that table's `SHARE` runs
    /// its trigger after the fence and is judged on it (a READ COMMITTED statement sees it; an
    /// older REPEATABLE READ snapshot is refused `40001`). Only writes to that table made
    /// before the fence can be admitted and uncommitted, and those are the ones its lock waits
    /// for. A transaction refused later rolls back its earlier writes with it.
    fn wait_for_earlier_writers(&self) -> Result<(), AdapterError> {
        let deadline = std::time::Instant::now() + WAIT_WRITERS;
        for t in self.tables() {
            let table = format!("{}.{}", quote(&self.schema), quote(&t));
            // Never 0: lock_timeout = 0 waits forever. Past the deadline, 1 ms: a table with no
            // writer in flight is still checked, a busy one times out as before.
            let left = deadline
                .saturating_duration_since(std::time::Instant::now())
                .as_millis()
                .max(1);
            self.conn.with(|c| {
                let mut tx = c.transaction()?;
                tx.batch_execute(&format!(
                    "SET LOCAL lock_timeout = {left}; LOCK TABLE {table} IN SHARE MODE"
                ))?;
                tx.commit()
            })?;
        }
        Ok(())
    }

    /// Runs `f` in one transaction under the guard's advisory lock, if the guard's schema
    /// exists. `Ok(None)`: not installed.
    fn in_guard<T>(
        &self,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T, postgres::Error>,
    ) -> Result<Option<T>, AdapterError> {
        self.conn.with(|c| {
            let mut tx = c.transaction()?;
            // One round trip for both (the lock's key is a constant): a job runs this about
            // eight times, most often against a database with no guard. Two statements, so
            // that the second reads the catalog with a snapshot taken after the lock, as
            // before: an install committed while we waited for the lock is seen.
            let replies = tx.simple_query(&format!(
                "SELECT pg_advisory_xact_lock({LOCK}); {}",
                installed_sql()
            ))?;
            if !last_row_is_true(&replies) {
                return Ok(None);
            }
            let out = f(&mut tx)?;
            tx.commit()?;
            Ok(Some(out))
        })
    }
}

/// The guard's triggers on each of its tables (`lethe_guard.attach`).
const TRIGGER_NAMES: [&str; 2] = ["lethe_guard", "lethe_guard_reown"];

/// Counts this target's triggers named in `$3` calling a function of schema lethe_guard.
const TRIGGERS: &str = "
SELECT count(*) FROM pg_trigger tg
  JOIN pg_class c ON c.oid = tg.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = tg.tgfoid
 WHERE tg.tgname = ANY($3) AND n.nspname = $1 AND c.relname = ANY($2)
   AND p.pronamespace = to_regnamespace('lethe_guard')";

impl Guard for PgGuard {
    fn status(&self) -> Result<GuardStatus, AdapterError> {
        let tables = self.tables();
        let needed = (tables.len() * TRIGGER_NAMES.len()) as u64;
        self.conn.with(|c| {
            let mut tx = c.build_transaction().read_only(true).start()?;
            let present: bool = tx.query_one(installed_sql(), &[])?.get(0);
            if !present {
                return Ok(GuardStatus {
                    triggers_needed: needed,
                    ..GuardStatus::default()
                });
            }
            let triggers: i64 = tx
                .query_one(TRIGGERS, &[&self.schema, &tables, &TRIGGER_NAMES.to_vec()])?
                .get(0);
            let r = tx.query_one(
                "SELECT (SELECT value FROM lethe_guard.meta WHERE key = 'version'),
                        (SELECT count(*) FROM lethe_guard.subject_fence WHERE fenced),
                        (SELECT count(*) FROM lethe_guard.tenant_fence WHERE fenced),
                        (SELECT count(*) FROM lethe_guard.subject_fence) + (SELECT count(*) FROM lethe_guard.tenant_fence),
                        (SELECT count(*) FROM lethe_guard.erased_thread),
                        (SELECT count(*) FROM lethe_guard.erased_item)",
                &[],
            )?;
            tx.commit()?;
            Ok(GuardStatus {
                installed: triggers as u64 == needed,
                version: r.get(0),
                triggers: triggers as u64,
                triggers_needed: needed,
                fenced_subjects: r.get::<_, i64>(1) as u64,
                fenced_tenants: r.get::<_, i64>(2) as u64,
                erased_owners: r.get::<_, i64>(3) as u64,
                erased_threads: r.get::<_, i64>(4) as u64,
                erased_items: r.get::<_, i64>(5) as u64,
            })
        })
    }

    fn install(&self, key: &GuardKey) -> Result<(), AdapterError> {
        // Refuse a schema the triggers cannot find, before creating anything.
        for t in self.tables() {
            let name = format!("{}.{}", quote(&self.schema), quote(&t));
            let found: bool = self.conn.with(|c| {
                Ok(c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])?
                    .get(0))
            })?;
            if !found {
                return Err(self.failed(&format!(
                    "no table {t} in schema {}: is this a LangGraph database (and `schema` right)?",
                    self.schema
                )));
            }
        }
        self.conn
            .with(|c| {
                let mut tx = c.transaction()?;
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])?;
                tx.batch_execute(INSTALL)?;
                let (ipad, opad) = key.pads();
                tx.execute(
                    "SELECT lethe_guard.set_key($1, $2)",
                    &[&&ipad[..], &&opad[..]],
                )?;
                for (table, function, args) in &self.attach {
                    tx.execute(
                        "SELECT lethe_guard.attach($1, $2, $3, $4)",
                        &[&self.schema, table, function, args],
                    )?;
                }
                tx.commit()
            })
            .map_err(|e| {
                // `set_key`'s refusal, whose message the driver's description withholds.
                if e.to_string().contains("SQLSTATE LT005") {
                    self.failed(
                    "the guard in this database was installed under another deployment key (its \
                     fences, erased lists and tokens belong to that deployment); nothing was \
                     changed. Install it with that deployment's key, or uninstall it there first",
                )
                } else {
                    e
                }
            })
    }

    fn uninstall(&self) -> Result<(), AdapterError> {
        let tables = self.tables();
        let fenced = self.in_guard(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT (SELECT count(*) FROM lethe_guard.subject_fence WHERE fenced)
                          + (SELECT count(*) FROM lethe_guard.tenant_fence WHERE fenced)",
                    &[],
                )?
                .get(0);
            if n > 0 {
                return Ok(true);
            }
            for t in &tables {
                for name in TRIGGER_NAMES {
                    // Only a trigger of ours: so named and calling a lethe_guard function.
                    let ours: i64 = tx
                        .query_one(TRIGGERS, &[&self.schema, &vec![t.clone()], &vec![name]])?
                        .get(0);
                    if ours > 0 {
                        let sql: String = tx
                            .query_one(
                                "SELECT format('DROP TRIGGER %I ON %I.%I', $1::text, $2::text, $3::text)",
                                &[&name, &self.schema, t],
                            )?
                            .get(0);
                        tx.batch_execute(&sql)?;
                    }
                }
            }
            let left: i64 = tx
                .query_one(
                    // Triggers of ours on other tables than the guard's own (`known`'s).
                    "SELECT count(*) FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
                       JOIN pg_class r ON r.oid = tg.tgrelid
                      WHERE p.pronamespace = to_regnamespace('lethe_guard')
                        AND r.relnamespace <> to_regnamespace('lethe_guard')",
                    &[],
                )?
                .get(0);
            if left == 0 {
                tx.batch_execute(UNINSTALL)?;
            }
            Ok(false)
        })?;
        if fenced == Some(true) {
            return Err(self.failed(
                "an erasure is running (a fence is closed): finish or resume its job before uninstalling the guard",
            ));
        }
        Ok(())
    }

    fn close(&self, fence: &Fence<'_>) -> Result<bool, AdapterError> {
        self.close_many(std::slice::from_ref(fence))
    }

    fn close_many(&self, fences: &[Fence<'_>]) -> Result<bool, AdapterError> {
        let done = self.in_guard(|tx| {
            tx.batch_execute(NEW_GENERATION)?;
            for fence in fences {
            match fence {
                Fence::Subject { tenant, subject, epoch } => {
                    tx.execute(
                        "INSERT INTO lethe_guard.subject_fence (owner, epoch, fenced)
                         VALUES (lethe_guard.subject_owner((SELECT g FROM lethe_guard.key g), $1, $2), $3, true)
                         ON CONFLICT (owner) DO UPDATE
                           SET epoch = GREATEST(lethe_guard.subject_fence.epoch, EXCLUDED.epoch), fenced = true",
                        &[&tenant.as_str(), &subject.as_str(), &(*epoch as i64)],
                    )?;
                }
                Fence::Tenant { tenant, epoch } => {
                    tx.execute(
                        "INSERT INTO lethe_guard.tenant_fence (owner, epoch, fenced)
                         VALUES (lethe_guard.tenant_owner((SELECT g FROM lethe_guard.key g), $1), $2, true)
                         ON CONFLICT (owner) DO UPDATE
                           SET epoch = GREATEST(lethe_guard.tenant_fence.epoch, EXCLUDED.epoch), fenced = true",
                        &[&tenant.as_str(), &(*epoch as i64)],
                    )?;
                }
                Fence::Memory => {}
            }
            }
            Ok(())
        })?;
        if done.is_none() {
            return Ok(false);
        }
        self.wait_for_earlier_writers()?;
        Ok(true)
    }

    fn record_erased(&self, fence: &Fence<'_>, frozen: &[Locator]) -> Result<bool, AdapterError> {
        if self.items {
            let mut prefixes = Vec::new();
            let mut keys = Vec::new();
            for (loc, _) in frozen {
                let (p, k) = crate::namespace::parse_locator(&self.target, loc)?;
                prefixes.push(p);
                keys.push(k);
            }
            // A memory scope moves no epoch: no token can tell a stale writer from a fresh
            // one, so the item stays erased. A tenant scope's check is the tenant token.
            let (epoch, forever) = match fence {
                Fence::Subject { epoch, .. } => (*epoch as i64, false),
                Fence::Tenant { .. } => (0, false),
                Fence::Memory => (0, true),
            };
            let done = self.in_guard(|tx| {
                tx.batch_execute(NEW_GENERATION)?;
                tx.execute(
                    "INSERT INTO lethe_guard.erased_item (item, epoch, forever)
                     SELECT lethe_guard.item_digest((SELECT g FROM lethe_guard.key g), p, k), $3, $4 FROM unnest($1::text[], $2::text[]) AS u(p, k)
                     ON CONFLICT (item) DO UPDATE
                       SET epoch = GREATEST(lethe_guard.erased_item.epoch, EXCLUDED.epoch),
                           forever = lethe_guard.erased_item.forever OR EXCLUDED.forever",
                    &[&prefixes, &keys, &epoch, &forever],
                )
                .map(|_| ())
            })?;
            Ok(done.is_some())
        } else {
            // Thread locators `0:<thread>` (and the registry's `1:<thread>`: same threads).
            let threads: Vec<String> = frozen
                .iter()
                .filter_map(|(l, _)| l.split_once(':').map(|(_, t)| t.to_string()))
                .collect();
            let done = self.in_guard(|tx| {
                tx.batch_execute(NEW_GENERATION)?;
                tx.execute(
                    "INSERT INTO lethe_guard.erased_thread (thread)
                     SELECT DISTINCT lethe_guard.thread_digest((SELECT g FROM lethe_guard.key g), t) FROM unnest($1::text[]) AS u(t)
                     ON CONFLICT (thread) DO NOTHING",
                    &[&threads],
                )
                .map(|_| ())
            })?;
            Ok(done.is_some())
        }
    }

    fn open(&self, fence: &Fence<'_>) -> Result<bool, AdapterError> {
        // The fence opens only up to the job's epoch, and one left closed with a later epoch
        // is reported. Epochs come from one journal and a job's epoch is its owner's latest
        // when it runs, so a later one was written by a journal this job's does not know: the
        // guard is shared with another journal (a second deployment, a migrated journal).
        // Succeeding there left the fence closed with no job to open it, every write of that
        // owner refused for good, silently (guard review).
        let later = self.in_guard(|tx| {
            // The UPDATE runs whether or not the SELECT reads it (a data-modifying WITH); the
            // two see disjoint rows (epoch <= $n, epoch > $n), so the SELECT's snapshot from
            // before the UPDATE is the state after it.
            let later = match fence {
                Fence::Subject {
                    tenant,
                    subject,
                    epoch,
                } => tx.query_one(
                    "WITH opened AS (
                         UPDATE lethe_guard.subject_fence SET fenced = false
                          WHERE owner = lethe_guard.subject_owner((SELECT g FROM lethe_guard.key g), $1, $2) AND epoch <= $3 RETURNING 1)
                     SELECT EXISTS (SELECT 1 FROM lethe_guard.subject_fence
                                     WHERE owner = lethe_guard.subject_owner((SELECT g FROM lethe_guard.key g), $1, $2) AND fenced AND epoch > $3)",
                    &[&tenant.as_str(), &subject.as_str(), &(*epoch as i64)],
                )?,
                Fence::Tenant { tenant, epoch } => tx.query_one(
                    "WITH opened AS (
                         UPDATE lethe_guard.tenant_fence SET fenced = false
                          WHERE owner = lethe_guard.tenant_owner((SELECT g FROM lethe_guard.key g), $1) AND epoch <= $2 RETURNING 1)
                     SELECT EXISTS (SELECT 1 FROM lethe_guard.tenant_fence
                                     WHERE owner = lethe_guard.tenant_owner((SELECT g FROM lethe_guard.key g), $1) AND fenced AND epoch > $2)",
                    &[&tenant.as_str(), &(*epoch as i64)],
                )?,
                Fence::Memory => return Ok(false),
            };
            Ok(later.get::<_, bool>(0))
        })?;
        match later {
            None => Ok(false),
            Some(false) => Ok(true),
            Some(true) => Err(self.failed(
                "the guard's fence for this job's scope was closed with a later epoch than this job's, \
                 so this job cannot open it: the guard is shared with another journal (a second \
                 deployment or a migrated journal). Run every erasure for this database from one \
                 journal; the fence stays closed until a job of the journal that closed it completes",
            )),
        }
    }
}

/// Quotes one identifier for `to_regclass` (a parameter, not SQL text).
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}
