//! The certificate: built from the job's projection, signed, journaled, then written to its
//! file.

use lethe_journal::jobs::JobRecord;
use lethe_journal::Entry;

use crate::{Engine, EngineError};

impl Engine {
    /// Writes a COMPLETE job's certificate file from the journal if it is missing (the process
    /// died between the journal's commit and the file).
    /// Writes a COMPLETE job's certificate file if it is missing; whether it did.
    pub(super) fn certificate_file(&self, job: &JobRecord) -> Result<bool, EngineError> {
        let path = self.certificates.join(format!("{}.json", job.job_id));
        match &job.certificate {
            Some(signed) if !path.exists() => {
                self.write_certificate(&job.job_id, signed)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Writes `certificates/JOB.json` whole (a temporary file renamed over it).
    pub(super) fn write_certificate(
        &self,
        job_id: &str,
        signed: &impl serde::Serialize,
    ) -> Result<(), EngineError> {
        let path = self.certificates.join(format!("{job_id}.json"));
        let failed = |cause| EngineError::CertificateFile {
            path: path.display().to_string(),
            cause,
        };
        std::fs::create_dir_all(&self.certificates).map_err(failed)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_string_pretty(signed).unwrap_or_default() + "\n",
        )
        .map_err(failed)?;
        std::fs::rename(&tmp, &path).map_err(failed)?;
        Ok(())
    }

    pub(super) fn error_codes(&self, job: &str, target: &str) -> Result<Vec<String>, EngineError> {
        let mut codes: Vec<String> = self
            .journal
            .entries(job)?
            .into_iter()
            .filter_map(|e| match e {
                Entry::Blocked {
                    reason,
                    target: Some(t),
                    ..
                } if t == target => Some(reason.as_str().to_string()),
                _ => None,
            })
            .collect();
        // Each reason once, in the order first met (a job may block on it again later).
        let mut seen = std::collections::HashSet::new();
        codes.retain(|c| seen.insert(c.clone()));
        Ok(codes)
    }
}
