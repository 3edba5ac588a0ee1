//! `opensearch`: documents of an OpenSearch or Elasticsearch index whose keyword fields carry
//! the Lethe tenant and subject (REST API; OpenSearch 1.x to 3.x, Elasticsearch 7.x to 9.x).
//!
//! - **Finding a scope's documents**: a `bool` `filter` of one `term` per identifier, built as
//!   JSON (`{"term": {"user_id": {"value": "o'brien"}}}`), never `match` and never a query
//!   string: an identifier is one JSON string, so `{"$ne": ""}` or `*` stays data. The probe
//!   checks both fields are mapped `keyword`: a `term` on a `text` field matches any analysed
//!   word (`alice` would match `Alice Smith`). Every hit is read back (its `_source` owner
//!   fields only) and must hold the identifiers as single strings, byte for byte.
//! - **Memory scope**: the memory id is the document's `_id` (with the scope's tenant and
//!   subject). The index's `_version` counts writes and is not the memory's version (a LangGraph
//!   store's `updated_at`): a version given is not checked here, as for Chroma and Azure.
//! - **Inventory**: after a `_refresh` (search sees only refreshed segments: a write
//!   acknowledged a moment ago is invisible without it), a scroll in pages of 1,000 (`from`
//!   stops at `max_result_window`, 10,000 by default), with `track_total_hits`; a scroll that
//!   finds fewer than the total is `unavailable`. Locators `d:<hex id>`, one document each.
//! - **Erase**: per batch, the ids are read back by an `ids` query; an id present without the
//!   scope's values stops the batch before anything is deleted (`anomalous_volume`). Then
//!   `_delete_by_query?conflicts=proceed&refresh=true&wait_for_completion=false` of the scope's
//!   filter narrowed to those ids, with `max_docs` = their number: it cannot delete a document
//!   outside the batch. The answer is a task id; `GET _tasks/<id>` is polled until it
//!   completed (within `task_timeout_ms`), and its `response.deleted` is the count. Version
//!   conflicts (a document written while the task ran) and failures leave the batch
//!   `unavailable`: a resume deletes what is left. `conflicts=proceed` makes the task go on past
//!   a conflict instead of aborting the batch at the first.
//! - **Verify**: after a `_refresh`, `_count` of the filter, plus the frozen ids still present
//!   (whoever they belong to now).
//! - **Requests**: the `http` kind's client (no redirects, no proxy, a timeout, 429 and 503
//!   retried after `Retry-After`, 5xx and dropped connections with backoff), at most
//!   `max_in_flight` at once for the target. Messages name the operation, the status and the
//!   server's `error.type`, never its `reason` (which may quote a query), an id or a credential.

mod adapter;
mod config;
/// The contract double the tests run this kind against, for other crates' tests too (feature
/// `test-doubles`).
#[cfg(any(test, feature = "test-doubles"))]
#[allow(missing_docs)]
pub mod double;
#[cfg(test)]
mod tests;

pub use adapter::OpenSearch;
pub use config::Config;
