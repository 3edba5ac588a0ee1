//! The watcher: every period, reads the control store into the metrics
//! ([`crate::metrics::Metrics::refresh`]) and raises the alerts it calls for
//! ([`crate::alerts::Alerts::check`]), until the server stops.

use std::sync::Arc;
use std::time::Duration;

use crate::alerts::Alerts;
use crate::api::State;
use crate::Webhook;

pub(crate) async fn watch(
    state: State,
    webhooks: Vec<Webhook>,
    every: Duration,
    backoff: Duration,
) {
    let alerts = Arc::new(Alerts::new(webhooks, backoff));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = state.stop.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let (metrics, engine, alerts, now) = (
            Arc::clone(&state.metrics),
            Arc::clone(&state.engine),
            Arc::clone(&alerts),
            state.clock.now(),
        );
        let done = tokio::task::spawn_blocking(move || {
            let snap = metrics.refresh(&engine, now)?;
            for alert in alerts.check(&engine, &snap.jobs, now)? {
                metrics
                    .alerts
                    .get_or_create(&crate::metrics::AlertLabel {
                        alert: alert.to_string(),
                    })
                    .inc();
            }
            metrics.watches.inc();
            Ok::<_, lethe_journal::JournalError>(())
        })
        .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "Watching the control store failed; tried again next period.")
            }
            Err(_) => return,
        }
    }
}
