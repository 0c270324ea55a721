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
//! weight, never ending between the two halves of a broken zig-zag pair — and every other
//! unit alone, heaviest first to the least-loaded node with room (`gpus_per_node × cap`
//! tokens) — a group no node has room for is placed pair by pair, then unit by unit, at the
//! margin block by block, and a block cut across nodes as FCP's LPT cuts across ranks; (2)
//! FCP's LPT over each node's units and ranks, under the per-rank cap.
//!
//! **Filling to the target** (`fill`). When the batch fills its budget every node must take
//! almost exactly its share of tokens, and the tokens left after the heavy runs are filled with
//! short documents, which are light but not weightless. A node given two heavy runs of a long
//! document (dense: late blocks attend to a long prefix) then ends above its share whatever
//! fills it: on magi at 256 ranks (B200, 4K blocks) LPT left nodes between 0.91 and 1.07 of
//! the mean, and no exchange of whole groups could fix it. With `fill`, a run of a document
//! heavier than a segment goes to the least-loaded node that can take it and still end at its
//! target — its load plus the rest of its room filled at the short documents' mean density —
//! and where none can, the least-loaded node takes the longest prefix of the run that keeps
//! it there (at least one unit) and the rest waits its turn. Nodes then end within 1–2% of
//! their share. Only runs of such documents are cut: they span several nodes anyway, and a
//! document light enough for one node stays in one.

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
/// up to `limit` weight, and every other unit alone. A run never ends between units of one
/// origin (the halves of a broken zig-zag pair): a node holding block `i` of a document but
/// not block `k−1−i` could not pair its ranks' blocks back to equal loads, and when every rank
/// must fill its token cap with two blocks, the mismatch stays (one 512K document on 64 H100
/// ranks: the busiest rank 1.19 × the mean).
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
        let twins = twin_slices(&members, |i| units[i].origin, |i| units[i].weight, limit);
        for twins in twins {
            let w: f64 = twins.iter().map(|&i| units[i].weight).sum();
            if !run.is_empty() && weight + w > limit {
                out.push(std::mem::take(&mut run));
                weight = 0.0;
            }
            weight += w;
            run.extend_from_slice(twins);
        }
        if !run.is_empty() {
            out.push(run);
        }
    }
    out
}

/// `members` (unit indices) cut where the origin changes, so that consecutive units of one
/// origin stay in one slice — unless together they weigh more than `limit`, when each is its
/// own slice: the pieces of a split block share the origin of its pair, and one slice as
/// heavy as a whole document could not be spread over nodes (a 4K document in 2K blocks
/// split down to 256 tokens was one group: 0 tokens on one node, compute imbalance 0.51).
fn twin_slices(
    members: &[usize],
    origin: impl Fn(usize) -> u32,
    weight: impl Fn(usize) -> f64,
    limit: f64,
) -> Vec<&[usize]> {
    let mut out = Vec::new();
    for twins in members.chunk_by(|&a, &b| origin(a) == origin(b)) {
        if twins.len() > 1 && twins.iter().map(|&i| weight(i)).sum::<f64>() > limit {
            out.extend(twins.chunks(1));
        } else {
            out.push(twins);
        }
    }
    out
}

/// Unit `i` of [`place_on_nodes`]' index space: `units[i]`, or beyond them a broken pair's
/// half in `halves`.
fn indexed<'a>(units: &'a [Unit], halves: &'a [Unit], i: usize) -> &'a Unit {
    units.get(i).unwrap_or_else(|| &halves[i - units.len()])
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
    fill: bool,
) -> Assignment {
    let gpn = gpus_per_node.max(1);
    if gpn == 1 || ranks % gpn != 0 || ranks / gpn < 2 {
        return assign_with(units, ranks, cap, opts);
    }
    let nodes = (ranks / gpn) as usize;
    let node_cap = u64::from(gpn) * cap;
    let mean = units.iter().map(|u| u.weight).sum::<f64>() / nodes as f64;
    let per_node = place_on_nodes(units, nodes, node_cap, mean, fill);
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

/// What filling to the target needs (see the module doc): the node's mean load, the short
/// documents' mean density, and the long documents whose runs may be cut.
struct Target {
    on: bool,
    mean: f64,
    density: f64,
    /// Documents heavier than a segment (cut into several runs).
    long: std::collections::BTreeSet<u32>,
    /// The document of each unit of a cut document.
    doc_of: Vec<Option<u32>>,
}

impl Target {
    fn new(units: &[Unit], mean: f64, limit: f64, on: bool) -> Target {
        let doc_of: Vec<Option<u32>> = units.iter().map(cut_doc).collect();
        let mut weight: std::collections::BTreeMap<u32, f64> = Default::default();
        let (mut short_w, mut short_t) = (0.0, 0u64);
        for (u, d) in units.iter().zip(&doc_of) {
            match d {
                Some(d) => *weight.entry(*d).or_default() += u.weight,
                None => {
                    short_w += u.weight;
                    short_t += u.tokens();
                }
            }
        }
        Target {
            on,
            mean,
            density: if short_t > 0 {
                short_w / short_t as f64
            } else {
                0.0
            },
            long: weight
                .into_iter()
                .filter(|&(_, w)| w > limit)
                .map(|(d, _)| d)
                .collect(),
            doc_of,
        }
    }

    /// Whether group `g` — several units of one cut document — goes to a node it keeps at its
    /// target when one exists. Single units (short documents, mostly) are the filler: they go
    /// to the least-loaded node, as in LPT.
    fn prefers(&self, g: &[usize]) -> bool {
        self.on && g.len() > 1
    }

    /// Whether group `g` is a run of a long document of more than one unit (halves of broken
    /// pairs, indexed past the units, are never runs).
    fn fills(&self, g: &[usize]) -> bool {
        self.on
            && g.len() > 1
            && self
                .doc_of
                .get(g[0])
                .copied()
                .flatten()
                .is_some_and(|d| self.long.contains(&d))
    }

    /// Whether a node at `load` with `room` tokens still free ends at most at its target once
    /// that room is filled at the short documents' density.
    fn keeps(&self, load: f64, room: u64) -> bool {
        load + room as f64 * self.density <= self.mean
    }
}

/// Every node's units: groups heaviest first (ties by first unit), each to the least-loaded
/// node (ties: lowest) with room. A group that fits no node is broken into its units; a pair
/// that fits none into its blocks; a block that fits none is cut across the nodes with the most
/// room, its weight shared by tokens — as FCP's LPT does at the cap's margin, so this never
/// fails when `nodes × node_cap` covers the batch. Groups weigh at most [`SEGMENT`] × `mean`,
/// a node's mean load; with `fill`, runs of documents heavier than that are placed to fill
/// nodes to their target (see the module doc).
fn place_on_nodes(
    units: &[Unit],
    nodes: usize,
    node_cap: u64,
    mean: f64,
    fill: bool,
) -> Vec<Vec<Unit>> {
    let limit = SEGMENT * mean;
    // Index i < units.len() is units[i]; beyond, a pair broken at the margin (`halves`).
    let mut halves: Vec<Unit> = Vec::new();
    let at = |halves: &[Unit], i: usize| -> Unit { indexed(units, halves, i).clone() };
    let unit_of = |halves: &[Unit], i: usize| -> (f64, u64) {
        let u = indexed(units, halves, i);
        (u.weight, u.tokens())
    };
    let origin_of = |halves: &[Unit], i: usize| indexed(units, halves, i).origin;
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
    let target = Target::new(units, mean, limit, fill);
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
        let least = |ok: &dyn Fn(usize) -> bool| {
            (0..nodes)
                .filter(|&n| room[n] >= t && ok(n))
                .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
        };
        let mut fits = least(&|_| true);
        if target.prefers(&g) {
            // The least-loaded node the group keeps at its target, if any.
            let w = weight(&halves, &g);
            let within = |n: usize| target.keeps(load[n] + w, room[n] - t);
            fits = least(&within).or(fits);
        }
        if let (Some(n), true) = (fits, target.fills(&g)) {
            // A run of a long document: whole where it keeps the node at its target, else the
            // longest prefix that does (at least one unit); the rest waits its turn.
            let w = weight(&halves, &g);
            if target.keeps(load[n] + w, room[n] - t) {
                for i in g {
                    give(n, at(&halves, i), &mut load, &mut room);
                }
                continue;
            }
            // Cut between origins only, as `groups` does.
            let (mut wp, mut tp, mut k) = (0.0, 0u64, 0);
            let twins = twin_slices(
                &g,
                |i| origin_of(&halves, i),
                |i| unit_of(&halves, i).0,
                limit,
            );
            for twins in twins {
                let (wi, ti) = twins.iter().fold((0.0, 0u64), |(w, t), &i| {
                    let (wi, ti) = unit_of(&halves, i);
                    (w + wi, t + ti)
                });
                if k > 0 && !target.keeps(load[n] + wp + wi, room[n] - tp - ti) {
                    break;
                }
                wp += wi;
                tp += ti;
                k += twins.len();
            }
            for &i in &g[..k] {
                give(n, at(&halves, i), &mut load, &mut room);
            }
            if k < g.len() {
                queue.push(g[k..].to_vec());
                order(&halves, &mut queue);
            }
            continue;
        }
        if let Some(n) = fits {
            for i in g {
                give(n, at(&halves, i), &mut load, &mut room);
            }
            continue;
        }
        if g.len() > 1 {
            // Broken into its pairs first, a pair into its units only when it fits no node.
            let twins: Vec<Vec<usize>> = twin_slices(
                &g,
                |i| origin_of(&halves, i),
                |i| unit_of(&halves, i).0,
                limit,
            )
            .into_iter()
            .map(<[usize]>::to_vec)
            .collect();
            if twins.len() > 1 {
                queue.extend(twins);
            } else {
                queue.extend(g.into_iter().map(|i| vec![i]));
            }
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
                    origin: u.origin,
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
                origin: u.origin,
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
        let a = assign_by_node(&units, 8, 2, 2000, Options::default(), false);
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
        assert_eq!(
            assign_by_node(&units, 6, 8, 800, Options::default(), false),
            flat
        );
        assert_eq!(
            assign_by_node(&units, 6, 4, 800, Options::default(), true),
            flat
        );
    }
}
