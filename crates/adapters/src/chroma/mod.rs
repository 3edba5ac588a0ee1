//! `chroma`: a Chroma collection (a vector database; REST API v2, `chroma run` or a Chroma
//! server), whose documents carry the Lethe tenant and subject in their metadata.
//!
//! - **Finding a scope's documents**: a `where` filter built as a JSON object, never from text:
//!   `{"$and": [{<tenant key>: {"$eq": T}}, {<subject key>: {"$eq": S}}]}` (a tenant scope: the
//!   tenant's clause alone). An identifier is only ever a JSON string under `$eq`, so one that
//!   looks like an operator (`$ne`, `{"$gt": ""}`) stays data, and Chroma's `$eq` on a string
//!   is exact: a longer id, another case or the same subject under another tenant never match.
//! - **Memory scope**: with `memory` set, the document whose metadata `memory` key holds the
//!   memory id (and the tenant's and subject's keys the scope's); without it, the memory id is
//!   the document id, still only if the document carries the scope's tenant and subject.
//!   Chroma keeps no versions: a version given is not checked here.
//! - **Inventory**: the matching documents' ids, paged by `get` with `limit`/`offset` and
//!   `include: []` (no document text, vector or metadata is read). Locators `d:<hex id>`, one
//!   row each.
//! - **Erase**: per batch, the ids are read back by `get` with their metadata (never their
//!   documents or vectors); an id that exists but whose metadata no longer carries the scope,
//!   byte for byte (another owner's document in the batch), stops the batch before anything is
//!   deleted (`anomalous_volume`). Then `delete` by those ids alone, never by a filter, so the
//!   delete cannot reach beyond the frozen inventory; the `deleted` count Chroma answers goes
//!   through the anomaly guard. (Not by ids and `where` together: Chroma evaluates that per
//!   id, 1.3 s for 100 ids among 20,000.) Chroma has no transactions: a writer that re-tags a
//!   document between the read-back and the delete is not seen.
//! - **Verify**: the filter's ids now (written after the inventory too) and the frozen ids
//!   still present.
//! - **Physical residue** (`path`, the persist folder): [`Chroma::physical_residue`] reads
//!   `chroma.sqlite3` read-only and counts the rows that still name an erased id: Chroma keeps
//!   every write in `embeddings_queue` (document text, metadata and vector included) after the
//!   delete. Through [`crate::Adapter::physical`] the certificate reports it (`physical`, per
//!   target) and `lethe verify --physical` re-checks it while the
//!   job still keeps the erased ids (completion drops them).
//!
//! Errors: connection failures, timeouts, 5xx and 429 are `unavailable` (retryable); other 4xx
//! are `failed`. Messages carry Chroma's error type and status, never its message text (which
//! may echo a value) and never an identifier or a document.

mod adapter;
mod config;
#[cfg(test)]
mod tests;

pub use adapter::{Chroma, PhysicalResidue};
pub use config::Config;
