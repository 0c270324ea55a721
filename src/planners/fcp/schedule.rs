//! FCP's communication planner (§4.2): the transfer graph of an assignment, its congestion-free
//! sub-stages, block-level pipelining and the coalescer, written into the plan.

use std::collections::BTreeMap;

use crate::comm::{coalesce, color_edges, sequential_by_receiver, TransferGraph};
use crate::plan::{
    allowed_pairs, Mask, PlanBuilder, TokenRange, Transfer, TransferKind, TransferTensor,
};

use super::super::shard::cross_tasks;

/// Collective id of the inbound reshuffle (user layout → planned layout, Q and K/V).
pub const RESHUFFLE_IN: u32 = 0;
/// Collective id of the outbound reshuffle (outputs back to the user layout).
pub const RESHUFFLE_OUT: u32 = 1;

/// Switches of the communication planner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Overlap: transfers of stage `g` fly while stage `g`'s compute runs (else all transfers
    /// are issued at step 0 and all remote compute waits for step 1).
    pub pipeline: bool,
    /// With `pipeline`: a first hop of stage `g` is issued at step `g − lookahead` (not before
    /// the first), still due by step `g + 1`. The sender owns that data from the start; tying
    /// its send to the sender's own step `g` makes every receiver wait on a sender that waited
    /// itself, a chain that grows with the number of stages and nodes. 0 is the paper's
    /// pipeline. Rounds stay a proper colouring; with a lookahead, two stages may share a port
    /// for a while (the simulator shares it fairly).
    pub lookahead: u32,
    /// Congestion-free sub-stages by edge colouring (else the naive per-receiver order).
    pub solver: bool,
    /// Sub-stages per stage (1 = no coalescing).
    pub coalesce: u32,
    /// With a reshuffle: the share of the local work that needs no reshuffled data (by allowed
    /// pairs) run first, while the inbound all-to-all flies; the rest runs last, while the
    /// outputs go back. The bytes in (Q + K/V) over the bytes in and out (Q + K/V + O + LSE).
    pub local_first: f64,
    /// Node-level relay of K/V (`Some(gpus_per_node)`; `None` = every consumer fetches from
    /// the owner): a chunk wanted by several ranks of another node crosses the NICs once, to
    /// one of them (the gateway, the one with the least NIC traffic so far), which forwards it
    /// over NVLink to the others one stage later. Across nodes a GPU's NIC is ~8× slower than
    /// its NVLink, so this trades the scarce link for the plentiful one. A chunk one rank of a
    /// node needs is relayed too when that rank's NIC already takes in more than a node-mate's
    /// by the chunk's length: the node's imports are spread over its NICs.
    pub relay: Option<u32>,
}

/// What the communication planner built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Schedule {
    /// Blocks moved (edges of the transfer graph).
    pub edges: usize,
    /// Δ: the largest number of blocks any rank sends or receives.
    pub delta: u32,
    /// Sub-stages used (Δ with the solver; the largest receive count without).
    pub substages: u32,
    /// Stages after coalescing.
    pub stages: u32,
    /// Chunks forwarded inside a node by a gateway (second hops of the node relay).
    pub relayed: usize,
}

/// Register `owned`, then emit every task and transfer of the plan.
///
/// Each rank's queries need, in their own document, every key chunk at or before them
/// (causal) or all of them (full). A needed chunk another rank owns is one edge
/// owner → consumer, once per consumer however many of its chunks need it. Edges are coloured
/// into sub-stages (rounds) and grouped `coalesce` at a time into stages. Step 0 computes
/// everything local; with pipelining, stage `g`'s transfers are issued at step `g` and arrive
/// by step `g + 1`, where the tasks they unlock run — so each step's compute covers the next
/// stage's transfers, and the local step covers the first.
///
/// With the relay ([`Options::relay`]), a chunk several ranks of another node need is one edge
/// owner → gateway (coloured and staged with the rest) and one second hop gateway → consumer
/// per other consumer there, issued when the first hop lands and coloured on its own (rounds
/// after the first hops'), so every round still has one send and one receive per rank.
///
/// With an `input` layout (the transparent reshuffler, §4.3), everything above moves one step
/// later and is framed by the two all-to-alls: step 0 runs the local tasks whose Q and K/V the
/// rank already holds in the user's layout (the first `local_first` of them) while the inbound
/// all-to-all (collective [`RESHUFFLE_IN`]) brings every rank the Q and K/V of what it owns;
/// step 1 runs the rest of the local work; the remote stages follow; a last step runs the
/// remaining already-held local tasks — rows that stay where the user put them, so nothing
/// waits for them — while the outbound all-to-all (collective [`RESHUFFLE_OUT`]) returns every
/// moved output row to its input owner.
pub fn schedule(
    b: &mut PlanBuilder,
    owned: &[Vec<TokenRange>],
    num_docs: usize,
    mask: Mask,
    opts: Options,
    input: Option<&[Vec<TokenRange>]>,
) -> Schedule {
    let n = owned.len() as u32;
    let base = u32::from(input.is_some());
    // Chunks of each document with their owner, by start.
    let mut by_doc: Vec<Vec<(TokenRange, u32)>> = vec![Vec::new(); num_docs];
    let inputs = input.map(|l| Inputs::new(l, num_docs));
    let mut held_local: Vec<Vec<(TokenRange, TokenRange, u128)>> = vec![Vec::new(); n as usize];
    for (r, chunks) in owned.iter().enumerate() {
        for &c in chunks {
            b.own(r as u32, c);
            by_doc[c.doc as usize].push((c, r as u32));
        }
        match &inputs {
            None => cross_tasks(b, r as u32, 0, chunks, chunks),
            Some(inp) => {
                // Local pairs: already held (both chunks in the rank's input) or not.
                let (held, moved): (Vec<TokenRange>, Vec<TokenRange>) =
                    chunks.iter().partition(|c| inp.holds(r as u32, c));
                cross_tasks(b, r as u32, 1, &moved, chunks);
                cross_tasks(b, r as u32, 1, &held, &moved);
                // Pairs within one document (sorted by document: packs hold many).
                let mut held = held;
                held.sort_by_key(|c| (c.doc, c.start));
                for same in held.chunk_by(|a, b| a.doc == b.doc) {
                    for &q in same {
                        for &kv in same {
                            let pairs = allowed_pairs(mask, q.start, q.end, kv.start, kv.end);
                            if pairs > 0 {
                                held_local[r].push((q, kv, pairs));
                            }
                        }
                    }
                }
            }
        }
    }
    // Consumers: (rank, its query chunks of one document), and the edges they need: a
    // first hop owner → consumer (or → gateway) in `graph`, and the relay's second hops
    // gateway → consumer in `hops` (with the first hop they wait for).
    let mut groups: Vec<(u32, Vec<TokenRange>)> = Vec::new();
    let mut graph = TransferGraph::new(n);
    let mut edge_data: Vec<(TokenRange, Option<usize>)> = Vec::new();
    let mut hops = TransferGraph::new(n);
    let mut hop_data: Vec<(TokenRange, usize, usize)> = Vec::new();
    let mut nic_in = vec![0u64; n as usize];
    for chunks in &mut by_doc {
        if chunks.len() < 2 {
            continue;
        }
        chunks.sort_by_key(|&(c, r)| (c.start, r));
        let first = groups.len();
        let mut holders: Vec<(u32, TokenRange)> = chunks.iter().map(|&(c, r)| (r, c)).collect();
        holders.sort_by_key(|&(r, c)| (r, c.start));
        for &(r, c) in &holders {
            if groups.len() > first && groups[groups.len() - 1].0 == r {
                let last = groups.len() - 1;
                groups[last].1.push(c);
            } else {
                groups.push((r, vec![c]));
            }
        }
        // wanted[i]: the consumer groups (by rank) that need chunk i from another rank.
        let relay = opts.relay.filter(|&g| g >= 1);
        let mut wanted: Vec<Vec<usize>> = vec![Vec::new(); chunks.len()];
        for (g, (w, qs)) in groups.iter().enumerate().skip(first) {
            let limit = match mask {
                Mask::Causal => qs.iter().map(|q| q.end).max().unwrap_or(0),
                Mask::Full => u64::MAX,
            };
            for (i, &(c, o)) in chunks
                .iter()
                .enumerate()
                .take_while(|(_, (c, _))| c.start < limit)
            {
                match (o != *w, relay) {
                    (false, _) => {}
                    // Without the relay, edges go straight in, consumer by consumer.
                    (true, None) => {
                        graph.add_edge(o, *w);
                        edge_data.push((c, Some(g)));
                    }
                    (true, Some(_)) => wanted[i].push(g),
                }
            }
        }
        let Some(gpn) = relay else { continue };
        for (i, &(c, o)) in chunks.iter().enumerate() {
            // Consumers are sorted by rank, so each node's are contiguous.
            for run in wanted[i].chunk_by(|&x, &y| groups[x].0 / gpn == groups[y].0 / gpn) {
                let node = groups[run[0]].0 / gpn;
                let members = node * gpn..((node + 1) * gpn).min(n);
                // A chunk one rank of another node needs goes straight to it, unless its NIC
                // already takes in more than another rank's of the node by the chunk's length:
                // then a node-mate takes it in and forwards it (a long document's prefix read
                // by one rank of a node would otherwise queue on that one NIC).
                let direct = node == o / gpn
                    || (run.len() == 1 && {
                        let least = members.clone().map(|r| nic_in[r as usize]).min();
                        nic_in[groups[run[0]].0 as usize] <= least.unwrap_or(0) + c.len()
                    });
                if direct {
                    for &g in run {
                        if node != o / gpn {
                            nic_in[groups[g].0 as usize] += c.len();
                        }
                        graph.add_edge(o, groups[g].0);
                        edge_data.push((c, Some(g)));
                    }
                    continue;
                }
                // The gateway: the node's rank with the least NIC traffic in so far (a
                // consumer on ties, which then needs no second hop itself). Any rank of the
                // node may relay, so all of its NICs share what the node takes in.
                let gate = members
                    .min_by_key(|&r| {
                        let consumer = run.iter().any(|&g| groups[g].0 == r);
                        (nic_in[r as usize], !consumer, r)
                    })
                    .expect("a node has a rank");
                nic_in[gate as usize] += c.len();
                let gate_group = run.iter().copied().find(|&g| groups[g].0 == gate);
                let e = graph.add_edge(o, gate);
                edge_data.push((c, gate_group));
                for &g in run.iter().filter(|&&g| Some(g) != gate_group) {
                    hops.add_edge(gate, groups[g].0);
                    hop_data.push((c, g, e));
                }
            }
        }
    }
    let coloring = if opts.solver {
        color_edges(&graph)
    } else {
        sequential_by_receiver(&graph)
    };
    let stages = coalesce(&coloring, opts.coalesce);
    let mut last = base;
    let mut timing = Vec::with_capacity(graph.len());
    for (e, &(src, dst)) in graph.edges().iter().enumerate() {
        let (chunk, g) = edge_data[e];
        let round = coloring.colors[e];
        let (issue, arrive) = if opts.pipeline {
            let s = stages.stage_of_edge[e];
            (s.saturating_sub(opts.lookahead) + base, s + base + 1)
        } else {
            (base, base + 1)
        };
        timing.push(arrive);
        last = last.max(arrive);
        for &q in g.map_or(&[][..], |g| &groups[g].1[..]) {
            b.task(dst, arrive, q, chunk);
        }
        let mut t = Transfer::kv(src, dst, vec![chunk], issue, arrive);
        t.round = Some(round);
        b.transfer(t);
    }
    // Second hops leave when their first hop has landed at the gateway. Their rounds follow
    // the first hops' (a separate colouring: they use NVLink ports, not NICs).
    let hop_coloring = if opts.solver {
        color_edges(&hops)
    } else {
        sequential_by_receiver(&hops)
    };
    for (e, &(src, dst)) in hops.edges().iter().enumerate() {
        let (chunk, g, parent) = hop_data[e];
        let issue = timing[parent];
        last = last.max(issue + 1);
        for &q in &groups[g].1 {
            b.task(dst, issue + 1, q, chunk);
        }
        let mut t = Transfer::kv(src, dst, vec![chunk], issue, issue + 1);
        t.round = Some(coloring.num_colors + hop_coloring.colors[e]);
        b.transfer(t);
    }
    b.congestion_free(opts.solver);
    if let (Some(inp), Some(layout)) = (&inputs, input) {
        let end = last + 1;
        for (r, pairs) in held_local.iter().enumerate() {
            let total: u128 = pairs.iter().map(|p| p.2).sum();
            let mut acc = 0u128;
            for &(q, kv, w) in pairs {
                // First `local_first` of the work (by pairs) before, the rest after.
                let step = if (acc as f64) < opts.local_first * total as f64 {
                    0
                } else {
                    end
                };
                acc += w;
                b.task(r as u32, step, q, kv);
            }
        }
        b.input_layout(layout.to_vec());
        reshuffle(b, owned, inp, end);
    }
    Schedule {
        edges: graph.len(),
        delta: graph.max_degree(),
        substages: coloring.num_colors,
        stages: stages.num_stages,
        relayed: hops.len(),
    }
}

/// The two all-to-alls of the reshuffler: Q and K/V of every owned range not already held go
/// from their input owners at step 0 (due by step 1), and the outputs of those rows go back
/// from their planned owners at step `end` — the last step, which computes only rows that
/// never moved — due by the end.
fn reshuffle(b: &mut PlanBuilder, owned: &[Vec<TokenRange>], inp: &Inputs, end: u32) {
    // (input owner, planned owner) → ranges.
    let mut moves: BTreeMap<(u32, u32), Vec<TokenRange>> = BTreeMap::new();
    for (r, chunks) in owned.iter().enumerate() {
        for c in chunks {
            for (piece, from) in inp.pieces(c) {
                if from != r as u32 {
                    moves.entry((from, r as u32)).or_default().push(piece);
                }
            }
        }
    }
    let piece = |tensor, collective, src, dst, ranges, issue_at, arrive_by| Transfer {
        kind: TransferKind::AllToAll,
        collective: Some(collective),
        tensor,
        src,
        dst,
        also_to: Vec::new(),
        ranges,
        heads: None,
        issue_at,
        arrive_by,
        round: None,
    };
    for (&(from, to), ranges) in &moves {
        for tensor in [TransferTensor::Q, TransferTensor::Kv] {
            b.transfer(piece(tensor, RESHUFFLE_IN, from, to, ranges.clone(), 0, 1));
        }
        b.transfer(piece(
            TransferTensor::Out,
            RESHUFFLE_OUT,
            to,
            from,
            ranges.clone(),
            end,
            end + 1,
        ));
    }
}

/// The user's layout, indexed for "who holds this range": per document, sorted disjoint
/// `(start, end, rank)` runs.
struct Inputs {
    runs: Vec<Vec<(u64, u64, u32)>>,
}

impl Inputs {
    fn new(layout: &[Vec<TokenRange>], num_docs: usize) -> Self {
        let mut runs = vec![Vec::new(); num_docs];
        for (r, ranges) in layout.iter().enumerate() {
            for c in ranges {
                runs[c.doc as usize].push((c.start, c.end, r as u32));
            }
        }
        for v in &mut runs {
            v.sort_unstable();
        }
        Inputs { runs }
    }

    /// The pieces of `c` and the rank holding each in the user's layout.
    fn pieces(&self, c: &TokenRange) -> impl Iterator<Item = (TokenRange, u32)> + '_ {
        let runs = &self.runs[c.doc as usize];
        let from = runs.partition_point(|&(_, e, _)| e <= c.start);
        let c = *c;
        runs[from..]
            .iter()
            .take_while(move |&&(s, _, _)| s < c.end)
            .map(move |&(s, e, r)| (TokenRange::new(c.doc, s.max(c.start), e.min(c.end)), r))
    }

    /// Whether rank `r` holds all of `c` in the user's layout.
    fn holds(&self, r: u32, c: &TokenRange) -> bool {
        self.pieces(c).all(|(_, from)| from == r)
    }
}
