//! `langgraph-postgres-checkpointer`: LangGraph's `PostgresSaver` tables, `checkpoints`,
//! `checkpoint_blobs` and `checkpoint_writes`.
//!
//! This module is the kind's config keys (`config.rs`) and its PostgreSQL dialect (`sql.rs`);
//! the checkpointer's logic, shared with SQLite, is [`crate::langgraph::checkpointer`].
//! Threads are found as on SQLite: the application's registry table (any schema and columns,
//! possibly in another database), keys of `checkpoints.metadata`, or both as a union; registry
//! rows are erased last. Deletes are set-based: one `DELETE ... WHERE thread_id = ANY($1)` per
//! table per batch of threads, in one transaction with the anomaly guard, so the cost is a few
//! round trips per batch whatever the subject's size.
//!
//! `checkpoints.metadata` is `jsonb` and LangGraph does not index it, so finding threads by
//! metadata scans the table. On a large table, add the index this query can use:
//! `CREATE INDEX CONCURRENTLY checkpoints_owner_idx ON checkpoints ((metadata->>'tenant_id'), (metadata->>'user_id'));`
//! (with your key names).
//!
//! Locators: `0:<thread_id>` (checkpoints, blobs, writes), `1:<thread_id>` (registry rows).

mod config;
mod sql;

pub use crate::langgraph::checkpointer::Checkpointer;
pub use config::Config;
