//! `langsmith`: traces of a LangSmith tracing project whose runs carry the Lethe tenant and
//! subject in their metadata (`extra.metadata`, which LangGraph fills from the run config's
//! `metadata`). A trace is erased whole when any of its runs carries the scope.
//!
//! - **Finding a scope's traces**: `POST /api/v1/runs/query` over the project, following
//!   `cursors.next` in pages of 100, with one filter, `eq(metadata_key, "<subject key>")` (the
//!   tenant's key for a tenant scope): no identifier is put into LangSmith's filter language,
//!   whose quoting its reference does not specify. Each run's metadata is compared here: each
//!   identifier a JSON string equal byte for byte, so a longer id, another case or another
//!   tenant's subject never match, and `{"$ne": ""}` is just a string. Only `id`, `trace_id`
//!   and `extra` are selected: no inputs or outputs are read.
//! - **Inventory**: each trace found read back whole (`trace`), at most `max_in_flight` at
//!   once; locators `t:<trace id>` with the trace's runs.
//! - **Erase**: each frozen trace read back; one grown since the freeze, or no longer holding a
//!   run of the scope, blocks the batch before anything is deleted (`anomalous_volume`). Then
//!   `POST /api/v1/runs/delete` with `session_id` and at most 1,000 `trace_ids` a request.
//! - **Verify**: LangSmith accepts a delete and carries it out later (its guide: not instant,
//!   a job run off-peak, no confirmation), so the answer is no proof. Verification reads back
//!   the frozen traces and lists the scope again, every `poll_ms`, until nothing is readable or
//!   `verify_timeout_ms` passed; what is readable then is the residue (the job BLOCKED
//!   `residue`; `lethe resume` reads back again later).
//! - **Memory scope**: runs carry no memory id: `EXEMPT`.
//! - **Requests**: the `http` kind's client, at most `max_in_flight` at once, 429 retried after
//!   `Retry-After`; the key in `x-api-key` only (and `workspace_id` in `x-tenant-id`).
//!   Messages hold the operation and the status, never LangSmith's text, an id or the key.

mod adapter;
mod config;
/// The contract double the tests run this kind against, for other crates' tests too (feature
/// `test-doubles`).
#[cfg(any(test, feature = "test-doubles"))]
#[allow(missing_docs)]
pub mod double;
#[cfg(test)]
mod tests;

pub use adapter::LangSmith;
pub use config::Config;
