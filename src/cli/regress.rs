//! `fcp regress`: the CI regression gate over a committed baseline.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use fcp::report::{shown, shown_when_long};
use fcp::study::regress::{check, default_grid, evaluate, failures, Baseline, DEFAULT_TOLERANCE};

use super::Exit;

/// Arguments of `fcp regress`.
#[derive(Debug, Args)]
pub struct RegressArgs {
    /// Baseline file (JSON: the grid, a tolerance, the recorded numbers per cell).
    #[arg(long)]
    baseline: PathBuf,
    /// Record the current numbers into the baseline instead of checking (creates it with the
    /// built-in grid when it does not exist).
    #[arg(long)]
    update: bool,
    /// Tolerance: imbalance ratios may rise by this much (absolute), attention time by this
    /// fraction (relative). Default: the baseline's own (0.03 in new baselines).
    #[arg(long)]
    tolerance: Option<f64>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(a: RegressArgs) -> Result<()> {
    if let Some(t) = a.tolerance {
        if !(t.is_finite() && t >= 0.0) {
            bail!("--tolerance must be a number ≥ 0, got {}", shown(t));
        }
    }
    let existing = if a.update && !a.baseline.exists() {
        None
    } else {
        Some(Baseline::load(&a.baseline)?)
    };
    let grid = existing
        .as_ref()
        .map(|b| b.grid.clone())
        .unwrap_or_else(default_grid);
    let pb = super::sweep::progress_bar(a.quiet);
    let results = evaluate(&grid, &|p| match p {
        fcp::study::Progress::Start { batches, .. } => pb.set_length(batches),
        fcp::study::Progress::Batch => pb.inc(1),
    })?;
    pb.finish_and_clear();
    if a.update {
        let failed = failures(&results);
        if let Some(first) = failed.first() {
            bail!(
                "{} of {} cells fail, and a baseline records numbers (first: {first}); fix those cells or drop them from the grid. Nothing was written{}",
                failed.len(),
                results.len(),
                if failed.len() > 1 {
                    format!(":\n  {}", failed.join("\n  "))
                } else {
                    String::new()
                }
            );
        }
        let tol = a
            .tolerance
            .or(existing.as_ref().map(|b| b.tolerance))
            .unwrap_or(DEFAULT_TOLERANCE);
        Baseline::from_results(grid, tol, &results).save(&a.baseline)?;
        outln!(
            "recorded {} cells into {} (tolerance {})",
            results.len(),
            a.baseline.display(),
            shown_when_long(tol)
        );
        return Ok(());
    }
    let Some(baseline) = existing else {
        unreachable!("a baseline is loaded unless --update creates one")
    };
    if baseline.cells.is_empty() {
        bail!(
            "{} records no cells, so it would check nothing; record them with `fcp regress --baseline {} --update`",
            a.baseline.display(),
            a.baseline.display()
        );
    }
    let tol = a.tolerance.unwrap_or(baseline.tolerance);
    let rep = check(&baseline, &results, tol);
    // Compact: a tolerance of 1e308 printed as 309 digits.
    let tol = shown_when_long(tol);
    for f in &rep.improvements {
        outln!("improved  {} · {}", f.cell.label(), f.message);
    }
    for f in &rep.regressions {
        outln!("REGRESSED {} · {}", f.cell.label(), f.message);
    }
    if rep.regressions.is_empty() {
        outln!(
            "regress: {} cells within tolerance {tol} of {}{}",
            rep.cells,
            baseline_name(&a.baseline),
            if rep.improvements.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} improvements: refresh with `fcp regress --baseline {} --update`)",
                    rep.improvements.len(),
                    a.baseline.display()
                )
            }
        );
        Ok(())
    } else {
        // Cells that fail for their settings, not their numbers, are said as such.
        let settings = rep
            .regressions
            .iter()
            .filter(|f| f.metric == "settings")
            .count();
        let what = if settings == rep.regressions.len() {
            format!("{settings} cell(s) recorded under other settings than the grid's now")
        } else {
            format!(
                "{} regression(s) in {} cells beyond tolerance {tol}",
                rep.regressions.len(),
                rep.cells
            )
        };
        eprintln!(
            "regress: {what}; if intended, refresh with `fcp regress --baseline {} --update`",
            a.baseline.display()
        );
        Err(Exit(1).into())
    }
}

fn baseline_name(p: &std::path::Path) -> String {
    p.display().to_string()
}
