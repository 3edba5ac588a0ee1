//! The closed registry: one enum lists every adapter kind, one `match` builds them.
//!
//! A `[[target]]` table has three common keys (`name`, `kind`, `class`); the rest belongs to the
//! kind and is parsed by that kind's `config.rs` with unknown keys refused.

use std::fmt;
use std::path::Path;

use crate::{Adapter, Kind};

/// What a target holds (docs/design.md, "Words": class).
pub const CLASSES: [&str; 14] = [
    "primary",
    "projection",
    "vector-index",
    "keyword-index",
    "summary",
    "prompt-snapshot",
    "cache",
    "queue",
    "export",
    "analytics",
    "vendor",
    "trace",
    "backup",
    "key",
];

/// A configured target: a name, its class and the adapter that erases it.
pub struct Target {
    /// Unique name, used in journals, logs and certificates.
    pub name: String,
    /// The adapter kind.
    pub kind: Kind,
    /// The asset class.
    pub class: String,
    /// The adapter.
    pub adapter: Box<dyn Adapter>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish()
    }
}

/// A `[[target]]` table that does not build. Each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TargetConfigError {
    /// A required key is missing.
    #[error("target #{index}: missing key `{key}`")]
    Missing {
        /// 1-based position in the file.
        index: usize,
        /// The key.
        key: &'static str,
    },
    /// A required key holds another type than a string.
    #[error("target #{index}: `{key}` must be a string (in quotes), not a TOML {found}")]
    NotAString {
        /// 1-based position in the file.
        index: usize,
        /// The key.
        key: &'static str,
        /// The TOML type found.
        found: &'static str,
    },
    /// `kind` is not a known adapter.
    #[error("target {name}: unknown kind '{kind}'; known kinds: {known}")]
    UnknownKind {
        /// Target name.
        name: String,
        /// What was given.
        kind: String,
        /// The known kinds.
        known: String,
    },
    /// `class` is not an asset class.
    #[error("target {name}: unknown class '{class}'; known classes: {known}")]
    UnknownClass {
        /// Target name.
        name: String,
        /// What was given.
        class: String,
        /// The known classes.
        known: String,
    },
    /// `class` is an asset class this kind of store cannot hold.
    #[error("target {name}: a {kind} target cannot be of class '{class}'; its classes: {allowed}")]
    ClassNotHeld {
        /// Target name.
        name: String,
        /// Its kind.
        kind: Kind,
        /// What was given.
        class: String,
        /// The classes the kind may claim.
        allowed: String,
    },
    /// A kind-specific key is wrong (unknown key, wrong type, bad value).
    #[error("target {name} ({kind}): {why}")]
    Invalid {
        /// Target name.
        name: String,
        /// Its kind.
        kind: Kind,
        /// What is wrong.
        why: String,
    },
}

fn take_str(
    t: &mut toml::Table,
    key: &'static str,
    index: usize,
) -> Result<String, TargetConfigError> {
    match t.remove(key) {
        Some(toml::Value::String(s)) => Ok(s),
        None => Err(TargetConfigError::Missing { index, key }),
        // Newcomer review: `name = 5` was reported as a missing `name`.
        Some(v) => Err(TargetConfigError::NotAString {
            index,
            key,
            found: v.type_str(),
        }),
    }
}

/// Builds a target from its `[[target]]` table. Relative paths are relative to `base` (the
/// config file's folder). Touches no store.
pub fn build(
    index: usize,
    mut table: toml::Table,
    base: &Path,
) -> Result<Target, TargetConfigError> {
    let name = take_str(&mut table, "name", index)?;
    let kind_str = take_str(&mut table, "kind", index)?;
    let class = take_str(&mut table, "class", index)?;
    let kind = Kind::ALL
        .iter()
        .copied()
        .find(|k| k.as_str() == kind_str)
        .ok_or_else(|| TargetConfigError::UnknownKind {
            name: name.clone(),
            kind: kind_str,
            known: Kind::ALL
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    if !CLASSES.contains(&class.as_str()) {
        return Err(TargetConfigError::UnknownClass {
            name,
            class,
            known: CLASSES.join(", "),
        });
    }
    // A class is a claim the certificate signs: one the store cannot hold would be read by
    // an auditor as a fact (a SQLite checkpointer listed as a `backup`).
    if !kind.classes().contains(&class.as_str()) {
        return Err(TargetConfigError::ClassNotHeld {
            name,
            kind,
            class,
            allowed: kind.classes().join(", "),
        });
    }
    let invalid = |why: String| TargetConfigError::Invalid {
        name: name.clone(),
        kind,
        why,
    };
    let adapter = kind.build(table, base, &name).map_err(invalid)?;
    Ok(Target {
        name,
        kind,
        class,
        adapter,
    })
}

/// Deserializes a kind's table, mapping serde's message (which names unknown keys and what was
/// expected) to a plain string, without the values it quotes (a URL given where a table was
/// expected holds its password).
/// The message starts with the key at fault (`path: invalid type ...`, `registry.table:
/// ...`, `namespace[1]: ...`; newcomer review: it did not say which key), but never with a key
/// the file made up.
pub(crate) fn parse_table<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T, String> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let (path, reason) = lethe_core::redact::fault(e.path(), e.inner().message().trim_end());
        if path.is_empty() {
            reason
        } else {
            format!("`{path}`: {reason}")
        }
    })
}

/// Resolves a configured path against the config file's folder.
pub(crate) fn resolve(base: &Path, p: &Path) -> std::path::PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Reads a secret (an API key, a bearer token) from a file relative to the config's folder:
/// private to its owner (`lethe_postgres::read_password_file`) and one line of visible ASCII,
/// as an HTTP header needs. `key` names the config key in errors; the secret is never shown.
pub(crate) fn read_secret(base: &Path, file: &Path, key: &str) -> Result<String, String> {
    let p = resolve(base, file);
    let t = lethe_postgres::read_password_file(&p)
        .map_err(|e| format!("{key} {}: {e}", p.display()))?;
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{key} {}: the secret must be visible ASCII on one line",
            p.display()
        ));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(lines: &str) -> Target {
        build(1, toml::from_str(lines).unwrap(), Path::new(".")).unwrap()
    }

    /// A class is a claim the certificate signs: a kind accepts only the classes its store can
    /// hold, and refuses another naming the target and the classes it may claim; every kind's
    /// classes are asset classes.
    #[test]
    fn a_class_the_store_cannot_hold_is_refused_naming_the_target() {
        let table = |class: &str| {
            toml::from_str::<toml::Table>(&format!(
                "name = \"history\"\nkind = \"langgraph-sqlite-checkpointer\"\nclass = \"{class}\"\n\
                 path = \"x.db\"\nmetadata = {{ tenant = \"t\", subject = \"s\" }}\n"
            ))
            .unwrap()
        };
        for class in ["backup", "key", "cache", "trace"] {
            let e = build(1, table(class), Path::new("."))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("target history") && e.contains(&format!("'{class}'")),
                "{class}: {e}"
            );
            assert!(e.contains("its classes: primary"), "{e}");
        }
        assert!(build(1, table("summary"), Path::new(".")).is_ok());
        for k in Kind::ALL {
            assert!(!k.classes().is_empty());
            assert!(k.classes().iter().all(|c| CLASSES.contains(c)), "{k}");
            // Only a backup kind holds backups, and it holds nothing else.
            let backup = matches!(k, Kind::BackupFiles | Kind::BackupS3);
            assert_eq!(k.classes().contains(&"backup"), backup, "{k}");
            assert!(!backup || k.classes() == ["backup"], "{k}");
        }
    }

    /// A target's place names its database and schema (PostgreSQL), its Redis database and
    /// pattern, not its host or password: a failover to another host keeps the place, another
    /// database or layout under the same name does not (a job refuses to go on there).
    #[test]
    fn a_place_changes_with_the_database_and_layout_not_the_host() {
        let pg = |url: &str, schema: &str| {
            target(&format!(
                "name = \"m\"\nkind = \"langgraph-postgres-store\"\nclass = \"primary\"\n\
                 url = \"{url}\"\nschema = \"{schema}\"\nnamespace = [\"{{tenant}}\", \"{{subject}}\"]\n"
            ))
            .adapter
            .place()
        };
        let a = pg("postgres://app:pw@10.0.0.1:5432/agent", "public");
        assert_eq!(a, pg("postgres://app:other@10.0.0.2:6432/agent", "public"));
        assert_ne!(
            a,
            pg("postgres://app:pw@10.0.0.1:5432/agent_copy", "public")
        );
        assert_ne!(a, pg("postgres://app:pw@10.0.0.1:5432/agent", "other"));
        assert!(!a.contains("pw") && !a.contains("10.0.0.1"), "{a}");
        let redis = |url: &str, pattern: &str| {
            target(&format!(
                "name = \"c\"\nkind = \"redis\"\nclass = \"cache\"\nurl = \"{url}\"\npattern = \"{pattern}\"\n"
            ))
            .adapter
            .place()
        };
        let r = redis("redis://10.0.0.1:6379/5", "{tenant}:{subject}:*");
        assert_eq!(r, redis("redis://10.0.0.2:6380/5", "{tenant}:{subject}:*"));
        assert_ne!(r, redis("redis://10.0.0.1:6379/6", "{tenant}:{subject}:*"));
        assert_ne!(
            r,
            redis("redis://10.0.0.1:6379/5", "app:{tenant}:{subject}:*")
        );
        // What else a target inventories is part of its place: an index layout, a registry.
        let indexed = |index: &str| {
            target(&format!(
                "name = \"c\"\nkind = \"redis\"\nclass = \"cache\"\nurl = \"redis://h/5\"\n\
                 pattern = \"{{tenant}}:{{subject}}:*\"\nmode = \"index\"\nindex = \"{index}\"\n"
            ))
            .adapter
            .place()
        };
        assert_ne!(
            indexed("idx:{tenant}:{subject}"),
            indexed("ix:{tenant}:{subject}")
        );
        let checkpointer = |registry: &str| {
            target(&format!(
                "name = \"k\"\nkind = \"langgraph-postgres-checkpointer\"\nclass = \"primary\"\n\
                 url = \"postgres://app@h/agent\"\nregistry = {{ url = \"postgres://app@h/{registry}\", \
                 table = \"thread_registry\", tenant = \"t\", subject = \"s\", thread = \"th\" }}\n"
            ))
            .adapter
            .place()
        };
        assert_ne!(checkpointer("accounts"), checkpointer("accounts_copy"));
    }
}
