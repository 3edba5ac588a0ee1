//! The deployment key, and the keys derived from it.
//!
//! One 32-byte secret per deployment. Independent keys are derived from it with HMAC-SHA256
//! under fixed labels: the Ed25519 signing key for certificates (and the journal's seals), the
//! HMAC keys for scope hashes and locator digests, and the database guard's key ([`GuardKey`]),
//! under which the gate issues fencing tokens and the guard keys its digests. Reading and writing
//! the key file is the engine's job; this module only computes.

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

    /// The database guard's key: the gate's fencing tokens are MACs under it, and the guard
    /// checks them (and keys its digests) with it, in SQL.
    pub fn guard_key(&self) -> GuardKey {
        GuardKey(derive(&self.0, b"lethe/v1/guard"))
    }
}

/// The database guard's key. The gate issues, with each lease, a fencing token only a holder
/// of this key can make ([`GuardKey::token`]); `lethe guard install` gives the guard the key's
/// HMAC pads ([`GuardKey::pads`]), kept in a table only the guard's own functions read, so it
/// checks tokens with PostgreSQL's built-in `sha256` (no extension).
#[derive(Clone)]
pub struct GuardKey([u8; 32]);

impl GuardKey {
    /// The key's inner and outer HMAC-SHA256 pads (RFC 2104: the key zero-padded to SHA-256's
    /// 64-byte block, XOR 0x36 and XOR 0x5c): `HMAC(m) = sha256(opad || sha256(ipad || m))`.
    pub fn pads(&self) -> ([u8; 64], [u8; 64]) {
        let (mut ipad, mut opad) = ([0x36u8; 64], [0x5cu8; 64]);
        for (i, b) in self.0.iter().enumerate() {
            ipad[i] ^= b;
            opad[i] ^= b;
        }
        (ipad, opad)
    }

    fn mac(&self, parts: &[&[u8]]) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .expect("HMAC accepts keys of any length");
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                mac.update(b"\0");
            }
            mac.update(p);
        }
        hex::encode(mac.finalize().into_bytes())
    }

    /// The fencing token the gate issues with lease `lease` of `(tenant, subject)`, bound to
    /// its epochs: `<lease>.<subject MAC>.<tenant MAC>`, where the subject MAC is over
    /// `s, lease, epoch, tenant, subject` and the tenant MAC over `t, lease, tenant_epoch,
    /// tenant` (NUL-separated; identifiers hold no NUL). A runtime carries it as `lethe_token`
    /// beside `lethe_epoch` and `lethe_tenant_epoch`; the guard recomputes the part it needs
    /// for the owner it attributes the write to, so a token made up, raised to a later epoch,
    /// or taken from another subject's or tenant's lease is refused.
    pub fn token(
        &self,
        lease: i64,
        epoch: u64,
        tenant_epoch: u64,
        tenant: &str,
        subject: &str,
    ) -> String {
        let (lease_s, epoch_s, tenant_epoch_s) = (
            lease.to_string(),
            epoch.to_string(),
            tenant_epoch.to_string(),
        );
        let s = self.mac(&[
            b"s",
            lease_s.as_bytes(),
            epoch_s.as_bytes(),
            tenant.as_bytes(),
            subject.as_bytes(),
        ]);
        let t = self.mac(&[
            b"t",
            lease_s.as_bytes(),
            tenant_epoch_s.as_bytes(),
            tenant.as_bytes(),
        ]);
        format!("{lease}.{s}.{t}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    /// The guard's SQL computes `sha256(opad || sha256(ipad || m))` from the pads: the same MAC
    /// as the token's HMAC.
    #[test]
    fn the_pads_give_the_tokens_hmac() {
        let g = DeploymentKey::from_bytes([7; 32]).guard_key();
        let (ipad, opad) = g.pads();
        let msg = b"s\x001\x003\x00acme\x00alice";
        let inner = Sha256::digest([&ipad[..], msg].concat());
        let outer = hex::encode(Sha256::digest([&opad[..], &inner[..]].concat()));
        let token = g.token(1, 3, 0, "acme", "alice");
        assert_eq!(token.split('.').nth(1), Some(outer.as_str()));
        // Each part binds what it covers.
        assert_ne!(token, g.token(2, 3, 0, "acme", "alice"));
        assert_ne!(token, g.token(1, 4, 0, "acme", "alice"));
        assert_ne!(
            token.split('.').nth(1),
            g.token(1, 3, 0, "acme", "bob").split('.').nth(1)
        );
        assert_eq!(
            token.split('.').nth(2),
            g.token(1, 9, 0, "acme", "bob").split('.').nth(2),
            "the tenant part does not depend on the subject"
        );
    }

    #[test]
    fn derived_keys_differ_from_each_other_and_the_master() {
        let k = DeploymentKey::from_bytes([9; 32]);
        assert_ne!(k.scope_key().0, k.signing_key().to_bytes());
        assert_ne!(k.scope_key().0, [9; 32]);
        assert_ne!(k.scope_key().0, k.locator_key().0);
        assert_ne!(k.guard_key().0, k.locator_key().0);
        assert_ne!(k.guard_key().0, k.scope_key().0);
        // Deterministic: the same master gives the same keys.
        assert_eq!(
            k.verifying_key(),
            DeploymentKey::from_bytes([9; 32]).verifying_key()
        );
    }
}
