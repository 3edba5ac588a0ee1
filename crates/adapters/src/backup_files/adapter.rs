//! The `backup-files` adapter: lists a folder's artifacts, erases nothing.

use std::path::PathBuf;

use lethe_core::Scope;
use time::OffsetDateTime;

use crate::backup::{glob, Artifact, Retention};
use crate::{Adapter, AdapterError, Applicability, Description, Inventory, Kind};

/// A folder of backup artifacts.
pub struct BackupFiles {
    pub(super) name: String,
    pub(super) path: PathBuf,
    pub(super) pattern: String,
    pub(super) retention: Retention,
}

impl BackupFiles {
    fn unavailable(&self, e: std::io::Error) -> AdapterError {
        AdapterError::Unavailable {
            target: self.name.clone(),
            why: format!("cannot list the backup folder {}: {e}", self.path.display()),
        }
    }

    /// The folder's artifacts, sorted by name.
    fn list(&self) -> Result<Vec<Artifact>, AdapterError> {
        if self.path.exists() && !self.path.is_dir() {
            return Err(AdapterError::Failed {
                target: self.name.clone(),
                why: format!("path {} is not a folder", self.path.display()),
            });
        }
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.path).map_err(|e| self.unavailable(e))? {
            let entry = entry.map_err(|e| self.unavailable(e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if name.starts_with('.') || !glob(&self.pattern, &name) {
                continue;
            }
            let modified = match entry.metadata().and_then(|m| m.modified()) {
                Ok(m) => m,
                // Deleted between the listing and the look: it is gone, not an artifact.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.unavailable(e)),
            };
            out.push(Artifact::new(
                name,
                OffsetDateTime::from(modified),
                self.retention.days,
            ));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl Adapter for BackupFiles {
    fn describe(&self) -> Description {
        Description {
            kind: Kind::BackupFiles,
            version: "1",
            capabilities: vec!["tenant", "subject", "memory", "backup"],
        }
    }

    /// Every scope: a backup of a covered target holds whatever that target held.
    fn check_scope(&self, _scope: &Scope) -> Result<Applicability, AdapterError> {
        Ok(Applicability::Applies)
    }

    fn probe(&self) -> Result<(), AdapterError> {
        self.list().map(|_| ())
    }

    fn place(&self) -> String {
        format!("{}/{}", self.path.display(), self.pattern)
    }

    /// Nothing to erase: an erasure cannot rewrite a backup.
    fn inventory(&self, _scope: &Scope) -> Result<Inventory, AdapterError> {
        Ok(Inventory::default())
    }

    fn erase_batch(&self, _scope: &Scope, _batch: &[(String, u64)]) -> Result<u64, AdapterError> {
        Ok(0)
    }

    fn verify(&self, _scope: &Scope, _frozen: &[(String, u64)]) -> Result<u64, AdapterError> {
        Ok(0)
    }

    fn backups(&self) -> Result<Option<Vec<Artifact>>, AdapterError> {
        self.list().map(Some)
    }

    fn covers(&self) -> &[String] {
        &self.retention.covers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(dir: &std::path::Path, extra: &str) -> Result<Box<dyn Adapter>, String> {
        let table: toml::Table = toml::from_str(&format!(
            "path = {:?}\nretention_days = 30\ncovers = [\"checkpoints\"]\n{extra}",
            dir.display().to_string()
        ))
        .unwrap();
        Kind::BackupFiles.build(table, dir, "nightly")
    }

    #[test]
    fn the_folder_entries_matching_the_pattern_are_the_artifacts_with_their_times() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.dump"), b"x").unwrap();
        std::fs::write(dir.path().join("b.dump"), b"x").unwrap();
        std::fs::write(dir.path().join(".c.dump"), b"in progress").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("d.dump")).unwrap();
        // A file's time is the system's.
        #[allow(clippy::disallowed_methods)]
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(10 * 86_400);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("a.dump"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let t = target(dir.path(), "pattern = \"*.dump\"").unwrap();
        let got = t.backups().unwrap().unwrap();
        let names: Vec<_> = got.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a.dump", "b.dump", "d.dump"]);
        let a = &got[0];
        let taken = OffsetDateTime::from(old);
        assert_eq!(a.taken_at.unix_timestamp(), taken.unix_timestamp());
        assert_eq!(a.expires, (taken + time::Duration::days(30)).date());
        // Nothing to erase, and nothing left: the engine settles it from the artifacts.
        let scope = Scope::Tenant {
            tenant: lethe_core::Tenant::new("acme").unwrap(),
        };
        assert_eq!(t.inventory(&scope).unwrap().count, 0);
        assert_eq!(t.covers(), ["checkpoints".to_string()]);
    }

    #[test]
    fn bad_config_and_a_missing_folder_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = target(dir.path(), "retention = 3").err().unwrap();
        assert!(e.contains("retention"), "{e}");
        let e = target(dir.path(), "pattern = \"a/b\"").err().unwrap();
        assert!(e.contains("pattern"), "{e}");
        let t = target(&dir.path().join("gone"), "").unwrap();
        let e = t.probe().unwrap_err();
        assert!(e.is_retryable(), "{e}");
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let t = target(&dir.path().join("file"), "").unwrap();
        let e = t.probe().unwrap_err();
        assert_eq!(e.code(), "failed", "{e}");
    }
}
