//! `lethe`: erase a person's AI-agent memory everywhere it lives, and prove it.
//!
//! This file only parses arguments, sets up logging and hands over to [`cli::run`].

mod args;
mod cli;
mod demo;
mod guard;
mod output;
mod serve;

use clap::Parser;

fn main() {
    let args = args::Args::parse();
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
        .init();
    std::process::exit(cli::run(args));
}
