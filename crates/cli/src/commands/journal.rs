//! `lethe journal verify`: the hash chain, every job's replay, and the chain's seals under the
//! deployment's public key; `--seal` signs the verified head.

use std::path::Path;

use ed25519_dalek::{SigningKey, VerifyingKey};
use lethe_engine::{Config, EngineError};
use lethe_journal::chain::{ChainReport, Seal};
use lethe_journal::Journal;
use serde_json::json;

use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::{self, print_json};

/// Walks the whole chain and checks its seals; with `seal`, signs the verified head. Exit 1 if
/// the chain is broken or a seal does not hold.
pub(crate) fn verify(
    config: &Path,
    json: bool,
    seal: bool,
    public_key: Option<&str>,
) -> Result<i32, Exit> {
    let (r, sealed_now) = match public_key {
        // Someone holding only the published key: the journal, not the deployment's key file.
        Some(pk) => {
            let key = output::parse_public_key(pk).map_err(bad)?;
            let cfg = Config::load(config).map_err(crate::exit::config)?;
            let journal = lethe_engine::open_journal(&cfg)?;
            check(&journal, &key, None)?
        }
        None => {
            let engine = open_engine(config)?;
            let signing = engine.key().signing_key();
            let key = signing.verifying_key();
            check(engine.journal(), &key, seal.then_some(&signing))?
        }
    };
    if json {
        print_json(&json!({
            "intact": r.is_intact(),
            "entries": r.entries,
            "jobs": r.jobs,
            "problems": r.problems,
            "sealed": r.sealed,
            "sealed_now": sealed_now,
        }));
    } else if r.is_intact() {
        outln!(
            "Journal intact: {} entries, {} jobs replayed.",
            r.entries,
            r.jobs
        );
        match (sealed_now, r.sealed) {
            (Some(s), _) => outln!(
                "Sealed now: entries 1 to {} signed with the deployment key (entry {}).",
                s.covers,
                s.entry
            ),
            (None, Some(s)) => outln!(
                "Sealed up to entry {} (seal at entry {}): a rewrite of those entries is detected under the public key alone.",
                s.covers,
                s.entry
            ),
            (None, None) => outln!(
                "Not sealed: no seal in this journal (one from before seals, or its seals were \
                 removed). Each job's completion seals it; `lethe journal verify --seal` seals \
                 it now."
            ),
        }
    } else {
        outln!("Journal BROKEN ({} entries read):", r.entries);
        for p in &r.problems {
            outln!("  - {p}");
        }
    }
    Ok(if r.is_intact() { 0 } else { 1 })
}

/// The report under `key`, and the seal made with `signing` if the chain is intact.
fn check(
    journal: &Journal,
    key: &VerifyingKey,
    signing: Option<&SigningKey>,
) -> Result<(ChainReport, Option<Seal>), Exit> {
    let r = journal.verify_sealed(key).map_err(EngineError::from)?;
    let sealed_now = match signing {
        Some(s) if r.is_intact() => journal
            .seal(
                &lethe_engine::rfc3339(time::OffsetDateTime::now_utc()),
                s,
                &r,
            )
            .map_err(EngineError::from)?,
        _ => None,
    };
    Ok((r, sealed_now))
}
