//! The deployment key file: 64 hex digits, created with mode 0600 on first use.

use std::io::Write;
use std::path::Path;

use lethe_core::keys::DeploymentKey;

/// Why the key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or creating it failed.
    #[error("key file {path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// Why (in the message, not a chained source: shown once).
        cause: std::io::Error,
    },
    /// The file is gone while the journal holds jobs made with a key.
    #[error(
        "key file {path} is missing, but this journal's jobs were signed and hashed with key \
         {recorded}: restore the file from your backup (a new key would leave every scope hash \
         unmatchable and every certificate unverifiable against the configuration)"
    )]
    Lost {
        /// The file.
        path: String,
        /// The public key the journal recorded, or a note that an older Lethe recorded none.
        recorded: String,
    },
    /// The file holds another key than the one the journal's jobs were made with.
    #[error(
        "key file {path} holds key {found}, but this journal's jobs were signed and hashed \
         with key {recorded}: point key_file at that key's file"
    )]
    Mismatch {
        /// The file.
        path: String,
        /// Its key's public id.
        found: String,
        /// The journal's.
        recorded: String,
    },
    /// It does not hold 64 hex digits.
    #[error("key file {0} does not hold a key (64 hex digits)")]
    Malformed(String),
    /// Others can read it.
    #[error("key file {0} is readable by other users: chmod 600 it")]
    TooOpen(String),
    /// The OS random source failed.
    #[error("cannot draw a random key: {0}")]
    Random(String),
}

/// Loads the key, or creates it (0600) if the file does not exist.
pub fn load_or_create(path: &Path) -> Result<DeploymentKey, KeyError> {
    let shown = path.display().to_string();
    let io = |cause| KeyError::Io {
        path: shown.clone(),
        cause,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(KeyError::TooOpen(shown));
                }
            }
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(text.trim(), &mut bytes)
                .map_err(|_| KeyError::Malformed(shown.clone()))?;
            Ok(DeploymentKey::from_bytes(bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            getrandom::getrandom(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(io)?;
            }
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(path).map_err(io)?;
            f.write_all(format!("{}\n", hex::encode(bytes)).as_bytes())
                .map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(DeploymentKey::from_bytes(bytes))
        }
        Err(e) => Err(io(e)),
    }
}

/// Loads an existing key; never creates one.
pub fn load(path: &Path) -> Result<DeploymentKey, KeyError> {
    if !path.exists() {
        return Err(KeyError::Io {
            path: path.display().to_string(),
            cause: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    load_or_create(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_0600_and_reloads_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        let k1 = load_or_create(&p).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        assert_eq!(load_or_create(&p).unwrap().to_bytes(), k1.to_bytes());
        std::fs::write(&p, "nope").unwrap();
        assert!(matches!(load(&p), Err(KeyError::Malformed(_))));
    }
}
