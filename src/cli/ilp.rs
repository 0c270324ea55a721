//! `fcp ilp`: a scheme's heuristic next to its exact ILP on one batch (issue 7).

use super::trace::WlbHints;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use fcp::ilp::{self, Mode, Options, Report};
use fcp::planners::Fcp;

use super::common::{BatchArgs, ProfileArgs};

/// Schemes with an ILP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IlpScheme {
    /// FlashCP's §3.4 ILP over document pieces.
    Flashcp,
    /// FCP's block assignment.
    Fcp,
}

/// What the ILP minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// imbalance + λ · comm.
    Objective,
    /// comm subject to imbalance ≤ --target-imbalance.
    MinComm,
}

/// Arguments of `fcp ilp`.
#[derive(Debug, Args)]
pub struct IlpArgs {
    /// Scheme whose heuristic is cross-checked.
    #[arg(long, value_enum)]
    scheme: IlpScheme,
    #[command(flatten)]
    batch: BatchArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Batch to solve (index into the packed trace).
    #[arg(long = "batch", default_value_t = 0)]
    batch_index: usize,
    /// FlashCP: cut documents at multiples of this many tokens (plus the heuristic's cuts)
    /// [default: 1024]. Refused with `--scheme fcp`, whose cuts are its blocks.
    #[arg(long)]
    granularity: Option<u64>,
    /// Weight of the comm term: the most K/V tokens a rank exchanges, over ⌈C/N⌉ tokens
    /// (flashcp) or the token cap a rank may hold (fcp; docs/ilp.md).
    #[arg(long, default_value_t = 0.1)]
    lambda: f64,
    /// `objective`: imbalance + λ·comm; `min-comm`: comm s.t. imbalance ≤ R.
    #[arg(long, value_enum, default_value_t = ModeArg::Objective)]
    mode: ModeArg,
    /// R: FlashCP's heuristic target and min-comm's constraint.
    #[arg(long, default_value_t = 1.05)]
    target_imbalance: f64,
    /// Seconds before the search returns its best plan with its gap (`inf`, or any limit too
    /// large to hold, means none; with either solver).
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
    /// FCP: block size in tokens [default: 4096]. Refused with `--scheme flashcp`.
    #[arg(long)]
    block: Option<u64>,
    /// Solve with good_lp's microlp MILP instead of the branch and bound (measurement only:
    /// microlp reports no bound; a time-out keeps the better of its incumbent and the
    /// heuristic's plan). Its model is built before the time limit starts: one of more than
    /// a million variables is refused.
    #[arg(long)]
    microlp: bool,
    /// Write the ILP's plan here (`-`: to stdout, the report then to stderr).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The largest `--lambda` accepted.
const MAX_LAMBDA: f64 = 1e6;

pub fn run(a: IlpArgs) -> Result<()> {
    if a.time_limit.is_nan() || a.time_limit < 0.0 || !a.lambda.is_finite() || a.lambda < 0.0 {
        bail!("--time-limit and --lambda must be numbers ≥ 0");
    }
    // The comm term is a fraction of a rank's tokens and the imbalance about 1: a weight past a
    // million already ignores the imbalance, and past ~1e300 overflowed microlp's pivoting
    // (bug hunt: `--lambda 1e308` panicked).
    if a.lambda > MAX_LAMBDA {
        bail!("--lambda {} is more than {MAX_LAMBDA:e}: past that the imbalance term no longer counts (use --mode min-comm to minimise communication alone)", a.lambda);
    }
    if a.target_imbalance.is_nan() || a.target_imbalance < 1.0 {
        bail!("--target-imbalance must be ≥ 1");
    }
    // An option of the other scheme was silently ignored (bug hunt: `--scheme fcp
    // --granularity 0` ran).
    match (a.scheme, a.granularity, a.block) {
        (IlpScheme::Fcp, Some(_), _) => {
            bail!("--granularity applies to --scheme flashcp; FCP cuts documents at its --block")
        }
        (IlpScheme::Flashcp, _, Some(_)) => {
            bail!("--block applies to --scheme fcp; FlashCP cuts at --granularity")
        }
        _ => {}
    }
    let to_stdout = a.output.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if to_stdout && a.json {
        bail!("`-o -` writes the plan to stdout, where --json would print the report too; write the plan to a file");
    }
    if let (Some(out), Some(t), false) = (&a.output, &a.batch.trace, to_stdout) {
        super::common::refuse_overwriting_input(out, &[t])?;
    }
    let (hw, model) = a.profile.load()?;
    let packed = a.batch.load_from(
        a.batch_index,
        a.batch_index.saturating_add(1),
        WlbHints::new(&model, None),
    )?;
    let batch = packed.pick(a.batch_index)?;
    packed.note_cuts([a.batch_index]);
    let ctx = a.batch.ctx(&hw, &model);
    let opts = Options {
        granularity: a.granularity.unwrap_or(Options::default().granularity),
        lambda: a.lambda,
        mode: match a.mode {
            ModeArg::Objective => Mode::Objective,
            ModeArg::MinComm => Mode::MinComm,
        },
        target_imbalance: a.target_imbalance,
        time_limit: a.time_limit,
        microlp: a.microlp,
    };
    let mut r: Report = match a.scheme {
        IlpScheme::Flashcp => ilp::flashcp::solve(batch, &ctx, &opts)?,
        IlpScheme::Fcp => {
            // Through the scheme's own parser, so `--block` is checked as `plan` checks it.
            let block = a.block.unwrap_or(fcp::planners::fcp::DEFAULT_BLOCK);
            let spec = fcp::planners::SchemeSpec::parse(&format!("fcp:block={block}"))?;
            let f = Fcp::from_spec(&spec).map_err(|e| anyhow::anyhow!("--block: {e}"))?;
            ilp::fcp::solve(&f, batch, &ctx, &opts)?
        }
    };
    a.profile.record_files(&mut r.plan);
    // `-o -` writes the plan to stdout, as `fcp plan -o -` does (bug hunt: it wrote a file
    // named `-`).
    match &a.output {
        Some(_) if to_stdout => out!("{}", r.plan.to_json()),
        Some(path) => r.plan.save(path)?,
        None => {}
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    use std::fmt::Write as _;
    let mut text = String::new();
    let num = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.4}"));
    let (h, i) = (&r.heuristic, &r.ilp);
    writeln!(
        text,
        "batch {} · {} docs · {} items · mode {} · λ {} · R {}",
        a.batch_index,
        batch.doc_lens.len(),
        i.items,
        match r.mode {
            Mode::Objective => "objective",
            Mode::MinComm => "min-comm",
        },
        r.lambda,
        r.target_imbalance
    )?;
    writeln!(text, "{:<12} {:>10} {:>10}", "", "heuristic", "ilp")?;
    writeln!(
        text,
        "{:<12} {:>10.4} {:>10.4}",
        "imbalance", h.imbalance, i.imbalance
    )?;
    writeln!(
        text,
        "{:<12} {:>9.1}% {:>9.1}%",
        "comm saving",
        100.0 * h.comm_saving,
        100.0 * i.comm_saving
    )?;
    writeln!(
        text,
        "{:<12} {:>10} {:>10}",
        "objective",
        num(h.objective),
        num(i.objective)
    )?;
    // Infinite when proven infeasible: printed as `-`, as JSON prints `null`.
    writeln!(
        text,
        "{:<12} {:>10} {:>10}",
        "best bound",
        "",
        num(Some(i.bound).filter(|b| b.is_finite()))
    )?;
    writeln!(
        text,
        "{:<12} {:>10} {:>10}",
        "gap",
        "",
        i.gap
            .map_or("-".to_string(), |g| format!("{:.4}%", 100.0 * g))
    )?;
    writeln!(text, "{:<12} {:>10} {:>10}", "status", "", i.status.label())?;
    writeln!(text, "{:<12} {:>10} {:>10.3}", "solve s", "", i.solve_s)?;
    for n in &r.notes {
        writeln!(text, "note: {n}")?;
    }
    // With `-o -` the plan is on stdout, so the report goes to stderr, as `fcp plan` does.
    if to_stdout {
        eprint!("{text}");
    } else {
        out!("{text}");
    }
    Ok(())
}
