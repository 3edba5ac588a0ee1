//! Jobs: created once per open scope, moved only by journaled events, claimed while running.

use hmac::{Hmac, Mac};
use lethe_core::state::{transition, JobState};
use lethe_core::{BlockedReason, Scope};
use sha2::{Digest, Sha256};

use crate::chain::{append, db};
use crate::db::{Row, Tx};
use crate::entry::Entry;
use crate::{Journal, JournalError, Result};

/// A new job's request, as validated by the engine.
#[derive(Clone, Debug)]
pub struct NewJob {
    /// The id to give it.
    pub job_id: String,
    /// The scope.
    pub scope: Scope,
    /// Its keyed hash, `hmac:<hex>`.
    pub scope_hash: String,
    /// Legal basis.
    pub basis: lethe_core::Basis,
    /// Ticket reference.
    pub ticket: String,
    /// Policy version.
    pub policy_version: String,
    /// Deadline.
    pub deadline: time::Date,
    /// Reason for an extended deadline.
    pub extension_reason: Option<String>,
    /// Time of receipt, RFC 3339.
    pub requested_at: String,
    /// A memory scope without a version: the version current at the request
    /// (`Entry::JobRequested::version_at_request`).
    pub version_at_request: Option<String>,
}

/// A job as the projection holds it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JobRecord {
    /// The job id.
    pub job_id: String,
    /// Keyed hash of the scope.
    pub scope_hash: String,
    /// The scope (identifiers: never print or log it).
    #[serde(skip)]
    pub scope: Scope,
    /// Current state.
    pub state: JobState,
    /// Why it is blocked.
    pub blocked_reason: Option<BlockedReason>,
    /// Which target blocked it.
    pub blocked_target: Option<String>,
    /// Legal basis.
    pub basis: lethe_core::Basis,
    /// Policy version.
    pub policy_version: String,
    /// Deadline, `YYYY-MM-DD`.
    pub deadline: String,
    /// When the request was received.
    pub requested_at: String,
    /// When the job last changed.
    pub updated_at: String,
    /// Subject epoch after the freeze.
    pub subject_epoch: Option<u64>,
    /// Tenant epoch after the freeze.
    pub tenant_epoch: Option<u64>,
    /// The tombstoned version, for a memory scope.
    pub tombstone_version: Option<String>,
    /// The signed certificate, once complete.
    #[serde(skip)]
    pub certificate: Option<serde_json::Value>,
}

impl JobRecord {
    /// What a listing shows of a job (`lethe jobs --json`, `GET /v1/jobs`): ids, state, the
    /// scope's kind and keyed hash, never its identifiers.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "job_id": self.job_id, "state": self.state, "scope_hash": self.scope_hash,
            "scope": self.scope.kind(), "requested_at": self.requested_at,
            "deadline": self.deadline, "blocked_reason": self.blocked_reason,
        })
    }
}

const JOB_COLUMNS: &str =
    "job_id, scope_hash, scope, state, blocked_reason, blocked_target, basis, \
     policy_version, deadline, requested_at, updated_at, subject_epoch, tenant_epoch, \
     tombstone_version, certificate";

fn job_from_row(r: &Row) -> Result<JobRecord> {
    let corrupt = |what: &str| JournalError::Corrupt(format!("job column {what}"));
    Ok(JobRecord {
        job_id: r[0].text(),
        scope_hash: r[1].text(),
        scope: serde_json::from_str(&r[2].text()).map_err(|_| corrupt("scope"))?,
        state: JobState::parse(&r[3].text()).ok_or_else(|| corrupt("state"))?,
        blocked_reason: match r[4].t() {
            Some(s) => Some(
                serde_json::from_value(serde_json::Value::String(s.to_string()))
                    .map_err(|_| corrupt("blocked_reason"))?,
            ),
            None => None,
        },
        blocked_target: r[5].t().map(str::to_owned),
        basis: r[6].text().parse().map_err(|_| corrupt("basis"))?,
        policy_version: r[7].text(),
        deadline: r[8].text(),
        requested_at: r[9].text(),
        updated_at: r[10].text(),
        subject_epoch: r[11].i().map(|v| v as u64),
        tenant_epoch: r[12].i().map(|v| v as u64),
        tombstone_version: r[13].t().map(str::to_owned),
        certificate: match r[14].t() {
            Some(c) => Some(serde_json::from_str(c).map_err(|_| corrupt("certificate"))?),
            None => None,
        },
    })
}

pub(crate) fn load_job(tx: &mut dyn Tx, job_id: &str) -> Result<JobRecord> {
    let row = tx
        .row(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = $1"),
            &[job_id.into()],
        )
        .map_err(db)?;
    job_from_row(&row.ok_or_else(|| JournalError::NoSuchJob(job_id.to_string()))?)
}

/// Applies a transition entry to the job row and appends it, inside `tx`.
pub(crate) fn apply(tx: &mut dyn Tx, at: &str, job_id: &str, entry: &Entry) -> Result<JobState> {
    let job = load_job(tx, job_id)?;
    let mut state = job.state;
    // A COMPLETE job is final: nothing of it is journaled after its `completed` (a runner that
    // lost its claim mid-erase, going on after another process completed the job, is refused
    // here too; review).
    if state == JobState::Complete && !matches!(entry, Entry::Completed { .. }) {
        return Err(JournalError::Final(job_id.to_string()));
    }
    if let Some(ev) = entry.event() {
        state = transition(job.state, ev).map_err(|source| JournalError::Transition {
            job: job_id.to_string(),
            source,
        })?;
        let (reason, target) = match entry {
            Entry::Blocked { reason, target, .. } => (Some(reason.as_str()), target.as_deref()),
            _ => (None, None),
        };
        tx.exec(
            "UPDATE jobs SET state = $2, blocked_reason = $3, blocked_target = $4, updated_at = $5 WHERE job_id = $1",
            &[job_id.into(), state.as_str().into(), reason.into(), target.into(), at.into()],
        )
        .map_err(db)?;
    }
    append(tx, at, Some(job_id), entry)?;
    Ok(state)
}

pub use crate::db::Locator;

/// A digest of an inventory's locators, keyed so that it cannot be used to test a guess.
pub fn inventory_digest(key: &[u8; 32], locators: &[(String, u64)]) -> String {
    let mut sorted: Vec<_> = locators.iter().collect();
    sorted.sort();
    let mut h = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for (loc, rows) in sorted {
        h.update(&(loc.len() as u64).to_be_bytes());
        h.update(loc.as_bytes());
        h.update(&rows.to_be_bytes());
    }
    format!("hmac:{}", hex::encode(h.finalize().into_bytes()))
}

/// A keyed digest of a target's place (`Adapter::place`): the journal never holds a host, a
/// path or a database name, and a guess cannot be tested against it without the key.
pub fn place_digest(key: &[u8; 32], place: &str) -> String {
    let mut h = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    h.update(b"place\0");
    h.update(place.as_bytes());
    format!("hmac:{}", hex::encode(h.finalize().into_bytes()))
}

/// A claim's transaction stays open, idle, while its job runs: a database or role's
/// `idle_in_transaction_session_timeout` (or, from PostgreSQL 17, `transaction_timeout`) would
/// end it, and the claim, under a live runner. One round trip (simple protocol).
const CLAIM_BEGIN: &str = "SET idle_in_transaction_session_timeout = 0;
    DO $$ BEGIN
        IF current_setting('server_version_num')::int >= 170000 THEN
            PERFORM set_config('transaction_timeout', '0', false);
        END IF;
    END $$;
    BEGIN";

/// The right to run a job, held until dropped. On PostgreSQL it is a row lock on the job's
/// claim row, taken `FOR UPDATE SKIP LOCKED` in a transaction on its own connection: if the
/// process dies, the connection drops and the claim with it. On SQLite it is an exclusive lock
/// on a file beside the journal.
pub struct Claim {
    /// The open transaction on PostgreSQL, rolled back when its last claim is dropped (a
    /// batch's claims share one connection and transaction).
    pg: Option<std::sync::Arc<std::sync::Mutex<postgres::Client>>>,
    /// On SQLite, the job's lock file, locked exclusively: the operating system releases it
    /// when this process closes it or dies.
    _file: Option<std::fs::File>,
    /// The claimed job.
    pub job_id: String,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("job_id", &self.job_id)
            .finish()
    }
}

impl Claim {
    /// Whether the claim still holds: on PostgreSQL, its connection and transaction still
    /// answer (a backend the server terminated or restarted took the row lock with it, and
    /// another process may have claimed the job since). A file lock holds while the process
    /// lives.
    pub fn holds(&mut self) -> bool {
        match self.pg.as_ref() {
            Some(c) => c
                .lock()
                .is_ok_and(|mut c| c.simple_query("SELECT 1").is_ok()),
            None => true,
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // The last claim on the connection ends its transaction (and its row locks).
        if let Some(c) = self.pg.take().and_then(std::sync::Arc::into_inner) {
            if let Ok(mut c) = c.into_inner() {
                let _ = c.batch_execute("ROLLBACK");
            }
        }
    }
}

fn shared(c: postgres::Client) -> Option<std::sync::Arc<std::sync::Mutex<postgres::Client>>> {
    Some(std::sync::Arc::new(std::sync::Mutex::new(c)))
}

/// One entry of [`Journal::record_many`]: the job, the entry, and the target whose erased
/// count it records with it, if any.
pub type GroupedEntry<'a> = (&'a str, Entry, Option<(&'a str, u64)>);

/// States in which a job has work a process can pick up.
const RUNNABLE: &str = "'FROZEN', 'DELETING', 'VERIFYING'";

impl Journal {
    /// Creates a job, unless a job for the same scope is still open: then returns that one and
    /// `false`. One transaction under the write lock, so two operators asking at once, from two
    /// processes, get one job.
    pub fn create_job(&self, new: &NewJob) -> Result<(JobRecord, bool)> {
        self.write_entry(|tx| {
            let open = tx
                .row(
                    "SELECT job_id FROM jobs WHERE scope_hash = $1 AND state <> 'COMPLETE' ORDER BY requested_at LIMIT 1",
                    &[new.scope_hash.as_str().into()],
                )
                .map_err(db)?;
            if let Some(r) = open {
                return Ok((load_job(tx, &r[0].text())?, false));
            }
            let scope = serde_json::to_string(&new.scope).map_err(|e| JournalError::Corrupt(e.to_string()))?;
            tx.exec(
                &format!(
                    "INSERT INTO jobs ({JOB_COLUMNS}) VALUES ($1, $2, $3, 'REQUESTED', NULL, NULL, $4, $5, $6, $7, $7, NULL, NULL, NULL, NULL)"
                ),
                &[
                    new.job_id.as_str().into(),
                    new.scope_hash.as_str().into(),
                    scope.into(),
                    new.basis.as_str().into(),
                    new.policy_version.as_str().into(),
                    new.deadline.to_string().into(),
                    new.requested_at.as_str().into(),
                ],
            )
            .map_err(db)?;
            tx.exec("INSERT INTO job_claims (job_id) VALUES ($1)", &[new.job_id.as_str().into()]).map_err(db)?;
            append(
                tx,
                &new.requested_at,
                Some(&new.job_id),
                &Entry::JobRequested {
                    scope: new.scope.clone(),
                    scope_hash: new.scope_hash.clone(),
                    basis: new.basis,
                    ticket: new.ticket.clone(),
                    policy_version: new.policy_version.clone(),
                    deadline: new.deadline.to_string(),
                    extension_reason: new.extension_reason.clone(),
                    version_at_request: new.version_at_request.clone(),
                },
            )?;
            Ok((load_job(tx, &new.job_id)?, true))
        })
    }

    /// Claims a job to run it. `None`: another process holds it (PostgreSQL only).
    pub fn claim(&self, job_id: &str) -> Result<Option<Claim>> {
        if let crate::Backend::Sqlite { path, .. } = &self.backend {
            return self.claim_file(path, job_id);
        }
        let Some(mut c) = self.pg_connect()? else {
            unreachable!("a PostgreSQL journal connects or fails");
        };
        // Jobs created before claims existed get their row now.
        c.execute(
            "INSERT INTO job_claims (job_id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&job_id],
        )
        .map_err(|e| self.db(crate::db::pg_err(e)))?;
        c.batch_execute(CLAIM_BEGIN)
            .map_err(|e| self.db(crate::db::pg_err(e)))?;
        let got = c
            .query(
                "SELECT job_id FROM job_claims WHERE job_id = $1 FOR UPDATE SKIP LOCKED",
                &[&job_id],
            )
            .map_err(|e| self.db(crate::db::pg_err(e)))?;
        Ok((!got.is_empty()).then(|| Claim {
            pg: shared(c),
            _file: None,
            job_id: job_id.to_string(),
        }))
    }

    /// Claims many jobs at once (a batch's), in their order: `None` for one another process
    /// runs. On PostgreSQL, one connection and transaction holds every row lock (not one
    /// connection a job); on SQLite, a lock file each.
    pub fn claim_many(&self, job_ids: &[String]) -> Result<Vec<Option<Claim>>> {
        if matches!(self.backend, crate::Backend::Sqlite { .. }) {
            return job_ids.iter().map(|id| self.claim(id)).collect();
        }
        let Some(mut c) = self.pg_connect()? else {
            unreachable!("a PostgreSQL journal connects or fails");
        };
        let pg = |e| self.db(crate::db::pg_err(e));
        c.execute(
            "INSERT INTO job_claims (job_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            &[&job_ids],
        )
        .map_err(pg)?;
        c.batch_execute(CLAIM_BEGIN).map_err(pg)?;
        let got: std::collections::HashSet<String> = c
            .query(
                "SELECT job_id FROM job_claims WHERE job_id = ANY($1) FOR UPDATE SKIP LOCKED",
                &[&job_ids],
            )
            .map_err(pg)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let conn = shared(c);
        Ok(job_ids
            .iter()
            .map(|id| {
                got.contains(id).then(|| Claim {
                    pg: conn.clone(),
                    _file: None,
                    job_id: id.clone(),
                })
            })
            .collect())
    }

    /// A claim on SQLite: an exclusive lock on `<journal>-claims/<job id>`, taken without
    /// waiting. Like PostgreSQL's row lock, it dies with the process that holds it, so a second
    /// runner of a live job is refused (exit 3) and a killed runner's job can be picked up.
    fn claim_file(&self, journal: &std::path::Path, job_id: &str) -> Result<Option<Claim>> {
        let io = |e: std::io::Error| self.db(format!("claim file: {e}"));
        // Job ids are Lethe's own (`del-` and hex); anything else is not a file name here.
        if !job_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(self.db("not a job id".to_string()));
        }
        let mut dir = journal.as_os_str().to_owned();
        dir.push("-claims");
        let dir = std::path::PathBuf::from(dir);
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir).map_err(io)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(job_id))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Claim {
                pg: None,
                _file: Some(file),
                job_id: job_id.to_string(),
            })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
        }
    }

    /// Claims the oldest unfinished job (REQUESTED, FROZEN, DELETING or VERIFYING) that no
    /// process is running (a runner that died left it) and that is not in `skip`. `None` if
    /// there is none, or on SQLite.
    pub fn claim_next(&self, skip: &[String]) -> Result<Option<Claim>> {
        let Some(mut c) = self.pg_connect()? else {
            return Ok(None);
        };
        c.batch_execute(CLAIM_BEGIN)
            .map_err(|e| self.db(crate::db::pg_err(e)))?;
        let got = c
            .query(
                &format!(
                    "SELECT c.job_id FROM job_claims c JOIN jobs j ON j.job_id = c.job_id
                      WHERE j.state IN ('REQUESTED', {RUNNABLE}) AND NOT (c.job_id = ANY($1))
                      ORDER BY j.requested_at LIMIT 1 FOR UPDATE OF c SKIP LOCKED"
                ),
                &[&skip],
            )
            .map_err(|e| self.db(crate::db::pg_err(e)))?;
        Ok(got
            .first()
            .map(|r| Claim {
                job_id: r.get(0),
                pg: None,
                _file: None,
            })
            .map(|mut claim| {
                claim.pg = shared(c);
                claim
            }))
    }

    /// Records an entry for a job; a transition entry moves the job through
    /// [`lethe_core::state::transition`] in the same transaction.
    pub fn record(&self, at: &str, job_id: &str, entry: &Entry) -> Result<JobState> {
        self.write_entry(|tx| apply(tx, at, job_id, entry))
    }

    /// One job.
    pub fn job(&self, job_id: &str) -> Result<JobRecord> {
        self.read(|tx| load_job(tx, job_id))
    }

    /// Whether the journal holds any job.
    pub fn has_jobs(&self) -> Result<bool> {
        self.read(|tx| {
            Ok(tx
                .row("SELECT job_id FROM jobs LIMIT 1", &[])
                .map_err(db)?
                .is_some())
        })
    }

    /// The public key recorded as the one this journal's jobs are signed and hashed with
    /// (`ed25519:<hex>`), recording `id` first if none is: returns the recorded one, which
    /// may be another. A deployment key file lost or swapped is noticed by this, before a new
    /// key makes every scope hash unmatchable and every certificate unverifiable.
    pub fn bind_signing_key(&self, id: &str) -> Result<String> {
        self.write(|tx| {
            tx.exec(
                "INSERT INTO lethe_meta (k, v) VALUES ('signing_key', $1) ON CONFLICT (k) DO NOTHING",
                &[id.into()],
            )
            .map_err(db)?;
            Ok(tx
                .row("SELECT v FROM lethe_meta WHERE k = 'signing_key'", &[])
                .map_err(db)?
                .map(|r| r[0].text())
                .unwrap_or_default())
        })
    }

    /// Records `id` as the signing key, replacing any: for a journal without jobs, whose
    /// recorded key protects nothing yet.
    pub fn set_signing_key(&self, id: &str) -> Result<()> {
        self.write(|tx| {
            tx.exec(
                "INSERT INTO lethe_meta (k, v) VALUES ('signing_key', $1) \
                 ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                &[id.into()],
            )
            .map_err(db)?;
            Ok(())
        })
    }

    /// The key that signed one of the stored certificates (`signed_by`), if any is stored.
    pub fn certificate_signer(&self) -> Result<Option<String>> {
        self.read(|tx| {
            Ok(tx
                .row(
                    "SELECT certificate FROM jobs WHERE certificate IS NOT NULL LIMIT 1",
                    &[],
                )
                .map_err(db)?
                .and_then(|r| serde_json::from_str::<serde_json::Value>(&r[0].text()).ok())
                .and_then(|c| c["signed_by"].as_str().map(str::to_owned)))
        })
    }

    /// The recorded signing key's public id, if any (see [`Journal::bind_signing_key`]).
    pub fn signing_key(&self) -> Result<Option<String>> {
        self.read(|tx| {
            Ok(tx
                .row("SELECT v FROM lethe_meta WHERE k = 'signing_key'", &[])
                .map_err(db)?
                .map(|r| r[0].text()))
        })
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<JobRecord>> {
        self.read(|tx| {
            tx.rows(
                &format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY requested_at, job_id"),
                &[],
            )
            .map_err(db)?
            .iter()
            .map(job_from_row)
            .collect()
        })
    }

    /// Journals a target's frozen inventory and stores its locators, in one transaction.
    /// Idempotent: a second call for the same target keeps the first inventory.
    #[allow(clippy::too_many_arguments)] // one transaction's whole input, each a different thing
    pub fn put_inventory(
        &self,
        at: &str,
        job_id: &str,
        target: &str,
        count: u64,
        locators: &[Locator],
        digest_key: &[u8; 32],
        place: &str,
    ) -> Result<()> {
        self.write_entry(|tx| {
            let done = tx
                .row(
                    "SELECT inventoried FROM target_progress WHERE job_id = $1 AND target = $2",
                    &[job_id.into(), target.into()],
                )
                .map_err(db)?
                .and_then(|r| r[0].i());
            if done.is_some() {
                return Ok(());
            }
            tx.insert_locators(job_id, target, locators).map_err(db)?;
            tx.exec(
                "INSERT INTO target_progress (job_id, target, inventoried) VALUES ($1, $2, $3)
                 ON CONFLICT (job_id, target) DO UPDATE SET inventoried = excluded.inventoried",
                &[job_id.into(), target.into(), count.into()],
            )
            .map_err(db)?;
            let entry = Entry::InventoryTaken {
                target: target.to_string(),
                count,
                locators: locators.len() as u64,
                digest: inventory_digest(digest_key, locators),
                place: (!place.is_empty()).then(|| place_digest(digest_key, place)),
            };
            apply(tx, at, job_id, &entry)?;
            Ok(())
        })
    }

    /// Adds rows found in scope after a `residue` block to a target's inventory, and marks the
    /// target to be erased and verified again. A locator already frozen gets the new rows added
    /// to its allowance. One transaction, journaled as `InventoryExtended`.
    pub fn extend_inventory(
        &self,
        at: &str,
        job_id: &str,
        target: &str,
        locators: &[Locator],
        digest_key: &[u8; 32],
    ) -> Result<u64> {
        self.write_entry(|tx| {
            tx.add_locators(job_id, target, locators).map_err(db)?;
            let count: u64 = locators.iter().map(|(_, n)| n).sum();
            tx.exec(
                "UPDATE target_progress SET inventoried = inventoried + $3, erased = NULL, residue = NULL WHERE job_id = $1 AND target = $2",
                &[job_id.into(), target.into(), count.into()],
            )
            .map_err(db)?;
            let entry = Entry::InventoryExtended {
                target: target.to_string(),
                count,
                locators: locators.len() as u64,
                digest: inventory_digest(digest_key, locators),
            };
            apply(tx, at, job_id, &entry)?;
            Ok(count)
        })
    }

    /// A target's frozen inventory: its count and its locators, if taken.
    pub fn inventory(&self, job_id: &str, target: &str) -> Result<Option<(u64, Vec<Locator>)>> {
        self.read(|tx| {
            let count = tx
                .row(
                    "SELECT inventoried FROM target_progress WHERE job_id = $1 AND target = $2",
                    &[job_id.into(), target.into()],
                )
                .map_err(db)?
                .and_then(|r| r[0].i());
            let Some(count) = count else { return Ok(None) };
            let locs = tx.locators(job_id, target).map_err(db)?;
            Ok(Some((count as u64, locs)))
        })
    }

    /// Marks a target erased (or verified, with its residue).
    pub fn set_progress(
        &self,
        job_id: &str,
        target: &str,
        erased: Option<u64>,
        residue: Option<u64>,
    ) -> Result<()> {
        self.write(|tx| put_progress(tx, job_id, target, erased, residue))
    }

    /// [`Journal::record`] and [`Journal::set_progress`] in one transaction (one durable
    /// commit instead of two): a target's last `batch_erased` with its erased count, or its
    /// `target_verified` with its residue.
    pub fn record_with_progress(
        &self,
        at: &str,
        job_id: &str,
        entry: &Entry,
        target: &str,
        erased: Option<u64>,
        residue: Option<u64>,
    ) -> Result<JobState> {
        self.write_entry(|tx| {
            let state = apply(tx, at, job_id, entry)?;
            put_progress(tx, job_id, target, erased, residue)?;
            Ok(state)
        })
    }

    /// Many jobs' entries in one transaction (one durable commit), each as
    /// [`Journal::record_with_progress`] records it (`Some((target, erased))`: with the
    /// target's erased count) or as [`Journal::record`] (`None`): what a batch journals for
    /// all its jobs at one step (their `erase_started`, then their `batch_erased`). All or
    /// none: a job's entry its state refuses fails the transaction.
    pub fn record_many(&self, at: &str, entries: &[GroupedEntry<'_>]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.write_entry(|tx| {
            for (job_id, entry, progress) in entries {
                apply(tx, at, job_id, entry)?;
                if let Some((target, erased)) = progress {
                    put_progress(tx, job_id, target, Some(*erased), None)?;
                }
            }
            Ok(())
        })
    }

    /// The targets a job has inventoried (exempt ones included), by name.
    pub fn job_targets(&self, job_id: &str) -> Result<Vec<String>> {
        self.read(|tx| {
            Ok(tx
                .rows(
                    "SELECT target FROM target_progress WHERE job_id = $1 ORDER BY target",
                    &[job_id.into()],
                )
                .map_err(db)?
                .into_iter()
                .map(|r| r[0].text().to_string())
                .collect())
        })
    }

    /// Each target the job inventoried, with the keyed digest of its place at the time (`None`
    /// when an older Lethe inventoried it).
    pub fn job_target_places(&self, job_id: &str) -> Result<Vec<(String, Option<String>)>> {
        Ok(self
            .entries(job_id)?
            .into_iter()
            .filter_map(|e| match e {
                Entry::InventoryTaken { target, place, .. } => Some((target, place)),
                _ => None,
            })
            .collect())
    }

    /// A target's progress: (inventoried count, erased, residue).
    pub fn progress(
        &self,
        job_id: &str,
        target: &str,
    ) -> Result<(Option<u64>, Option<u64>, Option<u64>)> {
        self.read(|tx| {
            let r = tx
                .row("SELECT inventoried, erased, residue FROM target_progress WHERE job_id = $1 AND target = $2", &[job_id.into(), target.into()])
                .map_err(db)?;
            Ok(match r {
                Some(r) => (r[0].i().map(|v| v as u64), r[1].i().map(|v| v as u64), r[2].i().map(|v| v as u64)),
                None => (None, None, None),
            })
        })
    }

    /// Completes a job: journals `VerifiedClean` and `Completed`, stores the certificate,
    /// opens the job's fence, drops its inventory locators and seals the chain with `key` (the
    /// deployment's signing key, the certificate's), all in one transaction.
    ///
    /// On SQLite the write-ahead log is then checkpointed and truncated: the dropped locators'
    /// pages are zeroed in the database file (`secure_delete`), but their earlier copies stay in
    /// the `-wal` until it is reset, which a long-running `lethe serve` would otherwise never
    /// do (review). A reader still in the log leaves it for the next completion; not an error.
    pub fn complete(
        &self,
        at: &str,
        job_id: &str,
        certificate: &serde_json::Value,
        key: &ed25519_dalek::SigningKey,
    ) -> Result<()> {
        self.complete_tx(at, job_id, certificate, key)?;
        self.truncate_wal();
        Ok(())
    }

    fn complete_tx(
        &self,
        at: &str,
        job_id: &str,
        certificate: &serde_json::Value,
        key: &ed25519_dalek::SigningKey,
    ) -> Result<()> {
        self.write_entry(|tx| {
            apply(tx, at, job_id, &Entry::VerifiedClean)?;
            let canonical = lethe_core::certificate::canonical_json(certificate);
            let digest = hex::encode(Sha256::digest(canonical.as_bytes()));
            tx.exec(
                "UPDATE jobs SET certificate = $2 WHERE job_id = $1",
                &[job_id.into(), certificate.to_string().into()],
            )
            .map_err(db)?;
            tx.exec("DELETE FROM fences WHERE job_id = $1", &[job_id.into()])
                .map_err(db)?;
            tx.drop_locators(job_id).map_err(db)?;
            apply(
                tx,
                at,
                job_id,
                &Entry::Completed {
                    certificate_sha256: digest,
                },
            )?;
            // The completion's own entry is the head the seal signs.
            crate::chain::seal_tx(tx, at, key, None)?;
            Ok(())
        })
    }
}

/// Inserts a target's frozen locators (unique, as an inventory's are) in multi-row `INSERT`s.
fn put_progress(
    tx: &mut dyn Tx,
    job_id: &str,
    target: &str,
    erased: Option<u64>,
    residue: Option<u64>,
) -> Result<()> {
    tx.exec(
        "INSERT INTO target_progress (job_id, target, erased, residue) VALUES ($1, $2, $3, $4)
         ON CONFLICT (job_id, target) DO UPDATE SET
           erased = coalesce(excluded.erased, target_progress.erased),
           residue = coalesce(excluded.residue, target_progress.residue)",
        &[job_id.into(), target.into(), erased.into(), residue.into()],
    )
    .map_err(db)?;
    Ok(())
}
