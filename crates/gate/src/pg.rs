//! The journal-backed gate's hot calls on PostgreSQL, asynchronous: leases, permits, releases,
//! for `lethe serve`. Each runs the functions in the journal's schema.rs (which take the scope's
//! advisory locks) on the caller's own tokio-postgres connections, so a request never leaves the
//! async threads. Measured: the blocking path (a pooled synchronous connection on a blocking
//! thread) spent most of its time switching threads. Not here: renewals, lease checks, sweeps
//! and freezes, which run on the journal's blocking connections ([`crate::JournalGate`]), and
//! anything of HTTP (the server maps [`Error`] to its answers).
//!
//! Permits taken and ended are **group-committed**: one worker task per lane (takes, ends), with
//! its own connection, takes every request waiting in its queue and sends them in one call of `lethe_gate_batch`
//! (one transaction, one WAL flush, one round trip). A request that finds the worker idle goes
//! alone, so batching adds no wait of its own; under load the batches grow instead of the
//! number of transactions. Inside the call, the locks of every scope in the batch are taken
//! first, then each request is checked and registered in a statement of its own, so the gate's
//! guarantees are those of a single permit. Measured on 2 cores (bench/README.md, "Gate"):
//! PostgreSQL's CPU per take-and-release halved with 8 clients and fell to a third with 32, and
//! more workers (more transactions in flight, smaller batches) cost more than they gained.
//!
//! Ends (releases and cancellations) have a worker and a connection of their own. A batch of
//! ends alone commits without waiting for the WAL flush (`lethe_gate_batch`): losing an end in
//! a PostgreSQL crash leaves its permit active, which only keeps a job BLOCKED, and whatever
//! acts on an end durably (a freeze's drain set, a drained job) commits synchronously after it,
//! which flushes the WAL past it. Batched with takes, an end waited for the takes' flush, and
//! a take waiting on a freeze's lock held back every release queued behind it.
//!
//! Connections are opened lazily, one per slot, and reopened after PostgreSQL closed one; a
//! slot's statements are prepared once per connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lethe_core::{MemoryId, Subject, Tenant, Version};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_postgres::{Client, Statement};

use crate::{GateError, Lease, Permit, Sink};

/// `(lease_ids BIGINT[], sinks TEXT[], request_keys TEXT[] (NULL for none), now_ms BIGINT,
/// ended_permit_ids BIGINT[], states TEXT[], their request_keys TEXT[]) -> BIGINT[]`: permits
/// taken and ended in one transaction: for each take in order its permit id or refusal code,
/// then for each end 1, or 0 if the permit was not active (or its key not given). The schema's
/// version fixes the signatures of the functions called here and in the journal's gate.rs.
const GATE_BATCH: &str = "SELECT lethe_gate_batch($1, $2, $3, $4, $5, $6, $7)";
/// `(tenant, subject, expires_ms BIGINT, reads JSON [[memory, version], ...])` ->
/// `(lease_id, epoch, tenant_epoch)`, lease_id -5 when fenced.
const TAKE_LEASE: &str =
    "SELECT lease_id, epoch, tenant_epoch FROM lethe_take_lease($1, $2, $3, $4)";

/// Why an asynchronous gate call got no answer from the gate's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The gate refused.
    #[error(transparent)]
    Refused(#[from] GateError),
    /// The control store did not answer, or answered out of form; the cause is logged here,
    /// since its text can name a host or SQL.
    #[error("the control store did not answer")]
    Unavailable,
}

/// The most requests one call carries.
const MAX_BATCH: usize = 128;

struct Conn {
    client: Client,
    gate_batch: Statement,
    take_lease: Statement,
}

/// A connection opened on first use and reopened after PostgreSQL closed it.
type Slot = Mutex<Option<Arc<Conn>>>;

struct Slots {
    settings: lethe_postgres::Settings,
    /// Leases, round robin.
    leases: Vec<Slot>,
    next: AtomicUsize,
    /// The take worker's.
    takes: Slot,
    /// The end worker's.
    ends: Slot,
}

/// Which worker a request goes to.
#[derive(Clone, Copy)]
enum Lane {
    /// Takes, with the releases they carry: synchronous commits.
    Takes,
    /// Releases and cancellations alone: commits that do not wait for the WAL flush.
    Ends,
}

/// A gate request waiting for its batch, and where its answer goes.
struct Waiting {
    op: Op,
    reply: oneshot::Sender<Result<Answer, Error>>,
}

/// A take's permit id (or an end's count of rows changed), and whether the permit a take
/// carried for release was active until this batch.
type Answer = (i64, Option<bool>);

enum Op {
    Take {
        lease: i64,
        sink: Sink,
        now_ms: i64,
        /// Released in the same transaction, whatever the take's answer, with its take's key.
        release: Option<(i64, Option<String>)>,
        /// The client's name for this take (`Journal::take_permit_keyed`).
        key: Option<String>,
    },
    End {
        permit: i64,
        state: &'static str,
        /// The key the permit's take carried.
        key: Option<String>,
    },
}

/// The journal-backed gate on PostgreSQL, asynchronous: its own connections to the control
/// store and the two batch workers.
pub struct PgGate {
    slots: Arc<Slots>,
    takes: mpsc::UnboundedSender<Waiting>,
    ends: mpsc::UnboundedSender<Waiting>,
}

fn failed(e: tokio_postgres::Error) -> Error {
    // The store's message stays in the log.
    tracing::error!(error = %lethe_postgres::describe(&e), "Control store failed during a gate request.");
    Error::Unavailable
}

impl Slots {
    async fn conn(&self, slot: &Slot) -> Result<Arc<Conn>, Error> {
        let mut slot = slot.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Arc::clone(c));
        }
        let (client, connection) = self
            .settings
            .connect_async("lethe-serve")
            .await
            .map_err(failed)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %lethe_postgres::describe(&e), "Control store connection ended.");
            }
        });
        // The gate functions' statements take arrays whose length varies from call to call;
        // PostgreSQL would otherwise keep planning them anew for each call (measured: about
        // 60-90 us of a 0.4-0.6 ms batch).
        // And READ COMMITTED whatever the database's default, as every Lethe connection
        // (`lethe_postgres::SESSION`), in the same round trip.
        client
            .batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; {}",
                lethe_postgres::SESSION
            ))
            .await
            .map_err(failed)?;
        let c = Arc::new(Conn {
            gate_batch: client.prepare(GATE_BATCH).await.map_err(failed)?,
            take_lease: client.prepare(TAKE_LEASE).await.map_err(failed)?,
            client,
        });
        *slot = Some(Arc::clone(&c));
        Ok(c)
    }
}

/// Answers requests from `rx`, a batch at a time: the first request it waits for and
/// everything queued behind it. One worker a lane, so the batches are as big as the load makes them:
/// measured on 2 cores, one cost PostgreSQL the least CPU per permit and gave the most permits a
/// second with 32 clients (two workers: smaller batches, the same throughput or less;
/// bench/README.md, "Gate"). The price: while a freeze holds a scope's lock (a few
/// milliseconds), a batch with a permit of that scope waits, and the requests queued behind it.
async fn batch_worker(slots: Arc<Slots>, lane: Lane, mut rx: mpsc::UnboundedReceiver<Waiting>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // Takes first, then ends, then the releases the takes carry: the order of the
        // function's results.
        let (takes, ends): (Vec<Waiting>, Vec<Waiting>) = batch
            .into_iter()
            .partition(|w| matches!(w.op, Op::Take { .. }));
        let swaps = takes
            .iter()
            .filter(|w| {
                matches!(
                    w.op,
                    Op::Take {
                        release: Some(_),
                        ..
                    }
                )
            })
            .count();
        match run_batch(&slots, lane, &takes, &ends).await {
            Ok(results) if results.len() == takes.len() + ends.len() + swaps => {
                let (took, rest) = results.split_at(takes.len());
                let (ended, mut swapped) = rest.split_at(ends.len());
                for (w, &id) in takes.into_iter().zip(took) {
                    let released = match w.op {
                        Op::Take {
                            release: Some(_), ..
                        } => {
                            let (&changed, tail) = swapped.split_first().expect("counted above");
                            swapped = tail;
                            Some(changed > 0)
                        }
                        _ => None,
                    };
                    let _ = w.reply.send(match GateError::from_code(id) {
                        Some(e) => Err(e.into()),
                        None => Ok((id, released)),
                    });
                }
                for (w, &changed) in ends.into_iter().zip(ended) {
                    let _ = w.reply.send(match changed {
                        0 => Err(GateError::NoSuchPermit.into()),
                        _ => Ok((changed, None)),
                    });
                }
            }
            other => {
                if other.is_ok() {
                    tracing::error!(
                        "The control store answered a gate batch with the wrong number of results."
                    );
                }
                for w in takes.into_iter().chain(ends) {
                    let _ = w.reply.send(Err(Error::Unavailable));
                }
            }
        }
    }
}

/// One call of `lethe_gate_batch`: one transaction, one round trip.
async fn run_batch(
    slots: &Slots,
    lane: Lane,
    takes: &[Waiting],
    ends: &[Waiting],
) -> Result<Vec<i64>, Error> {
    let (mut leases, mut sinks, mut keys, mut now) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for w in takes {
        if let Op::Take {
            lease,
            sink,
            now_ms,
            ref key,
            ..
        } = w.op
        {
            leases.push(lease);
            sinks.push(sink.as_str());
            keys.push(key.as_deref());
            // One clock reading for the batch: the latest, so no lease is used past its expiry.
            now = now.max(now_ms);
        }
    }
    let (mut permits, mut states, mut end_keys) = (Vec::new(), Vec::new(), Vec::new());
    for w in ends {
        if let Op::End {
            permit,
            state,
            ref key,
        } = w.op
        {
            permits.push(permit);
            states.push(state);
            end_keys.push(key.as_deref());
        }
    }
    for w in takes {
        if let Op::Take {
            release: Some((permit, ref key)),
            ..
        } = w.op
        {
            permits.push(permit);
            states.push("released");
            end_keys.push(key.as_deref());
        }
    }
    let c = slots
        .conn(match lane {
            Lane::Takes => &slots.takes,
            Lane::Ends => &slots.ends,
        })
        .await?;
    let row = c
        .client
        .query_one(
            &c.gate_batch,
            &[&leases, &sinks, &keys, &now, &permits, &states, &end_keys],
        )
        .await
        .map_err(failed)?;
    Ok(row.get(0))
}

impl PgGate {
    /// Must be called inside the server's runtime: it spawns the two batch workers, which end
    /// when the gate is dropped.
    pub fn new(settings: lethe_postgres::Settings, connections: usize) -> Self {
        let slots = Arc::new(Slots {
            settings,
            leases: (0..connections.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            takes: Mutex::new(None),
            ends: Mutex::new(None),
        });
        let (takes, rx) = mpsc::unbounded_channel();
        tokio::spawn(batch_worker(Arc::clone(&slots), Lane::Takes, rx));
        let (ends, rx) = mpsc::unbounded_channel();
        tokio::spawn(batch_worker(Arc::clone(&slots), Lane::Ends, rx));
        Self { slots, takes, ends }
    }

    async fn submit(&self, op: Op) -> Result<Answer, Error> {
        let (reply, answer) = oneshot::channel();
        match op {
            Op::Take { .. } => &self.takes,
            Op::End { .. } => &self.ends,
        }
        .send(Waiting { op, reply })
        .map_err(|_| Error::Unavailable)?;
        answer.await.map_err(|_| Error::Unavailable)?
    }

    /// Takes a permit; `release`, if given, is released in the same transaction whatever the
    /// take's answer, and the answer says whether it was active until then. `key`: see
    /// [`crate::JournalGate::take_permit_keyed`].
    pub async fn take_permit(
        &self,
        now_ms: i64,
        lease: i64,
        sink: Sink,
        release: Option<(i64, Option<String>)>,
        key: Option<String>,
    ) -> Result<(Permit, Option<bool>), Error> {
        let (id, released) = self
            .submit(Op::Take {
                lease,
                sink,
                now_ms,
                release,
                key,
            })
            .await?;
        Ok((Permit { id }, released))
    }

    /// Releases a permit whose boundary ended; `key`: the one its take carried.
    pub async fn release_permit(&self, permit: i64, key: Option<String>) -> Result<(), Error> {
        self.end_permit(permit, "released", key).await
    }

    /// The permit's holder aborted the work it covered; `key`: the one its take carried.
    pub async fn confirm_cancelled(&self, permit: i64, key: Option<String>) -> Result<(), Error> {
        self.end_permit(permit, "cancelled", key).await
    }

    async fn end_permit(
        &self,
        permit: i64,
        state: &'static str,
        key: Option<String>,
    ) -> Result<(), Error> {
        self.submit(Op::End { permit, state, key }).await?;
        Ok(())
    }

    /// Takes a lease expiring at `expires_ms` (milliseconds since the epoch) for a run that read
    /// `reads` of the subject's memory, as [`crate::JournalGate::take_lease`].
    pub async fn take_lease(
        &self,
        tenant: &Tenant,
        subject: &Subject,
        reads: &[(MemoryId, Version)],
        expires_ms: i64,
    ) -> Result<Lease, Error> {
        let pairs: Vec<[&str; 2]> = reads
            .iter()
            .map(|(m, v)| [m.as_str(), v.as_str()])
            .collect();
        let reads_json = serde_json::to_string(&pairs).map_err(|_| Error::Unavailable)?;
        let (tenant, subject) = (tenant.as_str(), subject.as_str());
        let i = self.slots.next.fetch_add(1, Ordering::Relaxed) % self.slots.leases.len();
        let c = self.slots.conn(&self.slots.leases[i]).await?;
        let row = c
            .client
            .query_one(
                &c.take_lease,
                &[&tenant, &subject, &expires_ms, &reads_json],
            )
            .await
            .map_err(failed)?;
        let id: i64 = row.get(0);
        if let Some(e) = GateError::from_code(id) {
            return Err(e.into());
        }
        Ok(Lease {
            id,
            epoch: row.get::<_, i64>(1) as u64,
            tenant_epoch: row.get::<_, i64>(2) as u64,
        })
    }
}
