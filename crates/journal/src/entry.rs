//! What the journal records. One variant per fact; none holds memory content.

use lethe_core::{BlockedReason, Event, Scope};

/// One journal entry's body. Serialized as JSON with a `kind` tag.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A request was parsed and validated into a job.
    JobRequested {
        /// The exact scope, identifiers included: needed to resume the job.
        scope: Scope,
        /// Its keyed hash.
        scope_hash: String,
        /// Legal basis.
        basis: lethe_core::Basis,
        /// The privacy ticket this job answers.
        ticket: String,
        /// The erasure policy version in force.
        policy_version: String,
        /// Deadline, `YYYY-MM-DD`.
        deadline: String,
        /// Why the deadline is extended, if it is.
        extension_reason: Option<String>,
        /// A memory scope requested without a version: the version current at the request,
        /// which the freeze falls back to if the memory is gone from every target by then
        /// (erased by another job while a hold kept this one waiting). Absent otherwise, and
        /// in entries written before the field existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version_at_request: Option<String>,
    },
    /// A legal hold kept the job in REQUESTED.
    HoldRefused {
        /// The holds that apply.
        hold_ids: Vec<String>,
    },
    /// The fence closed at the gate.
    FenceClosed {
        /// The subject's epoch after the bump (subject scope) or as it stands (memory scope).
        subject_epoch: Option<u64>,
        /// The tenant's epoch after the bump (tenant scope).
        tenant_epoch: Option<u64>,
        /// The tombstoned version (memory scope).
        tombstone_version: Option<String>,
        /// Leases revoked.
        revoked_leases: u64,
        /// Permits that were active at the close and must drain.
        permits_to_drain: u64,
    },
    /// Every earlier permit drained and every inventory is journaled.
    Drained,
    /// One target's frozen inventory.
    InventoryTaken {
        /// Target name.
        target: String,
        /// Rows the target holds for the scope.
        count: u64,
        /// Locators (threads, items) the rows hang from.
        locators: u64,
        /// Keyed digest of the sorted locators and their row counts.
        digest: String,
        /// Keyed digest of where the target's data was (`Adapter::place`): a resume refuses to
        /// go on when the configuration now points the target elsewhere. Absent in entries of
        /// an older Lethe.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        place: Option<String>,
    },
    /// An operator added the rows found in scope after a `residue` block to a target's
    /// inventory (`lethe resume --reinventory`).
    InventoryExtended {
        /// Target name.
        target: String,
        /// Rows added.
        count: u64,
        /// Locators in the addition.
        locators: u64,
        /// Keyed digest of the added locators and their row counts.
        digest: String,
    },
    /// A target was found not to apply to the scope, with the reason.
    TargetExempt {
        /// Target name.
        target: String,
        /// Why.
        reason: String,
    },
    /// A target's erase is starting (journaled before the first delete).
    EraseStarted {
        /// Target name.
        target: String,
    },
    /// A batch of a target's inventory was erased.
    BatchErased {
        /// Target name.
        target: String,
        /// Locators in the batch.
        locators: u64,
        /// Rows deleted by this batch (0 for a batch erased before a crash).
        rows: u64,
    },
    /// Every target erased its frozen inventory.
    TargetsErased,
    /// One target's verification.
    TargetVerified {
        /// Target name.
        target: String,
        /// Rows left for the scope.
        residue: u64,
    },
    /// Zero residue everywhere.
    VerifiedClean,
    /// The job stopped.
    Blocked {
        /// Why.
        reason: BlockedReason,
        /// The target at fault, if one.
        target: Option<String>,
        /// A message for the operator. Never an identifier or content.
        detail: String,
    },
    /// An operator resumed the job.
    Resumed,
    /// The certificate was issued; the fence is open again.
    Completed {
        /// SHA-256 of the signed certificate's canonical JSON.
        certificate_sha256: String,
    },
    /// Every backup artifact a COMPLETE job's certificate waited for is gone (`lethe backups
    /// check`): the job's final certificate was issued. The only entry a job has after
    /// `completed`.
    BackupsExpired {
        /// SHA-256 of the final certificate's canonical JSON.
        certificate_sha256: String,
    },
    /// `lethe recovery` began replaying completed erasures into a restored target: the gate's
    /// fences for every replayed scope closed in the same transaction.
    RecoveryStarted {
        /// The recovery's id (`rcv-` and hex).
        recovery_id: String,
        /// The restored target.
        target: String,
        /// The backup's time: erasures completed since then are replayed (RFC 3339). Absent:
        /// every completed erasure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<String>,
        /// How many completed jobs' scopes are replayed.
        scopes: u64,
    },
    /// A recovery verified every replayed scope clean in its target and opened the fences.
    RecoveryVerified {
        /// The recovery's id.
        recovery_id: String,
        /// Scopes replayed.
        scopes: u64,
        /// Rows (keys, documents) erased in the restored target.
        erased: u64,
        /// SHA-256 of the signed report's canonical JSON.
        report_sha256: String,
    },
    /// The job destroyed the scope's wrapped data keys (crypto-shredding): every copy written
    /// under them, backups included, is unreadable from this entry on.
    KeysDestroyed {
        /// How many keys (a subject's one; a tenant's, one per subject).
        count: u64,
    },
    /// A legal hold was placed.
    HoldAdded {
        /// Its id.
        hold_id: String,
        /// Keyed hash of the held scope.
        scope_hash: String,
    },
    /// A legal hold was released.
    HoldReleased {
        /// Its id.
        hold_id: String,
    },
    /// The chain up to entry `to`, signed with the deployment's Ed25519 key (at each job's
    /// completion, in its transaction, and by `lethe journal verify --seal`): someone who
    /// rewrites an entry and recomputes every hash after it cannot sign the new chain.
    Sealed {
        /// The first entry `hashes` lists: the entry after the previous seal's `to`.
        from: u64,
        /// The entry sealed: the chain's head at the seal.
        to: u64,
        /// The chain hash of each entry from `from` to `to`, so a rewritten entry is named by
        /// its sequence number, not only detected.
        hashes: Vec<String>,
        /// The public key that signed (`ed25519:<hex>`).
        signed_by: String,
        /// Ed25519 signature (hex) over `chain::seal_message(from, to, hashes)`.
        signature: String,
    },
    /// An erasure request was received, waiting for an approver.
    RequestReceived {
        /// Its id.
        request_id: String,
        /// Keyed hash of the scope asked for.
        scope_hash: String,
        /// Legal basis.
        basis: lethe_core::Basis,
        /// The privacy ticket.
        ticket: String,
        /// When the person's request was received (RFC 3339): the deadline counts from it.
        received_at: String,
        /// Deadline, `YYYY-MM-DD`.
        deadline: String,
        /// Whether the requester verified the person's identity.
        identity_verified: bool,
        /// The name of the token that asked (`[[serve.token]] name`), never a subject's.
        requested_by: String,
    },
    /// An approver approved a request; its job is `job_id`.
    RequestApproved {
        /// The request.
        request_id: String,
        /// The job it started (or continued, when one was open for the scope).
        job_id: String,
        /// The approving token's name.
        approved_by: String,
    },
    /// An approver rejected a request.
    RequestRejected {
        /// The request.
        request_id: String,
        /// The rejecting token's name.
        rejected_by: String,
        /// Why, as the approver wrote it.
        reason: String,
    },
    /// New requests are refused until the intake resumes; jobs in flight go on.
    IntakePaused {
        /// The token's name.
        by: String,
    },
    /// New requests are taken again.
    IntakeResumed {
        /// The token's name.
        by: String,
    },
    /// `lethe serve` raised an alert (journaled before it is sent, so it is raised once per
    /// condition across restarts).
    AlertRaised {
        /// Its kind: `deadline`, `blocked`, `residue`, `anomaly`.
        alert: String,
        /// The job it is about.
        job_id: String,
        /// The condition, as compared to raise it again when it changes (`due_soon`,
        /// `overdue`; a block's reason, target and time). Never an identifier.
        condition: String,
    },
}

impl Entry {
    /// The job-state event this entry records, if it is a transition.
    pub fn event(&self) -> Option<Event> {
        Some(match self {
            Entry::FenceClosed { .. } => Event::FenceClosed,
            Entry::Drained => Event::Drained,
            Entry::TargetsErased => Event::TargetsErased,
            Entry::VerifiedClean => Event::VerifiedClean,
            Entry::Blocked { reason, .. } => Event::Blocked(*reason),
            Entry::Resumed => Event::Resumed,
            _ => return None,
        })
    }

    /// The `kind` tag.
    pub fn kind(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
            .unwrap_or_default()
    }
}
