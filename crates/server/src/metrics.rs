//! `GET /metrics`: Prometheus metrics in the OpenMetrics text format (`prometheus-client`).
//!
//! Job counts, the deadline headroom and the active permits are read from the control store
//! at each scrape; the counters of blocks and adapter errors go on from the journal's entries
//! after the last one read ([`Metrics::refresh`], which the watcher also runs), so every
//! server over one journal reports the same totals and a restart loses none. Gate refusals
//! are this server's own answers. No label holds an identifier: states, reasons, store kinds.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::extract::State as AxState;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use lethe_core::{BlockedReason, JobState};
use lethe_engine::Engine;
use lethe_journal::jobs::JobRecord;
use lethe_journal::requests::RequestState;
use lethe_journal::Entry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::api::{authorize, Need, State};
use crate::error::{ApiError, ErrorCode};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AlertLabel {
    pub(crate) alert: String,
}

/// The gate's refusals counted as `lethe_gate_refusals_total{reason}`: a runtime turned away
/// because an erasure moved on (its codes in `error.rs`). A lease past its TTL (`expired`) is
/// not one of them.
const GATE_REFUSALS: [&str; 4] = ["stale_epoch", "fenced", "revoked", "tombstoned"];

/// What the control store looked like at the last refresh, for the watcher's alerts.
pub(crate) struct Snapshot {
    /// Every job.
    pub(crate) jobs: Vec<JobRecord>,
}

/// Where the counters read from the journal stand.
#[derive(Default)]
struct Read {
    /// The last journal entry counted.
    seq: i64,
    /// Jobs whose duration the histogram holds.
    timed: HashSet<String>,
}

/// The registry and its metrics.
pub(crate) struct Metrics {
    registry: Registry,
    jobs: Family<StateLabel, Gauge>,
    duration: Histogram,
    blocked: Family<ReasonLabel, Counter>,
    headroom: Gauge<f64, AtomicU64>,
    refusals: Family<ReasonLabel, Counter>,
    permits: Gauge,
    adapter_errors: Family<KindLabel, Counter>,
    pub(crate) alerts: Family<AlertLabel, Counter>,
    pub(crate) watches: Counter,
    read: Mutex<Read>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let jobs = Family::<StateLabel, Gauge>::default();
        registry.register(
            "lethe_jobs",
            "Jobs in the control store by state",
            jobs.clone(),
        );
        // From the request's receipt to COMPLETE: a minute to 90 days (the longest extension).
        let duration = Histogram::new([
            60.0, 600.0, 3600.0, 21600.0, 86400.0, 604800.0, 1209600.0, 2592000.0, 5184000.0,
            7776000.0,
        ]);
        registry.register(
            "lethe_job_duration_seconds",
            "Seconds from a job's request (its receipt) to COMPLETE",
            duration.clone(),
        );
        let blocked = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "lethe_jobs_blocked",
            "Times a job moved to BLOCKED, by reason",
            blocked.clone(),
        );
        let headroom = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "lethe_deadline_headroom_seconds",
            "Seconds to the nearest deadline (end of its day, UTC) among jobs not COMPLETE and \
             pending requests; negative once past, +Inf when none is open",
            headroom.clone(),
        );
        let refusals = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "lethe_gate_refusals",
            "Leases and permits this server refused because an erasure moved on, by reason",
            refusals.clone(),
        );
        let permits = Gauge::default();
        registry.register(
            "lethe_permits_active",
            "Permits active now",
            permits.clone(),
        );
        let adapter_errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "lethe_adapter_errors",
            "Jobs blocked by a target's failure (unreachable, failing, read-only), by store kind",
            adapter_errors.clone(),
        );
        let alerts = Family::<AlertLabel, Counter>::default();
        registry.register("lethe_alerts", "Alerts raised, by kind", alerts.clone());
        let watches = Counter::default();
        registry.register(
            "lethe_watch_runs",
            "Times the watcher read the control store for metrics and alerts",
            watches.clone(),
        );
        Self {
            registry,
            jobs,
            duration,
            blocked,
            headroom,
            refusals,
            permits,
            adapter_errors,
            alerts,
            watches,
            read: Mutex::new(Read::default()),
        }
    }

    /// Reads the control store into the metrics; returns what it read. Blocking.
    pub(crate) fn refresh(
        &self,
        engine: &Engine,
        now: time::OffsetDateTime,
    ) -> Result<Snapshot, lethe_journal::JournalError> {
        let journal = engine.journal();
        let jobs = journal.jobs()?;
        let requests = journal.requests()?;
        let permits = journal.active_permits()?;
        // One refresh at a time: the counters read the journal from where the last one stopped.
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let seen = journal.entries_after(read.seq, &["blocked"], 10_000)?;
            let Some(last) = seen.last() else { break };
            read.seq = last.seq;
            for s in &seen {
                if let Entry::Blocked { reason, target, .. } = &s.entry {
                    self.count_block(engine, *reason, target.as_deref());
                }
            }
        }
        let mut by_state: BTreeMap<&str, i64> =
            JobState::ALL.iter().map(|s| (s.as_str(), 0)).collect();
        let mut nearest: Option<f64> = None;
        let mut near = |deadline: &str| {
            if let Some(left) = headroom(deadline, now) {
                nearest = Some(nearest.map_or(left, |n: f64| n.min(left)));
            }
        };
        for j in &jobs {
            *by_state.entry(j.state.as_str()).or_default() += 1;
            if j.state == JobState::Complete {
                if read.timed.insert(j.job_id.clone()) {
                    if let Some(s) = seconds_between(&j.requested_at, &j.updated_at) {
                        self.duration.observe(s);
                    }
                }
            } else {
                near(&j.deadline);
            }
        }
        for r in requests.iter().filter(|r| r.state == RequestState::Pending) {
            near(&r.deadline);
        }
        for (state, n) in by_state {
            self.jobs
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(n);
        }
        self.headroom.set(nearest.unwrap_or(f64::INFINITY));
        self.permits.set(permits as i64);
        Ok(Snapshot { jobs })
    }

    fn count_block(&self, engine: &Engine, reason: BlockedReason, target: Option<&str>) {
        self.blocked
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            })
            .inc();
        let adapter = matches!(
            reason,
            BlockedReason::TargetUnavailable
                | BlockedReason::TargetFailed
                | BlockedReason::TargetReadOnly
        );
        if adapter {
            // The store's kind, from the configuration; a target since removed counts as such.
            let kind = target
                .and_then(|t| engine.targets().iter().find(|x| x.name == t))
                .map_or_else(|| "unknown".to_string(), |t| t.kind.to_string());
            self.adapter_errors.get_or_create(&KindLabel { kind }).inc();
        }
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String does not fail");
        out
    }
}

/// Seconds from now to the end (UTC) of a `YYYY-MM-DD` deadline's day.
fn headroom(deadline: &str, now: time::OffsetDateTime) -> Option<f64> {
    let d = time::Date::parse(
        deadline,
        &time::macros::format_description!("[year]-[month]-[day]"),
    )
    .ok()?;
    let end = d.next_day()?.midnight().assume_utc();
    Some((end - now).as_seconds_f64())
}

fn seconds_between(from: &str, to: &str) -> Option<f64> {
    let p = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
    };
    Some((p(to)? - p(from)?).as_seconds_f64().max(0.0))
}

/// `GET /metrics`, for any token (a Prometheus scrape config's `authorization`).
pub(crate) async fn scrape(
    AxState(state): AxState<State>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    authorize(&state, &headers, Need::Metrics)?;
    let (metrics, engine, now) = (
        Arc::clone(&state.metrics),
        Arc::clone(&state.engine),
        state.clock.now(),
    );
    let text = tokio::task::spawn_blocking(move || {
        metrics.refresh(&engine, now)?;
        Ok::<_, lethe_journal::JournalError>(metrics.encode())
    })
    .await
    .map_err(|_| ApiError::unavailable())??;
    Ok((
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}

/// Counts the gate's refusals by their code, from each answer's [`ErrorCode`].
pub(crate) async fn count_refusals(
    AxState(state): AxState<State>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let res = next.run(req).await;
    if let Some(ErrorCode(code)) = res.extensions().get::<ErrorCode>() {
        if GATE_REFUSALS.contains(code) {
            state
                .metrics
                .refusals
                .get_or_create(&ReasonLabel {
                    reason: (*code).to_string(),
                })
                .inc();
        }
    }
    res
}
