//! DP×CP: a cluster of G GPUs as G/CP data-parallel groups of CP ranks each, under a fixed
//! global token batch (G × tokens per GPU), as in the "balancing compute" note (seeds/003).
//!
//! Every step packs the trace (carry packing: a document crossing a boundary continues in the
//! next batch, as the note's simulation does) into G/CP group batches of CP × S tokens. Data
//! parallelism waits for the slowest group at the gradient all-reduce, so what matters is the
//! spread of per-group attention time. We report, per CP degree and averaged over steps:
//! max/min, the coefficient of variation (population std / mean; the note predicts CV ∝
//! 1/√CP), (max − min)/mean (the note's "imbalance"), and the step's attention time (the
//! slowest group).
//!
//! Balancers (`balance`):
//! * `none` — groups take consecutive batches of the stream (the note's setting).
//! * `lpt` — before planning, the step's documents are re-dealt across the groups: longest
//!   processing time first by whole-document attention cost (the shared cost model), each to
//!   the least-loaded group with room for it under the CP × S token cap; a document that fits
//!   nowhere is split over the groups with the most room. This is the spirit of WLB-LLM's
//!   workload-aware packing and of Megatron's dynamic CP, which both even out attention work
//!   across data-parallel micro-batches before CP runs (anchors-cp.md §3–4).
//!
//! Cost models (`cost`):
//! * `ideal` — a group's time is the sum of its documents' whole-document kernel times over
//!   CP (perfect intra-group balance, no communication: the note's Ulysses model, with
//!   profiled kernel efficiency instead of Σlen²).
//! * `sim` — every group batch is planned with `scheme` on CP ranks and simulated.
//!
//! With `tp` above 1 every CP rank is a tensor-parallel group of `tp` GPUs in one node
//! ([`crate::tp::split`]): a data-parallel group is then `CP × TP` GPUs holding `CP × TP × S`
//! tokens, each GPU running `1/TP` of the heads, so `G / (CP × TP)` groups share the cluster.
//! Under `cost = "sim"` with `layer = true` the TP collectives are in the group's time; the
//! ideal cost has no communication, TP's included.
//!
//! With `layer = true` a group's time is its whole layer — attention plus the projections and
//! MLP, which cost the same per token ([`crate::sim::LayerCost`]) — and `lpt` weighs each
//! document by both, as WLB-LLM's packing weighs attention and the linear layers together:
//! the linear part is the same in every full group, so it dilutes attention's spread, and a
//! balancer that moves tokens between groups has to count it.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::hardware::{Hardware, Pass};
use crate::model::Model;
use crate::planners::{planner_for, PlanContext};
use crate::report::mean;
use crate::sim::{PassSel, Simulator};
use crate::trace::{pack_first, Batch, PackMode, PackOptions};

use super::traces::TraceSpec;
use super::StudyError;

fn default_steps() -> usize {
    20
}
fn default_balance() -> Vec<String> {
    vec!["none".into(), "lpt".into()]
}
fn default_cost() -> String {
    "ideal".into()
}
fn default_scheme() -> String {
    "ulysses".into()
}
fn default_hardware() -> String {
    "h100".into()
}
fn default_model() -> String {
    "llama3-70b".into()
}
fn default_pass() -> String {
    "both".into()
}

/// A DP×CP study (TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpcpConfig {
    /// Name shown in outputs.
    #[serde(default)]
    pub name: Option<String>,
    /// What the study reproduces.
    #[serde(default)]
    pub description: Option<String>,
    /// G: GPUs in the cluster.
    pub gpus: u32,
    /// CP degrees to compare (each must divide `gpus`).
    pub cp: Vec<u32>,
    /// S: tokens per GPU (the global batch is G × S tokens for every CP).
    pub tokens_per_gpu: u64,
    /// Steps (global batches) to average over.
    #[serde(default = "default_steps")]
    pub steps: usize,
    /// Trace spec (see [`super::traces`]).
    pub trace: String,
    /// Balancers to compare: `none`, `lpt`.
    #[serde(default = "default_balance")]
    pub balance: Vec<String>,
    /// `ideal` or `sim`.
    #[serde(default = "default_cost")]
    pub cost: String,
    /// Scheme each group is planned with (`cost = "sim"`).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Hardware profile.
    #[serde(default = "default_hardware")]
    pub hardware: String,
    /// Model.
    #[serde(default = "default_model")]
    pub model: String,
    /// Passes: fwd, bwd or both.
    #[serde(default = "default_pass")]
    pub pass: String,
    /// A group's time is its whole layer (attention plus projections and MLP), not attention
    /// alone; the model and hardware must give the layer's cost.
    #[serde(default)]
    pub layer: bool,
    /// Tensor-parallel degree: every CP rank is a group of this many GPUs in one node, so a
    /// data-parallel group is `cp × tp` GPUs (each `cp × tp` must divide `gpus`).
    #[serde(default = "crate::tp::one")]
    pub tp: u32,
}

/// One CP degree under one balancer, averaged over steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DpcpRow {
    /// CP degree.
    pub cp: u32,
    /// Tensor-parallel degree of every CP rank; absent at 1.
    #[serde(default = "crate::tp::one", skip_serializing_if = "crate::tp::is_one")]
    pub tp: u32,
    /// DP groups (G / (CP × TP)).
    pub groups: u32,
    /// Whether a group's time is its whole layer (`layer = true`), not attention alone;
    /// absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layer: bool,
    /// Balancer.
    pub balance: String,
    /// Steps averaged.
    pub steps: usize,
    /// Mean over steps of max/min per-group time (attention, or the whole layer).
    pub max_over_min: f64,
    /// Mean over steps of the CV of per-group time.
    pub cv: f64,
    /// CV × √CP (constant if CV ∝ 1/√CP, as the note predicts).
    pub cv_sqrt_cp: f64,
    /// Mean over steps of (max − min)/mean.
    pub spread: f64,
    /// Mean over steps of the slowest group's time (ms).
    pub step_time_ms: f64,
    /// Mean over steps and groups of a group's time (ms).
    pub mean_group_ms: f64,
}

impl DpcpConfig {
    /// Read and validate.
    pub fn load(path: &std::path::Path) -> Result<DpcpConfig, StudyError> {
        let text = crate::input::read_text(path, "a TOML config", false)
            .map_err(|e| StudyError::io(path, e))?;
        let cfg: DpcpConfig = toml::from_str(&text).map_err(|e| {
            StudyError::Config(format!(
                "{}: {}",
                path.display(),
                crate::jsonpos::toml_message(&text, &e)
            ))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), StudyError> {
        let bad = |m: String| Err(StudyError::Config(m));
        if self.gpus == 0 || self.tokens_per_gpu == 0 || self.steps == 0 || self.cp.is_empty() {
            return bad("gpus, tokens_per_gpu, steps must be ≥ 1 and cp must list a degree".into());
        }
        if self.cp.contains(&0) {
            return bad("cp must be ≥ 1 (a CP group has at least one GPU); cp lists 0".into());
        }
        // Regression (bug hunt): gpus × tokens_per_gpu wrapped to 0 and the study reported
        // too few batches for a global batch it had read as empty.
        let tokens = u64::from(self.gpus)
            .checked_mul(self.tokens_per_gpu)
            .and_then(|t| t.checked_mul(self.steps as u64))
            .and_then(|t| {
                self.tokens_per_gpu
                    .checked_mul(u64::from(self.tp))
                    .map(|_| t)
            });
        if tokens.is_none() {
            return bad(format!(
                "gpus {} × tokens_per_gpu {} × steps {} (or tokens_per_gpu × tp {}) is more \
                 tokens than fit in 64 bits",
                self.gpus, self.tokens_per_gpu, self.steps, self.tp
            ));
        }
        if !(1..=crate::tp::MAX_TP).contains(&self.tp) {
            return bad(format!(
                "tp {}: must be 1 to {}",
                self.tp,
                crate::tp::MAX_TP
            ));
        }
        for &c in &self.cp {
            let group = u64::from(c) * u64::from(self.tp);
            if u64::from(self.gpus) % group != 0 {
                return bad(if self.tp == 1 {
                    format!("cp {c} does not divide gpus {}", self.gpus)
                } else {
                    format!(
                        "cp {c} × tp {} = {group} GPUs a group does not divide gpus {}",
                        self.tp, self.gpus
                    )
                });
            }
        }
        // Every group of every step is a batch the study packs and prices: bounded, so that a
        // request no trace can meet is refused here rather than packed until memory runs out
        // (bug hunt: steps = 2³³ on one GPU of one token aborted allocating batches).
        let cp_min = self.cp.iter().copied().min().unwrap_or(1);
        let batches = u128::from(self.gpus / (cp_min * self.tp).max(1)) * self.steps as u128;
        if batches > MAX_GROUP_STEPS as u128 {
            return bad(format!(
                "gpus {} at cp {cp_min} × tp {} over {} steps is {batches} group batches to pack and price; a study takes at most {MAX_GROUP_STEPS}",
                self.gpus, self.tp, self.steps
            ));
        }
        if let Some(c) = super::config::repeated(&self.cp) {
            return bad(format!("cp lists {c} twice"));
        }
        if let Some(b) = super::config::repeated(&self.balance) {
            return bad(format!("balance lists `{b}` twice"));
        }
        if self.balance.is_empty() {
            return bad("balance must list at least one balancer (none, lpt)".into());
        }
        for b in &self.balance {
            if b != "none" && b != "lpt" {
                return bad(format!("balance `{b}`: expected none or lpt"));
            }
        }
        if self.cost != "ideal" && self.cost != "sim" {
            return bad(format!("cost `{}`: expected ideal or sim", self.cost));
        }
        self.pass_sel()?;
        // Read under `ideal` too, which plans nothing: a misspelt scheme passed there and
        // failed only once the study switched to `sim` (bug hunt).
        planner_for(&self.scheme).map_err(|e| StudyError::Config(e.to_string()))?;
        TraceSpec::parse(&self.trace)?;
        Ok(())
    }

    fn pass_sel(&self) -> Result<PassSel, StudyError> {
        match self.pass.as_str() {
            "fwd" => Ok(PassSel::Fwd),
            "bwd" => Ok(PassSel::Bwd),
            "both" => Ok(PassSel::Both),
            o => Err(StudyError::Config(format!(
                "pass `{o}`: expected fwd, bwd or both"
            ))),
        }
    }
}

/// Most batches (CP groups × steps, at the smallest CP degree) one study packs and prices:
/// 655 times the bundled studies' 6,400, about half a GiB of batches.
pub const MAX_GROUP_STEPS: u64 = 1 << 22;

/// Whole-document attention time (ms) of one document, summed over the passes.
fn doc_ms(sim: &Simulator, len: u64, passes: &[Pass]) -> Result<f64, StudyError> {
    let mut cm = sim.compute_model();
    let mut s = 0.0;
    for &p in passes {
        s += cm
            .whole_document(crate::plan::Mask::Causal, len, p)
            .map_err(StudyError::Hardware)?
            .seconds;
    }
    Ok(s * 1e3)
}

/// Re-deal `docs` over `groups` groups of `cap` tokens, longest work first to the least
/// loaded group with room; documents that fit nowhere are split over the roomiest groups.
/// Deterministic: ties go to the lower index.
pub fn lpt_balance(
    docs: &[u64],
    groups: usize,
    cap: u64,
    weight: &dyn Fn(u64) -> f64,
) -> Vec<Vec<u64>> {
    let mut order: Vec<(f64, u64, usize)> = docs
        .iter()
        .enumerate()
        .map(|(i, &l)| (weight(l), l, i))
        .collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut load = vec![0.0f64; groups];
    let mut room = vec![cap; groups];
    let mut out: Vec<Vec<u64>> = vec![Vec::new(); groups];
    for (_, len, _) in order {
        let mut left = len;
        while left > 0 {
            let fit = (0..groups)
                .filter(|&g| room[g] >= left)
                .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)));
            let (g, take) = match fit {
                Some(g) => (g, left),
                None => {
                    // The roomiest group (least loaded among equals) takes what it can.
                    let g = (0..groups)
                        .max_by(|&a, &b| {
                            room[a]
                                .cmp(&room[b])
                                .then(load[b].total_cmp(&load[a]))
                                .then(b.cmp(&a))
                        })
                        .unwrap_or(0);
                    if room[g] == 0 {
                        // More tokens than the groups hold (never with carry packing): the
                        // least loaded group takes the rest over its cap.
                        let g = (0..groups)
                            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
                            .unwrap_or(0);
                        (g, left)
                    } else {
                        (g, room[g])
                    }
                }
            };
            out[g].push(take);
            load[g] += weight(take);
            room[g] = room[g].saturating_sub(take);
            left -= take;
        }
    }
    out
}

/// One step's (max/min, cv, spread, max, mean) of per-group times.
type StepStats = (f64, f64, f64, f64, f64);

/// Statistics of one step's per-group times.
fn step_stats(t: &[f64]) -> StepStats {
    let m = mean(t);
    let max = t.iter().copied().fold(f64::MIN, f64::max);
    let min = t.iter().copied().fold(f64::MAX, f64::min);
    let var = t.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / t.len().max(1) as f64;
    let cv = if m > 0.0 { var.sqrt() / m } else { 0.0 };
    let mom = if min > 0.0 { max / min } else { f64::INFINITY };
    let spread = if m > 0.0 { (max - min) / m } else { 0.0 };
    (mom, cv, spread, max, m)
}

/// Whether `groups` groups of `group` GPUs laid back to back on nodes of `gpn` put one across a
/// node's edge where it does not start on one: unless the groups tile the nodes (a group
/// dividing a node, or whole nodes), the second starts mid-node.
fn straddles(group: u64, groups: u64, gpn: u64) -> bool {
    groups > 1 && group % gpn != 0 && gpn % group != 0
}

/// The CP degrees of `cfg` whose data-parallel groups straddle a node's edge (6 ranks on
/// 8-GPU nodes: the second group runs on GPUs 6 to 11), when it simulates them: such a group
/// pays the NICs between its parts, but the planners place its ranks as if it started on a
/// node's edge. Empty under the ideal cost.
pub fn straddling(cfg: &DpcpConfig) -> Result<Vec<u32>, StudyError> {
    if cfg.cost != "sim" {
        return Ok(Vec::new());
    }
    let gpn = u64::from(Hardware::load(&cfg.hardware)?.gpus_per_node.max(1));
    let tp = u64::from(cfg.tp.max(1));
    Ok(cfg
        .cp
        .iter()
        .copied()
        .filter(|&cp| {
            let group = u64::from(cp) * tp;
            straddles(group, u64::from(cfg.gpus) / group.max(1), gpn)
        })
        .collect())
}

/// Run the study: one row per (CP, balancer), in config order.
pub fn run_dpcp(cfg: &DpcpConfig) -> Result<Vec<DpcpRow>, StudyError> {
    cfg.validate()?;
    let passes = cfg.pass_sel()?;
    // One GPU's share of the heads and widths, each CP rank a TP group in one node.
    let (hw, model) = crate::tp::split(
        &Hardware::load(&cfg.hardware)?,
        &Model::load(&cfg.model)?,
        cfg.tp,
    )?;
    let mut sim = Simulator::new(hw.clone(), model.clone())?;
    // Milliseconds of token-linear work per token over the passes (0 for attention alone).
    let mut linear_ms_per_token = 0.0;
    if cfg.layer {
        sim = sim.with_layer()?;
        let cost = sim
            .layer_cost()
            .copied()
            .ok_or_else(|| StudyError::Config("the whole layer could not be costed".into()))?;
        linear_ms_per_token = cost.flops_per_token(passes.passes()) / cost.flops_per_s * 1e3;
    }
    // Group g's CP ranks start on GPU g·CP of the cluster (in the CP view): one simulator
    // for each place in a node a group starts at, so a group across a node's edge pays the
    // NICs between its parts (bug hunt: every group was priced as if it started on an edge).
    let gpn = u64::from(hw.gpus_per_node.max(1));
    let first_gpu = |cp: u32, g: usize| ((g as u64 * u64::from(cp)) % gpn) as u32;
    let mut shifted: std::collections::BTreeMap<u32, Simulator> = Default::default();
    if cfg.cost == "sim" {
        // Only where a group straddles: one inside a node prices the same wherever it starts.
        for &cp in &cfg.cp {
            let groups = cfg.gpus / (cp * cfg.tp);
            if !straddles(u64::from(cp), u64::from(groups), gpn) {
                continue;
            }
            for g in 0..groups as usize {
                let first = first_gpu(cp, g);
                if first != 0 && !shifted.contains_key(&first) {
                    let mut s = Simulator::new(hw.clone(), model.clone())?.with_first_gpu(first);
                    if cfg.layer {
                        s = s.with_layer()?;
                    }
                    shifted.insert(first, s);
                }
            }
        }
    }
    let global = u64::from(cfg.gpus) * cfg.tokens_per_gpu;
    // Tokens a CP rank holds: its TP group's GPUs' worth.
    let s = cfg.tokens_per_gpu.saturating_mul(u64::from(cfg.tp));
    let trace = TraceSpec::parse(&cfg.trace)?.load(global.saturating_mul(cfg.steps as u64))?;
    // A kernel table without the model's series (a head dim or pass it never measured) fails
    // for every length alike: ask once, so the error ends the study here. Bug hunt: the
    // weight fell back to len² read as milliseconds, and `mha-16:head_dim=64` under both
    // passes printed 8,393,644 ms for an 8 × 4K step with exit 0.
    let longest = trace.docs.iter().map(|d| d.len).max().unwrap_or(1);
    for len in [1, s.max(1), longest] {
        doc_ms(&sim, len, passes.passes())?;
    }
    let weight = |l: u64| {
        // Cannot fail after the probe above (lookups clamp lengths, not refuse them); a
        // failure would still weigh the document by its quadratic work rather than stop.
        doc_ms(&sim, l, passes.passes()).unwrap_or(l as f64 * l as f64)
            + l as f64 * linear_ms_per_token
    };
    let mut jobs = Vec::new();
    for &cp in &cfg.cp {
        for b in &cfg.balance {
            jobs.push((cp, b.clone()));
        }
    }
    jobs.par_iter()
        .map(|(cp, balance)| -> Result<DpcpRow, StudyError> {
            let groups = cfg.gpus / (cp * cfg.tp);
            let need = groups as usize * cfg.steps;
            let packed = pack_first(
                &trace,
                &PackOptions {
                    mode: PackMode::Carry,
                    ranks: *cp,
                    tokens_per_rank: s,
                    context: None,
                },
                need,
            )?;
            if packed.batches.len() < need {
                return Err(StudyError::Config(format!(
                    "trace `{}` packs into {} batches of CP {cp}; {need} are needed",
                    cfg.trace,
                    packed.batches.len()
                )));
            }
            let per_step: Vec<Result<StepStats, StudyError>> = (0..cfg.steps)
                .into_par_iter()
                .map(|step| {
                    let batches =
                        &packed.batches[step * groups as usize..(step + 1) * groups as usize];
                    let group_docs: Vec<Vec<u64>> = if balance == "lpt" {
                        let all: Vec<u64> = batches
                            .iter()
                            .flat_map(|b| b.doc_lens.iter().copied())
                            .collect();
                        lpt_balance(&all, groups as usize, u64::from(*cp) * s, &weight)
                    } else {
                        batches.iter().map(|b| b.doc_lens.clone()).collect()
                    };
                    let times: Vec<f64> = group_docs
                        .par_iter()
                        .enumerate()
                        .map(|(g, docs)| {
                            let sim = shifted.get(&first_gpu(*cp, g)).unwrap_or(&sim);
                            group_ms(cfg, sim, &hw, &model, *cp, s, g, docs, passes, &weight)
                        })
                        .collect::<Result<_, _>>()?;
                    Ok(step_stats(&times))
                })
                .collect();
            let per_step: Vec<_> = per_step.into_iter().collect::<Result<_, _>>()?;
            let col = |f: fn(&StepStats) -> f64| mean(&per_step.iter().map(f).collect::<Vec<_>>());
            let cv = col(|x| x.1);
            Ok(DpcpRow {
                cp: *cp,
                tp: cfg.tp,
                groups,
                layer: cfg.layer,
                balance: balance.clone(),
                steps: cfg.steps,
                max_over_min: col(|x| x.0),
                cv,
                cv_sqrt_cp: cv * f64::from(*cp).sqrt(),
                spread: col(|x| x.2),
                step_time_ms: col(|x| x.3),
                mean_group_ms: col(|x| x.4),
            })
        })
        .collect()
}

/// One group's time (ms): attention, or its whole layer with `layer = true`.
#[allow(clippy::too_many_arguments)]
fn group_ms(
    cfg: &DpcpConfig,
    sim: &Simulator,
    hw: &Hardware,
    model: &Model,
    cp: u32,
    s: u64,
    g: usize,
    docs: &[u64],
    passes: PassSel,
    weight: &(dyn Fn(u64) -> f64 + Sync),
) -> Result<f64, StudyError> {
    if cfg.cost == "ideal" {
        return Ok(docs.iter().map(|&l| weight(l)).sum::<f64>() / f64::from(cp));
    }
    let planner = planner_for(&cfg.scheme).map_err(|e| StudyError::Config(e.to_string()))?;
    let ctx = PlanContext {
        ranks: cp,
        tokens_per_rank: s,
        mask: crate::plan::Mask::Causal,
        model,
        hardware: hw,
        judge: crate::planners::Judge {
            pass: passes,
            ..Default::default()
        },
    };
    let plan = planner
        .plan(&Batch::new(g, docs.to_vec()), &ctx)
        .map_err(|e| StudyError::Config(format!("{}: {e}", cfg.scheme)))?;
    let report = sim.simulate(&plan, passes)?;
    let m = &report.metrics;
    Ok(m.layer
        .as_ref()
        .map_or(m.attention_time_ms, |l| l.layer_time_ms))
}

/// Rows as CSV.
pub fn dpcp_csv(rows: &[DpcpRow]) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        let _ = w.serialize(r);
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// Lines for a plot: x = CP, one series per balancer, y = `metric`.
pub fn series(rows: &[DpcpRow], metric: &str) -> Vec<crate::report::plot::Series> {
    let mut out: Vec<crate::report::plot::Series> = Vec::new();
    for r in rows {
        let y = match metric {
            "max_over_min" => r.max_over_min,
            "cv" => r.cv,
            "spread" => r.spread,
            _ => r.step_time_ms,
        };
        let label = match r.balance.as_str() {
            "lpt" => "LPT balance across DP groups, then CP".to_string(),
            "none" => "consecutive batches (no balancing)".to_string(),
            o => o.to_string(),
        };
        match out.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push((f64::from(r.cp), y)),
            None => out.push(crate::report::plot::Series {
                label,
                points: vec![(f64::from(r.cp), y)],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpt_respects_caps_keeps_tokens_and_balances() {
        let docs = [8000, 100, 100, 7000, 500, 300, 200, 100, 8000, 8];
        let total: u64 = docs.iter().sum();
        let groups = lpt_balance(&docs, 3, total.div_ceil(3), &|l| (l * l) as f64);
        let sums: Vec<u64> = groups.iter().map(|g| g.iter().sum()).collect();
        assert_eq!(sums.iter().sum::<u64>(), total);
        assert!(sums.iter().all(|&s| s <= total.div_ceil(3)));
    }

    /// A study of the balancing-compute note's exponential lengths (seeds/003) with
    /// `settings` (TOML lines).
    /// Regression (bug hunt): a global batch past 64 bits of tokens wrapped to 0.
    #[test]
    fn a_global_batch_past_64_bits_is_refused() {
        let cfg =
            exponential("gpus = 4\ncp = [1]\ntokens_per_gpu = 4611686018427387904\nsteps = 1");
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("is more tokens than fit in 64 bits"), "{e}");
        assert!(
            exponential("gpus = 4\ncp = [1]\ntokens_per_gpu = 8192\nsteps = 1")
                .validate()
                .is_ok()
        );
    }

    /// Regression (bug hunt): 2³³ steps of one one-token GPU packed a 2³²-token trace one
    /// token a batch until memory ran out, before saying the trace was too short.
    #[test]
    fn regression_more_group_batches_than_a_study_takes_is_refused_before_packing() {
        let e = exponential(
            "gpus = 1
cp = [1]
tokens_per_gpu = 1
steps = 8589934592",
        )
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("8589934592 group batches"), "{e}");
        // The smallest CP degree has the most groups: 128 GPUs at cp 2 over 65,536 steps.
        let e = exponential(
            "gpus = 128
cp = [2, 128]
tokens_per_gpu = 1
steps = 65537",
        )
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("at most 4194304"), "{e}");
        assert!(exponential(
            "gpus = 128
cp = [2, 128]
tokens_per_gpu = 1
steps = 65536"
        )
        .validate()
        .is_ok());
    }

    /// Regression (bug hunt): `scheme` was read only under `cost = "sim"`, so a misspelt one
    /// passed an `ideal` study.
    #[test]
    fn a_misspelt_scheme_is_refused_under_ideal_cost_too() {
        let base = "gpus = 4\ncp = [1]\ntokens_per_gpu = 8192\nsteps = 1\ncost = \"ideal\"";
        let e = exponential(&format!("{base}\nscheme = \"nope\""))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope"), "{e}");
        assert!(exponential(base).validate().is_ok());
    }

    fn exponential(settings: &str) -> DpcpConfig {
        toml::from_str(&format!(
            "{settings}\ntrace = \"gen:exponential:mean=1024,max=8192,seed=1\""
        ))
        .unwrap()
    }

    #[test]
    fn cp_shrinks_the_straggler_effect_and_lpt_shrinks_it_more() {
        let cfg = exponential("gpus = 16\ncp = [1, 4]\ntokens_per_gpu = 8192\nsteps = 4");
        let rows = run_dpcp(&cfg).unwrap();
        assert_eq!(rows.len(), 4);
        let get = |cp, b: &str| rows.iter().find(|r| r.cp == cp && r.balance == b).unwrap();
        assert!(get(4, "none").cv < get(1, "none").cv, "{rows:?}");
        assert!(get(4, "lpt").max_over_min <= get(4, "none").max_over_min);
        assert!(get(1, "lpt").cv < get(1, "none").cv);
        // About the same work per GPU whatever CP: only the documents carry packing cuts at
        // batch boundaries differ (fewer cuts in larger batches, so slightly more work).
        let a = get(1, "none").mean_group_ms;
        let b = get(4, "none").mean_group_ms;
        assert!((a - b).abs() / a < 0.15, "{a} {b}");
    }

    /// Under TP 8 a CP rank is 8 GPUs holding 8 GPUs' tokens at an eighth of the heads and
    /// widths each: 64 GPUs at TP 8 see the batches 8 GPUs of 8× the tokens see at TP 1,
    /// with the same spread between groups and an eighth of the work on each GPU.
    #[test]
    fn tensor_parallelism_makes_each_cp_rank_a_group_of_gpus() {
        let one =
            exponential("gpus = 8\ncp = [1, 2]\ntokens_per_gpu = 32768\nsteps = 2\nlayer = true");
        let eight = DpcpConfig {
            gpus: 64,
            tokens_per_gpu: 4096,
            tp: 8,
            ..one.clone()
        };
        let (a, b) = (run_dpcp(&one).unwrap(), run_dpcp(&eight).unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.cp, x.groups, y.tp), (y.cp, y.groups, 8));
            assert!((x.cv - y.cv).abs() < 1e-9, "{x:?} {y:?}");
            assert!((x.mean_group_ms - 8.0 * y.mean_group_ms).abs() < 1e-6 * x.mean_group_ms);
        }
        // Only TP above 1 names itself in the outputs.
        assert!(!dpcp_csv(&a).contains("tp") && dpcp_csv(&b).starts_with("cp,tp,groups"));
        let e = DpcpConfig {
            cp: vec![16],
            ..eight.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cp 16 × tp 8 = 128 GPUs a group does not divide gpus 64"),
            "{e}"
        );
        // A TP degree the model's heads do not split by is refused.
        let e = run_dpcp(&DpcpConfig {
            gpus: 48,
            tp: 3,
            ..eight
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("divide"), "{e}");
    }

    /// The whole layer adds the same linear work to every full group: the groups' spread
    /// shrinks against their mean, and the step takes longer by about that work.
    #[test]
    fn the_whole_layer_dilutes_the_straggler_effect() {
        let plain = exponential("gpus = 8\ncp = [1, 2]\ntokens_per_gpu = 8192\nsteps = 3");
        let layer = DpcpConfig {
            layer: true,
            ..plain.clone()
        };
        let (a, b) = (run_dpcp(&plain).unwrap(), run_dpcp(&layer).unwrap());
        // Llama-3-70B on the H100: 3 × 1.711 GFLOP a token at 794.5 TFLOP/s, 8192 a GPU.
        let linear =
            8192.0 * 3.0 * 2.0 * (8192.0 * 80.0 * 128.0 + 8192.0 * 8192.0 + 3.0 * 8192.0 * 28672.0)
                / 794.5e12
                * 1e3;
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.cp, &x.balance), (y.cp, &y.balance));
            assert!(y.cv < x.cv, "{x:?} {y:?}");
            assert!(y.max_over_min < x.max_over_min);
            if x.balance == "none" {
                // Carry packing fills every group: each adds exactly the linear work.
                assert!(
                    (y.mean_group_ms - x.mean_group_ms - linear).abs() < 1e-6 * linear,
                    "{x:?} {y:?}"
                );
            }
        }
        // A model without the layer's widths is refused.
        let bad = DpcpConfig {
            model: "mha-16".into(),
            ..layer
        };
        assert!(run_dpcp(&bad).unwrap_err().to_string().contains("mha-16"));
    }
}
