//! One module a command (or a group of them); this one routes a parsed command line to it,
//! prints a failure, and opens the engine for the commands that need it.

mod backups;
mod certificate;
mod demo;
mod erase;
mod guard;
mod hold;
mod jobs;
mod journal;
mod lineage;
mod recovery;
mod request;
mod scope;
mod serve;
mod targets;

use crate::args::{
    Args, BackupsCommand, Command, JobCommand, JournalCommand, KeysCommand, LineageCommand,
};
use crate::exit::Exit;

/// Runs a command; returns the exit code.
pub fn run(args: Args) -> i32 {
    match dispatch(args) {
        Ok(code) => code,
        Err(Exit(code, e)) => {
            eprintln!("error: {e:#}");
            crate::output::json_error(code, &format!("{e:#}"));
            code
        }
    }
}

fn dispatch(args: Args) -> Result<i32, Exit> {
    let config = args.config;
    match args.command {
        Command::Demo { dir } => demo::run(&dir),
        Command::Serve { listen } => serve::run(&config, listen),
        Command::Targets { json } => targets::run(&config, json),
        Command::Inventory { scope, json } => scope::inventory(&config, scope, json),
        Command::Verify {
            job: Some(job_id),
            json,
            ..
        } => scope::verify_physical(&config, &job_id, json),
        Command::Verify {
            scope, audit, json, ..
        } => scope::verify(&config, scope, audit, json),
        Command::Erase(erase) => erase::erase(&config, erase),
        Command::Resume {
            job_id,
            drain_timeout,
            reinventory,
            json,
        } => erase::resume(&config, job_id, drain_timeout, reinventory, json),
        Command::Work {
            drain_timeout,
            json,
        } => erase::work(&config, drain_timeout, json),
        Command::Recovery {
            target,
            since,
            json,
        } => recovery::run(&config, &target, since, json),
        Command::Jobs { json } => jobs::list(&config, json),
        Command::Job {
            command: JobCommand::Show { job_id, json },
        } => jobs::show(&config, job_id, json),
        Command::Certificate { command } => certificate::run(&config, command),
        Command::Keys {
            command: KeysCommand::Inventory { json },
        } => {
            let engine = crate::open::open_engine(&config)?;
            let inv = engine.key_inventory()?;
            if json {
                crate::output::print_json(&inv);
            } else if inv["enabled"] == false {
                outln!("Crypto-shredding is off: add [keys] kek_file to the config to turn it on.");
            } else {
                outln!("Key-encryption key: {}", inv["kek"].as_str().unwrap_or("-"));
                outln!(
                    "Wrapped data keys: {} in {}",
                    inv["key_store"]["keys"],
                    inv["key_store"]["where"].as_str().unwrap_or("-")
                );
                outln!("Targets written encrypted: {}", inv["encrypted_targets"]);
                outln!(
                    "Runtime caches: {}",
                    inv["runtime_caches"].as_str().unwrap_or("-")
                );
                outln!(
                    "Backups: {}",
                    inv["backups"]["of_the_key_store"].as_str().unwrap_or("-")
                );
            }
            Ok(0)
        }
        Command::Lineage {
            command: LineageCommand::Add { file },
        } => lineage::add(&config, &file),
        Command::Backups {
            command: BackupsCommand::Check { json },
        } => backups::check(&config, json),
        Command::Hold { command } => hold::run(&config, command),
        Command::Request { command } => request::run(&config, command),
        Command::Approve {
            request_id,
            token_file,
            drain_timeout,
            json,
        } => erase::approve(
            &config,
            &request_id,
            token_file.as_deref(),
            drain_timeout,
            json,
        ),
        Command::Guard { command } => guard::run(&config, command),
        Command::Journal {
            command:
                JournalCommand::Verify {
                    json,
                    seal,
                    public_key,
                },
        } => journal::verify(&config, json, seal, public_key.as_deref()),
    }
}
