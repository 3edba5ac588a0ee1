//! The gate: how running agents are kept from writing an erased person's memory back. This
//! crate is the gate's home: its types, and the closed set of authorities that enforce it.
//!
//! - The types ([`GateError`] with its stable codes, [`Sink`], [`Lease`], [`Permit`],
//!   [`GateState`], [`Freeze`]) are defined as plain data in `lethe_core::gate`, since the
//!   journal, on which this crate depends, names them too; use them from here.
//! - [`Authority`]: the in-process gate or the control store's, whichever governs a journal.
//! - [`MemoryGate`] (`memory.rs`): leases and permits in memory, for runtimes in this process.
//! - [`JournalGate`] (`journal.rs`): leases and permits as rows in the control store; the rules
//!   and SQL are the journal's, whose freeze commits with its journal entry.
//! - [`pg`]: the control store's gate on PostgreSQL, asynchronous and group-committed, for
//!   `lethe serve`.
//!
//! Not here: HTTP (`lethe-server`), or when a job freezes and drains (`lethe-engine`).

mod authority;
mod journal;
mod memory;
pub mod pg;

pub use authority::Authority;
pub use journal::JournalGate;
pub use lethe_core::gate::{Freeze, GateError, GateState, Lease, Permit, Sink};
pub use memory::MemoryGate;
