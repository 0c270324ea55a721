//! `fcp simulate`: per-rank compute, communication, overlap and imbalance of a plan.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use fcp::sim::{SimReport, Simulator};

use super::common::{bytes, load_verified_plan, PassArg, PlanProfileArgs};

/// Arguments of `fcp simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Plan file (`-` for stdin).
    plan: PathBuf,
    #[command(flatten)]
    profile: PlanProfileArgs,
    /// Passes: fwd (inference), bwd, or both (training).
    #[arg(long, value_enum, default_value_t = PassArg::Both)]
    pass: PassArg,
    /// Print JSON (plan metrics plus a `ranks` array).
    #[arg(long)]
    json: bool,
}

pub fn run(a: SimulateArgs) -> Result<()> {
    // Simulating a broken plan would report numbers for work that is not attention.
    let plan = load_verified_plan(&a.plan)?;
    let (hw, model) = a.profile.load(&plan)?;
    let sim = Simulator::new(hw, model)?;
    let report = sim.simulate(&plan, a.pass.into())?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report)?;
    }
    Ok(())
}

/// Human-readable report: plan metrics, then one row per rank.
pub fn print_table(r: &SimReport) -> Result<()> {
    let m = &r.metrics;
    outln!(
        "{} · {} ranks · {} · {} · pass {}",
        r.scheme,
        r.num_ranks,
        r.hardware,
        r.model,
        r.pass
    );
    outln!(
        "attention time {:.3} ms (lower bound {:.3} ms, {:.2}×) · MFU {:.1}% · compute imbalance {:.3} · comm imbalance {:.3} · FLOPs max/mean {:.3} · comm {} · peak memory {}",
        m.attention_time_ms,
        m.lower_bound_ms,
        m.vs_lower_bound,
        100.0 * m.mfu,
        m.compute_imbalance,
        m.comm_imbalance,
        m.max_over_mean,
        bytes(m.comm_bytes_total),
        bytes(m.mem_max_bytes)
    );
    outln!(
        "{:>5} {:>11} {:>9} {:>11} {:>11} {:>9} {:>9} {:>11} {:>11} {:>8} {:>11}",
        "rank",
        "compute_ms",
        "comm_ms",
        "exposed_ms",
        "on_peers_ms",
        "idle_ms",
        "TFLOP",
        "sent",
        "recv",
        "tokens",
        "memory"
    );
    for x in &r.ranks {
        outln!(
            "{:>5} {:>11.3} {:>9.3} {:>11.3} {:>11.3} {:>9.3} {:>9.2} {:>11} {:>11} {:>8} {:>11}",
            x.rank,
            x.compute_ms,
            x.comm_ms,
            x.exposed_comm_ms,
            x.waiting_on_peers_ms,
            x.idle_ms,
            x.flops / 1e12,
            bytes(x.bytes_sent),
            bytes(x.bytes_recv),
            x.tokens,
            bytes(x.mem_bytes)
        );
    }
    Ok(())
}
