//! `langgraph-sqlite-store`: LangGraph's `SqliteStore` tables, `store` and `store_vectors`.
//!
//! This module is the kind's config keys (`config.rs`) and its SQLite dialect (`sql.rs`); the
//! store's logic, shared with PostgreSQL, is [`crate::langgraph::store`].
//!
//! LangGraph stores a namespace as its labels joined by `.` in `store.prefix`. A target's
//! `namespace` template (`["{tenant}", "{subject}"]`) names the labels that make a scope's
//! namespace; matching is label-exact: the prefix equals the scope's namespace, or starts with
//! it followed by `.`. So `(acme, u1)` never matches `(acme, u10)`, nested namespaces are
//! counted once, and there is no listing limit. The match is a byte range on the primary-key
//! index (`prefix >= 'acme.u1.' AND prefix < 'acme.u1/'`), not `LIKE`, which in SQLite is
//! case-insensitive and would need every `%` and `_` escaped.
//!
//! Rows past their TTL are counted and erased (normal reads hide them; they are still on disk).
//! `store_vectors` rows are erased explicitly: SQLite does not cascade unless the connection
//! turns foreign keys on, and LangGraph's `SqliteStore.delete` leaves them behind.
//!
//! An identifier containing `.` cannot be one namespace label: such a scope is refused.
//!
//! Memory scope: the memory id is the namespace suffix and the key, `memories/k42`; the version
//! is the item's `updated_at`.
//!
//! Locators: the JSON array `[prefix, key]`.

mod config;
mod sql;

pub use crate::langgraph::store::Store;
pub use config::Config;
