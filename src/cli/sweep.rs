//! `fcp sweep`: run a study grid (traces × schemes × ranks × ...) resumably, in parallel.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use fcp::study::{run_sweep, Progress, SweepConfig};

/// Arguments of `fcp sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Sweep config (TOML; see `docs/studies.md`).
    config: PathBuf,
    /// Output directory: `cells/` (one file per finished cell), `results.csv`, `results.json`.
    /// A rerun skips the cells already there.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long, short)]
    quiet: bool,
    /// Worker threads, 1 to 1024 (default: rayon's, i.e. RAYON_NUM_THREADS or one per core).
    /// Bounded: 100,000 threads exhausted memory setting up their stacks and hung (bug hunt).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS))]
    threads: Option<u16>,
}

/// The most worker threads `--threads` takes: far more than any machine has cores, far fewer
/// than exhaust memory with their stacks.
const MAX_THREADS: i64 = 1024;

/// A progress bar on a terminal, nothing otherwise.
pub fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} batches · ETA {eta}",
    ) {
        pb.set_style(style);
    }
    pb
}

pub fn run(a: SweepArgs) -> Result<()> {
    let cfg = SweepConfig::load(&a.config)?;
    // `run_sweep` creates the folder once the inputs load, so a bad config leaves nothing.
    let pb = progress_bar(a.quiet);
    let on = |p: Progress| match p {
        Progress::Start { batches, .. } => pb.set_length(batches),
        Progress::Batch => pb.inc(1),
    };
    let start = std::time::Instant::now();
    let outcome = match a.threads {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n.into())
            .build()?
            .install(|| run_sweep(&cfg, Some(&a.output), &on))?,
        None => run_sweep(&cfg, Some(&a.output), &on)?,
    };
    pb.finish_and_clear();
    let failed = outcome.rows.iter().filter(|r| r.error.is_some()).count();
    if !a.quiet {
        eprintln!(
            "{} cells ({} computed, {} reused, {} with errors) in {:.1}s → {}/results.{{csv,json}}",
            outcome.rows.len(),
            outcome.computed,
            outcome.skipped,
            failed,
            start.elapsed().as_secs_f64(),
            a.output.display()
        );
    }
    Ok(())
}
