//! `fcp dpcp`: straggler effect across data-parallel groups as CP grows (seeds/003).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use fcp::study::dpcp::{dpcp_csv, run_dpcp, DpcpConfig};

/// Arguments of `fcp dpcp`.
#[derive(Debug, Args)]
pub struct DpcpArgs {
    /// Study config (TOML: gpus, cp, tokens_per_gpu, steps, trace, balance, cost, ...).
    config: PathBuf,
    /// Directory for dpcp.csv and dpcp.json.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: DpcpArgs) -> Result<()> {
    let cfg = DpcpConfig::load(&a.config)?;
    let straddle = fcp::study::dpcp::straddling(&cfg)?;
    if !straddle.is_empty() {
        eprintln!(
            "note: at CP {} some data-parallel groups straddle two nodes ({} GPUs a node): their traffic between the two pays the NICs, but node-aware schemes (fcp:nodes, hybrid, usp) place their ranks as if each group started on a node's first GPU. CP × TP dividing, or divisible by, the GPUs of a node avoids it",
            straddle
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            fcp::hardware::Hardware::load(&cfg.hardware)?.gpus_per_node
        );
    }
    let start = std::time::Instant::now();
    let rows = run_dpcp(&cfg)?;
    let json = serde_json::to_string_pretty(&rows)? + "\n";
    if let Some(dir) = &a.output {
        // Both files are written before either appears, so a failure leaves neither behind.
        fcp::output::write_all_atomic(
            dir,
            [("dpcp.csv", dpcp_csv(&rows)), ("dpcp.json", json.clone())]
                .map(|(name, text)| (dir.join(name), text.into_bytes())),
        )
        .with_context(|| format!("writing {}", dir.display()))?;
    }
    if a.json {
        out!("{json}");
        return Ok(());
    }
    outln!(
        "{} GPUs{} · {} tokens/GPU · {} steps · {} · cost {}{}{}",
        cfg.gpus,
        super::common::tp_words(cfg.tp),
        cfg.tokens_per_gpu,
        cfg.steps,
        cfg.trace,
        cfg.cost,
        if cfg.cost == "sim" {
            format!(" ({})", cfg.scheme)
        } else {
            String::new()
        },
        if cfg.layer { " · whole layer" } else { "" }
    );
    outln!(
        "{:>4} {:>6} {:<8} {:>9} {:>7} {:>9} {:>8} {:>12} {:>12}",
        "CP",
        "groups",
        "balance",
        "max/min",
        "CV",
        "CV·√CP",
        "spread",
        "step_ms",
        "mean_grp_ms"
    );
    for r in &rows {
        outln!(
            "{:>4} {:>6} {:<8} {:>8.2}× {:>6.1}% {:>9.3} {:>7.1}% {:>12.3} {:>12.3}",
            r.cp,
            r.groups,
            r.balance,
            r.max_over_min,
            r.cv * 100.0,
            r.cv_sqrt_cp,
            r.spread * 100.0,
            r.step_time_ms,
            r.mean_group_ms
        );
    }
    outln!(
        "(means over steps; max/min, CV and spread of per-group {} time; step = slowest group; {:.1}s)",
        if cfg.layer { "whole-layer" } else { "attention" },
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
