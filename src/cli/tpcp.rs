//! `fcp tpcp`: split the GPUs of one sequence between tensor and context parallelism.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use fcp::hardware::Hardware;
use fcp::report::{fits_word, human_bytes, parse_scheme_list};
use fcp::study::tpcp::{
    best_split_per_scheme, fastest, fastest_that_fits, run_tpcp, smallest_footprint, TpCpOptions,
    TpCpRow,
};
use fcp::trace::PackMode;
use fcp::Model;

use super::common::{
    footprint_words, memory_words, plural, rate, recompute_words, repeats_note, stage_words,
    step_parts, step_words, BatchArgs, LeverArgs, MaskArg, PassArg, RecomputeArg, StepArgs,
    TrainingArgs,
};
use super::steps::{batches_wanted, whole_steps};
use super::trace::{PackArgs, PackModeArg, WlbArgs, WlbHints};

/// Arguments of `fcp tpcp`.
#[derive(Debug, Args)]
pub struct TpCpArgs {
    /// Trace file; defaults to the bundled trace.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// GPUs that hold one sequence (TP × CP). Every TP degree that divides it and fits a node
    /// is tried.
    #[arg(long)]
    gpus: u32,
    /// Tokens per sequence: the trace is packed into windows of this many (as `--pack window`).
    #[arg(long, default_value_t = super::trace::DEFAULT_CONTEXT)]
    context: u64,
    /// Packing: `window` (fixed --context windows) or `wlb` (WLB-LLM's: each step's
    /// --context windows repacked into micro-batches of equal work, as `fcp compare --pack
    /// wlb`). Every split sees the same ones.
    #[arg(long = "pack", value_enum, default_value_t = TpCpPack::Window)]
    pack: TpCpPack,
    #[command(flatten)]
    wlb: WlbArgs,
    /// Number of windows (from the start of the trace): 4, or with --steps every step's.
    #[arg(long)]
    batches: Option<usize>,
    /// Schemes, comma-separated (as `fcp compare --schemes`), or `all`.
    #[arg(long, default_value = "zigzag,fcp,flashcp,hybrid")]
    schemes: Vec<String>,
    /// Mask inside each document.
    #[arg(long, value_enum, default_value_t = MaskArg::Causal)]
    mask: MaskArg,
    /// Passes: fwd (inference), bwd, or both (training).
    #[arg(long, value_enum, default_value_t = PassArg::Both)]
    pass: PassArg,
    /// Hardware profile: a bundled name (h100, h200, b200) or a TOML file.
    #[arg(long, default_value = "h100")]
    hardware: String,
    /// Model preset or TOML file; it must give the layer's widths (`hidden`, `ffn_hidden`).
    #[arg(long, default_value = "llama3-70b")]
    model: String,
    /// What the backward pass recomputes (none, mlp, full; as `fcp simulate --recompute`).
    #[arg(long, value_enum)]
    recompute: Option<RecomputeArg>,
    /// TP collectives overlap their GEMMs (as `fcp simulate --tp-overlap`).
    #[arg(long)]
    tp_overlap: bool,
    #[command(flatten)]
    training: TrainingArgs,
    #[command(flatten)]
    step: StepArgs,
    /// With --micro-batches: price this many consecutive training steps, each on its own
    /// --micro-batches × --dp windows, and rank the splits by the mean step (as `fcp compare
    /// --steps`: the JSON's `steps` and `over_steps`, a `max_step` column). --batches defaults
    /// to every step's windows.
    #[arg(long, requires = "micro_batches")]
    steps: Option<usize>,
    #[command(flatten)]
    levers: LeverArgs,
    /// Print JSON: one object per (split, scheme).
    #[arg(long)]
    json: bool,
}

pub fn run(a: TpCpArgs) -> Result<()> {
    let schemes = parse_scheme_list(&a.schemes)?;
    if schemes.is_empty() {
        bail!("--schemes lists no scheme (give names, comma-separated, or `all`)");
    }
    if a.batches == Some(0) {
        bail!("--batches must be at least 1");
    }
    if a.steps == Some(0) {
        bail!("--steps must be at least 1");
    }
    if a.gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    let hw = Hardware::load(&a.hardware)?;
    let model = Model::load(&a.model)?;
    let training = a.training.training()?;
    let step = a.levers.apply(a.step.step(training)?, training)?;
    super::common::optimizer_note(&hw, step.is_some());
    // Window packing depends on the context alone, WLB packing on the step and the model
    // too (TP splits attention and the linear layers alike): every split sees these.
    let source = BatchArgs {
        trace: a.trace.clone(),
        ranks: a.gpus.min(fcp::planners::MAX_RANKS),
        tokens_per_rank: None,
        pack: PackArgs {
            pack: a.pack.into(),
            context: Some(a.context),
            wlb: a.wlb.clone(),
        },
        mask: a.mask,
    };
    let hints = WlbHints::new(
        &model,
        step.map(|o| u32::try_from(o.windows(training.dp)).unwrap_or(u32::MAX)),
    );
    let mode = source.pack.mode(hints);
    let wlb = match mode {
        PackMode::Window => None,
        PackMode::Wlb(p) => Some(p),
        other => bail!(
            "fcp tpcp splits the GPUs of one window: --pack window or wlb, not {}",
            other.name()
        ),
    };
    // The windows one step trains: --micro-batches on each of --dp replicas.
    let per_step = step.map(|o| usize::try_from(o.windows(training.dp)).unwrap_or(usize::MAX));
    let wanted = batches_wanted(
        a.batches,
        a.steps,
        step.map(|o| (o.micro_batches, training.dp)),
    )?;
    let mut windows = source.load(wanted, hints)?;
    let unit = if wlb.is_some() {
        ("WLB micro-batch", "WLB micro-batches")
    } else {
        ("window", "windows")
    };
    // `--steps S`: S steps (the whole steps the trace holds, if fewer), each on its own
    // windows, as `compare --steps` prices them.
    let steps = match (a.steps, per_step) {
        (Some(s), Some(per)) => Some(whole_steps(&mut windows.batches, s, per, 0, unit)),
        _ => None,
    };
    if let (Some(p), Some(o)) = (wlb, step) {
        super::common::wlb_alignment_note(
            p.group as usize,
            usize::try_from(o.windows(training.dp)).unwrap_or(usize::MAX),
            0,
        );
    }
    windows.note_all_cuts();
    let opts = TpCpOptions {
        gpus: a.gpus,
        context: a.context,
        pack: mode,
        schemes: schemes.clone(),
        mask: a.mask.into(),
        pass: a.pass.into(),
        recompute: a.recompute.map_or(Default::default(), Into::into),
        tp_overlap: a.tp_overlap,
        training,
        step,
        steps,
    };
    let rows = run_tpcp(&windows.batches, &hw, &model, &opts)?;
    // As `compare`: a study in which nothing ran is a failure, in every format.
    let Some(best) = fastest(&rows) else {
        bail!("no split could run any scheme:\n{}", why_none_ran(&rows));
    };
    // Overlap matters only where some split with TP ran.
    let overlapped = a.tp_overlap && rows.iter().any(|r| r.tp > 1 && r.error.is_none());
    if a.tp_overlap && !overlapped {
        eprintln!("note: --tp-overlap changes nothing: no split with TP above 1 ran");
    }
    if step.is_some_and(|s| s.dp_overlap)
        && rows
            .iter()
            .flat_map(|r| r.priced.all())
            .all(|s| s.dp_comm_ms == 0.0)
    {
        super::common::dp_overlap_idle_note("no split runs");
    }
    // Under `--steps` each step has its own windows, or `whole_steps` said why not.
    if let Some(s) = rows
        .iter()
        .find_map(|r| r.priced.first())
        .filter(|_| steps.is_none())
    {
        let needed = u64::from(training.dp) * u64::from(s.micro_batches);
        if (s.windows as u64) < needed {
            // Bug hunt: the count is a u64 (65,536 × 65,536 overflowed a u32), and a trace
            // too short for more windows gets no advice it cannot follow. Packing is cheap:
            // count its windows up to what the step needs (or a million).
            let probe = needed.min(1 << 20) as usize;
            let avail = if windows.batches.len() < wanted {
                windows.batches.len()
            } else {
                source.load(probe, hints).map_or(probe, |w| w.batches.len())
            };
            let advice = if avail < probe {
                format!(
                    "the trace packs into only {}{}",
                    match wlb {
                        Some(p) => format!(
                            "{} (each at most {} tokens)",
                            plural(avail as u32, unit.0, unit.1),
                            p.max_len
                        ),
                        None => format!(
                            "{} of {} tokens",
                            plural(avail as u32, unit.0, unit.1),
                            a.context
                        ),
                    },
                    if avail > windows.batches.len() {
                        format!(" (--batches {avail} simulates them all)")
                    } else {
                        String::new()
                    }
                )
            } else {
                format!(
                    "--batches {needed} gives each its own {}",
                    if wlb.is_some() {
                        "micro-batch"
                    } else {
                        "window"
                    }
                )
            };
            repeats_note(
                needed,
                s.micro_batches,
                training.dp,
                s.windows,
                if wlb.is_some() {
                    ("simulated micro-batch", "simulated micro-batches")
                } else {
                    ("simulated window", "simulated windows")
                },
                &advice,
            );
        }
    }
    // Bug hunt: a step over the first of the windows simulated was not said (compare says it).
    if let (None, Some(s)) = (steps, rows.iter().find_map(|r| r.priced.first())) {
        super::steps::first_windows_note(
            u64::from(training.dp) * u64::from(s.micro_batches),
            windows.batches.len(),
            s.micro_batches,
            training.dp,
            unit.1,
        );
    }
    a.levers.notes(training);
    // Said in every format, on stderr, so that JSON consumers see it too.
    if model.stack.is_none() {
        eprintln!(
            "note: GPU memory not counted: model {} gives no `layers` and `vocab`{}",
            model.name,
            if a.training.given() {
                " (--zero, --dp, --pp, --vp and --shard-dp change nothing)"
            } else {
                ""
            }
        );
    } else if hw.hbm_gb.is_none() {
        eprintln!(
            "note: GPU memory counted but not checked: hardware {} gives no `hbm_gb`",
            hw.name
        );
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    outln!(
        "{} GPUs per {}, split TP × CP · {} {} of {} · {} / {} · {} · pass {}{}{}{}{}{}",
        a.gpus,
        match wlb {
            Some(p) => format!(
                "WLB micro-batch (at most {} tokens; {} a step, from {}-token windows)",
                p.max_len, p.group, a.context
            ),
            None => format!("{}-token window", a.context),
        },
        windows.batches.len(),
        if wlb.is_some() {
            "micro-batch(es)"
        } else {
            "window(s)"
        },
        a.trace
            .as_ref()
            .map_or("the bundled trace".to_string(), |p| p.display().to_string()),
        hw.name,
        model.name,
        if a.mask == MaskArg::Full {
            "full"
        } else {
            "causal"
        },
        opts.pass.name(),
        recompute_words(a.recompute),
        if overlapped {
            " · TP collectives overlapped"
        } else {
            ""
        },
        memory_words(model.stack.map(|_| opts.training)),
        step_words(step),
        steps.map_or(String::new(), |n| format!(
            " · {}",
            plural(n as u32, "step", "steps")
        ))
    );
    out!("{}", table(&rows));
    // Counted: the model gives its layers; checked: the hardware its memory too.
    let checked = rows
        .iter()
        .any(|r| r.footprint.is_some_and(|f| f.fits.is_some()));
    match fastest_that_fits(&rows) {
        Some(fit) => {
            outln!(
                "\nFastest {}{}: {}, {}.",
                if step.is_some() { "step" } else { "layer" },
                if checked { " that fits in memory" } else { "" },
                at_split(fit),
                fit_words(fit)
            );
            for words in lever_words(fit) {
                outln!("  {words}");
            }
            if let Some(f) = &fit.footprint {
                outln!("  {}", footprint_words(f, fit.cp));
            }
            if best.overflows() {
                outln!(
                    "Faster, but it does not fit: {}, {}, {} on its fullest GPU.",
                    at_split(best),
                    time_words(best),
                    needs(best)
                );
            }
        }
        None => {
            outln!(
                "\nNo split fits in memory. The fastest, {} ({}), needs {} on its fullest GPU.",
                at_split(best),
                time_words(best),
                needs(best)
            );
            for words in lever_words(best) {
                outln!("  {words}");
            }
            if let Some(small) = smallest_footprint(&rows) {
                if let Some(f) = &small.footprint {
                    outln!(
                        "Closest: {}.\n  {}",
                        at_split(small),
                        footprint_words(f, small.cp)
                    );
                }
            }
            outln!("{}", to_fit(&opts));
        }
    }
    let per: Vec<String> = best_split_per_scheme(&rows, &schemes)
        .iter()
        .map(|(scheme, r)| match r {
            Some(r) => format!(
                "{scheme} TP {} × CP {} ({})",
                r.tp,
                r.cp,
                step_time_words(r)
                    .unwrap_or_else(|| format!("{:.3} ms", r.layer_time_ms.unwrap_or(0.0)))
            ),
            // Whether it ran anywhere (bug hunt: a scheme that ran at no split was said to fit
            // at none, as if memory were the reason).
            None if checked
                && rows
                    .iter()
                    .any(|r| &r.scheme == scheme && r.error.is_none()) =>
            {
                format!("{scheme} fits at none of the splits it ran at")
            }
            None => format!("{scheme} ran at no split"),
        })
        .collect();
    outln!("Each scheme's best split: {}.", per.join("; "));
    outln!(
        "Not in the times: {}; kernel tables are applied unchanged at 1/TP of the heads (docs/cost-model.md § Tensor parallelism). Not in the memory: the CUDA context, NCCL buffers and allocator fragmentation, a few GB (§ GPU memory).",
        match (step.is_some(), opts.training.gathers_weights() && model.stack.is_some()) {
            (true, _) => "the loss's element-wise work and the contention of pipeline traffic with CP's own, and of data-parallel and ZeRO 3 traffic with it inside a node (across nodes they share the NICs)",
            (false, true) => "ZeRO 3's gathers of the embedding and output layer (once a step) and its traffic's contention with CP's own inside a node (across nodes they share the NICs)",
            (false, false) => "the pipeline's bubble, the data-parallel gradient reduction and parameter all-gather and the optimizer step (once a step, after the last layer; --micro-batches prices them)",
        }
    );
    Ok(())
}

/// The packings `tpcp` takes: both cut the trace into `--context` windows that every split
/// sees alike (bug hunt: `--help` listed budget and carry, which it then refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TpCpPack {
    /// Fixed --context windows; the crossing document is truncated (FlashCP).
    Window,
    /// WLB-LLM: each step's --context windows repacked into micro-batches of equal work,
    /// outliers delayed.
    Wlb,
}

impl From<TpCpPack> for PackModeArg {
    fn from(p: TpCpPack) -> PackModeArg {
        match p {
            TpCpPack::Window => PackModeArg::Window,
            TpCpPack::Wlb => PackModeArg::Wlb,
        }
    }
}

/// What would shrink the footprint, from where `opts` stands: the levers not yet pulled all
/// the way.
fn to_fit(opts: &TpCpOptions) -> String {
    let t = opts.training;
    let shard = match t.zero {
        0 => "shard the model state over the replicas' GPUs (--zero 1 to 3, more --dp replicas)",
        1 | 2 if t.shard_dp.is_some() => {
            "shard more of it (--zero 3 shards the weights too) or over more replicas (a larger --shard-dp)"
        }
        1 | 2 => "shard more of it (--zero 3 shards the weights too) or over more --dp replicas",
        _ if t.shard_dp.is_some() => "shard over more of the replicas (a larger --shard-dp)",
        _ => "spread the shards over more --dp replicas",
    };
    let recompute = (opts.recompute != fcp::model::Recompute::Full)
        .then_some("recompute activations (--recompute full)");
    let levers: Vec<&str> = [
        recompute,
        Some("split the layers over more pipeline stages (--pp)"),
        (t.vp > 1).then_some("interleave fewer chunks a stage (a smaller --vp)"),
        Some(shard),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(
        "To fit: {}, or use more GPUs per window.",
        levers.join(", ")
    )
}

/// "T ms per layer", or "S ms a step" when a step was priced.
fn time_words(r: &TpCpRow) -> String {
    step_time_words(r)
        .unwrap_or_else(|| format!("{:.3} ms per layer", r.layer_time_ms.unwrap_or(0.0)))
}

/// "S ms a step", over several steps "S ms a step on the mean, M ms the slowest"; `None`
/// when no step was priced.
fn step_time_words(r: &TpCpRow) -> Option<String> {
    let f = r.priced.figures()?;
    Some(if f.steps > 1 {
        format!(
            "{:.1} ms a step on the mean, {:.1} ms the slowest",
            f.mean_step_ms, f.max_step_ms
        )
    } else {
        format!("{:.1} ms a step", f.mean_step_ms)
    })
}

/// The answer's figures for the row it names: its time and what of it is exposed
/// communication; under a step, the step's parts and its throughput.
fn fit_words(r: &TpCpRow) -> String {
    let layer = format!(
        "{:.3} ms per layer ({:.3} ms of it exposed TP collectives{})",
        r.layer_time_ms.unwrap_or(0.0),
        r.tp_comm_max_ms.unwrap_or(0.0),
        r.zero3_exposed_ms.map_or(String::new(), |z| format!(
            ", {z:.3} ms exposed ZeRO 3 collectives"
        ))
    );
    match (r.priced.slowest(), r.priced.figures()) {
        (Some(s), Some(f)) => format!(
            "{:.1} ms a step of {}{}, {} tokens/s per GPU\n  {} at {layer}; {}{}",
            f.mean_step_ms,
            plural(s.micro_batches, "micro-batch", "micro-batches"),
            if f.steps > 1 {
                format!(
                    " (the mean of {} steps; the slowest, step {} of {}, {:.1} ms)",
                    f.steps,
                    f.slowest_step + 1,
                    f.steps,
                    f.max_step_ms
                )
            } else {
                String::new()
            },
            rate(f.tokens_per_gpu_s),
            stage_words(s),
            if f.steps > 1 {
                "the slowest step: "
            } else {
                ""
            },
            step_parts(s, r.zero3_comm_ms.is_some())
        ),
        _ => layer,
    }
}

/// What the step's levers would save the row, where they save anything: its micro-batches
/// in the other order, its windows dealt to the replicas the other way.
fn lever_words(r: &TpCpRow) -> Vec<String> {
    let Some(s) = r.priced.figures() else {
        return Vec::new();
    };
    let l = r.levers;
    [
        (
            l.hill_step_ms,
            "In hill order (--micro-batch-order hill: lightest micro-batches first and last, heaviest in the middle) the same step takes",
            "fewer stalls in the pipeline",
        ),
        (
            l.stream_order_step_ms,
            "In the stream's order (--micro-batch-order stream) the same step takes",
            "the hill order stalls this pipeline more",
        ),
        (
            l.lpt_step_ms,
            "Dealt to the replicas LPT (--deal lpt: the heaviest window to the replica with least work) it takes",
            "less waiting for the slowest replica",
        ),
        (
            l.stream_deal_step_ms,
            "Dealt as streamed (--deal stream) it takes",
            "LPT's deal leaves a slower replica here",
        ),
    ]
    .into_iter()
    .filter_map(|(t, what, why)| {
        // Worth a line from 0.1 % (bug hunt: a 0.03 % saving read "0.0% less").
        let t = t.filter(|&t| t < s.mean_step_ms * 0.999)?;
        Some(format!(
            "{what} {t:.1} ms{}, {:.1}% less: {why}.",
            if s.steps > 1 { " on the mean" } else { "" },
            100.0 * (1.0 - t / s.mean_step_ms)
        ))
    })
    .collect()
}

/// "SCHEME at TP T × CP C", as the answer lines name a row.
fn at_split(r: &TpCpRow) -> String {
    format!("{} at TP {} × CP {}", r.scheme, r.tp, r.cp)
}

/// What a row's fullest GPU holds.
fn needs(r: &TpCpRow) -> String {
    human_bytes(r.footprint.map_or(0, |f| f.total_bytes))
}

/// One line per (split, scheme); a split or scheme that cannot run shows why.
fn table(rows: &[TpCpRow]) -> String {
    // Under ZeRO 3, a column for what the layer's weight gathers leave exposed.
    let zero3 = rows.iter().any(|r| r.zero3_exposed_ms.is_some());
    let z3 = |v: String| {
        if zero3 {
            format!(" {v:>8}")
        } else {
            String::new()
        }
    };
    // Under a priced step, its time, what data parallelism leaves exposed and throughput.
    let stepped = rows.iter().any(|r| r.priced.figures().is_some());
    // Several steps priced (`--steps`): their mean, the slowest beside it, and dp_ms their
    // mean.
    let multi = rows.iter().any(|r| r.priced.over_steps.is_some());
    let st = |step: String, max: String, dp: String, tok: String| match (stepped, multi) {
        (false, _) => String::new(),
        (true, false) => format!(" {step:>10} {dp:>8} {tok:>10}"),
        (true, true) => format!(" {step:>10} {max:>10} {dp:>8} {tok:>10}"),
    };
    let mut s = format!(
        "{:>4} {:>5}  {:<22} {:>10} {:>10} {:>8}{}{} {:>11} {:>13} {:>6} {:>11} {:>5}\n",
        "TP",
        "CP",
        "scheme",
        "attn_ms",
        "layer_ms",
        "tp_ms",
        z3("zero3_ms".into()),
        st(
            "step_ms".into(),
            "max_step".into(),
            "dp_ms".into(),
            "tok/s/GPU".into()
        ),
        "act/layer",
        "weights/layer",
        "MFU",
        "mem/GPU",
        "fits"
    );
    for r in rows {
        match (r.layer_time_ms, &r.error) {
            (Some(layer), None) => s.push_str(&format!(
                "{:>4} {:>5}  {:<22} {:>10.3} {:>10.3} {:>8.3}{}{} {:>11} {:>13} {:>5.1}% {:>11} {:>5}\n",
                r.tp,
                r.cp,
                r.scheme,
                r.attention_time_ms.unwrap_or(0.0),
                layer,
                r.tp_comm_max_ms.unwrap_or(0.0),
                z3(format!("{:.3}", r.zero3_exposed_ms.unwrap_or(0.0))),
                r.priced.figures().map_or(
                    st("-".into(), "-".into(), "-".into(), "-".into()),
                    |x| st(
                        format!("{:.1}", x.mean_step_ms),
                        format!("{:.1}", x.max_step_ms),
                        format!(
                            "{:.1}",
                            r.priced.all().map(|s| s.dp_exposed_ms).sum::<f64>()
                                / x.steps.max(1) as f64
                        ),
                        rate(x.tokens_per_gpu_s)
                    )
                ),
                human_bytes(r.act_max_bytes.unwrap_or(0)),
                human_bytes(r.weight_bytes_per_layer.unwrap_or(0)),
                100.0 * r.layer_mfu.unwrap_or(0.0),
                r.footprint
                    .map_or("-".to_string(), |f| human_bytes(f.total_bytes)),
                fits_word(r.footprint.as_ref())
            )),
            _ => s.push_str(&format!(
                "{:>4} {:>5}  {:<22} cannot run: {}\n",
                r.tp,
                r.cp,
                r.scheme,
                r.error.as_deref().unwrap_or("no result")
            )),
        }
    }
    s.push_str(&format!("(means over windows; layer = attention, projections, MLP and exposed TP collectives{}{}; act/layer on the fullest GPU; weights/layer the projection and MLP weights each GPU holds per layer{}; MFU of the layer; mem/GPU what the fullest GPU holds over a training step in the fullest window: weights, gradients, optimizer state, every layer's activations and the largest transient; fits: within the GPU's memory)\n",
        if zero3 {
            "; zero3_ms what ZeRO 3's per-layer collectives (weight gathers; in a backward pass the gradients' reduce-scatter too) leave exposed, in layer_ms too"
        } else {
            ""
        },
        if stepped {
            let steps = rows.iter().find_map(|r| r.priced.over_steps).map_or(1, |o| o.steps);
            format!("; step_ms a training step of the slowest replica: its micro-batches (the windows in turn, or as --deal dealt them) through a 1F1B pipeline of its stages ({} running the output layer; the bubble, stalls behind heavy windows and the sends between stages included){}, dp_ms, the data-parallel gradient reduction and weight gather it leaves exposed{}, and the optimizer step (Adam over the GPU's share of the parameters at the hardware's hbm_gbs); tok/s/GPU real tokens {} per GPU-second",
                match rows.iter().find_map(|r| r.priced.first().filter(|s| s.vp > 1)) {
                    Some(s) => format!("each stage's layers in {} interleaved chunks, the last stage's last chunk", s.vp),
                    None => "the last one".to_string(),
                },
                if multi && steps > 1 {
                    format!(", the mean of {steps} consecutive steps, each with its own windows; max_step the slowest of them")
                } else if multi {
                    ", one step priced; max_step the slowest of the steps priced (that one)".to_string()
                } else {
                    String::new()
                },
                if multi && steps > 1 { " on the mean" } else { "" },
                if multi && steps > 1 { "they train" } else { "a step trains" },
            )
        } else {
            String::new()
        },
        if zero3 {
            " (under ZeRO 3 gathered for each pass; between passes a shard of it)"
        } else {
            ""
        }
    ));
    s
}

/// Each distinct reason no split ran, with the splits it stopped, one line each (bug hunt:
/// only the first row's reason was given, which sent a user after TP when the other splits
/// failed for their CP degree).
fn why_none_ran(rows: &[fcp::study::tpcp::TpCpRow]) -> String {
    let mut reasons: Vec<(&str, Vec<String>)> = Vec::new();
    for r in rows {
        let why = r.error.as_deref().unwrap_or("no result");
        // A split refused before any scheme ran names none (`-`).
        let split = match r.scheme.as_str() {
            "-" => format!("TP {} × CP {}", r.tp, r.cp),
            s => format!("TP {} × CP {} {s}", r.tp, r.cp),
        };
        match reasons.iter_mut().find(|(w, _)| *w == why) {
            Some((_, splits)) => splits.push(split),
            None => reasons.push((why, vec![split])),
        }
    }
    if reasons.is_empty() {
        return "  no split to try".into();
    }
    reasons
        .iter()
        .map(|(why, splits)| format!("  {}: {why}", splits.join(", ")))
        .collect::<Vec<_>>()
        .join("\n")
}
