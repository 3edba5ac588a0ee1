//! Lethe's pure core: the words of docs/design.md as types, and nothing that touches a store.
//!
//! - [`ident`]: identifiers (tenant, subject, memory id, version) as validated newtypes.
//! - [`scope`]: what one request erases, its canonical encoding and its keyed hash.
//! - [`state`]: the job states and the pure transition function.
//! - [`basis`]: legal bases and their deadlines.
//! - [`keys`]: the deployment key and the two keys derived from it.
//! - [`certificate`]: the signed completion proof.
//! - [`clock`]: the injected source of time.
//! - [`gate`]: the gate's refusals, sinks, leases, permits and freezes, as plain data
//!   (`lethe-gate` is their home and re-exports them).
//! - [`redact`]: parser messages without the values they quote.
//! - [`object`]: structs read from user input only as objects with named fields.
//!
//! Start with [`state::transition`]; everything the engine does is driven by it.

pub mod basis;
pub mod certificate;
pub mod clock;
pub mod gate;
pub mod ident;
pub mod keys;
pub mod object;
pub mod redact;
pub mod scope;
pub mod state;

pub use basis::Basis;
pub use ident::{IdentError, MemoryId, Subject, Tenant, Version};
pub use object::Object;
pub use redact::redact_quoted;
pub use scope::{Scope, ScopeError, ScopeHash, ScopeKind};
pub use state::{BlockedReason, Event, JobState};
