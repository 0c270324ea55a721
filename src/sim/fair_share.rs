//! Max-min fair rates of messages sharing ports (water-filling), recomputed by the engine every
//! time a message starts or ends.
//!
//! Water-filling repeatedly takes the port with the smallest fair share (capacity left over
//! flows left), fixes its remaining flows at that share and takes their rate off their other
//! port. The first version kept every share a port ever had in one binary heap and skipped the
//! stale ones when they came up: two heap entries per flow, so at 1024 ranks (5,500 flows in
//! flight, one component) the heap's pops were half of all simulation time.
//!
//! Here each port is one entry of an indexed heap, keyed by the smallest of its pending
//! shares, and a port's pending shares are pruned of those that can never be used again. The
//! ports are taken in the same order and fixed at the same shares, bit for bit: the test below
//! runs the first version as its oracle.

/// A share is used when it is within this relative distance of its port's current share (the
/// same pushed share recomputed after rounding); further off, it is stale.
const STALE: f64 = 1e-12;

/// Pending shares this far (relative) below their port's current one are dropped: they are
/// stale and stay so. A port's share only grows while others are fixed at shares below it
/// (`(cap − s)/(n − 1) ≥ cap/n` for `s ≤ cap/n`), up to rounding of about 1e-16 per step, so
/// anything 1000 × `STALE` below can never come back within `STALE`.
const DEAD: f64 = 1e-9;

use super::network::Network;

/// Max-min fair rates (bytes/ns) for flows crossing the given port pairs.
pub fn max_min_rates(net: &Network, ports: &[[usize; 2]]) -> Vec<f64> {
    let total = ports.iter().flatten().copied().max().map_or(0, |m| m + 1);
    FairShare::new(total).rates(net, ports).to_vec()
}

/// Water-filling with buffers kept between calls: the engine recomputes rates every time a
/// message starts or ends, so allocation would otherwise dominate.
pub struct FairShare {
    slot_of_port: Vec<u32>,
    used: Vec<usize>,
    cap: Vec<f64>,
    count: Vec<u32>,
    start: Vec<u32>,
    fill: Vec<u32>,
    members: Vec<u32>,
    /// Per port slot: shares computed for it and not yet taken or dropped. The port's heap key
    /// is the smallest of them, or a dead one smaller still.
    pending: Vec<Vec<f64>>,
    heap: SlotHeap,
    fixed: Vec<bool>,
    rates: Vec<f64>,
}

impl FairShare {
    /// Buffers for a network with `ports` port ids (4 per GPU).
    pub fn new(ports: usize) -> Self {
        FairShare {
            slot_of_port: vec![u32::MAX; ports],
            used: Vec::new(),
            cap: Vec::new(),
            count: Vec::new(),
            start: Vec::new(),
            fill: Vec::new(),
            members: Vec::new(),
            pending: Vec::new(),
            heap: SlotHeap::default(),
            fixed: Vec::new(),
            rates: Vec::new(),
        }
    }

    /// Max-min fair rates for flows crossing `ports` (same order).
    pub fn rates(&mut self, net: &Network, ports: &[[usize; 2]]) -> &[f64] {
        let nf = ports.len();
        self.rates.clear();
        self.rates.resize(nf, 0.0);
        self.number_ports(ports);
        let np = self.used.len();
        self.cap.clear();
        self.cap.extend(self.used.iter().map(|&p| net.capacity(p)));
        if self.pending.len() < np {
            self.pending.resize_with(np, Vec::new);
        }
        self.heap.clear(np);
        for k in 0..np {
            let share = self.cap[k] / self.count[k] as f64;
            self.pending[k].clear();
            self.pending[k].push(share);
            self.heap.push(k, share);
        }
        self.fixed.clear();
        self.fixed.resize(nf, false);
        while let Some((k, share)) = self.heap.peek() {
            let n = self.count[k];
            if n == 0 {
                self.heap.pop();
                continue;
            }
            let current = self.cap[k] / n as f64;
            if (current - share).abs() > STALE * share.max(1.0) {
                self.drop_stale(k, share, current);
                continue;
            }
            self.heap.pop();
            for m in self.start[k]..self.start[k + 1] {
                let f = self.members[m as usize] as usize;
                if self.fixed[f] {
                    continue;
                }
                self.fixed[f] = true;
                self.rates[f] = share;
                for &q in &ports[f] {
                    let j = self.slot_of_port[q] as usize;
                    self.cap[j] = (self.cap[j] - share).max(0.0);
                    self.count[j] -= 1;
                    if j != k && self.count[j] > 0 {
                        let s = self.cap[j] / self.count[j] as f64;
                        // Shares far below the new one are dead: the port's key may still
                        // be one of them, which `drop_stale` handles when it comes up.
                        let pending = &mut self.pending[j];
                        pending.retain(|&p| s - p <= DEAD * p.max(1.0));
                        pending.push(s);
                        self.heap.lower(j, s);
                    }
                }
            }
        }
        &self.rates
    }

    /// Number the ports in use densely and list each one's flows (one array with offsets).
    fn number_ports(&mut self, ports: &[[usize; 2]]) {
        for &p in &self.used {
            self.slot_of_port[p] = u32::MAX;
        }
        self.used.clear();
        self.count.clear();
        for ps in ports {
            for &p in ps {
                if self.slot_of_port[p] == u32::MAX {
                    self.slot_of_port[p] = self.used.len() as u32;
                    self.used.push(p);
                    self.count.push(0);
                }
                self.count[self.slot_of_port[p] as usize] += 1;
            }
        }
        let np = self.used.len();
        self.start.clear();
        let mut acc = 0u32;
        for k in 0..np {
            self.start.push(acc);
            acc += self.count[k];
        }
        self.start.push(acc);
        self.fill.clear();
        self.fill.extend_from_slice(&self.start[..np]);
        self.members.clear();
        self.members.resize(acc as usize, 0);
        for (f, ps) in ports.iter().enumerate() {
            for &p in ps {
                let k = self.slot_of_port[p] as usize;
                self.members[self.fill[k] as usize] = f as u32;
                self.fill[k] += 1;
            }
        }
    }

    /// Port `k`'s key `share` is stale against its `current` share: take it off (the first
    /// version skipped it when it came up; it may have been dropped as dead already), drop
    /// every pending share that can never be used, and key the port by the smallest one left.
    fn drop_stale(&mut self, k: usize, share: f64, current: f64) {
        let pending = &mut self.pending[k];
        if let Some(i) = pending.iter().position(|&s| s == share) {
            pending.swap_remove(i);
        }
        pending.retain(|&s| current - s <= DEAD * s.max(1.0));
        // The current share is pending already (pushed when the port last changed, or its
        // first; a share equal to the current one is never stale); should it not be, it is
        // added, as the first version's heap always held it, and the loop still ends.
        if !pending.contains(&current) {
            pending.push(current);
        }
        let next = pending.iter().copied().fold(f64::INFINITY, f64::min);
        self.heap.raise(k, next);
    }
}

/// A min-heap of port slots keyed by share, ties to the lower slot (the order the first
/// version's heap of `(share, slot)` entries popped in), with each slot's position kept so a
/// key can move. Four children per node and the keys stored in the heap: every port is popped
/// once per call, and this halves the levels a pop walks down.
#[derive(Default)]
struct SlotHeap {
    heap: Vec<(f64, u32)>,
    pos: Vec<u32>,
}

const ABSENT: u32 = u32::MAX;

/// Children per heap node.
const ARITY: usize = 4;

fn before(a: (f64, u32), b: (f64, u32)) -> bool {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
}

impl SlotHeap {
    fn clear(&mut self, slots: usize) {
        self.heap.clear();
        self.pos.clear();
        self.pos.resize(slots, ABSENT);
    }

    fn push(&mut self, slot: usize, key: f64) {
        self.heap.push((key, slot as u32));
        self.up(self.heap.len() - 1);
    }

    fn peek(&self) -> Option<(usize, f64)> {
        self.heap.first().map(|&(k, s)| (s as usize, k))
    }

    fn pop(&mut self) {
        let Some(&(_, top)) = self.heap.first() else {
            return;
        };
        self.pos[top as usize] = ABSENT;
        let last = self.heap.pop().unwrap_or((0.0, top));
        if !self.heap.is_empty() {
            self.heap[0] = last;
            self.down(0);
        }
    }

    /// Key `slot` by `key` if that is lower than its key now (a new pending share).
    fn lower(&mut self, slot: usize, key: f64) {
        let at = self.pos[slot];
        if at != ABSENT && key.total_cmp(&self.heap[at as usize].0).is_lt() {
            self.heap[at as usize].0 = key;
            self.up(at as usize);
        }
    }

    /// Key `slot` by `key`, at least its key now (its smallest pending share was taken off).
    fn raise(&mut self, slot: usize, key: f64) {
        let at = self.pos[slot];
        if at != ABSENT {
            self.heap[at as usize].0 = key;
            self.down(at as usize);
        }
    }

    /// Move the entry at `i` up to its place, recording the positions it passes.
    fn up(&mut self, mut i: usize) {
        let item = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if !before(item, self.heap[parent]) {
                break;
            }
            self.place(i, self.heap[parent]);
            i = parent;
        }
        self.place(i, item);
    }

    /// Move the entry at `i` down to its place, recording the positions it passes.
    fn down(&mut self, mut i: usize) {
        let item = self.heap[i];
        let n = self.heap.len();
        loop {
            let first = ARITY * i + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            for c in first + 1..(first + ARITY).min(n) {
                if before(self.heap[c], self.heap[best]) {
                    best = c;
                }
            }
            if !before(self.heap[best], item) {
                break;
            }
            self.place(i, self.heap[best]);
            i = best;
        }
        self.place(i, item);
    }

    /// Put `item` at position `i` and record it there.
    fn place(&mut self, i: usize, item: (f64, u32)) {
        self.heap[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cmp::Ordering;
    use std::collections::BinaryHeap;

    #[derive(PartialEq)]
    struct Share(f64, usize);
    impl Eq for Share {}
    impl PartialOrd for Share {
        fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Share {
        fn cmp(&self, o: &Self) -> Ordering {
            o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
        }
    }

    /// The first version, kept as the oracle: every share a port has had in one heap, stale
    /// ones skipped when they come up.
    fn oracle(net: &Network, ports: &[[usize; 2]]) -> Vec<f64> {
        let mut slot: std::collections::HashMap<usize, usize> = Default::default();
        let mut used = Vec::new();
        let mut count: Vec<u32> = Vec::new();
        for ps in ports {
            for &p in ps {
                let k = *slot.entry(p).or_insert_with(|| {
                    used.push(p);
                    count.push(0);
                    used.len() - 1
                });
                count[k] += 1;
            }
        }
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); used.len()];
        for (f, ps) in ports.iter().enumerate() {
            for &p in ps {
                members[slot[&p]].push(f);
            }
        }
        let mut cap: Vec<f64> = used.iter().map(|&p| net.capacity(p)).collect();
        let mut heap: BinaryHeap<Share> = (0..used.len())
            .map(|k| Share(cap[k] / count[k] as f64, k))
            .collect();
        let mut fixed = vec![false; ports.len()];
        let mut rates = vec![0.0; ports.len()];
        while let Some(Share(share, k)) = heap.pop() {
            let n = count[k];
            if n == 0 || (cap[k] / n as f64 - share).abs() > 1e-12 * share.max(1.0) {
                continue;
            }
            for &f in &members[k] {
                if fixed[f] {
                    continue;
                }
                fixed[f] = true;
                rates[f] = share;
                for &q in &ports[f] {
                    let j = slot[&q];
                    cap[j] = (cap[j] - share).max(0.0);
                    count[j] -= 1;
                    if j != k && count[j] > 0 {
                        heap.push(Share(cap[j] / count[j] as f64, j));
                    }
                }
            }
        }
        rates
    }

    proptest! {
        /// Bit for bit the first version's rates, on random flows among 16 GPUs (two per node:
        /// NVLink and NIC ports mixed) whose link speeds make exact ties and near-ties common.
        #[test]
        fn rates_equal_the_first_version_bit_for_bit(
            pairs in prop::collection::vec((0u32..16, 1u32..16), 1..120),
            nvlink in prop::sample::select(vec![100.0, 3.0, 1.0 / 3.0, 450.0]),
            nic in prop::sample::select(vec![10.0, 3.0, 0.1, 50.0]),
        ) {
            let net = Network::custom(2, nvlink, nic, 1000, 5000);
            let ports: Vec<[usize; 2]> = pairs
                .iter()
                .map(|&(s, d)| net.ports(s, (s + d) % 16))
                .collect();
            let fast = max_min_rates(&net, &ports);
            let slow = oracle(&net, &ports);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&fast), bits(&slow));
        }
    }

    /// A near-tie the first version resolves by the older share: GPU 0 sends 11 messages and
    /// GPU 1 receives 11, one of them the same, over 10 B/ns NICs. Both ports share 10/11;
    /// fixing GPU 0's messages leaves GPU 1 (10 − 10/11)/10, one ulp above 10/11, and GPU 1's
    /// others still get 10/11, the share it was keyed by, not the ulp more of its current one.
    #[test]
    fn a_near_tie_takes_the_older_share_as_the_first_version_did() {
        let net = Network::custom(1, 100.0, 10.0, 1000, 5000);
        let mut ports = vec![net.ports(0, 1)];
        ports.extend((2..12).map(|d| net.ports(0, d)));
        ports.extend((12..22).map(|s| net.ports(s, 1)));
        let a: f64 = 10.0 / 11.0;
        assert!((10.0 - a) / 10.0 > a, "the ulp this test is about");
        let rates = max_min_rates(&net, &ports);
        assert!(
            rates.iter().all(|r| r.to_bits() == a.to_bits()),
            "{rates:?}"
        );
        assert_eq!(rates, oracle(&net, &ports));
    }

    /// Buffers reused across calls give the answers of fresh ones.
    #[test]
    fn a_reused_fair_share_answers_like_a_fresh_one() {
        let net = Network::custom(2, 100.0, 10.0, 1000, 5000);
        let mut fair = FairShare::new(4 * 16);
        for n in [30usize, 3, 17, 1, 60] {
            let ports: Vec<[usize; 2]> = (0..n as u32)
                .map(|i| net.ports(i % 16, (i * 7 + 3) % 16))
                .filter(|p| p[0] / 4 != p[1] / 4)
                .collect();
            assert_eq!(fair.rates(&net, &ports), oracle(&net, &ports).as_slice());
        }
    }
}
