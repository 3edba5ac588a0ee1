//! `lethe hold`: legal holds, which keep a tenant's or a subject's jobs from touching anything.

use std::path::Path;

use lethe_engine::EngineError;
use serde_json::json;

use crate::args::HoldCommand;
use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::{print_json, Table};
use crate::scope_input::{escaped, hold_ids, looks_like_another, parse_scope, warn_if_lookalike};

/// Places, releases or lists holds.
pub(crate) fn run(config: &Path, command: HoldCommand) -> Result<i32, Exit> {
    // The scope is read and checked before the journal opens: bad input touches
    // nothing, not even a new journal or key file (review).
    let scope = match &command {
        HoldCommand::Add {
            tenant,
            subject,
            scope_file,
            ..
        }
        | HoldCommand::Release {
            tenant,
            subject,
            scope_file,
        } => {
            let ids = hold_ids(tenant.clone(), subject.clone(), scope_file.as_deref())?;
            let scope = parse_scope(&ids)?;
            Some((ids, scope))
        }
        HoldCommand::List { .. } => None,
    };
    let engine = open_engine(config)?;
    match command {
        HoldCommand::Add { reason, .. } => {
            let (ids, scope) = scope.expect("read above");
            // A hold matches byte for byte: an identifier that prints like another
            // (spaces at an end, an invisible character, a letter decomposed into a
            // combining accent) would hold nobody while it looks right in `hold list`.
            warn_if_lookalike(&ids, "the hold covers");
            let id = engine.add_hold(scope.tenant(), scope.subject(), reason.as_deref())?;
            outln!(
                "Hold {id} placed on {} scope {}.",
                scope.kind(),
                engine.scope_hash(&scope)
            );
        }
        HoldCommand::Release { .. } => {
            let (_, scope) = scope.expect("read above");
            let ids = engine.release_holds(scope.tenant(), scope.subject())?;
            if ids.is_empty() {
                return Err(bad(
                    "no active hold on exactly that scope; `lethe hold list` shows them",
                ));
            }
            outln!("Released {}.", ids.join(", "));
        }
        HoldCommand::List { json } => {
            let holds = engine.journal().holds().map_err(EngineError::from)?;
            if json {
                print_json(&json!(holds));
            } else {
                // An identifier that prints like another (`bob ` and `bob`) is shown
                // quoted, its invisible characters escaped (newcomer review: two such
                // holds looked the same).
                let shown = |id: String| {
                    if looks_like_another(&id) {
                        escaped(&id)
                    } else {
                        id
                    }
                };
                let mut t = Table::new(&["HOLD", "TENANT", "SUBJECT", "SINCE", "REASON"]);
                for h in holds {
                    t.row(vec![
                        h.hold_id,
                        shown(h.tenant),
                        h.subject
                            .map(shown)
                            .unwrap_or_else(|| "(whole tenant)".into()),
                        h.created_at,
                        h.reason.unwrap_or_default(),
                    ]);
                }
                t.print();
            }
        }
    }
    Ok(0)
}
