//! `lethe journal verify`: the hash chain and every job's replay.

use std::path::Path;

use lethe_engine::EngineError;
use serde_json::json;

use crate::exit::Exit;
use crate::open::open_engine;
use crate::output::print_json;

/// Walks the whole chain; exit 1 if it is broken.
pub(crate) fn verify(config: &Path, json: bool) -> Result<i32, Exit> {
    let engine = open_engine(config)?;
    let r = engine.journal().verify_chain().map_err(EngineError::from)?;
    if json {
        print_json(
            &json!({"intact": r.is_intact(), "entries": r.entries, "jobs": r.jobs, "problems": r.problems}),
        );
    } else if r.is_intact() {
        outln!(
            "Journal intact: {} entries, {} jobs replayed.",
            r.entries,
            r.jobs
        );
    } else {
        outln!("Journal BROKEN ({} entries read):", r.entries);
        for p in &r.problems {
            outln!("  - {p}");
        }
    }
    Ok(if r.is_intact() { 0 } else { 1 })
}
