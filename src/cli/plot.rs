//! `fcp plot`: Gantt charts, sweep charts, trace CDFs and DP×CP curves (PNG or SVG).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};

use fcp::report::plot::{
    gantt, length_cdf, line_chart, sweep_chart, GanttOptions, LineChart, SweepAxis, YFormat,
};
use fcp::sim::Simulator;
use fcp::study::dpcp::DpcpRow;
use fcp::study::traces::TraceSpec;
use fcp::study::{load_results, CellResult};

use super::common::{
    layer_sim, load_verified_plan, profile_words, recompute_words, refuse_overwriting_input,
    PassArg, PlanProfileArgs, RecomputeArg,
};

/// Arguments of `fcp plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    #[command(subcommand)]
    kind: Kind,
}

#[derive(Debug, Subcommand)]
enum Kind {
    /// Per-rank timeline of one simulated plan: compute, send, receive, waiting, idle.
    Gantt(GanttArgs),
    /// Imbalance vs ranks, one line per scheme (FCP Fig. 9), from a sweep's results.json.
    Imbalance(ResultsArgs),
    /// Attention MFU vs ranks at fixed tokens per GPU (weak scaling, FCP Fig. 11).
    Scaling(ResultsArgs),
    /// A metric vs block size (FCP Fig. 12).
    Block(ResultsArgs),
    /// Any metric of a sweep against any axis.
    Lines(LinesArgs),
    /// Document-length CDF with cumulative shares of tokens and Σlen² (FCP Fig. 2).
    Cdf(CdfArgs),
    /// Straggler effect across DP groups vs CP, from `fcp dpcp`'s dpcp.json.
    Dpcp(DpcpPlotArgs),
}

#[derive(Debug, Args)]
struct GanttArgs {
    /// Plan file.
    plan: PathBuf,
    #[command(flatten)]
    profile: PlanProfileArgs,
    /// Passes: fwd, bwd, or both (training).
    #[arg(long, value_enum, default_value_t = PassArg::Both)]
    pass: PassArg,
    /// Output (.png or .svg).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Caption (default: scheme, ranks, profiles).
    #[arg(long, value_parser = parse_title)]
    title: Option<String>,
    /// Draw the whole layer: each rank's projections and MLP before and after its attention
    /// (as `fcp simulate --layer`).
    #[arg(long)]
    layer: bool,
    /// With `--layer`: what the backward pass recomputes (none, mlp, full; as
    /// `fcp simulate --recompute`); under `full` the rerun forward pass is drawn between
    /// the forward and the backward.
    #[arg(long, value_enum, requires = "layer")]
    recompute: Option<RecomputeArg>,
    /// With `--layer` under `--tp`: TP collectives overlap their GEMMs (as
    /// `fcp simulate --tp-overlap`).
    #[arg(long, requires = "layer")]
    tp_overlap: bool,
}

#[derive(Debug, Args)]
struct ResultsArgs {
    /// A sweep's results.json.
    results: PathBuf,
    /// Output (.png or .svg).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Metric (default: compute_imbalance for `imbalance`, mfu otherwise).
    #[arg(long)]
    metric: Option<String>,
    /// Statistic over each cell's batches.
    #[arg(long, value_enum, default_value_t = Stat::Mean)]
    stat: Stat,
    /// Keep only rows whose key field has this value (`trace=default`, `model=mha-16`);
    /// repeatable: values given for one key are alternatives (`--filter scheme=fcp --filter
    /// scheme=hybrid` keeps both), and every key named must hold.
    #[arg(long)]
    filter: Vec<String>,
    /// Plot speedup (this scheme's attention time / the row's) instead of a metric (so not
    /// with `--metric`, which it used to ignore).
    #[arg(long, conflicts_with = "metric")]
    speedup_vs: Option<String>,
    /// Caption.
    #[arg(long, value_parser = parse_title)]
    title: Option<String>,
}

#[derive(Debug, Args)]
struct LinesArgs {
    #[command(flatten)]
    common: ResultsArgs,
    /// X axis.
    #[arg(long, value_enum)]
    x: AxisArg,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AxisArg {
    Ranks,
    Block,
    TokensPerRank,
    Context,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Stat {
    Mean,
    P50,
    P95,
    Max,
}

#[derive(Debug, Args)]
struct CdfArgs {
    /// Trace: a file, `default`, or `gen:SOURCE[:k=v,...]` (as in study configs).
    #[arg(default_value = "default")]
    trace: String,
    /// For generated traces without `docs=`: generate at least this many tokens.
    #[arg(long, default_value_t = 50_000_000)]
    tokens: u64,
    /// Output (.png or .svg).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Caption.
    #[arg(long, value_parser = parse_title)]
    title: Option<String>,
}

#[derive(Debug, Args)]
struct DpcpPlotArgs {
    /// dpcp.json written by `fcp dpcp -o DIR`.
    results: PathBuf,
    /// Output (.png or .svg).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// What to plot: max_over_min, cv, spread, or step_time_ms.
    #[arg(long, default_value = "max_over_min")]
    metric: String,
    /// Caption.
    #[arg(long, value_parser = parse_title)]
    title: Option<String>,
}

/// A `--title` the figure can hold: no control characters, which an SVG cannot carry (bug
/// hunt: `--title $'a\x01b'` wrote an SVG no XML parser reads).
fn parse_title(s: &str) -> std::result::Result<String, String> {
    match s.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!(
            "holds the control character U+{:04X}, which a figure cannot show",
            c as u32
        )),
        None => Ok(s.to_string()),
    }
}

pub fn run(a: PlotArgs) -> Result<()> {
    match a.kind {
        Kind::Gantt(g) => run_gantt(g),
        Kind::Imbalance(r) => run_results(r, SweepAxis::Ranks, "compute_imbalance"),
        Kind::Scaling(r) => run_results(r, SweepAxis::Ranks, "mfu"),
        Kind::Block(r) => run_results(r, SweepAxis::Block, "mfu"),
        Kind::Lines(l) => {
            let axis = match l.x {
                AxisArg::Ranks => SweepAxis::Ranks,
                AxisArg::Block => SweepAxis::Block,
                AxisArg::TokensPerRank => SweepAxis::TokensPerRank,
                AxisArg::Context => SweepAxis::Context,
            };
            run_results(l.common, axis, "mfu")
        }
        Kind::Cdf(c) => run_cdf(c),
        Kind::Dpcp(d) => run_dpcp(d),
    }
}

fn run_gantt(a: GanttArgs) -> Result<()> {
    refuse_overwriting_input(&a.output, &[&a.plan])?;
    // A broken plan would be drawn as if it ran (`simulate` refuses it too).
    let plan = load_verified_plan(&a.plan)?;
    let (hw, model) = a.profile.load(&plan)?;
    let sim = layer_sim(
        Simulator::new(hw.clone(), model.clone())?,
        a.layer,
        a.recompute,
        a.tp_overlap,
    )?;
    let pass: fcp::sim::PassSel = a.pass.into();
    let (report, outcomes, pass_names) = if a.layer {
        let (report, layers) = sim.simulate_layer_traced(&plan, pass)?;
        let names = layers.iter().map(|l| l.label()).collect();
        (
            report,
            layers.into_iter().map(|l| l.outcome).collect(),
            names,
        )
    } else {
        let (report, outcomes) = sim.simulate_traced(&plan, pass)?;
        let names = pass.passes().iter().map(|p| p.to_string()).collect();
        (report, outcomes, names)
    };
    let title = a.title.unwrap_or_else(|| {
        let layer = report.metrics.layer.as_ref().map_or(String::new(), |l| {
            format!(
                " · layer {:.2} ms{}",
                l.layer_time_ms,
                recompute_words(a.recompute)
            )
        });
        format!(
            "{} · {} ranks · {} docs · {} · attention {:.2} ms{layer}",
            plan.scheme.name,
            plan.num_ranks,
            plan.documents.len(),
            profile_words(&hw, &model),
            report.metrics.attention_time_ms
        )
    });
    let opts = GanttOptions {
        title,
        pass_names,
        tp: a.layer && model.tp > 1,
    };
    gantt(&a.output, &outcomes, &opts)?;
    outln!("wrote {}", a.output.display());
    Ok(())
}

/// Metric names a sweep row carries, with their axis text and format.
fn metric_meta(metric: &str) -> (String, YFormat, bool) {
    match metric {
        "compute_imbalance" => (
            "compute imbalance (max − mean)/max".into(),
            YFormat::Percent,
            true,
        ),
        "comm_imbalance" => (
            "communication imbalance (max − mean)/max".into(),
            YFormat::Percent,
            true,
        ),
        "mfu" => ("attention MFU".into(), YFormat::Percent, true),
        "max_over_mean" => ("max / mean FLOPs per GPU".into(), YFormat::Times, false),
        "vs_lower_bound" => ("attention time / lower bound".into(), YFormat::Times, false),
        "attention_time_ms" => ("attention time (ms)".into(), YFormat::Plain, true),
        "lower_bound_ms" => ("lower bound (ms)".into(), YFormat::Plain, true),
        "comm_bytes_total" => ("bytes moved".into(), YFormat::Bytes, true),
        "mem_max_bytes" => ("peak attention memory".into(), YFormat::Bytes, true),
        "act_max_bytes" => (
            "activations one layer keeps, fullest rank".into(),
            YFormat::Bytes,
            true,
        ),
        other => (other.to_string(), YFormat::Plain, false),
    }
}

/// A key field of a cell as `--filter` compares it: strings bare, numbers as written, absent
/// (`null`) as the empty string.
fn key_field(key: &serde_json::Value, field: &str) -> String {
    match key.get(field) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Whether `row` passes `filters`: every key they name holds one of the values given for it
/// (bug hunt: `--filter scheme=A --filter scheme=B` asked for a row of both schemes, matched
/// none, and was refused as "no row has both a `ranks` value and mfu").
fn keep(row: &CellResult, filters: &[(String, String)]) -> Result<bool> {
    let v = serde_json::to_value(&row.key)?;
    Ok(filters.iter().all(|(k, _)| {
        let have = key_field(&v, k);
        filters.iter().any(|(k2, want)| k2 == k && &have == want)
    }))
}

/// Refuse a `--filter` that names no key field, or that no row matches, saying what the rows
/// hold. Both used to end in the same "no row has a value" message, which did not say that the
/// filter was the reason.
fn check_filters(
    rows: &[CellResult],
    filters: &[(String, String)],
    path: &std::path::Path,
) -> Result<()> {
    let keys = rows
        .iter()
        .map(|r| serde_json::to_value(&r.key))
        .collect::<Result<Vec<_>, _>>()?;
    let fields: Vec<String> = match keys.first() {
        Some(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => return Ok(()),
    };
    for (k, want) in filters {
        if !fields.contains(k) {
            bail!(
                "--filter `{k}={want}`: the rows of {} have no key `{k}` (keys: {})",
                path.display(),
                fields.join(", ")
            );
        }
        if !keys.iter().any(|key| &key_field(key, k) == want) {
            let seen: std::collections::BTreeSet<String> =
                keys.iter().map(|key| key_field(key, k)).collect();
            let mut seen: Vec<String> = seen.into_iter().collect();
            let more = seen.len().saturating_sub(12);
            seen.truncate(12);
            bail!(
                "--filter `{k}={want}`: no row of {} has {k} = `{want}` (values: {}{})",
                path.display(),
                seen.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

fn run_results(a: ResultsArgs, axis: SweepAxis, default_metric: &str) -> Result<()> {
    refuse_overwriting_input(&a.output, &[&a.results])?;
    let rows = load_results(&a.results)?;
    if rows.is_empty() {
        // Bug hunt: this blamed --filter when none was given.
        bail!(
            "{} has no rows: nothing to plot (a sweep writes one row per cell it ran)",
            a.results.display()
        );
    }
    let filters: Vec<(String, String)> = a
        .filter
        .iter()
        .map(|f| {
            f.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .with_context(|| format!("--filter `{f}` is not key=value"))
        })
        .collect::<Result<_>>()?;
    check_filters(&rows, &filters, &a.results)?;
    let mut kept = Vec::new();
    for r in rows {
        if keep(&r, &filters)? {
            kept.push(r);
        }
    }
    if kept.is_empty() {
        let all: Vec<String> = filters.iter().map(|(k, v)| format!("{k}={v}")).collect();
        bail!(
            "no row of {} passes every --filter together ({})",
            a.results.display(),
            all.join(", ")
        );
    }
    let metric = a.metric.clone().unwrap_or_else(|| default_metric.into());
    if !fcp::study::is_metric(&metric) {
        bail!(
            "unknown metric `{metric}` (known: {}; and with `layer = true` in the sweep: {}; with `tp` > 1 too: {}; with a `[memory]` table: {})",
            names(fcp::study::METRICS),
            names(fcp::study::LAYER_METRICS),
            names(fcp::study::TP_METRICS),
            names(fcp::study::MEMORY_METRICS)
        );
    }
    let pick = |r: &CellResult, m: &str| {
        r.metrics.get(m).map(|g| match a.stat {
            Stat::Mean => g.mean,
            Stat::P50 => g.p50,
            Stat::P95 => g.p95,
            Stat::Max => g.max,
        })
    };
    let (y_label, y_format, from_zero, series) = match &a.speedup_vs {
        Some(base) => {
            // No baseline row, no speedup: say so, not "no row has mfu" (the metric was
            // never asked for).
            if !kept
                .iter()
                .any(|r| &r.key.scheme == base && r.error.is_none())
            {
                let mut schemes: Vec<&str> = kept
                    .iter()
                    .filter(|r| r.error.is_none())
                    .map(|r| r.key.scheme.as_str())
                    .collect();
                schemes.sort_unstable();
                schemes.dedup();
                bail!(
                    "--speedup-vs {base}: no row of {}{} ran {base} (schemes there: {})",
                    a.results.display(),
                    if filters.is_empty() {
                        ""
                    } else {
                        " left by --filter"
                    },
                    if schemes.is_empty() {
                        "none".to_string()
                    } else {
                        schemes.join(", ")
                    }
                );
            }
            let same_cell = |x: &CellResult, r: &CellResult| {
                let (p, q) = (&x.key, &r.key);
                p.trace == q.trace
                    && p.ranks == q.ranks
                    && p.tokens_per_rank == q.tokens_per_rank
                    && p.context == q.context
                    && p.hardware == q.hardware
                    && p.model == q.model
            };
            let value = |r: &CellResult| {
                let b = kept
                    .iter()
                    .find(|x| &x.key.scheme == base && same_cell(x, r))?;
                Some(pick(b, "attention_time_ms")? / pick(r, "attention_time_ms")?)
            };
            (
                format!("speedup over {base} (attention time)"),
                YFormat::Times,
                true,
                sweep_chart(&kept, axis, &value),
            )
        }
        None => {
            let (label, fmt, zero) = metric_meta(&metric);
            let value = |r: &CellResult| pick(r, &metric);
            (label, fmt, zero, sweep_chart(&kept, axis, &value))
        }
    };
    if series.is_empty() {
        bail!(
            "no row of {} has both a `{}` value and {}",
            a.results.display(),
            axis.flag(),
            if a.speedup_vs.is_some() {
                "a speedup"
            } else {
                metric.as_str()
            }
        );
    }
    let stat = match a.stat {
        Stat::Mean => "mean",
        Stat::P50 => "p50",
        Stat::P95 => "p95",
        Stat::Max => "max",
    };
    let title = a.title.unwrap_or_else(|| {
        format!(
            "{} vs {} ({stat} over batches)",
            y_label,
            axis.label().split(" (").next().unwrap_or("x")
        )
    });
    let chart = LineChart {
        title,
        x_label: axis.label().into(),
        y_label,
        x_log2: true,
        x_tokens: matches!(
            axis,
            SweepAxis::Block | SweepAxis::Context | SweepAxis::TokensPerRank
        ),
        y_format,
        y_from_zero: from_zero,
        markers: true,
        series,
    };
    line_chart(&a.output, &chart)?;
    outln!("wrote {}", a.output.display());
    Ok(())
}

fn run_cdf(a: CdfArgs) -> Result<()> {
    refuse_overwriting_input(&a.output, &[std::path::Path::new(&a.trace)])?;
    let spec = TraceSpec::parse(&a.trace)?;
    let trace = spec.load(a.tokens)?;
    let lens = trace.lens();
    let title = a.title.unwrap_or_else(|| {
        format!(
            "{} · {} documents · {:.1}M tokens",
            a.trace,
            lens.len(),
            trace.tokens() as f64 / 1e6
        )
    });
    length_cdf(&a.output, &lens, &title)?;
    outln!("wrote {}", a.output.display());
    Ok(())
}

fn run_dpcp(a: DpcpPlotArgs) -> Result<()> {
    refuse_overwriting_input(&a.output, &[&a.results])?;
    let text = fcp::input::read_text(&a.results, "a dpcp.json", false)
        .with_context(|| format!("reading {}", a.results.display()))?;
    let rows: Vec<DpcpRow> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a dpcp.json", a.results.display()))?;
    // Regression (bug hunt): a whole-layer study's times were labelled attention time.
    let time = if rows.iter().any(|r| r.layer) {
        "whole-layer time"
    } else {
        "attention time"
    };
    let (label, fmt): (String, YFormat) = match a.metric.as_str() {
        "max_over_min" => (format!("max / min {time} across DP groups"), YFormat::Times),
        "cv" => (format!("CV of {time} across DP groups"), YFormat::Percent),
        "spread" => (
            "(max − min) / mean across DP groups".into(),
            YFormat::Percent,
        ),
        "step_time_ms" => (format!("step {time}: slowest group (ms)"), YFormat::Plain),
        o => bail!("unknown metric `{o}` (max_over_min, cv, spread, step_time_ms)"),
    };
    let series = fcp::study::dpcp::series(&rows, &a.metric);
    let title = a
        .title
        .unwrap_or_else(|| format!("{label} vs CP (fixed global batch)"));
    let chart = LineChart {
        title,
        x_label: "CP degree (ranks per DP group)".into(),
        y_label: label,
        x_log2: true,
        x_tokens: false,
        y_format: fmt,
        y_from_zero: a.metric != "max_over_min",
        markers: true,
        series,
    };
    line_chart(&a.output, &chart)?;
    outln!("wrote {}", a.output.display());
    Ok(())
}

/// The names of a metric table, comma-separated.
fn names<F>(table: &[(&str, F)]) -> String {
    table.iter().map(|(m, _)| *m).collect::<Vec<_>>().join(", ")
}
