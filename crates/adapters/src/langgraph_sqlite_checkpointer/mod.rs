//! `langgraph-sqlite-checkpointer`: LangGraph's `SqliteSaver` tables, `checkpoints` and `writes`.
//!
//! This module is the kind's config keys (`config.rs`) and its SQLite dialect (`sql.rs`); the
//! checkpointer's logic, shared with PostgreSQL, is [`crate::langgraph::checkpointer`].
//! A subject's threads come from the application's thread registry (a table, possibly in
//! another file), from keys inside `checkpoints.metadata`, or both (the union). The registry's
//! rows are erased last, after the threads they point to.
//!
//! Locators: `0:<thread_id>` for a thread's checkpoints and writes, `1:<thread_id>` for its
//! registry rows; sorted, the registry comes last.
//!
//! Memory scopes do not apply: threads are not addressed by memory id (the target is reported
//! EXEMPT with that reason; lineage from memories to threads is future work).

mod config;
mod sql;

pub use crate::langgraph::checkpointer::Checkpointer;
pub use config::Config;
