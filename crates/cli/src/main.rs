//! `lethe`: erase a person's AI-agent memory everywhere it lives, and prove it.
//!
//! This file only parses arguments, sets up logging and hands over to [`commands::run`].

#[macro_use]
mod output; // first: its `outln!` and `out!` are used by the others
mod args;
mod commands;
mod exit;
mod open;
mod progress;
mod scope_input;
mod secret;

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
    std::process::exit(commands::run(args));
}

/// clap's own message, except that an unexpected argument is not repeated unless clap knows the
/// flag it was meant to be (a typo): a stray value, or an identifier that starts with `-`
/// (`--subject -x` reads `-x` as a flag), may be an identifier, Lethe's errors never carry one,
/// and stderr often ends up in a log.
fn refuse_args(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ErrorKind};
    let refuse = |message: String| -> ! {
        eprintln!("error: {message}");
        output::json_error(2, &message);
        std::process::exit(2);
    };
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(clap::error::ContextValue::String(near)) = e.get(ContextKind::SuggestedArg) {
            // clap would quote what was typed (`--subjectbob`), which may hold an identifier:
            // only the flag it resembles is named (review).
            if near.starts_with("--") {
                refuse(format!(
                    "unexpected argument (not repeated here: it may be an identifier); a \
                     similar flag exists: '{near}'; see `lethe --help`"
                ));
            }
        }
    }
    if e.kind() == ErrorKind::TooManyValues {
        // `--json=bob`: clap would quote the value.
        let flag = match e.get(ContextKind::InvalidArg) {
            Some(clap::error::ContextValue::String(a)) => {
                a.split([' ', '.']).next().unwrap_or_default().to_string()
            }
            _ => "this flag".into(),
        };
        refuse(format!(
            "{flag} takes no value (the value is not repeated here: it may be an identifier); \
             see `lethe help`"
        ));
    }
    if e.kind() == ErrorKind::UnknownArgument && e.get(ContextKind::SuggestedArg).is_none() {
        // A flag Lethe has, given to a command that does not take it (`certificate show
        // --json`): named, since it is a flag's name and not a value.
        if let Some(clap::error::ContextValue::String(a)) = e.get(ContextKind::InvalidArg) {
            let flag = a.split('=').next().unwrap_or_default();
            if lethe_flags().iter().any(|f| f == flag) {
                let certificate = std::env::args().any(|a| a == "certificate");
                let hint = if flag == "--json" && certificate {
                    " (`certificate show` prints JSON with --format json)"
                } else {
                    ""
                };
                refuse(format!(
                    "this command does not take {flag}; see its --help{hint}"
                ));
            }
        }
        refuse(
            "unexpected argument (not repeated here: it may be an identifier); every value \
             needs its flag, and a value that starts with '-' is written with '=', as \
             --subject=-x; see `lethe --help`"
                .into(),
        );
    }
    if e.kind() == ErrorKind::InvalidSubcommand && e.get(ContextKind::SuggestedSubcommand).is_none()
    {
        refuse(
            "unrecognized command (not repeated here: it may be an identifier); see \
             `lethe --help` for the commands"
                .into(),
        );
    }
    if matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        let flag = match e.get(ContextKind::InvalidArg) {
            Some(clap::error::ContextValue::String(a)) => a.clone(),
            _ => "an option".into(),
        };
        let valid = match e.get(ContextKind::ValidValue) {
            Some(clap::error::ContextValue::Strings(v)) if !v.is_empty() => {
                format!("; one of: {}", v.join(", "))
            }
            _ => String::new(),
        };
        if matches!(e.get(ContextKind::InvalidValue), Some(clap::error::ContextValue::String(v)) if v.is_empty())
        {
            refuse(format!("{flag} needs a value; see `lethe help`"));
        }
        // A parser's own reason (a job id's form, say), unless it quotes the value.
        let value = match e.get(ContextKind::InvalidValue) {
            Some(clap::error::ContextValue::String(v)) => v.clone(),
            _ => String::new(),
        };
        let why = std::error::Error::source(&e)
            .map(|c| c.to_string())
            .filter(|c| !value.is_empty() && !c.contains(&value))
            .map(|c| format!(": {c}"))
            .unwrap_or_default();
        refuse(format!(
            "invalid value for {flag} (not repeated here: it may be an identifier){why}{valid}; \
             see `lethe help`"
        ));
    }
    if e.use_stderr() {
        // Any other refusal of the command line (a missing flag, say): clap's own message.
        output::json_error(2, e.kind().as_str().unwrap_or("invalid command line"));
    }
    e.exit()
}

/// Every long flag of every command, `--name` spelt.
fn lethe_flags() -> Vec<String> {
    fn walk(c: &clap::Command, out: &mut Vec<String>) {
        out.extend(
            c.get_arguments()
                .filter_map(|a| a.get_long())
                .map(|l| format!("--{l}")),
        );
        for sub in c.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = Vec::new();
    walk(&<args::Args as clap::CommandFactory>::command(), &mut out);
    out
}
