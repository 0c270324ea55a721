//! FCP's communication planner (§4.2): the transfer graph of an assignment, its congestion-free
//! sub-stages, block-level pipelining and the coalescer, written into the plan.

use crate::comm::{coalesce, color_edges, sequential_by_receiver, TransferGraph};
use crate::plan::{Mask, PlanBuilder, TokenRange, Transfer};

use super::super::shard::cross_tasks;

/// Switches of the communication planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Overlap: transfers of stage `g` fly while stage `g`'s compute runs (else all transfers
    /// are issued at step 0 and all remote compute waits for step 1).
    pub pipeline: bool,
    /// Congestion-free sub-stages by edge colouring (else the naive per-receiver order).
    pub solver: bool,
    /// Sub-stages per stage (1 = no coalescing).
    pub coalesce: u32,
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
pub fn schedule(
    b: &mut PlanBuilder,
    owned: &[Vec<TokenRange>],
    num_docs: usize,
    mask: Mask,
    opts: Options,
) -> Schedule {
    let n = owned.len() as u32;
    // Chunks of each document with their owner, by start.
    let mut by_doc: Vec<Vec<(TokenRange, u32)>> = vec![Vec::new(); num_docs];
    for (r, chunks) in owned.iter().enumerate() {
        for &c in chunks {
            b.own(r as u32, c);
            by_doc[c.doc as usize].push((c, r as u32));
        }
        cross_tasks(b, r as u32, 0, chunks, chunks);
    }
    // Consumers: (rank, its query chunks of one document), and the edges they need.
    let mut groups: Vec<(u32, Vec<TokenRange>)> = Vec::new();
    let mut graph = TransferGraph::new(n);
    let mut edge_data: Vec<(TokenRange, usize)> = Vec::new();
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
        for (g, (w, qs)) in groups.iter().enumerate().skip(first) {
            let limit = match mask {
                Mask::Causal => qs.iter().map(|q| q.end).max().unwrap_or(0),
                Mask::Full => u64::MAX,
            };
            for &(c, o) in chunks.iter().take_while(|(c, _)| c.start < limit) {
                if o != *w {
                    graph.add_edge(o, *w);
                    edge_data.push((c, g));
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
    for (e, &(src, dst)) in graph.edges().iter().enumerate() {
        let (chunk, g) = edge_data[e];
        let round = coloring.colors[e];
        let (issue, arrive) = if opts.pipeline {
            let s = stages.stage_of_edge[e];
            (s, s + 1)
        } else {
            (0, 1)
        };
        for &q in &groups[g].1 {
            b.task(dst, arrive, q, chunk);
        }
        let mut t = Transfer::kv(src, dst, vec![chunk], issue, arrive);
        t.round = Some(round);
        b.transfer(t);
    }
    b.congestion_free(opts.solver);
    Schedule {
        edges: graph.len(),
        delta: graph.max_degree(),
        substages: coloring.num_colors,
        stages: stages.num_stages,
    }
}
