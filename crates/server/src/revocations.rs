//! The revocation stream's source: one watcher task per server polls the control store for
//! the leases that open streams listen to, every [`POLL`], and pushes each revoked lease once.
//!
//! Polling keeps one mechanism for both backends and for several servers sharing a PostgreSQL
//! journal (a freeze committed by any process is seen by every server's watcher). The cost is
//! one indexed query per tick while at least one stream is open, and none otherwise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lethe_journal::Journal;
use tokio::sync::{mpsc, watch};

use crate::pool::DropOffRuntime;

/// How often open streams' leases are checked: the push latency's bound, plus delivery.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// The most leases all open streams of one server may watch together: two full streams (a
/// runtime past 10,000 leases opens a second). The watcher checks every one each [`POLL`], so
/// each costs CPU (5,000 cost about a quarter of a core): past the bound a new stream is
/// refused (503 `watch_limit`), and the streams open are not touched.
pub const MAX_WATCHED_LEASES: usize = 20_000;

/// Streams waiting for revocations, by lease.
pub(crate) struct Watchers {
    by_lease: Mutex<HashMap<i64, Vec<mpsc::UnboundedSender<i64>>>>,
}

impl Watchers {
    /// Starts the watcher task on the current runtime; it ends when `stop` turns true.
    pub(crate) fn start(journal: Journal, stop: watch::Receiver<bool>) -> Arc<Self> {
        let w = Arc::new(Self {
            by_lease: Mutex::new(HashMap::new()),
        });
        tokio::spawn(Arc::clone(&w).poll_until(Arc::new(DropOffRuntime::new(journal)), stop));
        w
    }

    /// Registers a stream for these leases; `None` when that would take the leases watched past
    /// [`MAX_WATCHED_LEASES`] (streams whose client went away no longer count).
    pub(crate) fn watch(&self, leases: &[i64]) -> Option<mpsc::UnboundedReceiver<i64>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut map = self.by_lease.lock().unwrap_or_else(|p| p.into_inner());
        let watched: usize = map
            .values()
            .map(|s| s.iter().filter(|s| !s.is_closed()).count())
            .sum();
        if watched + leases.len() > MAX_WATCHED_LEASES {
            return None;
        }
        for &l in leases {
            map.entry(l).or_default().push(tx.clone());
        }
        Some(rx)
    }

    async fn poll_until(
        self: Arc<Self>,
        journal: Arc<DropOffRuntime<Journal>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let ids: Vec<i64> = {
                let mut map = self.by_lease.lock().unwrap_or_else(|p| p.into_inner());
                // Streams whose client went away.
                map.retain(|_, senders| {
                    senders.retain(|s| !s.is_closed());
                    !senders.is_empty()
                });
                map.keys().copied().collect()
            };
            if ids.is_empty() {
                continue;
            }
            let j = Arc::clone(&journal);
            let found = tokio::task::spawn_blocking(move || {
                lethe_gate::JournalGate::new(&j).revoked_among(&ids)
            })
            .await;
            match found {
                Ok(Ok(revoked)) => {
                    if failing {
                        tracing::info!("Revocation watcher reaches the control store again.");
                        failing = false;
                    }
                    let mut map = self.by_lease.lock().unwrap_or_else(|p| p.into_inner());
                    for id in revoked {
                        for s in map.remove(&id).unwrap_or_default() {
                            let _ = s.send(id);
                        }
                    }
                }
                Ok(Err(e)) => {
                    // Streams stay open; a revoked lease still gets no permit, so the gate
                    // itself stays safe. Logged once per outage.
                    if !failing {
                        tracing::error!(error = %e, "Revocation watcher cannot read the control store.");
                        failing = true;
                    }
                }
                Err(_) => return,
            }
        }
    }
}
