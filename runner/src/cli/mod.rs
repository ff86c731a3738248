//! The `mlxkit` commands: parse the command line, build what a command needs from the library's
//! parts, and run it. No model or sampling logic lives here.
//!
//! - [`args`]: the commands and flags, and the parsers of flag values.
//! - `dispatch`: one function per command, from parsed arguments to a result.
//! - `app`: the engine, the model keeper and the server state the model-running commands share.
//! - `serve`: `mlxkit serve`, until the stop signals.
//! - `repl`: `mlxkit run`, one prompt or an interactive chat.
//! - `bench` and `replay`: `mlxkit bench`, its timed runs and its decision-log replay.
//! - `listing`: `list`, `show` and `ps` tables; `progress`: the terminal's progress bars;
//!   `info`: the system report.

use std::process::ExitCode;

use clap::Parser;

mod app;
pub mod args;
mod bench;
mod dispatch;
mod info;
mod listing;
mod progress;
mod repl;
mod replay;
mod serve;

pub use args::DEFAULT_MODEL;

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = args::Cli::parse();
    crate::logging::init_from_env();
    match dispatch::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
