//! Event-driven simulator: per-rank compute, communication, overlap and imbalance for any plan,
//! under one cost model for all schemes (`docs/cost-model.md`).
//!
//! Planners never simulate and the simulator never plans: it reads the plan IR, derives the
//! backward pass with one shared function ([`program::Program::backward`]), runs each pass on
//! the event engine and reports the metrics named in the design.

mod compute;
mod engine;
mod fair_share;
mod index;
mod layer;
mod memory;
mod metrics;
mod network;
pub mod pipeline;
mod program;
pub mod step;
pub mod waits;
pub mod zero3;

pub use compute::{ComputeModel, TileCost};
pub use engine::{PassOutcome, RankOutcome, RankTimeline};
pub use layer::{LayerCost, LayerMetrics, LayerPass, LinearEstimate};
pub use metrics::{lower_bound_ms, PlanMetrics, RankMetrics, SimReport};
pub use network::{max_min_rates, CollectiveModel, Network};
pub use program::{grad_bytes, CollectiveKind, CollectiveOp, Flow, Program, StepCost};

use crate::hardware::{Hardware, HardwareError, KernelProfile, NcclTable, Pass};
use crate::model::{Model, Recompute};
use crate::plan::Plan;

/// Errors simulating a plan.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A profile lacks what the plan needs (e.g. a kernel row for its head dimension).
    #[error(transparent)]
    Hardware(#[from] HardwareError),
    /// The plan's dependencies can never be satisfied.
    #[error("the plan deadlocks: {0}")]
    Deadlock(String),
    /// The plan does not fit the model (head counts differ, ...).
    #[error("{0}")]
    Mismatch(String),
    /// A GPU's memory for a training step cannot be counted ([`crate::footprint`]).
    #[error(transparent)]
    Footprint(#[from] crate::footprint::FootprintError),
}

/// Which passes to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PassSel {
    /// Forward only (inference).
    Fwd,
    /// Backward only.
    Bwd,
    /// Forward then backward (training), the default.
    #[default]
    Both,
}

impl PassSel {
    /// The passes in order.
    pub fn passes(self) -> &'static [Pass] {
        match self {
            PassSel::Fwd => &[Pass::Fwd],
            PassSel::Bwd => &[Pass::Bwd],
            PassSel::Both => &[Pass::Fwd, Pass::Bwd],
        }
    }

    /// Name as written on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PassSel::Fwd => "fwd",
            PassSel::Bwd => "bwd",
            PassSel::Both => "both",
        }
    }
}

/// Everything the simulator needs besides the plan. Load once, simulate many plans.
pub struct Simulator {
    hw: Hardware,
    model: Model,
    profile: KernelProfile,
    nccl: Option<NcclTable>,
    net: Network,
    layer: Option<LayerCost>,
    /// One TP group's node, when the model is a tensor-parallel share ([`Model::tp`]).
    tp_node: Option<Network>,
    /// How a training step holds its model state, when reports count each GPU's memory
    /// ([`Simulator::with_training`]).
    training: Option<crate::footprint::Training>,
}

impl Simulator {
    /// The same simulator for a CP group whose rank 0 sits on GPU `first_gpu` of its node
    /// ([`network::Network::with_first_gpu`]): a group that straddles a node's edge pays the
    /// NICs between its two parts. The planners still place ranks as if the group started on
    /// a node's edge.
    pub fn with_first_gpu(mut self, first_gpu: u32) -> Simulator {
        self.net = self.net.with_first_gpu(first_gpu);
        self
    }

    /// A simulator for `model` on `hw` (loads the kernel profile and NCCL table it names).
    pub fn new(hw: Hardware, model: Model) -> Result<Simulator, SimError> {
        let profile = hw.kernel_profile()?;
        let nccl = hw.nccl_table()?;
        let net = Network::new(&hw);
        let tp_node = (model.tp > 1).then(|| layer::TpComm::node(&hw, model.tp));
        Ok(Simulator {
            hw,
            model,
            profile,
            nccl,
            net,
            layer: None,
            tp_node,
            training: None,
        })
    }

    /// Also simulate the whole layer around attention ([`layer`]): every report then carries
    /// [`LayerMetrics`] and per-rank token-linear time. An error names what the model or
    /// hardware lacks for it.
    pub fn with_layer(self) -> Result<Simulator, SimError> {
        self.with_recompute(Recompute::None)
    }

    /// [`Simulator::with_layer`] with a backward pass that recomputes as `recompute` says: the
    /// activations kept and the layer's time follow it.
    pub fn with_recompute(mut self, recompute: Recompute) -> Result<Simulator, SimError> {
        self.layer = Some(LayerCost::with_recompute(&self.hw, &self.model, recompute)?);
        Ok(self)
    }

    /// With the whole layer on, each TP collective overlapping the GEMM it feeds or drains
    /// ([`LayerCost::with_tp_overlap`]). No effect without the layer or without TP.
    pub fn with_tp_overlap(mut self, tp_overlap: bool) -> Simulator {
        self.layer = self.layer.map(|c| c.with_tp_overlap(tp_overlap));
        self
    }

    /// With the whole layer on, also count what each GPU holds over a training step under
    /// `training` ([`crate::footprint`]): every report's layer metrics then carry the fullest
    /// GPU's [`crate::footprint::Footprint`]. An error when the layer is off or the model gives
    /// no `layers` and `vocab`.
    pub fn with_training(
        mut self,
        training: crate::footprint::Training,
    ) -> Result<Simulator, SimError> {
        if self.layer.is_none() {
            return Err(SimError::Mismatch(
                "a GPU's memory for a training step needs the whole layer (--layer): activations are counted there".into(),
            ));
        }
        training.check(&self.model)?;
        self.training = Some(training);
        Ok(self)
    }

    /// The training step over `windows` (each window's layer metrics from this simulator
    /// and its real tokens, [`step::MicroBatch::of`], in the order the stream trains them)
    /// on a CP group of `cp` ranks ([`step`]): each window's output layer and sends between
    /// stages priced from the tokens on its busiest rank. An error unless
    /// [`Simulator::with_training`] set how the state is held, or unless every layer ran
    /// both passes: a step trains.
    pub fn step(
        &self,
        windows: &[step::MicroBatch],
        cp: u32,
        opts: step::StepOptions,
    ) -> Result<step::StepMetrics, SimError> {
        let Some(training) = self.training else {
            return Err(SimError::Mismatch(
                "a training step needs how the state is held (Simulator::with_training)".into(),
            ));
        };
        if windows.is_empty() {
            return Err(SimError::Mismatch(
                "a training step needs at least one simulated window".into(),
            ));
        }
        if windows
            .iter()
            .any(|w| w.backward_ms <= 0.0 || w.backward_ms >= w.layer_ms)
        {
            return Err(SimError::Mismatch(
                "a training step runs the forward and the backward pass: simulate --pass both"
                    .into(),
            ));
        }
        let coll = CollectiveModel::new(&self.net, self.nccl.as_ref());
        let sync = step::DpSync::new(
            &self.model,
            training,
            cp,
            self.hw.gpus_per_node,
            &coll,
            self.hw.hbm_bytes_per_s(),
        )?;
        let stage = training.fullest_stage_params(&self.model)?;
        let rate = self.layer.as_ref().map_or(0.0, |l| l.flops_per_s);
        let priced: Vec<step::MicroBatch> = windows
            .iter()
            .map(|w| step::MicroBatch {
                extras: step::StageExtras {
                    send_ms: step::activation_send_ns(
                        &self.model,
                        training,
                        cp,
                        w.rank_tokens,
                        self.hw.gpus_per_node,
                        &self.net,
                    ) as f64
                        * 1e-6,
                    head: step::output_layer(&self.model, w.rank_tokens, rate),
                },
                ..*w
            })
            .collect();
        Ok(step::step_metrics(
            &priced,
            stage.layers,
            training,
            sync,
            opts,
            self.model.tp.max(1) * cp.max(1),
        ))
    }

    /// The layer cost, when [`Simulator::with_layer`] turned the whole layer on.
    pub fn layer_cost(&self) -> Option<&LayerCost> {
        self.layer.as_ref()
    }

    /// The hardware profile.
    pub fn hardware(&self) -> &Hardware {
        &self.hw
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// A compute model sharing this simulator's profiles.
    pub fn compute_model(&self) -> ComputeModel<'_> {
        ComputeModel::new(&self.hw, &self.profile, &self.model)
    }

    /// Simulate `plan` for the selected passes.
    pub fn simulate(&self, plan: &Plan, passes: PassSel) -> Result<SimReport, SimError> {
        self.simulate_traced(plan, passes).map(|(r, _)| r)
    }

    /// The plan was made for this model's head counts.
    fn check_model(&self, plan: &Plan) -> Result<(), SimError> {
        let planned_tp = plan.tp.unwrap_or(1);
        let split = self.model.tp.max(1);
        if planned_tp != split {
            return Err(SimError::Mismatch(format!(
                "the plan was made under tensor parallelism {planned_tp} ({} q / {} kv heads per GPU) but model {} is split {split} way(s): split it as the plan's `tp` says (fcp::tp::split)",
                plan.q_heads, plan.kv_heads, self.model.name,
            )));
        }
        if plan.q_heads != self.model.q_heads || plan.kv_heads != self.model.kv_heads {
            // The model's own heads split another way: the plan's `tp` does not match its
            // head counts (a hand edit), so the advice is the split, not another model.
            let (q, kv) = (self.model.q_heads * split, self.model.kv_heads * split);
            let other_split = (plan.q_heads > 0 && q % plan.q_heads == 0)
                .then(|| q / plan.q_heads)
                .filter(|&t| t != split && plan.kv_heads * t == kv);
            if let Some(t) = other_split {
                return Err(SimError::Mismatch(format!(
                    "the plan holds {} q / {} kv heads, model {}'s split {t} ways, but records tensor parallelism {split}: its `tp` field does not match its heads; plan again with --tp {t}",
                    plan.q_heads, plan.kv_heads, self.model.name,
                )));
            }
            return Err(SimError::Mismatch(format!(
                "the plan was made for {} q / {} kv heads ({}) but model {} has {} / {}: simulate it with the model it was made for, or plan again with --model {}",
                plan.q_heads,
                plan.kv_heads,
                plan.model.as_deref().unwrap_or("model not recorded"),
                self.model.name,
                self.model.q_heads,
                self.model.kv_heads,
                self.model.name,
            )));
        }
        Ok(())
    }

    /// The whole layer's time alone (ms, summed over `passes`), without the attention-only
    /// runs and metrics [`Simulator::simulate`] adds: what a planner comparing candidates on
    /// the layer needs, at half the engine runs. `None` unless [`Simulator::with_layer`].
    pub fn layer_time_ms(&self, plan: &Plan, passes: PassSel) -> Result<Option<f64>, SimError> {
        let Some(cost) = &self.layer else {
            return Ok(None);
        };
        let mut run = self.start(plan)?;
        let mut layers = Vec::new();
        for &pass in passes.passes() {
            let program = run.program(pass)?;
            run.push_layer_pass(cost, &program, &mut layers)?;
        }
        // Summed as `LayerMetrics::layer_time_ms` is, to the last bit.
        Ok(Some(layers.iter().map(|l| l.end_ns() as f64 * 1e-6).sum()))
    }

    /// [`Simulator::simulate`] with the whole layer on, returning each pass's whole-layer
    /// pass: per-rank timelines with the token-linear work ([`RankTimeline::linear`]) and the
    /// pass ending where the layer does (what `fcp plot gantt --layer` draws), the forward pass
    /// rerun under full recomputation among them ([`LayerPass::label`]). An error unless
    /// [`Simulator::with_layer`].
    pub fn simulate_layer_traced(
        &self,
        plan: &Plan,
        passes: PassSel,
    ) -> Result<(SimReport, Vec<LayerPass>), SimError> {
        if self.layer.is_none() {
            return Err(SimError::Mismatch(
                "the whole layer is not on (Simulator::with_layer)".into(),
            ));
        }
        let (report, _, layers) = self.run(plan, passes)?;
        Ok((report, layers))
    }

    /// [`Simulator::simulate`], also returning each pass's outcome with its per-rank timeline
    /// (what Gantt charts draw).
    pub fn simulate_traced(
        &self,
        plan: &Plan,
        passes: PassSel,
    ) -> Result<(SimReport, Vec<PassOutcome>), SimError> {
        self.run(plan, passes).map(|(r, o, _)| (r, o))
    }

    /// Start simulating `plan`: checked against the model, with what every pass reads.
    fn start<'s>(&'s self, plan: &'s Plan) -> Result<PlanRun<'s>, SimError> {
        self.check_model(plan)?;
        Ok(PlanRun {
            sim: self,
            plan,
            idx: index::PlanIndex::new(plan),
            cm: self.compute_model(),
            coll: CollectiveModel::new(&self.net, self.nccl.as_ref()),
            tp: self
                .layer
                .as_ref()
                .zip(self.tp_node.as_ref())
                .and_then(|(cost, node)| layer::TpComm::new(cost, node, self.nccl.as_ref())),
            tokens: plan.tokens_per_rank(),
            zero3: self.training.and_then(|t| {
                zero3::Zero3::new(&self.model, t, plan.num_ranks, self.hw.gpus_per_node)
            }),
        })
    }

    /// Every pass on the engine (and, with the layer on, its whole layer too), and the report.
    fn run(
        &self,
        plan: &Plan,
        passes: PassSel,
    ) -> Result<(SimReport, Vec<PassOutcome>, Vec<LayerPass>), SimError> {
        let mut run = self.start(plan)?;
        let mut outcomes = Vec::new();
        let mut layers = Vec::new();
        for &pass in passes.passes() {
            let program = run.program(pass)?;
            outcomes.push(engine::run(&program, &[], &self.net, &run.coll)?);
            if let Some(cost) = &self.layer {
                run.push_layer_pass(cost, &program, &mut layers)?;
            }
        }
        // The TP collectives every pass would run on evenly spread real tokens: part of the
        // layer's bound, as unavoidable under TP as the GEMMs.
        let tp_lower = match (&run.tp, &self.layer) {
            (Some(tp), Some(cost)) => {
                let real: u64 = plan.documents.iter().map(|d| d.len).sum();
                let even = real.div_ceil(u64::from(plan.num_ranks.max(1)));
                let mut ns = 0;
                for l in &layers {
                    ns += tp.pass_ns(l.pass, even, cost)?;
                }
                ns as f64 * 1e-6
            }
            _ => 0.0,
        };
        let PlanRun { idx, mut cm, .. } = run;
        let lower = lower_bound_ms(plan, &mut cm, passes)?;
        // The layer's bound covers the work it runs: the rerun forward pass's attention too.
        let rerun_lower = if layers.iter().any(|l| l.recomputed) {
            lower_bound_ms(plan, &mut cm, PassSel::Fwd)?
        } else {
            0.0
        };
        let layer = self
            .layer
            .as_ref()
            .map(|c| (c, layers.as_slice(), lower + rerun_lower + tp_lower));
        let mut report = metrics::report(
            plan,
            &idx,
            &self.hw,
            &self.model,
            passes,
            &outcomes,
            lower,
            layer,
        );
        if let (Some(training), Some(cost)) = (self.training, &self.layer) {
            let tokens = plan.tokens_per_rank();
            // A training step runs both passes whatever was simulated: the backward pass's
            // gradient buffers are part of its working set (bug hunt: `--pass fwd` counted a
            // smaller step, and its verdict could flip).
            let working = memory::peak_bytes(plan, &idx, &self.model, PassSel::Both.passes());
            let loads: Vec<crate::footprint::RankLoad> = report
                .ranks
                .iter()
                .zip(tokens.iter().zip(working))
                .map(
                    |(r, (&tokens, attention_bytes))| crate::footprint::RankLoad {
                        rank: r.rank,
                        tokens,
                        attention_bytes,
                    },
                )
                .collect();
            let fullest = crate::footprint::Counter {
                model: &self.model,
                training,
                recompute: cost.recompute,
                cp: plan.num_ranks,
                hbm_bytes: self.hw.hbm_bytes(),
            }
            .fullest(&loads)?;
            if let Some(l) = report.metrics.layer.as_mut() {
                l.footprint = fullest;
            }
        }
        if let Some(l) = report.metrics.layer.as_mut() {
            // Each pass's own NIC traffic, for a data-parallel collective that overlaps it;
            // a rerun forward pass runs inside the backward one.
            let nic_ms = |fwd: bool| {
                let ns: u64 = layers
                    .iter()
                    .filter(|p| (p.pass == Pass::Fwd && !p.recomputed) == fwd)
                    .map(|p| p.nic_ns)
                    .sum();
                ns as f64 * 1e-6
            };
            (l.nic_fwd_ms, l.nic_bwd_ms) = (nic_ms(true), nic_ms(false));
        }
        Ok((report, outcomes, layers))
    }
}

/// One plan on a simulator: what every pass of it reads.
struct PlanRun<'s> {
    sim: &'s Simulator,
    plan: &'s Plan,
    idx: index::PlanIndex,
    cm: ComputeModel<'s>,
    coll: CollectiveModel<'s>,
    tp: Option<layer::TpComm<'s>>,
    tokens: Vec<u64>,
    /// Under ZeRO 3, the weight gathers every layer pass waits for.
    zero3: Option<zero3::Zero3>,
}

impl PlanRun<'_> {
    /// The program of one pass: the plan's forward, or the backward derived from it.
    fn program(&mut self, pass: Pass) -> Result<Program, SimError> {
        let model = &self.sim.model;
        Ok(match pass {
            Pass::Fwd => Program::forward(self.plan, &self.idx, model, &mut self.cm)?,
            Pass::Bwd => Program::backward(self.plan, &self.idx, model, &mut self.cm)?,
        })
    }

    /// Push the whole-layer pass of `program` onto `layers`: under full recomputation a
    /// backward pass comes after the forward pass it reruns (the same work on the same
    /// engine, so the forward's own outcome when it was simulated).
    fn push_layer_pass(
        &mut self,
        cost: &LayerCost,
        program: &Program,
        layers: &mut Vec<LayerPass>,
    ) -> Result<(), SimError> {
        let net = &self.sim.net;
        // A pass's busiest NIC time is read only by a training step's collectives (ZeRO 3's
        // here, data parallelism's in the step): not counted on the planners' hot path.
        let nic_ns = |p: &Program| match self.sim.training {
            Some(_) => p.nic_busy_ns(net),
            None => 0,
        };
        let mut hidden_ns = 0;
        if program.pass == Pass::Bwd && cost.reruns_forward() {
            let rerun = match layers.iter().find(|l| l.pass == Pass::Fwd && !l.recomputed) {
                Some(fwd) => fwd.rerun(),
                None => {
                    let fwd = self.program(Pass::Fwd)?;
                    let mut pass =
                        layer::run(&fwd, &self.tokens, cost, net, &self.coll, self.tp.as_ref())?;
                    pass.nic_ns = nic_ns(&fwd);
                    pass.rerun()
                }
            };
            hidden_ns = rerun.end_ns();
            layers.push(rerun);
        }
        let mut pass = layer::run(
            program,
            &self.tokens,
            cost,
            net,
            &self.coll,
            self.tp.as_ref(),
        )?;
        pass.nic_ns = nic_ns(program);
        if let Some(z) = &self.zero3 {
            // Across nodes the collectives share the NICs with this pass's messages and
            // those of the rerun forward pass they also overlap.
            let shared_nic_ns = match z.spans_nodes() {
                true => layers
                    .last()
                    .filter(|l| l.recomputed)
                    .map_or(0, |rerun| rerun.nic_ns)
                    .saturating_add(pass.nic_ns),
                false => 0,
            };
            pass.wait_for_weights(
                z.pass_ns(program.pass, &self.coll)?,
                hidden_ns,
                shared_nic_ns,
            );
        }
        layers.push(pass);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::tile_time_s;
    use crate::plan::{allowed_pairs, Mask};
    use crate::planners::testing::with_ctx;
    use crate::planners::{Planner, Ring, Zigzag};
    use crate::trace::Batch;

    fn sim() -> Simulator {
        Simulator::new(
            Hardware::load("h100").unwrap(),
            Model::load("llama3-70b").unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_launch_fuses_the_unmasked_tiles_of_one_query_range() {
        use crate::plan::{Task, TokenRange};
        let plan = with_ctx(1, Mask::Causal, |ctx| {
            Ring.plan(&Batch::new(0, vec![12288]), ctx)
        })
        .unwrap();
        let s = sim();
        let mut cm = s.compute_model();
        let task = |q: (u64, u64), kv: (u64, u64)| Task {
            q: TokenRange::new(0, q.0, q.1),
            kv: TokenRange::new(0, kv.0, kv.1),
            heads: None,
        };
        // Queries [8K, 12K) over keys [0, 4K) and [4K, 8K): one 4K × 8K unmasked tile; the
        // diagonal [8K, 12K) × itself stays a causal tile of its own.
        let tasks = [
            task((8192, 12288), (0, 4096)),
            task((8192, 12288), (4096, 8192)),
            task((8192, 12288), (8192, 12288)),
        ];
        let got = cm.launch(&plan, &tasks, Pass::Fwd).unwrap();
        let prof = s.hardware().kernel_profile().unwrap();
        let t = |mask, kv: u64, pairs| {
            tile_time_s(
                s.hardware(),
                &prof,
                s.model(),
                Pass::Fwd,
                mask,
                4096,
                kv,
                pairs,
            )
            .unwrap()
                - s.hardware().launch_overhead_s()
        };
        let want = t(Mask::Full, 8192, 4096 * 8192)
            + t(
                Mask::Causal,
                4096,
                allowed_pairs(Mask::Causal, 8192, 12288, 8192, 12288),
            );
        assert!((got.seconds - want).abs() < 1e-12, "{got:?} vs {want}");
        // Backward, where the profile's throughput still grows past 4K, fusing beats two
        // 4K × 4K tiles; FLOPs are unchanged.
        let fused = cm.launch(&plan, &tasks, Pass::Bwd).unwrap().seconds;
        let apart: f64 = tasks
            .iter()
            .map(|x| cm.tile(&plan, x, Pass::Bwd).unwrap().seconds)
            .sum();
        assert!(fused < apart, "{fused} vs {apart}");
        let flops: f64 = tasks
            .iter()
            .map(|x| cm.tile(&plan, x, Pass::Fwd).unwrap().flops)
            .sum();
        assert!((got.flops - flops).abs() < 1.0);
    }

    /// Llama3 CP on documents of 48K and 16K tokens at 2 ranks: the all-gather gives rank 0
    /// a shard of rank 1 that none of its steps reads. That delivery's (zero) dK/dV was "done"
    /// at its arrival, and as a member joined a gradient call at its earliest piece, the
    /// reduce-scatter ran beside the backward compute that produces the rest of its dK/dV: the
    /// plan simulated faster than the same plan without the unread delivery (142.47 against
    /// 155.58 ms backward with 10 GB/s NVLink; 22.04 against 30.57 ms on a 16-rank wlb-llm
    /// batch).
    #[test]
    fn regression_a_reduce_scatter_ran_before_the_gradients_it_returns_were_computed() {
        use crate::planners::Llama3;
        let plan = with_ctx(2, Mask::Causal, |ctx| {
            Llama3.plan(&Batch::new(0, vec![48000, 16000]), ctx)
        })
        .unwrap();
        // The same plan, each transfer sent only to the receivers that read it.
        let idx = index::PlanIndex::new(&plan);
        let mut read = plan.clone();
        let mut d = 0;
        read.transfers.clear();
        for t in &plan.transfers {
            let readers: Vec<u32> = t
                .receivers()
                .filter(|_| {
                    d += 1;
                    idx.use_steps(d - 1).is_some()
                })
                .collect();
            if let Some((&dst, rest)) = readers.split_first() {
                let mut t = t.clone();
                t.dst = dst;
                t.also_to = rest.to_vec();
                read.transfers.push(t);
            }
        }
        assert!(
            read.delivery_count() < plan.delivery_count(),
            "a delivery is unread"
        );
        let violations = crate::plan::verify(&read);
        assert!(violations.is_empty(), "{violations:?}");
        let s = sim();
        let bwd = |p: &Plan| {
            s.simulate(p, PassSel::Bwd)
                .unwrap()
                .metrics
                .attention_time_ms
        };
        let (all, only_read) = (bwd(&plan), bwd(&read));
        assert!((all - only_read).abs() < 1e-9, "{all} vs {only_read} ms");
    }

    #[test]
    fn one_rank_one_document_is_the_kernel_time() {
        let plan = with_ctx(1, Mask::Causal, |ctx| {
            Ring.plan(&Batch::new(0, vec![4096]), ctx)
        })
        .unwrap();
        let s = sim();
        let r = s.simulate(&plan, PassSel::Fwd).unwrap();
        let pairs = allowed_pairs(Mask::Causal, 0, 4096, 0, 4096);
        let prof = s.hardware().kernel_profile().unwrap();
        let want = tile_time_s(
            s.hardware(),
            &prof,
            s.model(),
            Pass::Fwd,
            Mask::Causal,
            4096,
            4096,
            pairs,
        )
        .unwrap();
        assert!(
            (r.metrics.attention_time_ms - want * 1e3).abs() < 1e-6,
            "{r:?} vs {want}"
        );
        // The lower bound is the same kernel without its launch overhead.
        let lb = want * 1e3 - s.hardware().launch_overhead_s() * 1e3;
        assert!((r.metrics.lower_bound_ms - lb).abs() < 1e-9);
        assert_eq!(r.metrics.comm_bytes_total, 0);
        assert_eq!(r.ranks[0].idle_ms, 0.0);
    }

    #[test]
    fn zigzag_beats_ring_on_a_causal_document() {
        let batch = Batch::new(0, vec![65536, 4096, 4096]);
        let s = sim();
        let ring = s
            .simulate(
                &with_ctx(8, Mask::Causal, |c| Ring.plan(&batch, c)).unwrap(),
                PassSel::Both,
            )
            .unwrap();
        let zz = s
            .simulate(
                &with_ctx(8, Mask::Causal, |c| Zigzag.plan(&batch, c)).unwrap(),
                PassSel::Both,
            )
            .unwrap();
        assert!(zz.metrics.attention_time_ms < ring.metrics.attention_time_ms);
        assert!(zz.metrics.compute_imbalance < 0.05, "{:?}", zz.metrics);
        assert!(ring.metrics.compute_imbalance > 0.3, "{:?}", ring.metrics);
        assert!(zz.metrics.vs_lower_bound >= 1.0);
        // Training moves the forward K/V again, plus fp32 dK/dV back (ring-flash-attention).
        let fwd = s
            .simulate(
                &with_ctx(8, Mask::Causal, |c| Zigzag.plan(&batch, c)).unwrap(),
                PassSel::Fwd,
            )
            .unwrap();
        assert_eq!(
            zz.metrics.comm_bytes_total,
            fwd.metrics.comm_bytes_total * 4
        );
    }

    /// ZeRO 3's rings across nodes share the NICs with the plan's own messages across
    /// nodes (bug: they were priced on idle NICs, so at short contexts every scheme's layer
    /// was the gathers' alone, however much K/V it sent between nodes).
    #[test]
    fn zero_3_collectives_across_nodes_share_the_nics_with_the_plans_messages() {
        use crate::footprint::Training;
        use crate::model::Recompute;
        let batch = Batch::new(0, vec![16384, 9000, 4000, 3000, 700]);
        let plan = with_ctx(16, Mask::Causal, |c| Zigzag.plan(&batch, c)).unwrap();
        for recompute in [Recompute::None, Recompute::Full] {
            let s = sim()
                .with_layer()
                .unwrap()
                .with_recompute(recompute)
                .unwrap()
                .with_training(Training::new(3, 4, 1).unwrap())
                .unwrap();
            let (_, layers) = s.simulate_layer_traced(&plan, PassSel::Both).unwrap();
            let bwd = layers.iter().find(|l| l.pass == Pass::Bwd).unwrap();
            let fwd = layers.iter().find(|l| l.pass == Pass::Fwd).unwrap();
            // Two nodes, K/V sent between them in both passes.
            assert!(fwd.nic_ns > 0 && bwd.nic_ns > fwd.nic_ns, "{recompute:?}");
            let own = |l: &LayerPass| l.zero3_ns.unwrap();
            assert_eq!(fwd.zero3_ready_ns, own(fwd) + fwd.nic_ns);
            // Under full recomputation the backward pass's collectives also share the NICs
            // with the rerun forward pass they overlap, and hide under it.
            let (rerun_nic, hidden) = match recompute {
                Recompute::Full => (fwd.nic_ns, fwd.end_ns() - fwd.zero3_exposed_ns),
                _ => (0, 0),
            };
            assert_eq!(
                bwd.zero3_ready_ns,
                own(bwd) + bwd.nic_ns + rerun_nic - hidden
            );
            // The gathers outlast this small batch's work: the pass ends when they do.
            assert!(bwd.zero3_exposed_ns > 0, "{recompute:?}");
            assert_eq!(bwd.end_ns(), bwd.zero3_ready_ns);
        }
        // Inside one node nothing crosses a NIC and nothing is shared.
        let one_node = with_ctx(8, Mask::Causal, |c| Zigzag.plan(&batch, c)).unwrap();
        let s = sim()
            .with_layer()
            .unwrap()
            .with_training(Training::new(3, 4, 1).unwrap())
            .unwrap();
        let (_, layers) = s.simulate_layer_traced(&one_node, PassSel::Both).unwrap();
        for l in &layers {
            assert_eq!(l.nic_ns, 0);
            assert_eq!(l.zero3_ready_ns, l.zero3_ns.unwrap());
        }
    }

    #[test]
    fn same_plan_gives_identical_reports() {
        let batch = Batch::new(0, vec![30000, 700, 12000, 5]);
        let plan = with_ctx(8, Mask::Causal, |c| Zigzag.plan(&batch, c)).unwrap();
        let a = serde_json::to_string(&sim().simulate(&plan, PassSel::Both).unwrap()).unwrap();
        let b = serde_json::to_string(&sim().simulate(&plan, PassSel::Both).unwrap()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn wrong_model_and_missing_kernel_rows_are_errors() {
        let plan = with_ctx(2, Mask::Causal, |c| Ring.plan(&Batch::new(0, vec![100]), c)).unwrap();
        let other = Simulator::new(
            Hardware::load("h100").unwrap(),
            Model::load("mha-16").unwrap(),
        )
        .unwrap();
        let e = other.simulate(&plan, PassSel::Fwd).unwrap_err();
        assert!(e.to_string().contains("q / 8 kv heads"), "{e}");
        let odd = Model {
            head_dim: 96,
            ..Model::load("llama3-70b").unwrap()
        };
        let s = Simulator::new(Hardware::load("h100").unwrap(), odd).unwrap();
        let e = s.simulate(&plan, PassSel::Fwd).unwrap_err();
        assert!(e.to_string().contains("hd 96"), "{e}");
    }
}
