//! `sql`: any table in PostgreSQL or SQLite, erased through statements the config declares:
//! `locate` (a locator and the rows it accounts for, per row), `erase` (one locator's rows) and
//! `verify` (the rows left), with the named parameters `:tenant`, `:subject`, `:memory_id`,
//! `:version` and, in `erase`, `:locator`. For what the adapters do not cover: an
//! application's summaries, exports or analytics tables.
//!
//! - **Parameters** are always bound, never spliced: `statement.rs` rewrites each `:name` to
//!   the engine's placeholder (`?N`; `$N::text` on PostgreSQL, so every parameter is text and a
//!   column of another type takes a cast, `:locator::bigint`), skipping string literals,
//!   quoted identifiers, comments and `::` casts. An unknown name, a positional parameter, a
//!   parameter the statement's scope kind does not give, or one it gives and the statement
//!   leaves out (it would reach beyond the scope; `:version` excepted) is refused at config
//!   load (exit 2).
//! - **Form, at config load**: one statement each (a trailing `;` only); the reads start with
//!   `SELECT`, `WITH` or `VALUES`; `erase` is `DELETE FROM` the declared `table`.
//! - **Engine, at probe** (and before first use in a process): the table exists, with no
//!   `DELETE` trigger, rule, cascading foreign key or row-level security that would act
//!   unseen (as for the LangGraph kinds); every statement parses; the reads write nothing in
//!   their plan (PostgreSQL: no `ModifyTable` or `LockRows` node in `EXPLAIN`, run in a
//!   `READ ONLY` transaction; SQLite: `sqlite3_stmt_readonly`) and return 2 columns
//!   (`locate`) or 1 (`verify`); `erase`'s plan writes the declared table and nothing else
//!   (PostgreSQL: its `ModifyTable` nodes; SQLite: every b-tree its bytecode opens for writing
//!   or clears, and no trigger program). The reads also run in a read-only transaction, so a
//!   function that writes fails them.
//! - **Erase**: one transaction per batch, the `erase` statement once per locator, the
//!   affected rows summed and held to the locators' counts ([`crate::within_inventory`]: past
//!   it, the batch rolls back, `AnomalousVolume`). Idempotent: a locator already gone deletes 0.
//! - **Verify**: the larger of `verify`'s count and the rows `locate` still finds.
//! - **Scopes**: subject always; memory with `locate_memory`/`verify_memory`, else `EXEMPT`
//!   with the reason; tenant with `locate_tenant`/`verify_tenant`, else refused
//!   (`inexpressible`): a table of subjects' rows holds the tenant's, and an offboarding that
//!   left them would be certified.
//!
//! Not checked: what the rows mean (that `locate` finds every row of the subject is the
//! config's claim); that a locator names only the rows counted for it (the anomaly guard
//! catches more, not other); functions an `erase` calls.
//!
//! Locators: `locate`'s first column as text (its rows summed per locator).

mod adapter;
mod config;
mod statement;
#[cfg(test)]
mod tests;

pub use adapter::SqlTarget;
pub use config::Config;
