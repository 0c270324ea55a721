//! A training step from one layer's time: the micro-batches, the pipeline's bubble and the
//! data-parallel gradient reduction that runs once a step.
//!
//! A layer's time compares placements, but a user picks a parallel layout by what a step
//! costs, and two things a layer's time leaves out move that answer:
//!
//! - **The pipeline's bubble.** Under Megatron's 1F1B schedule a stage of `L / P` layers
//!   runs its `m` micro-batches in `(m + P − 1)` micro-batch slots: `P − 1` of them are the
//!   bubble of filling and draining the pipeline (Narayanan et al. 2021, arXiv:2104.04473
//!   §2.2: the bubble is `(P − 1) / m` of the ideal time). Each slot is one micro-batch
//!   through the stage's layers, forward and backward, at the layer time simulated for
//!   one window.
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
//! Not modelled: micro-batches of different lengths in one step (every slot is the mean
//! window), the embedding's and output layer's own compute, the optimizer step, the bandwidth
//! the reduction takes from CP's traffic when it overlaps, and the pipeline's point-to-point
//! activation sends between stages.

use serde::Serialize;

use crate::footprint::{FootprintError, Training, GRAD_BYTES};
use crate::hardware::Collective;
use crate::model::Model;

use super::network::CollectiveModel;
use super::zero3::any_straddles;
use super::{LayerMetrics, SimError};

/// Most micro-batches a step may run: far beyond any global batch, small enough for exact
/// arithmetic.
pub const MAX_MICRO_BATCHES: u32 = 1 << 20;

/// How a training step runs around its layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOptions {
    /// Micro-batches (windows) each pipeline runs a step: gradient accumulation steps times
    /// nothing else (the global batch is this times `dp` windows).
    pub micro_batches: u32,
    /// The data-parallel reduction overlaps the last backward pass and the gather the first
    /// forward pass (Megatron's `--overlap-grad-reduce`, `--overlap-param-gather`).
    pub dp_overlap: bool,
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
        Ok(StepOptions {
            micro_batches,
            dp_overlap,
        })
    }
}

/// The data-parallel collectives of one step on one GPU, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpSync {
    /// ZeRO 2: the gradients' reduce-scatter after every micro-batch's backward pass (only a
    /// shard of them is kept between micro-batches); 0 otherwise.
    pub per_micro_batch_ns: u64,
    /// The gradients' reduction once a step: all-reduce, or reduce-scatter (and the
    /// all-reduce across shard groups).
    pub reduce_ns: u64,
    /// The updated weights' all-gather (distributed optimizer).
    pub gather_ns: u64,
}

impl DpSync {
    /// What one step's data-parallel collectives cost a GPU of the fullest pipeline stage of
    /// `model` (one GPU's TP share) under `training`, for a CP group of `cp` ranks on nodes
    /// of `gpus_per_node` (the CP view of the hardware, [`crate::tp::split`]).
    pub fn new(
        model: &Model,
        training: Training,
        cp: u32,
        gpus_per_node: u32,
        coll: &CollectiveModel<'_>,
    ) -> Result<DpSync, SimError> {
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
            },
            1 => DpSync {
                per_micro_batch_ns: 0,
                reduce_ns: scatter()? + across,
                gather_ns: gather()?,
            },
            2 => DpSync {
                per_micro_batch_ns: scatter()?,
                reduce_ns: across,
                gather_ns: gather()?,
            },
            // ZeRO 3 gathers and scatters layer by layer, in the layer's time.
            _ => DpSync {
                per_micro_batch_ns: 0,
                reduce_ns: across,
                gather_ns: 0,
            },
        })
    }
}

/// A training step's time, from a layer's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Micro-batches each pipeline runs.
    pub micro_batches: u32,
    /// Layers on a pipeline stage.
    pub stage_layers: u32,
    /// The stage's layers over all micro-batches, the bubble included: `(m + P − 1) × L/P`
    /// layer times, ms.
    pub pipeline_ms: f64,
    /// The `(P − 1) × L/P` layer times of it that fill and drain the pipeline, ms (0 without
    /// pipelining).
    pub bubble_ms: f64,
    /// The data-parallel collectives of the step: the gradients' reduction and, under the
    /// distributed optimizer, the weights' all-gather, ms.
    pub dp_comm_ms: f64,
    /// What of them the step's compute does not hide, ms: all of it without `dp_overlap`.
    pub dp_exposed_ms: f64,
    /// Whether the collectives overlapped the first and last micro-batch; absent when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dp_overlap: bool,
    /// `pipeline_ms + dp_exposed_ms`.
    pub step_ms: f64,
    /// Real tokens a step trains per GPU-second: the measure that compares layouts on
    /// different numbers of GPUs (a pipeline's stages multiply them).
    pub tokens_per_gpu_s: f64,
}

/// The step of `opts` around `layer` (one micro-batch's layer, forward and backward) under
/// `training`, with `sync` the data-parallel collectives, `tokens` the real tokens of one
/// micro-batch and `stage_gpus` the GPUs of one pipeline stage of one replica (TP × CP).
pub fn step_metrics(
    layer: &LayerMetrics,
    stage_layers: u32,
    training: Training,
    sync: DpSync,
    opts: StepOptions,
    tokens: f64,
    stage_gpus: u32,
) -> StepMetrics {
    const MS: f64 = 1e-6;
    let layers = f64::from(stage_layers);
    let m = f64::from(opts.micro_batches);
    let pp = f64::from(training.pp);
    let slot = layers * layer.layer_time_ms;
    let (each, reduce, gather) = (
        sync.per_micro_batch_ns as f64 * MS,
        sync.reduce_ns as f64 * MS,
        sync.gather_ns as f64 * MS,
    );
    let dp_comm_ms = m * each + reduce + gather;
    let dp_exposed_ms = if opts.dp_overlap {
        // Each micro-batch's reduction hides under its own backward pass; the last one's
        // carries the step's too.
        let backward = layers * layer.backward_ms;
        let forward = slot - backward;
        (m - 1.0) * (each - backward).max(0.0)
            + (each + reduce - backward).max(0.0)
            + (gather - forward).max(0.0)
    } else {
        dp_comm_ms
    };
    let pipeline_ms = (m + pp - 1.0) * slot;
    let step_ms = pipeline_ms + dp_exposed_ms;
    let gpus = f64::from(stage_gpus) * pp;
    StepMetrics {
        micro_batches: opts.micro_batches,
        stage_layers,
        pipeline_ms,
        bubble_ms: (pp - 1.0) * slot,
        dp_comm_ms,
        dp_exposed_ms,
        dp_overlap: opts.dp_overlap,
        step_ms,
        tokens_per_gpu_s: if step_ms > 0.0 {
            m * tokens / (step_ms * 1e-3) / gpus
        } else {
            0.0
        },
    }
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
        DpSync::new(&llama70(), t, cp, 8, &coll).unwrap()
    }

    fn layer(time: f64, backward: f64) -> LayerMetrics {
        LayerMetrics {
            layer_time_ms: time,
            backward_ms: backward,
            linear_mean_ms: 0.0,
            linear_max_ms: 0.0,
            token_imbalance: 0.0,
            layer_lower_bound_ms: time,
            layer_vs_lower_bound: 1.0,
            layer_mfu: 0.0,
            act_max_bytes: 0,
            recompute: Default::default(),
            tp_comm_max_ms: None,
            tp_overlap: false,
            zero3_comm_ms: None,
            zero3_exposed_ms: None,
            footprint: None,
            step: None,
        }
    }

    #[test]
    fn the_bubble_is_p_minus_one_slots_of_the_stage() {
        let t = Training::new(1, 1, 4).unwrap();
        let none = DpSync {
            per_micro_batch_ns: 0,
            reduce_ns: 0,
            gather_ns: 0,
        };
        let opts = StepOptions::new(8, false, t).unwrap();
        let s = step_metrics(&layer(2.0, 1.5), 20, t, none, opts, 1000.0, 64);
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
    fn overlap_hides_the_reduction_under_the_last_backward_and_the_gather_under_the_first_forward()
    {
        let t = Training::default();
        let sync = DpSync {
            per_micro_batch_ns: 0,
            reduce_ns: 50_000_000,
            gather_ns: 10_000_000,
        };
        let l = layer(1.0, 0.75);
        let at = |sync, overlap| {
            step_metrics(
                &l,
                80,
                t,
                sync,
                StepOptions::new(4, overlap, t).unwrap(),
                1.0,
                8,
            )
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
        };
        let over = at(slow, true);
        assert!((over.dp_exposed_ms - 15.0).abs() < 1e-9, "{over:?}");
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
        let l = layer(1.0, 0.75);
        let step = |overlap| {
            step_metrics(
                &l,
                10,
                t,
                z2,
                StepOptions::new(4, overlap, t).unwrap(),
                1.0,
                8,
            )
        };
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
            DpSync::new(&m2, t, 3, 4, &coll).unwrap()
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
}
