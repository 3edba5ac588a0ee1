//! Opening the engine from a config file, for the commands that run or read jobs.

use std::path::Path;
use std::sync::Arc;

use lethe_core::clock::SystemClock;
use lethe_engine::{Config, Engine};

use crate::exit::Exit;

pub(crate) fn open_engine(config: &Path) -> Result<Engine, Exit> {
    let cfg = Config::load(config).map_err(crate::exit::config)?;
    Ok(Engine::open(cfg, Arc::new(SystemClock))?)
}

/// For a command that touches every target first (inventory, erase, resume, verify): the
/// targets are probed while the journal opens.
pub(crate) fn open_engine_probing(config: &Path) -> Result<Engine, Exit> {
    let cfg = Config::load(config).map_err(crate::exit::config)?;
    Ok(Engine::open_probing(cfg, Arc::new(SystemClock))?)
}
