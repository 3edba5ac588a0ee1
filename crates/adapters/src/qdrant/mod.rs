//! `qdrant`: points of a Qdrant collection whose payload carries the Lethe tenant and subject
//! (REST API, Qdrant 1.x).
//!
//! - **Finding a scope's points**: a filter of `must` conditions `{"key": K, "match": {"value":
//!   V}}`, built as JSON: an identifier is one JSON string, so `{"$ne": ""}` stays data, and
//!   `match.value` on a string is exact (case and length count). Every point found is read back
//!   (its owner keys only, no vector) and must hold the identifiers as single strings, byte for
//!   byte: `match` also matches one member of a list, and a point holding a list cannot be said
//!   to be one subject's (the inventory fails, naming the key).
//! - **Memory scope**: the memory id is the point id (an unsigned integer, or a UUID), under
//!   the scope's tenant and subject; only the canonical text is accepted (Qdrant reads `0042`
//!   as 42 and an upper-case UUID as its lower-case form). Qdrant keeps no versions.
//! - **Inventory**: a scroll of the filter, following `next_page_offset` in pages of 1,000
//!   (the default page is 10), checked against an exact count (`exact: true`: the default
//!   count is an estimate). Locators `p:<hex id>`, one point each.
//! - **Erase**: per batch, the points are retrieved by id; one present without the scope's
//!   values stops the batch before anything is deleted (`anomalous_volume`). Then
//!   `POST points/delete?wait=true` with the scope's filter narrowed by `has_id` to those
//!   points, so a delete cannot reach beyond the batch. The answer says neither what it
//!   deleted nor, without `wait=true`, that it was applied: the count is an exact count of the
//!   same filter before, and a count after must be zero.
//! - **Verify**: an exact count of the filter, plus the frozen points still present (whoever
//!   they belong to now).
//! - **Requests**: the `http` kind's client, at most `max_in_flight` at once for the target;
//!   429 retried after `Retry-After`. The key goes in the `api-key` header only. Messages never
//!   hold Qdrant's error text (it may quote a filter value).

mod adapter;
mod config;
#[cfg(test)]
mod tests;

pub use adapter::Qdrant;
pub use config::Config;
