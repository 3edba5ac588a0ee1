//! A command's failure and its exit code: the codes are decided here and by
//! `EngineError::exit_code`, nowhere else.

use lethe_engine::EngineError;

/// A failure with its exit code.
pub struct Exit(pub i32, pub anyhow::Error);

impl From<EngineError> for Exit {
    fn from(e: EngineError) -> Self {
        Exit(e.exit_code(), e.into())
    }
}

/// Bad input or config: exit 2, nothing touched.
pub(crate) fn bad(msg: impl std::fmt::Display) -> Exit {
    Exit(2, anyhow::anyhow!("{msg}"))
}
