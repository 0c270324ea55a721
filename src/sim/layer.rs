//! The whole layer: attention as the plan runs it, between the token-linear work around it.
//!
//! Attention is what the plan decides, but it is not all a training step pays for. The Q/K/V
//! projection before it and the output projection and MLP after it cost the same per token
//! whatever the documents' lengths, so a rank holding more tokens than its peers runs longer
//! there. That is why FlashCP holds tokens equal (seed paper §3.1, "Equal Token Constraint":
//! the cost of non-attention layers scales linearly with token count) and FCP caps them (seed
//! paper §4: memory balance "influences the compute balance of non-attention modules such as
//! FFN"). Reporting attention alone hides that trade; this module prices it.
//!
//! Per pass, on the same engine and network as attention:
//! - each rank's compute stream first runs the work before attention (forward: the Q/K/V
//!   projection; backward, which runs the layer in reverse: the MLP and output projection),
//!   `tokens × FLOPs per token / GEMM rate` (the engine's per-rank start); its own K/V cannot
//!   leave before that ends;
//! - attention then runs exactly as the plan says;
//! - the work after attention starts once the rank's last step has ended and everything it
//!   receives (K/V, partial outputs, gradients) has landed;
//! - the pass ends when the last rank's does.
//!
//! Activation recomputation ([`Recompute`], `--recompute`): under `mlp` the backward pass
//! first reruns the MLP's forward GEMMs (more work before attention); under `full` it first
//! reruns the layer's whole forward pass, attention and its communication included, which is
//! simulated as a pass of its own ([`LayerPass::recomputed`]) between the forward and the
//! backward.
//!
//! Tensor parallelism ([`crate::tp`], `--tp`): the model is one GPU's share, and each rank
//! also runs the TP collectives of its tokens ([`crate::tp::stages`]) on its compute stream,
//! before and after attention as the layer orders them ([`TpComm`]). By default they are
//! exposed: each GEMM waits for its all-gather, and a reduce-scatter for its GEMM. With
//! `--tp-overlap` ([`LayerCost::tp_overlap`]) each collective runs under the GEMM it feeds or
//! drains, chunk by chunk as Transformer Engine's userbuffer overlap does, and only what
//! outlasts that GEMM is exposed.
//!
//! Under ZeRO 3 ([`super::zero3`]) each pass also gathers the layer's weights (and the
//! backward pass scatters its gradients) on a stream of its own, prefetched: a pass ends no
//! earlier than those collectives do ([`LayerPass::wait_for_weights`]).
//!
//! Not modelled: element-wise and normalisation kernels, the GEMMs' dependence on shape (all
//! run at the hardware's measured large-GEMM rate), the SMs overlapped TP collectives take
//! from their GEMMs, pipeline-parallel communication, and data-parallel gradient reduction
//! below ZeRO 3 (once a step, after the last layer's backward pass).

use serde::Serialize;

use crate::hardware::{Hardware, NcclTable, Pass};
use crate::model::{Gemm, LinearFlops, Model, Recompute};

use super::engine::{self, PassOutcome};
use super::network::{CollectiveModel, Network};
use super::program::Program;
use super::SimError;

/// How the token-linear work of a layer is priced: FLOPs per token, and the GEMM rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerCost {
    /// FLOP/s the projections and MLP run at ([`Hardware::gemm_flops_per_s`]).
    pub flops_per_s: f64,
    /// Forward FLOPs per token, before and after attention.
    pub fwd: LinearFlops,
    /// Backward FLOPs per token, before and after attention.
    pub bwd: LinearFlops,
    /// Bytes the layer keeps per token for its backward pass under `recompute`
    /// ([`Model::saved_bytes_per_token`]).
    pub saved_bytes_per_token: u64,
    /// What the backward pass recomputes.
    pub recompute: Recompute,
    /// Forward FLOPs per token the backward pass reruns before its own work
    /// ([`Model::rerun_flops_per_token`]).
    pub rerun_before: f64,
    /// Tensor-parallel degree of the model ([`Model::tp`]): above 1, every pass also runs
    /// the TP collectives ([`crate::tp::stages`]).
    pub tp: u32,
    /// Bytes per token of one TP collective: the `hidden`-wide activation.
    pub tp_bytes_per_token: u64,
    /// Forward FLOPs per token of each GEMM ([`Model::gemm_flops_per_token`]), in
    /// [`Gemm`] order: how long each TP collective can hide under its GEMM.
    pub gemm_flops: [f64; 4],
    /// Whether each TP collective overlaps the GEMM it feeds or drains
    /// ([`LayerCost::with_tp_overlap`]); exposed otherwise.
    pub tp_overlap: bool,
}

impl LayerCost {
    /// The layer cost of `model` on `hw` without recomputation, or an error naming what is
    /// missing: the model's `hidden` and `ffn_hidden`, the hardware's `gemm_tflops`.
    pub fn new(hw: &Hardware, model: &Model) -> Result<LayerCost, SimError> {
        Self::with_recompute(hw, model, Recompute::None)
    }

    /// [`LayerCost::new`] for a backward pass that recomputes as `recompute` says.
    pub fn with_recompute(
        hw: &Hardware,
        model: &Model,
        recompute: Recompute,
    ) -> Result<LayerCost, SimError> {
        let mut missing = Vec::new();
        if model.linear.is_none() {
            missing.push(format!(
                "model {} gives no `hidden` and `ffn_hidden` (the layer's widths; add them to a model TOML, see docs/hardware.md)",
                model.name
            ));
        }
        if hw.gemm_tflops.is_none() {
            missing.push(format!(
                "hardware {} gives no `gemm_tflops` (the measured large-GEMM rate; add it to a hardware TOML)",
                hw.name
            ));
        }
        match (
            model.linear_flops_per_token(Pass::Fwd),
            model.linear_flops_per_token(Pass::Bwd),
            model.saved_bytes_per_token(recompute),
            model.rerun_flops_per_token(recompute),
            hw.gemm_flops_per_s(),
        ) {
            (
                Some(fwd),
                Some(bwd),
                Some(saved_bytes_per_token),
                Some(rerun_before),
                Some(flops_per_s),
            ) => Ok(LayerCost {
                flops_per_s,
                fwd,
                bwd,
                saved_bytes_per_token,
                recompute,
                rerun_before,
                tp: model.tp.max(1),
                tp_bytes_per_token: model.stream_bytes(model.tp.max(1).into()),
                gemm_flops: [Gemm::Qkv, Gemm::Out, Gemm::MlpIn, Gemm::MlpOut]
                    .map(|g| model.gemm_flops_per_token(g).unwrap_or(0.0)),
                tp_overlap: false,
            }),
            _ => Err(SimError::Mismatch(format!(
                "the whole-layer simulation needs the layer's shape and a GEMM rate: {}",
                missing.join("; ")
            ))),
        }
    }

    /// The model's FLOPs per token in `pass`, split at attention (what MFU counts).
    pub fn flops(&self, pass: Pass) -> LinearFlops {
        match pass {
            Pass::Fwd => self.fwd,
            Pass::Bwd => self.bwd,
        }
    }

    /// The model's FLOPs per token over `passes`, before and after attention together.
    pub fn flops_per_token(&self, passes: &[Pass]) -> f64 {
        passes.iter().map(|&p| self.flops(p).total()).sum()
    }

    /// FLOPs per token `pass` runs, split at attention: the model's, and before the backward
    /// pass's own work what it recomputes ([`LayerCost::rerun_before`]).
    pub fn run_flops(&self, pass: Pass) -> LinearFlops {
        match pass {
            Pass::Fwd => self.fwd,
            Pass::Bwd => LinearFlops {
                before: self.bwd.before + self.rerun_before,
                ..self.bwd
            },
        }
    }

    /// This cost with each TP collective overlapping the GEMM it feeds (an all-gather) or
    /// drains (a reduce-scatter), as Megatron's `--tp-comm-overlap` runs them: only the part
    /// of a collective that outlasts one run of its GEMM is exposed. No effect without TP.
    pub fn with_tp_overlap(self, tp_overlap: bool) -> LayerCost {
        LayerCost { tp_overlap, ..self }
    }

    /// Forward FLOPs per token of `gemm`.
    pub fn gemm(&self, gemm: Gemm) -> f64 {
        self.gemm_flops[gemm as usize]
    }

    /// Whether the backward pass reruns the whole forward pass first ([`Recompute::Full`]).
    pub fn reruns_forward(&self) -> bool {
        self.recompute == Recompute::Full
    }

    /// Nanoseconds of `flops_per_token` work on `tokens` tokens. Refused past the longest
    /// step the simulator times ([`super::program::MAX_STEP_NS`]): a hand-made GEMM rate of
    /// 1e-300 TFLOP/s saturated `u64`, and the sums after it wrapped to a layer shorter than
    /// its attention (bug hunt).
    pub fn ns(&self, tokens: u64, flops_per_token: f64) -> Result<u64, SimError> {
        let ns = tokens as f64 * flops_per_token / self.flops_per_s * 1e9;
        if ns.is_nan() || ns >= super::program::MAX_STEP_NS {
            return Err(SimError::Mismatch(format!(
                "the projections and MLP of {tokens} tokens would take {:.3e} s at {:.3e} TFLOP/s, beyond the {:.0e} s one step may take in the simulator",
                ns * 1e-9,
                self.flops_per_s * 1e-12,
                super::program::MAX_STEP_NS * 1e-9
            )));
        }
        Ok(ns.round() as u64)
    }

    /// Bytes one layer keeps for the backward pass on a rank holding `tokens` (padding
    /// included: it is stored as if it were data). Saturating: a hand-made plan's 2⁶⁰ tokens
    /// read as "more than any GPU has".
    pub fn saved_bytes(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.saved_bytes_per_token)
    }
}

/// Prices the tensor-parallel collectives of a rank's tokens: ring all-gathers and
/// reduce-scatters among the `tp` GPUs of one node, at NCCL's measured bus bandwidth when the
/// hardware has a table (else NVLink's).
pub struct TpComm<'a> {
    coll: CollectiveModel<'a>,
    members: Vec<u32>,
    bytes_per_token: u64,
}

impl<'a> TpComm<'a> {
    /// The group of `cost.tp` GPUs on `node` (a network whose node holds them all, see
    /// [`TpComm::node`]); `None` without tensor parallelism.
    pub fn new(
        cost: &LayerCost,
        node: &'a Network,
        nccl: Option<&'a NcclTable>,
    ) -> Option<TpComm<'a>> {
        (cost.tp > 1).then(|| TpComm {
            coll: CollectiveModel::new(node, nccl),
            members: (0..cost.tp).collect(),
            bytes_per_token: cost.tp_bytes_per_token,
        })
    }

    /// The network of one TP group: `hw`'s links, with a node of exactly `tp` GPUs.
    pub fn node(hw: &Hardware, tp: u32) -> Network {
        let mut node = hw.clone();
        node.gpus_per_node = tp.max(1);
        Network::new(&node)
    }

    /// Nanoseconds of TP collectives `stages` leave exposed on a rank's stream with `tokens`
    /// tokens: every collective's whole time, or under [`LayerCost::tp_overlap`] what
    /// outlasts one run of its GEMM.
    pub fn exposed_ns(
        &self,
        stages: &[crate::tp::Stage],
        tokens: u64,
        cost: &LayerCost,
    ) -> Result<u64, SimError> {
        let bytes = tokens.saturating_mul(self.bytes_per_token);
        let mut ns = 0.0;
        for s in stages {
            let Some(op) = s.collective else { continue };
            let c = self.coll.ring_ns(op, &self.members, bytes)? as f64;
            ns += if cost.tp_overlap {
                let gemm = tokens as f64 * cost.gemm(s.gemm) / cost.flops_per_s * 1e9;
                (c - gemm).max(0.0)
            } else {
                c
            };
        }
        Ok(ns.round() as u64)
    }

    /// Nanoseconds of TP collectives exposed in a whole `pass` on `tokens` tokens.
    pub fn pass_ns(&self, pass: Pass, tokens: u64, cost: &LayerCost) -> Result<u64, SimError> {
        let [before, after] = crate::tp::stages(pass, cost.recompute);
        Ok(self.exposed_ns(&before, tokens, cost)? + self.exposed_ns(&after, tokens, cost)?)
    }
}

/// The token-linear part of a layer as a planner's estimate prices it for one rank, without
/// the engine: the projections and MLP of its tokens, what the backward pass recomputes
/// (the MLP's forward, or under [`Recompute::Full`] the whole forward pass), and the exposed TP
/// collectives, over the passes judged. `hybrid` and budgeted `auto` add it to their attention
/// estimate, so they rank candidates by the layer the command reports (bug hunt: under
/// `--recompute full` a budgeted `auto` kept Ulysses' plan, 536.917 against wlb-llm's 535.893
/// ms a layer, while recording that it judged with recomputation).
pub struct LinearEstimate {
    cost: LayerCost,
    /// The TP group's network and NCCL table, when the model is tensor-parallel.
    tp: Option<(Network, Option<NcclTable>)>,
}

impl LinearEstimate {
    /// For `model` on `hw`, recomputing as `recompute` says, TP collectives overlapped when
    /// `tp_overlap`; an error names what the layer's cost lacks ([`LayerCost::new`]).
    pub fn new(
        hw: &Hardware,
        model: &Model,
        recompute: Recompute,
        tp_overlap: bool,
    ) -> Result<LinearEstimate, SimError> {
        let cost = LayerCost::with_recompute(hw, model, recompute)?.with_tp_overlap(tp_overlap);
        let tp = match cost.tp > 1 {
            true => Some((TpComm::node(hw, cost.tp), hw.nccl_table()?)),
            false => None,
        };
        Ok(LinearEstimate { cost, tp })
    }

    /// The passes a layer runs when `passes` are judged: under [`Recompute::Full`] the
    /// backward pass first reruns the forward pass, attention, projections, MLP and TP
    /// collectives alike.
    pub fn runs(&self, passes: &[Pass]) -> Vec<Pass> {
        let mut all = passes.to_vec();
        if self.cost.reruns_forward() && passes.contains(&Pass::Bwd) {
            all.push(Pass::Fwd);
        }
        all
    }

    /// Seconds of token-linear work (with what the backward pass recomputes before its own,
    /// [`LayerCost::run_flops`]) and exposed TP collectives of `runs` ([`LinearEstimate::runs`])
    /// on a rank holding `tokens` tokens.
    pub fn seconds(&self, tokens: u64, runs: &[Pass]) -> Result<f64, SimError> {
        let tp = self
            .tp
            .as_ref()
            .and_then(|(node, nccl)| TpComm::new(&self.cost, node, nccl.as_ref()));
        let mut ns = 0;
        for &pass in runs {
            ns += self.cost.ns(tokens, self.cost.run_flops(pass).total())?;
            if let Some(tp) = &tp {
                ns += tp.pass_ns(pass, tokens, &self.cost)?;
            }
        }
        Ok(ns as f64 * 1e-9)
    }
}

/// One pass of the whole layer; it ends at `outcome.end_ns` ([`LayerPass::end_ns`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPass {
    /// The pass.
    pub pass: Pass,
    /// A forward pass the backward pass reruns ([`Recompute::Full`]): its work is time, not
    /// model FLOPs.
    pub recomputed: bool,
    /// Per rank: when it finished the work after attention (under ZeRO 3 it may then still
    /// wait for the collectives: [`LayerPass::rank_end`]).
    pub rank_end_ns: Vec<u64>,
    /// Per rank: nanoseconds of token-linear work (before plus after attention).
    pub linear_ns: Vec<u64>,
    /// Per rank: nanoseconds of exposed tensor-parallel collectives (all 0 without TP).
    pub tp_ns: Vec<u64>,
    /// Under ZeRO 3: nanoseconds of the pass's weight gathers and gradient reduce-scatter
    /// (the same on every rank); `None` otherwise.
    pub zero3_ns: Option<u64>,
    /// Under ZeRO 3: how long those collectives outlast the pass's own work, which
    /// [`LayerPass::end_ns`] includes.
    pub zero3_exposed_ns: u64,
    /// Under ZeRO 3: when, from the pass's start, its collectives are done (those hidden
    /// under a rerun forward pass before it already counted); no rank ends the pass before.
    pub zero3_ready_ns: u64,
    /// Nanoseconds the busiest NIC direction of any rank spends on the pass's own attention
    /// traffic ([`super::program::Program::nic_busy_ns`]): what a collective across nodes
    /// that overlaps the pass shares the NICs with. Counted by a simulator that prices
    /// training ([`super::Simulator::with_training`]), whose collectives read it; 0 otherwise.
    pub nic_ns: u64,
    /// The engine's outcome with the token-linear work added to each rank's timeline
    /// ([`super::RankTimeline::linear`]), its finish and the pass's end moved to the layer's: what a
    /// Gantt chart of the whole layer draws.
    pub outcome: PassOutcome,
}

/// Run `attention` (one pass's program) between the token-linear work of ranks holding
/// `tokens` each.
pub fn run(
    attention: &Program,
    tokens: &[u64],
    cost: &LayerCost,
    net: &Network,
    coll: &CollectiveModel<'_>,
    tp: Option<&TpComm<'_>>,
) -> Result<LayerPass, SimError> {
    let f = cost.run_flops(attention.pass);
    let [tp_before, tp_after] = crate::tp::stages(attention.pass, cost.recompute);
    let tp_ns =
        |t: u64, stages: &[crate::tp::Stage]| tp.map_or(Ok(0), |tp| tp.exposed_ns(stages, t, cost));
    let (mut before, mut after, mut tp_total) = (Vec::new(), Vec::new(), Vec::new());
    // Ranks mostly hold equal tokens: price each count's collectives once (each is an NCCL
    // table lookup per stage).
    let mut priced: std::collections::HashMap<u64, (u64, u64)> = Default::default();
    for &t in tokens {
        let (b, a) = match priced.get(&t) {
            Some(&ba) => ba,
            None => {
                let ba = (tp_ns(t, &tp_before)?, tp_ns(t, &tp_after)?);
                priced.insert(t, ba);
                ba
            }
        };
        before.push(cost.ns(t, f.before)? + b);
        after.push(cost.ns(t, f.after)? + a);
        tp_total.push(b + a);
    }
    let mut outcome = engine::run(attention, &before, net, coll)?;
    let mut rank_end_ns = Vec::with_capacity(tokens.len());
    for (r, (o, tl)) in outcome
        .ranks
        .iter_mut()
        .zip(&mut outcome.timeline)
        .enumerate()
    {
        let post = o.compute_end_ns.max(o.inputs_done_ns);
        let end = post + after[r];
        tl.linear = [(0, before[r]), (post, end)]
            .into_iter()
            .filter(|(a, b)| b > a)
            .collect();
        o.finish_ns = o.finish_ns.max(end);
        rank_end_ns.push(end);
    }
    // Every message lands at a rank that ends its layer after it: the pass ends with the last.
    outcome.end_ns = outcome
        .end_ns
        .max(rank_end_ns.iter().copied().max().unwrap_or(0));
    Ok(LayerPass {
        pass: attention.pass,
        recomputed: false,
        rank_end_ns,
        linear_ns: before
            .iter()
            .zip(&after)
            .zip(&tp_total)
            .map(|((b, a), c)| b + a - c)
            .collect(),
        tp_ns: tp_total,
        zero3_ns: None,
        zero3_exposed_ns: 0,
        zero3_ready_ns: 0,
        nic_ns: 0,
        outcome,
    })
}

impl LayerPass {
    /// When the last rank finished the work after attention.
    pub fn end_ns(&self) -> u64 {
        self.outcome.end_ns
    }

    /// When rank `r` finished the pass: its work after attention, and under ZeRO 3 the
    /// collectives the whole group waits for.
    pub fn rank_end(&self, r: usize) -> u64 {
        self.rank_end_ns[r].max(self.zero3_ready_ns)
    }

    /// This forward pass, as the backward pass reruns it under [`Recompute::Full`]: under
    /// ZeRO 3 it runs on the weights the backward pass gathers, so without a gather of its
    /// own.
    pub fn rerun(&self) -> LayerPass {
        let mut rerun = LayerPass {
            recomputed: true,
            ..self.clone()
        };
        rerun.outcome.end_ns -= rerun.zero3_exposed_ns;
        rerun.zero3_ns = rerun.zero3_ns.map(|_| 0);
        rerun.zero3_exposed_ns = 0;
        rerun.zero3_ready_ns = 0;
        rerun
    }

    /// Under ZeRO 3: the pass also runs `comm_ns` of weight gathers and gradient scatters
    /// on their own stream, prefetched so that they overlap its work and, for a backward
    /// pass under full recomputation, the `hidden_ns` of the rerun forward pass before it.
    /// The pass then ends no earlier than they do. Collectives across nodes share the NICs
    /// with the `shared_nic_ns` those passes' own messages keep them busy: the NICs carry
    /// both, so the collectives end no earlier than the two together would take.
    pub fn wait_for_weights(&mut self, comm_ns: u64, hidden_ns: u64, shared_nic_ns: u64) {
        let busy = comm_ns.saturating_add(shared_nic_ns);
        let exposed = busy.saturating_sub(self.end_ns().saturating_add(hidden_ns));
        self.zero3_ns = Some(comm_ns);
        self.zero3_exposed_ns = exposed;
        self.zero3_ready_ns = busy.saturating_sub(hidden_ns);
        self.outcome.end_ns += exposed;
    }

    /// Name as a Gantt chart captions it: `fwd`, `bwd`, or `recompute` for a rerun forward.
    pub fn label(&self) -> String {
        if self.recomputed {
            "recompute".to_string()
        } else {
            self.pass.to_string()
        }
    }
}

/// Whole-layer results of a plan, summed over the simulated passes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerMetrics {
    /// One transformer layer, attention as planned plus the projections and MLP: when the
    /// slowest rank finished, summed over passes.
    pub layer_time_ms: f64,
    /// The backward pass's part of `layer_time_ms` (with the forward pass it reruns under
    /// full recomputation): the window in which data parallelism's gradient reduction can
    /// hide on a step's last micro-batch ([`super::step`]). Not in JSON: with
    /// `layer_time_ms` it says no more than the passes' own times.
    #[serde(skip)]
    pub backward_ms: f64,
    /// Mean over ranks of the token-linear work.
    pub linear_mean_ms: f64,
    /// The rank with the most tokens: its token-linear work.
    pub linear_max_ms: f64,
    /// (max − mean) / max of tokens per rank: the imbalance the token-linear work inherits.
    pub token_imbalance: f64,
    /// Tokens on the busiest rank, padding included: what a training step's output layer
    /// and pipeline sends carry for this window ([`crate::sim::step`]). Not in the JSON.
    #[serde(skip)]
    pub max_rank_tokens: u64,
    /// The attention lower bound plus every document's token-linear work spread evenly over
    /// the ranks (no padding, no imbalance, nothing exposed).
    pub layer_lower_bound_ms: f64,
    /// layer_time_ms / layer_lower_bound_ms.
    pub layer_vs_lower_bound: f64,
    /// Model FLOPs of the layer (attention as the simulator counts it, plus the projections
    /// and MLP of the real tokens; padding is not the model's work) / (layer time × ranks ×
    /// dense peak).
    pub layer_mfu: f64,
    /// The rank with the most tokens: the bytes one layer keeps on it for the backward pass
    /// (its tokens × [`LayerCost::saved_bytes_per_token`]). A GPU holds this once per layer
    /// it runs, unless it recomputes activations: the figure that says whether a placement
    /// fits, where `mem_max_bytes` counts attention's working buffers only.
    pub act_max_bytes: u64,
    /// What the backward pass recomputes (`--recompute`); absent when nothing is.
    #[serde(skip_serializing_if = "Recompute::is_off")]
    pub recompute: Recompute,
    /// Under TP: the rank spending longest in exposed TP collectives, its time (all
    /// passes); absent without TP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp_comm_max_ms: Option<f64>,
    /// Under TP: whether the collectives overlapped their GEMMs (`--tp-overlap`); absent
    /// when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tp_overlap: bool,
    /// Under ZeRO 3: the layer's weight gathers and gradient reduce-scatter, all passes
    /// (the same on every rank); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero3_comm_ms: Option<f64>,
    /// Under ZeRO 3: how much of that the passes' own work did not hide, part of
    /// `layer_time_ms`; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero3_exposed_ms: Option<f64>,
    /// What the fullest GPU holds over a training step, when the simulator counts it
    /// ([`super::Simulator::with_training`]); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub footprint: Option<crate::footprint::Footprint>,
    /// The busiest NIC direction's time with CP's own messages in the forward pass, ms
    /// ([`super::program::Program::nic_busy_ns`]): what an overlapped weight gather shares
    /// the NICs with. Set by the simulator; not reported.
    #[serde(skip)]
    pub nic_fwd_ms: f64,
    /// The same in the backward pass (the rerun forward pass's too under full
    /// recomputation): what an overlapped gradient reduction shares the NICs with.
    #[serde(skip)]
    pub nic_bwd_ms: f64,
    /// The training step around this layer, when the caller priced one
    /// ([`super::Simulator::step`], `fcp simulate --micro-batches`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<super::step::StepMetrics>,
}

/// Whole-layer metrics of a plan from its layer passes. `tokens`: per rank (padding
/// included: it is computed as if it were data); `documents`: the real document lengths;
/// `attention_flops`: what attention computed, all ranks and passes;
/// `fixed_lower_bound_ms`: the bound of what the passes ran besides the token-linear GEMMs:
/// [`super::lower_bound_ms`] for the same passes (the rerun forward pass included), plus under
/// TP the collectives on evenly spread tokens.
pub fn metrics(
    cost: &LayerCost,
    passes: &[LayerPass],
    tokens: &[u64],
    documents: &[u64],
    attention_flops: f64,
    fixed_lower_bound_ms: f64,
    peak_flops_per_s: f64,
) -> LayerMetrics {
    const MS: f64 = 1e-6;
    let ranks = tokens.len().max(1) as f64;
    let layer_time_ms: f64 = passes.iter().map(|p| p.end_ns() as f64 * MS).sum();
    let backward_ms: f64 = passes
        .iter()
        .filter(|p| p.pass == Pass::Bwd || p.recomputed)
        .map(|p| p.end_ns() as f64 * MS)
        .sum();
    let linear: Vec<f64> = (0..tokens.len())
        .map(|r| passes.iter().map(|p| p.linear_ns[r] as f64 * MS).sum())
        .collect();
    // FLOPs per token over the passes: what ran, recomputation included, for the bound; the
    // model's alone for the MFU (recomputed work is time spent, not model FLOPs: Korthikanti
    // et al. 2022 §6, model vs hardware FLOPs utilisation). Both over real tokens.
    let run_per_token: f64 = passes.iter().map(|p| cost.run_flops(p.pass).total()).sum();
    let model_passes: Vec<Pass> = passes
        .iter()
        .filter(|p| !p.recomputed)
        .map(|p| p.pass)
        .collect();
    let model_per_token = cost.flops_per_token(&model_passes);
    let real: u64 = documents.iter().sum();
    // Under ZeRO 3 (any pass gathered) no pass ends before its collectives: their sum
    // bounds the layer too.
    let zero3 = passes.iter().any(|p| p.zero3_ns.is_some());
    let zero3_ms =
        |ns: fn(&LayerPass) -> u64| zero3.then(|| passes.iter().map(ns).sum::<u64>() as f64 * MS);
    let zero3_comm_ms = zero3_ms(|p| p.zero3_ns.unwrap_or(0));
    let layer_lower_bound_ms = (fixed_lower_bound_ms
        + real as f64 * run_per_token / cost.flops_per_s * 1e3 / ranks)
        .max(zero3_comm_ms.unwrap_or(0.0));
    let token_f: Vec<f64> = tokens.iter().map(|&t| t as f64).collect();
    // Model FLOPs: real tokens only, as `mfu` counts attention. Padding rows run (and are in
    // the time) but are not the model's work. (Regression, bug hunt: a magi plan of 1,807 real
    // tokens padded to 16,384 read 77 % layer MFU against 5 % attention MFU.)
    let layer_flops = attention_flops + real as f64 * model_per_token;
    LayerMetrics {
        layer_time_ms,
        backward_ms,
        linear_mean_ms: linear.iter().sum::<f64>() / ranks,
        linear_max_ms: linear.iter().copied().fold(0.0, f64::max),
        token_imbalance: crate::plan::imbalance(&token_f),
        max_rank_tokens: tokens.iter().copied().max().unwrap_or(0),
        layer_lower_bound_ms,
        layer_vs_lower_bound: if layer_lower_bound_ms > 0.0 {
            layer_time_ms / layer_lower_bound_ms
        } else {
            1.0
        },
        layer_mfu: if layer_time_ms > 0.0 {
            layer_flops / (layer_time_ms * 1e-3 * ranks * peak_flops_per_s)
        } else {
            0.0
        },
        act_max_bytes: cost.saved_bytes(tokens.iter().copied().max().unwrap_or(0)),
        recompute: cost.recompute,
        tp_comm_max_ms: (cost.tp > 1).then(|| {
            (0..tokens.len())
                .map(|r| passes.iter().map(|p| p.tp_ns[r] as f64 * MS).sum::<f64>())
                .fold(0.0, f64::max)
        }),
        tp_overlap: cost.tp > 1 && cost.tp_overlap,
        zero3_comm_ms,
        zero3_exposed_ms: zero3_ms(|p| p.zero3_exposed_ns),
        footprint: None,
        nic_fwd_ms: 0.0,
        nic_bwd_ms: 0.0,
        step: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Collective;
    use crate::plan::Mask;
    use crate::planners::testing::with_ctx;
    use crate::planners::{Planner, Ring};
    use crate::sim::{PassSel, Simulator};
    use crate::trace::Batch;

    fn sim(model: &str) -> Result<Simulator, SimError> {
        Simulator::new(Hardware::load("h100").unwrap(), Model::load(model).unwrap())?.with_layer()
    }

    fn recomputing(recompute: Recompute) -> Simulator {
        Simulator::new(
            Hardware::load("h100").unwrap(),
            Model::load("llama3-70b").unwrap(),
        )
        .unwrap()
        .with_recompute(recompute)
        .unwrap()
    }

    fn zigzag_plan() -> crate::plan::Plan {
        use crate::planners::Zigzag;
        let batch = Batch::new(0, vec![9000, 3000, 700, 300]);
        with_ctx(4, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap()
    }

    #[test]
    fn full_recomputation_reruns_the_forward_pass_and_keeps_the_inputs_alone() {
        let plan = zigzag_plan();
        let keep = recomputing(Recompute::None)
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let full = recomputing(Recompute::Full)
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let fwd = recomputing(Recompute::None)
            .simulate(&plan, PassSel::Fwd)
            .unwrap();
        let (k, f, fw) = (
            keep.metrics.layer.as_ref().unwrap(),
            full.metrics.layer.as_ref().unwrap(),
            fwd.metrics.layer.as_ref().unwrap(),
        );
        // The backward pass pays the forward pass once more, attention and all.
        assert!(
            (f.layer_time_ms - (k.layer_time_ms + fw.layer_time_ms)).abs() < 1e-9,
            "{f:?}"
        );
        // The forward pass is what the backward leaves of the layer; the rerun belongs to
        // the backward pass (the window data parallelism's reduction can hide in).
        assert!((k.backward_ms + fw.layer_time_ms - k.layer_time_ms).abs() < 1e-9);
        assert!((f.backward_ms - (k.backward_ms + fw.layer_time_ms)).abs() < 1e-9);
        assert_eq!(fw.backward_ms, 0.0);
        assert!((f.linear_mean_ms - (k.linear_mean_ms + fw.linear_mean_ms)).abs() < 1e-9);
        // Attention as planned is unchanged: the rerun is the layer's.
        assert_eq!(
            full.metrics.attention_time_ms,
            keep.metrics.attention_time_ms
        );
        // The same model FLOPs over a longer time: MFU falls by the time's ratio.
        assert!(
            (f.layer_mfu * f.layer_time_ms - k.layer_mfu * k.layer_time_ms).abs() < 1e-9,
            "{f:?} {k:?}"
        );
        // The bound covers the rerun too: the forward's bound added.
        assert!(
            (f.layer_lower_bound_ms - (k.layer_lower_bound_ms + fw.layer_lower_bound_ms)).abs()
                < 1e-9
        );
        assert!(f.layer_vs_lower_bound >= 1.0);
        // Kept: each token's layer input, 8,192 wide at 16 bits.
        let most = plan.tokens_per_rank().into_iter().max().unwrap();
        assert_eq!(f.act_max_bytes, most * 8192 * 2);
        assert_eq!(f.recompute, Recompute::Full);
        // The backward pass alone reruns the forward too, simulated on its own.
        let bwd = recomputing(Recompute::Full)
            .simulate(&plan, PassSel::Bwd)
            .unwrap();
        let keep_bwd = recomputing(Recompute::None)
            .simulate(&plan, PassSel::Bwd)
            .unwrap();
        let (b, kb) = (
            bwd.metrics.layer.unwrap().layer_time_ms,
            keep_bwd.metrics.layer.unwrap().layer_time_ms,
        );
        assert!((b - (kb + fw.layer_time_ms)).abs() < 1e-9, "{b} {kb}");
        // Forward alone (inference) recomputes nothing.
        let f_only = recomputing(Recompute::Full)
            .simulate(&plan, PassSel::Fwd)
            .unwrap();
        assert_eq!(
            f_only.metrics.layer.unwrap().layer_time_ms,
            fw.layer_time_ms
        );
    }

    #[test]
    fn mlp_recomputation_reruns_the_mlp_before_the_backward_pass() {
        let plan = zigzag_plan();
        let keep = recomputing(Recompute::None)
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let mlp = recomputing(Recompute::Mlp)
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let (k, m) = (
            keep.metrics.layer.as_ref().unwrap(),
            mlp.metrics.layer.as_ref().unwrap(),
        );
        // Every rank's token-linear work grows by its tokens × the MLP's forward FLOPs.
        let rerun = 2.0 * 3.0 * 8192.0 * 28672.0;
        for (r, (a, b)) in mlp.ranks.iter().zip(&keep.ranks).enumerate() {
            let want = b.linear_ms.unwrap() + a.tokens as f64 * rerun / 794.5e12 * 1e3;
            assert!(
                (a.linear_ms.unwrap() - want).abs() < 1e-5,
                "rank {r}: {a:?}"
            );
            assert_eq!(
                b.act_bytes.unwrap() - a.act_bytes.unwrap(),
                a.tokens * 3 * 28672 * 2
            );
        }
        assert!(m.layer_time_ms > k.layer_time_ms);
        assert!(
            (m.layer_mfu * m.layer_time_ms - k.layer_mfu * k.layer_time_ms).abs() < 1e-9,
            "the same model FLOPs"
        );
        assert!(m.layer_vs_lower_bound >= 1.0);
    }

    #[test]
    fn on_one_rank_the_layer_is_its_linear_work_then_attention() {
        let plan = with_ctx(1, Mask::Causal, |ctx| {
            Ring.plan(&Batch::new(0, vec![6000, 2000]), ctx)
        })
        .unwrap();
        let r = sim("llama3-70b")
            .unwrap()
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let l = r.metrics.layer.as_ref().unwrap();
        // Nothing to wait for: the three pieces run back to back (±1 ns of rounding each).
        let sum = r.metrics.attention_time_ms + l.linear_mean_ms;
        assert!((l.layer_time_ms - sum).abs() < 5e-6, "{l:?} vs {sum}");
        assert_eq!(l.linear_mean_ms, l.linear_max_ms);
        assert_eq!(l.token_imbalance, 0.0);
        assert_eq!(r.ranks[0].linear_ms, Some(l.linear_mean_ms));
        // The linear work: 8000 tokens × 3 × 1.711 GFLOP at 794.5 TFLOP/s.
        let per_token =
            3.0 * 2.0 * (8192.0 * 80.0 * 128.0 + 8192.0 * 8192.0 + 3.0 * 8192.0 * 28672.0);
        assert!((l.linear_mean_ms - 8000.0 * per_token / 794.5e9).abs() < 1e-5);
        // What the layer keeps for the backward pass: every token's saved activations.
        let saved = Model::load("llama3-70b")
            .unwrap()
            .saved_bytes_per_token(Recompute::None)
            .unwrap();
        assert_eq!(l.act_max_bytes, 8000 * saved);
        assert_eq!(r.ranks[0].act_bytes, Some(8000 * saved));
        // The bound: the attention bound plus the linear work, nothing lost on one rank but
        // the launch overhead the attention bound leaves out.
        assert!(
            l.layer_vs_lower_bound >= 1.0 && l.layer_vs_lower_bound < 1.01,
            "{l:?}"
        );
    }

    /// One GPU of a TP-8 group, one CP rank: attention over its 8 heads, its share of the
    /// GEMMs, and four all-gathers and four reduce-scatters of its tokens over the node.
    #[test]
    fn under_tensor_parallelism_each_pass_pays_two_gathers_and_two_scatters() {
        let (hw, shard) = crate::tp::split(
            &Hardware::load("h100").unwrap(),
            &Model::load("llama3-70b").unwrap(),
            8,
        )
        .unwrap();
        let batch = Batch::new(0, vec![6000, 2000]);
        let ctx = crate::planners::PlanContext {
            ranks: 1,
            tokens_per_rank: 8000,
            mask: Mask::Causal,
            model: &shard,
            hardware: &hw,
            judge: crate::planners::Judge::default(),
        };
        let plan = Ring.plan(&batch, &ctx).unwrap();
        assert_eq!((plan.q_heads, plan.kv_heads, plan.tp), (8, 1, Some(8)));
        let s = Simulator::new(hw.clone(), shard.clone())
            .unwrap()
            .with_layer()
            .unwrap();
        let r = s.simulate(&plan, PassSel::Both).unwrap();
        let l = r.metrics.layer.as_ref().unwrap();
        // Each collective: 8,000 tokens × 8,192 × 2 bytes over 8 GPUs of one node, ring
        // time at the NCCL table's bus bandwidth for that size.
        let nccl = crate::hardware::NcclTable::load("h200-8gpu").unwrap();
        let bytes = 8000 * 8192 * 2;
        let ring = |op| {
            let bw = nccl.busbw_gbs(op, 8, bytes).unwrap().gbs;
            (7.0 * 3000.0 + bytes as f64 * 7.0 / 8.0 / bw).ceil() * 1e-6
        };
        let want = 4.0 * (ring(Collective::AllGather) + ring(Collective::ReduceScatter));
        let tp_ms = l.tp_comm_max_ms.unwrap();
        assert!((tp_ms - want).abs() < 1e-9, "{tp_ms} vs {want}");
        assert_eq!(r.ranks[0].tp_comm_ms, Some(tp_ms));
        assert_eq!(r.tp, 8);
        // On one rank the pieces run back to back; the linear work is an eighth of TP 1's.
        let sum = r.metrics.attention_time_ms + l.linear_mean_ms + tp_ms;
        assert!((l.layer_time_ms - sum).abs() < 1e-5, "{l:?} vs {sum}");
        let whole = sim("llama3-70b").unwrap();
        let full_plan = with_ctx(1, Mask::Causal, |ctx| Ring.plan(&batch, ctx)).unwrap();
        let w = whole.simulate(&full_plan, PassSel::Both).unwrap();
        let wl = w.metrics.layer.unwrap();
        assert!((wl.linear_mean_ms / l.linear_mean_ms - 8.0).abs() < 1e-4);
        assert_eq!(wl.tp_comm_max_ms, None);
        // Sequence parallelism: every activation but 8 bytes of norm statistics per token is
        // spread over the eight GPUs.
        assert!(wl.act_max_bytes.abs_diff(8 * l.act_max_bytes) <= 8000 * 8 * 8);
        // The bound holds the TP collectives of the evenly spread tokens: one rank, exact.
        assert!(
            l.layer_vs_lower_bound >= 1.0 && l.layer_vs_lower_bound < 1.01,
            "{l:?}"
        );
        // A plan made under TP is not simulated on the whole model.
        let e = whole.simulate(&plan, PassSel::Fwd).unwrap_err().to_string();
        assert!(e.contains("split it as the plan's `tp` says"), "{e}");
        // Overlapped, each collective shows only what outlasts one run of its GEMM.
        let o = s
            .with_tp_overlap(true)
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let ol = o.metrics.layer.as_ref().unwrap();
        let mut want = 0.0;
        for pass in [Pass::Fwd, Pass::Bwd] {
            for st in crate::tp::stages(pass, Recompute::None).concat() {
                let Some(op) = st.collective else { continue };
                let gemm = 8000.0 * shard.gemm_flops_per_token(st.gemm).unwrap() / 794.5e12;
                want += (ring(op) * 1e-3 - gemm).max(0.0) * 1e3;
            }
        }
        let got = ol.tp_comm_max_ms.unwrap();
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        assert!(got < tp_ms && ol.tp_overlap && !l.tp_overlap);
        assert!((ol.layer_time_ms - (l.layer_time_ms - (tp_ms - got))).abs() < 1e-5);
    }

    #[test]
    fn the_layer_time_alone_is_the_reports_to_the_last_bit() {
        use crate::planners::Zigzag;
        let batch = Batch::new(0, vec![9000, 3000, 700, 300]);
        let plan = with_ctx(4, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap();
        for recompute in [Recompute::None, Recompute::Mlp, Recompute::Full] {
            let s = recomputing(recompute);
            for pass in [PassSel::Fwd, PassSel::Bwd, PassSel::Both] {
                let full = s.simulate(&plan, pass).unwrap().metrics.layer.unwrap();
                assert_eq!(
                    s.layer_time_ms(&plan, pass).unwrap(),
                    Some(full.layer_time_ms),
                    "{recompute:?} {pass:?}"
                );
            }
        }
        let attention_only = Simulator::new(
            Hardware::load("h100").unwrap(),
            Model::load("llama3-70b").unwrap(),
        )
        .unwrap();
        assert_eq!(
            attention_only.layer_time_ms(&plan, PassSel::Both).unwrap(),
            None
        );
    }

    /// Regression (bug hunt): `layer_mfu` counted padding rows as model work, so a magi plan
    /// of 1,807 real tokens padded to 16,384 read 77 % against an attention MFU of 5 %.
    #[test]
    fn layer_mfu_counts_the_real_tokens_as_mfu_does() {
        use crate::planners::Magi;
        let batch = Batch::new(0, vec![300, 7, 1500]);
        let plan = with_ctx(8, Mask::Full, |ctx| Magi::default().plan(&batch, ctx)).unwrap();
        assert!(plan.pad_tokens() > 0 || plan.tokens_per_rank().iter().sum::<u64>() > 1807);
        let r = sim("llama3-70b")
            .unwrap()
            .simulate(&plan, PassSel::Both)
            .unwrap();
        let l = r.metrics.layer.as_ref().unwrap();
        let attention: f64 = r.ranks.iter().map(|x| x.flops).sum();
        let cost = LayerCost::new(
            &Hardware::load("h100").unwrap(),
            &Model::load("llama3-70b").unwrap(),
        )
        .unwrap();
        let model_flops = attention + 1807.0 * cost.flops_per_token(&[Pass::Fwd, Pass::Bwd]);
        let peak = 989.4e12 * 8.0 * l.layer_time_ms * 1e-3;
        assert!((l.layer_mfu - model_flops / peak).abs() < 1e-9, "{l:?}");
    }

    #[test]
    fn reserved_communication_sms_slow_the_gemms_too() {
        let mut hw = Hardware::load("h100").unwrap();
        let full = LayerCost::new(&hw, &Model::load("llama3-8b").unwrap()).unwrap();
        hw.comm_sms = 33;
        let less = LayerCost::new(&hw, &Model::load("llama3-8b").unwrap()).unwrap();
        assert!((less.flops_per_s / full.flops_per_s - 0.75).abs() < 1e-12);
        assert_eq!(full.ns(0, full.fwd.before).unwrap(), 0);
    }

    #[test]
    fn a_pass_waits_for_the_weights_its_work_and_the_rerun_before_it_do_not_hide() {
        let plan = zigzag_plan();
        let (_, passes) = recomputing(Recompute::None)
            .simulate_layer_traced(&plan, PassSel::Fwd)
            .unwrap();
        let fwd = &passes[0];
        let end = fwd.end_ns();
        // Hidden: the pass ends as it did.
        let mut hidden = fwd.clone();
        hidden.wait_for_weights(end, 0, 0);
        assert_eq!((hidden.end_ns(), hidden.zero3_exposed_ns), (end, 0));
        assert_eq!(hidden.zero3_ns, Some(end));
        // Outlasting the pass by 1 ms: the pass ends 1 ms later...
        let mut late = fwd.clone();
        late.wait_for_weights(end + 1_000_000, 0, 0);
        assert_eq!(late.end_ns(), end + 1_000_000);
        // ...unless a rerun forward pass before it hides the rest.
        let mut behind_rerun = fwd.clone();
        behind_rerun.wait_for_weights(end + 1_000_000, 400_000, 0);
        assert_eq!(behind_rerun.zero3_exposed_ns, 600_000);
        assert_eq!(behind_rerun.end_ns(), end + 600_000);
        // Across nodes the collectives share the NICs with the pass's own messages: 1 ms
        // of gathers the pass would hide outlasts it by the 3 ms of NIC time they share.
        let mut shared = fwd.clone();
        shared.wait_for_weights(end - 1_000_000, 0, 3_000_000);
        assert_eq!(shared.zero3_ns, Some(end - 1_000_000));
        assert_eq!(
            (shared.zero3_exposed_ns, shared.end_ns()),
            (2_000_000, end + 2_000_000)
        );
        // Every rank waits for the group's collectives, the early ones longest.
        let first = (0..plan.num_ranks as usize)
            .min_by_key(|&r| fwd.rank_end_ns[r])
            .unwrap();
        assert!(fwd.rank_end_ns[first] < end);
        assert_eq!(late.rank_end(first), end + 1_000_000);
        assert_eq!(hidden.rank_end(first), end);
        // A rerun reuses the backward pass's gather: none of its own, nothing exposed.
        let rerun = late.rerun();
        assert_eq!((rerun.end_ns(), rerun.zero3_ns), (end, Some(0)));
        assert_eq!(rerun.zero3_exposed_ns, 0);
        assert_eq!(rerun.rank_end(first), fwd.rank_end_ns[first]);
    }

    #[test]
    fn a_model_or_hardware_without_the_layer_cost_says_what_is_missing() {
        let e = sim("mha-16").err().unwrap().to_string();
        assert!(
            e.contains("model mha-16 gives no `hidden` and `ffn_hidden`"),
            "{e}"
        );
        let mut hw = Hardware::load("h100").unwrap();
        hw.gemm_tflops = None;
        let e = LayerCost::new(&hw, &Model::load("mha-16").unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mha-16") && e.contains("h100 gives no `gemm_tflops`"),
            "{e}"
        );
    }
}
