//! A COMPLETE job's final certificate: issued once every backup artifact its first
//! certificate waited for is gone, journaled as `backups_expired`, kept beside the first.

use sha2::{Digest, Sha256};

use crate::chain::{append, db};
use crate::db::Tx;
use crate::jobs::load_job;
use crate::{Entry, Journal, JournalError, Result};

impl Journal {
    /// Records a COMPLETE job's final certificate and journals `backups_expired`, in one
    /// transaction. Idempotent: a job that has one keeps it, and `false` is returned.
    pub fn settle_backups(
        &self,
        at: &str,
        job_id: &str,
        certificate: &serde_json::Value,
    ) -> Result<bool> {
        self.write_entry(|tx| {
            // The job must exist; the engine settles only a COMPLETE one, and `journal
            // verify` reports a `backups_expired` of any other.
            load_job(tx, job_id)?;
            if has_final(tx, job_id)? {
                return Ok(false);
            }
            let canonical = lethe_core::certificate::canonical_json(certificate);
            let digest = hex::encode(Sha256::digest(canonical.as_bytes()));
            tx.exec(
                "INSERT INTO final_certificates (job_id, certificate, issued_at) VALUES ($1, $2, $3)",
                &[job_id.into(), certificate.to_string().into(), at.into()],
            )
            .map_err(db)?;
            append(
                tx,
                at,
                Some(job_id),
                &Entry::BackupsExpired {
                    certificate_sha256: digest,
                },
            )?;
            Ok(true)
        })
    }

    /// The jobs whose backups settled (a final certificate was issued).
    pub fn settled_jobs(&self) -> Result<std::collections::HashSet<String>> {
        self.read(|tx| {
            Ok(tx
                .rows("SELECT job_id FROM final_certificates", &[])
                .map_err(db)?
                .iter()
                .map(|r| r[0].text())
                .collect())
        })
    }

    /// A job's final certificate, if its backups settled.
    pub fn final_certificate(&self, job_id: &str) -> Result<Option<serde_json::Value>> {
        self.read(|tx| {
            let Some(r) = tx
                .row(
                    "SELECT certificate FROM final_certificates WHERE job_id = $1",
                    &[job_id.into()],
                )
                .map_err(db)?
            else {
                return Ok(None);
            };
            serde_json::from_str(&r[0].text())
                .map(Some)
                .map_err(|_| JournalError::Corrupt("final certificate".into()))
        })
    }
}

fn has_final(tx: &mut dyn Tx, job_id: &str) -> Result<bool> {
    Ok(tx
        .row(
            "SELECT 1 FROM final_certificates WHERE job_id = $1",
            &[job_id.into()],
        )
        .map_err(db)?
        .is_some())
}
