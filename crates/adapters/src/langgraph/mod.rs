//! The LangGraph adapters' logic, written once over the [`crate::sql`] facade: the
//! checkpointer (threads found by registry and metadata) and the store (namespaced items).
//!
//! Each kind folder (`langgraph_sqlite_checkpointer/` and the others) holds its config keys and
//! its dialect table: the SQL of its engine, its messages and what it describes itself as. This
//! module holds no SQL text and never asks which engine it runs on.

pub(crate) mod checkpointer;
pub(crate) mod store;
