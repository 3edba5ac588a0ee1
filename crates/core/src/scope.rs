//! What one request erases, its canonical encoding and its keyed hash.
//!
//! The scope hash is the only trace of the identifiers that leaves the control plane: it goes
//! on certificates, in logs and in job listings. It is an HMAC under the deployment key, so
//! nobody without the key can test a guess of who was erased.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ident::{IdentError, MemoryId, Subject, Tenant, Version};
use crate::keys::ScopeKey;

/// What one request erases.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Scope {
    /// Everything of one person in one tenant. Bumps the subject's epoch.
    Subject {
        /// The tenant.
        tenant: Tenant,
        /// The person.
        subject: Subject,
    },
    /// One memory of one person. Appends a tombstone; other memories stay usable.
    Memory {
        /// The tenant.
        tenant: Tenant,
        /// The person.
        subject: Subject,
        /// The memory, in the target's layout.
        memory: MemoryId,
        /// The version asked for; `None` means the one current at the freeze.
        version: Option<Version>,
    },
    /// Everything of a tenant (offboarding). Bumps the tenant's epoch.
    Tenant {
        /// The tenant.
        tenant: Tenant,
    },
}

/// The kind of a scope, as certificates and listings name it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScopeKind {
    /// [`Scope::Subject`].
    Subject,
    /// [`Scope::Memory`].
    Memory,
    /// [`Scope::Tenant`].
    Tenant,
}

impl fmt::Display for ScopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScopeKind::Subject => "SUBJECT",
            ScopeKind::Memory => "MEMORY",
            ScopeKind::Tenant => "TENANT",
        })
    }
}

/// Why raw identifiers do not make a scope. Messages name the field, never the value.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    /// An identifier is malformed.
    #[error(transparent)]
    Ident(#[from] IdentError),
    /// A memory was named without its subject.
    #[error("memory needs subject")]
    MemoryWithoutSubject,
    /// A version was named without its memory.
    #[error("version needs memory")]
    VersionWithoutMemory,
}

impl Scope {
    /// The scope raw identifiers name: a tenant; with a subject, that subject; with a subject
    /// and a memory, that memory (at `version`, or the one current at the freeze). Every
    /// identifier is validated; a combination that names no scope is refused, never widened.
    pub fn from_parts(
        tenant: &str,
        subject: Option<&str>,
        memory: Option<&str>,
        version: Option<&str>,
    ) -> Result<Self, ScopeError> {
        let tenant = Tenant::new(tenant)?;
        Ok(match (subject, memory, version) {
            (_, None, Some(_)) => return Err(ScopeError::VersionWithoutMemory),
            (None, Some(_), _) => return Err(ScopeError::MemoryWithoutSubject),
            (None, None, None) => Scope::Tenant { tenant },
            (Some(s), None, None) => Scope::Subject {
                tenant,
                subject: Subject::new(s)?,
            },
            (Some(s), Some(m), v) => Scope::Memory {
                tenant,
                subject: Subject::new(s)?,
                memory: MemoryId::new(m)?,
                version: v.map(Version::new).transpose()?,
            },
        })
    }

    /// This scope's kind.
    pub fn kind(&self) -> ScopeKind {
        match self {
            Scope::Subject { .. } => ScopeKind::Subject,
            Scope::Memory { .. } => ScopeKind::Memory,
            Scope::Tenant { .. } => ScopeKind::Tenant,
        }
    }

    /// The tenant every scope names.
    pub fn tenant(&self) -> &Tenant {
        match self {
            Scope::Subject { tenant, .. }
            | Scope::Memory { tenant, .. }
            | Scope::Tenant { tenant } => tenant,
        }
    }

    /// The subject, for subject and memory scopes.
    pub fn subject(&self) -> Option<&Subject> {
        match self {
            Scope::Subject { subject, .. } | Scope::Memory { subject, .. } => Some(subject),
            Scope::Tenant { .. } => None,
        }
    }

    /// The canonical byte encoding: a format tag, the kind, then each field as a 4-byte
    /// big-endian length and its bytes, with an absent version encoded as length `u32::MAX`.
    /// Length prefixes make the encoding injective whatever bytes an identifier holds.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = b"lethe-scope/1\0".to_vec();
        let mut field = |b: Option<&[u8]>| match b {
            Some(b) => {
                // Identifiers are at most 256 bytes, so the cast cannot truncate.
                out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                out.extend_from_slice(b);
            }
            None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
        };
        match self {
            Scope::Subject { tenant, subject } => {
                field(Some(b"subject"));
                field(Some(tenant.as_str().as_bytes()));
                field(Some(subject.as_str().as_bytes()));
            }
            Scope::Memory {
                tenant,
                subject,
                memory,
                version,
            } => {
                field(Some(b"memory"));
                field(Some(tenant.as_str().as_bytes()));
                field(Some(subject.as_str().as_bytes()));
                field(Some(memory.as_str().as_bytes()));
                field(version.as_ref().map(|v| v.as_str().as_bytes()));
            }
            Scope::Tenant { tenant } => {
                field(Some(b"tenant"));
                field(Some(tenant.as_str().as_bytes()));
            }
        }
        out
    }

    /// HMAC-SHA256 of [`Scope::canonical_bytes`] under the deployment's scope key.
    pub fn hash(&self, key: &ScopeKey) -> ScopeHash {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes())
            .expect("HMAC accepts keys of any length");
        mac.update(&self.canonical_bytes());
        ScopeHash(mac.finalize().into_bytes().into())
    }
}

/// A keyed hash of a scope, shown as `hmac:<64 hex>`. Safe to log and to publish.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScopeHash([u8; 32]);

impl ScopeHash {
    /// Parses `hmac:<64 hex>`.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix("hmac:")?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex, &mut out).ok()?;
        Some(Self(out))
    }

    /// A short form for log lines: the first 12 hex digits.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl fmt::Display for ScopeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hmac:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for ScopeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_parts_names_exactly_one_scope_or_refuses() {
        assert_eq!(
            Scope::from_parts("t", None, None, None).unwrap().kind(),
            ScopeKind::Tenant
        );
        assert_eq!(
            Scope::from_parts("t", Some("s"), None, None)
                .unwrap()
                .kind(),
            ScopeKind::Subject
        );
        assert_eq!(
            Scope::from_parts("t", Some("s"), Some("m"), Some("v"))
                .unwrap()
                .kind(),
            ScopeKind::Memory
        );
        assert!(matches!(
            Scope::from_parts("t", None, Some("m"), None),
            Err(ScopeError::MemoryWithoutSubject)
        ));
        assert!(matches!(
            Scope::from_parts("t", Some("s"), None, Some("v")),
            Err(ScopeError::VersionWithoutMemory)
        ));
        assert!(matches!(
            Scope::from_parts("", Some("s"), None, None),
            Err(ScopeError::Ident(_))
        ));
    }
    use crate::keys::DeploymentKey;

    fn subject(t: &str, s: &str) -> Scope {
        Scope::Subject {
            tenant: Tenant::new(t).unwrap(),
            subject: Subject::new(s).unwrap(),
        }
    }

    #[test]
    fn hash_is_hmac_hex_and_keyed() {
        let k1 = DeploymentKey::from_bytes([1; 32]);
        let k2 = DeploymentKey::from_bytes([2; 32]);
        let h = subject("acme", "alice").hash(&k1.scope_key());
        let shown = h.to_string();
        assert!(
            shown.starts_with("hmac:") && shown.len() == 5 + 64,
            "{shown}"
        );
        assert_eq!(ScopeHash::parse(&shown), Some(h));
        assert_ne!(h, subject("acme", "alice").hash(&k2.scope_key()));
    }

    #[test]
    fn encoding_is_injective_across_field_boundaries() {
        let k = DeploymentKey::from_bytes([7; 32]).scope_key();
        // The same concatenated text split differently must hash differently.
        assert_ne!(
            subject("acme", "eu:bob").hash(&k),
            subject("acme:eu", "bob").hash(&k)
        );
        assert_ne!(subject("ab", "c").hash(&k), subject("a", "bc").hash(&k));
        let mem = |v: Option<&str>| Scope::Memory {
            tenant: Tenant::new("a").unwrap(),
            subject: Subject::new("b").unwrap(),
            memory: MemoryId::new("m").unwrap(),
            version: v.map(|v| Version::new(v).unwrap()),
        };
        assert_ne!(mem(None).hash(&k), mem(Some("1")).hash(&k));
        assert_ne!(
            Scope::Tenant {
                tenant: Tenant::new("a").unwrap()
            }
            .hash(&k),
            subject("a", "b").hash(&k)
        );
    }
}
