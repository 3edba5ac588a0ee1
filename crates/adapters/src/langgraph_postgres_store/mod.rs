//! `langgraph-postgres-store`: LangGraph's `PostgresStore` tables, `store` and, when the store
//! has an index, `store_vectors` (pgvector).
//!
//! This module is the kind's config keys (`config.rs`) and its PostgreSQL dialect (`sql.rs`);
//! the store's logic, shared with SQLite, is [`crate::langgraph::store`].
//!
//! Namespaces are matched label-exactly as on SQLite (see `namespace`): the prefix equals the
//! scope's namespace, or is `LIKE` it followed by `.%`, with `\`, `%` and `_` in identifiers
//! escaped so each matches only itself. LangGraph's `store_prefix_idx` (`text_pattern_ops`)
//! serves that `LIKE`. No listing limit; rows past their TTL are counted and erased.
//!
//! `store_vectors` references `store` with `ON DELETE CASCADE`, which a session cannot turn off
//! without superuser rights: the adapter deletes an item's vectors explicitly first, then the
//! item, so every deleted row is counted and the cascade finds nothing.
//!
//! Memory scope: the memory id is `label/.../key`; the version is the item's `updated_at` in
//! UTC as `YYYY-MM-DDTHH:MM:SS.ffffffZ`.

mod config;
mod sql;

pub use crate::langgraph::store::Store;
pub use config::Config;
