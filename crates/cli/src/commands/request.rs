//! `lethe request`: record, list and reject erasure requests, and pause the intake, with the
//! same rules as `lethe serve`'s `/v1/requests` (`lethe_engine::requests`). `lethe approve`,
//! which runs the job, is in `erase.rs`.

use std::path::Path;

use lethe_core::Basis;
use lethe_engine::config::Role;
use lethe_engine::requests::{days_left, RequestInput};
use lethe_engine::EngineError;
use serde_json::json;

use crate::args::RequestCommand;
use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::{print_json, short_hash, Table};
use crate::scope_input::checked_scope;
use crate::secret::holder;

/// Runs a `lethe request` subcommand.
pub(crate) fn run(config: &Path, command: RequestCommand) -> Result<i32, Exit> {
    match command {
        RequestCommand::Create {
            scope,
            basis,
            ticket,
            received_at,
            identity_verified,
            deadline,
            extension_reason,
            token_file,
            json,
        } => {
            // Everything is read and checked before the journal opens: bad input touches
            // nothing.
            let scope = checked_scope(&scope, "the request covers")?;
            let basis: Basis = basis.parse().map_err(bad)?;
            let received_at =
                lethe_engine::requests::parse_received(&received_at).ok_or_else(|| {
                    bad("--received-at must be an RFC 3339 time with its offset \
                     (2026-12-01T09:30:00Z) or a day (2026-12-01)")
                })?;
            let deadline = deadline
                .map(|d| {
                    time::Date::parse(
                        &d,
                        &time::macros::format_description!("[year]-[month]-[day]"),
                    )
                })
                .transpose()
                .map_err(|_| bad("--deadline must be YYYY-MM-DD"))?;
            let by = holder(config, token_file.as_deref(), &[Role::Requester])?;
            let engine = open_engine(config)?;
            let rec = engine.submit_request(
                RequestInput {
                    scope,
                    basis,
                    ticket,
                    received_at,
                    deadline,
                    extension_reason,
                    identity_verified,
                },
                &by,
            )?;
            if json {
                print_json(
                    &json!({"request_id": rec.request_id, "deadline": rec.deadline, "state": rec.state}),
                );
            } else {
                outln!(
                    "Request {} recorded (PENDING), deadline {}: `lethe approve {}` by another \
                     approver starts its job.",
                    rec.request_id,
                    rec.deadline,
                    rec.request_id
                );
            }
            Ok(0)
        }
        RequestCommand::List { json } => {
            let engine = open_engine(config)?;
            let all = engine.journal().requests().map_err(EngineError::from)?;
            let today = time::OffsetDateTime::now_utc().date();
            if json {
                print_json(&json!(all
                    .iter()
                    .map(|r| json!({
                        "request_id": r.request_id, "state": r.state, "scope": r.scope.kind(),
                        "scope_hash": r.scope_hash, "basis": r.basis, "ticket": r.ticket,
                        "received_at": r.received_at, "deadline": r.deadline,
                        "days_left": days_left(&r.deadline, today),
                        "identity_verified": r.identity_verified,
                        "requested_by": r.requested_by, "decided_by": r.decided_by,
                        "reject_reason": r.reject_reason, "job_id": r.job_id,
                    }))
                    .collect::<Vec<_>>()));
            } else {
                let mut t = Table::new(&[
                    "REQUEST", "STATE", "SCOPE", "DEADLINE", "DAYS", "BY", "DECIDED", "JOB",
                ]);
                for r in all {
                    t.row(vec![
                        r.request_id,
                        format!("{:?}", r.state).to_uppercase(),
                        short_hash(&r.scope_hash),
                        r.deadline.clone(),
                        days_left(&r.deadline, today).map_or("-".into(), |d| d.to_string()),
                        r.requested_by,
                        r.decided_by.unwrap_or_else(|| "-".into()),
                        r.job_id.unwrap_or_else(|| "-".into()),
                    ]);
                }
                t.print();
            }
            Ok(0)
        }
        RequestCommand::Reject {
            request_id,
            reason,
            token_file,
        } => {
            let by = holder(config, token_file.as_deref(), &[Role::Approver])?;
            let engine = open_engine(config)?;
            engine.reject_request(&request_id, &by, &reason)?;
            outln!("Request {request_id} rejected.");
            Ok(0)
        }
        RequestCommand::Intake { switch, token_file } => {
            let by = holder(config, token_file.as_deref(), &[])?;
            let engine = open_engine(config)?;
            let paused = switch == "pause";
            let changed = engine.set_intake_paused(paused, &by)?;
            let now = if paused { "paused" } else { "open" };
            if changed {
                outln!("Intake {now}.");
            } else {
                outln!("Intake was {now} already.");
            }
            Ok(0)
        }
    }
}
