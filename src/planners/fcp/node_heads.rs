//! Head-parallel nodes (`fcp:node_heads`): FCP across nodes, Ulysses inside them.
//!
//! Cutting a long document into blocks for N ranks leaves every rank small query tiles — 2K
//! rows of a 222K-token document at 256 ranks — and the kernel runs those far below its
//! large-tile throughput (on the B200 profile a 2K causal backward tile runs at a quarter of a
//! 32K one). Splitting the *heads* inside a node instead of the rows keeps the tiles 8× longer
//! for the same memory: the 8 ranks of a node each compute all of the node's rows of a document
//! for one eighth of the heads (Ulysses' all-to-all, DeepSpeed Ulysses arXiv 2309.14509; the
//! two-level "Ulysses inside, ring across" layout of USP / LoongTrain, anchors-cp.md §3).
//!
//! The plan is made in two levels:
//!
//! 1. **Across nodes, FCP on virtual ranks.** Each node is one virtual rank with the node's
//!    token budget (gpus_per_node × the cap); FCP places blocks and schedules their K/V on
//!    those virtual ranks, exactly as it would on N / gpus_per_node GPUs.
//! 2. **Inside a node, heads.** Documents a node holds whole stay on one rank, all heads, run
//!    first (no traffic) while LPT can balance them among themselves ([`Shape::place_whole`]);
//!    those that do not fit are shared by heads with the rest. Every other row of the node is computed by all its ranks, rank j
//!    taking query heads `[j·H/g, (j+1)·H/g)`: its rows' Q and K/V heads arrive from their
//!    owners over NVLink before step 1 and the outputs go back after the last step that
//!    computes them. A virtual transfer between nodes becomes one transfer per rail — rank j
//!    of one node to rank j of the other, carrying head group j — so a node's imports spread
//!    over all its NICs.
//!
//! Balance inside a node is then exact for the head-split work (every rank does an eighth of
//! it) whatever the rows' sizes, and the token cap only decides where rows are stored, not
//! who computes them.

use crate::hardware::Pass;
use crate::plan::{
    allowed_pairs, Plan, PlanBuilder, PlanError, Task, TokenRange, Transfer, TransferKind,
    TransferTensor,
};
use crate::planners::shard::{head_group, kv_group};
use crate::planners::{PlanContext, Planner};
use crate::sim::{ComputeModel, PassSel};
use crate::trace::Batch;

use super::Fcp;

/// How far above an even share of its node's whole documents a rank may take them, as a
/// fraction of the node's mean rank load ([`Shape::place_whole`]): a document that does not
/// fit is shared by heads instead (in-node traffic over NVLink, against an idle rank for as
/// long as the excess lasts).
pub const SINGLE_SLACK: f64 = 0.02;

/// Plan `batch` with `fcp`'s switches across nodes and head-parallel ranks inside them.
pub fn plan(fcp: &Fcp, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
    let g = node_size(ctx, "fcp:node_heads")?;
    if fcp.reshuffle {
        return Err(PlanError::Planning(
            "fcp:node_heads does not combine with reshuffle".into(),
        ));
    }
    let cap = Fcp::cap(batch, ctx);
    let mut node_hw = ctx.hardware.clone();
    node_hw.gpus_per_node = 1;
    let node_ctx = PlanContext {
        ranks: ctx.ranks / g,
        tokens_per_rank: cap * u64::from(g),
        hardware: &node_hw,
        ..ctx.clone()
    };
    // Node-level switches are meaningless on virtual ranks that are nodes.
    let across = Fcp {
        node_heads: false,
        nodes: false,
        node_fill: false,
        relay: false,
        rebalance_in_node: false,
        ..*fcp
    };
    let dist = across.distribute(batch, &node_ctx)?;
    let nodes = across.build(batch, &node_ctx, &dist.assignment.owned, dist.cap, |_| {});
    expand(fcp, &nodes, batch, ctx, g, cap)
}

/// The ranks of a node, when head-parallel nodes apply to `ctx`: the ranks fill whole nodes
/// and the query heads divide over a node's ranks and over the K/V heads. Else an error that
/// says which, prefixed with `what` (the scheme and key that asked for them, so that `fcp`
/// and `hybrid` refuse the same groups with the same reason).
pub fn node_size(ctx: &PlanContext<'_>, what: &str) -> Result<u32, PlanError> {
    let g = ctx.hardware.gpus_per_node.clamp(1, ctx.ranks.max(1));
    let (hq, hk) = (ctx.model.q_heads, ctx.model.kv_heads);
    if ctx.ranks == 0 || ctx.ranks % g != 0 {
        return Err(PlanError::Planning(format!(
            "{what} needs whole nodes: {} ranks are not a multiple of {g} per node",
            ctx.ranks
        )));
    }
    if hq % g != 0 || hk == 0 || hq % hk != 0 {
        return Err(PlanError::Planning(format!(
            "{what} needs q_heads ({hq}) divisible by the {g} ranks of a node and by \
             kv_heads ({hk})"
        )));
    }
    Ok(g)
}

/// Turn a plan whose ranks are nodes into one whose ranks are GPUs (module doc, level 2).
fn expand(
    fcp: &Fcp,
    nodes: &Plan,
    batch: &Batch,
    ctx: &PlanContext<'_>,
    g: u32,
    cap: u64,
) -> Result<Plan, PlanError> {
    let cost_err = |e: crate::hardware::HardwareError| {
        PlanError::Planning(format!("fcp:node_heads: cost model: {e}"))
    };
    let profile = ctx.hardware.kernel_profile().map_err(cost_err)?;
    let mut cm = ComputeModel::new(ctx.hardware, &profile, ctx.model);
    let group = ctx.model.q_heads / ctx.model.kv_heads;
    let heads = |j: u32| head_group(ctx.model.q_heads, g, j);
    let lens = &batch.doc_lens;
    // The node holding each document, or None when it is cut across nodes.
    let mut home: Vec<Option<Option<u32>>> = vec![None; lens.len()];
    for vr in &nodes.ranks {
        for r in &vr.owned {
            let h = &mut home[r.doc as usize];
            *h = match *h {
                None => Some(Some(vr.rank)),
                Some(Some(n)) if n == vr.rank => Some(Some(n)),
                _ => Some(None),
            };
        }
    }
    let mut b = PlanBuilder::new(fcp.name(), fcp.params(), batch, ctx);
    b.memory_cap(cap);
    let mut single = vec![false; lens.len()];
    let mut singles_total = 0usize;
    for vr in &nodes.ranks {
        let base = vr.rank * g;
        // The node's work, as its virtual steps cost (forward + backward).
        let mut total = 0.0;
        for st in &vr.steps {
            for pass in [Pass::Fwd, Pass::Bwd] {
                total += cm.launch(nodes, &st.tasks, pass).map_err(cost_err)?.seconds;
            }
        }
        // Documents held whole here, heaviest first (ties: lower id).
        let mut whole: Vec<(f64, u32)> = Vec::new();
        for r in &vr.owned {
            let d = r.doc as usize;
            if home[d] == Some(Some(vr.rank)) && r.start == 0 && r.end == lens[d] && lens[d] <= cap
            {
                let mut w = 0.0;
                for pass in [Pass::Fwd, Pass::Bwd] {
                    w += cm
                        .whole_document(ctx.mask, lens[d], pass)
                        .map_err(cost_err)?
                        .seconds;
                }
                whole.push((w, r.doc));
            }
        }
        whole.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let node_tokens: u64 = vr.owned.iter().map(TokenRange::len).sum();
        let shape = Shape {
            g,
            cap,
            total,
            node_tokens,
            grad_secs_per_token: return_bytes_per_token(ctx) / (ctx.hardware.nvlink_gbs * 1e9),
        };
        let (ranks_of, mut tokens) = shape.place_whole(&whole, lens);
        for (&(_, d), j) in whole.iter().zip(ranks_of) {
            let Some(j) = j else { continue };
            single[d as usize] = true;
            singles_total += 1;
            let whole = TokenRange::new(d, 0, lens[d as usize]);
            b.own(base + j, whole);
            b.task(base + j, 0, whole, whole);
        }
        // Every other row of the node, stored wherever there is room (in order).
        let mut split_rows: Vec<Vec<TokenRange>> = vec![Vec::new(); g as usize];
        let mut j = 0usize;
        for r in vr.owned.iter().filter(|r| !single[r.doc as usize]) {
            let mut start = r.start;
            while start < r.end {
                while j < g as usize && tokens[j] >= cap {
                    j += 1;
                }
                let Some(&have) = tokens.get(j) else {
                    return Err(PlanError::Planning(format!(
                        "fcp:node_heads: node {} holds more than {g} × {cap} tokens",
                        vr.rank
                    )));
                };
                let end = r.end.min(start + (cap - have));
                let piece = TokenRange::new(r.doc, start, end);
                b.own(base + j as u32, piece);
                split_rows[j].push(piece);
                tokens[j] += end - start;
                start = end;
            }
        }
        // Head-split steps: virtual step s is step s + 1 on every rank of the node.
        let mut last_step = 0u32;
        for (s, st) in vr.steps.iter().enumerate() {
            let shared: Vec<Task> = st
                .tasks
                .iter()
                .filter(|t| !single[t.q.doc as usize])
                .copied()
                .collect();
            for t in merge_tiles(&mut cm, nodes, &shared, ctx.judge.pass).map_err(cost_err)? {
                for j in 0..g {
                    b.task_heads(base + j, s as u32 + 1, t.q, t.kv, Some(heads(j)));
                }
                last_step = s as u32 + 1;
            }
        }
        // In-node all-to-alls: Q and K/V heads to their computing ranks, outputs back.
        for (i, rows) in split_rows.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            for j in (0..g).filter(|&j| j as usize != i) {
                let p2p = |tensor, src, dst, h, issue_at, arrive_by| Transfer {
                    kind: TransferKind::P2p,
                    collective: None,
                    tensor,
                    src,
                    dst,
                    also_to: Vec::new(),
                    ranges: rows.clone(),
                    heads: Some(h),
                    issue_at,
                    arrive_by,
                    round: None,
                };
                let (owner, rank) = (base + i as u32, base + j);
                b.transfer(p2p(TransferTensor::Q, owner, rank, heads(j), 0, 1));
                let kv = kv_group(heads(j), group);
                b.transfer(p2p(TransferTensor::Kv, owner, rank, kv, 0, 1));
                let done = last_step + 1;
                b.transfer(p2p(TransferTensor::Out, rank, owner, heads(j), done, done));
            }
        }
    }
    // Between nodes, one transfer per rail: rank j to rank j, head group j.
    for t in &nodes.transfers {
        for j in 0..g {
            b.transfer(Transfer {
                src: t.src * g + j,
                dst: t.dst * g + j,
                also_to: t.also_to.iter().map(|d| d * g + j).collect(),
                heads: Some(kv_group(heads(j), group)),
                issue_at: t.issue_at + 1,
                arrive_by: t.arrive_by + 1,
                ..t.clone()
            });
        }
    }
    b.param("single_rank_documents", singles_total.into());
    // Its tiles were merged by the passes judged (`merge_tiles`): a plan says which (bug hunt:
    // `--pass fwd` planned other tiles and the plan did not say so).
    if ctx.judge.pass != crate::sim::PassSel::Both {
        b.param("objective_pass", ctx.judge.pass.name().into());
    }
    Ok(b.finish())
}

/// A step's tasks, with each document's tiles merged into one tile where together they are
/// exactly the mask's region of that tile — a run of query blocks against every key they see —
/// and the cost model prices the one tile below the launch of them all over `pass` (the
/// planning context's: a training step unless one pass is judged). In order of each
/// document's first task.
///
/// Why: FCP cuts the node's rows into blocks sized for balance across *nodes*, but inside a
/// node every rank runs all the node's rows of a document for its heads, so the blocks only
/// shrink the tiles. One 128K-token document on one B200 node ran as 36 tiles of 16K a rank
/// (8 diagonal ones, causal) where Ulysses runs one: 27.51 against 25.85 ms forward.
fn merge_tiles(
    cm: &mut ComputeModel<'_>,
    plan: &Plan,
    tasks: &[Task],
    pass: PassSel,
) -> Result<Vec<Task>, crate::hardware::HardwareError> {
    let mut docs: Vec<u32> = Vec::new();
    let mut of_doc: std::collections::BTreeMap<u32, Vec<Task>> = Default::default();
    for t in tasks {
        let group = of_doc.entry(t.q.doc).or_default();
        if group.is_empty() {
            docs.push(t.q.doc);
        }
        group.push(*t);
    }
    let mut out = Vec::with_capacity(tasks.len());
    for d in docs {
        let group = &of_doc[&d];
        if let Some(one) = merged(cm, plan, group, pass)? {
            out.push(one);
        } else {
            out.extend_from_slice(group);
        }
    }
    Ok(out)
}

/// The one tile that `group` (tasks of one document, all heads, disjoint as a valid plan's
/// are) covers exactly, if it exists and is cheaper over `pass`.
fn merged(
    cm: &mut ComputeModel<'_>,
    plan: &Plan,
    group: &[Task],
    pass: PassSel,
) -> Result<Option<Task>, crate::hardware::HardwareError> {
    if group.len() < 2 || group.iter().any(|t| t.heads.is_some()) {
        return Ok(None);
    }
    let doc = group[0].q.doc;
    let span = |r: fn(&Task) -> TokenRange| {
        let start = group.iter().map(|t| r(t).start).min().unwrap_or(0);
        let end = group.iter().map(|t| r(t).end).max().unwrap_or(0);
        TokenRange::new(doc, start, end)
    };
    let (q, kv) = (span(|t| t.q), span(|t| t.kv));
    let pairs =
        |q: TokenRange, kv: TokenRange| allowed_pairs(plan.mask, q.start, q.end, kv.start, kv.end);
    // Disjoint tiles inside the bounding one cover it exactly when their pairs add up to its.
    if group.iter().map(|t| pairs(t.q, t.kv)).sum::<u128>() != pairs(q, kv) {
        return Ok(None);
    }
    let (mut apart, mut one) = (0.0, 0.0);
    for &pass in pass.passes() {
        apart += cm.launch(plan, group, pass)?.seconds;
        one += cm.ranges(plan.mask, q, kv, 1.0, pass)?.seconds;
    }
    Ok((one < apart).then_some(Task { q, kv, heads: None }))
}

/// What [`Shape::place_whole`] needs to know about a node.
struct Shape {
    /// Ranks per node.
    g: u32,
    /// Token cap per rank.
    cap: u64,
    /// The node's work (seconds, forward + backward).
    total: f64,
    /// Tokens the node holds.
    node_tokens: u64,
    /// Seconds per head-split token that a rank's outputs and gradients take to go back to
    /// their owners over NVLink at the end of the passes (exposed: nothing is left to run).
    grad_secs_per_token: f64,
}

impl Shape {
    /// Which of the node's whole documents (weights, heaviest first) stay on one rank, and
    /// where. A rank ends with its whole documents plus an even share of the rest, so two
    /// LPT rules are tried under the token cap and the cheaper kept: *strict* — no document
    /// may take its rank more than [`SINGLE_SLACK`] of the node's mean rank load above an even
    /// share of the documents placed so far (balance first: heavy documents are shared by
    /// heads); *even* — no rank above an even share of the documents still expected on one
    /// rank plus the slack (traffic first: a batch of short documents keeps them all). The cost
    /// of a rule is the busiest rank's compute plus the return of its head-split outputs and
    /// gradients. Returns each document's rank (None: shared by heads) and the tokens each
    /// rank then holds.
    fn place_whole(&self, whole: &[(f64, u32)], lens: &[u64]) -> (Vec<Option<u32>>, Vec<u64>) {
        let g = f64::from(self.g);
        let slack = SINGLE_SLACK * self.total / g;
        let run = |strict: bool| {
            let mut load = vec![0.0f64; self.g as usize];
            let mut tokens = vec![0u64; self.g as usize];
            let mut expected: f64 = whole.iter().map(|w| w.0).sum();
            let mut placed = 0.0;
            let mut at = Vec::with_capacity(whole.len());
            for &(w, d) in whole {
                let len = lens[d as usize];
                let best = (0..self.g as usize)
                    .filter(|&j| tokens[j] + len <= self.cap)
                    .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)));
                let fits = |j: usize| {
                    if strict {
                        load[j] + w - (placed + w) / g <= slack
                    } else {
                        load[j] + w <= expected / g + slack
                    }
                };
                match best.filter(|&j| fits(j)) {
                    Some(j) => {
                        load[j] += w;
                        tokens[j] += len;
                        placed += w;
                        at.push(Some(j as u32));
                    }
                    None => {
                        expected -= w;
                        at.push(None);
                    }
                }
            }
            let single_tokens: u64 = tokens.iter().sum();
            let shared = (self.node_tokens - single_tokens) as f64 / g;
            let busiest = load.iter().copied().fold(0.0, f64::max);
            let cost = busiest
                + (self.total - placed) / g
                + shared * (g - 1.0) / g * self.grad_secs_per_token;
            (cost, at, tokens)
        };
        let (strict, even) = (run(true), run(false));
        let best = if even.0 < strict.0 { even } else { strict };
        (best.1, best.2)
    }
}

/// Bytes per head-split token a computing rank returns to the owner in both passes: the
/// output and its fp32 log-sum-exp forward, dQ and dK/dV backward.
fn return_bytes_per_token(ctx: &PlanContext<'_>) -> f64 {
    let m = ctx.model;
    let (d, b) = (f64::from(m.head_dim), f64::from(m.dtype_bytes));
    let q = f64::from(m.q_heads) * d * b;
    q + 4.0 * f64::from(m.q_heads) + q + 2.0 * f64::from(m.kv_heads) * d * b
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::hardware::Hardware;
    use crate::model::Model;
    use crate::planners::fcp::tests::first_batch;
    use crate::planners::testing::assert_valid;
    use crate::planners::SchemeSpec;
    use crate::sim::{PassSel, Simulator};

    fn plan_on(hw: &str, ranks: u32, batch: &Batch, spec: &str) -> Result<Plan, PlanError> {
        let model = Model::load("llama3-70b").unwrap();
        let hardware = Hardware::load(hw).unwrap();
        let ctx = PlanContext {
            ranks,
            tokens_per_rank: 32768,
            mask: crate::plan::Mask::Causal,
            model: &model,
            hardware: &hardware,
            judge: crate::planners::Judge::default(),
        };
        Fcp::from_spec(&SchemeSpec::parse(spec).unwrap())
            .unwrap()
            .plan(batch, &ctx)
    }

    /// A rank's head-split tiles: (step, queries, keys), heads dropped.
    type Tiles = BTreeSet<(u32, TokenRange, TokenRange)>;

    /// Every rank's head-split tasks with their heads dropped, and the heads it computes.
    fn split_work(plan: &Plan, rank: usize) -> (Tiles, BTreeSet<(u32, u32)>) {
        let mut tasks = BTreeSet::new();
        let mut heads = BTreeSet::new();
        for (s, st) in plan.ranks[rank].steps.iter().enumerate() {
            for t in &st.tasks {
                if let Some(h) = t.heads {
                    tasks.insert((s as u32, t.q, t.kv));
                    heads.insert((h.start, h.end));
                }
            }
        }
        (tasks, heads)
    }

    #[test]
    fn every_rank_of_a_node_runs_the_node_s_rows_for_its_own_heads() {
        // magi at 64 ranks: 8 nodes; a node's ranks run the same head-split tiles, rank j
        // for query heads [8j, 8j + 8), so they split that work exactly evenly.
        let batch = first_batch("magi", 4000, 64);
        let plan = plan_on("h100", 64, &batch, "fcp:node_heads=true,block=8192").unwrap();
        assert_valid(&plan);
        assert_eq!(plan.scheme.params["node_heads"], true);
        for node in 0..8 {
            let first = split_work(&plan, node * 8).0;
            assert!(!first.is_empty(), "node {node} splits no heads");
            for j in 0..8 {
                let (tasks, heads) = split_work(&plan, node * 8 + j);
                assert_eq!(tasks, first, "rank {}", node * 8 + j);
                assert_eq!(heads, BTreeSet::from([(8 * j as u32, 8 * j as u32 + 8)]));
            }
        }
        for r in &plan.ranks {
            assert!(r.owned.iter().map(TokenRange::len).sum::<u64>() <= 32768);
        }
    }

    #[test]
    fn transfers_between_nodes_stay_on_their_rail() {
        // A K/V transfer between nodes goes from rank j of one node to rank j of the other
        // and carries head group j: a node's imports spread over all of its NICs.
        let batch = first_batch("pile", 4000, 64);
        let plan = plan_on("b200", 64, &batch, "fcp:node_heads=true,block=4096").unwrap();
        assert_valid(&plan);
        let cross: Vec<_> = plan
            .transfers
            .iter()
            .filter(|t| t.src / 8 != t.dst / 8)
            .collect();
        assert!(!cross.is_empty());
        for t in cross {
            assert_eq!(t.src % 8, t.dst % 8);
            let j = t.src % 8;
            assert_eq!(t.heads.map(|h| (h.start, h.end)), Some((8 * j, 8 * j + 8)));
            assert_eq!(t.tensor, TransferTensor::Kv);
        }
    }

    #[test]
    fn light_documents_a_node_holds_whole_stay_on_one_rank() {
        // lognormal documents (≤ 8K) are all light and held whole by their node: most sit on
        // one rank with all heads, in one task, and never move. (The last ones LPT cannot fit
        // under a rank's share of the node — the batch fills its token budget, so the ranks
        // with room are the loaded ones — are shared by heads instead.)
        let batch = first_batch("lognormal", 3000, 16);
        let plan = plan_on("h100", 16, &batch, "fcp:node_heads=true,whole=8192").unwrap();
        assert_valid(&plan);
        let singles = plan.scheme.params["single_rank_documents"]
            .as_u64()
            .unwrap();
        assert!(
            singles as usize * 2 >= batch.doc_lens.len(),
            "{singles} of {}",
            batch.doc_lens.len()
        );
        let moved: BTreeSet<u32> = plan
            .transfers
            .iter()
            .flat_map(|t| t.ranges.iter().map(|r| r.doc))
            .collect();
        for r in &plan.ranks {
            for t in r.steps.iter().flat_map(|s| &s.tasks) {
                if t.heads.is_none() {
                    assert!(!moved.contains(&t.q.doc));
                    assert_eq!(t.q.len(), batch.doc_lens[t.q.doc as usize]);
                }
            }
        }
    }

    #[test]
    fn heads_that_do_not_divide_over_a_node_are_refused_by_name() {
        let batch = Batch::new(0, vec![1000, 3000]);
        let err = plan_on("h100", 12, &batch, "fcp:node_heads=true").unwrap_err();
        assert!(
            err.to_string().contains("12 ranks are not a multiple of 8"),
            "{err}"
        );
        let err = plan_on("h100", 6, &batch, "fcp:node_heads=true").unwrap_err();
        assert!(
            err.to_string().contains("divisible by the 6 ranks"),
            "{err}"
        );
        let err = plan_on("h100", 16, &batch, "fcp:node_heads=true,reshuffle=true").unwrap_err();
        assert!(err.to_string().contains("reshuffle"), "{err}");
    }

    #[test]
    fn longer_tiles_cost_less_compute_than_fcp_s_blocks() {
        // pile at 64 ranks on the B200 profile, whose small tiles are slow. A node's blocks
        // may be 8× a rank's for the same balance (a node's share is 8× a rank's), and shared
        // by heads they run as 8× longer tiles: the mean rank compute falls.
        let batch = first_batch("pile", 4000, 64);
        let model = Model::load("llama3-70b").unwrap();
        let hw = Hardware::load("b200").unwrap();
        let sim = Simulator::new(hw, model).unwrap();
        let mean = |spec: &str| {
            let plan = plan_on("b200", 64, &batch, spec).unwrap();
            sim.simulate(&plan, PassSel::Both)
                .unwrap()
                .metrics
                .mean_compute_ms
        };
        let fcp = mean("fcp:block=2048");
        let heads = mean("fcp:block=16384,node_heads=true");
        assert!(heads < 0.95 * fcp, "{heads} vs {fcp}");
    }

    #[test]
    fn a_lone_document_on_one_node_runs_as_one_tile_a_rank() {
        // One 256K-token document filling one B200 node: every rank runs all of it for its
        // heads. Its 32K blocks used to stay 36 tiles a rank (8 of them diagonal) where
        // Ulysses runs one causal tile: 108.58 against 102.31 ms forward. Merged, the rank's
        // head-split step is the one tile, within 1 % of Ulysses (a launch and a step more).
        let batch = Batch::new(0, vec![262144]);
        let plan = plan_on("b200", 8, &batch, "fcp:block=32768,node_heads=true").unwrap();
        assert_valid(&plan);
        for r in 0..8 {
            let (tiles, _) = split_work(&plan, r);
            let whole = TokenRange::new(0, 0, 262144);
            assert_eq!(
                tiles.into_iter().collect::<Vec<_>>(),
                vec![(1, whole, whole)]
            );
        }
        let model = Model::load("llama3-70b").unwrap();
        let sim = Simulator::new(Hardware::load("b200").unwrap(), model).unwrap();
        let time = |plan: &Plan| {
            sim.simulate(plan, PassSel::Fwd)
                .unwrap()
                .metrics
                .attention_time_ms
        };
        let ulysses = crate::planners::planner_for("ulysses")
            .unwrap()
            .plan(
                &batch,
                &PlanContext {
                    ranks: 8,
                    tokens_per_rank: 32768,
                    mask: crate::plan::Mask::Causal,
                    model: &Model::load("llama3-70b").unwrap(),
                    hardware: &Hardware::load("b200").unwrap(),
                    judge: crate::planners::Judge::default(),
                },
            )
            .unwrap();
        let (heads, ulysses) = (time(&plan), time(&ulysses));
        assert!(heads < 1.01 * ulysses, "{heads} vs {ulysses}");
    }

    /// Tiles are merged by the passes judged, so `--pass fwd` can plan other tiles: the plan
    /// says so (bug hunt: both plans carried the same parameters).
    #[test]
    fn a_plan_merged_for_one_pass_records_it() {
        let batch = Batch::new(0, vec![262144]);
        let (model, hw) = (
            Model::load("llama3-70b").unwrap(),
            Hardware::load("b200").unwrap(),
        );
        let planned = |pass| {
            let ctx = PlanContext {
                ranks: 8,
                tokens_per_rank: 32768,
                mask: crate::plan::Mask::Causal,
                model: &model,
                hardware: &hw,
                judge: crate::planners::Judge {
                    pass,
                    ..Default::default()
                },
            };
            let spec = SchemeSpec::parse("fcp:block=32768,node_heads=true").unwrap();
            Fcp::from_spec(&spec).unwrap().plan(&batch, &ctx).unwrap()
        };
        let fwd = planned(PassSel::Fwd);
        assert_eq!(fwd.scheme.params["objective_pass"], "fwd");
        let both = planned(PassSel::Both);
        assert!(!both.scheme.params.contains_key("objective_pass"));
    }

    #[test]
    fn tiles_across_steps_or_not_one_tile_stay_apart() {
        // Merging needs the tiles to be exactly one tile's region: two query blocks of a
        // causal document against their own keys only (no off-diagonal) are not.
        let model = Model::load("llama3-70b").unwrap();
        let hw = Hardware::load("b200").unwrap();
        let profile = hw.kernel_profile().unwrap();
        let mut cm = ComputeModel::new(&hw, &profile, &model);
        let batch = Batch::new(0, vec![65536]);
        let plan = plan_on("b200", 8, &batch, "fcp:node_heads=true").unwrap();
        let r = |a, b| TokenRange::new(0, a, b);
        let t = |q, kv| Task { q, kv, heads: None };
        let diagonals = [
            t(r(0, 32768), r(0, 32768)),
            t(r(32768, 65536), r(32768, 65536)),
        ];
        assert_eq!(
            merge_tiles(&mut cm, &plan, &diagonals, PassSel::Both).unwrap(),
            diagonals
        );
        let square = [t(r(32768, 65536), r(0, 32768)), diagonals[0], diagonals[1]];
        assert_eq!(
            merge_tiles(&mut cm, &plan, &square, PassSel::Both).unwrap(),
            vec![t(r(0, 65536), r(0, 65536))]
        );
    }
}
