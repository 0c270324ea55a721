//! `fcp validate`: the simulator against a replay's measurements (docs/executor.md).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use fcp::report::validate::{ErrorStats, Pair};
use fcp::report::{validate, Measured, ValidationReport};
use fcp::sim::Simulator;

use super::common::{load_verified_plan, tp_words, PlanProfileArgs};
use super::Exit;

/// Arguments of `fcp validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Plan file that was replayed.
    #[arg(long)]
    plan: PathBuf,
    /// measured.json written by `scripts/replay.py`.
    #[arg(long)]
    measured: PathBuf,
    #[command(flatten)]
    profile: PlanProfileArgs,
    /// Print JSON (summary, per-rank and per-step rows).
    #[arg(long)]
    json: bool,
    /// Exit 1 when the mean relative error of per-rank compute exceeds this (e.g. 0.10).
    #[arg(long)]
    max_compute_error: Option<f64>,
}

pub fn run(a: ValidateArgs) -> Result<()> {
    let plan = load_verified_plan(&a.plan)?;
    if let Some(x) = a.max_compute_error {
        if !(x.is_finite() && x >= 0.0) {
            anyhow::bail!("--max-compute-error must be a number ≥ 0, got {x}");
        }
    }
    let measured = Measured::load(&a.measured)?;
    if let Some(c) = measured.check.as_ref().filter(|c| c.passed == Some(false)) {
        eprintln!(
            "warning: {} records a replay whose outputs failed the dense check (max relative error {}): its timings are of a run that computed something else",
            a.measured.display(),
            c.max_rel_error.map_or("unknown".into(), |x| format!("{x:.3e}"))
        );
    }
    if measured.backend.as_deref() == Some("sdpa") {
        // The replay's fallback when PyTorch's varlen op fails its self-test (docs/executor.md
        // § Kernels): every piece its own launch, where the simulator prices a step as one.
        eprintln!(
            "warning: {} was measured with the dense sdpa op, one launch per piece: the simulator prices one launch a step, so the compute of plans cut into many small pieces reads high",
            a.measured.display()
        );
    }
    let (hw, model) = a.profile.load(&plan)?;
    let sim = Simulator::new(hw, model)?;
    let report = validate(&plan, &sim, &measured, &a.measured.display().to_string())?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report)?;
    }
    if let Some(limit) = a.max_compute_error {
        // A gate that cannot check fails, as `fcp regress` does on a cell it cannot evaluate.
        // Regression: a measurement with every compute time 0 passed it.
        let Some(rc) = report.summary.rank_compute.filter(|rc| rc.n > 0) else {
            eprintln!(
                "per-rank compute: {} measures no compute time, so --max-compute-error cannot be checked",
                a.measured.display()
            );
            return Err(Exit(1).into());
        };
        if rc.zero_measured > 0 {
            eprintln!(
                "per-rank compute: {} measures 0 ms on {} rank(s) where the simulation computes, so --max-compute-error cannot be checked there",
                a.measured.display(),
                rc.zero_measured
            );
            return Err(Exit(1).into());
        }
        if rc.mean > limit {
            eprintln!(
                "per-rank compute: mean relative error {} exceeds --max-compute-error {}",
                percent(rc.mean),
                percent(limit)
            );
            return Err(Exit(1).into());
        }
    }
    Ok(())
}

fn pct(e: Option<f64>) -> String {
    e.map_or_else(|| "-".to_string(), percent)
}

/// A relative error as a percentage, one decimal; in exponent form from a million percent on
/// (bug hunt: a measured 1e-300 ms printed an error of 300 digits).
fn percent(x: f64) -> String {
    let p = 100.0 * x;
    if p.abs() < 1e6 {
        format!("{p:.1}%")
    } else {
        format!("{p:.1e}%")
    }
}

fn stats(s: Option<ErrorStats>) -> String {
    s.map_or_else(
        || "not measured".to_string(),
        |s| {
            let zero = match s.zero_measured {
                0 => String::new(),
                z => format!(", {z} measured 0 ms where simulated > 0"),
            };
            if s.n == 0 {
                return format!("not measured{zero}");
            }
            format!(
                "mean {} · max {} ({} values{zero})",
                percent(s.mean),
                percent(s.max),
                s.n
            )
        },
    )
}

fn pair(p: Option<Pair>) -> String {
    p.map_or_else(
        || format!("{:>10} {:>10} {:>7}", "-", "-", "-"),
        |p| {
            format!(
                "{:>10.3} {:>10.3} {:>7}",
                p.sim_ms,
                p.measured_ms,
                pct(p.rel_error)
            )
        },
    )
}

fn print_table(r: &ValidationReport) -> Result<()> {
    outln!(
        "{} · {} ranks · simulated on {} · {}{} · pass {} · measured {} ({})",
        r.scheme,
        r.ranks.len(),
        r.hardware,
        r.model,
        tp_words(r.tp),
        r.pass,
        r.mode,
        r.measured_on
    );
    outln!("per step (ms):");
    outln!(
        "{:>5} {:>4} {:>5} {:>6} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
        "rank",
        "pass",
        "step",
        "tasks",
        "sim_comp",
        "meas_comp",
        "err",
        "sim_wait",
        "meas_wait",
        "err"
    );
    for s in &r.steps {
        outln!(
            "{:>5} {:>4} {:>5} {:>6} {} {}",
            s.rank,
            s.pass,
            s.step,
            s.tasks,
            pair(Some(s.compute)),
            pair(s.wait)
        );
    }
    outln!("per rank (ms, passes summed):");
    outln!(
        "{:>5} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
        "rank",
        "sim_comp",
        "meas_comp",
        "err",
        "sim_comm",
        "meas_comm",
        "err",
        "sim_end",
        "meas_end",
        "err"
    );
    for x in &r.ranks {
        outln!(
            "{:>5} {} {} {}",
            x.rank,
            pair(Some(x.compute)),
            pair(x.comm),
            pair(x.end)
        );
    }
    let s = &r.summary;
    outln!("compute per rank: {}", stats(s.rank_compute));
    outln!("compute per step: {}", stats(s.step_compute));
    outln!("comm per rank:    {}", stats(s.rank_comm));
    match s.attention_time {
        Some(p) => outln!(
            "attention time:   simulated {:.3} ms · measured {:.3} ms · error {}",
            p.sim_ms,
            p.measured_ms,
            pct(p.rel_error)
        ),
        None => outln!("attention time:   not measured"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::percent;

    /// Regression (bug hunt): a measured 1e-300 ms printed a relative error of 300 digits.
    #[test]
    fn regression_a_huge_relative_error_prints_in_exponent_form() {
        assert_eq!(percent(0.0123), "1.2%");
        assert_eq!(percent(9999.0), "999900.0%");
        let huge = percent(2.5e300);
        assert_eq!(huge, "2.5e302%");
    }
}
