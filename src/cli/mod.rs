//! Command-line glue: each subcommand is a small function over the library.
//!
//! Exit codes: 0 success; 1 a check failed (an invalid plan, a regression); 2 bad input or
//! usage (the message says what to fix).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` that returns a closed pipe (`fcp ... | head`) as an error — which `main` turns
/// into a quiet exit 0 — instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($t)*)?;
    }};
}

/// `print!` with the same closed-pipe handling as [`outln!`].
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($t)*)?;
    }};
}

mod ablation;
mod common;
mod compare;
mod demo;
mod dpcp;
mod hw;
mod ilp;
mod plan;
mod plot;
mod regress;
mod simulate;
mod steps;
mod sweep;
mod tpcp;
mod trace;
mod validate;
mod verify;

/// Plan and simulate context parallelism (CP) for long-context LLM training.
#[derive(Debug, Parser)]
#[command(name = "fcp", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// FCP's components added one by one (pipelining, solver, coalescer, reshuffler), simulated.
    Ablation(ablation::AblationArgs),
    /// Plan and simulate several schemes on the same batches, side by side.
    Compare(compare::CompareArgs),
    /// The main job: plan the bundled trace with every scheme, verify, and compare balance.
    Demo(demo::DemoArgs),
    /// Plan one batch (or all) with one scheme and write plan files.
    Plan(plan::PlanArgs),
    /// Simulate a plan: per-rank compute, communication, overlap, imbalance, memory.
    Simulate(simulate::SimulateArgs),
    /// Check a plan file: structural invariants, optionally a numeric run.
    Verify(verify::VerifyArgs),
    /// Simulated vs measured (`scripts/replay.py`'s measured.json), per rank and per step.
    Validate(validate::ValidateArgs),
    /// Generate, inspect and pack document-length traces.
    Trace(trace::TraceArgs),
    /// Inspect hardware and model profiles.
    Hw(hw::HwArgs),
    /// Run a study grid (traces × schemes × ranks × ...) in parallel, resumably.
    Sweep(sweep::SweepArgs),
    /// Regression gate: evaluate fixed cells and compare with a committed baseline.
    Regress(regress::RegressArgs),
    /// Draw Gantt charts, sweep charts, trace CDFs, DP×CP curves (PNG or SVG).
    Plot(plot::PlotArgs),
    /// DP×CP: straggler effect across data-parallel groups as CP grows, with a balancer.
    Dpcp(dpcp::DpcpArgs),
    /// TP×CP: split the GPUs of one sequence between tensor and context parallelism, per scheme.
    Tpcp(tpcp::TpCpArgs),
    /// Cross-check a scheme's heuristic against its exact ILP on one batch.
    Ilp(ilp::IlpArgs),
}

/// An error that should exit with a specific code (1: a check failed).
#[derive(Debug)]
pub struct Exit(pub u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}
impl std::error::Error for Exit {}

/// Parse arguments, run, and map the outcome to an exit code.
pub fn main() -> ExitCode {
    // No output of this command may replace a file it read (`fcp::read_guard`).
    fcp::read_guard::guard_outputs();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Ablation(a) => ablation::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Hw(a) => hw::run(a),
        Command::Sweep(a) => sweep::run(a),
        Command::Regress(a) => regress::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Dpcp(a) => dpcp::run(a),
        Command::Tpcp(a) => tpcp::run(a),
        Command::Ilp(a) => ilp::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
                return ExitCode::from(*code);
            }
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", error_message(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, each cause once: errors that already quote their
/// source (`cannot read X: No such file…`) would otherwise print it twice.
fn error_message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `cannot read wlb.csv: No such file or directory (os error 2): No such file
    /// or directory (os error 2)`.
    #[test]
    fn a_cause_already_quoted_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::from(fcp::trace::TraceError::Io {
            path: "wlb.csv".into(),
            source: io,
        });
        assert_eq!(error_message(&e), "cannot read wlb.csv: no such file");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_message(&e), "outer: inner");
    }
}
