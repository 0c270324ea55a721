//! A training step from its micro-batches' layer times: the pipeline's bubble and stalls,
//! and the data-parallel gradient reduction that runs once a step.
//!
//! A layer's time compares placements, but a user picks a parallel layout by what a step
//! costs, and two things a layer's time leaves out move that answer:
//!
//! - **The pipeline's bubble.** Under Megatron's 1F1B schedule a stage of `L / P` layers
//!   runs its `m` micro-batches in `(m + P − 1)` micro-batch slots: `P − 1` of them are the
//!   bubble of filling and draining the pipeline (Narayanan et al. 2021, arXiv:2104.04473
//!   §2.2: the bubble is `(P − 1) / m` of the ideal time) when the micro-batches are equal.
//!   Each slot is one micro-batch through the stage's layers, forward and backward, at the
//!   layer time simulated for its window.
//! - **The gradients' reduction over data parallelism.** Every GPU holding a copy of the same
//!   weights, the CP ranks of every replica (`dp × cp` GPUs, Megatron-Core's
//!   `get_data_parallel_group(with_context_parallel=True)`), must sum its gradients once a
//!   step. Replicated state (ZeRO 0) all-reduces them; Megatron's distributed optimizer
//!   (ZeRO 1) reduce-scatters them and all-gathers the updated weights; ZeRO 2 keeps only its
//!   shard of the gradients between micro-batches, so it reduce-scatters after every
//!   micro-batch's backward pass (DeepSpeed's ZeRO-2 under gradient accumulation) and
//!   all-gathers the weights once; ZeRO 3 does both per layer, in the layer's time already
//!   ([`super::zero3`]). Hybrid sharding adds an all-reduce of each shard across the
//!   `dp / shard_dp` groups, once a step. Gradients travel in fp32
//!   ([`GRAD_BYTES`]: Megatron reduces bf16 models' gradients in fp32,
//!   `megatron/training/arguments.py`, `accumulate_allreduce_grads_in_fp32`), the weights in
//!   the model's dtype. Each collective is a ring on the simulator's [`CollectiveModel`],
//!   over NVLink while the group fits a node and the NICs beyond.
//!
//! Without overlap (Megatron's default) the reduction follows the last backward pass and the
//! gather precedes the first forward pass: both add to the step. With `dp_overlap`
//! (Megatron's `--overlap-grad-reduce` and `--overlap-param-gather`) the reduction hides
//! under the last micro-batch's backward pass through the stage's layers (ZeRO 2's every
//! micro-batch's under its own) and the gather under the first micro-batch's forward pass;
//! what they outlast is exposed.
//!
//! Micro-batches differ: replica `r` trains windows `r·m … r·m + m − 1` of the stream, each
//! at the layer time simulated for it, and the pipeline runs them op by op
//! ([`super::pipeline`]), so a heavy window stalls the stages around it. The step is the
//! slowest replica's: the reduction waits for it.
//!
//! The last stage also runs the output layer on every micro-batch ([`output_layer`]).
//!
//! Interleaved (`training.vp` chunks a stage, Megatron's virtual pipeline stages) the bubble
//! shrinks to `(P − 1)/vp` slots, for `vp` times the sends ([`super::pipeline::interleaved`]).
//!
//! Not modelled: the embedding lookup, the loss's element-wise work, the optimizer step, and
//! the bandwidth the reduction and the pipeline's sends take from CP's traffic when they
//! overlap it.

use serde::Serialize;

use crate::footprint::{FootprintError, Training, GRAD_BYTES};
use crate::hardware::{Collective, HardwareError};
use crate::model::Model;

use super::network::CollectiveModel;
pub use super::pipeline::StageWork;
use super::pipeline::{interleaved, Load};
use super::zero3::any_straddles;
use super::{LayerMetrics, SimError};

/// Most micro-batches a step may run: far beyond any global batch (65,536 windows of 128K
/// tokens are 8.6B tokens a replica), few enough that the pipeline's schedule, which keeps
/// every op's end time, fits in memory (`2 × P × M` of them per distinct replica; the
/// largest settings still take minutes).
pub const MAX_MICRO_BATCHES: u32 = 1 << 16;

/// The order in which a replica runs its micro-batches within a step. Gradients accumulate
/// over the step, so any order trains the same model; under a pipeline it changes the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MicroBatchOrder {
    /// As the data loader yields them: the stream's order.
    #[default]
    Stream,
    /// Lightest at both ends, heaviest in the middle, each next to the ones most like it:
    /// 1F1B pairs a stage's forward of one micro-batch with the backward of an earlier one,
    /// so neighbours alike seldom stall a stage, and light ones first and last shorten the
    /// fill and drain ([`super::pipeline`]). A heuristic: it sorts by a micro-batch's whole
    /// time, blind to its split between the passes, and can lose to the stream's order.
    Hill,
}

impl MicroBatchOrder {
    /// Every order.
    pub const ALL: [MicroBatchOrder; 2] = [MicroBatchOrder::Stream, MicroBatchOrder::Hill];

    /// `drawn` rearranged into this order, by each micro-batch's time (stable: ties keep
    /// the stream's order).
    fn arrange(self, drawn: Vec<MicroBatch>) -> Vec<MicroBatch> {
        match self {
            MicroBatchOrder::Stream => drawn,
            MicroBatchOrder::Hill => {
                let mut sorted = drawn;
                sorted.sort_by(|a, b| a.layer_ms.total_cmp(&b.layer_ms));
                // Every other one up the front slope, the rest down the back.
                let (mut up, mut down) = (Vec::new(), Vec::new());
                for (i, b) in sorted.into_iter().enumerate() {
                    if i % 2 == 0 {
                        up.push(b);
                    } else {
                        down.push(b);
                    }
                }
                up.extend(down.into_iter().rev());
                up
            }
        }
    }
}

/// How a step's `dp × m` windows are dealt to the data-parallel replicas. Each replica
/// trains `m` of them whichever way, so the global batch is the same; what changes is how
/// long the others wait for the slowest at the gradient reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Deal {
    /// As the stream yields them: replica `r` takes windows `r·m … r·m + m − 1`.
    #[default]
    Stream,
    /// Longest processing time first: the heaviest window to the replica with the least
    /// work that still has room, until each holds `m`. The data-parallel balancing of
    /// WLB-LLM's packing and of Megatron's DP-balanced scheduler (anchors-cp.md §3–4), at
    /// the granularity of whole windows.
    Lpt,
}

/// How a training step runs around its layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOptions {
    /// Micro-batches (windows) each pipeline runs a step: gradient accumulation steps times
    /// nothing else (the global batch is this times `dp` windows).
    pub micro_batches: u32,
    /// The data-parallel reduction overlaps the last backward pass and the gather the first
    /// forward pass (Megatron's `--overlap-grad-reduce`, `--overlap-param-gather`).
    pub dp_overlap: bool,
    /// The order each replica runs its micro-batches in ([`StepOptions::with_order`]).
    pub order: MicroBatchOrder,
    /// How the windows are dealt to the replicas ([`StepOptions::with_deal`]).
    pub deal: Deal,
}

impl StepOptions {
    /// A step of `micro_batches` under a pipeline of `training.pp` stages: refused when it is
    /// zero, absurdly many, or fewer than the stages (1F1B needs a micro-batch in every stage
    /// to reach its steady state, and the memory count assumes it).
    pub fn new(
        micro_batches: u32,
        dp_overlap: bool,
        training: Training,
    ) -> Result<StepOptions, FootprintError> {
        if !(1..=MAX_MICRO_BATCHES).contains(&micro_batches) {
            return Err(FootprintError::Setting(format!(
                "--micro-batches {micro_batches}: a step runs 1 to {MAX_MICRO_BATCHES} micro-batches"
            )));
        }
        if micro_batches < training.pp {
            return Err(FootprintError::Setting(format!(
                "--micro-batches {micro_batches} is fewer than the {} pipeline stages: 1F1B needs at least one micro-batch per stage",
                training.pp
            )));
        }
        if training.vp > 1 && micro_batches % training.pp != 0 {
            return Err(FootprintError::Setting(format!(
                "--micro-batches {micro_batches} is not a multiple of the {} pipeline stages: the interleaved schedule (--vp {}) runs micro-batches in groups of the stages, as Megatron's does",
                training.pp, training.vp
            )));
        }
        Ok(StepOptions {
            micro_batches,
            dp_overlap,
            order: MicroBatchOrder::Stream,
            deal: Deal::Stream,
        })
    }

    /// The windows one step trains over `dp` replicas: its micro-batches on each (what WLB
    /// packing balances together, and what `--steps` gives each step).
    pub fn windows(self, dp: u32) -> u64 {
        u64::from(self.micro_batches) * u64::from(dp)
    }

    /// The same step with its windows dealt to `training.dp` replicas by `deal`. LPT deals
    /// every micro-batch of the step one by one: refused beyond [`MAX_MICRO_BATCHES`] of
    /// them in all.
    pub fn with_deal(self, deal: Deal, training: Training) -> Result<StepOptions, FootprintError> {
        let all = self.windows(training.dp);
        if deal == Deal::Lpt && all > u64::from(MAX_MICRO_BATCHES) {
            return Err(FootprintError::Setting(format!(
                "--deal lpt deals at most {MAX_MICRO_BATCHES} micro-batches a step: {} on each of {} replicas are {all}",
                self.micro_batches, training.dp
            )));
        }
        Ok(StepOptions { deal, ..self })
    }

    /// The same step with each replica's micro-batches run in `order`.
    pub fn with_order(self, order: MicroBatchOrder) -> StepOptions {
        StepOptions { order, ..self }
    }
}

/// What keeps the replicas' weights in step once a step, on one GPU, in nanoseconds: the
/// data-parallel collectives and, between the gradients' reduction and the weights' gather,
/// the optimizer step on the GPU's share of the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DpSync {
    /// ZeRO 2: the gradients' reduce-scatter after every micro-batch's backward pass (only a
    /// shard of them is kept between micro-batches); 0 otherwise.
    pub per_micro_batch_ns: u64,
    /// The gradients' reduction once a step: all-reduce, or reduce-scatter (and the
    /// all-reduce across shard groups).
    pub reduce_ns: u64,
    /// The updated weights' all-gather (distributed optimizer).
    pub gather_ns: u64,
    /// The optimizer step: [`crate::footprint::optimizer_step_bytes_per_param`] for each
    /// parameter the GPU updates ([`Training::optimizer_params`]) at the hardware's memory
    /// bandwidth; 0 when the profile gives none. It follows the reduction and precedes the
    /// gather, so no compute hides it.
    pub optimizer_ns: u64,
    /// Whether the collectives cross nodes: overlapped with a pass, they then share the NICs
    /// with its own messages ([`MicroBatch::nic_ms`]).
    pub over_nic: bool,
}

impl DpSync {
    /// What one step's data-parallel collectives and optimizer step cost a GPU of the
    /// fullest pipeline stage of `model` (one GPU's TP share) under `training`, for a CP
    /// group of `cp` ranks on nodes of `gpus_per_node` (the CP view of the hardware,
    /// [`crate::tp::split`]), with memory bandwidth `hbm_bytes_per_s` (none: the optimizer
    /// step is not priced).
    pub fn new(
        model: &Model,
        training: Training,
        cp: u32,
        gpus_per_node: u32,
        coll: &CollectiveModel<'_>,
        hbm_bytes_per_s: Option<f64>,
    ) -> Result<DpSync, SimError> {
        let optimizer_ns = match hbm_bytes_per_s {
            Some(bw) => {
                let bytes = training.optimizer_params(model, cp)? as f64
                    * crate::footprint::optimizer_step_bytes_per_param(model.dtype_bytes) as f64;
                let ns = bytes / bw * 1e9;
                // Held to the longest step the simulator times, as collectives are (bug hunt:
                // 10¹⁵ parameters at 0.001 GB/s saturated `u64` and printed a time 39 % low).
                if ns.is_nan() || ns >= super::program::MAX_STEP_NS {
                    return Err(SimError::Hardware(HardwareError::InvalidQuery(format!(
                        "the optimizer step over {bytes:.3e} B at {:.3e} GB/s would take {:.3e} s, beyond the {:.0e} s one step may take in the simulator",
                        bw * 1e-9,
                        ns * 1e-9,
                        super::program::MAX_STEP_NS * 1e-9
                    ))));
                }
                ns.round() as u64
            }
            None => 0,
        };
        let params = training.fullest_stage_params(model)?.total();
        // Megatron orders ranks TP, CP, DP, then PP: the stages' groups follow each other.
        let stages = u64::from(training.pp);
        let grads = params.saturating_mul(GRAD_BYTES);
        let weights = params.saturating_mul(u64::from(model.dtype_bytes));
        let node = u64::from(gpus_per_node.max(1));
        // Every GPU holding a copy of these weights, and the shard group within them.
        let replicas = u64::from(training.dp) * u64::from(cp.max(1));
        let shard = training.shard_ranks(cp);
        let groups = u64::from(training.dp / training.shard_replicas());
        let all_spans = any_straddles(replicas, stages, node);
        let shard_spans = any_straddles(shard, groups.saturating_mul(stages), node);
        let ring = |op, n, spans, bytes| coll.ring_ns_over(op, n, spans, bytes);
        // Under hybrid sharding each shard is summed across the groups too; the groups' GPUs
        // of one shard index lie one shard group apart.
        let across = ring(
            Collective::AllReduce,
            groups,
            all_spans,
            grads.div_ceil(shard.max(1)),
        )?;
        let scatter = || ring(Collective::ReduceScatter, shard, shard_spans, grads);
        let gather = || ring(Collective::AllGather, shard, shard_spans, weights);
        Ok(match training.zero {
            0 => DpSync {
                per_micro_batch_ns: 0,
                reduce_ns: ring(Collective::AllReduce, replicas, all_spans, grads)?,
                gather_ns: 0,
                optimizer_ns,
                over_nic: all_spans,
            },
            1 => DpSync {
                per_micro_batch_ns: 0,
                reduce_ns: scatter()? + across,
                gather_ns: gather()?,
                optimizer_ns,
                over_nic: shard_spans || (groups > 1 && all_spans),
            },
            2 => DpSync {
                per_micro_batch_ns: scatter()?,
                reduce_ns: across,
                gather_ns: gather()?,
                optimizer_ns,
                over_nic: shard_spans || (groups > 1 && all_spans),
            },
            // ZeRO 3 gathers and scatters layer by layer, in the layer's time.
            _ => DpSync {
                per_micro_batch_ns: 0,
                reduce_ns: across,
                gather_ns: 0,
                optimizer_ns,
                over_nic: groups > 1 && all_spans,
            },
        })
    }
}

/// One window trained as a micro-batch: one layer's passes over it and its real tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MicroBatch {
    /// One layer's forward and backward pass, ms ([`LayerMetrics::layer_time_ms`]).
    pub layer_ms: f64,
    /// The backward part of it, recomputation included, ms.
    pub backward_ms: f64,
    /// Real (unpadded) tokens in the window.
    pub tokens: f64,
    /// Tokens on its busiest CP rank, padding included ([`LayerMetrics::max_rank_tokens`]):
    /// what the output layer and the sends between stages carry.
    pub rank_tokens: u64,
    /// Its output layer and sends ([`crate::sim::Simulator::step`] prices them from
    /// `rank_tokens`).
    pub extras: StageExtras,
    /// One layer's forward and backward passes' own NIC time on the busiest NIC, ms
    /// ([`LayerMetrics::nic_fwd_ms`], [`LayerMetrics::nic_bwd_ms`]): an overlapped
    /// data-parallel collective over the NICs hides only in the rest.
    pub nic_ms: [f64; 2],
}

impl MicroBatch {
    /// The micro-batch whose layer was simulated as `layer`, holding `tokens` real tokens.
    pub fn of(layer: &LayerMetrics, tokens: f64) -> MicroBatch {
        MicroBatch {
            layer_ms: layer.layer_time_ms,
            backward_ms: layer.backward_ms,
            tokens,
            rank_tokens: layer.max_rank_tokens,
            extras: StageExtras::default(),
            nic_ms: [layer.nic_fwd_ms, layer.nic_bwd_ms],
        }
    }

    /// Its load on a pipeline of stages of `layers` layers.
    fn load(&self, layers: f64) -> Load {
        Load {
            work: self.through(layers),
            head: self.extras.head,
            send_ms: self.extras.send_ms,
        }
    }

    /// Its passes through a stage of `layers` layers.
    fn through(&self, layers: f64) -> StageWork {
        StageWork {
            forward_ms: layers * (self.layer_ms - self.backward_ms),
            backward_ms: layers * self.backward_ms,
        }
    }
}

/// A training step's time, from its micro-batches' layers.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct StepMetrics {
    /// Micro-batches each pipeline runs.
    pub micro_batches: u32,
    /// Layers on a pipeline stage.
    pub stage_layers: u32,
    /// Chunks the stage's layers are interleaved in (Megatron's virtual pipeline stages);
    /// absent when 1, the plain schedule.
    #[serde(skip_serializing_if = "is_one")]
    pub vp: u32,
    /// Distinct simulated windows the step's `dp × micro_batches` micro-batches were drawn
    /// from, in turn: fewer than them means windows repeat.
    pub windows: usize,
    /// One micro-batch through a stage's layers, forward and backward, ms: the mean over the
    /// windows drawn.
    pub micro_batch_mean_ms: f64,
    /// The heaviest of them, ms.
    pub micro_batch_max_ms: f64,
    /// The slowest replica's 1F1B pipeline, its micro-batches in order, ms
    /// ([`super::pipeline`]): `(m + P − 1)` slots when they are equal, `m + (P − 1)/vp`
    /// interleaved.
    pub pipeline_ms: f64,
    /// What of it the busiest stage (the last, with the output layer) spends waiting rather
    /// than computing, ms: filling and draining the pipeline, and the stalls that
    /// micro-batches of unequal lengths cause (0 without pipelining).
    pub bubble_ms: f64,
    /// What of the bubble the slowest replica's micro-batches being unequal cost, ms: its
    /// pipeline against the same pipeline with every micro-batch its mean (0 without
    /// pipelining, or when the order makes up for the spread).
    pub stall_ms: f64,
    /// One point-to-point send of a micro-batch's activations (or their gradients) to the
    /// next stage, ms, on the mean over the windows drawn; 0 without pipelining.
    pub pp_send_ms: f64,
    /// The output layer's GEMMs for one micro-batch on the last stage, forward and
    /// backward, ms ([`output_layer`]), on the mean over the windows drawn: that stage's
    /// extra work on every micro-batch.
    pub output_layer_ms: f64,
    /// The data-parallel collectives of the step: the gradients' reduction and, under the
    /// distributed optimizer, the weights' all-gather, ms.
    pub dp_comm_ms: f64,
    /// What of them the slowest replica's compute does not hide, ms: all of it without
    /// `dp_overlap`.
    pub dp_exposed_ms: f64,
    /// The optimizer step on one GPU of the fullest stage, ms ([`DpSync::optimizer_ns`]):
    /// Adam streaming its share of the parameters' state through HBM, after the reduction
    /// and before the gather. 0 when the hardware gives no `hbm_gbs`.
    pub optimizer_ms: f64,
    /// The order each replica ran its micro-batches in: `stream` or `hill`
    /// ([`MicroBatchOrder`]).
    pub micro_batch_order: MicroBatchOrder,
    /// How the windows were dealt to the replicas: `stream` or `lpt` ([`Deal`]).
    pub deal: Deal,
    /// Whether the collectives overlapped the first and last micro-batch; absent when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dp_overlap: bool,
    /// How long the replicas wait for the slowest at the reduction, ms, on the mean over
    /// replicas: their micro-batches differ (0 when one replica, or all drew alike).
    pub dp_wait_ms: f64,
    /// The slowest replica's `pipeline_ms + dp_exposed_ms`, plus `optimizer_ms`.
    pub step_ms: f64,
    /// Real tokens a step trains per GPU-second: the measure that compares layouts on
    /// different numbers of GPUs (a pipeline's stages multiply them).
    pub tokens_per_gpu_s: f64,
}

/// What a micro-batch adds to its stages' layers: the sends between stages and the last
/// stage's output layer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StageExtras {
    /// One activation send between neighbouring stages, ms ([`activation_send_ns`]).
    pub send_ms: f64,
    /// The output layer on the last stage ([`output_layer`]).
    pub head: StageWork,
}

/// The output layer's GEMM on one GPU for one micro-batch, ms: the `tokens_per_rank` of its
/// CP rank (under sequence parallelism the TP group gathers them) times `2 × hidden ×
/// vocab / tp` FLOPs forward (Megatron splits the vocabulary over TP), twice that backward
/// (the gradients of the input and of the weights), at the measured GEMM rate. The
/// softmax and loss over the logits are element-wise and not counted, as in the layer.
pub fn output_layer(model: &Model, tokens_per_rank: u64, flops_per_s: f64) -> StageWork {
    let (Some(linear), Some(stack)) = (model.linear.as_ref(), model.stack.as_ref()) else {
        return StageWork::default();
    };
    if flops_per_s <= 0.0 {
        return StageWork::default();
    }
    let vocab = f64::from(stack.vocab.div_ceil(model.tp.max(1)));
    let forward = tokens_per_rank as f64 * 2.0 * f64::from(linear.hidden) * vocab;
    let ms = |flops: f64| flops / flops_per_s * 1e3;
    StageWork {
        forward_ms: ms(forward),
        backward_ms: ms(2.0 * forward),
    }
}

/// One replica's step: its pipeline, its exposed collectives, its tokens.
#[derive(Debug, Clone, Copy)]
struct Replica {
    pipeline_ms: f64,
    busy_ms: f64,
    exposed_ms: f64,
    tokens: f64,
    /// Its micro-batches' mean load and how many: the pipeline it would run were they
    /// equal, what its stalls are measured against.
    mean: Load,
    count: usize,
}

impl Replica {
    fn step_ms(&self) -> f64 {
        self.pipeline_ms + self.exposed_ms
    }
}

/// The step of `opts` over `windows` (each a micro-batch's layer, forward and backward, its
/// tokens, output layer and sends) under `training`: replica `r` of `training.dp` runs
/// windows `r·m … r·m + m − 1` in that order (or as [`StepOptions::deal`] deals them),
/// cycling through `windows` when the step needs more than there are. With `sync` the
/// data-parallel collectives and `stage_gpus` the GPUs of one pipeline stage of one replica
/// (TP × CP). The step is the slowest replica's: the reduction waits for it.
pub fn step_metrics(
    windows: &[MicroBatch],
    stage_layers: u32,
    training: Training,
    sync: DpSync,
    opts: StepOptions,
    stage_gpus: u32,
) -> StepMetrics {
    const MS: f64 = 1e-6;
    let layers = f64::from(stage_layers);
    let m = opts.micro_batches as usize;
    let w = windows.len().max(1);
    let (each, reduce, gather) = (
        sync.per_micro_batch_ns as f64 * MS,
        sync.reduce_ns as f64 * MS,
        sync.gather_ns as f64 * MS,
    );
    let dp_comm_ms = m as f64 * each + reduce + gather;
    let optimizer_ms = sync.optimizer_ns as f64 * MS;
    let replica = |drawn: Vec<MicroBatch>| -> Replica {
        let drawn = opts.order.arrange(drawn);
        let loads: Vec<Load> = drawn.iter().map(|b| b.load(layers)).collect();
        let work: Vec<StageWork> = loads.iter().map(|l| l.work).collect();
        let exposed_ms = if opts.dp_overlap {
            // Each micro-batch's reduction hides under its own backward pass; the last one's
            // carries the step's too; the gather hides under the first forward pass. Over
            // the NICs, only in what the pass's own messages leave of them.
            let hides = |b: &MicroBatch, s: &StageWork| {
                let busy = |pass: usize| match sync.over_nic {
                    true => layers * b.nic_ms[pass],
                    false => 0.0,
                };
                (
                    (s.forward_ms - busy(0)).max(0.0),
                    (s.backward_ms - busy(1)).max(0.0),
                )
            };
            let n = work.len();
            work.iter()
                .zip(&drawn)
                .enumerate()
                .map(|(i, (s, b))| {
                    let mine = if i + 1 == n { each + reduce } else { each };
                    (mine - hides(b, s).1).max(0.0)
                })
                .sum::<f64>()
                + work
                    .first()
                    .zip(drawn.first())
                    .map_or(gather, |(s, b)| (gather - hides(b, s).0).max(0.0))
        } else {
            dp_comm_ms
        };
        Replica {
            pipeline_ms: interleaved(training.pp, training.vp, &loads),
            // The last stage's: the busiest, with the head.
            busy_ms: loads
                .iter()
                .map(|l| l.work.total_ms() + l.head.total_ms())
                .sum(),
            exposed_ms,
            tokens: drawn.iter().map(|b| b.tokens).sum(),
            mean: mean_load(&loads),
            count: loads.len(),
        }
    };
    let dp = training.dp.max(1) as usize;
    // Each distinct replica's run, with how many replicas run it.
    let runs: Vec<(Replica, usize)> = match opts.deal {
        Deal::Stream => {
            // Replicas starting at the same window modulo `w` run the same micro-batches.
            let mut runs: Vec<(Replica, usize)> = Vec::new();
            let mut seen: std::collections::BTreeMap<usize, usize> = Default::default();
            for r in 0..dp {
                let offset = (r % w) * (m % w) % w;
                match seen.get(&offset) {
                    Some(&k) => runs[k].1 += 1,
                    None => {
                        seen.insert(offset, runs.len());
                        let drawn = (0..m)
                            .filter_map(|i| windows.get((offset + i) % w).copied())
                            .collect();
                        runs.push((replica(drawn), 1));
                    }
                }
            }
            runs
        }
        Deal::Lpt => lpt_deal(windows, dp, m, layers)
            .into_iter()
            .map(|drawn| (replica(drawn), 1))
            .collect(),
    };
    let slowest = runs
        .iter()
        .map(|(r, _)| *r)
        .reduce(|a, b| if b.step_ms() > a.step_ms() { b } else { a })
        .expect("at least one replica");
    // Every replica updates its weights alike after the reduction: no compute hides it.
    let step_ms = slowest.step_ms() + optimizer_ms;
    // Without a pipeline a stage never waits (bug hunt: summing the ops in another order
    // left a 1e-12 ms "bubble" the report then named).
    let (bubble_ms, stall_ms) = if training.pp > 1 {
        let even = interleaved(training.pp, training.vp, &vec![slowest.mean; slowest.count]);
        (
            (slowest.pipeline_ms - slowest.busy_ms).max(0.0),
            (slowest.pipeline_ms - even).max(0.0),
        )
    } else {
        (0.0, 0.0)
    };
    let mean_step = runs
        .iter()
        .map(|(r, n)| r.step_ms() * *n as f64)
        .sum::<f64>()
        / dp as f64
        + optimizer_ms;
    let tokens: f64 = runs.iter().map(|(r, n)| r.tokens * *n as f64).sum();
    let used = w.min(dp.saturating_mul(m));
    // The windows drawn: one micro-batch through a stage, and on the mean what one of them
    // adds beside its layers.
    let loads: Vec<Load> = windows.iter().take(used).map(|b| b.load(layers)).collect();
    let slots: Vec<f64> = loads.iter().map(|l| l.work.total_ms()).collect();
    let drawn = mean_load(&loads);
    let gpus = f64::from(stage_gpus) * f64::from(training.pp) * dp as f64;
    StepMetrics {
        micro_batches: opts.micro_batches,
        stage_layers,
        vp: training.vp,
        windows: used,
        micro_batch_mean_ms: slots.iter().sum::<f64>() / slots.len().max(1) as f64,
        micro_batch_max_ms: slots.iter().copied().fold(0.0, f64::max),
        pipeline_ms: slowest.pipeline_ms,
        bubble_ms,
        stall_ms,
        pp_send_ms: if training.pp > 1 { drawn.send_ms } else { 0.0 },
        output_layer_ms: drawn.head.total_ms(),
        dp_comm_ms,
        dp_exposed_ms: slowest.exposed_ms,
        optimizer_ms,
        micro_batch_order: opts.order,
        deal: opts.deal,
        dp_overlap: opts.dp_overlap,
        dp_wait_ms: (step_ms - mean_step).max(0.0),
        step_ms,
        tokens_per_gpu_s: if step_ms > 0.0 {
            tokens / (step_ms * 1e-3) / gpus
        } else {
            0.0
        },
    }
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// The mean of `loads`, field by field (zero for none).
fn mean_load(loads: &[Load]) -> Load {
    let n = loads.len().max(1) as f64;
    let sum = |f: fn(&Load) -> f64| loads.iter().map(f).sum::<f64>() / n;
    Load {
        work: StageWork {
            forward_ms: sum(|l| l.work.forward_ms),
            backward_ms: sum(|l| l.work.backward_ms),
        },
        head: StageWork {
            forward_ms: sum(|l| l.head.forward_ms),
            backward_ms: sum(|l| l.head.backward_ms),
        },
        send_ms: sum(|l| l.send_ms),
    }
}

/// The step's `dp × m` windows (the stream's, cycling through `windows`) dealt longest
/// first to the replica with the least work and room left, each replica's in the stream's
/// order. Ties go to the earlier window and the lower replica, so the deal is deterministic.
fn lpt_deal(windows: &[MicroBatch], dp: usize, m: usize, layers: f64) -> Vec<Vec<MicroBatch>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let w = windows.len().max(1);
    let time = |k: usize| {
        windows
            .get(k % w)
            .map_or(0.0, |b| b.through(layers).total_ms())
    };
    let mut order: Vec<usize> = (0..dp * m).collect();
    order.sort_by(|&a, &b| time(b).total_cmp(&time(a)).then(a.cmp(&b)));
    // Loads in whole nanoseconds, so the heap orders them exactly.
    let mut open: BinaryHeap<Reverse<(u64, usize)>> = (0..dp).map(|r| Reverse((0, r))).collect();
    let mut dealt: Vec<Vec<usize>> = vec![Vec::with_capacity(m); dp];
    for k in order {
        let Some(Reverse((load, r))) = open.pop() else {
            break;
        };
        dealt[r].push(k);
        if dealt[r].len() < m {
            open.push(Reverse((load + (time(k) * 1e6).round() as u64, r)));
        }
    }
    dealt
        .into_iter()
        .map(|mut ks| {
            ks.sort_unstable();
            ks.into_iter()
                .filter_map(|k| windows.get(k % w).copied())
                .collect()
        })
        .collect()
}

/// One send of a micro-batch's activations between neighbouring pipeline stages, ns: each
/// GPU sends its share, the `tokens_per_rank` of its CP rank split `model.tp` ways (sequence
/// parallelism, as Megatron's `get_tensor_shapes` sizes it) × the hidden width × the dtype.
/// Megatron orders ranks TP, CP, DP, then PP: the stages' `dp × cp` CP ranks follow each
/// other, so a send crosses the NICs once the pipeline outgrows a node (`gpus_per_node` in
/// the CP view). 0 without pipelining or without the model's widths.
pub fn activation_send_ns(
    model: &Model,
    training: Training,
    cp: u32,
    tokens_per_rank: u64,
    gpus_per_node: u32,
    net: &super::Network,
) -> u64 {
    let Some(linear) = model.linear.as_ref() else {
        return 0;
    };
    if training.pp < 2 {
        return 0;
    }
    let bytes = tokens_per_rank
        .saturating_mul(u64::from(linear.hidden))
        .saturating_mul(u64::from(model.dtype_bytes))
        / u64::from(model.tp.max(1));
    let span = u64::from(training.pp) * u64::from(training.dp) * u64::from(cp.max(1));
    net.send_ns(bytes, span > u64::from(gpus_per_node.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Hardware;
    use crate::sim::network::Network;

    fn llama70() -> Model {
        Model::load("llama3-70b").unwrap()
    }

    fn sync(t: Training, cp: u32) -> DpSync {
        let hw = Hardware::load("h100").unwrap();
        let net = Network::new(&hw);
        let nccl = hw.nccl_table().unwrap();
        let coll = CollectiveModel::new(&net, nccl.as_ref());
        DpSync::new(&llama70(), t, cp, 8, &coll, None).unwrap()
    }

    fn mb(layer_ms: f64, backward_ms: f64, tokens: f64) -> MicroBatch {
        MicroBatch {
            layer_ms,
            backward_ms,
            tokens,
            ..Default::default()
        }
    }

    /// The optimizer step streams 30 bytes for each bf16 parameter the GPU updates: all of
    /// its stage's under ZeRO 0, its shard of the `dp × cp` group from ZeRO 1 on; nothing
    /// without a memory bandwidth.
    #[test]
    fn the_optimizer_step_streams_each_parameter_it_updates_once() {
        let hw = Hardware::load("h100").unwrap();
        let net = Network::new(&hw);
        let coll = CollectiveModel::new(&net, None);
        let m = llama70();
        assert_eq!(
            crate::footprint::optimizer_step_bytes_per_param(m.dtype_bytes),
            30
        );
        let bw = 3.35e12;
        let at = |t: Training, cp| DpSync::new(&m, t, cp, 8, &coll, Some(bw)).unwrap();
        let replicated = Training::new(0, 2, 1).unwrap();
        let params = replicated.fullest_stage_params(&m).unwrap().total();
        let want = |p: u64| (p as f64 * 30.0 / bw * 1e9).round() as u64;
        assert_eq!(at(replicated, 8).optimizer_ns, want(params));
        // ZeRO 1 over 2 replicas × 8 CP ranks: a sixteenth each.
        let sharded = Training::new(1, 2, 1).unwrap();
        assert_eq!(at(sharded, 8).optimizer_ns, want(params.div_ceil(16)));
        // Hybrid sharding over one replica: an eighth.
        let hybrid = sharded.with_shard_dp(1).unwrap();
        assert_eq!(at(hybrid, 8).optimizer_ns, want(params.div_ceil(8)));
        // llama3-70b's 70.6 B parameters on one GPU: 2.1 TB of state streamed, about 632 ms
        // at 3.35 TB/s replicated.
        assert_eq!(m.tp, 1);
        let ms = at(replicated, 8).optimizer_ns as f64 * 1e-6;
        assert!(
            (625.0..640.0).contains(&ms),
            "{ms} ms for {params} parameters"
        );
        assert_eq!(
            DpSync::new(&m, replicated, 8, 8, &coll, None)
                .unwrap()
                .optimizer_ns,
            0
        );
    }

    /// It follows the reduction on every replica alike: added to the step whole, it moves
    /// neither which replica is slowest nor how long the others wait.
    #[test]
    fn the_optimizer_step_adds_to_the_step_and_to_no_wait() {
        let t = Training::new(1, 2, 1).unwrap();
        let sync = DpSync {
            reduce_ns: 5_000_000,
            gather_ns: 1_000_000,
            ..DpSync::default()
        };
        let windows = [mb(2.0, 1.5, 1000.0), mb(3.0, 2.0, 1000.0)];
        let opts = StepOptions::new(1, false, t).unwrap();
        let without = step_metrics(&windows, 10, t, sync, opts, 8);
        let with = step_metrics(
            &windows,
            10,
            t,
            DpSync {
                optimizer_ns: 7_000_000,
                over_nic: false,
                ..sync
            },
            opts,
            8,
        );
        assert_eq!((without.optimizer_ms, with.optimizer_ms), (0.0, 7.0));
        assert!((with.step_ms - without.step_ms - 7.0).abs() < 1e-9);
        assert_eq!(with.dp_wait_ms, without.dp_wait_ms);
        assert_eq!(with.dp_exposed_ms, without.dp_exposed_ms);
        assert!(with.tokens_per_gpu_s < without.tokens_per_gpu_s);
    }

    #[test]
    fn the_bubble_is_p_minus_one_slots_of_the_stage() {
        let t = Training::new(1, 1, 4).unwrap();
        let none = DpSync::default();
        let opts = StepOptions::new(8, false, t).unwrap();
        let s = step_metrics(&[mb(2.0, 1.5, 1000.0)], 20, t, none, opts, 64);
        // 20 layers × 2 ms a slot, 8 + 3 slots, 3 of them the bubble.
        assert_eq!(
            (s.pipeline_ms, s.bubble_ms, s.step_ms),
            (440.0, 120.0, 440.0)
        );
        // 8 windows of 1000 tokens over 64 × 4 GPUs in 0.44 s.
        assert!((s.tokens_per_gpu_s - 8000.0 / 0.44 / 256.0).abs() < 1e-9);
        // Fewer micro-batches than stages never reach 1F1B's steady state.
        let e = StepOptions::new(3, false, t).unwrap_err().to_string();
        assert!(e.contains("fewer than the 4 pipeline stages"), "{e}");
        assert!(StepOptions::new(0, false, Training::default()).is_err());
    }

    #[test]
    fn interleaving_cuts_the_bubble_by_the_chunks_a_stage_holds() {
        let none = DpSync::default();
        let plain = Training::new(1, 1, 4).unwrap();
        let two = plain.with_virtual_stages(2).unwrap();
        let at = |t| {
            let opts = StepOptions::new(8, false, t).unwrap();
            step_metrics(&[mb(2.0, 1.5, 1000.0)], 20, t, none, opts, 64)
        };
        // 20 layers × 2 ms a slot: 3 slots of bubble, 1.5 interleaved over 2 chunks.
        assert_eq!((at(plain).bubble_ms, at(two).bubble_ms), (120.0, 60.0));
        assert_eq!(at(two).pipeline_ms, 320.0 + 60.0);
        // The chunks run micro-batches in groups of the stages.
        let e = StepOptions::new(6, false, two).unwrap_err().to_string();
        assert!(e.contains("not a multiple of the 4 pipeline stages"), "{e}");
        assert!(StepOptions::new(6, false, plain).is_ok());
    }

    #[test]
    fn overlap_hides_the_reduction_under_the_last_backward_and_the_gather_under_the_first_forward()
    {
        let t = Training::default();
        let sync = DpSync {
            per_micro_batch_ns: 0,
            reduce_ns: 50_000_000,
            gather_ns: 10_000_000,
            optimizer_ns: 0,
            over_nic: false,
        };
        let l = [mb(1.0, 0.75, 1.0)];
        let at = |sync, overlap| {
            step_metrics(&l, 80, t, sync, StepOptions::new(4, overlap, t).unwrap(), 8)
        };
        let plain = at(sync, false);
        assert_eq!((plain.dp_comm_ms, plain.dp_exposed_ms), (60.0, 60.0));
        assert_eq!(plain.step_ms, 4.0 * 80.0 + 60.0);
        let over = at(sync, true);
        // 60 ms of backward hide 50 of reduction; 20 ms of forward hide the 10 ms gather.
        assert_eq!(over.dp_exposed_ms, 0.0);
        let slow = DpSync {
            per_micro_batch_ns: 0,
            reduce_ns: 70_000_000,
            gather_ns: 25_000_000,
            optimizer_ns: 0,
            over_nic: false,
        };
        let over = at(slow, true);
        assert!((over.dp_exposed_ms - 15.0).abs() < 1e-9, "{over:?}");
    }

    /// Over the NICs, an overlapped collective shares them with the pass's own messages: it
    /// hides only in what they leave (of the last backward pass, 60 − 80 × 0.2 = 44 ms for a
    /// 50 ms reduction; of the first forward pass, 20 − 80 × 0.15 = 8 ms for a 10 ms gather).
    /// Inside a node the NICs' traffic takes nothing from it.
    #[test]
    fn an_overlapped_collective_over_the_nics_hides_only_in_what_cp_leaves_of_them() {
        let t = Training::default();
        let sync = DpSync {
            reduce_ns: 50_000_000,
            gather_ns: 10_000_000,
            over_nic: true,
            ..DpSync::default()
        };
        let l = [MicroBatch {
            nic_ms: [0.15, 0.2],
            ..mb(1.0, 0.75, 1.0)
        }];
        let at = |sync| step_metrics(&l, 80, t, sync, StepOptions::new(4, true, t).unwrap(), 8);
        let over = at(sync);
        assert!((over.dp_exposed_ms - (6.0 + 2.0)).abs() < 1e-9, "{over:?}");
        assert!((over.step_ms - (4.0 * 80.0 + 8.0)).abs() < 1e-9, "{over:?}");
        let inside = at(DpSync {
            over_nic: false,
            ..sync
        });
        assert_eq!(inside.dp_exposed_ms, 0.0);
        // Without overlap all of it is exposed either way.
        let plain = step_metrics(&l, 80, t, sync, StepOptions::new(4, false, t).unwrap(), 8);
        assert_eq!(plain.dp_exposed_ms, 60.0);
    }

    /// Regression (bug hunt): ZeRO 2 keeps a shard of the gradients between micro-batches,
    /// so it reduce-scatters after each; it was charged once a step, as ZeRO 1 is, and got
    /// its memory saving for free.
    #[test]
    fn zero_2_reduce_scatters_every_micro_batch() {
        let (z1, z2) = (
            sync(Training::new(1, 1, 1).unwrap(), 8),
            sync(Training::new(2, 1, 1).unwrap(), 8),
        );
        assert_eq!(z2.per_micro_batch_ns, z1.reduce_ns);
        assert_eq!((z2.reduce_ns, z2.gather_ns), (0, z1.gather_ns));
        let t = Training::new(2, 1, 1).unwrap();
        let l = [mb(1.0, 0.75, 1.0)];
        let step =
            |overlap| step_metrics(&l, 10, t, z2, StepOptions::new(4, overlap, t).unwrap(), 8);
        let ms = |ns: u64| ns as f64 * 1e-6;
        let plain = step(false);
        assert!(
            (plain.dp_comm_ms - (4.0 * ms(z2.per_micro_batch_ns) + ms(z2.gather_ns))).abs() < 1e-9
        );
        // Overlapped, each hides under its own micro-batch's 7.5 ms of backward passes.
        let over = step(true);
        let each = (ms(z2.per_micro_batch_ns) - 7.5).max(0.0);
        let expected = 4.0 * each + (ms(z2.gather_ns) - 2.5).max(0.0);
        assert!((over.dp_exposed_ms - expected).abs() < 1e-9, "{over:?}");
    }

    /// Regression (bug hunt): the pipeline's stages come after DP in Megatron's rank order,
    /// so a later stage's CP group can straddle a node edge the first stage's does not:
    /// TP 2 × CP 3 on 8-GPU nodes puts stage 1's CP ranks on GPUs 6, 8 and 10.
    #[test]
    fn a_later_stage_straddling_a_node_crosses_the_nics() {
        let hw = Hardware::load("h100").unwrap();
        let net = Network::new(&hw);
        let coll = CollectiveModel::new(&net, None);
        let m = Model::load("llama3-8b").unwrap();
        let (_, m2) = crate::tp::split(&hw, &m, 2).unwrap();
        let at = |pp| {
            let t = Training::new(1, 1, pp).unwrap();
            DpSync::new(&m2, t, 3, 4, &coll, None).unwrap()
        };
        // One stage: 3 of a node's 4 CP slots. Two: the second group straddles the edge.
        let (one, two) = (at(1), at(2));
        let per_param = |s: DpSync, pp| {
            let p = Training::new(1, 1, pp)
                .unwrap()
                .fullest_stage_params(&m2)
                .unwrap()
                .total();
            s.reduce_ns as f64 / p as f64
        };
        assert!(
            per_param(two, 2) > 3.0 * per_param(one, 1),
            "{one:?} {two:?}"
        );
    }

    #[test]
    fn each_zero_stage_reduces_what_it_holds() {
        let m = llama70();
        let params = Training::default()
            .fullest_stage_params(&m)
            .unwrap()
            .total();
        // One GPU alone has nothing to sum.
        let alone = sync(Training::new(0, 1, 1).unwrap(), 1);
        assert_eq!((alone.reduce_ns, alone.gather_ns), (0, 0));
        // Replicated: an all-reduce of fp32 gradients, twice a reduce-scatter's traffic.
        let z0 = sync(Training::new(0, 1, 1).unwrap(), 8);
        let z1 = sync(Training::new(1, 1, 1).unwrap(), 8);
        assert_eq!(z0.gather_ns, 0);
        assert!(z0.reduce_ns > z1.reduce_ns && z1.gather_ns > 0);
        // The weights gathered in bf16 are half the fp32 gradients scattered.
        assert!(z1.gather_ns < z1.reduce_ns);
        // ZeRO 3 already did it layer by layer; hybrid sharding adds the groups' all-reduce.
        let z3 = sync(Training::new(3, 4, 1).unwrap(), 8);
        assert_eq!((z3.reduce_ns, z3.gather_ns), (0, 0));
        let hsdp = sync(Training::new(3, 4, 1).unwrap().with_shard_dp(1).unwrap(), 8);
        assert!(hsdp.reduce_ns > 0 && hsdp.gather_ns == 0);
        // Across two nodes the NICs carry it: slower than within one.
        let wide = sync(Training::new(1, 2, 1).unwrap(), 8);
        assert!(wide.reduce_ns > 3 * z1.reduce_ns, "{wide:?} {z1:?}");
        assert!(params > 0);
    }

    #[test]
    fn pipelining_reduces_a_stage_s_share() {
        let t1 = Training::new(1, 1, 1).unwrap();
        let t4 = Training::new(1, 1, 4).unwrap();
        let (a, b) = (sync(t1, 8), sync(t4, 8));
        assert!(b.reduce_ns * 3 < a.reduce_ns, "{a:?} {b:?}");
    }

    /// `b` with `send_ms` for each send between stages.
    fn sent(b: MicroBatch, send_ms: f64) -> MicroBatch {
        MicroBatch {
            extras: StageExtras {
                send_ms,
                ..Default::default()
            },
            ..b
        }
    }

    /// The pipeline module's worked example: four windows, the second 3× as heavy as the
    /// others, with `tokens` real tokens each and `heavy` in the heavy one.
    fn worked_example(tokens: f64, heavy: f64) -> [MicroBatch; 4] {
        let light = mb(3.0, 2.0, tokens);
        [light, mb(9.0, 6.0, heavy), light, light]
    }

    #[test]
    fn unequal_micro_batches_stall_the_pipeline_beyond_its_bubble() {
        let t = Training::new(1, 1, 2).unwrap();
        let opts = StepOptions::new(4, false, t).unwrap();
        // One layer a stage; a window 3× as heavy as the others, second in the stream.
        let windows = worked_example(100.0, 300.0);
        let s = step_metrics(&windows, 1, t, DpSync::default(), opts, 8);
        // The pipeline module's worked example: 25 ms, where four mean windows take 22.5.
        assert_eq!(s.pipeline_ms, 25.0);
        assert_eq!((s.micro_batch_mean_ms, s.micro_batch_max_ms), (4.5, 9.0));
        assert_eq!(s.bubble_ms, 25.0 - 18.0);
        assert_eq!((s.windows, s.dp_wait_ms, s.pp_send_ms), (4, 0.0, 0.0));
        assert!((s.tokens_per_gpu_s - 600.0 / 0.025 / 16.0).abs() < 1e-9);
        // Equal windows of the same mean: the closed form, (m + P − 1) slots.
        let even = step_metrics(&[mb(4.5, 3.0, 150.0)], 1, t, DpSync::default(), opts, 8);
        assert_eq!((even.pipeline_ms, even.bubble_ms), (22.5, 4.5));
        // Each send between the stages delays both the fill and the drain.
        let with_sends = step_metrics(
            &[sent(mb(4.5, 3.0, 150.0), 0.25)],
            1,
            t,
            DpSync::default(),
            opts,
            8,
        );
        assert_eq!(with_sends.pp_send_ms, 0.25);
        assert!(
            with_sends.pipeline_ms >= even.pipeline_ms + 0.5,
            "{with_sends:?}"
        );
    }

    #[test]
    fn each_replica_draws_its_own_windows_and_the_slowest_sets_the_step() {
        let t = Training::new(1, 2, 1).unwrap();
        let opts = StepOptions::new(2, false, t).unwrap();
        let sync = DpSync {
            per_micro_batch_ns: 0,
            reduce_ns: 1_000_000,
            gather_ns: 0,
            optimizer_ns: 0,
            over_nic: false,
        };
        // Replica 0 trains windows 0 and 1, replica 1 windows 2 and 3.
        let windows = [
            mb(2.0, 1.0, 10.0),
            mb(2.0, 1.0, 10.0),
            mb(4.0, 3.0, 30.0),
            mb(4.0, 3.0, 30.0),
        ];
        let s = step_metrics(&windows, 10, t, sync, opts, 4);
        // Replica 1: 2 × 40 ms, then the 1 ms reduction; replica 0 waits 40 of it.
        assert_eq!((s.pipeline_ms, s.step_ms), (80.0, 81.0));
        assert_eq!(s.dp_wait_ms, 81.0 - (41.0 + 81.0) / 2.0);
        assert!((s.tokens_per_gpu_s - 80.0 / 0.081 / 8.0).abs() < 1e-9);
        // Fewer windows than the step needs: they repeat, and the replicas draw in turn.
        let t4 = Training::new(1, 4, 1).unwrap();
        let o4 = StepOptions::new(2, false, t4).unwrap();
        let three = step_metrics(&windows[1..], 10, t4, sync, o4, 4);
        assert_eq!(three.windows, 3);
        // Replicas start at windows 0, 2, 1, 0 of three: one draws both heavy ones.
        assert_eq!(three.pipeline_ms, 80.0);
        // One window serves every replica alike: nobody waits.
        let one = step_metrics(&windows[..1], 10, t4, sync, o4, 4);
        assert_eq!((one.windows, one.dp_wait_ms), (1, 0.0));
    }

    #[test]
    fn a_pipeline_s_sends_cross_the_nics_once_it_outgrows_a_node() {
        let hw = Hardware::load("h100").unwrap();
        let net = Network::new(&hw);
        let m = llama70();
        let t = |dp, pp| Training::new(1, dp, pp).unwrap();
        assert_eq!(activation_send_ns(&m, t(1, 1), 8, 4096, 8, &net), 0);
        // 4096 tokens × 8192 wide × 2 bytes, 64 MiB.
        let bytes = 4096 * 8192 * 2;
        let within = activation_send_ns(&m, t(1, 2), 4, 4096, 8, &net);
        assert_eq!(within, net.send_ns(bytes, false));
        let across = activation_send_ns(&m, t(1, 2), 8, 4096, 8, &net);
        assert_eq!(across, net.send_ns(bytes, true));
        assert!(across > 2 * within, "{within} {across}");
        // Under TP each GPU sends its share of the tokens' activations.
        let (_, m8) = crate::tp::split(&hw, &m, 8).unwrap();
        assert_eq!(
            activation_send_ns(&m8, t(1, 2), 8, 4096, 1, &net),
            net.send_ns(bytes / 8, true)
        );
    }

    #[test]
    fn an_lpt_deal_evens_the_replicas_out() {
        let t = Training::new(1, 2, 1).unwrap();
        let windows = [
            mb(4.0, 3.0, 40.0),
            mb(4.0, 3.0, 40.0),
            mb(2.0, 1.0, 20.0),
            mb(2.0, 1.0, 20.0),
        ];
        let at = |deal| {
            let o = StepOptions::new(2, false, t)
                .unwrap()
                .with_deal(deal, t)
                .unwrap();
            step_metrics(&windows, 1, t, DpSync::default(), o, 4)
        };
        // The stream gives replica 0 both heavy windows: 8 ms against 4.
        let stream = at(Deal::Stream);
        assert_eq!((stream.step_ms, stream.dp_wait_ms), (8.0, 2.0));
        // LPT deals one heavy and one light to each: 6 ms, nobody waits; same tokens.
        let lpt = at(Deal::Lpt);
        assert_eq!(
            (lpt.step_ms, lpt.dp_wait_ms, lpt.deal),
            (6.0, 0.0, Deal::Lpt)
        );
        assert_eq!(
            lpt.tokens_per_gpu_s * lpt.step_ms,
            stream.tokens_per_gpu_s * stream.step_ms
        );
        // Each replica's deal keeps the stream's order and its m windows.
        let dealt = lpt_deal(&windows, 2, 2, 1.0);
        assert_eq!(
            dealt,
            vec![vec![windows[0], windows[2]], vec![windows[1], windows[3]]]
        );
        // Dealing every micro-batch one by one has a limit.
        let wide = Training::new(1, 1 << 10, 1).unwrap();
        let e = StepOptions::new(128, false, wide)
            .unwrap()
            .with_deal(Deal::Lpt, wide)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 65536 micro-batches"), "{e}");
    }

    /// Regression (bug hunt): without a pipeline, summing a replica's ops in another order
    /// than its work left a 1e-12 ms bubble, which the report named "the pipeline's bubble".
    #[test]
    fn one_stage_never_waits() {
        let t = Training::new(1, 1, 1).unwrap();
        let windows = [0.1, 0.3, 0.7].map(|x| sent(mb(x, 0.4 * x, 1.0), 0.01));
        let o = StepOptions::new(3, false, t).unwrap();
        let s = step_metrics(&windows, 7, t, DpSync::default(), o, 8);
        assert_eq!((s.bubble_ms, s.stall_ms, s.pp_send_ms), (0.0, 0.0, 0.0));
    }

    #[test]
    fn stalls_are_what_unequal_micro_batches_add_to_the_bubble() {
        let t = Training::new(1, 1, 2).unwrap();
        let o = StepOptions::new(4, false, t).unwrap();
        let unequal = worked_example(1.0, 1.0);
        // The worked example: 25 ms, where four mean micro-batches take 22.5.
        let s = step_metrics(&unequal, 1, t, DpSync::default(), o, 8);
        assert_eq!((s.bubble_ms, s.stall_ms), (7.0, 2.5));
        let even = step_metrics(
            &[sent(mb(4.5, 3.0, 1.0), 0.5)],
            1,
            t,
            DpSync::default(),
            o,
            8,
        );
        assert_eq!(even.stall_ms, 0.0);
        assert!(even.bubble_ms > 4.5, "{even:?}");
    }

    /// Regression (bug hunt): the hill order is a heuristic, not an optimum. It sorts by a
    /// micro-batch's whole time, blind to how it splits between the passes: here it puts
    /// the long forward first, and the second stage waits 6 ms for it.
    #[test]
    fn the_hill_order_can_lose() {
        let t = Training::new(1, 1, 2).unwrap();
        let windows = [mb(9.0, 8.0, 1.0), mb(8.0, 2.0, 1.0)];
        let at = |order| {
            let o = StepOptions::new(2, false, t).unwrap().with_order(order);
            step_metrics(&windows, 1, t, DpSync::default(), o, 8).pipeline_ms
        };
        assert_eq!(at(MicroBatchOrder::Stream), 20.0);
        assert_eq!(at(MicroBatchOrder::Hill), 31.0);
    }

    /// Regression (bug hunt): every window's output layer and sends were priced at the full
    /// window's tokens per rank, so a short last window of a trace paid 130 ms of output
    /// layer for 1,000 tokens. Each window now carries its own.
    #[test]
    fn each_window_pays_its_own_output_layer_and_sends() {
        let hw = Hardware::load("h100").unwrap();
        let model = Model::load("llama3-8b").unwrap();
        let rate = hw.gemm_flops_per_s().unwrap();
        let full = output_layer(&model, 131072, rate);
        let short = output_layer(&model, 1000, rate);
        assert!((full.total_ms() / short.total_ms() - 131.072).abs() < 1e-9);
        // 1,000 tokens × 2 × 4096 wide × 128,256 words, at the GEMM rate; twice backward.
        let forward = 1000.0 * 2.0 * 4096.0 * 128256.0 / rate * 1e3;
        assert!((short.forward_ms - forward).abs() < 1e-12);
        assert!((short.backward_ms - 2.0 * forward).abs() < 1e-12);
        // A step of one full and one short window charges each its own head.
        let t = Training::new(1, 1, 1).unwrap();
        let o = StepOptions::new(2, false, t).unwrap();
        let with = |b: MicroBatch, head: StageWork| MicroBatch {
            extras: StageExtras { send_ms: 0.0, head },
            ..b
        };
        let windows = [
            with(mb(1.0, 0.5, 1.0), full),
            with(mb(1.0, 0.5, 1.0), short),
        ];
        let s = step_metrics(&windows, 1, t, DpSync::default(), o, 8);
        assert!((s.pipeline_ms - (2.0 + full.total_ms() + short.total_ms())).abs() < 1e-9);
        assert!((s.output_layer_ms - (full.total_ms() + short.total_ms()) / 2.0).abs() < 1e-9);
    }
}
