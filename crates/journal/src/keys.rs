//! Crypto-shredding's key store: each subject's data key, wrapped by a key-encryption key the
//! journal never sees. A runtime gets its subject's key only under a live lease (not revoked,
//! not expired, its epoch current, no fence closed), so a run that started before an erasure
//! cannot fetch the key after it; the erasure destroys the wrapped key in a journaled step.

use lethe_core::gate::GateError;
use lethe_core::{Scope, Subject, Tenant};
use time::OffsetDateTime;

use crate::chain::{append, db};
use crate::db::V;
use crate::{Entry, Journal, JournalError, Result};

/// A subject's wrapped data key, as the lease that fetched it may use it.
#[derive(Clone, PartialEq, Eq)]
pub struct WrappedKey {
    /// The lease's tenant.
    pub tenant: Tenant,
    /// The lease's subject.
    pub subject: Subject,
    /// The key's id (`dk-` and hex), which ciphertexts name.
    pub key_id: String,
    /// The key, wrapped by the key-encryption key (its bytes, hex).
    pub wrapped: String,
    /// When the lease expires (Unix milliseconds): no cache may keep the key longer.
    pub expires_ms: i64,
}

/// Never the subject or the key.
impl std::fmt::Debug for WrappedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrappedKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Why a data key is not given.
#[derive(Debug)]
pub enum KeyRefusal {
    /// The lease may not work on its subject now.
    Gate(GateError),
    /// The subject's key with this id no longer exists: what was written under it was erased.
    Destroyed,
}

impl Journal {
    /// The data key of `lease_id`'s subject: the one named `key_id`, or without `key_id` the
    /// current one, created from `new` (a fresh key's id and wrapping) if the subject has
    /// none. Refused for a lease that is gone, revoked, expired or of an old epoch, or whose
    /// subject or tenant is fenced.
    pub fn data_key(
        &self,
        now: OffsetDateTime,
        lease_id: i64,
        key_id: Option<&str>,
        new: impl FnOnce(&Tenant, &Subject) -> std::result::Result<(String, String), String>,
    ) -> Result<std::result::Result<WrappedKey, KeyRefusal>> {
        let now_ms = (now.unix_timestamp_nanos() / 1_000_000) as i64;
        let created = now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        self.write(|tx| {
            let Some(l) = tx
                .row(
                    "SELECT l.tenant, l.subject, l.epoch, l.tenant_epoch, l.expires_ms, l.revoked_by, \
                       coalesce((SELECT e.epoch FROM epochs e WHERE e.tenant = l.tenant AND e.subject = l.subject), 0), \
                       coalesce((SELECT e.epoch FROM epochs e WHERE e.tenant = l.tenant AND e.subject = ''), 0), \
                       (SELECT count(*) FROM fences f WHERE f.tenant = l.tenant AND f.subject IN (l.subject, '')) \
                     FROM leases l WHERE l.lease_id = $1",
                    &[V::I(lease_id)],
                )
                .map_err(db)?
            else {
                return Ok(Err(KeyRefusal::Gate(GateError::NoSuchLease)));
            };
            let refusal = if l[5].t().is_some() {
                Some(GateError::Revoked)
            } else if l[4].i().unwrap_or(0) <= now_ms {
                Some(GateError::Expired)
            } else if l[2].i() < l[6].i() || l[3].i() < l[7].i() {
                Some(GateError::StaleEpoch)
            } else if l[8].i().unwrap_or(0) > 0 {
                Some(GateError::Fenced)
            } else {
                None
            };
            if let Some(r) = refusal {
                return Ok(Err(KeyRefusal::Gate(r)));
            }
            let corrupt = |_| JournalError::Corrupt("lease owner".into());
            let tenant = Tenant::new(l[0].text()).map_err(corrupt)?;
            let subject = Subject::new(l[1].text()).map_err(corrupt)?;
            let expires_ms = l[4].i().unwrap_or(0);
            let current = tx
                .row(
                    "SELECT key_id, wrapped FROM subject_keys WHERE tenant = $1 AND subject = $2",
                    &[tenant.as_str().into(), subject.as_str().into()],
                )
                .map_err(db)?;
            let (id, wrapped) = match (current, key_id) {
                (Some(r), Some(want)) if r[0].text() != want => {
                    return Ok(Err(KeyRefusal::Destroyed))
                }
                (None, Some(_)) => return Ok(Err(KeyRefusal::Destroyed)),
                (Some(r), _) => (r[0].text(), r[1].text()),
                (None, None) => {
                    let (id, wrapped) = new(&tenant, &subject).map_err(JournalError::Corrupt)?;
                    tx.exec(
                        "INSERT INTO subject_keys (tenant, subject, key_id, wrapped, created_at) \
                         VALUES ($1, $2, $3, $4, $5)",
                        &[
                            tenant.as_str().into(),
                            subject.as_str().into(),
                            id.as_str().into(),
                            wrapped.as_str().into(),
                            created.as_str().into(),
                        ],
                    )
                    .map_err(db)?;
                    (id, wrapped)
                }
            };
            Ok(Ok(WrappedKey {
                tenant,
                subject,
                key_id: id,
                wrapped,
                expires_ms,
            }))
        })
    }

    /// Destroys the wrapped data keys `scope` covers (a subject's, or every subject's of a
    /// tenant; a memory scope none) and journals `keys_destroyed` for the job, in one
    /// transaction. Idempotent: a second call destroys and journals nothing.
    pub fn destroy_keys(&self, at: &str, job_id: &str, scope: &Scope) -> Result<u64> {
        self.write_entry(|tx| {
            let n = match scope {
                Scope::Subject { tenant, subject } => tx
                    .exec(
                        "DELETE FROM subject_keys WHERE tenant = $1 AND subject = $2",
                        &[tenant.as_str().into(), subject.as_str().into()],
                    )
                    .map_err(db)?,
                Scope::Tenant { tenant } => tx
                    .exec(
                        "DELETE FROM subject_keys WHERE tenant = $1",
                        &[tenant.as_str().into()],
                    )
                    .map_err(db)?,
                Scope::Memory { .. } => 0,
            };
            if n > 0 {
                append(tx, at, Some(job_id), &Entry::KeysDestroyed { count: n })?;
            }
            Ok(n)
        })
    }

    /// How many wrapped data keys the store holds.
    pub fn data_key_count(&self) -> Result<u64> {
        self.read(|tx| {
            Ok(tx
                .one("SELECT count(*) FROM subject_keys", &[])
                .map_err(db)?
                .i()
                .unwrap_or(0) as u64)
        })
    }
}
