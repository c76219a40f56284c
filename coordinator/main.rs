//! `rekindle-coordinator`: finds interrupted runs and assigns them to workers.
//!
//! The coordination loop is not built yet; this binary only documents its interface.

use std::process::ExitCode;

const USAGE: &str = "\
rekindle-coordinator — finds interrupted agent runs and assigns them to workers

Usage: rekindle-coordinator --store URL

Not available in this build: the coordination loop is not implemented yet.
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
