//! `azure-ai-search`: documents of an Azure AI Search index (REST API, `api-version`
//! 2024-07-01 by default) whose fields carry the Lethe tenant and subject. The service has no
//! delete by query, so this is the runbook's "query, then delete by key".
//!
//! - **Finding a scope's documents**: an OData `$filter` built from string literals whose
//!   single quotes are doubled (`user_id eq 'o''brien'`), never concatenated from an
//!   identifier: `<tenant> eq 'T' and <subject> eq 'S'` (a tenant scope: the tenant's clause
//!   alone; a memory scope adds `<memory> eq 'M'`). Field names are checked as OData
//!   identifiers at parse. `eq` on a string field is exact (case and length count), so a longer
//!   id, another case or the same subject under another tenant never match, and an identifier
//!   that looks like OData (`x' or true or 'a`) stays one literal.
//! - **Memory scope**: only with `memory` (the field holding a memory id); without it the
//!   target is `EXEMPT` for memory scopes (its documents name no memory). Azure keeps no
//!   versions: a version given is not checked here.
//! - **Inventory**: the keys only (`select` of the key field), paged by the key, never by
//!   `skip` (which stops at 100,000): `orderby=<key> asc`, `top=1000`, and from the second page
//!   `(<filter>) and <key> gt '<last key>'`. The first page asks for `count`; a walk that finds
//!   fewer keys than that count is `unavailable` (the index changed, or its key order is not
//!   the one `gt` compares by), never a short inventory. Locators `k:<hex key>`, one row each.
//! - **Erase**: per batch, the keys are read back (`search.in` on the key, `select` of the key,
//!   tenant, subject and memory fields; no content is read); a key that exists without the
//!   scope's values, byte for byte, stops the batch before anything is deleted
//!   (`anomalous_volume`). Then Index Documents with `@search.action: delete` for those keys
//!   only (at most 1,000 actions a request): a delete by key cannot reach beyond the frozen
//!   inventory. A 207 is read per document: 200 counts one, 404 counts zero, 409, 422, 429 and
//!   5xx are `unavailable`, anything else `failed`.
//! - **Verify**: the filter's `count` plus the frozen keys still present, polled: the index is
//!   eventually consistent (a deleted document stays visible for a while, and replicas catch up
//!   at different times), so zero counts only once it has held on every poll for `settle_ms`
//!   (and at least two polls); at `verify_timeout_ms` what was last seen is the residue (the
//!   job is BLOCKED `residue`, and a resume checks again).
//! - **Requests** go through the `http` kind's client (`crate::http::client`): no redirects,
//!   no proxy, a timeout per request, 429 and 503 retried after their `Retry-After` (up to
//!   `retry_after_max_ms`), 5xx and connection failures retried with backoff `retries` times,
//!   then `unavailable`. The key goes in the `api-key` header and nowhere else.
//!
//! Messages carry the operation and the HTTP status, never the service's message text (which
//! may echo a filter), an identifier, a key, a document or the api key.

mod adapter;
mod config;
#[cfg(test)]
mod tests;

pub use adapter::AzureAiSearch;
pub use config::Config;
