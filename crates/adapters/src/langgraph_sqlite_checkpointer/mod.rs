//! `langgraph-sqlite-checkpointer`: LangGraph's `SqliteSaver` tables, `checkpoints` and `writes`.
//!
//! Checkpointer tables have no owner column. A subject's threads come from the application's
//! thread registry (a table, possibly in another file), from keys inside `checkpoints.metadata`
//! (LangGraph copies the run config's metadata there), or both: both means the union, so a thread
//! missing from the registry is still found. The registry's rows are erased last, after the
//! threads they point to, so a crash never loses track of a thread.
//!
//! Locators: `0:<thread_id>` for a thread's checkpoints and writes, `1:<thread_id>` for its
//! registry rows; sorted, the registry comes last.
//!
//! Memory scopes do not apply: threads are not addressed by memory id (the target is reported
//! EXEMPT with that reason; lineage from memories to threads is future work).

mod adapter;
mod config;

pub use adapter::Checkpointer;
pub use config::Config;
