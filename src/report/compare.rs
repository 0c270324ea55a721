//! Plan and simulate several schemes on the same batches, side by side.

use rayon::prelude::*;
use serde::Serialize;

use crate::planners::{planner_for, PlanContext, SchemeError, SCHEMES};
use crate::sim::step::{MicroBatch, StepMetrics, StepOptions};
use crate::sim::{LayerMetrics, PlanMetrics, SimError, Simulator};
use crate::trace::Batch;

use super::stats::{mean, percentile};

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Scheme entries as given (`ring`, `fcp:block=2048,coalesce=8`).
    pub schemes: Vec<String>,
    /// Entry the speedup column is measured against (default: the first).
    pub baseline: Option<String>,
    /// Run the structural verifier on every plan first; an invalid plan turns its scheme's row
    /// into an error instead of reporting numbers for work that is not attention.
    pub verify: bool,
}

/// One scheme's results over the batches: means of every plan metric, their 95th percentiles,
/// and the speedup against the baseline. A scheme that cannot run a batch keeps its row, with
/// the reason in `error`, so one bad scheme never stops a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareRow {
    /// The entry as given.
    pub scheme: String,
    /// Batches simulated.
    pub batches: usize,
    /// Means over batches.
    #[serde(flatten)]
    pub mean: Option<PlanMetrics>,
    /// 95th percentiles over batches.
    pub p95: Option<PlanMetrics>,
    /// Baseline mean attention time / this scheme's mean attention time.
    pub speedup: Option<f64>,
    /// Baseline mean whole-layer time / this scheme's, when the layer was simulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_speedup: Option<f64>,
    /// Mean over batches of the plans' `comm_saving` parameter (FlashCP's `1 − Eq5/Eq4`), for
    /// schemes that record one; absent otherwise. Read from the plan, not the simulation, so any
    /// scheme can report the K/V it avoids sending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm_saving: Option<f64>,
    /// Why the scheme produced no result.
    pub error: Option<String>,
    /// Tensor-parallel degree the model was split by (`--tp`); absent when 1.
    #[serde(skip_serializing_if = "crate::tp::is_one")]
    pub tp: u32,
    /// Every batch's whole-layer metrics, in batch order, when the layer was simulated:
    /// what a training step over the batches is priced from ([`crate::sim::step`]). Not in
    /// the JSON, which carries the means and percentiles.
    #[serde(skip)]
    pub layers: Vec<LayerMetrics>,
    /// The training step(s) [`price_steps`] priced over the batches; empty otherwise.
    #[serde(flatten)]
    pub priced: PricedSteps,
}

/// The training step(s) a row priced over its batches: one step (`step`), or several
/// consecutive ones (`steps`, with `over_steps`, what they add up to). Shared by `compare`'s
/// and `tpcp`'s rows so that both price, rank and print steps alike, under the same JSON keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PricedSteps {
    /// The training step over the batches, each a micro-batch in batch order, when one was
    /// priced; absent otherwise (and when several were: `steps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepMetrics>,
    /// Each of several consecutive training steps priced, in order (`--steps`); empty
    /// otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepMetrics>,
    /// What the `steps` add up to; absent unless they were priced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_steps: Option<StepsSummary>,
}

impl PricedSteps {
    /// Price a training step of `opts` over `drawn` (micro-batches in stream order) on `cp`
    /// ranks; with `steps`, `drawn` is that many consecutive steps' windows, an equal share
    /// each (the caller hands over `steps` × the step's windows), each priced on its own
    /// into `steps` and `over_steps` (even one step, so that the output's shape follows the
    /// question, not how many steps the trace held).
    pub fn price(
        sim: &Simulator,
        drawn: &[MicroBatch],
        cp: u32,
        opts: StepOptions,
        steps: Option<usize>,
    ) -> Result<PricedSteps, SimError> {
        Ok(match steps.filter(|&s| s > 0) {
            Some(steps) => {
                let per = drawn.len().div_ceil(steps).max(1);
                let steps = drawn
                    .chunks(per)
                    .map(|windows| sim.step(windows, cp, opts))
                    .collect::<Result<Vec<_>, _>>()?;
                PricedSteps {
                    over_steps: StepsSummary::of(&steps),
                    step: None,
                    steps,
                }
            }
            None => PricedSteps {
                step: Some(sim.step(drawn, cp, opts)?),
                ..Default::default()
            },
        })
    }

    /// The step columns' figures: over several steps their [`StepsSummary`], over one its
    /// own (mean and slowest alike); `None` when no step was priced.
    pub fn figures(&self) -> Option<StepsSummary> {
        self.over_steps
            .or_else(|| self.step.and_then(|s| StepsSummary::of(&[s])))
    }

    /// The step's settings (micro-batches, order, deal), alike in every step priced.
    pub fn first(&self) -> Option<&StepMetrics> {
        self.step.as_ref().or(self.steps.first())
    }

    /// The slowest step priced (the one step, when there is one): the one whose parts say
    /// where a stretch of training loses its time.
    pub fn slowest(&self) -> Option<&StepMetrics> {
        match self.over_steps {
            Some(o) => self.steps.get(o.slowest_step),
            None => self.step.as_ref(),
        }
    }

    /// Every step priced, in order.
    pub fn all(&self) -> impl Iterator<Item = &StepMetrics> {
        self.step.iter().chain(&self.steps)
    }
}

/// Consecutive training steps taken together: a step's own figures change from one step to
/// the next with the documents it draws (a step whose windows hold the long documents is the
/// slow one), so throughput is judged over a stretch of training, and the slowest step is
/// what a straggler alarm sees.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepsSummary {
    /// Steps priced.
    pub steps: usize,
    /// Mean step time, ms.
    pub mean_step_ms: f64,
    /// The slowest step's time, ms.
    pub max_step_ms: f64,
    /// Which step that was, from 0 (the first of the stretch priced).
    pub slowest_step: usize,
    /// Real tokens of every step per GPU-second of all of them: each step's rate weighed by
    /// its time, not a mean of rates (a mean of rates overweighs the quick steps).
    pub tokens_per_gpu_s: f64,
}

impl StepsSummary {
    /// The summary of `steps` (in order); `None` when there are none.
    pub fn of(steps: &[StepMetrics]) -> Option<StepsSummary> {
        let total: f64 = steps.iter().map(|s| s.step_ms).sum();
        let (slowest, max) = steps
            .iter()
            .enumerate()
            // The first of equals, so the answer does not depend on float ties' order.
            .fold(None, |best: Option<(usize, f64)>, (i, s)| match best {
                Some((_, m)) if m >= s.step_ms => best,
                _ => Some((i, s.step_ms)),
            })?;
        let trained: f64 = steps.iter().map(|s| s.tokens_per_gpu_s * s.step_ms).sum();
        Some(StepsSummary {
            steps: steps.len(),
            mean_step_ms: total / steps.len() as f64,
            max_step_ms: max,
            slowest_step: slowest,
            // One step's own rate as it is (the weighing could round it off by an ulp).
            tokens_per_gpu_s: match steps {
                [one] => one.tokens_per_gpu_s,
                _ if total > 0.0 => trained / total,
                _ => 0.0,
            },
        })
    }
}

/// Expand `all` and split a comma-separated list whose entries may carry `key=value`
/// parameters: a token with `=` and no `:` continues the previous entry's parameters, so
/// `ring,fcp:block=2048,coalesce=8,zigzag` is three entries. An empty entry (`ring,,zigzag`,
/// a trailing comma) is refused, naming its position: a scheme left out by mistake would
/// otherwise drop out of the comparison unseen. A list with no entry at all (`""`, `,`)
/// yields nothing, for the caller to refuse as listing no scheme.
pub fn parse_scheme_list(lists: &[String]) -> Result<Vec<String>, SchemeError> {
    let mut out: Vec<String> = Vec::new();
    for list in lists {
        let toks: Vec<&str> = list.split(',').map(str::trim).collect();
        if toks.iter().all(|t| t.is_empty()) {
            continue;
        }
        if let Some(i) = toks.iter().position(|t| t.is_empty()) {
            return Err(SchemeError::EmptyEntry {
                list: list.clone(),
                position: i + 1,
            });
        }
        for tok in toks {
            if tok == "all" {
                out.extend(SCHEMES.iter().map(|s| s.to_string()));
            } else if tok.contains('=') && !tok.contains(':') {
                match out.last_mut() {
                    Some(prev) if prev.contains(':') => {
                        prev.push(',');
                        prev.push_str(tok);
                    }
                    _ => {
                        return Err(SchemeError::BadParam {
                            scheme: tok.to_string(),
                            message: "a parameter must follow `scheme:`".into(),
                        })
                    }
                }
            } else {
                out.push(tok.to_string());
            }
        }
    }
    // Resolve every entry up front so a typo fails fast with the list of known schemes.
    // Two entries are one scheme when they plan alike: the same name and parameters once
    // read (bug hunt: `fcp:block=2048,coalesce=8` beside `fcp:coalesce=8,block=2048`, or
    // `fcp:block=02048`, passed).
    let mut seen = Vec::with_capacity(out.len());
    for s in &out {
        let id = crate::planners::planning_identity(s)?;
        if seen.contains(&id) {
            return Err(SchemeError::Duplicate { scheme: s.clone() });
        }
        seen.push(id);
    }
    Ok(out)
}

fn aggregate(all: &[PlanMetrics], f: impl Fn(&[f64]) -> f64) -> PlanMetrics {
    let col = |g: &dyn Fn(&PlanMetrics) -> f64| f(&all.iter().map(g).collect::<Vec<_>>());
    PlanMetrics {
        attention_time_ms: col(&|m| m.attention_time_ms),
        mem_max_bytes: col(&|m| m.mem_max_bytes as f64).round() as u64,
        compute_imbalance: col(&|m| m.compute_imbalance),
        comm_imbalance: col(&|m| m.comm_imbalance),
        max_over_mean: col(&|m| m.max_over_mean),
        comm_bytes_total: col(&|m| m.comm_bytes_total as f64).round() as u64,
        mfu: col(&|m| m.mfu),
        lower_bound_ms: col(&|m| m.lower_bound_ms),
        vs_lower_bound: col(&|m| m.vs_lower_bound),
        pad_tokens: col(&|m| m.pad_tokens as f64).round() as u64,
        mean_compute_ms: col(&|m| m.mean_compute_ms),
        max_compute_ms: col(&|m| m.max_compute_ms),
        layer: aggregate_layer(all, &f),
    }
}

/// [`aggregate`] of the whole-layer metrics, when every plan has them.
fn aggregate_layer(all: &[PlanMetrics], f: &impl Fn(&[f64]) -> f64) -> Option<LayerMetrics> {
    let layers: Vec<&LayerMetrics> = all
        .iter()
        .map(|m| m.layer.as_ref())
        .collect::<Option<_>>()?;
    let col =
        |g: &dyn Fn(&LayerMetrics) -> f64| f(&layers.iter().map(|l| g(l)).collect::<Vec<_>>());
    // A figure only some setups have: aggregated when every plan has it.
    let some = |g: &dyn Fn(&LayerMetrics) -> Option<f64>| {
        layers
            .iter()
            .map(|l| g(l))
            .collect::<Option<Vec<f64>>>()
            .map(|v| f(&v))
    };
    Some(LayerMetrics {
        layer_time_ms: col(&|l| l.layer_time_ms),
        backward_ms: col(&|l| l.backward_ms),
        linear_mean_ms: col(&|l| l.linear_mean_ms),
        linear_max_ms: col(&|l| l.linear_max_ms),
        token_imbalance: col(&|l| l.token_imbalance),
        // The fullest window's, as the footprint below.
        max_rank_tokens: layers.iter().map(|l| l.max_rank_tokens).max().unwrap_or(0),
        layer_lower_bound_ms: col(&|l| l.layer_lower_bound_ms),
        layer_vs_lower_bound: col(&|l| l.layer_vs_lower_bound),
        layer_mfu: col(&|l| l.layer_mfu),
        act_max_bytes: col(&|l| l.act_max_bytes as f64).round() as u64,
        // One simulator priced every plan: they all recompute and split alike.
        recompute: layers.first().map_or(Default::default(), |l| l.recompute),
        tp_comm_max_ms: some(&|l| l.tp_comm_max_ms),
        tp_overlap: layers.first().is_some_and(|l| l.tp_overlap),
        zero3_comm_ms: some(&|l| l.zero3_comm_ms),
        zero3_exposed_ms: some(&|l| l.zero3_exposed_ms),
        // Memory is decided by the fullest batch, not a typical one: the mean and the p95
        // rows both carry the batch whose GPU holds the most.
        footprint: layers
            .iter()
            .filter_map(|l| l.footprint)
            .max_by_key(|f| f.total_bytes),
        nic_fwd_ms: col(&|l| l.nic_fwd_ms),
        nic_bwd_ms: col(&|l| l.nic_bwd_ms),
        // A step is priced from a layer by its caller, not aggregated over batches.
        step: None,
    })
}

/// Plan and simulate every scheme on every batch, over the passes `ctx` judges plans on
/// (`ctx.judge.pass`): the passes `auto` and `hybrid` choose by are the passes reported.
pub fn compare(
    batches: &[Batch],
    ctx: &PlanContext<'_>,
    sim: &Simulator,
    opts: &CompareOptions,
) -> Vec<CompareRow> {
    let mut rows: Vec<CompareRow> = opts
        .schemes
        .iter()
        .map(|entry| {
            let run = || -> Result<Vec<(PlanMetrics, Option<f64>)>, String> {
                planner_for(entry).map_err(|e| e.to_string())?;
                // Batches plan and simulate independently: in parallel, collected in batch
                // order, and the first failing batch in that order is the one named, so the
                // output is the same on any number of threads.
                let each: Vec<Result<(PlanMetrics, Option<f64>), String>> = batches
                    .par_iter()
                    .map(|b| {
                        let planner = planner_for(entry).map_err(|e| e.to_string())?;
                        let plan = planner
                            .plan(b, ctx)
                            .map_err(|e| format!("batch {}: {e}", b.index))?;
                        if opts.verify {
                            if let Some(v) = crate::plan::verify(&plan).first() {
                                return Err(format!("batch {}: invalid plan: {v}", b.index));
                            }
                        }
                        let saving = plan
                            .scheme
                            .params
                            .get("comm_saving")
                            .and_then(|v| v.as_f64());
                        sim.simulate(&plan, ctx.judge.pass)
                            .map(|r| (r.metrics, saving))
                            .map_err(|e| format!("batch {}: {e}", b.index))
                    })
                    .collect();
                each.into_iter().collect()
            };
            match run() {
                Ok(results) => {
                    let all: Vec<PlanMetrics> = results.iter().map(|(m, _)| m.clone()).collect();
                    let savings: Vec<f64> = results.iter().filter_map(|(_, s)| *s).collect();
                    CompareRow {
                        scheme: entry.clone(),
                        batches: all.len(),
                        mean: Some(aggregate(&all, mean)),
                        p95: Some(aggregate(&all, |v| percentile(v, 95.0))),
                        speedup: None,
                        layer_speedup: None,
                        comm_saving: (!savings.is_empty()).then(|| mean(&savings)),
                        error: None,
                        tp: ctx.model.tp.max(1),
                        layers: all.iter().filter_map(|m| m.layer.clone()).collect(),
                        priced: PricedSteps::default(),
                    }
                }
                Err(e) => CompareRow {
                    scheme: entry.clone(),
                    batches: 0,
                    mean: None,
                    p95: None,
                    speedup: None,
                    layer_speedup: None,
                    comm_saving: None,
                    error: Some(e),
                    tp: ctx.model.tp.max(1),
                    layers: Vec::new(),
                    priced: PricedSteps::default(),
                },
            }
        })
        .collect();
    let base_name = opts
        .baseline
        .clone()
        .or_else(|| opts.schemes.first().cloned());
    let base = rows
        .iter()
        .find(|r| Some(&r.scheme) == base_name.as_ref())
        .and_then(|r| r.mean.clone());
    let ratio = |b: f64, x: f64| (x > 0.0).then(|| b / x);
    for r in &mut rows {
        if let (Some(b), Some(m)) = (&base, &r.mean) {
            r.speedup = ratio(b.attention_time_ms, m.attention_time_ms);
            if let (Some(bl), Some(ml)) = (&b.layer, &m.layer) {
                r.layer_speedup = ratio(bl.layer_time_ms, ml.layer_time_ms);
            }
        }
    }
    rows
}

/// Price each row's training step of `opts` over `batches` (the ones [`compare`] ran, in
/// order: batch `i` is micro-batch `i` of the stream) on `cp` ranks, with `sim` (the
/// simulator that ran them, with its training setting). Rows without every batch's layer
/// (a scheme that could not run, a comparison without `--layer`) keep no step.
///
/// With `steps` (`fcp compare --steps`) the batches are that many consecutive steps'
/// windows, an equal share each (the caller hands over `steps` × the step's windows): each
/// is priced on its own, into `steps` and `over_steps` (even one step, so that the output's
/// shape follows the question, not how many steps the trace held), and `step` stays empty.
pub fn price_steps(
    rows: &mut [CompareRow],
    batches: &[Batch],
    sim: &Simulator,
    cp: u32,
    opts: StepOptions,
    steps: Option<usize>,
) -> Result<(), SimError> {
    for r in rows.iter_mut() {
        let Some(drawn) = r.micro_batches(batches) else {
            continue;
        };
        r.priced = PricedSteps::price(sim, &drawn, cp, opts, steps)?;
    }
    Ok(())
}

impl CompareRow {
    /// Its `batches` (the ones [`compare`] ran) as a step's micro-batches, each with its
    /// layer and real tokens; `None` without every batch's layer.
    pub fn micro_batches(&self, batches: &[Batch]) -> Option<Vec<MicroBatch>> {
        (!batches.is_empty() && self.layers.len() == batches.len()).then(|| {
            self.layers
                .iter()
                .zip(batches)
                .map(|(l, b)| MicroBatch::of(l, b.tokens() as f64))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(ms: f64, rate: f64) -> StepMetrics {
        StepMetrics {
            step_ms: ms,
            tokens_per_gpu_s: rate,
            ..Default::default()
        }
    }

    #[test]
    fn steps_sum_up_weighed_by_their_time() {
        assert_eq!(StepsSummary::of(&[]), None);
        // A 3 s step at 100 tok/s/GPU and a 1 s one at 300: 600 tokens/GPU in 4 s is 150,
        // not the 200 a mean of rates says.
        let s = StepsSummary::of(&[step(3000.0, 100.0), step(1000.0, 300.0)]).unwrap();
        assert_eq!(s.steps, 2);
        assert_eq!(s.mean_step_ms, 2000.0);
        assert_eq!(s.max_step_ms, 3000.0);
        assert_eq!(s.slowest_step, 0);
        assert_eq!(s.tokens_per_gpu_s, 150.0);
        // Of equally slow steps the first is named; one step is its own figures.
        let s = StepsSummary::of(&[step(1.0, 1.0), step(2.0, 1.0), step(2.0, 1.0)]).unwrap();
        assert_eq!(s.slowest_step, 1);
        let one = step(1234.5, 0.1 + 0.2);
        let s = StepsSummary::of(&[one]).unwrap();
        assert_eq!((s.mean_step_ms, s.tokens_per_gpu_s), (1234.5, 0.1 + 0.2));
    }

    #[test]
    fn parameters_stay_with_their_scheme() {
        let l = parse_scheme_list(&["ring,zigzag".into()]).unwrap();
        assert_eq!(l, vec!["ring", "zigzag"]);
        let all = parse_scheme_list(&["all".into()]).unwrap();
        assert_eq!(all, SCHEMES);
        assert!(parse_scheme_list(&["ring,block=3".into()]).is_err());
        assert!(parse_scheme_list(&["ring,nope".into()]).is_err());
    }

    /// Regression (bug hunt): `--schemes ring,,zigzag` compared ring and zigzag without a word
    /// about the entry left empty.
    #[test]
    fn an_empty_entry_in_the_scheme_list_is_refused_naming_its_position() {
        for (list, position) in [
            ("ring,,zigzag", 2),
            ("ring,zigzag,", 3),
            (",ring", 1),
            ("fcp:block=2048,,coalesce=8", 2),
        ] {
            let e = parse_scheme_list(&["ring".into(), list.into()]).unwrap_err();
            assert_eq!(
                e,
                SchemeError::EmptyEntry {
                    list: list.into(),
                    position
                }
            );
            assert!(
                e.to_string()
                    .contains(&format!("entry {position} is empty")),
                "{e}"
            );
        }
        // Regression (bug hunt): `ring,ring` printed the same row twice; the same scheme
        // however spelled.
        for list in [
            "ring,ring",
            "all,zigzag",
            "fcp:block=2048,ring,fcp:block=2048",
            "fcp:block=2048,coalesce=8,fcp:coalesce=8,block=2048",
            "fcp:block=02048,fcp:block=2048",
        ] {
            assert!(
                matches!(
                    parse_scheme_list(&[list.into()]),
                    Err(SchemeError::Duplicate { .. })
                ),
                "{list}"
            );
        }
        for list in [
            "fcp:block=2048,fcp:block=4096",
            "usp:ulysses=2,usp:ulysses=4",
            "usp,usp:ulysses=4",
            "usp,usp:inner=ring",
        ] {
            assert!(parse_scheme_list(&[list.into()]).is_ok(), "{list}");
        }
        // A list with no entry at all is left to the caller ("lists no scheme").
        assert_eq!(
            parse_scheme_list(&[",".into(), "".into()]).unwrap(),
            Vec::<String>::new()
        );
    }

    /// Batches run in parallel, but a scheme that fails on several names the first in
    /// batch order, and the rows are the same on every run.
    #[test]
    fn parallel_batches_name_the_first_failure_and_keep_their_order() {
        use crate::hardware::Hardware;
        use crate::model::Model;
        use crate::plan::Mask;
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-70b").unwrap();
        let ctx = PlanContext {
            ranks: 3,
            tokens_per_rank: 4096,
            mask: Mask::Causal,
            model: &model,
            hardware: &hw,
            judge: crate::planners::Judge::default(),
        };
        let sim = Simulator::new(hw.clone(), model.clone()).unwrap();
        let batches: Vec<Batch> = (0..6)
            .map(|i| Batch::new(i, vec![3000 + 100 * i as u64, 5000, 1000]))
            .collect();
        let opts = CompareOptions {
            schemes: vec!["ulysses".into(), "zigzag".into()],
            baseline: None,
            verify: true,
        };
        let rows = compare(&batches, &ctx, &sim, &opts);
        // 64 heads over 3 ranks: every batch fails; the first is named.
        assert!(
            rows[0].error.as_deref().unwrap().starts_with("batch 0:"),
            "{rows:?}"
        );
        assert_eq!(rows[1].batches, 6);
        assert_eq!(rows, compare(&batches, &ctx, &sim, &opts));
    }
}
