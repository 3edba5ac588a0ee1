//! `langgraph-redis-cache`: LangGraph's node cache (`RedisCache`, keys
//! `langgraph:cache:<namespace>:<input hash>`), which holds a node's output for an input and
//! so a person's text, keyed by no subject.
//!
//! - **Exact entries**: a runtime that uses Lethe's Python package writes the cache through
//!   `Gate.cache(...)`, which adds each entry's key to the subject's index set
//!   (`index`, default `lethe:lg-cache:{tenant}:{subject}`). Erasing the subject unlinks the
//!   keys its set lists, then the set. A memory scope takes the subject's whole set: an entry
//!   is derived from a run's whole input, so any of them may hold the memory (a cache is
//!   recomputable).
//! - **Legacy entries**: keys under `prefix` that no index set lists (written before the
//!   package, or around it). No pattern finds their owner, so `legacy` decides, and the
//!   certificate says which and how many: `refuse` (the default) blocks the job
//!   (`legacy_derived`), `flush` erases every legacy entry of this cache with the scope,
//!   `expire` leaves them to their TTL and marks the target `PENDING_EXPIRY` until the last
//!   one goes (an entry without TTL refuses). Never a guess by content.
//! - **Reaching Redis**: the `redis` kind's connection keys and client (standalone, cluster,
//!   TLS); keys are unlinked one at a time at their owner node.
//!
//! Locators: `k:<hex key>` an indexed entry, `l:<hex key>` a legacy entry to flush,
//! `x:<expiry ms>:<entries>` legacy entries left to expire (no rows), `z:<hex key>` the index
//! set (sorted last).

mod adapter;
mod config;
#[cfg(test)]
mod tests;

pub use adapter::NodeCache;
pub use config::Config;
