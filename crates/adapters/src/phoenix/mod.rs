//! `phoenix`: an Arize Phoenix project's traces (OpenInference spans, REST API `/v1`), whose
//! spans carry the Lethe tenant and subject in their OpenInference `metadata` attribute (a JSON
//! string LangGraph fills from the run config's metadata; Phoenix stores it parsed).
//!
//! - **Finding a scope's traces**: every span of the project is listed, paged by Phoenix's
//!   cursor (`GET /v1/projects/{project}/spans`, sorted by insertion id), and each span's
//!   metadata is read as JSON: the tenant's (and subject's) key must hold a JSON string equal,
//!   byte for byte, to the scope's identifier. Never a substring match on text and never
//!   Phoenix's own `attribute` filter (it compares JSON text that Python and SQLite escape
//!   differently for non-ASCII). A trace is in scope, whole, when ANY of its spans carries the
//!   scope: a trace shared by two subjects goes with either's erasure, the other subject's
//!   spans in it included.
//! - **Memory scope**: exempt (a trace holds no memory id; a memory's traces go with its
//!   subject).
//! - **Inventory**: locators `t:<hex of the trace id>`, each with the number of spans the trace
//!   holds (what deleting it removes).
//! - **Erase**: per batch, each trace's spans are read back first (by `trace_id`, in this
//!   project): a trace that now holds more spans than frozen (spans added since, perhaps
//!   another run's), or that no longer carries the scope, stops the batch before anything is
//!   deleted (`anomalous_volume`). Then `DELETE /v1/traces/{trace_id}`, one trace at a time; a
//!   404 (already gone) counts zero. A trace not seen in this project is never deleted.
//!   Phoenix has no transactions: a span added between the read-back and the delete is not
//!   seen.
//! - **Verify**: the project is listed again until no span carries the scope and no frozen
//!   trace is left, polled for at most `verify_timeout_ms` (a 204 is not proof).
//! - **Physical residue** (`path`, Phoenix's working folder): [`Phoenix::physical_residue`]
//!   reads `phoenix.db` and `phoenix.db-wal` as bytes, read-only, for the erased trace ids.
//!   Phoenix runs SQLite in WAL mode without `secure_delete`: a deleted span's page images stay
//!   in the `-wal` until a checkpoint, which moves them into `phoenix.db`'s freed space (kept
//!   until `VACUUM`; later writes to those pages copy them into the `-wal` again). Through
//!   [`crate::Adapter::physical`] the certificate reports it (`physical`, per target) and
//!   `lethe verify --physical` re-checks it while the
//!   job still keeps the erased ids (completion drops them).
//!
//! Errors: 429 and 503 are retried after their `Retry-After` (within `timeout_ms`); other 5xx,
//! connection failures and timeouts are `unavailable`; other 4xx `failed`. Messages carry the
//! operation and the HTTP status, never Phoenix's message text (it may echo a value), an
//! identifier, span content or the key.

mod adapter;
mod config;
#[cfg(test)]
mod tests;

pub use adapter::{PhysicalResidue, Phoenix};
pub use config::Config;
