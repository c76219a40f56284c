//! `rekindle-worker`: executes recoveries of interrupted runs.
//!
//! The worker loop (register, heartbeat, take assignments, resume runs) is not built yet;
//! this binary only documents its interface.

use std::process::ExitCode;

const USAGE: &str = "\
rekindle-worker — executes recoveries of interrupted agent runs

Usage: rekindle-worker --store URL --config rekindle.toml [--id NAME] [--concurrency N]

Not available in this build: the worker loop is not implemented yet.
";

fn main() -> ExitCode {
    let wants_help = std::env::args().skip(1).any(|a| a == "--help" || a == "-h");
    if wants_help {
        print!("{USAGE}");
        ExitCode::SUCCESS
    } else {
        eprint!("{USAGE}");
        ExitCode::from(2)
    }
}
