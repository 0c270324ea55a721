//! TP×CP: how to split the GPUs that hold one sequence between tensor parallelism (inside a
//! node) and context parallelism, per scheme ([`crate::tp`]).
//!
//! Every split sees the same windows of the trace (window packing depends on the context
//! alone; WLB packing on the context, the step and the model, not the split), so their layer
//! times compare directly: TP `T` × CP `G / T`, each CP rank holding
//! `1/(G/T)` of a window and each GPU `1/T` of the heads. Each split is planned and simulated
//! with every scheme asked for, on the whole layer (attention, the projections and MLP, and
//! the TP collectives), which is where TP and CP trade: TP shrinks attention and K/V per GPU
//! but adds collectives on every layer's activations; CP spreads the tokens thinner.
//!
//! Splits the node or the model cannot take (`T` not dividing the GPUs per node or the heads)
//! are kept as rows with the reason, as `compare` keeps a scheme that cannot run.

use serde::Serialize;

use crate::footprint::{Footprint, Training};
use crate::hardware::Hardware;
use crate::model::{Model, Recompute};
use crate::plan::Mask;
use crate::planners::PlanContext;
use crate::report::{compare, CompareOptions, PricedSteps};
use crate::sim::step::{Deal, MicroBatchOrder, StepOptions};
use crate::sim::{PassSel, Simulator};
use crate::trace::{Batch, PackMode};

use super::StudyError;

/// What a TP×CP study runs.
#[derive(Debug, Clone)]
pub struct TpCpOptions {
    /// GPUs per sequence (TP × CP).
    pub gpus: u32,
    /// Tokens per window (the sequence the GPUs hold).
    pub context: u64,
    /// How the windows were packed: [`PackMode::Window`], or [`PackMode::Wlb`] whose
    /// micro-batches run up to its `max_len` (each CP rank's token cap is its share of
    /// that, as on the command line).
    pub pack: PackMode,
    /// Scheme entries, as `compare` takes them.
    pub schemes: Vec<String>,
    /// Mask inside each document.
    pub mask: Mask,
    /// Passes simulated.
    pub pass: PassSel,
    /// What the backward pass recomputes.
    pub recompute: Recompute,
    /// TP collectives overlap their GEMMs.
    pub tp_overlap: bool,
    /// How the model state is held, for each GPU's memory ([`crate::footprint`]); counted
    /// when the model gives its `layers` and `vocab`.
    pub training: Training,
    /// When given, each row also prices a training step of this many micro-batches
    /// ([`crate::sim::step`]: the pipeline's bubble and the data-parallel gradient
    /// reduction), and rows rank by the step, not the layer. Needs both passes and a model
    /// with its `layers` and `vocab`.
    pub step: Option<StepOptions>,
    /// With [`TpCpOptions::step`]: the windows are this many consecutive steps' (each
    /// `micro_batches × dp` of them), each priced on its own, and rows rank by their mean
    /// step (as `fcp compare --steps`).
    pub steps: Option<usize>,
}

/// One scheme at one split, means over the windows; or why it has no numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TpCpRow {
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Context-parallel degree (`gpus / tp`).
    pub cp: u32,
    /// Scheme entry.
    pub scheme: String,
    /// Attention time per window (fwd + bwd by default), ms.
    pub attention_time_ms: Option<f64>,
    /// The whole layer's time per window, ms.
    pub layer_time_ms: Option<f64>,
    /// Exposed TP collectives of the slowest rank, ms (0 at TP 1).
    pub tp_comm_max_ms: Option<f64>,
    /// Under ZeRO 3: the layer's weight gathers and gradient reduce-scatter, ms; absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero3_comm_ms: Option<f64>,
    /// Under ZeRO 3: what of them the layer's work leaves exposed, ms; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero3_exposed_ms: Option<f64>,
    /// Activations one layer keeps on the fullest GPU, bytes.
    pub act_max_bytes: Option<u64>,
    /// The layer's model FLOPs utilisation.
    pub layer_mfu: Option<f64>,
    /// Bytes of one layer's projection and MLP weights on each GPU, in the model's dtype
    /// ([`Model::weights_per_layer`]): what a low TP leaves on every GPU, times the layers it
    /// holds (gradients and optimizer state come on top).
    pub weight_bytes_per_layer: Option<u64>,
    /// What the fullest GPU holds over a training step, in the fullest window
    /// ([`crate::footprint`]), with the verdict against the GPU's memory; absent when the
    /// model gives no `layers` and `vocab`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub footprint: Option<Footprint>,
    /// The training step around the layer, when [`TpCpOptions::step`] asks for it: `step`,
    /// or under [`TpCpOptions::steps`] `steps` and `over_steps`, as `compare` has them.
    #[serde(flatten)]
    pub priced: PricedSteps,
    /// The step's time under the other micro-batch order and the other deal, where they
    /// apply (under [`TpCpOptions::steps`], the mean step's).
    #[serde(flatten)]
    pub levers: Levers,
    /// Why this split or scheme has no numbers.
    pub error: Option<String>,
}

/// A priced step's time, ms, under the levers it was not priced with: neither the hill
/// order nor the LPT deal always wins, so the answer says which way is faster. Each is
/// absent where it does not apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Levers {
    /// In hill order ([`MicroBatchOrder::Hill`]), when priced in the stream's order under a
    /// pipeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hill_step_ms: Option<f64>,
    /// In the stream's order, when priced in hill order under a pipeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_order_step_ms: Option<f64>,
    /// Dealt LPT ([`Deal::Lpt`]), when priced dealt as streamed over several replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lpt_step_ms: Option<f64>,
    /// Dealt as streamed, when priced dealt LPT over several replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_deal_step_ms: Option<f64>,
}

impl TpCpRow {
    fn failed(tp: u32, cp: u32, scheme: &str, error: String) -> TpCpRow {
        TpCpRow {
            tp,
            cp,
            scheme: scheme.to_string(),
            attention_time_ms: None,
            layer_time_ms: None,
            tp_comm_max_ms: None,
            zero3_comm_ms: None,
            zero3_exposed_ms: None,
            act_max_bytes: None,
            layer_mfu: None,
            weight_bytes_per_layer: None,
            footprint: None,
            priced: PricedSteps::default(),
            levers: Levers::default(),
            error: Some(error),
        }
    }
}

/// The TP degrees a study of `gpus` GPUs tries: every divisor of `gpus` up to the GPUs of one
/// node (a TP group stays inside its NVLink domain), smallest CP first.
pub fn candidate_tps(gpus: u32, hw: &Hardware) -> Vec<u32> {
    let mut tps: Vec<u32> = (1..=hw.gpus_per_node.min(gpus))
        .filter(|t| gpus % t == 0)
        .collect();
    tps.reverse();
    tps
}

/// Plan and simulate `windows` at every split of [`candidate_tps`], with every scheme: one
/// row per (split, scheme), largest TP first. Errors only on what no split could run: a
/// model or hardware without the layer's cost (TP's collectives are priced there, so an
/// attention-only comparison would leave them out).
pub fn run_tpcp(
    windows: &[Batch],
    hw: &Hardware,
    model: &Model,
    opts: &TpCpOptions,
) -> Result<Vec<TpCpRow>, StudyError> {
    if opts.gpus == 0 {
        return Err(StudyError::Config("--gpus must be at least 1".into()));
    }
    // The layer is what the comparison is about: refuse up front what cannot price it.
    crate::sim::LayerCost::new(hw, model).map_err(|e| StudyError::Config(e.to_string()))?;
    // A step needs the stack's layers and a backward pass: refuse up front, not per row.
    if opts.step.is_some() {
        if model.stack.is_none() {
            return Err(StudyError::Config(format!(
                "a training step (--micro-batches) needs the model's `layers` and `vocab`: model {} gives none",
                model.name
            )));
        }
        if opts.pass != PassSel::Both {
            return Err(StudyError::Config(format!(
                "a training step (--micro-batches) runs both passes: --pass {} leaves one out",
                opts.pass.name()
            )));
        }
    }
    // A pipeline that does not divide the layers fails every split alike: say so once.
    if model.stack.is_some() {
        opts.training
            .check(model)
            .map_err(|e| StudyError::Config(e.to_string()))?;
    }
    let mut rows = Vec::new();
    for tp in candidate_tps(opts.gpus, hw) {
        let cp = opts.gpus / tp;
        // Regression (bug hunt): 2³² − 1 GPUs planned a CP group of that size and aborted
        // allocating it; a split no plan may hold is a row, as `compare --ranks` refuses it.
        if cp > crate::planners::MAX_RANKS {
            rows.push(TpCpRow::failed(
                tp,
                cp,
                "-",
                format!(
                    "CP {cp} is more than the {} ranks a plan may have",
                    crate::planners::MAX_RANKS
                ),
            ));
            continue;
        }
        let (hw_t, model_t) = match crate::tp::split(hw, model, tp) {
            Ok(s) => s,
            Err(e) => {
                rows.push(TpCpRow::failed(tp, cp, "-", e.to_string()));
                continue;
            }
        };
        let sim = Simulator::new(hw_t.clone(), model_t.clone())?
            .with_recompute(opts.recompute)?
            .with_tp_overlap(opts.tp_overlap);
        let sim = match model_t.stack {
            // Counted for the step's micro-batches when one is priced.
            Some(_) => sim.with_training(
                opts.training
                    .with_micro_batches(opts.step.map(|s| s.micro_batches)),
            )?,
            None => sim,
        };
        let ctx = PlanContext {
            ranks: cp,
            tokens_per_rank: opts.pack.default_tokens_per_rank(cp, opts.context),
            mask: opts.mask,
            model: &model_t,
            hardware: &hw_t,
            judge: crate::planners::Judge {
                pass: opts.pass,
                recompute: opts.recompute,
                tp_overlap: opts.tp_overlap,
            },
        };
        let compared = compare(
            windows,
            &ctx,
            &sim,
            &CompareOptions {
                schemes: opts.schemes.clone(),
                baseline: None,
                verify: true,
            },
        );
        for r in compared {
            let row = match (&r.mean, &r.error) {
                (Some(m), None) => {
                    let l = m.layer.as_ref();
                    let mut levers = Levers::default();
                    let priced = match (opts.step, r.micro_batches(windows)) {
                        (Some(o), Some(drawn)) => {
                            let price = |o| PricedSteps::price(&sim, &drawn, cp, o, opts.steps);
                            let time = |o| -> Result<f64, StudyError> {
                                Ok(price(o)?.figures().map_or(0.0, |f| f.mean_step_ms))
                            };
                            // The step under the other order, where the order matters,
                            // and under the other deal, where there are replicas to deal to:
                            // neither lever always wins.
                            if opts.training.pp > 1 {
                                let t = Some(time(o.with_order(match o.order {
                                    MicroBatchOrder::Stream => MicroBatchOrder::Hill,
                                    MicroBatchOrder::Hill => MicroBatchOrder::Stream,
                                }))?);
                                match o.order {
                                    MicroBatchOrder::Stream => levers.hill_step_ms = t,
                                    MicroBatchOrder::Hill => levers.stream_order_step_ms = t,
                                }
                            }
                            if opts.training.dp > 1 {
                                let other = match o.deal {
                                    Deal::Stream => Deal::Lpt,
                                    Deal::Lpt => Deal::Stream,
                                };
                                if let Ok(d) = o.with_deal(other, opts.training) {
                                    let t = Some(time(d)?);
                                    match o.deal {
                                        Deal::Stream => levers.lpt_step_ms = t,
                                        Deal::Lpt => levers.stream_deal_step_ms = t,
                                    }
                                }
                            }
                            price(o)?
                        }
                        _ => PricedSteps::default(),
                    };
                    TpCpRow {
                        tp,
                        cp,
                        scheme: r.scheme.clone(),
                        attention_time_ms: Some(m.attention_time_ms),
                        layer_time_ms: l.map(|l| l.layer_time_ms),
                        tp_comm_max_ms: l.map(|l| l.tp_comm_max_ms.unwrap_or(0.0)),
                        zero3_comm_ms: l.and_then(|l| l.zero3_comm_ms),
                        zero3_exposed_ms: l.and_then(|l| l.zero3_exposed_ms),
                        act_max_bytes: l.map(|l| l.act_max_bytes),
                        layer_mfu: l.map(|l| l.layer_mfu),
                        weight_bytes_per_layer: model_t
                            .weights_per_layer()
                            .map(|w| w * u64::from(model_t.dtype_bytes)),
                        footprint: l.and_then(|l| l.footprint),
                        priced,
                        levers,
                        error: None,
                    }
                }
                _ => TpCpRow::failed(
                    tp,
                    cp,
                    &r.scheme,
                    r.error.clone().unwrap_or_else(|| "no result".into()),
                ),
            };
            rows.push(row);
        }
    }
    Ok(rows)
}

impl TpCpRow {
    /// What the row is ranked by: its step's time when a step was priced (the mean step's,
    /// over several), else its layer's; `None` without numbers.
    pub fn time_ms(&self) -> Option<f64> {
        self.layer_time_ms
            .map(|l| self.priced.figures().map_or(l, |s| s.mean_step_ms))
    }

    /// Whether its footprint is known not to fit in the GPU's memory.
    pub fn overflows(&self) -> bool {
        self.footprint.and_then(|f| f.fits) == Some(false)
    }
}

/// The fastest row on the whole layer (or step, when priced), over all splits and schemes.
pub fn fastest(rows: &[TpCpRow]) -> Option<&TpCpRow> {
    fastest_of(rows.iter())
}

/// The fastest row whose GPUs are not known to overflow their memory: what a user can run.
pub fn fastest_that_fits(rows: &[TpCpRow]) -> Option<&TpCpRow> {
    fastest_of(rows.iter().filter(|r| !r.overflows()))
}

/// The row holding least on its fullest GPU, among those with a footprint; of rows holding
/// the same, the fastest (bug hunt: a tie named the first scheme listed, not the fastest).
pub fn smallest_footprint(rows: &[TpCpRow]) -> Option<&TpCpRow> {
    rows.iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| {
            r.footprint
                .map(|f| (r, f.total_bytes, r.time_ms().unwrap_or(f64::INFINITY)))
        })
        .min_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)))
        .map(|(r, _, _)| r)
}

/// Per scheme, in the order given: its fastest split that fits (any split when no memory
/// is known), `None` when it ran at none that fits.
pub fn best_split_per_scheme<'r>(
    rows: &'r [TpCpRow],
    schemes: &'r [String],
) -> Vec<(&'r str, Option<&'r TpCpRow>)> {
    schemes
        .iter()
        .map(|s| {
            (
                s.as_str(),
                fastest_of(rows.iter().filter(|r| &r.scheme == s && !r.overflows())),
            )
        })
        .collect()
}

fn fastest_of<'r>(rows: impl Iterator<Item = &'r TpCpRow>) -> Option<&'r TpCpRow> {
    rows.filter_map(|r| r.time_ms().map(|t| (r, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(gpus: u32) -> TpCpOptions {
        TpCpOptions {
            gpus,
            context: 16384,
            pack: PackMode::Window,
            schemes: vec!["zigzag".into(), "hybrid:quick=true".into()],
            mask: Mask::Causal,
            pass: PassSel::Both,
            recompute: Recompute::None,
            tp_overlap: false,
            training: Training::default(),
            step: None,
            steps: None,
        }
    }

    #[test]
    fn candidates_divide_the_gpus_and_fit_a_node() {
        let h100 = Hardware::load("h100").unwrap();
        assert_eq!(candidate_tps(64, &h100), vec![8, 4, 2, 1]);
        assert_eq!(candidate_tps(12, &h100), vec![6, 4, 3, 2, 1]);
        assert_eq!(candidate_tps(2, &h100), vec![2, 1]);
    }

    #[test]
    fn every_split_sees_the_same_windows_and_odd_ones_say_why() {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-70b").unwrap();
        let windows = vec![Batch::new(0, vec![9000, 4000, 2000, 1384])];
        // ZeRO 2 over 64 replicas: Llama-3-70B fits at TP 4; at TP 1 its 141 GB of bf16
        // weights, whole on every GPU, do not.
        let o = TpCpOptions {
            training: Training::new(2, 64, 1).unwrap(),
            ..opts(12)
        };
        let rows = run_tpcp(&windows, &hw, &model, &o).unwrap();
        // 6 and 3 divide neither 64 query heads nor 8 KV heads.
        for tp in [6, 3] {
            let r: Vec<_> = rows.iter().filter(|r| r.tp == tp).collect();
            assert_eq!(r.len(), 1);
            assert!(r[0].error.as_deref().unwrap().contains("does not divide"));
        }
        for tp in [4, 2, 1] {
            let r: Vec<_> = rows.iter().filter(|r| r.tp == tp).collect();
            assert_eq!(r.len(), 2, "{r:?}");
            for x in r {
                assert_eq!(x.cp, 12 / tp);
                // Llama-3-70B: 855.6M weights a layer in bf16, split TP ways.
                let w = 2 * (8192 * 80 * 128 + 64 * 128 * 8192 + 3 * 8192 * 28672) / tp as u64;
                assert_eq!(x.weight_bytes_per_layer, Some(w));
                assert!(x.layer_time_ms.unwrap() > x.attention_time_ms.unwrap());
                assert_eq!(x.tp_comm_max_ms.unwrap() > 0.0, tp > 1);
            }
        }
        let best = fastest(&rows).unwrap();
        assert!(rows
            .iter()
            .filter_map(|r| r.layer_time_ms)
            .all(|t| t >= best.layer_time_ms.unwrap()));
        for r in rows.iter().filter(|r| r.error.is_none()) {
            let f = r.footprint.unwrap();
            assert_eq!(f.fits, Some(r.tp == 4), "{r:?}");
            // Bf16 weights: everything but the norms split TP ways.
            let (_, m) = crate::tp::split(&hw, &model, r.tp).unwrap();
            assert_eq!(f.weight_bytes, 2 * m.params_per_gpu().unwrap());
        }
        let schemes = opts(12).schemes;
        let per = best_split_per_scheme(&rows, &schemes);
        assert_eq!(per.len(), 2);
        assert_eq!(per[0].0, "zigzag");
        assert!(per.iter().all(|(s, r)| r.is_some_and(|r| r.scheme == *s)));
        // Deterministic.
        assert_eq!(rows, run_tpcp(&windows, &hw, &model, &o).unwrap());
    }

    #[test]
    fn a_split_that_overflows_memory_is_never_the_answer() {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-70b").unwrap();
        let windows = vec![Batch::new(0, vec![9000, 4000, 2000, 1384])];
        // Replicated state: 18 bytes a parameter, 1.27 TB at TP 1 and 159 GB at TP 8.
        let o = TpCpOptions {
            training: Training::new(0, 1, 1).unwrap(),
            ..opts(8)
        };
        let rows = run_tpcp(&windows, &hw, &model, &o).unwrap();
        assert!(rows.iter().all(TpCpRow::overflows), "{rows:?}");
        assert!(fastest(&rows).is_some());
        assert!(fastest_that_fits(&rows).is_none());
        let per = best_split_per_scheme(&rows, &o.schemes);
        assert!(per.iter().all(|(_, r)| r.is_none()));
        // The closest is at the largest TP, which splits the state most.
        assert_eq!(smallest_footprint(&rows).unwrap().tp, 8);
        // Sharded over 16 replicas at TP 8, it fits, and only the fitting splits answer.
        let o = TpCpOptions {
            training: Training::new(2, 16, 1).unwrap(),
            ..opts(8)
        };
        let rows = run_tpcp(&windows, &hw, &model, &o).unwrap();
        let fit = fastest_that_fits(&rows).unwrap();
        assert!(!fit.overflows());
        assert!(rows.iter().any(|r| r.tp == 8 && !r.overflows()));
        for (_, r) in best_split_per_scheme(&rows, &o.schemes) {
            assert!(!r.unwrap().overflows());
        }
    }

    /// Regression (bug hunt): of splits holding the same bytes, the first listed was named
    /// the closest to fitting, not the fastest.
    #[test]
    fn the_closest_to_fitting_breaks_ties_on_time() {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-70b").unwrap();
        let o = TpCpOptions {
            training: Training::new(0, 1, 1).unwrap(),
            ..opts(8)
        };
        let windows = vec![Batch::new(0, vec![9000, 4000, 2000, 1384])];
        let mut rows = run_tpcp(&windows, &hw, &model, &o).unwrap();
        let smallest = smallest_footprint(&rows).unwrap().clone();
        // A copy holding the same bytes, faster, listed after it.
        let mut faster = smallest.clone();
        faster.scheme = "faster".into();
        faster.layer_time_ms = Some(smallest.layer_time_ms.unwrap() / 2.0);
        rows.push(faster);
        assert_eq!(smallest_footprint(&rows).unwrap().scheme, "faster");
    }

    /// Regression (bug hunt): a CP group larger than any plan may hold aborted allocating.
    #[test]
    fn a_cp_past_the_rank_limit_is_a_row() {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-70b").unwrap();
        let gpus = 8 * crate::planners::MAX_RANKS * 2;
        let rows = run_tpcp(&[Batch::new(0, vec![100])], &hw, &model, &opts(gpus)).unwrap();
        assert_eq!(rows.len(), 4);
        for r in &rows {
            assert!(
                r.error
                    .as_deref()
                    .unwrap()
                    .contains("ranks a plan may have"),
                "{r:?}"
            );
        }
    }

    #[test]
    fn a_model_without_the_layers_cost_is_refused() {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("mha-16").unwrap();
        let e = run_tpcp(&[Batch::new(0, vec![100])], &hw, &model, &opts(8)).unwrap_err();
        assert!(e.to_string().contains("hidden"), "{e}");
    }
}
