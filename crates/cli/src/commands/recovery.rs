//! `lethe recovery --target NAME [--since TIME]`: completed erasures replayed into a restored
//! store.

use std::path::Path;

use lethe_engine::{RecoveryOptions, RecoveryProgress};

use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::print_json;

/// Exit 0 verified; 1 the target unreachable or a scope not clean (fences stay closed); 2 bad
/// input.
pub(crate) fn run(
    config: &Path,
    target: &str,
    since: Option<time::OffsetDateTime>,
    json: bool,
) -> Result<i32, Exit> {
    if since.is_some_and(|s| s > time::OffsetDateTime::now_utc()) {
        return Err(bad(
            "--since is in the future: give the time the restored backup was taken",
        ));
    }
    if since.is_none() && !json {
        eprintln!(
            "warning: no --since: every completed erasure is replayed. A person who came back \
             after being erased, and whose new data the restored backup holds, loses that too; \
             give the backup's time to replay only what the backup predates."
        );
    }
    let engine = open_engine(config)?;
    let opts = RecoveryOptions {
        since,
        pause_at: lethe_engine::pause_from_env(),
    };
    let mut progress = |p: RecoveryProgress| {
        if json {
            return;
        }
        match p {
            RecoveryProgress::Fenced { scopes, resumed } => eprintln!(
                "{} {scopes} completed erasure(s) to replay into {target}; their scopes are \
                 fenced at the gate until verified.",
                if resumed {
                    "Resuming the recovery an earlier run left:"
                } else {
                    "Recovery started:"
                }
            ),
            RecoveryProgress::Replayed { done, total } => {
                if done == total || done % 100 == 0 {
                    eprintln!("  replayed and verified {done}/{total}");
                }
            }
        }
    };
    let report = engine.recover(target, &opts, &mut progress)?;
    if json {
        print_json(&report);
    } else {
        outln!(
            "Recovery {} of target {}: {} scope(s) replayed and verified clean, {} row(s) \
             erased; fences open. Signed report: {}.",
            report["recovery_id"].as_str().unwrap_or("-"),
            target,
            report["scopes"].as_array().map_or(0, Vec::len),
            report["erased"],
            engine
                .certificates_dir()
                .join(format!(
                    "{}.json",
                    report["recovery_id"].as_str().unwrap_or("-")
                ))
                .display()
        );
    }
    Ok(0)
}
