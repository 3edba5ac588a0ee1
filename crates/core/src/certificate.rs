//! The signed completion proof.
//!
//! A certificate says which job erased what kind of scope (by keyed hash), under which basis and
//! policy, when, and for each target its status and count. It never holds an identifier, a key
//! or any content. It is JSON, signed with Ed25519 over its canonical form (keys sorted, no
//! spaces, the `signature` field left out), so anyone with the public key verifies it offline.

use std::collections::BTreeMap;

use ed25519_dalek::{Signature, Signer, VerifyingKey};
use serde_json::Value;
use time::Date;

use crate::basis::Basis;
use crate::keys::DeploymentKey;
use crate::scope::{ScopeHash, ScopeKind};

/// The format tag every certificate carries.
pub const FORMAT: &str = "lethe-certificate/1";

/// A target's outcome, as the certificate shows it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TargetStatus {
    /// Erased and verified zero.
    Done,
    /// A backup that ages out on `expires`.
    PendingExpiry,
    /// Made unreadable by destroying its key.
    Shredded,
    /// Not erased, for the recorded `reason`.
    Exempt,
}

/// One target's line on the certificate.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetRecord {
    /// The outcome.
    pub status: TargetStatus,
    /// Rows (or keys, documents) erased: the frozen inventory, all verified gone.
    pub count: u64,
    /// The target's asset class (`primary`, `vector-index`, ...).
    pub class: String,
    /// The adapter kind that erased it.
    pub adapter: String,
    /// The adapter's version.
    pub adapter_version: String,
    /// Error codes met on the way (retried errors included), for the audit.
    pub error_codes: Vec<String>,
    /// Why an `EXEMPT` target was not erased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When a `PENDING_EXPIRY` target's last copy expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<Date>,
    /// For a backup target: how many of its artifacts were taken before completion and may
    /// hold the scope's data (each kept until its retention ends; `expires` is the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<u64>,
    /// For a derived store (a node cache): what was done with entries no lineage ties to any
    /// subject, which the target's `legacy` setting allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy: Option<LegacyRecord>,
    /// What the store's own files (the target's `path`) still held of the erased data when the
    /// certificate was issued: present only for a target whose kind has such a check and which
    /// is given its files. The logical outcome (`status`) does not wait for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical: Option<PhysicalRecord>,
}

/// A physical check's outcome.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PhysicalStatus {
    /// The files hold nothing of what was erased.
    Clean,
    /// The files still hold some of it, until the store's `remedy` runs.
    Pending,
    /// The check could not run (its files unreadable, not the store's): `reason` says why.
    Unchecked,
}

/// What a target's own files still held of the erased data, counts and words only.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhysicalRecord {
    /// `CLEAN`, `PENDING` or `UNCHECKED`.
    pub status: PhysicalStatus,
    /// How much the files still hold, as the adapter kind counts it (0: `CLEAN`); absent when
    /// `UNCHECKED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residue: Option<u64>,
    /// For `PENDING`: what the store offers against it, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
    /// For `UNCHECKED`: why the check did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the files were read (RFC 3339, UTC).
    pub checked_at: String,
}

impl PhysicalRecord {
    /// A check that ran and found `residue`: `CLEAN` at 0, else `PENDING` with the remedy.
    pub fn found(residue: u64, remedy: &str, checked_at: String) -> Self {
        Self {
            status: if residue == 0 {
                PhysicalStatus::Clean
            } else {
                PhysicalStatus::Pending
            },
            residue: Some(residue),
            remedy: (residue > 0).then(|| remedy.to_string()),
            reason: None,
            checked_at,
        }
    }

    /// A check that could not run, and why (a message that names no identifier).
    pub fn unchecked(reason: String, checked_at: String) -> Self {
        Self {
            status: PhysicalStatus::Unchecked,
            residue: None,
            remedy: None,
            reason: Some(reason),
            checked_at,
        }
    }
}

/// A declared store no target erases.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptAsset {
    /// What it holds (a target class).
    pub class: String,
    /// Why it is not erased.
    pub reason: String,
}

/// Entries of a derived store that no lineage ties to a subject, and what became of them.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyRecord {
    /// `flush`: erased with the scope (a cache is recomputable), counted in `count`;
    /// `expire`: left to their TTL, the target `PENDING_EXPIRY` until `expires`.
    pub policy: String,
    /// How many such entries there were at the inventory.
    pub count: u64,
}

/// The certificate's content, before it is signed.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// Always [`FORMAT`].
    pub format: String,
    /// The job that did the work.
    pub job_id: String,
    /// What kind of scope was erased.
    pub scope: ScopeKind,
    /// The keyed hash of the canonical scope.
    pub scope_hash: String,
    /// The subject's epoch after the freeze (subject and memory scopes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_epoch: Option<u64>,
    /// The tenant's epoch after the freeze (tenant scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_epoch: Option<u64>,
    /// The legal basis.
    pub basis: Basis,
    /// The deployment's erasure policy version in force.
    pub policy_version: String,
    /// When the request was received (RFC 3339, UTC).
    pub requested_at: String,
    /// When the job completed (RFC 3339, UTC).
    pub completed_at: String,
    /// The statutory or contractual deadline.
    pub deadline: Date,
    /// Each target's outcome, by target name.
    pub targets: BTreeMap<String, TargetRecord>,
    /// When the last backup copy expires, if any target is pending expiry.
    #[serde(default)]
    pub backup_expiry: Option<Date>,
    /// On a job's final certificate only: when `lethe backups check` found every backup
    /// artifact the job waited for gone (RFC 3339, UTC). Its backup targets then say `DONE`; the
    /// first certificate, with their `PENDING_EXPIRY`, is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_expiry_met: Option<String>,
    /// Crypto-shredding: how many of the scope's data keys the job destroyed (a subject's one;
    /// one per subject of a tenant). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_destroyed: Option<u64>,
    /// Stores the deployment declared but no target erases, by name, with the reason: what
    /// this certificate does not cover.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exempt_assets: BTreeMap<String, ExemptAsset>,
    /// `ed25519:<hex>`: the public key that signed it.
    pub signed_by: String,
}

/// Why a certificate does not verify.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// Not JSON, or not a certificate's shape.
    #[error("not a Lethe certificate: {0}")]
    Malformed(String),
    /// Signed by another key than the one trusted.
    #[error("signed by {found}, not by the trusted key {trusted}")]
    WrongKey {
        /// The key named in the certificate.
        found: String,
        /// The key trusted.
        trusted: String,
    },
    /// The signature does not match the content: it was altered after signing.
    #[error("the signature does not match the content: the certificate was altered")]
    BadSignature,
}

/// Serializes with object keys sorted and no whitespace: the bytes that are signed. For every
/// document Lethe signs (integers only; keys and strings sorted the same by UTF-8 bytes as by
/// UTF-16 units) this is RFC 8785, the JSON Canonicalization Scheme, which a third-party
/// verifier should follow; `canonical_json_is_rfc_8785_for_certificates` pins it against an
/// implementation of the RFC. Kept as these few lines, not a dependency, for that reason.
pub fn canonical_json(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<_> = m.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

/// A public key's name as certificates write it: `ed25519:<64 hex>`.
pub fn key_name(k: &VerifyingKey) -> String {
    format!("ed25519:{}", hex::encode(k.as_bytes()))
}

/// The keys a certificate has (its own and its target lines'), the only ones a message about
/// its shape may name.
const CERTIFICATE_KEYS: [&str; 33] = [
    "format",
    "job_id",
    "scope",
    "scope_hash",
    "subject_epoch",
    "tenant_epoch",
    "basis",
    "policy_version",
    "requested_at",
    "completed_at",
    "deadline",
    "targets",
    "backup_expiry",
    "signed_by",
    "signature",
    "status",
    "count",
    "class",
    "adapter",
    "adapter_version",
    "error_codes",
    "reason",
    "expires",
    "legacy",
    "policy",
    "exempt_assets",
    "physical",
    "residue",
    "remedy",
    "checked_at",
    "artifacts",
    "backup_expiry_met",
    "keys_destroyed",
];

/// Refuses a document in which an object names a key twice. A JSON parser keeps one of the
/// two values (serde_json the last), so the text a person reads could differ from what was
/// signed and verified.
pub fn refuse_duplicate_keys(text: &str) -> Result<(), CertificateError> {
    use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

    struct Unique;
    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(Unique)
        }
    }
    impl<'de> Visitor<'de> for Unique {
        type Value = Unique;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Unique, A::Error> {
            while a.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Unique, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = a.next_key::<String>()? {
                if !seen.insert(k.clone()) {
                    // Named only if it is a certificate's own key: a tampered file's key
                    // could be anything, an identifier included.
                    return Err(A::Error::custom(
                        if CERTIFICATE_KEYS.contains(&k.as_str()) {
                            format!("the key `{k}` appears twice")
                        } else {
                            "a key appears twice (not shown: it is not a certificate's)".into()
                        },
                    ));
                }
                a.next_value::<Unique>()?;
            }
            Ok(Unique)
        }
    }
    let mut d = serde_json::Deserializer::from_str(text);
    Unique::deserialize(&mut d)
        .and_then(|_| d.end())
        .map_err(|e| CertificateError::Malformed(crate::redact_quoted(&e.to_string())))
}

/// Signs a document Lethe issues (a certificate, a recovery report): sets its `signed_by` and
/// adds `signature`, Ed25519 over its canonical JSON without that field.
pub fn sign_document(mut doc: Value, key: &DeploymentKey) -> Value {
    let signing = key.signing_key();
    doc["signed_by"] = Value::String(key_name(&signing.verifying_key()));
    let sig = signing.sign(canonical_json(&doc).as_bytes());
    doc["signature"] = Value::String(format!("ed25519:{}", hex::encode(sig.to_bytes())));
    doc
}

/// Checks a signed document's `signed_by` and `signature` against the trusted public key;
/// returns the document without its signature. Its shape is the caller's to check.
pub fn verify_document(doc: &Value, trusted: &VerifyingKey) -> Result<Value, CertificateError> {
    let mut unsigned = doc.clone();
    let sig = unsigned
        .as_object_mut()
        .and_then(|m| m.remove("signature"))
        .and_then(|s| s.as_str().map(str::to_owned))
        .ok_or_else(|| CertificateError::Malformed("no signature field".into()))?;
    // The messages below quote nothing from the document but a well-formed key name: a
    // tampered or foreign file's values could be anything, identifiers included (review).
    let signed_by = unsigned["signed_by"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let trusted_name = key_name(trusted);
    if signed_by != trusted_name {
        let well_formed = signed_by.strip_prefix("ed25519:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        return Err(CertificateError::WrongKey {
            found: if well_formed {
                signed_by
            } else {
                "a key name that is not ed25519:<64 hex> (not shown)".into()
            },
            trusted: trusted_name,
        });
    }
    let mut bytes = [0u8; 64];
    sig.strip_prefix("ed25519:")
        .and_then(|h| hex::decode_to_slice(h, &mut bytes).ok())
        .ok_or_else(|| CertificateError::Malformed("signature is not ed25519:<128 hex>".into()))?;
    if trusted.is_weak() {
        // A small-order key: some signature verifies for any content under it.
        return Err(CertificateError::Malformed(
            "the trusted key is a weak (small-order) Ed25519 key".into(),
        ));
    }
    // Strict: no small-order R, no non-canonical S (RFC 8032 as written, not a variant).
    trusted
        .verify_strict(
            canonical_json(&unsigned).as_bytes(),
            &Signature::from_bytes(&bytes),
        )
        .map_err(|_| CertificateError::BadSignature)?;
    Ok(unsigned)
}

impl Certificate {
    /// Signs the certificate; returns the signed JSON document.
    pub fn sign(self, key: &DeploymentKey) -> Value {
        sign_document(
            serde_json::to_value(&self).expect("a certificate always serializes"),
            key,
        )
    }

    /// Checks a signed document against the trusted public key and returns its content.
    pub fn verify(doc: &Value, trusted: &VerifyingKey) -> Result<Certificate, CertificateError> {
        let mut unsigned = doc.clone();
        unsigned
            .as_object_mut()
            .and_then(|m| m.remove("signature"))
            .ok_or_else(|| CertificateError::Malformed("no signature field".into()))?;
        let cert: Certificate = serde_json::from_value(unsigned)
            .map_err(|e| CertificateError::Malformed(crate::redact_quoted(&e.to_string())))?;
        if cert.format != FORMAT {
            return Err(CertificateError::Malformed(format!(
                "its format is not {FORMAT} (not shown)"
            )));
        }
        verify_document(doc, trusted)?;
        Ok(cert)
    }

    /// Whether the certificate is for this scope hash.
    pub fn is_for(&self, hash: &ScopeHash) -> bool {
        self.scope_hash == hash.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    fn sample() -> Certificate {
        let mut targets = BTreeMap::new();
        targets.insert(
            "memories".to_string(),
            TargetRecord {
                status: TargetStatus::Done,
                count: 14,
                class: "primary".into(),
                adapter: "langgraph-sqlite-store".into(),
                adapter_version: "1".into(),
                error_codes: vec![],
                reason: None,
                expires: None,
                artifacts: None,
                legacy: None,
                physical: None,
            },
        );
        Certificate {
            format: FORMAT.into(),
            job_id: "del-1".into(),
            scope: ScopeKind::Subject,
            scope_hash: format!("hmac:{}", "ab".repeat(32)),
            subject_epoch: Some(12),
            tenant_epoch: None,
            basis: Basis::GdprArt17,
            policy_version: "2026-12".into(),
            requested_at: "2026-12-02T10:00:00Z".into(),
            completed_at: "2026-12-02T10:00:05Z".into(),
            deadline: date!(2027 - 01 - 02),
            targets,
            backup_expiry: None,
            backup_expiry_met: None,
            keys_destroyed: None,
            exempt_assets: BTreeMap::new(),
            signed_by: String::new(),
        }
    }

    /// The signed bytes are RFC 8785's (JCS), checked against an implementation of the RFC
    /// on a certificate with targets whose names need escaping or sort beyond ASCII.
    #[test]
    fn canonical_json_is_rfc_8785_for_certificates() {
        let mut c = sample();
        for name in [
            "zoë-store",
            "Zeta",
            "a\"quoted\\name",
            "用户-cache",
            "tab\there",
        ] {
            let mut t = c.targets["memories"].clone();
            t.count = 7;
            t.error_codes = vec!["target_unavailable".into()];
            t.reason = Some("exempt: ümlaut".into());
            c.targets.insert(name.into(), t);
        }
        let doc = c.sign(&DeploymentKey::from_bytes([5; 32]));
        let mut unsigned = doc.clone();
        unsigned.as_object_mut().unwrap().remove("signature");
        for v in [&doc, &unsigned] {
            assert_eq!(canonical_json(v), serde_jcs::to_string(v).unwrap());
        }
    }

    #[test]
    fn signed_certificate_verifies_and_any_edit_breaks_it() {
        let key = DeploymentKey::from_bytes([3; 32]);
        let doc = sample().sign(&key);
        assert_eq!(
            Certificate::verify(&doc, &key.verifying_key())
                .unwrap()
                .job_id,
            "del-1"
        );

        let mut edited = doc.clone();
        edited["targets"]["memories"]["count"] = 13.into();
        assert!(matches!(
            Certificate::verify(&edited, &key.verifying_key()),
            Err(CertificateError::BadSignature)
        ));

        // Reordering keys or reformatting does not matter: the canonical form is signed.
        let reparsed: Value =
            serde_json::from_str(&serde_json::to_string_pretty(&doc).unwrap()).unwrap();
        assert!(Certificate::verify(&reparsed, &key.verifying_key()).is_ok());
    }

    #[test]
    fn refuses_another_key() {
        let doc = sample().sign(&DeploymentKey::from_bytes([3; 32]));
        let other = DeploymentKey::from_bytes([4; 32]).verifying_key();
        assert!(matches!(
            Certificate::verify(&doc, &other),
            Err(CertificateError::WrongKey { .. })
        ));
    }

    /// A tampered or foreign document is refused without quoting its values or keys: any of
    /// them could hold an identifier (review: serde's text and the format were echoed).
    #[test]
    fn a_malformed_document_is_refused_without_quoting_it() {
        let key = DeploymentKey::from_bytes([3; 32]);
        let doc = sample().sign(&key);
        let trusted = key.verifying_key();
        let edits: [(&str, Value); 4] = [
            ("count", Value::String("SECRETQX".into())),
            ("format", Value::String("SECRETQX".into())),
            ("signed_by", Value::String("SECRETQX".into())),
            ("job_id", serde_json::json!({"SECRETQX": 1})),
        ];
        for (field, value) in edits {
            let mut d = doc.clone();
            if field == "count" {
                d["targets"]["memories"]["count"] = value;
            } else {
                d[field] = value;
            }
            let e = Certificate::verify(&d, &trusted).unwrap_err().to_string();
            assert!(!e.contains("SECRETQX"), "{field}: {e}");
        }
        let e = refuse_duplicate_keys(r#"{"a": 1, "SECRET-QX": 1, "SECRET-QX": 2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("appears twice") && !e.contains("SECRET"), "{e}");
        let e = refuse_duplicate_keys(r#"{"scope_hash": 1, "scope_hash": 2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`scope_hash` appears twice"), "{e}");
        // A key a certificate does not have is not named, however field-like: it is a name.
        let e = refuse_duplicate_keys(r#"{"alice": 1, "alice": 2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("appears twice") && !e.contains("alice"), "{e}");
        // A well-formed foreign key is still named: it is what a checker compares.
        let other = DeploymentKey::from_bytes([4; 32]).verifying_key();
        let e = Certificate::verify(&doc, &other).unwrap_err().to_string();
        assert!(e.contains(&key_name(&trusted)), "{e}");
    }

    /// A target line without a physical check has the keys it always had (old certificates stay
    /// byte-identical); one with it carries `physical`, signed and verified like the rest.
    #[test]
    fn the_physical_line_is_optional_and_signed() {
        let key = DeploymentKey::from_bytes([3; 32]);
        let doc = sample().sign(&key);
        let mut keys: Vec<_> = doc["targets"]["memories"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "adapter",
                "adapter_version",
                "class",
                "count",
                "error_codes",
                "status"
            ]
        );
        let mut c = sample();
        let at = "2026-12-02T10:00:05Z".to_string();
        c.targets.get_mut("memories").unwrap().physical = Some(PhysicalRecord::found(
            6,
            "run the store's remedy",
            at.clone(),
        ));
        let mut clean = c.targets["memories"].clone();
        clean.physical = Some(PhysicalRecord::found(0, "unused", at.clone()));
        c.targets.insert("clean".into(), clean);
        let mut unchecked = c.targets["memories"].clone();
        unchecked.physical = Some(PhysicalRecord::unchecked("unreadable".into(), at));
        c.targets.insert("unchecked".into(), unchecked);
        let doc = c.clone().sign(&key);
        assert_eq!(
            doc["targets"]["memories"]["physical"],
            serde_json::json!({"status": "PENDING", "residue": 6, "remedy": "run the store's remedy", "checked_at": "2026-12-02T10:00:05Z"})
        );
        assert_eq!(
            doc["targets"]["clean"]["physical"],
            serde_json::json!({"status": "CLEAN", "residue": 0, "checked_at": "2026-12-02T10:00:05Z"})
        );
        assert_eq!(
            doc["targets"]["unchecked"]["physical"],
            serde_json::json!({"status": "UNCHECKED", "reason": "unreadable", "checked_at": "2026-12-02T10:00:05Z"})
        );
        let back = Certificate::verify(&doc, &key.verifying_key()).unwrap();
        assert_eq!(back.targets, c.targets);
        let mut edited = doc.clone();
        edited["targets"]["memories"]["physical"]["status"] = "CLEAN".into();
        assert!(matches!(
            Certificate::verify(&edited, &key.verifying_key()),
            Err(CertificateError::BadSignature)
        ));
        let e = refuse_duplicate_keys(r#"{"residue": 1, "residue": 2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`residue` appears twice"), "{e}");
    }

    #[test]
    fn canonical_json_sorts_nested_keys() {
        let v: Value = serde_json::from_str(r#"{"b":{"d":1,"c":2},"a":[{"z":1,"y":2}]}"#).unwrap();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":[{"y":2,"z":1}],"b":{"c":2,"d":1}}"#
        );
    }
}
