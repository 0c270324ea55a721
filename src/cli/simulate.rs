//! `fcp simulate`: per-rank compute, communication, overlap and imbalance of a plan.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use fcp::sim::step::MicroBatch;
use fcp::sim::{SimReport, Simulator};

use super::common::{
    bytes, footprint_words, layer_sim, load_verified_plan, memory_sim, step_line, tp_words,
    zero3_words, PassArg, PlanProfileArgs, RecomputeArg, StepArgs, TrainingArgs,
};

/// Arguments of `fcp simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Plan file (`-` for stdin).
    plan: PathBuf,
    #[command(flatten)]
    profile: PlanProfileArgs,
    /// Passes: fwd (inference), bwd, or both (training). Default: the pass the plan was
    /// chosen for where it records one (`objective_pass`, hybrid and auto), else both.
    #[arg(long, value_enum)]
    pass: Option<PassArg>,
    /// Print JSON (plan metrics plus a `ranks` array).
    #[arg(long)]
    json: bool,
    /// Also simulate the whole layer: the Q/K/V projection before attention and the output
    /// projection and MLP after it, priced per token at the hardware's `gemm_tflops` (needs a
    /// model with `hidden` and `ffn_hidden`). Adds `layer_time_ms` and friends, `act_max_bytes`
    /// (activations one layer keeps for the backward pass), and per-rank `linear_ms`,
    /// `layer_end_ms` and `act_bytes`.
    #[arg(long)]
    layer: bool,
    /// With `--layer`: what the backward pass recomputes. `mlp` drops the MLP's wide tensors
    /// and reruns its forward GEMMs; `full` keeps each layer's input alone and reruns the
    /// layer's forward pass, attention and its communication included. Changes the
    /// activations kept and the layer's time (not attention's). Default: what the plan was
    /// chosen under where it records it (`objective_recompute`), else none.
    #[arg(long, value_enum, requires = "layer")]
    recompute: Option<RecomputeArg>,
    /// With `--layer` under `--tp`: each TP collective overlaps the GEMM it feeds or drains
    /// (Megatron's `--tp-comm-overlap`); only what outlasts that GEMM is exposed. Default:
    /// what the plan was chosen under where it records it (`objective_tp_overlap`), else off.
    #[arg(long, requires = "layer", conflicts_with = "no_tp_overlap")]
    tp_overlap: bool,
    /// With `--layer`: simulate the TP collectives exposed even where the plan was chosen
    /// with them overlapped (`objective_tp_overlap`).
    #[arg(long, requires = "layer")]
    no_tp_overlap: bool,
    /// With `--layer`: also count what the fullest GPU holds over a training step (weights,
    /// gradients and optimizer state, every layer's activations, the largest transient) and
    /// check it against the hardware's `hbm_gb`. Needs a model with `layers` and `vocab`.
    /// Adds `footprint` to the JSON (docs/cost-model.md § GPU memory).
    #[arg(long, requires = "layer")]
    memory: bool,
    #[command(flatten)]
    training: TrainingArgs,
    /// With `--memory`: a training step of `--micro-batches` copies of this batch (adds
    /// `step` to the layer's JSON; docs/cost-model.md § Training step).
    #[command(flatten)]
    step: StepArgs,
}

pub fn run(a: SimulateArgs) -> Result<()> {
    // Simulating a broken plan would report numbers for work that is not attention.
    let plan = load_verified_plan(&a.plan)?;
    let training = a.training.when(a.memory)?;
    let step = a.step.step(training.unwrap_or_default())?;
    if step.is_some() && training.is_none() {
        anyhow::bail!("--micro-batches prices a training step from the memory count's setting: it needs --layer --memory");
    }
    let (hw, model) = a.profile.load(&plan)?;
    // What the plan was chosen for (hybrid and auto record it), as the hardware and model
    // it was made for are the defaults (bug hunt: a plan chosen for the forward pass was
    // simulated for both without a word).
    // A priced training step runs both passes, whatever the plan was chosen for (bug hunt:
    // a plan chosen for --pass fwd refused --micro-batches until --pass both was given).
    let pass = match (step, a.pass) {
        (Some(_), None) => PassArg::Both,
        _ => chosen(&plan, "objective_pass", "--pass", a.pass, PassArg::Both),
    };
    let recompute = if a.layer {
        Some(chosen(
            &plan,
            "objective_recompute",
            "--recompute",
            a.recompute,
            RecomputeArg::None,
        ))
    } else {
        a.recompute
    };
    let tp_overlap = a.layer && tp_overlap(&plan, a.tp_overlap, a.no_tp_overlap);
    let sim = layer_sim(Simulator::new(hw, model)?, a.layer, recompute, tp_overlap)?;
    let sim = memory_sim(sim, training, step)?;
    let mut report = sim.simulate(&plan, pass.into())?;
    if let (Some(opts), Some(layer)) = (step, report.metrics.layer.as_mut()) {
        let tokens: u64 = plan.documents.iter().map(|d| d.len).sum();
        let window = MicroBatch::of(layer, tokens as f64);
        let step = sim.step(&[window], plan.num_ranks, opts)?;
        if opts.dp_overlap && step.dp_comm_ms == 0.0 {
            super::common::dp_overlap_idle_note("this step runs no");
        }
        layer.step = Some(step);
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report)?;
    }
    Ok(())
}

/// Whether to overlap the TP collectives: as asked (`--tp-overlap`, `--no-tp-overlap`), else
/// as the plan was chosen (`objective_tp_overlap`), saying so, as [`chosen`] does for the pass
/// and recomputation (bug hunt: a plan chosen with overlap was simulated without, silently,
/// 111.5 ms a layer against the 105.8 it was chosen at).
fn tp_overlap(plan: &fcp::plan::Plan, on: bool, off: bool) -> bool {
    let recorded = plan
        .scheme
        .params
        .get("objective_tp_overlap")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if on || off {
        if recorded && off {
            eprintln!("note: the plan was chosen with --tp-overlap (objective_tp_overlap); simulating the TP collectives exposed as asked");
        }
        return on;
    }
    if recorded {
        eprintln!("note: simulating --tp-overlap, what the plan was chosen for (objective_tp_overlap); --no-tp-overlap to simulate otherwise");
    }
    recorded
}

/// The value of `flag`: as given, else what the plan records it was chosen for under `key`,
/// else `default`. Says so when the plan's choice is taken or overridden.
fn chosen<T: clap::ValueEnum + Copy + PartialEq>(
    plan: &fcp::plan::Plan,
    key: &str,
    flag: &str,
    given: Option<T>,
    default: T,
) -> T {
    let name = |v: T| {
        v.to_possible_value()
            .map_or_else(String::new, |p| p.get_name().to_string())
    };
    let recorded = plan
        .scheme
        .params
        .get(key)
        .and_then(|v| v.as_str())
        .and_then(|s| T::from_str(s, false).ok());
    match (given, recorded) {
        (None, Some(r)) => {
            if r != default {
                eprintln!(
                    "note: simulating {flag} {}, what the plan was chosen for ({key}); {flag} {} to simulate otherwise",
                    name(r),
                    name(default)
                );
            }
            r
        }
        (Some(g), Some(r)) if g != r => {
            eprintln!(
                "note: the plan was chosen for {flag} {} ({key}); simulating {flag} {} as asked",
                name(r),
                name(g)
            );
            g
        }
        (g, _) => g.unwrap_or(default),
    }
}

/// Human-readable report: plan metrics, then one row per rank.
pub fn print_table(r: &SimReport) -> Result<()> {
    let m = &r.metrics;
    outln!(
        "{} · {} ranks · {} · {}{} · pass {}",
        r.scheme,
        r.num_ranks,
        r.hardware,
        r.model,
        tp_words(r.tp),
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
    if let Some(l) = &m.layer {
        outln!(
            "whole layer {:.3} ms (lower bound {:.3} ms, {:.2}×) · MFU {:.1}% · projections+MLP {:.3} ms mean, {:.3} ms max · token imbalance {:.3} · activations kept {} per layer (max; × the layers a GPU runs{})",
            l.layer_time_ms,
            l.layer_lower_bound_ms,
            l.layer_vs_lower_bound,
            100.0 * l.layer_mfu,
            l.linear_mean_ms,
            l.linear_max_ms,
            l.token_imbalance,
            bytes(l.act_max_bytes),
            match l.recompute {
                fcp::model::Recompute::None => ", unless recomputed".to_string(),
                r => format!("; recompute {}", r.name()),
            }
        );
        if let Some(tp_ms) = l.tp_comm_max_ms {
            outln!(
                "tensor parallel: TP {} · collectives {tp_ms:.3} ms max per rank ({})",
                r.tp,
                if l.tp_overlap {
                    "all-gathers and reduce-scatters of its tokens, the part outlasting their GEMMs"
                } else {
                    "all-gathers and reduce-scatters of its tokens, exposed"
                }
            );
        }
        if let (Some(comm), Some(exposed)) = (l.zero3_comm_ms, l.zero3_exposed_ms) {
            let (replicas, hybrid) = l.footprint.map_or((1, false), |f| {
                (f.training.shard_replicas(), f.training.shard_dp.is_some())
            });
            outln!(
                "{}",
                zero3_words(
                    comm,
                    exposed,
                    r.pass != fcp::sim::PassSel::Fwd.name(),
                    replicas,
                    hybrid
                )
            );
        }
        if let Some(f) = &l.footprint {
            outln!("{}", footprint_words(f, r.num_ranks));
        }
        if let Some(s) = &l.step {
            outln!("{}", step_line(s, l.zero3_comm_ms.is_some()));
        }
    }
    let layer = m.layer.is_some();
    out!(
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
    if layer {
        out!(
            " {:>10} {:>10} {:>11}",
            "linear_ms",
            "layer_end",
            "act/layer"
        );
    }
    let tp = r.ranks.iter().any(|x| x.tp_comm_ms.is_some());
    if tp {
        out!(" {:>9}", "tp_ms");
    }
    outln!();
    for x in &r.ranks {
        out!(
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
        if let (Some(l), Some(e), Some(a)) = (x.linear_ms, x.layer_end_ms, x.act_bytes) {
            out!(" {l:>10.3} {e:>10.3} {:>11}", bytes(a));
        }
        if let Some(t) = x.tp_comm_ms {
            out!(" {t:>9.3}");
        }
        outln!();
    }
    Ok(())
}
