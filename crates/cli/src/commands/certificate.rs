//! `lethe certificate show` and `lethe certificate verify`.

use std::path::Path;

use anyhow::Context;
use lethe_core::certificate::Certificate;
use lethe_core::Scope;
use lethe_engine::Config;

use crate::args::{CertFormat, CertificateCommand};
use crate::exit::{bad, Exit};
use crate::open::open_engine;
use crate::output::{self, print_json};
use crate::scope_input::{parse_scope, read_scope_file, Origin, ScopeIds};

/// Shows a job's certificate, or checks a certificate file's signature (and its scope).
pub(crate) fn run(config: &Path, command: CertificateCommand) -> Result<i32, Exit> {
    match command {
        CertificateCommand::Show {
            job_id,
            format,
            first,
        } => {
            let engine = open_engine(config)?;
            let o = engine
                .outcome(&job_id)
                .map_err(|e| bad(format!("{e}; `lethe jobs` lists them")))?;
            let Some(cert) = o.certificate else {
                return Err(bad(format!(
                    "job {job_id} is {} and has no certificate yet",
                    o.state
                )));
            };
            // The final one, once the job's backups expired, unless the first is asked for.
            let cert = match first {
                true => cert,
                false => engine
                    .final_certificate(&job_id)
                    .map_err(|e| Exit(1, e.into()))?
                    .unwrap_or(cert),
            };
            match format {
                CertFormat::Json => print_json(&cert),
                CertFormat::Md => out!("{}", output::certificate_markdown(&cert)),
            }
            Ok(0)
        }
        CertificateCommand::Verify {
            file,
            public_key,
            tenant,
            subject,
            memory,
            version,
            scope_file,
        } => {
            let ids = match &scope_file {
                Some(f) => Some(read_scope_file(f)?),
                None => tenant.map(|tenant| ScopeIds {
                    tenant,
                    subject,
                    memory,
                    version,
                    origin: Origin::Flags,
                }),
            };
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))
                .map_err(|e| Exit(2, e))?;
            let doc: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| bad(format!("{} is not JSON: {e}", file.display())))?;
            lethe_core::certificate::refuse_duplicate_keys(&text).map_err(|e| Exit(1, e.into()))?;
            let key = match (&public_key, &ids) {
                (Some(_), Some(ids)) => {
                    return Err(bad(format!(
                        "{} needs the deployment key; drop --public-key",
                        match ids.origin {
                            Origin::Flags => "--tenant",
                            Origin::File => "--scope-file",
                        }
                    )))
                }
                (Some(pk), None) => output::parse_public_key(pk).map_err(bad)?,
                (None, _) => {
                    // Someone checking a certificate they were handed has no deployment: say
                    // how to check it without one.
                    let offline = if ids.is_none() {
                        "; without the deployment's config and key, pass --public-key \
                     ed25519:<hex>, the key the issuer publishes (a certificate's \
                     `signed_by` names the key that signed it, so trust only the published one)"
                    } else {
                        ""
                    };
                    let cfg = Config::load(config).map_err(|e| {
                        let Exit(code, message) = crate::exit::config(e);
                        Exit(code, anyhow::anyhow!("{message}{offline}"))
                    })?;
                    lethe_engine::keyfile::load(&cfg.key_file)
                        .map_err(|e| bad(format!("{e}{offline}")))?
                        .verifying_key()
                }
            };
            if doc["format"] == lethe_engine::REPORT_FORMAT {
                return verify_recovery_report(&doc, &key, ids.is_some());
            }
            let cert = Certificate::verify(&doc, &key).map_err(|e| Exit(1, e.into()))?;
            if let Some(ids) = ids {
                let scope = parse_scope(&ids)?;
                let cfg = Config::load(config).map_err(crate::exit::config)?;
                let dk = lethe_engine::keyfile::load(&cfg.key_file).map_err(bad)?;
                if !cert.is_for(&scope.hash(&dk.scope_key())) {
                    outln!("Signature valid, but the certificate is NOT for that scope.");
                    if matches!(scope, Scope::Memory { version: None, .. }) {
                        outln!(
                            "A memory certificate binds the version it erased: give {} \
                         (`lethe job show JOB` shows it as frozen_version).",
                            match ids.origin {
                                Origin::Flags => "--version",
                                Origin::File => "\"version\" in the --scope-file",
                            }
                        );
                    }
                    return Ok(1);
                }
                outln!(
                    "Signature valid; job {} is for that {} scope.",
                    cert.job_id,
                    scope.kind()
                );
            } else {
                outln!(
                    "Signature valid: job {}, {} scope {}, completed {}.",
                    cert.job_id,
                    cert.scope,
                    cert.scope_hash,
                    cert.completed_at
                );
            }
            Ok(0)
        }
    }
}

/// A recovery report (`lethe recovery`): its signature, and what it says in one line.
fn verify_recovery_report(
    doc: &serde_json::Value,
    key: &ed25519_dalek::VerifyingKey,
    scope_given: bool,
) -> Result<i32, Exit> {
    if scope_given {
        return Err(bad(
            "this is a recovery report, which covers every replayed scope by its hash: check \
             its signature without a scope, then look for the scope's hash in its `scopes`",
        ));
    }
    lethe_core::certificate::verify_document(doc, key).map_err(|e| Exit(1, e.into()))?;
    let s = |k: &str| doc[k].as_str().unwrap_or("-").to_string();
    outln!(
        "Signature valid: recovery {} of target {}, {} scope(s) replayed and verified, completed {}.",
        s("recovery_id"),
        s("target"),
        doc["scopes"].as_array().map_or(0, Vec::len),
        s("completed_at")
    );
    Ok(0)
}
