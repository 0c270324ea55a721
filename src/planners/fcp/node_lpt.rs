//! Node-grouped placement: documents to nodes first, then blocks to the ranks of each node.
//!
//! Why: FCP's LPT places every block on the least-loaded rank anywhere in the group, so the
//! blocks of one long document land on ranks of many nodes, and every one of those nodes
//! imports the document's K/V over its NICs — ~8× slower than NVLink. At 256 ranks (32 nodes)
//! that traffic is what `hybrid` leaves exposed (`docs/results/beyond.md`, exposure factor up
//! to 1.4). A document whose units are kept inside one node moves its K/V over NVLink only.
//!
//! Two LPT passes: (1) each cut document's units, grouped — the whole document while it weighs
//! at most [`SEGMENT`] × a node's mean load, else consecutive runs of its units up to that
//! weight — and every other unit alone, heaviest first to the least-loaded node with room
//! (`gpus_per_node × cap` tokens) — a group no node has room for is placed unit by unit, at the
//! margin block by block, and a block cut across nodes as FCP's LPT cuts across ranks; (2)
//! FCP's LPT over each node's units and ranks, under the per-rank cap.

use super::blocks::{Block, Unit};
use super::lpt::{assign_with, take_front, Assignment, Options};
use crate::plan::TokenRange;

/// Largest group of one document's units kept together, as a fraction of a node's mean load:
/// a whole node's worth would leave node-level LPT too coarse to balance.
pub const SEGMENT: f64 = 0.5;

/// The document a unit of a cut document belongs to (`None`: a pack or whole document).
fn cut_doc(u: &Unit) -> Option<u32> {
    u.blocks
        .iter()
        .find(|b| !b.packed)
        .and_then(|b| b.chunks.first())
        .map(|c| c.doc)
}

/// Groups of units placed together on one node, in unit order: runs of a cut document's units
/// up to `limit` weight, and every other unit alone.
fn groups(units: &[Unit], limit: f64) -> Vec<Vec<usize>> {
    let mut by_doc: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    let mut out = Vec::new();
    for (i, u) in units.iter().enumerate() {
        match cut_doc(u) {
            Some(d) => by_doc.entry(d).or_default().push(i),
            None => out.push(vec![i]),
        }
    }
    for members in by_doc.into_values() {
        let mut run: Vec<usize> = Vec::new();
        let mut weight = 0.0;
        for i in members {
            if !run.is_empty() && weight + units[i].weight > limit {
                out.push(std::mem::take(&mut run));
                weight = 0.0;
            }
            weight += units[i].weight;
            run.push(i);
        }
        if !run.is_empty() {
            out.push(run);
        }
    }
    out
}

/// Place `units` on `ranks` ranks of `gpus_per_node` per node under `cap` tokens per rank:
/// node-grouped (see the module doc) when the group spans at least two whole nodes, else
/// [`assign_with`] alone.
pub fn assign_by_node(
    units: &[Unit],
    ranks: u32,
    gpus_per_node: u32,
    cap: u64,
    opts: Options,
) -> Assignment {
    let gpn = gpus_per_node.max(1);
    if gpn == 1 || ranks % gpn != 0 || ranks / gpn < 2 {
        return assign_with(units, ranks, cap, opts);
    }
    let nodes = (ranks / gpn) as usize;
    let node_cap = u64::from(gpn) * cap;
    let mean = units.iter().map(|u| u.weight).sum::<f64>() / nodes as f64;
    let per_node = place_on_nodes(units, nodes, node_cap, SEGMENT * mean);
    let mut all = Assignment {
        owned: vec![Vec::new(); ranks as usize],
        loads: vec![0.0; ranks as usize],
        tokens: vec![0; ranks as usize],
        comm: vec![0.0; ranks as usize],
        split_pairs: 0,
        split_blocks: 0,
        items: Vec::new(),
        item_rank: Vec::new(),
    };
    for (n, mut mine) in per_node.into_iter().enumerate() {
        let first = n as u32 * gpn;
        // A reshuffler home is a rank of the whole group: kept if it is on this node.
        for u in &mut mine {
            u.home = u
                .home
                .filter(|h| (first..first + gpn).contains(h))
                .map(|h| h - first);
        }
        let a = assign_with(&mine, gpn, cap, opts);
        for (r, c) in a.comm.iter().enumerate() {
            all.comm[first as usize + r] = *c;
        }
        all.split_pairs += a.split_pairs;
        all.split_blocks += a.split_blocks;
        all.item_rank.extend(a.item_rank.iter().map(|&r| first + r));
        all.items.extend(a.items);
    }
    all.regroup();
    all
}

/// Every node's units: groups heaviest first (ties by first unit), each to the least-loaded
/// node (ties: lowest) with room. A group that fits no node is broken into its units; a pair
/// that fits none into its blocks; a block that fits none is cut across the nodes with the most
/// room, its weight shared by tokens — as FCP's LPT does at the cap's margin, so this never
/// fails when `nodes × node_cap` covers the batch.
fn place_on_nodes(units: &[Unit], nodes: usize, node_cap: u64, limit: f64) -> Vec<Vec<Unit>> {
    // Index i < units.len() is units[i]; beyond, a pair broken at the margin (`halves`).
    let mut halves: Vec<Unit> = Vec::new();
    let at = |halves: &[Unit], i: usize| -> Unit {
        if i < units.len() {
            units[i].clone()
        } else {
            halves[i - units.len()].clone()
        }
    };
    let unit_of = |halves: &[Unit], i: usize| -> (f64, u64) {
        let u = units.get(i).unwrap_or_else(|| &halves[i - units.len()]);
        (u.weight, u.tokens())
    };
    let weight =
        |halves: &[Unit], g: &[usize]| g.iter().map(|&i| unit_of(halves, i).0).sum::<f64>();
    let tokens =
        |halves: &[Unit], g: &[usize]| g.iter().map(|&i| unit_of(halves, i).1).sum::<u64>();
    let order = |halves: &[Unit], q: &mut Vec<Vec<usize>>| {
        // Lightest first, so the heaviest pops first; ties: the later first unit first.
        q.sort_by(|a, b| {
            weight(halves, a)
                .total_cmp(&weight(halves, b))
                .then(b[0].cmp(&a[0]))
        });
    };
    let mut queue = groups(units, limit);
    order(&halves, &mut queue);
    let mut load = vec![0.0f64; nodes];
    let mut room = vec![node_cap; nodes];
    let mut out: Vec<Vec<Unit>> = vec![Vec::new(); nodes];
    let mut give = |n: usize, u: Unit, load: &mut [f64], room: &mut [u64]| {
        load[n] += u.weight;
        room[n] -= u.tokens();
        out[n].push(u);
    };
    while let Some(g) = queue.pop() {
        let t = tokens(&halves, &g);
        let fits = (0..nodes)
            .filter(|&n| room[n] >= t)
            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)));
        if let Some(n) = fits {
            for i in g {
                give(n, at(&halves, i), &mut load, &mut room);
            }
            continue;
        }
        if g.len() > 1 {
            queue.extend(g.into_iter().map(|i| vec![i]));
            order(&halves, &mut queue);
            continue;
        }
        let u = at(&halves, g[0]);
        if u.blocks.len() > 1 {
            // A pair no node can hold: its blocks, weight and traffic shared by tokens.
            for b in &u.blocks {
                let share = b.tokens() as f64 / u.tokens().max(1) as f64;
                halves.push(Unit {
                    blocks: vec![b.clone()],
                    weight: u.weight * share,
                    comm: u.comm * share,
                    home: None,
                });
                queue.push(vec![units.len() + halves.len() - 1]);
            }
            order(&halves, &mut queue);
            continue;
        }
        // One block no node can hold: cut, front first, across the roomiest nodes.
        let total = u.tokens().max(1) as f64;
        let mut rest: Vec<TokenRange> = u.blocks[0].chunks.iter().rev().copied().collect();
        while !rest.is_empty() {
            let n = (0..nodes)
                .max_by(|&a, &b| room[a].cmp(&room[b]).then(b.cmp(&a)))
                .filter(|&n| room[n] > 0)
                .expect("nodes × node_cap below the batch's tokens");
            let mine = take_front(&mut rest, room[n]);
            let share = mine.iter().map(TokenRange::len).sum::<u64>() as f64 / total;
            let piece = Unit {
                blocks: vec![Block {
                    chunks: mine,
                    packed: u.blocks[0].packed,
                }],
                weight: u.weight * share,
                comm: u.comm * share,
                home: None,
            };
            give(n, piece, &mut load, &mut room);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::fcp::blocks::make_units;
    use crate::trace::Batch;

    fn weighed(lens: Vec<u64>, block: u64) -> Vec<Unit> {
        let mut units = make_units(&Batch::new(0, lens), block, Mask::Causal);
        for u in &mut units {
            // Causal pairs as the weight.
            u.weight = u
                .blocks
                .iter()
                .flat_map(|b| &b.chunks)
                .map(|c: &TokenRange| (c.end * c.end - c.start * c.start) as f64)
                .sum();
        }
        units
    }

    #[test]
    fn a_document_that_fits_a_node_stays_in_it() {
        // 4 nodes × 2 ranks × 2000 tokens: a 600-token document cut in 200-token blocks (a
        // pair and a middle block) among 80 short ones. It weighs less than half a node's
        // share, so both its units share one node.
        let mut lens = vec![600];
        lens.extend(std::iter::repeat_n(190u64, 80));
        let units = weighed(lens, 200);
        assert_eq!(units.iter().filter(|u| cut_doc(u) == Some(0)).count(), 2);
        let a = assign_by_node(&units, 8, 2, 2000, Options::default());
        let nodes: std::collections::BTreeSet<u32> = a
            .items
            .iter()
            .zip(&a.item_rank)
            .filter(|(it, _)| it.chunks.iter().any(|c| c.doc == 0))
            .map(|(_, &r)| r / 2)
            .collect();
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        assert!(a.tokens.iter().all(|&t| t <= 2000));
        assert_eq!(a.tokens.iter().sum::<u64>(), 600 + 80 * 190);
    }

    #[test]
    fn one_node_or_uneven_groups_fall_back_to_flat_lpt() {
        let units = weighed(vec![1600, 300, 200], 200);
        let flat = assign_with(&units, 6, 800, Options::default());
        assert_eq!(assign_by_node(&units, 6, 8, 800, Options::default()), flat);
        assert_eq!(assign_by_node(&units, 6, 4, 800, Options::default()), flat);
    }
}
