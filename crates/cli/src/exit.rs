//! A command's failure, its exit code and its words: the codes are decided here and nowhere
//! else, and so is how the engine's errors read on a command line (its fields as flags, the
//! command that goes on).

use lethe_engine::config::ConfigError;
use lethe_engine::EngineError;
use lethe_journal::JournalError;

/// A failure with its exit code.
pub struct Exit(pub i32, pub anyhow::Error);

impl From<EngineError> for Exit {
    fn from(e: EngineError) -> Self {
        Exit(code(&e), anyhow::anyhow!("{}", words(&e)))
    }
}

/// Bad input or config: exit 2, nothing touched.
pub(crate) fn bad(msg: impl std::fmt::Display) -> Exit {
    Exit(2, anyhow::anyhow!("{msg}"))
}

/// A config that does not load: exit 2, with what to do when there is none.
pub(crate) fn config(e: ConfigError) -> Exit {
    match e {
        ConfigError::Read { .. } => bad(format!(
            "{e}; create one (see `lethe demo` for an example) or pass --config"
        )),
        e => bad(e),
    }
}

/// The process exit code for an engine error (the README's table).
fn code(e: &EngineError) -> i32 {
    match e {
        EngineError::Input(_)
        | EngineError::Key(_)
        | EngineError::Journal(JournalError::BadUrl(_))
        | EngineError::Journal(JournalError::UnsupportedUrl(_))
        | EngineError::Journal(JournalError::NoSuchJob(_))
        | EngineError::Request(_) => 2,
        EngineError::Held { .. } => 4,
        EngineError::Claimed(_)
        | EngineError::Journal(JournalError::GateAuthority)
        | EngineError::Journal(JournalError::GateAuthorityTaken) => 3,
        EngineError::Journal(JournalError::Io { .. })
        | EngineError::CertificateFile { .. }
        | EngineError::Io(_) => 5,
        _ => 1,
    }
}

/// An engine error as a command line says it: the engine's sentence, its fields as the flags
/// that set them, and the command that goes on.
fn words(e: &EngineError) -> String {
    let said = match e {
        EngineError::Held { job_id, .. } => {
            format!("{e} (then `lethe resume {job_id}` or `lethe work` runs it)")
        }
        EngineError::Claimed(job) => format!("{e}; `lethe job show {job}` follows it"),
        EngineError::ClaimLost(job) => {
            format!("job {job}: this process lost its claim on the job (the control store closed its connection) and stopped; run `lethe resume {job}` or `lethe work`")
        }
        EngineError::Journal(JournalError::NoSuchJob(job)) => {
            format!("no job {job}; `lethe jobs` lists them")
        }
        EngineError::Journal(JournalError::Corrupt(_)) => {
            format!("{e}; run `lethe journal verify`")
        }
        EngineError::Journal(JournalError::Broken(_)) => format!(
            "{e}. `lethe journal verify` lists every problem; restore the journal's database \
             from a backup, or move it aside and start a new journal (its certificates stay \
             verifiable with the deployment key)"
        ),
        e => e.to_string(),
    };
    flags(&said)
}

/// The request's fields, as the engine names them (`` `ticket` ``), as the flags that set them.
fn flags(message: &str) -> String {
    [
        ("`extension_reason`", "--extension-reason"),
        ("`deadline`", "--deadline"),
        ("`ticket`", "--ticket"),
        ("`version`", "--version"),
        ("`reason`", "--reason"),
    ]
    .iter()
    .fold(message.to_string(), |m, (field, flag)| {
        m.replace(field, flag)
    })
}
