//! Crypto-shredding: per-subject data keys (AES-256-GCM), each wrapped by a key-encryption
//! key (KEK) that Lethe holds, stored wrapped in the control store. A runtime fetches its
//! subject's key through the gate under a live lease and encrypts what it writes with it;
//! erasing the subject destroys the wrapped key in a journaled step, and every copy written
//! under it, backups included, becomes unreadable.
//!
//! The KEK is behind [`Kek`]: a file (64 hex digits, 0600, made on first use) here; an external
//! KMS is another implementation of the same two calls.

use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use lethe_core::{Subject, Tenant};
use lethe_journal::keys::KeyRefusal;

use crate::{input, random_hex, Engine, EngineError};

/// A key-encryption key: wraps and unwraps 32-byte data keys, binding each to `aad`.
pub trait Kek: Send + Sync {
    /// Wraps `key`; the result names nothing and is safe to store.
    fn wrap(&self, key: &[u8; 32], aad: &[u8]) -> Result<Vec<u8>, String>;
    /// Unwraps what [`Kek::wrap`] made with the same `aad`.
    fn unwrap(&self, wrapped: &[u8], aad: &[u8]) -> Result<[u8; 32], String>;
    /// Where the KEK lives, for `lethe keys inventory`.
    fn location(&self) -> String;
}

/// A KEK in a file: 64 hex digits, readable by its owner only.
pub struct FileKek {
    path: PathBuf,
    cipher: Aes256Gcm,
}

impl FileKek {
    /// Loads the file, or creates it (0600) if it does not exist. One readable by others is
    /// refused.
    pub fn load_or_create(path: &Path) -> Result<Self, EngineError> {
        let key = crate::keyfile::load_or_create(path).map_err(|e| {
            input(
                e.to_string()
                    .replace("key file", "key-encryption key file (keys.kek_file)"),
            )
        })?;
        let cipher = Aes256Gcm::new_from_slice(&key.to_bytes())
            .map_err(|_| input("keys.kek_file: not a 256-bit key"))?;
        Ok(Self {
            path: path.to_path_buf(),
            cipher,
        })
    }
}

impl Kek for FileKek {
    fn wrap(&self, key: &[u8; 32], aad: &[u8]) -> Result<Vec<u8>, String> {
        let mut nonce = [0u8; 12];
        getrandom::getrandom(&mut nonce).map_err(|e| format!("no OS randomness: {e}"))?;
        let mut out = nonce.to_vec();
        out.extend(
            self.cipher
                .encrypt(Nonce::from_slice(&nonce), Payload { msg: key, aad })
                .map_err(|_| "wrapping failed".to_string())?,
        );
        Ok(out)
    }

    fn unwrap(&self, wrapped: &[u8], aad: &[u8]) -> Result<[u8; 32], String> {
        let (nonce, sealed) = wrapped
            .split_at_checked(12)
            .ok_or("a wrapped key is too short")?;
        let key = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad })
            .map_err(|_| {
                "a wrapped key does not open under this key-encryption key (another KEK, or \
                 an edited row)"
                    .to_string()
            })?;
        key.try_into()
            .map_err(|_| "a wrapped key is not 32 bytes".into())
    }

    fn location(&self) -> String {
        format!("file {}", self.path.display())
    }
}

/// What a wrapped key is bound to: its owner, so a row moved to another subject does not open.
fn aad(tenant: &Tenant, subject: &Subject) -> Vec<u8> {
    let mut a = b"lethe-data-key/1".to_vec();
    for part in [tenant.as_str(), subject.as_str()] {
        a.extend((part.len() as u64).to_be_bytes());
        a.extend(part.as_bytes());
    }
    a
}

/// A subject's data key, for the lease that fetched it.
pub struct DataKey {
    /// Its id, which ciphertexts name (`dk-` and hex).
    pub key_id: String,
    /// The AES-256 key.
    pub key: [u8; 32],
    /// When the lease expires (Unix milliseconds): no cache may keep the key longer.
    pub expires_ms: i64,
}

impl DataKey {
    /// The key as 64 hex digits, as the gate's API gives it.
    pub fn key_hex(&self) -> String {
        hex::encode(self.key)
    }
}

/// Never the key.
impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Why a data key is not given.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// No `[keys]` in the configuration: crypto-shredding is off.
    #[error("crypto-shredding is off: this deployment has no [keys] kek_file")]
    Off,
    /// The gate refused the lease.
    #[error(transparent)]
    Gate(lethe_core::gate::GateError),
    /// The lease's subject has no key with this id: an erasure destroyed it (what was written
    /// under it is erased), or it is another subject's.
    #[error("key destroyed: the lease's subject has no such key (an erasure destroyed it, so what was written under it is erased; or it is another subject's key)")]
    Destroyed,
    /// The control store or the KEK failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl Engine {
    /// The data key of `lease_id`'s subject (`key_id`: that one; `None`: the current one, made
    /// if the subject has none), for a lease that may work on the subject now.
    pub fn data_key(&self, lease_id: i64, key_id: Option<&str>) -> Result<DataKey, KeyError> {
        let kek = self.kek.as_deref().ok_or(KeyError::Off)?;
        let got = self
            .journal
            .data_key(self.clock.now(), lease_id, key_id, |t, s| {
                let mut key = [0u8; 32];
                getrandom::getrandom(&mut key).map_err(|e| format!("no OS randomness: {e}"))?;
                let wrapped = kek.wrap(&key, &aad(t, s))?;
                let id = random_hex(12).map_err(|e| e.to_string())?;
                Ok((format!("dk-{id}"), hex::encode(wrapped)))
            })
            .map_err(EngineError::from)?;
        let w = match got {
            Ok(w) => w,
            Err(KeyRefusal::Gate(g)) => return Err(KeyError::Gate(g)),
            Err(KeyRefusal::Destroyed) => return Err(KeyError::Destroyed),
        };
        let bytes = hex::decode(&w.wrapped).map_err(|_| {
            EngineError::from(lethe_journal::JournalError::Corrupt("wrapped key".into()))
        })?;
        let key = kek
            .unwrap(&bytes, &aad(&w.tenant, &w.subject))
            .map_err(EngineError::Input)?;
        Ok(DataKey {
            key_id: w.key_id,
            key,
            expires_ms: w.expires_ms,
        })
    }

    /// Whether crypto-shredding is on, and where its key material lives, for `lethe keys
    /// inventory`.
    pub fn key_inventory(&self) -> Result<serde_json::Value, EngineError> {
        let Some(kek) = self.kek.as_deref() else {
            return Ok(serde_json::json!({ "enabled": false }));
        };
        let backups: Vec<_> = self
            .targets
            .iter()
            .filter(|t| !t.adapter.covers().is_empty())
            .map(|t| t.name.clone())
            .collect();
        Ok(serde_json::json!({
            "enabled": true,
            "kek": kek.location(),
            "key_store": {
                "where": "the control store (control.journal), table subject_keys, wrapped by the KEK",
                "keys": self.journal.data_key_count()?,
            },
            "encrypted_targets": self.encrypted,
            "runtime_caches": "each runtime's cache of a fetched key lives no longer than the lease that fetched it (the key's expires_ms)",
            "backups": {
                "of_the_key_store": "every backup of the control store holds the wrapped keys of its time: it is a backup too, and its retention bounds when a destroyed key is gone from it; a key is useless without the KEK",
                "backup_targets": backups,
            },
        }))
    }
}
