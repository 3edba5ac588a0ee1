//! `redis`: cache keys on a standalone Redis or every primary of a Redis Cluster.
//!
//! - **Patterns that never widen** (`layout`): identifiers are glob-escaped in `SCAN MATCH`,
//!   an identifier holding its layout's separator is refused, and every key found is re-checked
//!   against the exact prefix before it is unlinked.
//! - **`mode = "scan"`**: cursor `SCAN` with `COUNT` on every primary (a scan sees one node),
//!   then single-key `UNLINK`s pipelined per node in slot order: never `KEYS`, never `DEL`, no
//!   multi-key command that could fail with `CROSSSLOT`.
//! - **`mode = "index"`**: a per-subject set lists the subject's keys; erasing reads it in
//!   pages (`SSCAN`) and unlinks the keys, then the set, without walking the keyspace; a set
//!   that lists a key written after the inventory stays, and verify counts both. A tenant
//!   scope is scanned, and so are its subjects' index sets (the index layout's tenant prefix,
//!   each key re-checked against the exact layout).
//! - **Verify**: by default a second keyspace scan plus the frozen keys, which finds keys a
//!   writer around the gate added after the inventory; `verify = "frozen"` checks only the
//!   frozen keys (one keyspace pass per job) and leaves the scan to `lethe verify --audit`.
//! - **Pacing**: `scan_count` (default 100) bounds how long one `SCAN` holds Redis's single
//!   thread; `scan_pause_ms` and `pipeline` leave other clients more room.
//! - **Redirects** (`resp`): `MOVED` and `ASK` during resharding are followed; a node that does
//!   not answer is a retryable error, so the job blocks and a rerun finishes. A cluster's
//!   keyspace pass counts only if the topology held still through it (`Redis::scan`).
//! - **TLS** (`resp`): `rediss://` over OpenSSL, the certificate chain and host always verified.
//!
//! Locators: `k:<hex key>` for a key, `z:<hex key>` for the index set (sorted last).

pub(crate) mod adapter;
pub(crate) mod config;
pub(crate) mod layout;
pub(crate) mod resp;
#[cfg(test)]
mod tests;

pub use adapter::Redis;
pub use config::Config;
