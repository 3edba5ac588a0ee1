//! `lethe`: erase a person's AI-agent memory everywhere it lives, and prove it.
//!
//! This file only parses arguments, sets up logging and hands over to [`cli::run`].

mod args;
mod cli;
mod demo;
mod guard;
mod output;
mod serve;

use std::io::IsTerminal;

use clap::Parser;

fn main() {
    let args = args::Args::try_parse().unwrap_or_else(|e| refuse_args(e));
    let filter = std::env::var("LETHE_LOG").unwrap_or_else(|_| {
        match args.verbose {
            0 => "warn",
            1 => "info",
            _ => "debug",
        }
        .to_string()
    });
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour only on a terminal: not in a file, a pipe, journald or a CI log.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    std::process::exit(cli::run(args));
}

/// clap's own message, except that a stray value (an identifier typed without its flag) is not
/// repeated: Lethe's errors never carry an identifier, and stderr often ends up in a log.
fn refuse_args(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
            if !arg.starts_with('-') {
                eprintln!(
                    "error: unexpected argument (not repeated here: a value without its flag may \
                     be an identifier); every value needs its flag, see `lethe --help`"
                );
                std::process::exit(2);
            }
        }
    }
    e.exit()
}
