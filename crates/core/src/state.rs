//! A job's life as a pure function: `(state, event) -> Result<state>`.
//!
//! ```text
//! REQUESTED -> FROZEN -> DELETING -> VERIFYING -> COMPLETE
//!                 |         |            |
//!                 +---------+---------> BLOCKED -> (resume) -> DELETING
//! ```
//!
//! FROZEN may block too: permits issued before the freeze that do not drain keep the job from
//! ever reaching DELETING (docs/design.md, "A job's life"). COMPLETE is final: no event leaves it.

use std::fmt;

/// Where a job is.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Parsed, validated and journaled; nothing touched yet. A legal hold keeps a job here.
    Requested,
    /// The fence is closed; earlier permits are draining and inventories are being taken.
    Frozen,
    /// Adapters are erasing the frozen inventory.
    Deleting,
    /// Adapters are counting what is left.
    Verifying,
    /// Zero residue everywhere and a signed certificate. Final.
    Complete,
    /// Stopped with a reason; `resume` takes it back to DELETING.
    Blocked,
}

impl JobState {
    /// Every state, for table tests and listings.
    pub const ALL: [JobState; 6] = [
        JobState::Requested,
        JobState::Frozen,
        JobState::Deleting,
        JobState::Verifying,
        JobState::Complete,
        JobState::Blocked,
    ];

    /// The name users see and scripts parse.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Requested => "REQUESTED",
            JobState::Frozen => "FROZEN",
            JobState::Deleting => "DELETING",
            JobState::Verifying => "VERIFYING",
            JobState::Complete => "COMPLETE",
            JobState::Blocked => "BLOCKED",
        }
    }

    /// Parses [`JobState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether no event can leave this state.
    pub fn is_final(self) -> bool {
        self == JobState::Complete
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a job is BLOCKED. Stable strings: scripts match on them.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockedReason {
    /// Permits issued before the freeze were neither released nor confirmed cancelled in time.
    Undrained,
    /// A target would have erased more than its frozen inventory.
    AnomalousVolume,
    /// Verification counted rows left for the scope.
    Residue,
    /// A target could not be reached or failed with an error worth retrying.
    TargetUnavailable,
    /// A target failed with an error that retrying will not fix.
    TargetFailed,
    /// A target refused a write: its file, database, server or user is read-only. Make it
    /// writable, then resume.
    TargetReadOnly,
    /// A derived store (a node cache) holds entries no lineage ties to any subject, and the
    /// target's `legacy` setting is `refuse`: an operator decides (flush or expire), then
    /// resumes.
    LegacyDerived,
}

impl BlockedReason {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockedReason::Undrained => "undrained",
            BlockedReason::AnomalousVolume => "anomalous_volume",
            BlockedReason::Residue => "residue",
            BlockedReason::TargetUnavailable => "target_unavailable",
            BlockedReason::TargetFailed => "target_failed",
            BlockedReason::TargetReadOnly => "target_read_only",
            BlockedReason::LegacyDerived => "legacy_derived",
        }
    }
}

impl fmt::Display for BlockedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to a job. Past tense: each is a fact the journal records.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    /// The fence closed at the gate (epoch bumped or tombstone appended, leases revoked).
    FenceClosed,
    /// Every permit issued before the freeze was released or confirmed cancelled, and every
    /// target's inventory is journaled.
    Drained,
    /// Every target erased its frozen inventory.
    TargetsErased,
    /// Every target verified zero residue.
    VerifiedClean,
    /// The job stopped, with a reason.
    Blocked(BlockedReason),
    /// An operator resumed a blocked job (after the gate drained).
    Resumed,
}

/// An event that cannot happen in a state. A bug in the engine, or a tampered journal.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("event {event:?} cannot happen in state {state}")]
pub struct InvalidTransition {
    /// The state the job was in.
    pub state: JobState,
    /// The event refused.
    pub event: Event,
}

/// The transition function. The only place the job graph is written down.
pub fn transition(state: JobState, event: Event) -> Result<JobState, InvalidTransition> {
    use BlockedReason as R;
    use Event as E;
    use JobState as S;
    let next = match (state, event) {
        (S::Requested, E::FenceClosed) => S::Frozen,
        (S::Frozen, E::Drained) => S::Deleting,
        (
            S::Frozen,
            E::Blocked(
                R::Undrained
                | R::TargetUnavailable
                | R::TargetFailed
                | R::TargetReadOnly
                | R::LegacyDerived,
            ),
        ) => S::Blocked,
        (S::Deleting, E::TargetsErased) => S::Verifying,
        (
            S::Deleting,
            E::Blocked(
                R::AnomalousVolume
                | R::TargetUnavailable
                | R::TargetFailed
                | R::TargetReadOnly
                | R::LegacyDerived
                | R::Undrained,
            ),
        ) => S::Blocked,
        (S::Verifying, E::VerifiedClean) => S::Complete,
        (
            S::Verifying,
            E::Blocked(R::Residue | R::TargetUnavailable | R::TargetFailed | R::TargetReadOnly),
        ) => S::Blocked,
        (S::Blocked, E::Resumed) => S::Deleting,
        _ => return Err(InvalidTransition { state, event }),
    };
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use BlockedReason as R;
    use Event as E;
    use JobState as S;

    fn all_events() -> Vec<Event> {
        let mut v = vec![
            E::FenceClosed,
            E::Drained,
            E::TargetsErased,
            E::VerifiedClean,
            E::Resumed,
        ];
        for r in [
            R::Undrained,
            R::AnomalousVolume,
            R::Residue,
            R::TargetUnavailable,
            R::TargetFailed,
            R::TargetReadOnly,
            R::LegacyDerived,
        ] {
            v.push(E::Blocked(r));
        }
        v
    }

    /// The whole table, every (state, event) pair: what docs/design.md draws and nothing else.
    #[test]
    fn transition_table_is_exactly_the_design() {
        let expected = |s: S, e: E| -> Option<S> {
            Some(match (s, e) {
                (S::Requested, E::FenceClosed) => S::Frozen,
                (S::Frozen, E::Drained) => S::Deleting,
                (S::Frozen, E::Blocked(R::Undrained)) => S::Blocked,
                (S::Frozen, E::Blocked(R::TargetUnavailable)) => S::Blocked,
                (S::Frozen, E::Blocked(R::TargetFailed)) => S::Blocked,
                (S::Frozen, E::Blocked(R::TargetReadOnly)) => S::Blocked,
                (S::Frozen, E::Blocked(R::LegacyDerived)) => S::Blocked,
                (S::Deleting, E::TargetsErased) => S::Verifying,
                (S::Deleting, E::Blocked(R::AnomalousVolume)) => S::Blocked,
                (S::Deleting, E::Blocked(R::TargetUnavailable)) => S::Blocked,
                (S::Deleting, E::Blocked(R::TargetFailed)) => S::Blocked,
                (S::Deleting, E::Blocked(R::TargetReadOnly)) => S::Blocked,
                (S::Deleting, E::Blocked(R::LegacyDerived)) => S::Blocked,
                (S::Deleting, E::Blocked(R::Undrained)) => S::Blocked,
                (S::Verifying, E::VerifiedClean) => S::Complete,
                (S::Verifying, E::Blocked(R::Residue)) => S::Blocked,
                (S::Verifying, E::Blocked(R::TargetUnavailable)) => S::Blocked,
                (S::Verifying, E::Blocked(R::TargetFailed)) => S::Blocked,
                (S::Verifying, E::Blocked(R::TargetReadOnly)) => S::Blocked,
                (S::Blocked, E::Resumed) => S::Deleting,
                _ => return None,
            })
        };
        let mut allowed = 0;
        for s in S::ALL {
            for e in all_events() {
                match (transition(s, e), expected(s, e)) {
                    (Ok(got), Some(want)) => {
                        assert_eq!(got, want, "{s} + {e:?}");
                        allowed += 1;
                    }
                    (Err(err), None) => assert_eq!(err, InvalidTransition { state: s, event: e }),
                    (got, want) => panic!("{s} + {e:?}: got {got:?}, want {want:?}"),
                }
            }
        }
        assert_eq!(allowed, 20);
    }

    #[test]
    fn complete_is_final_and_requested_cannot_skip_the_freeze() {
        assert!(S::Complete.is_final());
        for e in all_events() {
            assert!(transition(S::Complete, e).is_err());
        }
        assert!(transition(S::Requested, E::Drained).is_err());
        assert!(transition(S::Requested, E::TargetsErased).is_err());
        assert!(transition(S::Blocked, E::VerifiedClean).is_err());
    }

    #[test]
    fn names_round_trip() {
        for s in S::ALL {
            assert_eq!(S::parse(s.as_str()), Some(s));
        }
    }
}
