//! `http`: a vendor's API, reached through request templates for what the vendor does not
//! give Lethe a store for (a CRM's notes, a support desk's tickets).
//!
//! - **Locate** (`locate`, and `locate_tenant`, `locate_memory` for those scopes): a request
//!   whose JSON answer lists the scope's items; `items` points at the array, `id` at an item's
//!   id (the locator), `count` at its rows (default 1).
//! - **Erase** (`erase`): one request per locator, with `{locator}` in it. 2xx counts the
//!   item's rows (or the number at `deleted`); 404 and 410 count zero, except after an attempt
//!   whose answer was lost (the item was listed by this call's locate, so that attempt erased
//!   it). 202 is polled at its `Location` (or the URL at `status.url`) until `status.done`
//!   reads `done_value`, within `poll_timeout_ms`; unfinished, the job is BLOCKED
//!   (`target_unavailable`) and a resume sends the same request with the same key.
//! - **Verify**: locate again, and, with a `get` request, read back every frozen locator the
//!   locate no longer lists (2xx: still there; 404/410: gone).
//! - **Identifiers** go only whole and encoded (`template.rs`): a path segment, a query value, a
//!   JSON string value. Everything else is refused at parse; a `.` or `..` value where a path
//!   segment takes it is inexpressible.
//! - **Requests** (`client.rs`): an `Idempotency-Key` per request (a SHA-256 of the target,
//!   the operation and the locator: the same on every retry, run and job), the token from
//!   `token_file` as `Authorization: Bearer`, no redirects, no proxy, a timeout per request,
//!   retries with backoff that honour `Retry-After`. No message holds a URL, a response body or
//!   the token.
//!
//! Locators are the vendor's ids as it gives them (a number as its decimal text).

mod adapter;
pub(crate) mod client;
mod config;
mod template;
#[cfg(test)]
mod tests;

pub use adapter::Http;
pub use config::Config;
