//! Network model: which ports a message crosses, max-min fair sharing of those ports among
//! concurrent messages, and the time of collective calls.
//!
//! Every GPU has an NVLink port and a NIC, each with a send and a receive direction. A message
//! between two GPUs of one node uses the sender's NVLink send side and the receiver's NVLink
//! receive side; across nodes it uses the two NICs. Concurrent messages through a port share
//! it max-min fairly (water-filling), so two flows into one NIC take twice as long as one.
//! Each message first pays its link's latency α, then drains its bytes at its fair rate.

use crate::hardware::{Collective, Hardware, HardwareError, NcclTable};

use super::program::{CollectiveKind, CollectiveOp};

pub use super::fair_share::{max_min_rates, FairShare};

/// Port directions of one GPU.
const NV_OUT: usize = 0;
const NV_IN: usize = 1;
const NIC_OUT: usize = 2;
const NIC_IN: usize = 3;

/// Topology and link speeds, in the engine's units (bytes per nanosecond, nanoseconds).
#[derive(Debug, Clone)]
pub struct Network {
    gpus_per_node: u32,
    /// Where rank 0 sits in its node (0: on its first GPU): a group that does not start on a
    /// node's edge, as a data-parallel group of 6 ranks on 8-GPU nodes does every other time.
    first_gpu: u32,
    nvlink_bpns: f64,
    nic_bpns: f64,
    nvlink_alpha_ns: u64,
    nic_alpha_ns: u64,
}

impl Network {
    /// The network of a hardware profile.
    pub fn new(hw: &Hardware) -> Self {
        Network {
            gpus_per_node: hw.gpus_per_node.max(1),
            first_gpu: 0,
            nvlink_bpns: hw.nvlink_gbs,
            nic_bpns: hw.nic_gbs,
            nvlink_alpha_ns: (hw.nvlink_latency_us * 1e3).round() as u64,
            nic_alpha_ns: (hw.nic_latency_us * 1e3).round() as u64,
        }
    }

    /// A network from raw figures: GPUs per node, NVLink and NIC bandwidth per direction
    /// (GB/s = bytes/ns) and latencies (ns). For tests and what-if studies.
    pub fn custom(
        gpus_per_node: u32,
        nvlink_gbs: f64,
        nic_gbs: f64,
        nvlink_alpha_ns: u64,
        nic_alpha_ns: u64,
    ) -> Self {
        Network {
            gpus_per_node: gpus_per_node.max(1),
            first_gpu: 0,
            nvlink_bpns: nvlink_gbs,
            nic_bpns: nic_gbs,
            nvlink_alpha_ns,
            nic_alpha_ns,
        }
    }

    /// Whether two ranks share a node.
    pub fn same_node(&self, a: u32, b: u32) -> bool {
        let node =
            |r: u32| (u64::from(r) + u64::from(self.first_gpu)) / u64::from(self.gpus_per_node);
        node(a) == node(b)
    }

    /// The same network with rank 0 on GPU `first_gpu` of its node (taken modulo the
    /// node's GPUs): every node boundary moves with it.
    pub fn with_first_gpu(mut self, first_gpu: u32) -> Self {
        self.first_gpu = first_gpu % self.gpus_per_node;
        self
    }

    /// The two ports (resource ids) a message from `src` to `dst` crosses.
    pub fn ports(&self, src: u32, dst: u32) -> [usize; 2] {
        if self.same_node(src, dst) {
            [4 * src as usize + NV_OUT, 4 * dst as usize + NV_IN]
        } else {
            [4 * src as usize + NIC_OUT, 4 * dst as usize + NIC_IN]
        }
    }

    /// Capacity of a port, bytes per nanosecond.
    pub fn capacity(&self, port: usize) -> f64 {
        match port % 4 {
            NV_OUT | NV_IN => self.nvlink_bpns,
            _ => self.nic_bpns,
        }
    }

    /// A lone message of `bytes` on an idle link, nanoseconds: its latency, then its bytes at
    /// the link's speed, NIC to NIC when it crosses nodes. For point-to-point sends priced
    /// outside the event engine (a pipeline's activations between stages).
    pub fn send_ns(&self, bytes: u64, across_nodes: bool) -> u64 {
        let (alpha, bw) = if across_nodes {
            (self.nic_alpha_ns, self.nic_bpns)
        } else {
            (self.nvlink_alpha_ns, self.nvlink_bpns)
        };
        if bytes == 0 {
            return 0;
        }
        alpha + (bytes as f64 / bw).ceil() as u64
    }

    /// Nanoseconds a NIC direction takes to carry `bytes` at full speed, latency aside.
    pub fn nic_ns(&self, bytes: u64) -> u64 {
        if bytes == 0 || self.nic_bpns <= 0.0 {
            return 0;
        }
        (bytes as f64 / self.nic_bpns).ceil() as u64
    }

    /// Start-up latency of a message, nanoseconds.
    pub fn alpha_ns(&self, src: u32, dst: u32) -> u64 {
        if self.same_node(src, dst) {
            self.nvlink_alpha_ns
        } else {
            self.nic_alpha_ns
        }
    }
}

/// Costs collective calls by their algorithm.
pub struct CollectiveModel<'a> {
    net: &'a Network,
    nccl: Option<&'a NcclTable>,
}

impl<'a> CollectiveModel<'a> {
    /// Model collectives on `net`, with measured NCCL bus bandwidth when a table is given.
    pub fn new(net: &'a Network, nccl: Option<&'a NcclTable>) -> Self {
        CollectiveModel { net, nccl }
    }

    /// Whether `members` sit on more than one node.
    fn spans_nodes(&self, members: &[u32]) -> bool {
        !members.windows(2).all(|w| self.net.same_node(w[0], w[1]))
    }

    /// Bus bandwidth (bytes/ns) for a ring collective over `n` GPUs moving `size` bytes: the
    /// NCCL curve at the nearest measured GPU count when the group sits in one node (else the
    /// NVLink speed), capped by the NIC when the group `spans` nodes.
    fn bus_bpns(
        &self,
        op: Collective,
        n: u64,
        spans: bool,
        size: u64,
    ) -> Result<f64, HardwareError> {
        let mut bw = self.net.nvlink_bpns;
        if let Some(t) = self.nccl {
            let counts = t.gpu_counts(op);
            if let Some(&best) = counts.iter().min_by(|a, b| {
                let d = |c: u32| ((c as f64).ln() - (n as f64).ln()).abs();
                d(**a).total_cmp(&d(**b)).then(a.cmp(b))
            }) {
                bw = t.busbw_gbs(op, best, size)?.gbs;
                // Another count's curve may beat the link (8 GPUs' all-reduce runs in the
                // NVSwitch, NVLS): a group it was not measured at gets no more than its link.
                if u64::from(best) != n {
                    bw = bw.min(self.net.nvlink_bpns);
                }
            }
        }
        if spans {
            bw = bw.min(self.net.nic_bpns);
        }
        Ok(bw)
    }

    /// Start-up latency of one step among `members`: the NIC's when they span nodes.
    fn alpha_ns(&self, members: &[u32]) -> (bool, f64) {
        let spans = self.spans_nodes(members);
        (spans, self.step_alpha_ns(spans))
    }

    /// Start-up latency of one step: the NIC's when the group `spans` nodes.
    fn step_alpha_ns(&self, spans: bool) -> f64 {
        (if spans {
            self.net.nic_alpha_ns
        } else {
            self.net.nvlink_alpha_ns
        }) as f64
    }

    /// Duration in nanoseconds of a ring collective over `members` of `size` bytes
    /// (nccl-tests' size: the gathered output, the scattered input, the reduced buffer): an
    /// all-gather or reduce-scatter takes N − 1 steps, each paying α, and moves (N−1)/N of
    /// the data across every link (nccl-tests' bus-bandwidth definition); an all-reduce is
    /// the two back to back, 2(N − 1) steps and 2(N−1)/N of the data.
    pub fn ring_ns(
        &self,
        op: Collective,
        members: &[u32],
        size: u64,
    ) -> Result<u64, HardwareError> {
        self.ring_ns_over(op, members.len() as u64, self.spans_nodes(members), size)
    }

    /// [`CollectiveModel::ring_ns`] over a group named by its size `n` and whether it
    /// `spans` nodes: for groups too large to list, such as every data-parallel replica's
    /// CP ranks.
    pub fn ring_ns_over(
        &self,
        op: Collective,
        n: u64,
        spans: bool,
        size: u64,
    ) -> Result<u64, HardwareError> {
        if size == 0 || n < 2 {
            return Ok(0);
        }
        let alpha = self.step_alpha_ns(spans);
        let bw = self.bus_bpns(op, n, spans, size)?;
        let phases = match op {
            Collective::AllGather | Collective::ReduceScatter => 1.0,
            Collective::AllReduce => 2.0,
        };
        let steps = n as f64;
        let ns = phases * ((steps - 1.0) * alpha + size as f64 * (steps - 1.0) / steps / bw);
        // Held to the longest step the simulator times: a hand-made bus bandwidth of 1e-12
        // GB/s saturated `u64`, and the layer's sums wrapped to a normal-looking time (bug hunt).
        if ns.is_nan() || ns >= super::program::MAX_STEP_NS {
            return Err(HardwareError::InvalidQuery(format!(
                "an {op} of {size} B over {n} GPUs would take {:.3e} s, beyond the {:.0e} s one step may take in the simulator",
                ns * 1e-9,
                super::program::MAX_STEP_NS * 1e-9
            )));
        }
        Ok(ns.ceil() as u64)
    }

    /// Duration of a collective call in nanoseconds.
    pub fn duration_ns(&self, c: &CollectiveOp) -> Result<u64, HardwareError> {
        if c.size_bytes == 0 || c.members.len() < 2 {
            return Ok(0);
        }
        match c.kind {
            CollectiveKind::AllGather => {
                self.ring_ns(Collective::AllGather, &c.members, c.size_bytes)
            }
            CollectiveKind::ReduceScatter => {
                self.ring_ns(Collective::ReduceScatter, &c.members, c.size_bytes)
            }
            CollectiveKind::AllToAll => {
                // Pairwise exchange: every rank's port carries its own volume.
                let (spans, alpha) = self.alpha_ns(&c.members);
                let bw = if spans {
                    self.net.nic_bpns
                } else {
                    self.net.nvlink_bpns
                };
                Ok((alpha + c.size_bytes as f64 / bw).ceil() as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> Network {
        Network::custom(2, 100.0, 10.0, 1000, 5000)
    }

    #[test]
    fn one_flow_gets_the_whole_link() {
        let n = net();
        assert_eq!(max_min_rates(&n, &[n.ports(0, 1)]), vec![100.0]);
        assert_eq!(max_min_rates(&n, &[n.ports(0, 2)]), vec![10.0]);
    }

    #[test]
    fn two_flows_into_one_nic_share_it() {
        let n = net();
        let r = max_min_rates(&n, &[n.ports(0, 2), n.ports(1, 2)]);
        assert_eq!(r, vec![5.0, 5.0]);
    }

    #[test]
    fn max_min_gives_leftover_to_unconstrained_flows() {
        let n = net();
        // Flows a: 0→2 (NIC), b: 1→2 (NIC, shares 2's NIC-in), c: 1→3 (shares 1's NIC-out).
        let r = max_min_rates(&n, &[n.ports(0, 2), n.ports(1, 2), n.ports(1, 3)]);
        assert_eq!(r, vec![5.0, 5.0, 5.0]);
        // d alone on 4→5 (another node pair) is unaffected.
        let r = max_min_rates(&n, &[n.ports(0, 2), n.ports(4, 6)]);
        assert_eq!(r, vec![10.0, 10.0]);
    }

    #[test]
    fn intra_and_inter_node_links_differ() {
        let n = net();
        assert!(n.same_node(0, 1) && !n.same_node(1, 2));
        assert_eq!(n.alpha_ns(0, 1), 1000);
        assert_eq!(n.alpha_ns(0, 2), 5000);
    }

    #[test]
    fn ring_all_gather_matches_its_formula() {
        let n = net();
        let cm = CollectiveModel::new(&n, None);
        let op = CollectiveOp {
            kind: CollectiveKind::AllGather,
            members: vec![0, 1],
            issue_at: vec![0, 0],
            need_by: vec![Some(0), Some(0)],
            sent: vec![500, 500],
            recv: vec![500, 500],
            size_bytes: 1000,
        };
        // (N−1)·α + (N−1)/N · size / bw = 1000 + 0.5 · 1000 / 100.
        assert_eq!(cm.duration_ns(&op).unwrap(), 1005);
        let wide = CollectiveOp {
            members: vec![0, 1, 2, 3],
            size_bytes: 4000,
            issue_at: vec![0; 4],
            need_by: vec![None; 4],
            sent: vec![1000; 4],
            recv: vec![3000; 4],
            ..op
        };
        // Spans two nodes: NIC-bound, α of the NIC.
        assert_eq!(cm.duration_ns(&wide).unwrap(), 3 * 5000 + 300);
    }

    /// Regression (bug hunt): a 2-GPU all-reduce ran at the 8-GPU NVLS curve's 479 GB/s,
    /// faster than the 380 GB/s NVLink it runs over.
    #[test]
    fn another_counts_curve_never_beats_the_link() {
        let hw = Hardware::load("h100").unwrap();
        let n = Network::new(&hw);
        let nccl = hw.nccl_table().unwrap();
        let cm = CollectiveModel::new(&n, nccl.as_ref());
        let size = 8 << 30;
        let link = n.nvlink_bpns;
        assert!(cm.bus_bpns(Collective::AllReduce, 2, false, size).unwrap() <= link);
        // At the count it was measured at, the measurement stands.
        assert!(cm.bus_bpns(Collective::AllReduce, 8, false, size).unwrap() > link);
    }

    /// An all-reduce is a reduce-scatter and an all-gather: twice the steps and the bytes
    /// (it was priced as one of them).
    #[test]
    fn a_ring_all_reduce_runs_both_halves() {
        let n = net();
        let cm = CollectiveModel::new(&n, None);
        let half = cm
            .ring_ns_over(Collective::ReduceScatter, 4, true, 4000)
            .unwrap();
        assert_eq!(half, 3 * 5000 + 300);
        let all = cm
            .ring_ns_over(Collective::AllReduce, 4, true, 4000)
            .unwrap();
        assert_eq!(all, 2 * half);
    }

    /// A group whose rank 0 sits on GPU 6 of an 8-GPU node has ranks 0 and 1 on one node and
    /// ranks 2 to 9 on the next: a message from rank 1 to rank 2 takes the NICs.
    #[test]
    fn a_group_off_a_node_edge_moves_every_boundary() {
        let n = Network::custom(8, 100.0, 10.0, 0, 0).with_first_gpu(6);
        assert!(n.same_node(0, 1) && !n.same_node(1, 2) && n.same_node(2, 9));
        assert!(!n.same_node(9, 10));
        assert_eq!(n.ports(1, 2).map(|p| n.capacity(p)), [10.0, 10.0]);
        assert_eq!(n.ports(2, 3).map(|p| n.capacity(p)), [100.0, 100.0]);
        // Modulo the node: 14 is 6.
        let m = Network::custom(8, 100.0, 10.0, 0, 0).with_first_gpu(14);
        assert!(m.same_node(0, 1) && !m.same_node(1, 2));
    }

    /// Regression (bug hunt): a collective past `u64` nanoseconds saturated, and the sums
    /// after it wrapped; one past the longest step the simulator times is refused.
    #[test]
    fn regression_a_collective_longer_than_a_step_may_be_is_refused() {
        let n = net();
        let cm = CollectiveModel::new(&n, None);
        let e = cm
            .ring_ns_over(Collective::AllReduce, 4, true, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("an all_reduce of") && e.contains("beyond the 1e5 s"),
            "{e}"
        );
        assert!(cm
            .ring_ns_over(Collective::AllReduce, 4, true, 1 << 40)
            .is_ok());
    }
}
