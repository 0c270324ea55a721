//! ZeRO stage 3: what gathering the weights layer by layer costs a layer's passes.
//!
//! Under ZeRO 3 (PyTorch FSDP's full sharding, Megatron-FSDP) every GPU keeps a shard of the
//! weights, so each layer's are gathered before a pass runs it and its gradients scattered
//! back after the backward pass: an all-gather of the layer's weights in the model's dtype
//! in the forward pass, the same all-gather again in the backward pass (the weights were
//! dropped after the forward, FSDP's `reshard_after_forward`), then a reduce-scatter of its
//! gradients in fp32 ([`GRAD_BYTES`]): three collectives a layer where data parallelism
//! runs two once a step (1.5× the volume in one dtype, Rajbhandari et al. 2020,
//! arXiv:1910.02054 §7.2.2; here 8 bytes a parameter against the distributed optimizer's 6;
//! Zhao et al. 2023, arXiv:2304.11277 §3.2–3.4). A full recomputation reruns the forward pass under the backward pass's gather:
//! no gather of its own.
//!
//! The group is the CP ranks of one TP index in every data-parallel replica of a shard
//! group, `dp × cp` GPUs unless hybrid sharding narrows it to `shard_dp × cp` (the same
//! group the optimizer state is sharded over, [`Training::shard_ranks`]), laid out
//! `gpus_per_node / tp` to a node as Megatron orders ranks (TP, then CP, then DP): within a
//! node while they fit there, else across the NICs. Each collective is a ring on the
//! simulator's [`CollectiveModel`], at NCCL's measured bus bandwidth when the hardware has a
//! table.
//!
//! The collectives run on a stream of their own and are prefetched a layer ahead (FSDP's
//! forward and backward prefetching), so in the steady state of a deep stack a layer's pass
//! takes the longer of its own work and its collectives: a pass ends no earlier than they
//! do, and what they outlast the pass by is exposed ([`super::LayerPass::zero3_exposed_ns`]).
//!
//! A group across nodes runs its rings over the NICs the plan's own messages across nodes
//! take too: the collectives end no earlier than both together would
//! ([`super::LayerPass::wait_for_weights`]).
//!
//! Not modelled: the NVLink bandwidth the collectives share with the plan's traffic inside a
//! node and with TP's collectives, the SMs NCCL takes from the GEMMs, the first layer's gather
//! that nothing before it hides, the embedding's and output layer's gathers (once a step, not
//! a layer), and under hybrid sharding the gradients' all-reduce across the groups (once a
//! step).
//!
//! A group spans nodes when it is larger than one, or when groups that do not divide a node
//! are laid out back to back (every shard group of every pipeline stage) and one straddles a
//! node's edge: the slowest group sets the pace.

use crate::footprint::{Training, GRAD_BYTES};
use crate::hardware::{Collective, Pass};
use crate::model::Model;

use super::network::CollectiveModel;
use super::SimError;

/// The per-layer collectives of ZeRO 3 on one CP group of a data-parallel job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zero3 {
    /// GPUs the weights are sharded over (`dp × cp`).
    ranks: u64,
    /// Whether they sit on more than one node.
    spans_nodes: bool,
    /// One layer's weights, gathered (bytes).
    gather_bytes: u64,
    /// One layer's gradients, reduce-scattered (bytes).
    reduce_bytes: u64,
}

impl Zero3 {
    /// The collectives of one layer of `model` (one GPU's TP share) under `training`, for a
    /// CP group of `cp` ranks on nodes of `gpus_per_node` (the CP view of the hardware,
    /// [`crate::tp::split`]); `None` unless the weights are sharded (ZeRO 3) and the model
    /// gives its layer's parameters.
    pub fn new(model: &Model, training: Training, cp: u32, gpus_per_node: u32) -> Option<Zero3> {
        if !training.gathers_weights() {
            return None;
        }
        let layer = model.param_parts()?.layer;
        let ranks = training.shard_ranks(cp);
        if ranks < 2 {
            // One GPU shards nothing and gathers nothing.
            return None;
        }
        // Megatron orders ranks TP, CP, DP, then PP: every stage's shard groups follow
        // each other.
        let groups = u64::from(training.dp / training.shard_replicas()) * u64::from(training.pp);
        Some(Zero3 {
            ranks,
            spans_nodes: any_straddles(ranks, groups, u64::from(gpus_per_node.max(1))),
            gather_bytes: layer.saturating_mul(u64::from(model.dtype_bytes)),
            reduce_bytes: layer.saturating_mul(GRAD_BYTES),
        })
    }

    /// Whether the GPUs this sees span nodes: the largest figure any group pays.
    pub fn spans_nodes(&self) -> bool {
        self.spans_nodes
    }

    /// Nanoseconds of collectives one layer's `pass` runs: the gather, and in the backward
    /// pass the gather and the gradients' reduce-scatter.
    pub fn pass_ns(&self, pass: Pass, coll: &CollectiveModel<'_>) -> Result<u64, SimError> {
        let ring = |op, bytes| coll.ring_ns_over(op, self.ranks, self.spans_nodes, bytes);
        let gather = ring(Collective::AllGather, self.gather_bytes)?;
        Ok(match pass {
            Pass::Fwd => gather,
            Pass::Bwd => gather + ring(Collective::ReduceScatter, self.reduce_bytes)?,
        })
    }
}

/// Whether any of `groups` groups of `size` consecutive GPUs, laid out back to back on nodes
/// of `node` GPUs, straddles a node's edge. The layout repeats every `node / gcd(size, node)`
/// groups, so no more are checked.
pub(crate) fn any_straddles(size: u64, groups: u64, node: u64) -> bool {
    if size > node {
        return true;
    }
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let period = node / gcd(size, node);
    (0..groups.min(period)).any(|g| (g * size) / node != ((g + 1) * size - 1) / node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Hardware;
    use crate::sim::network::Network;

    fn llama70() -> Model {
        Model::load("llama3-70b").unwrap()
    }

    /// Regression (bug hunt): groups of 6 GPUs fit a node of 8, but the second, GPUs 6 to
    /// 11, straddles two nodes; it was priced on NVLink.
    #[test]
    fn a_group_straddling_two_nodes_crosses_the_nics() {
        assert!(!any_straddles(6, 1, 8));
        assert!(any_straddles(6, 2, 8));
        assert!(!any_straddles(4, 1000, 8));
        assert!(!any_straddles(3, 2, 8) && any_straddles(3, 3, 8));
        assert!(any_straddles(9, 1, 8));
        let m = llama70();
        let t = Training::new(3, 4, 1).unwrap().with_shard_dp(2).unwrap();
        assert!(Zero3::new(&m, t, 3, 8).unwrap().spans_nodes());
        assert!(!Zero3::new(&m, Training::new(3, 2, 1).unwrap(), 3, 8)
            .unwrap()
            .spans_nodes());
        // Regression (bug hunt): the pipeline's second stage follows the first, GPUs 6 to
        // 11, across the edge; stages were left out of the layout.
        assert!(Zero3::new(&m, Training::new(3, 2, 2).unwrap(), 3, 8)
            .unwrap()
            .spans_nodes());
    }

    #[test]
    fn only_zero_3_gathers_weights() {
        let m = llama70();
        for zero in 0..3 {
            let t = Training::new(zero, 4, 1).unwrap();
            assert_eq!(Zero3::new(&m, t, 8, 8), None);
        }
        let t = Training::new(3, 4, 1).unwrap();
        let z = Zero3::new(&m, t, 8, 8).unwrap();
        let layer = m.param_parts().unwrap().layer;
        assert_eq!((z.ranks, z.spans_nodes), (32, true));
        assert_eq!((z.gather_bytes, z.reduce_bytes), (2 * layer, 4 * layer));
        // A model without its layer's shape has nothing to gather.
        let t = Training::new(3, 1, 1).unwrap();
        assert_eq!(Zero3::new(&Model::load("mha-16").unwrap(), t, 8, 8), None);
    }

    #[test]
    fn the_backward_pass_gathers_again_and_scatters_twice_the_bytes() {
        let hw = Hardware::load("h100").unwrap();
        let net = Network::new(&hw);
        let nccl = hw.nccl_table().unwrap();
        let coll = CollectiveModel::new(&net, nccl.as_ref());
        let m = llama70();
        let z = |dp, cp| Zero3::new(&m, Training::new(3, dp, 1).unwrap(), cp, 8).unwrap();
        let within = z(1, 8);
        let fwd = within.pass_ns(Pass::Fwd, &coll).unwrap();
        let bwd = within.pass_ns(Pass::Bwd, &coll).unwrap();
        let scatter = coll
            .ring_ns_over(Collective::ReduceScatter, 8, false, within.reduce_bytes)
            .unwrap();
        assert_eq!(bwd, fwd + scatter);
        // Sixteen GPUs span two nodes: the NIC, far slower than NVLink, carries the ring.
        let across = z(2, 8);
        assert!(across.spans_nodes);
        let slow = across.pass_ns(Pass::Fwd, &coll).unwrap();
        assert!(slow > 3 * fwd, "{slow} vs {fwd}");
        // Hybrid sharding over one replica keeps the ring on the node's NVLink.
        let hsdp = Training::new(3, 2, 1).unwrap().with_shard_dp(1).unwrap();
        let hsdp = Zero3::new(&m, hsdp, 8, 8).unwrap();
        assert_eq!(hsdp, within);
        // One GPU alone shards and gathers nothing.
        assert_eq!(Zero3::new(&m, Training::new(3, 1, 1).unwrap(), 1, 8), None);
    }
}
