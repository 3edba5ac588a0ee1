//! What the backup kinds (`backup-files`, `backup-s3`) share: an artifact, its expiry, and the
//! keys every backup target has (`retention_days`, `covers`).
//!
//! An erasure cannot rewrite a backup. A backup target erases nothing and verifies nothing;
//! at completion the engine asks it for its artifacts ([`crate::Adapter::backups`]): those
//! taken before the job's completion may hold the scope's data, and the target is
//! `PENDING_EXPIRY` until the last of them expires. One taken after completion holds nothing
//! of the scope and does not extend it. `lethe backups check` issues the job's final
//! certificate once every artifact it waited for is gone.

use time::{Date, OffsetDateTime};

/// One backup artifact (a file, a folder, an object): never its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Its name within the target (a file name, an object key below the prefix).
    pub name: String,
    /// When it was taken: the file's modification time, the object's `LastModified`.
    pub taken_at: OffsetDateTime,
    /// The day its retention ends: `taken_at` plus the target's retention, in UTC.
    pub expires: Date,
}

impl Artifact {
    /// An artifact taken at `taken_at`, kept `retention_days`.
    pub fn new(name: String, taken_at: OffsetDateTime, retention_days: u32) -> Self {
        let expires = (taken_at.to_offset(time::UtcOffset::UTC)
            + time::Duration::days(i64::from(retention_days)))
        .date();
        Self {
            name,
            taken_at,
            expires,
        }
    }
}

/// The keys every backup target has, validated.
#[derive(Debug, Clone)]
pub(crate) struct Retention {
    /// How many days an artifact is kept after it is taken.
    pub days: u32,
    /// The targets whose data the artifacts hold.
    pub covers: Vec<String>,
}

impl Retention {
    /// Checks `retention_days` (1 to 36,500) and `covers` (at least one name, none twice);
    /// that each name is a target, and not a backup target, the engine checks with the whole
    /// configuration.
    pub(crate) fn new(days: i64, covers: Vec<String>) -> Result<Self, String> {
        let days = u32::try_from(days)
            .ok()
            .filter(|d| (1..=36_500).contains(d))
            .ok_or("retention_days must be a whole number of days from 1 to 36500")?;
        if covers.is_empty() {
            return Err("covers must name at least one target whose data these backups hold (covers = [\"checkpoints\"])".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in &covers {
            if !seen.insert(c) {
                return Err(format!("covers names target {c} twice"));
            }
        }
        Ok(Self { days, covers })
    }
}

/// Whether `name` matches `pattern`: `*` any run of characters, `?` one, all else itself.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with backtracking to the last star.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    while i < p.len() && p[i] == '*' {
        i += 1;
    }
    i == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_stars_and_marks_only() {
        assert!(glob("*.dump", "langgraph-2026-12-01.dump"));
        assert!(!glob("*.dump", "langgraph.dump.tmp"));
        assert!(glob("rdb-??.rdb", "rdb-01.rdb"));
        assert!(!glob("rdb-??.rdb", "rdb-1.rdb"));
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
        // Brackets are not special: a name with them matches itself only.
        assert!(glob("[x].dump", "[x].dump"));
        assert!(!glob("[x].dump", "x.dump"));
    }

    #[test]
    fn an_artifact_expires_its_retention_after_it_was_taken_in_utc() {
        let taken = time::macros::datetime!(2026-12-01 23:30 -02:00);
        // 2026-12-02 01:30 UTC, plus 30 days.
        let a = Artifact::new("a".into(), taken, 30);
        assert_eq!(a.expires, time::macros::date!(2027 - 01 - 01));
    }

    #[test]
    fn retention_and_covers_are_checked() {
        assert!(Retention::new(0, vec!["a".into()]).is_err());
        assert!(Retention::new(36_501, vec!["a".into()]).is_err());
        assert!(Retention::new(-3, vec!["a".into()]).is_err());
        assert!(Retention::new(7, vec![]).is_err());
        assert!(Retention::new(7, vec!["a".into(), "a".into()]).is_err());
        let r = Retention::new(7, vec!["a".into(), "b".into()]).unwrap();
        assert_eq!((r.days, r.covers.len()), (7, 2));
    }
}
