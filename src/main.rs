//! `fcp` command-line entry point. All logic lives in the library; this file only parses
//! arguments, runs the command and maps errors to exit codes.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
