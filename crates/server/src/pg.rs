//! The gate's hot calls on PostgreSQL, asynchronous: leases, permits, releases. Each is one
//! statement (the functions in the journal's schema.rs, which take the scope's advisory locks),
//! run on the server's own tokio-postgres connections, so a request never leaves the async
//! threads. Measured: the blocking path (a pooled synchronous connection on a blocking thread)
//! spent most of its time switching threads.
//!
//! Connections are opened lazily, one per slot, and reopened after PostgreSQL closed one; a
//! slot's statements are prepared once per connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lethe_journal::gate::{pg, GateError, Lease, Permit, Sink};
use tokio::sync::Mutex;
use tokio_postgres::{Client, Statement};

use crate::error::ApiError;

struct Conn {
    client: Client,
    take_permit: Statement,
    end_permit: Statement,
    take_lease: Statement,
}

/// Asynchronous connections to the PostgreSQL control store.
pub(crate) struct PgGate {
    settings: lethe_postgres::Settings,
    /// Leases and permits: every commit waits for the WAL flush.
    slots: Vec<Mutex<Option<Arc<Conn>>>>,
    /// Releases and cancellations: sessions with `synchronous_commit = off`, so a release is a
    /// plain `UPDATE` whose commit does not wait for the flush. Losing one in a server crash
    /// leaves the permit active, which keeps a job BLOCKED (safe); the next synchronous commit
    /// (a freeze) flushes it anyway.
    release_slots: Vec<Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
}

fn failed(e: tokio_postgres::Error) -> ApiError {
    // The store's message stays in the server's log.
    tracing::error!(error = %lethe_postgres::describe(&e), "Control store failed during a gate request.");
    ApiError::unavailable()
}

impl PgGate {
    pub(crate) fn new(settings: lethe_postgres::Settings, connections: usize) -> Self {
        Self {
            settings,
            slots: (0..connections.max(1)).map(|_| Mutex::new(None)).collect(),
            release_slots: (0..connections.div_ceil(2).max(1))
                .map(|_| Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    async fn conn(&self) -> Result<Arc<Conn>, ApiError> {
        self.conn_in(&self.slots, false).await
    }

    async fn conn_in(
        &self,
        slots: &[Mutex<Option<Arc<Conn>>>],
        async_commit: bool,
    ) -> Result<Arc<Conn>, ApiError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % slots.len();
        let mut slot = slots[i].lock().await;
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
        if async_commit {
            client
                .batch_execute("SET synchronous_commit = off")
                .await
                .map_err(failed)?;
        }
        let c = Arc::new(Conn {
            take_permit: client.prepare(pg::TAKE_PERMIT).await.map_err(failed)?,
            end_permit: client.prepare(pg::END_PERMIT_PLAIN).await.map_err(failed)?,
            take_lease: client.prepare(pg::TAKE_LEASE).await.map_err(failed)?,
            client,
        });
        *slot = Some(Arc::clone(&c));
        Ok(c)
    }

    pub(crate) async fn take_permit(
        &self,
        now_ms: i64,
        lease: i64,
        sink: Sink,
    ) -> Result<Permit, ApiError> {
        let c = self.conn().await?;
        let row = c
            .client
            .query_one(&c.take_permit, &[&lease, &sink.as_str(), &now_ms])
            .await
            .map_err(failed)?;
        let id: i64 = row.get(0);
        match GateError::from_code(id) {
            Some(e) => Err(e.into()),
            None => Ok(Permit { id }),
        }
    }

    /// `state`: "released" or "cancelled".
    pub(crate) async fn end_permit(&self, permit: i64, state: &str) -> Result<(), ApiError> {
        let c = self.conn_in(&self.release_slots, true).await?;
        let n = c
            .client
            .execute(&c.end_permit, &[&permit, &state])
            .await
            .map_err(failed)?;
        if n == 0 {
            return Err(GateError::NoSuchPermit.into());
        }
        Ok(())
    }

    pub(crate) async fn take_lease(
        &self,
        tenant: &str,
        subject: &str,
        expires_ms: i64,
        reads_json: &str,
    ) -> Result<Lease, ApiError> {
        let c = self.conn().await?;
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
