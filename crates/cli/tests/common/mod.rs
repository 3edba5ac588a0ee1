//! What the CLI's suites share: the `lethe` binary under test, run on a folder's `lethe.toml`.
// Each suite uses some of these.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// `lethe --config DIR/lethe.toml ARGS`, with no log filter from the environment.
pub fn lethe(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lethe"));
    c.arg("--config")
        .arg(dir.join("lethe.toml"))
        .args(args)
        .env_remove("LETHE_LOG");
    c
}

/// [`lethe`] run to its end.
pub fn run(dir: &Path, args: &[&str]) -> Output {
    lethe(dir, args).output().unwrap()
}

/// [`lethe`] with `--json`-shaped output: its exit code and its stdout as JSON (a panic shows
/// both streams when stdout is not JSON).
pub fn json(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = run(dir, args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), v)
}
