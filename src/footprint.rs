//! What one GPU holds during a training step, and whether it fits in the GPU's memory.
//!
//! A CP plan decides how many tokens, and so how many activations, each GPU keeps; the
//! parallel layout decides how much model state sits beside them. A placement that wins on
//! time but does not fit is no answer, so the study commands check both:
//!
//! - **model state**, for mixed-precision Adam as Megatron-Core runs it with bf16 weights:
//!   the weights in the model's dtype, fp32 main gradients ([`GRAD_BYTES`]) and fp32 master
//!   weights with Adam's two moments ([`OPTIMIZER_BYTES`]): 18 bytes a parameter, 6 + 12/d
//!   with the distributed optimizer sharding over `d` GPUs (Megatron-Core developer guide,
//!   "Distributed Optimizer", table of bytes per parameter for bf16 parameters and fp32
//!   gradients; ZeRO stage 1, Rajbhandari et al. 2020, arXiv:1910.02054 §5). ZeRO stage 2
//!   also shards the gradients. The sharding group is the data-parallel group with the CP
//!   ranks folded in, `dp × cp`: CP ranks hold the same weights and reduce their gradients
//!   together (Megatron-Core's `get_data_parallel_group(with_context_parallel=True)`).
//!   ZeRO stage 3 (PyTorch FSDP's full sharding, Megatron-FSDP) shards the weights as well,
//!   so the state is 18/d bytes a parameter, and gathers each layer's weights for the pass
//!   that runs it: the GPU then also holds [`Footprint::gathered_bytes`], two units of
//!   gathered weights (the one running and the one prefetched, Zhao et al. 2023,
//!   arXiv:2304.11277 §3.3–3.4 "backward/forward prefetching") and one unit's full-size fp32
//!   gradients before they are reduce-scattered. A unit is a layer, or the embedding or
//!   output layer where the stage holds a larger one; its neighbour, the one prefetched
//!   beside it, is a layer. On one GPU (`d` = 1) nothing is sharded and nothing gathered.
//!   What the gathers cost in time is the simulator's ([`crate::sim::zero3`]).
//! - **activations**: what each of the GPU's layers keeps for the backward pass
//!   ([`Model::saved_bytes_per_token`] under the chosen recomputation) times its tokens;
//! - **transients**, the largest of what lives only for a moment: the fp32 logits of the
//!   loss (`tokens × vocab / tp`), or one layer's attention working set (the simulator's
//!   `mem_bytes`) plus, when recomputing, the tensors the rerun layer rebuilds.
//!
//! Under pipeline parallelism (`pp` stages, Megatron's 1F1B schedule; `pp` must divide the
//! layers) each stage holds `layers / pp` layers, the first the embedding too and the last the output layer and the
//! loss. The first stage keeps `pp` micro-batches in flight, so it holds as many layers'
//! activations as the whole network has (Korthikanti et al. 2022, arXiv:2205.05198 §4.2.3);
//! the last keeps one. The fullest GPU is on one of those two stages; both are counted.
//! That assumes at least `pp` micro-batches per step, as 1F1B needs to fill the pipeline.
//! Interleaved over `vp` chunks a stage (Megatron's virtual pipeline stages) the first
//! stage keeps `L·(1 + (P − 1)/(P·vp))` layers' activations (§4.2.3 again; Megatron's
//! warm-up count, [`crate::sim::pipeline::in_flight_chunks`]) once a step runs `2·pp` or
//! more micro-batches; at exactly `pp` it runs every forward first and keeps `L`
//! ([`Training::with_micro_batches`] says how many a priced step runs).
//!
//! Not counted: the CUDA context, NCCL's buffers, the allocator's fragmentation and the
//! framework's own workspaces, which together take a few GB a real job cannot use (the
//! datasheet's GB are 10⁹ bytes, a little under what the GPU has: docs/cost-model.md).

use serde::Serialize;
use thiserror::Error;

use crate::model::{Model, ParamParts, Recompute, Stack};
use crate::sim::pipeline::in_flight_chunks;

/// Bytes a parameter's gradient takes: Megatron-Core accumulates and reduces gradients in
/// fp32 when training in bf16 (`accumulate_allreduce_grads_in_fp32`), the "bf16 param, fp32
/// grads" row of its distributed-optimizer table.
pub const GRAD_BYTES: u64 = 4;

/// Bytes of optimizer state a parameter takes: an fp32 master copy and Adam's first and
/// second moments in fp32 (the 12 of the 6 + 12/d in Megatron-Core's table; ZeRO's K = 12).
pub const OPTIMIZER_BYTES: u64 = 12;

/// Bytes the optimizer step moves through HBM for each parameter it updates, given the
/// model's dtype: Adam reads the fp32 gradient ([`GRAD_BYTES`]), the master weight and both
/// moments ([`OPTIMIZER_BYTES`]), writes those three back, and writes the weight in the
/// model's dtype for the next step (Kingma & Ba 2015, Algorithm 1; Megatron-Core's
/// distributed optimizer keeps exactly this state). A fused multi-tensor kernel streams
/// each once, which is what this counts: 30 bytes for bf16.
pub fn optimizer_step_bytes_per_param(dtype_bytes: u32) -> u64 {
    GRAD_BYTES + 2 * OPTIMIZER_BYTES + u64::from(dtype_bytes)
}

/// Bytes a logit takes in the loss: the cross-entropy runs on fp32 logits.
pub const LOGIT_BYTES: u64 = 4;

/// The highest ZeRO stage whose cost is modelled (see the module docs).
pub const MAX_ZERO: u8 = 3;

/// Why a footprint cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FootprintError {
    /// A setting outside what is modelled.
    #[error("{0}")]
    Setting(String),
    /// The model lacks what the footprint is computed from.
    #[error("model {model} gives no {missing}, which a GPU's memory for a training step needs (add them to a model TOML, see docs/hardware.md)")]
    Model {
        /// The model's name.
        model: String,
        /// The keys it lacks.
        missing: String,
    },
}

/// The parameters one pipeline stage holds on a GPU, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageParams {
    /// Layers on the stage.
    pub layers: u32,
    /// One layer's parameters, and the embedding, output layer and final norm where this
    /// stage holds them (0 where it does not).
    pub parts: ParamParts,
}

impl StageParams {
    /// Every parameter the stage holds.
    pub fn total(&self) -> u64 {
        let p = self.parts;
        u64::from(self.layers)
            .saturating_mul(p.layer)
            .saturating_add(p.embedding)
            .saturating_add(p.output)
            .saturating_add(p.final_norm)
    }
}

/// How a training step holds its model state: which ZeRO stage, over how many data-parallel
/// replicas of the CP group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Training {
    /// 0: everything replicated; 1: optimizer state sharded (Megatron's distributed
    /// optimizer); 2: gradients sharded too; 3: weights too, each layer's gathered for the
    /// pass that runs it (FSDP's full sharding).
    pub zero: u8,
    /// Data-parallel replicas of the whole TP × CP group.
    pub dp: u32,
    /// Pipeline stages the layers are split over.
    pub pp: u32,
    /// Chunks of layers each pipeline stage holds (Megatron's virtual pipeline stages,
    /// `--num-virtual-stages-per-pipeline-rank`): 1 is the plain 1F1B schedule; more
    /// interleave them, a smaller bubble for more sends and activations in flight.
    #[serde(skip_serializing_if = "is_one")]
    pub vp: u32,
    /// Micro-batches a step runs, when one is priced: an interleaved schedule of few of them
    /// keeps fewer chunks in flight than its steady state ([`Training::with_micro_batches`]).
    #[serde(skip)]
    pub micro_batches: Option<u32>,
    /// Hybrid sharding: the data-parallel replicas one shard group spans, a divisor of `dp`
    /// (the state is sharded within a group and replicated across the `dp / shard_dp`
    /// groups: PyTorch FSDP's HSDP, DeepSpeed's MiCS, Megatron's
    /// `num_distributed_optimizer_instances`); `None` when the shards span every replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_dp: Option<u32>,
}

impl Default for Training {
    /// Megatron's distributed optimizer, one replica: what long-context recipes run.
    fn default() -> Training {
        Training {
            zero: 1,
            dp: 1,
            pp: 1,
            vp: 1,
            micro_batches: None,
            shard_dp: None,
        }
    }
}

/// Whether a count is the default 1, left out of the JSON.
fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Training {
    /// A training setting, refused outside what is modelled.
    pub fn new(zero: u8, dp: u32, pp: u32) -> Result<Training, FootprintError> {
        if zero > MAX_ZERO {
            return Err(FootprintError::Setting(format!(
                "ZeRO stage {zero} does not exist: 0 (replicated), 1 (optimizer state sharded, Megatron's distributed optimizer), 2 (gradients too) or 3 (weights too, gathered layer by layer: FSDP's full sharding)"
            )));
        }
        if !(1..=1 << 20).contains(&dp) {
            return Err(FootprintError::Setting(format!(
                "--dp {dp}: data-parallel replicas must be 1 to {}",
                1 << 20
            )));
        }
        if !(1..=100_000).contains(&pp) {
            return Err(FootprintError::Setting(format!(
                "--pp {pp}: pipeline stages must be 1 to 100000"
            )));
        }
        Ok(Training {
            zero,
            dp,
            pp,
            vp: 1,
            micro_batches: None,
            shard_dp: None,
        })
    }

    /// This setting counted for a step of `micro_batches`, when one is priced (validated by
    /// [`crate::sim::step::StepOptions::new`]): at exactly `pp` of them an interleaved first
    /// stage runs every forward before any backward and keeps `v·m` chunks, not its steady
    /// state's more. Without a step the count assumes enough micro-batches (`2·pp` or more).
    pub fn with_micro_batches(self, micro_batches: Option<u32>) -> Training {
        Training {
            micro_batches,
            ..self
        }
    }

    /// This setting with each pipeline stage's layers in `vp` chunks, interleaved
    /// (Megatron's virtual pipeline stages). It needs a pipeline to interleave.
    pub fn with_virtual_stages(self, vp: u32) -> Result<Training, FootprintError> {
        if !(1..=1000).contains(&vp) {
            return Err(FootprintError::Setting(format!(
                "--vp {vp}: a pipeline stage holds 1 to 1000 chunks of layers"
            )));
        }
        if vp > 1 && self.pp < 2 {
            return Err(FootprintError::Setting(format!(
                "--vp {vp} interleaves the chunks of a pipeline's stages: it needs --pp 2 or more"
            )));
        }
        Ok(Training { vp, ..self })
    }

    /// This setting with its shards spanning `shard_dp` of the replicas, a divisor of `dp`
    /// (hybrid sharding); `shard_dp = dp` is the default, every replica.
    pub fn with_shard_dp(self, shard_dp: u32) -> Result<Training, FootprintError> {
        if self.zero == 0 {
            return Err(FootprintError::Setting(format!(
                "--shard-dp {shard_dp}: ZeRO 0 shards nothing (--zero 1 to 3 shard the state)"
            )));
        }
        if shard_dp == 0 || self.dp % shard_dp != 0 {
            return Err(FootprintError::Setting(format!(
                "--shard-dp {shard_dp} must divide --dp {} (each shard group spans an equal number of replicas)",
                self.dp
            )));
        }
        Ok(Training {
            shard_dp: (shard_dp != self.dp).then_some(shard_dp),
            ..self
        })
    }

    /// Data-parallel replicas one shard group spans: `shard_dp`, or all of them.
    pub fn shard_replicas(&self) -> u32 {
        self.shard_dp.unwrap_or(self.dp)
    }

    /// Whether `model` can be counted under this setting: it gives its `layers` and `vocab`
    /// and the pipeline stages divide its layers (each holds an equal share, as Megatron
    /// requires). Checked where the setting meets the model, before anything runs.
    pub fn check(&self, model: &Model) -> Result<(), FootprintError> {
        self.parts_of(model).map(|_| ())
    }

    /// The model's stack and parameter parts, once [`Training::check`] holds.
    fn parts_of(&self, model: &Model) -> Result<(Stack, ParamParts), FootprintError> {
        let missing = |what: &str| FootprintError::Model {
            model: model.name.clone(),
            missing: what.to_string(),
        };
        let s = model.stack.ok_or_else(|| missing("`layers` and `vocab`"))?;
        let parts = model
            .param_parts()
            .ok_or_else(|| missing("`hidden` and `ffn_hidden`"))?;
        if s.layers % self.pp != 0 {
            return Err(FootprintError::Setting(format!(
                "--pp {} does not divide model {}'s {} layers (each pipeline stage holds an equal share, as Megatron requires)",
                self.pp, model.name, s.layers
            )));
        }
        if s.layers % (self.pp * self.vp) != 0 {
            return Err(FootprintError::Setting(format!(
                "--pp {} × --vp {} does not divide model {}'s {} layers (each chunk holds an equal share, as Megatron requires)",
                self.pp, self.vp, model.name, s.layers
            )));
        }
        Ok((s, parts))
    }

    /// The parameters pipeline stage `stage` holds (on one GPU of its TP group): its share of
    /// the layers, the first stage the embedding, the last the output layer and the final
    /// norm. A tied output layer keeps a copy of the embedding on the last stage when it is
    /// not also the first (Megatron's shared word embedding).
    pub fn stage_params(&self, model: &Model, stage: u32) -> Result<StageParams, FootprintError> {
        let (s, parts) = self.parts_of(model)?;
        let (is_first, is_last) = (stage == 0, stage + 1 == self.pp);
        let output = if s.tied_embeddings && !is_first {
            parts.embedding
        } else {
            parts.output
        };
        Ok(StageParams {
            layers: s.layers / self.pp,
            parts: ParamParts {
                layer: parts.layer,
                embedding: if is_first { parts.embedding } else { 0 },
                output: if is_last { output } else { 0 },
                final_norm: if is_last { parts.final_norm } else { 0 },
            },
        })
    }

    /// The largest [`Training::stage_params`] of any stage: the first or the last, which hold
    /// the embedding and the output layer beside their layers.
    pub fn fullest_stage_params(&self, model: &Model) -> Result<StageParams, FootprintError> {
        let first = self.stage_params(model, 0)?;
        let last = self.stage_params(model, self.pp - 1)?;
        Ok(if last.total() > first.total() {
            last
        } else {
            first
        })
    }

    /// Parameters one GPU of the fullest pipeline stage updates in the optimizer step: the
    /// stage's (its TP share), split over the shard group once the optimizer state is sharded
    /// (ZeRO 1 and up: each GPU updates its shard, then the weights are gathered).
    pub fn optimizer_params(&self, model: &Model, cp: u32) -> Result<u64, FootprintError> {
        let params = self.fullest_stage_params(model)?.total();
        Ok(if self.zero >= 1 {
            params.div_ceil(self.shard_ranks(cp).max(1))
        } else {
            params
        })
    }

    /// GPUs the sharded state is spread over: the CP ranks of every replica in a shard group
    /// (all replicas unless hybrid sharding narrows it).
    pub fn shard_ranks(&self, cp: u32) -> u64 {
        u64::from(self.shard_replicas()) * u64::from(cp.max(1))
    }

    /// Whether the weights are sharded and gathered layer by layer (ZeRO 3).
    pub fn gathers_weights(&self) -> bool {
        self.zero >= 3
    }
}

/// What one GPU holds at its fullest moment of a training step, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Footprint {
    /// The CP rank this is (the fullest one, where a plan gives several).
    pub rank: u32,
    /// The weights, in the model's dtype (sharded under ZeRO 3).
    pub weight_bytes: u64,
    /// Main gradients (fp32), sharded under ZeRO 2 and 3.
    pub grad_bytes: u64,
    /// Master weights and Adam's moments (fp32), sharded under ZeRO 1 to 3.
    pub optimizer_bytes: u64,
    /// Under ZeRO 3: the gathered weights of the unit running and the one prefetched, and
    /// the running unit's full fp32 gradients before their reduce-scatter; 0 otherwise.
    #[serde(skip_serializing_if = "crate::plan::is_zero")]
    pub gathered_bytes: u64,
    /// What all the GPU's layers keep for the backward pass.
    pub activation_bytes: u64,
    /// The largest of what lives only for a moment: the loss's logits, or one layer's
    /// attention working set plus what recomputation rebuilds.
    pub transient_bytes: u64,
    /// All of the above.
    pub total_bytes: u64,
    /// The GPU's memory, when the hardware profile gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hbm_bytes: Option<u64>,
    /// `total_bytes <= hbm_bytes`, when the memory is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fits: Option<bool>,
    /// The training setting it was counted for (its keys, `zero`, `dp`, `pp` and
    /// `shard_dp`, sit in the footprint's JSON).
    #[serde(flatten)]
    pub training: Training,
    /// The pipeline stage the GPU is in (0 is the first).
    pub stage: u32,
    /// Layers the GPU holds.
    pub layers: u32,
    /// Layers' worth of activations it keeps: its layers times the micro-batches in
    /// flight on its stage.
    pub activation_layers: u32,
}

impl Footprint {
    /// The model state alone (weights, gradients, optimizer; sharded, under ZeRO 3, without
    /// what is gathered), which no placement changes.
    pub fn state_bytes(&self) -> u64 {
        self.weight_bytes + self.grad_bytes + self.optimizer_bytes
    }

    /// Share of the GPU's memory the step takes, when the memory is known.
    pub fn hbm_fraction(&self) -> Option<f64> {
        self.hbm_bytes
            .map(|h| self.total_bytes as f64 / h.max(1) as f64)
    }
}

/// One CP rank of a plan, as the footprint reads it.
#[derive(Debug, Clone, Copy)]
pub struct RankLoad {
    /// CP rank.
    pub rank: u32,
    /// Tokens whose rows it computes (padding included: it is stored like data).
    pub tokens: u64,
    /// Its peak attention working set (the simulator's `mem_bytes`).
    pub attention_bytes: u64,
}

/// What the count needs besides a rank's load: the model (one GPU's share under its
/// [`Model::tp`]), how the state is held, what is recomputed, the CP group's size and the
/// GPU's memory.
#[derive(Debug, Clone, Copy)]
pub struct Counter<'a> {
    /// One GPU's share of the model.
    pub model: &'a Model,
    /// How the model state is held.
    pub training: Training,
    /// What the backward pass recomputes.
    pub recompute: Recompute,
    /// CP ranks (the sharded state spreads over `dp ×` these).
    pub cp: u32,
    /// The GPU's memory, when known.
    pub hbm_bytes: Option<u64>,
}

impl Counter<'_> {
    /// The footprint of the fullest of `ranks` (ties: the lowest rank).
    pub fn fullest(&self, ranks: &[RankLoad]) -> Result<Option<Footprint>, FootprintError> {
        let mut best: Option<Footprint> = None;
        for r in ranks {
            let f = self.of_rank(r)?;
            if best.is_none_or(|b| f.total_bytes > b.total_bytes) {
                best = Some(f);
            }
        }
        Ok(best)
    }

    /// The footprint of one rank: of its fuller pipeline stage, the first or the last.
    pub fn of_rank(&self, load: &RankLoad) -> Result<Footprint, FootprintError> {
        let first = self.of_stage(load, 0)?;
        if self.training.pp == 1 {
            return Ok(first);
        }
        let last = self.of_stage(load, self.training.pp - 1)?;
        Ok(if last.total_bytes > first.total_bytes {
            last
        } else {
            first
        })
    }

    /// The footprint of one rank on pipeline stage `stage`.
    fn of_stage(&self, load: &RankLoad, stage: u32) -> Result<Footprint, FootprintError> {
        let Counter {
            model,
            training,
            recompute,
            cp,
            hbm_bytes,
        } = *self;
        let (s, _) = training.parts_of(model)?;
        let pp = training.pp;
        let is_last = stage + 1 == pp;
        let held = training.stage_params(model, stage)?;
        let (layers, parts) = (held.layers, held.parts);
        let params = held.total();
        let d = training.shard_ranks(cp);
        let sharded = |bytes_per_param: u64, shard: bool| {
            let all = params.saturating_mul(bytes_per_param);
            if shard {
                all.div_ceil(d)
            } else {
                all
            }
        };
        let dtype = u64::from(model.dtype_bytes);
        let weight_bytes = sharded(dtype, training.gathers_weights());
        let grad_bytes = sharded(GRAD_BYTES, training.zero >= 2);
        let optimizer_bytes = sharded(OPTIMIZER_BYTES, training.zero >= 1);
        // FSDP gathers a unit at a time and prefetches the next: at worst the largest the
        // stage holds and a layer beside it, and the largest's fp32 gradients.
        let gathered_bytes = if training.gathers_weights() && d > 1 {
            let unit = [parts.layer, parts.embedding, parts.output]
                .into_iter()
                .max()
                .unwrap_or(0);
            (unit.saturating_add(parts.layer))
                .saturating_mul(dtype)
                .saturating_add(unit.saturating_mul(GRAD_BYTES))
        } else {
            0
        };
        // 1F1B: stage i keeps pp − i micro-batches in flight, more chunks when interleaved,
        // and never more than the step runs.
        let chunks = training.micro_batches.map_or(u64::MAX, |m| {
            u64::from(m).saturating_mul(u64::from(training.vp))
        });
        let activation_layers = u64::from(layers / training.vp)
            .saturating_mul(in_flight_chunks(pp, training.vp, stage).min(chunks));
        let saved = |r: Recompute| model.saved_bytes_per_token(r).unwrap_or(0);
        let activation_bytes = activation_layers
            .saturating_mul(load.tokens)
            .saturating_mul(saved(recompute));
        let logits = if is_last {
            let vocab_rows = u64::from(s.vocab).div_ceil(u64::from(model.tp.max(1)));
            load.tokens
                .saturating_mul(vocab_rows)
                .saturating_mul(LOGIT_BYTES)
        } else {
            0
        };
        let rebuilt = load
            .tokens
            .saturating_mul(saved(Recompute::None) - saved(recompute));
        let transient_bytes = logits.max(load.attention_bytes.saturating_add(rebuilt));
        let total_bytes = [
            weight_bytes,
            grad_bytes,
            optimizer_bytes,
            gathered_bytes,
            activation_bytes,
            transient_bytes,
        ]
        .into_iter()
        .fold(0u64, u64::saturating_add);
        Ok(Footprint {
            rank: load.rank,
            weight_bytes,
            grad_bytes,
            optimizer_bytes,
            gathered_bytes,
            activation_bytes,
            transient_bytes,
            total_bytes,
            hbm_bytes,
            fits: hbm_bytes.map(|h| total_bytes <= h),
            training,
            stage,
            layers,
            // At most twice the model's layers: it fits where they do.
            activation_layers: u32::try_from(activation_layers).unwrap_or(u32::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Hardware;

    fn llama70() -> Model {
        Model::load("llama3-70b").unwrap()
    }

    fn load(rank: u32, tokens: u64, attention_bytes: u64) -> RankLoad {
        RankLoad {
            rank,
            tokens,
            attention_bytes,
        }
    }

    /// A counter for `model` on a CP group of 8, no memory given unless `hbm_bytes`.
    fn count(model: &Model, training: Training, recompute: Recompute) -> Counter<'_> {
        Counter {
            model,
            training,
            recompute,
            cp: 8,
            hbm_bytes: None,
        }
    }

    fn training(zero: u8, dp: u32, pp: u32) -> Training {
        Training::new(zero, dp, pp).unwrap()
    }

    #[test]
    fn llama3_70b_has_the_parameters_its_card_gives() {
        // 70,553,706,496: the parameter count of Meta-Llama-3-70B's safetensors index.
        assert_eq!(llama70().params_per_gpu(), Some(70_553_706_496));
        // Llama 3 8B: 8,030,261,248.
        let m = Model::load("llama3-8b").unwrap();
        assert_eq!(m.params_per_gpu(), Some(8_030_261_248));
        assert_eq!(Model::load("mha-16").unwrap().params_per_gpu(), None);
    }

    #[test]
    fn state_follows_megatrons_bytes_per_parameter() {
        let m = Model::load("llama3-8b").unwrap();
        let p = m.params_per_gpu().unwrap();
        let f = |zero, dp, cp| {
            Counter {
                cp,
                ..count(&m, training(zero, dp, 1), Recompute::None)
            }
            .of_rank(&load(0, 0, 0))
            .unwrap()
        };
        // Replicated: 18 bytes a parameter.
        assert_eq!(f(0, 1, 8).state_bytes(), 18 * p);
        // Distributed optimizer over d = dp × cp: 6 + 12/d.
        let z1 = f(1, 2, 8);
        assert_eq!(z1.weight_bytes + z1.grad_bytes, 6 * p);
        assert_eq!(z1.optimizer_bytes, (12 * p).div_ceil(16));
        // ZeRO 2: 2 + 16/d.
        let z2 = f(2, 1, 4);
        assert_eq!(z2.weight_bytes, 2 * p);
        assert_eq!(
            z2.grad_bytes + z2.optimizer_bytes,
            (4 * p).div_ceil(4) + (12 * p).div_ceil(4)
        );
        assert_eq!(z2.fits, None);
    }

    #[test]
    fn zero_3_shards_the_weights_too_and_holds_the_largest_unit_gathered() {
        let m = Model::load("llama3-8b").unwrap();
        let p = m.params_per_gpu().unwrap();
        let parts = m.param_parts().unwrap();
        let f = |zero, pp| {
            count(&m, training(zero, 2, pp), Recompute::None)
                .of_rank(&load(0, 0, 0))
                .unwrap()
        };
        // 18 bytes a parameter over d = 2 × 8 = 16 GPUs.
        let z3 = f(3, 1);
        assert_eq!(z3.weight_bytes, (2 * p).div_ceil(16));
        assert_eq!(z3.grad_bytes, (4 * p).div_ceil(16));
        assert_eq!(z3.optimizer_bytes, (12 * p).div_ceil(16));
        // Llama 3 8B's embedding (128256 × 4096) outweighs a layer: it is the largest unit
        // gathered, in bf16 beside a prefetched layer, and as fp32 gradients.
        assert!(parts.embedding > parts.layer);
        let embedding_and_layer = (parts.embedding + parts.layer) * 2 + parts.embedding * 4;
        assert_eq!(z3.gathered_bytes, embedding_and_layer);
        assert_eq!(z3.total_bytes, z3.state_bytes() + z3.gathered_bytes);
        assert_eq!(f(2, 1).gathered_bytes, 0);
        // Under a pipeline the first stage still gathers the embedding, and the last the
        // output layer, a tied one as its copy of the embedding.
        let four = count(&m, training(3, 2, 4), Recompute::None);
        assert_eq!(
            four.of_stage(&load(0, 0, 0), 0).unwrap().gathered_bytes,
            embedding_and_layer
        );
        let mut tied = m.clone();
        tied.stack.as_mut().unwrap().tied_embeddings = true;
        let tied_last = count(&tied, training(3, 2, 4), Recompute::None)
            .of_stage(&load(0, 0, 0), 3)
            .unwrap();
        assert_eq!(tied_last.gathered_bytes, embedding_and_layer);
        // Less state than ZeRO 2 on so many GPUs, despite the gathered units.
        assert!(z3.total_bytes < f(2, 1).total_bytes);
        // One GPU shards nothing, so gathers nothing: ZeRO 3 holds what ZeRO 2 does.
        let alone = |zero| {
            Counter {
                cp: 1,
                ..count(&m, training(zero, 1, 1), Recompute::None)
            }
            .of_rank(&load(0, 0, 0))
            .unwrap()
        };
        assert_eq!(alone(3).gathered_bytes, 0);
        assert_eq!(alone(3).total_bytes, alone(2).total_bytes);
    }

    #[test]
    fn activations_and_transients_follow_the_tokens() {
        let m = llama70();
        let hbm_bytes = Hardware::load("h100").unwrap().hbm_bytes();
        let at = |tokens| load(3, tokens, 1 << 30);
        let counter = |recompute| Counter {
            hbm_bytes,
            ..count(&m, Training::default(), recompute)
        };
        let none = counter(Recompute::None).of_rank(&at(4096)).unwrap();
        let per = m.saved_bytes_per_token(Recompute::None).unwrap();
        assert_eq!(none.activation_bytes, 80 * 4096 * per);
        // Logits: 4096 × 128256 fp32 = 2.1 GB, more than the 1 GiB working set.
        assert_eq!(none.transient_bytes, 4096 * 128_256 * 4);
        let full = counter(Recompute::Full).of_rank(&at(4096)).unwrap();
        assert_eq!(full.activation_bytes, 80 * 4096 * 8192 * 2);
        // Recomputing one layer rebuilds its whole set on top of the working set.
        let rebuilt = 4096 * (per - 8192 * 2);
        assert_eq!(
            full.transient_bytes,
            (4096 * 128_256 * 4).max((1 << 30) + rebuilt)
        );
        assert_eq!(full.state_bytes(), none.state_bytes());
        assert!(full.total_bytes < none.total_bytes);
        assert_eq!(none.fits, Some(none.total_bytes <= 80_000_000_000));
        // The fullest of several ranks is the one with most tokens.
        let f = counter(Recompute::None)
            .fullest(&[at(10), at(4096), at(20)])
            .unwrap();
        assert_eq!(f, Some(none));
    }

    #[test]
    fn tensor_parallelism_splits_weights_and_logits() {
        let m = llama70();
        let h100 = Hardware::load("h100").unwrap();
        let (_, m8) = crate::tp::split(&h100, &m, 8).unwrap();
        let p1 = m.params_per_gpu().unwrap();
        let p8 = m8.params_per_gpu().unwrap();
        // Everything but the norms is split eight ways.
        let norms = 80 * 2 * 8192 + 8192;
        assert_eq!(p8 - norms, (p1 - norms) / 8);
        let f = count(&m8, Training::default(), Recompute::None)
            .of_rank(&load(0, 1000, 0))
            .unwrap();
        assert_eq!(f.transient_bytes, 1000 * (128_256 / 8) * 4);
    }

    #[test]
    fn hybrid_sharding_shards_within_a_group_of_replicas() {
        let m = Model::load("llama3-8b").unwrap();
        let p = m.params_per_gpu().unwrap();
        let at = |t: Training| {
            count(&m, t, Recompute::None)
                .of_rank(&load(0, 0, 0))
                .unwrap()
        };
        // DP 8, shards over 2 replicas × CP 8 = 16 GPUs, replicated over 4 groups.
        let hsdp = training(3, 8, 1).with_shard_dp(2).unwrap();
        assert_eq!(hsdp.shard_ranks(8), 16);
        let f = at(hsdp);
        assert_eq!(f.optimizer_bytes, (12 * p).div_ceil(16));
        assert_eq!(f.weight_bytes, (2 * p).div_ceil(16));
        assert_eq!(f.training.shard_dp, Some(2));
        // As much as ZeRO 3 over two replicas alone; more than over all eight.
        assert_eq!(f.state_bytes(), at(training(3, 2, 1)).state_bytes());
        assert!(f.total_bytes > at(training(3, 8, 1)).total_bytes);
        // Spanning every replica is the default, written as none.
        assert_eq!(
            training(1, 8, 1).with_shard_dp(8).unwrap(),
            training(1, 8, 1)
        );
        for (zero, shard) in [(1, 3), (1, 0), (0, 1)] {
            assert!(training(zero, 8, 1).with_shard_dp(shard).is_err());
        }
    }

    #[test]
    fn what_is_not_modelled_is_refused() {
        let e = Training::new(4, 1, 1).unwrap_err().to_string();
        assert!(e.contains("stage 4") && e.contains("3 (weights too"), "{e}");
        assert!(Training::new(1, 0, 1).is_err());
        assert!(Training::new(1, 1, 0).is_err());
        let refused = |m: &Model, t| {
            count(m, t, Recompute::None)
                .of_rank(&load(0, 1, 0))
                .unwrap_err()
                .to_string()
        };
        let e = refused(&Model::load("mha-16").unwrap(), Training::default());
        assert!(e.contains("layers"), "{e}");
        // Chunks hold equal shares too, and interleaving needs a pipeline.
        let chunks = training(1, 1, 4).with_virtual_stages(3).unwrap();
        let e = refused(&llama70(), chunks);
        assert!(e.contains("--pp 4 × --vp 3 does not divide"), "{e}");
        let e = training(1, 1, 1)
            .with_virtual_stages(2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs --pp 2 or more"), "{e}");
        assert!(training(1, 1, 2).with_virtual_stages(0).is_err());
        // Pipeline stages hold equal shares of the layers.
        for pp in [81, 3] {
            let e = refused(&llama70(), training(1, 1, pp));
            assert!(
                e.contains("does not divide") && e.contains("80 layers"),
                "{e}"
            );
        }
    }

    #[test]
    fn pipeline_stages_split_the_state_but_the_first_keeps_every_layers_activations() {
        let m = llama70();
        let parts = m.param_parts().unwrap();
        let rank = load(0, 8192, 0);
        let per = m.saved_bytes_per_token(Recompute::None).unwrap();
        let one = count(&m, Training::default(), Recompute::None)
            .of_rank(&rank)
            .unwrap();
        let four = count(&m, training(1, 1, 4), Recompute::None);
        let first = four.of_stage(&rank, 0).unwrap();
        let last = four.of_stage(&rank, 3).unwrap();
        // 20 layers a stage; the first adds the embedding, the last the output layer and norm.
        assert_eq!(first.weight_bytes, 2 * (20 * parts.layer + parts.embedding));
        assert_eq!(
            last.weight_bytes,
            2 * (20 * parts.layer + parts.output + parts.final_norm)
        );
        // 1F1B: the first stage has 4 micro-batches of 20 layers in flight, as many as the
        // whole network without a pipeline; the last has one, and the logits.
        assert_eq!((first.activation_layers, last.activation_layers), (80, 20));
        assert_eq!(first.activation_bytes, one.activation_bytes);
        assert_eq!(last.activation_bytes, 20 * 8192 * per);
        assert_eq!(first.transient_bytes, 0);
        assert_eq!(last.transient_bytes, 8192 * 128_256 * 4);
        // The rank's footprint is its fuller stage.
        let f = four.of_rank(&rank).unwrap();
        assert_eq!(f, first);
        // Interleaved over 2 chunks of 10 layers: the first stage keeps 2·3 + 4 + 1 = 11
        // chunks in flight, 80 · (1 + 3/8) = 110 layers; the last 4 + 1 chunks; the same
        // weights.
        let two = count(
            &m,
            training(1, 1, 4).with_virtual_stages(2).unwrap(),
            Recompute::None,
        );
        let (vfirst, vlast) = (
            two.of_stage(&rank, 0).unwrap(),
            two.of_stage(&rank, 3).unwrap(),
        );
        assert_eq!(
            (vfirst.activation_layers, vlast.activation_layers),
            (110, 50)
        );
        assert_eq!(vfirst.weight_bytes, first.weight_bytes);
        // A step of only 4 micro-batches has 8 chunk forwards a stage: the first stage runs
        // them all before any backward; 8 is more than the last stage's 5. At 8 the steady
        // state's 11 fit.
        let layers_of = |micro_batches, stage| {
            let t = training(1, 1, 4)
                .with_virtual_stages(2)
                .unwrap()
                .with_micro_batches(Some(micro_batches));
            let f = count(&m, t, Recompute::None).of_stage(&rank, stage);
            f.unwrap().activation_layers
        };
        assert_eq!((layers_of(4, 0), layers_of(4, 3)), (80, 50));
        assert_eq!(layers_of(8, 0), 110);
        assert!(f.state_bytes() * 3 < one.state_bytes());
        // A tied output layer keeps a copy of the embedding on the last stage.
        let mut tied = m.clone();
        tied.stack.as_mut().unwrap().tied_embeddings = true;
        let last = count(&tied, training(1, 1, 4), Recompute::None)
            .of_stage(&rank, 3)
            .unwrap();
        assert_eq!(
            last.weight_bytes,
            2 * (20 * parts.layer + parts.embedding + parts.final_norm)
        );
        let only = count(&tied, Training::default(), Recompute::None)
            .of_rank(&rank)
            .unwrap();
        assert_eq!(
            only.weight_bytes,
            2 * (80 * parts.layer + parts.embedding + parts.final_norm)
        );
    }
}
