//! The deployment key, and the keys derived from it.
//!
//! One 32-byte secret per deployment. Two independent keys are derived from it with
//! HMAC-SHA256 under fixed labels: the Ed25519 signing key for certificates and the HMAC key
//! for scope hashes. Reading and writing the key file is the engine's job; this module only
//! computes.

use ed25519_dalek::{SigningKey, VerifyingKey};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The deployment's secret. Never logged, never on a certificate.
#[derive(Clone)]
pub struct DeploymentKey([u8; 32]);

/// The key scope hashes are computed under.
#[derive(Clone)]
pub struct ScopeKey([u8; 32]);

impl ScopeKey {
    /// The raw key bytes, for the HMAC.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn derive(master: &[u8; 32], label: &[u8]) -> [u8; 32] {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(master).expect("HMAC accepts keys of any length");
    mac.update(label);
    mac.finalize().into_bytes().into()
}

impl DeploymentKey {
    /// Wraps 32 secret bytes (from the key file, or fresh from the OS).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw secret, for writing the key file.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0
    }

    /// The Ed25519 key certificates are signed with.
    pub fn signing_key(&self) -> SigningKey {
        SigningKey::from_bytes(&derive(&self.0, b"lethe/v1/certificate-signing"))
    }

    /// The public half, for verifying certificates offline.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing_key().verifying_key()
    }

    /// The key scope hashes are computed under.
    pub fn scope_key(&self) -> ScopeKey {
        ScopeKey(derive(&self.0, b"lethe/v1/scope-hash"))
    }

    /// The key inventory locators are hashed under before they are journaled.
    pub fn locator_key(&self) -> ScopeKey {
        ScopeKey(derive(&self.0, b"lethe/v1/locator-digest"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_differ_from_each_other_and_the_master() {
        let k = DeploymentKey::from_bytes([9; 32]);
        assert_ne!(k.scope_key().0, k.signing_key().to_bytes());
        assert_ne!(k.scope_key().0, [9; 32]);
        assert_ne!(k.scope_key().0, k.locator_key().0);
        // Deterministic: the same master gives the same keys.
        assert_eq!(
            k.verifying_key(),
            DeploymentKey::from_bytes([9; 32]).verifying_key()
        );
    }
}
