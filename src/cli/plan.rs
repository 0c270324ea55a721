//! `fcp plan`: plan one batch (or all) with one scheme and write plan files.

use super::trace::WlbHints;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use fcp::plan::{summarize, Plan};
use fcp::planners::{planner_for, SchemeError, SchemeSpec};

use super::common::{bytes, judge, receivers, BatchArgs, PassArg, ProfileArgs, RecomputeArg};

/// Arguments of `fcp plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Scheme, optionally with parameters: `zigzag`, `fcp:block=2048,coalesce=8`.
    #[arg(long)]
    scheme: String,
    #[command(flatten)]
    batch: BatchArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Batch to plan (index into the packed trace).
    #[arg(
        long = "batch",
        visible_alias = "batch-index",
        default_value_t = 0,
        conflicts_with = "all_batches"
    )]
    batch_index: usize,
    /// Plan every batch; `-o` is then a directory that receives `batch-NNNNN.json` files.
    #[arg(long)]
    all_batches: bool,
    /// Output plan file (`-` for stdout), or directory with `--all-batches`.
    #[arg(short, long)]
    output: PathBuf,
    /// Passes the plan is for: both (training, the default), fwd (inference) or bwd. Schemes
    /// that choose among candidates by simulating them (`auto`, `hybrid`, and `fcp`'s
    /// head-parallel nodes merging tiles) judge by these passes and record them as
    /// `objective_pass`; every other scheme plans alike for all three.
    #[arg(long, value_enum, default_value_t = PassArg::Both)]
    pass: PassArg,
    /// What the backward pass recomputes (none, mlp, full), as `fcp simulate --recompute`: the
    /// whole layer `auto` and `hybrid` judge recomputes so too. Other schemes ignore it.
    #[arg(long, value_enum)]
    recompute: Option<RecomputeArg>,
    /// TP collectives overlap their GEMMs in the whole layer `auto` and `hybrid` judge, as
    /// `fcp simulate --tp-overlap`. Other schemes ignore it.
    #[arg(long)]
    tp_overlap: bool,
    #[command(flatten)]
    switches: FcpSwitches,
}

/// Scheme switches as flags (FCP's, issue 5; FlashCP's target, issue 6); each adds or
/// overrides a parameter of the scheme entry, and a scheme that does not take that parameter
/// refuses it.
#[derive(Debug, Args)]
struct FcpSwitches {
    /// Block size in tokens (`block=`).
    #[arg(long)]
    block: Option<u64>,
    /// Sub-stages merged per stage (`coalesce=`).
    #[arg(long)]
    coalesce: Option<u32>,
    /// Block-level pipelining off (`pipeline=false`).
    #[arg(long)]
    no_pipeline: bool,
    /// Congestion-free solver off (`solver=false`).
    #[arg(long)]
    no_solver: bool,
    /// Bottom-up coalescer off (`coalescer=false`).
    #[arg(long)]
    no_coalesce: bool,
    /// Transparent reshuffler off (`reshuffle=false`, FCP's default).
    #[arg(long, conflicts_with = "reshuffle")]
    no_reshuffle: bool,
    /// Transparent reshuffler on (`reshuffle=true`): the plan starts from the user's
    /// contiguous layout and pays two all-to-alls (FCP §4.3).
    #[arg(long)]
    reshuffle: bool,
    /// FCP's traffic repair off (`repair=false`).
    #[arg(long)]
    no_repair: bool,
    /// FlashCP's target imbalance ratio R (`target_imbalance=`, default 1.05).
    #[arg(long)]
    target_imbalance: Option<f64>,
    /// `auto`'s planning-time budget in milliseconds (`budget_ms=`; 0 = none): the quick
    /// `hybrid` search first, then only candidates the time left is expected to cover,
    /// compared by estimate instead of simulation.
    #[arg(long)]
    budget_ms: Option<u64>,
}

impl FcpSwitches {
    /// `(flag, key=value)` for every flag given.
    fn params(&self) -> Vec<(&'static str, String)> {
        let mut p = Vec::new();
        if let Some(b) = self.block {
            p.push(("--block", format!("block={b}")));
        }
        if let Some(c) = self.coalesce {
            p.push(("--coalesce", format!("coalesce={c}")));
        }
        if let Some(r) = self.target_imbalance {
            p.push(("--target-imbalance", format!("target_imbalance={r}")));
        }
        if let Some(ms) = self.budget_ms {
            p.push(("--budget-ms", format!("budget_ms={ms}")));
        }
        for (on, flag, kv) in [
            (self.no_pipeline, "--no-pipeline", "pipeline=false"),
            (self.no_solver, "--no-solver", "solver=false"),
            (self.no_coalesce, "--no-coalesce", "coalescer=false"),
            (self.no_reshuffle, "--no-reshuffle", "reshuffle=false"),
            (self.reshuffle, "--reshuffle", "reshuffle=true"),
            (self.no_repair, "--no-repair", "repair=false"),
        ] {
            if on {
                p.push((flag, kv.to_string()));
            }
        }
        p
    }

    /// The scheme entry with the flags' parameters added. A flag overrides the parameter the
    /// entry gives (`docs/schemes/fcp.md`), and says so on stderr (`--scheme fcp:block=512
    /// --block 1024` used to plan with 1024 without a word); a flag's error says whether the
    /// scheme does not take it or its value is wrong (`--block 0` was told "--block does not
    /// apply to `fcp`").
    fn apply(&self, scheme: &str) -> Result<String> {
        let mut entry = SchemeSpec::parse(scheme)?;
        for (flag, kv) in self.params() {
            let (key, value) = kv.split_once('=').expect("flags give key=value");
            if let Some(given) = entry.get(key).filter(|given| *given != value) {
                eprintln!("note: {flag} overrides `{key}={given}` in --scheme {scheme}");
            }
            entry.set(key, value);
            if let Err(e) = planner_for(&entry.to_string()) {
                if matches!(e, SchemeError::NotTaken { .. }) {
                    bail!("{flag} does not apply to `{scheme}`: {e}");
                }
                bail!("{flag}: {e}");
            }
        }
        Ok(entry.to_string())
    }
}

pub fn run(a: PlanArgs) -> Result<()> {
    if a.all_batches && a.output.as_os_str() == "-" {
        bail!("--all-batches writes one file per batch into a directory; `-o -` (stdout) takes one plan");
    }
    if let Some(t) = &a.batch.trace {
        super::common::refuse_overwriting_input(&a.output, &[t])?;
    }
    let scheme = a.switches.apply(&a.scheme)?;
    let planner = planner_for(&scheme)?;
    let (hw, model) = a.profile.load()?;
    // One batch holds that batch only, not those before it (bug hunt: `--batch K` held K + 1).
    let (skip, keep) = if a.all_batches {
        (0, usize::MAX)
    } else {
        (a.batch_index, a.batch_index.saturating_add(1))
    };
    let packed = a.batch.load_from(skip, keep, WlbHints::new(&model, None))?;
    let ctx = fcp::planners::PlanContext {
        judge: judge(a.pass, true, a.recompute, a.tp_overlap),
        ..a.batch.ctx(&hw, &model)
    };
    let chosen: Vec<_> = if a.all_batches {
        packed.batches.iter().collect()
    } else {
        vec![packed.pick(a.batch_index)?]
    };
    // Plan everything before writing anything, so a failure leaves no output behind.
    let plans: Vec<Plan> = chosen
        .iter()
        .map(|b| {
            let mut p = planner
                .plan(b, &ctx)
                .with_context(|| format!("planning batch {}", b.index))?;
            a.profile.record_files(&mut p);
            Ok(p)
        })
        .collect::<Result<_>>()?;
    packed.note_cuts(chosen.iter().map(|b| b.index));
    if a.all_batches {
        let name = |p: &Plan| format!("batch-{:05}.json", p.batch_index.unwrap_or(0));
        // Every path checked before any is written. Regression: a trace named like a plan
        // (`pd/batch-00000.json`) was replaced by its own plan.
        if let Some(t) = &a.batch.trace {
            for p in &plans {
                super::common::refuse_overwriting_input(&a.output.join(name(p)), &[t])?;
            }
        }
        // All or nothing: a plan that cannot be written leaves none of the others behind.
        fcp::output::write_all_atomic(
            &a.output,
            plans
                .iter()
                .map(|p| (a.output.join(name(p)), p.to_json().into_bytes())),
        )
        .with_context(|| format!("writing plans to {}", a.output.display()))?;
        eprintln!(
            "wrote {} ({}) to {}",
            plural(plans.len(), "plan"),
            scheme,
            a.output.display()
        );
        // Plans of an earlier run with more batches stay (they are the user's files), but a
        // directory that mixes two runs is said so. Regression: it was silent.
        let written: std::collections::BTreeSet<String> = plans.iter().map(name).collect();
        let stale = earlier_plans(&a.output, &written);
        if !stale.is_empty() {
            let shown: Vec<&str> = stale.iter().take(3).map(String::as_str).collect();
            eprintln!(
                "note: {} also holds {} this run did not write ({}{}), from an earlier run",
                a.output.display(),
                plural(stale.len(), "plan file"),
                shown.join(", "),
                if stale.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            );
        }
    } else {
        let p = &plans[0];
        if a.output.as_os_str() == "-" {
            out!("{}", p.to_json());
        } else {
            p.save(&a.output)?;
        }
        let s = summarize(p, &model);
        // Schemes that record the K/V they avoid sending (FlashCP's 1 − Eq5/Eq4) say so.
        let saving = p
            .scheme
            .params
            .get("comm_saving")
            .and_then(|v| v.as_f64())
            .map_or(String::new(), |x| {
                format!(" · comm_saving {:.1}%", 100.0 * x)
            });
        // Schemes that choose per batch (`hybrid`, `auto`) say what they chose, and for what.
        let chosen: String = p
            .scheme
            .params
            .iter()
            .filter(|(k, _)| k.starts_with("chosen") || *k == "objective")
            .map(|(k, v)| format!(" · {k} {}", v.as_str().map_or(v.to_string(), String::from)))
            .collect();
        eprintln!(
            "{}: batch {} · {} docs · {} tokens on {} ranks · {} steps · {} tasks · {} transfers{} ({}) · FLOPs max/mean {:.3}{}{}",
            a.output.display(),
            p.batch_index.unwrap_or(0),
            s.docs,
            s.tokens,
            s.ranks,
            s.steps,
            s.tasks,
            s.transfers,
            receivers(p),
            bytes(s.comm_bytes_total),
            s.max_over_mean,
            saving,
            chosen
        );
    }
    Ok(())
}

/// `n` and `noun`, plural when `n` is not 1.
fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Names of the `batch-NNNNN.json` files in `dir` that are not in `written`, sorted.
fn earlier_plans(
    dir: &std::path::Path,
    written: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut stale: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("batch-")
                .and_then(|r| r.strip_suffix(".json"))
                .is_some_and(|d| d.len() == 5 && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|n| !written.contains(n))
        .collect();
    stale.sort();
    stale
}
