//! `usp`: Ulysses inside a node, zigzag ring across nodes — the two-level context parallelism
//! of USP (feifeibear/long-context-attention, "ulysses degree × ring degree"), LoongTrain's
//! 2D attention (arXiv 2406.18485) and TransformerEngine's `cp_comm_type="a2a+p2p"` (Megatron's
//! `hierarchical_context_parallel_sizes`); anchors-cp.md §3–4, [sources](docs/sources.md).
//!
//! Ulysses alone needs the query heads divisible by N and replicates whole K/V heads once N
//! passes their count (Llama-3-70B's 8); a ring alone sends every K/V piece N − 1 hops, over the
//! NICs as soon as the group spans nodes. USP splits N = u × r: the `u` ranks of a Ulysses
//! group (a node by default) trade heads over NVLink, and the `r` groups run a ring among the
//! ranks that hold the same head group, each hop carrying only those heads' K/V.
//!
//! **Layout.** TransformerEngine's: every document is cut into 2N even pieces and rank
//! `k = g·u + j` (group `g`, position `j`) holds pieces `k` and `2N − 1 − k`, the `zigzag`
//! layout. Group `g` then holds pieces `[g·u, (g+1)·u)` and their mirror: chunks `g` and
//! `2r − 1 − g` of a 2r-way zigzag, so the ring across groups is balanced under a causal mask.
//!
//! **Steps.** Before step 0 each group's all-to-alls give rank `(g, j)` the Q and K/V of the
//! group's tokens for head group `j` (`head_all_to_all`). Steps `0 … r − 1` are a ring among
//! ranks `(0, j) … (r − 1, j)` over those unions ([`super::shard::ring_pass_heads`]), one hop
//! of head group `j`'s K/V per step, sent while the previous step computes. After step
//! `r − 1` the outputs go back to their owners by a third all-to-all. `u = N` is Ulysses on a
//! zigzag layout; `u = 1` is `zigzag`.
//!
//! **Placement.** Ranks are numbered node by node, so which level gets consecutive ranks
//! decides which one rides NVLink. By default (`inner=ulysses`) logical rank `g·u + j` is
//! physical rank `g·u + j`: a Ulysses group is `u` consecutive ranks, a ring strides `u`
//! apart. `inner=ring` (USP's other placement, its `use_ulysses_low = False`) puts logical
//! rank `(g, j)` on physical rank `j·r + g`: a ring's `r` ranks are consecutive and its hops
//! stay in a node, while the all-to-alls span nodes. Only the numbering changes; the pieces,
//! tiles and transfers of each logical rank are the same.

use std::collections::BTreeMap;

use crate::plan::{Plan, PlanBuilder, PlanError, TokenRange};
use crate::trace::Batch;

use super::shard::{
    assign_pieces, check_head_all_to_alls, check_rings_bound, gqa_group, head_all_to_all,
    head_all_to_all_ranges, head_group, kv_group, merge_ranges, ring_flash_params, ring_pass_heads,
    zigzag_pieces, RingHeads,
};
use super::{PlanContext, Planner, MAX_PLAN_ITEMS};

/// Two-level context parallelism: Ulysses groups of `ulysses` ranks, a zigzag ring across
/// them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usp {
    /// Ranks per Ulysses group (the ulysses degree); absent: [`Usp::default_degree`].
    pub ulysses: Option<u32>,
    /// Which level gets consecutive ranks, the ones a node holds ([`Inner`]).
    pub inner: Inner,
}

/// The level of `usp` whose groups are consecutive ranks (inside a node while they fit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Inner {
    /// Ulysses groups: the all-to-alls on NVLink, the ring's hops across nodes (USP's
    /// default, TransformerEngine's `a2a+p2p`).
    #[default]
    Ulysses,
    /// Rings: the hops on NVLink, the all-to-alls across nodes.
    Ring,
}

impl Inner {
    /// The parameter's value, as `usp:inner=` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Inner::Ulysses => "ulysses",
            Inner::Ring => "ring",
        }
    }
}

impl Usp {
    /// The Ulysses degree when none is given: the largest that divides both the ranks and the
    /// query heads and whose groups (consecutive ranks) each fit in one node, so the
    /// all-to-alls stay on NVLink (1 when nothing larger does: a plain zigzag ring). Past one
    /// node that means dividing the node's GPUs too: 5 of 20 ranks on 8-GPU nodes would put
    /// ranks 5–9 across two (bug hunt: a 40-head model at 20 ranks got 5, 51 % slower than 4).
    pub fn default_degree(ctx: &PlanContext<'_>) -> u32 {
        let gpn = ctx.hardware.gpus_per_node.max(1);
        let n = ctx.ranks.max(1);
        let fits = |k: u32| n % k == 0 && (n <= gpn || gpn % k == 0);
        (1..=gpn.min(n))
            .rev()
            .find(|&u| fits(u) && ctx.model.q_heads % u == 0)
            .unwrap_or(1)
    }

    /// The Ulysses degree for `batch` when none is given under `inner=ring`: the one whose
    /// rings are the longest that fit in one node (a divisor of the node's GPUs past one
    /// node), with the query heads divisible by the Ulysses degree that leaves and its
    /// all-to-alls within what a plan may list; [`Usp::default_degree`] when none is (12
    /// ranks of a 64-head model: no ring of 1, 2 or 4 leaves a divisor of 64). Regression
    /// (bug hunt): at 256 ranks it took 32 and the bundled trace's all-to-alls were refused,
    /// where the default placement planned.
    pub fn default_degree_ring_inside(ctx: &PlanContext<'_>, batch: &Batch) -> u32 {
        let gpn = ctx.hardware.gpus_per_node.max(1);
        let n = ctx.ranks.max(1);
        // The shards' ranges: every document cut into 2N pieces, the empty ones skipped.
        let ranges: u64 = batch
            .doc_lens
            .iter()
            .map(|&l| l.min(2 * u64::from(n)))
            .sum();
        (1..=gpn.min(n))
            .rev()
            .find(|&r| {
                n % r == 0
                    && (n <= gpn || gpn % r == 0)
                    && ctx.model.q_heads % (n / r) == 0
                    && head_all_to_all_ranges(ranges, n / r) <= MAX_PLAN_ITEMS
            })
            .map_or_else(|| Usp::default_degree(ctx), |r| n / r)
    }

    /// The entry as the user wrote it, with the degree it ran at: what refusals name.
    fn entry(self, u: u32) -> String {
        match self.inner {
            Inner::Ulysses => format!("usp:ulysses={u}"),
            Inner::Ring => format!("usp:inner=ring,ulysses={u}"),
        }
    }

    /// Physical rank of logical rank `(g, j)` (group `g`, position `j`) with `u` ranks a
    /// group and `r` groups.
    fn rank(self, g: u32, j: u32, u: u32, r: u32) -> u32 {
        match self.inner {
            Inner::Ulysses => g * u + j,
            Inner::Ring => j * r + g,
        }
    }
}

impl Planner for Usp {
    fn name(&self) -> &'static str {
        "usp"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        let mut p = ring_flash_params();
        if self.inner != Inner::default() {
            p.insert("inner".into(), self.inner.name().into());
        }
        // A degree given is a parameter like any other (bug hunt: without it, `usp:ulysses=2`
        // and `usp:ulysses=4` read as one scheme); the plan records the degree it resolved.
        if let Some(u) = self.ulysses {
            p.insert("ulysses".into(), u.into());
        }
        p
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let n = ctx.ranks;
        let hq = ctx.model.q_heads;
        let u = self.ulysses.unwrap_or_else(|| match self.inner {
            Inner::Ulysses => Usp::default_degree(ctx),
            Inner::Ring => Usp::default_degree_ring_inside(ctx, batch),
        });
        if n == 0 || u == 0 || n % u != 0 {
            return Err(PlanError::Planning(format!(
                "{} needs the ranks ({n}) to be a multiple of it",
                self.entry(u)
            )));
        }
        if hq % u != 0 {
            return Err(PlanError::Planning(format!(
                "{} needs q_heads ({hq}) divisible by it",
                self.entry(u)
            )));
        }
        let gqa = gqa_group("usp", ctx.model)?;
        let r = n / u;
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        b.param("ulysses", u.into()).param("ring", r.into());
        // A document's 2r chunks (one per group, and its mirror) are min(len, 2r) non-empty
        // ranges, and at most one group finds its two touching (all between them empty) and
        // holds them as one: each ring cuts it into at least min(len, 2r) − 1 pieces (a plain
        // zigzag ring, u = 1, is checked as `zigzag` is). The bound was min(len, 2r − 1),
        // which refused batches of 3-token documents that fit (bug hunt).
        check_rings_bound(&b, batch, r, u, |len| ring_pieces_at_least(len, u, r))?;
        // Physical rank p holds the pieces of the logical rank placed on it.
        let logical: Vec<usize> = {
            let mut l = vec![0; n as usize];
            for g in 0..r {
                for j in 0..u {
                    l[self.rank(g, j, u, r) as usize] = (g * u + j) as usize;
                }
            }
            l
        };
        let shards = assign_pieces(&mut b, batch, n, |len| {
            let z = zigzag_pieces(len, n);
            logical.iter().map(|&k| z[k].clone()).collect()
        });
        // The rings' hops need no count of their own: a hop lists a group's ranges, no more
        // than the tiles it feeds, bounded above as for `ring` and `zigzag`.
        check_head_all_to_alls(&self.entry(u), &shards, u)?;
        // What each group's ranks compute: its tokens (each rank for its head group).
        let mut unions: Vec<Vec<TokenRange>> = Vec::with_capacity(r as usize);
        for g in 0..r {
            let members: Vec<u32> = (0..u).map(|j| self.rank(g, j, u, r)).collect();
            let all: Vec<TokenRange> = members
                .iter()
                .flat_map(|&k| shards[k as usize].iter().copied())
                .collect();
            // Gathered, a group's pieces that meet are one buffer (one zigzag ring keeps its
            // two pieces apart, as ring-flash-attention's does).
            let union = if u > 1 { merge_ranges(&all) } else { all };
            unions.push(union);
            // One all-to-all of each kind per group: ids 3g, 3g + 1, 3g + 2.
            head_all_to_all(&mut b, &members, &shards, (hq, gqa), 3 * g, r);
        }
        for j in 0..u {
            let q = head_group(hq, u, j);
            let heads = RingHeads {
                q,
                kv: kv_group(q, gqa),
            };
            let ring: Vec<u32> = (0..r).map(|g| self.rank(g, j, u, r)).collect();
            ring_pass_heads(&mut b, &ring, |g| &unions[g], (u > 1).then_some(heads))?;
        }
        Ok(b.finish())
    }
}

/// The fewest pieces a ring of `usp` with Ulysses degree `u` and `r` groups cuts a document of
/// `len` tokens into (the up-front tile bound, [`Planner::plan`]).
fn ring_pieces_at_least(len: u64, u: u32, r: u32) -> u64 {
    match u {
        1 => len.min(u64::from(r)),
        _ => len.min(2 * u64::from(r)).saturating_sub(1).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{summarize, Mask};
    use crate::planners::testing::{assert_plans_verify, with_ctx};
    use crate::planners::Zigzag;

    #[test]
    fn usp_plans_verify_structurally_and_numerically() {
        let batches: &[&[u64]] = &[&[1], &[2000], &[1, 3, 16, 31, 100, 257]];
        for u in [1, 2, 4, 8] {
            let usp = Usp {
                ulysses: Some(u),
                ..Usp::default()
            };
            let ranks: Vec<u32> = [1, 2, 4, 8, 16]
                .into_iter()
                .filter(|n| n % u == 0)
                .collect();
            assert_plans_verify(&usp, &ranks, batches);
        }
        assert_plans_verify(&Usp::default(), &[1, 2, 3, 4, 6, 8, 16], batches);
    }

    /// `ulysses=1` is a zigzag ring: the same layout, tiles and K/V hops.
    #[test]
    fn one_rank_per_group_is_zigzag() {
        let batch = Batch::new(0, vec![4096, 300, 17, 1]);
        for n in [1, 2, 4, 8] {
            let (usp, zz) = with_ctx(n, Mask::Causal, |ctx| {
                let usp = Usp {
                    ulysses: Some(1),
                    ..Usp::default()
                }
                .plan(&batch, ctx)
                .unwrap();
                (usp, Zigzag.plan(&batch, ctx).unwrap())
            });
            assert_eq!(usp.ranks, zz.ranks, "N={n}");
            assert_eq!(usp.transfers, zz.transfers, "N={n}");
        }
    }

    /// The default degree keeps the all-to-alls in a node: 8 on an 8-GPU node at 16 and 64
    /// ranks, the largest divisor of both the ranks and the 64 query heads below that.
    #[test]
    fn the_default_degree_fills_a_node() {
        for (n, u) in [
            (1, 1),
            (2, 2),
            (3, 1),
            (6, 2),
            (8, 8),
            (12, 4),
            (16, 8),
            (64, 8),
        ] {
            let got = with_ctx(n, Mask::Causal, Usp::default_degree);
            assert_eq!(got, u, "N={n}");
        }
    }

    /// Every rank does the same causal work (zigzag across groups, heads within), and a ring
    /// hop carries one head group's K/V: 1/u of what a zigzag hop of the same tokens does.
    #[test]
    fn work_is_even_and_hops_carry_one_head_group() {
        let batch = Batch::new(0, vec![16 * 512, 16 * 64]);
        let (plan, m) = with_ctx(16, Mask::Causal, |ctx| {
            (Usp::default().plan(&batch, ctx).unwrap(), ctx.model.clone())
        });
        assert_eq!(plan.scheme.params["ulysses"], 8);
        assert_eq!(plan.scheme.params["ring"], 2);
        let s = summarize(&plan, &m);
        let flops: Vec<f64> = s.per_rank.iter().map(|r| r.flops).collect();
        assert!(flops.iter().all(|&f| f == flops[0]), "{flops:?}");
        let hops: Vec<_> = plan
            .transfers
            .iter()
            .filter(|t| t.collective.is_none())
            .collect();
        // Two rings' worth of hops per head group: r − 1 = 1 step, 2 members, 8 groups.
        assert_eq!(hops.len(), 16);
        for t in hops {
            let h = t.heads.unwrap();
            assert_eq!(h.end - h.start, 8, "one K/V head of 8 query heads");
            assert_eq!(t.src % 8, t.dst % 8, "a ring links the same head group");
        }
    }

    /// Every head group runs its own ring, so the tiles to refuse are u rings' worth, counted
    /// before the batch is cut: 2,100 documents of 64 tokens at 256 ranks are 4.2 million
    /// tiles a ring, 34 million over the 8 rings.
    #[test]
    fn every_ring_s_tiles_are_counted_up_front() {
        let batch = Batch::new(0, vec![64; 2100]);
        let err = with_ctx(256, Mask::Causal, |ctx| Usp::default().plan(&batch, ctx))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("needs at least 33868800 attention tiles in 8 rings (one per head group) of 32 ranks"),
            "{err}"
        );
    }

    /// Regression (bug hunt): the up-front bound said 3-token documents take 3 pieces a ring
    /// at u = 2, r = 2 and refused a batch of them that fit; they take 2. The bound never
    /// exceeds the pieces a ring really has (its causal tiles are p(p + 1)/2).
    #[test]
    fn the_up_front_piece_bound_is_a_lower_bound() {
        for (u, n) in [
            (1, 1),
            (1, 4),
            (2, 2),
            (2, 4),
            (2, 8),
            (4, 8),
            (4, 16),
            (8, 16),
        ] {
            for len in 1..=40u64 {
                let batch = Batch::new(0, vec![len]);
                let plan = with_ctx(n, Mask::Causal, |ctx| {
                    Usp {
                        ulysses: Some(u),
                        ..Usp::default()
                    }
                    .plan(&batch, ctx)
                    .unwrap()
                });
                // Ring 0: the ranks at position 0 of each group.
                let tiles: usize = (0..n / u)
                    .flat_map(|g| &plan.ranks[(g * u) as usize].steps)
                    .map(|s| s.tasks.len())
                    .sum();
                let p = ring_pieces_at_least(len, u, n / u) as usize;
                assert!(
                    p * (p + 1) / 2 <= tiles,
                    "u={u} N={n} len={len}: {p} pieces, {tiles} tiles"
                );
                if (u, n, len) == (2, 4, 3) {
                    assert_eq!((p, tiles), (2, 3));
                }
            }
        }
    }

    /// Regression (bug hunt): `usp:ulysses=64` at 128 ranks listed 49 million token ranges in
    /// its all-to-alls (a 768 MB plan); they are counted before any is listed.
    #[test]
    fn oversized_all_to_alls_are_refused_up_front() {
        let batch = Batch::new(0, vec![300; 2000]);
        let err = with_ctx(128, Mask::Causal, |ctx| {
            Usp {
                ulysses: Some(64),
                ..Usp::default()
            }
            .plan(&batch, ctx)
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "usp:ulysses=64 on 128 ranks lists 96768000 token ranges in its all-to-alls"
            ),
            "{err}"
        );
    }

    /// Regression (bug hunt): past one node the default degree must divide the node's GPUs,
    /// or a group straddles two nodes: a 40-head model at 20 ranks took 5, not 4.
    #[test]
    fn the_default_degree_keeps_groups_inside_nodes() {
        let hardware = crate::hardware::Hardware::load("h100").unwrap();
        for (q_heads, n, u) in [
            (40, 20, 4),
            (40, 4, 4),
            (40, 5, 5),
            (24, 12, 4),
            (12, 12, 4),
            (24, 6, 6),
        ] {
            let model = crate::model::Model {
                q_heads,
                kv_heads: 8.min(q_heads),
                ..crate::model::Model::load("llama3-8b").unwrap()
            };
            let ctx = PlanContext {
                ranks: n,
                tokens_per_rank: 1024,
                mask: Mask::Causal,
                model: &model,
                hardware: &hardware,
                judge: crate::planners::Judge::default(),
            };
            assert_eq!(Usp::default_degree(&ctx), u, "{q_heads} heads, N={n}");
        }
    }

    /// `inner=ring` renumbers the ranks: rings of consecutive ranks (each inside a node),
    /// all-to-alls across nodes. Every plan verifies, and each rank does the work of the
    /// logical rank placed on it in the default placement.
    #[test]
    fn ring_inside_keeps_the_hops_in_a_node_and_moves_only_the_numbering() {
        let ring_in = |u| Usp {
            ulysses: Some(u),
            inner: Inner::Ring,
        };
        let batches: &[&[u64]] = &[&[1], &[2000], &[1, 3, 16, 31, 100, 257]];
        for u in [1, 2, 4] {
            assert_plans_verify(&ring_in(u), &[4, 8, 16], batches);
        }
        assert_plans_verify(
            &Usp {
                inner: Inner::Ring,
                ..Usp::default()
            },
            &[1, 2, 3, 4, 8, 16, 32],
            batches,
        );
        let batch = Batch::new(0, vec![16 * 512, 16 * 64, 77]);
        // 32 ranks on 8-GPU nodes, u = 4: four rings of 8 ranks, one per node.
        let (inside, outside, m) = with_ctx(32, Mask::Causal, |ctx| {
            (
                ring_in(4).plan(&batch, ctx).unwrap(),
                Usp {
                    ulysses: Some(4),
                    ..Usp::default()
                }
                .plan(&batch, ctx)
                .unwrap(),
                ctx.model.clone(),
            )
        });
        assert_eq!(inside.scheme.params["inner"], "ring");
        assert!(!outside.scheme.params.contains_key("inner"));
        let node = |r: u32| r / 8;
        for t in &inside.transfers {
            let across = node(t.src) != node(t.dst);
            // Hops (no collective) stay in a node; the all-to-alls leave it.
            assert_eq!(across, t.collective.is_some(), "{t:?}");
        }
        assert!(outside
            .transfers
            .iter()
            .filter(|t| t.collective.is_some())
            .all(|t| node(t.src) == node(t.dst)));
        // Logical rank (g, j) is physical g·4 + j by default and j·8 + g inside.
        let (a, b) = (summarize(&inside, &m), summarize(&outside, &m));
        for g in 0..8u32 {
            for j in 0..4u32 {
                let (p, q) = ((j * 8 + g) as usize, (g * 4 + j) as usize);
                assert_eq!(a.per_rank[p].flops, b.per_rank[q].flops, "({g}, {j})");
            }
        }
    }

    /// `inner=ring`'s default degree: the longest ring that fits a node, so the rings ride
    /// NVLink, with the query heads divisible by the rest.
    #[test]
    fn the_ring_inside_default_fills_a_node_with_the_ring() {
        let small = Batch::new(0, vec![100; 10]);
        for (n, u) in [(1, 1), (8, 1), (16, 2), (64, 8), (12, 4), (256, 32)] {
            let got = with_ctx(n, Mask::Causal, |ctx| {
                Usp::default_degree_ring_inside(ctx, &small)
            });
            assert_eq!(got, u, "N={n}");
        }
        // 1,500 documents of 512 tokens at 256 ranks: 768,000 ranges, whose all-to-alls
        // among 32, 64, 128 or 256 ranks list more than a plan may hold; the default
        // placement's degree (8) lists 16 million.
        let many = Batch::new(0, vec![512; 1500]);
        let got = with_ctx(256, Mask::Causal, |ctx| {
            Usp::default_degree_ring_inside(ctx, &many)
        });
        assert_eq!(got, 8);
    }

    #[test]
    fn the_placement_is_a_parameter() {
        use crate::planners::planner_for;
        let e = planner_for("usp:inner=nic").err().unwrap().to_string();
        assert!(
            e.contains("`inner` must be ulysses or ring, not `nic`"),
            "{e}"
        );
        assert!(planner_for("usp:inner=ring,ulysses=2").is_ok());
        assert!(planner_for("usp:inner=ulysses").is_ok());
    }

    #[test]
    fn bad_degrees_are_refused_by_name() {
        let batch = Batch::new(0, vec![100]);
        let err = |u, n| {
            with_ctx(n, Mask::Causal, |ctx| {
                Usp {
                    ulysses: Some(u),
                    ..Usp::default()
                }
                .plan(&batch, ctx)
            })
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            err(3, 8),
            "usp:ulysses=3 needs the ranks (8) to be a multiple of it"
        );
        assert_eq!(
            err(128, 128),
            "usp:ulysses=128 needs q_heads (64) divisible by it"
        );
    }
}
