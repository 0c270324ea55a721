//! `fcp`: flexible context parallelism — fixed-size blocks placed anywhere by LPT, moved
//! point-to-point in congestion-free, pipelined, coalesced stages.
//!
//! Source: the FCP paper (seeds/000, §4.1 block distributor, §4.2 communication planner).
//! Everything the paper leaves open is decided and explained in `docs/schemes/fcp.md`.
//!
//! * [`blocks`]: documents → blocks (fixed `block` tokens; short documents packed, varlen;
//!   zig-zag pairs in causal documents) → units weighed by f(B) from the shared cost model.
//! * [`lpt`]: heaviest unit first to the least-loaded rank with room under the token cap.
//! * [`schedule`]: transfer graph → Δ congestion-free sub-stages → coalesced, pipelined steps.
//!
//! * the transparent reshuffler (§4.3, `reshuffle`): the plan starts from the user's layout
//!   ([`user_layout`], recorded as `Plan::input_layout`) and returns outputs to it, with two
//!   all-to-alls overlapped by local work run first and last ([`schedule`]).

use std::collections::BTreeMap;

use crate::plan::{Mask, Plan, PlanBuilder, PlanError, TokenRange};
use crate::trace::Batch;

use super::{
    limit_json, param_bool, param_non_negative, param_positive, rebalance, repair, shard,
    PlanContext, Planner, SchemeError, SchemeSpec, MAX_PLAN_ITEMS,
};

pub mod blocks;
pub mod lpt;
pub mod node_heads;
pub mod node_lpt;
pub mod schedule;

pub use lpt::Assignment;
pub use schedule::Schedule;

/// Default block size in tokens (the paper's 4K, §6.1).
pub const DEFAULT_BLOCK: u64 = 4096;
/// Default coalesce degree (the paper's 16, §6.1).
pub const DEFAULT_COALESCE: u32 = 16;
/// Default `pair_limit`: a zig-zag pair heavier than a quarter of the mean rank load is
/// assigned as two blocks (measured in `tests/fcp_imbalance.rs`; see `docs/schemes/fcp.md`).
pub const DEFAULT_PAIR_LIMIT: f64 = 0.25;

/// Default `affinity`: a unit stays on the rank holding it in the user's layout when that costs
/// at most 2% of the mean rank load (measured in `docs/results/fcp.md`).
pub const DEFAULT_AFFINITY: f64 = 0.02;

/// Parameter names `fcp:key=value` accepts.
pub const PARAMS: [&str; 21] = [
    "affinity",
    "block",
    "coalesce",
    "coalescer",
    "comm_aware",
    "fill",
    "lookahead",
    "node_fill",
    "node_heads",
    "nodes",
    "pair_limit",
    "pipeline",
    "rebalance",
    "rebalance_in_node",
    "rebalance_pairs",
    "relay",
    "repair",
    "split_limit",
    "reshuffle",
    "solver",
    "whole",
];

/// The FCP planner and its switches (`fcp:block=2048,coalesce=8,pipeline=false,...`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fcp {
    /// Block size in tokens (`block`, ≥ 1).
    pub block: u64,
    /// Zig-zag pairs weighing more than this fraction of the mean rank load are assigned as
    /// two separate blocks (`pair_limit`, ≥ 0; 0 never pairs, `inf` always pairs): a pair keeps
    /// a causal block's compute and communication in step, but a unit near a rank's whole
    /// share leaves LPT too coarse to balance.
    pub pair_limit: f64,
    /// Sub-stages per stage (`coalesce`, ≥ 1).
    pub coalesce: u32,
    /// Coalescer on (`coalescer`); off is the same as `coalesce=1` (`--no-coalesce`).
    pub coalescer: bool,
    /// Block-level pipelining on (`pipeline`; off is `--no-pipeline`).
    pub pipeline: bool,
    /// With `pipeline`, first-hop transfers leave this many steps before their stage
    /// (`lookahead`; 0, the default, is the paper's pipeline; [`schedule::Options::lookahead`]).
    pub lookahead: u32,
    /// Congestion-free solver on (`solver`; off is `--no-solver`).
    pub solver: bool,
    /// Balance K/V traffic as well as compute (`comm_aware`; see [`lpt::Options::comm_aware`]).
    pub comm_aware: bool,
    /// Reshuffler affinity (`affinity`, ≥ 0, fraction of the mean rank load): see
    /// [`lpt::Options::affinity`]. Only used with the reshuffler.
    pub affinity: f64,
    /// Transparent reshuffler on (`reshuffle`, `--reshuffle`; `--no-reshuffle` is the
    /// default): the plan starts from the user's layout (contiguous tokens per rank) and
    /// returns outputs to it (§4.3). Off by default so that FCP, like every other scheme, is
    /// fed its own layout by the data loader: comparisons are like for like, and a user whose
    /// framework cannot lay tokens out per plan turns it on and sees what it costs.
    pub reshuffle: bool,
    /// Traffic repair after LPT (`repair`): a local search that evens out K/V traffic within
    /// the cap and a 1% compute slack ([`crate::planners::repair`]); FCP's claim is that both
    /// compute and traffic are balanced (seed 000 §6.2).
    pub repair: bool,
    /// Documents of at most this many tokens stay whole on one rank, never cut or moved
    /// (`whole`; 0 or ≤ `block` = FCP's own rule, only documents up to a block).
    pub whole: u64,
    /// Node-level K/V relay (`relay`; off by default, as in the paper's flat P2P): a chunk
    /// wanted by several ranks of another node crosses the NICs once and is forwarded over
    /// NVLink inside the node ([`schedule::Options::relay`]).
    pub relay: bool,
    /// A one-block unit weighing more than this fraction of the mean rank load is halved,
    /// repeatedly, down to [`MIN_SPLIT_TOKENS`] (`split_limit`, ≥ 0; `inf`, the default, never
    /// splits: the paper's fixed blocks). See [`blocks::split_heavy_blocks`].
    pub split_limit: f64,
    /// Compute rebalance after LPT (`rebalance`; off by default, the paper's greedy alone):
    /// moves and equal-size swaps that lower the busiest rank's compute under the token cap
    /// ([`crate::planners::rebalance`]).
    pub rebalance: bool,
    /// The rebalance also tries two items for one and one for two (`rebalance_pairs`):
    /// more exchanges where no two items share a size ([`rebalance::Options::pairs`]).
    pub rebalance_pairs: bool,
    /// The rebalance keeps every item of a cut document on its node (`rebalance_in_node`;
    /// only with `nodes` on a multi-node group): moved to another node such an item pulls its
    /// document's K/V over the NICs, undoing what node-grouped placement saved, while an item
    /// of whole documents moves no data wherever it goes. Single-item exchanges then try every
    /// rank as a partner, not only the 16 least loaded ([`rebalance::Options::node`]).
    pub rebalance_in_node: bool,
    /// Node-grouped placement (`nodes`; off by default, the paper's flat LPT): a cut
    /// document's units go to one node while they weigh at most half a node's share, then LPT
    /// places each node's units on its ranks ([`node_lpt`]), so their K/V stays on NVLink.
    pub nodes: bool,
    /// With `nodes`, runs of documents heavier than a node segment are placed so that every
    /// node ends at its target load once its remaining room is filled with short documents
    /// (`node_fill`; [`node_lpt`]'s module doc).
    pub node_fill: bool,
    /// LPT is also run with the fill rule and the assignment whose busiest rank is lighter
    /// kept (`fill`; off by default, the paper's LPT): a rank that takes a dense document
    /// must fill the rest of its room with light ones ([`lpt::Options::fill`]).
    pub fill: bool,
    /// Head-parallel nodes (`node_heads`; off by default): FCP places and schedules blocks
    /// across nodes as if each node were one GPU, and the ranks of a node split the heads of
    /// the node's rows instead of the rows ([`node_heads`]) — tiles 8× longer for the same
    /// memory, K/V spread over every NIC of the node.
    pub node_heads: bool,
}

/// Smallest piece [`Fcp::split_limit`] cuts a block into: 256 query rows still fill the GPU
/// (64 heads × two 128-row tiles) when the keys are a long prefix.
pub const MIN_SPLIT_TOKENS: u64 = 256;

impl Default for Fcp {
    fn default() -> Self {
        Fcp {
            block: DEFAULT_BLOCK,
            pair_limit: DEFAULT_PAIR_LIMIT,
            coalesce: DEFAULT_COALESCE,
            coalescer: true,
            pipeline: true,
            lookahead: 0,
            solver: true,
            comm_aware: true,
            affinity: DEFAULT_AFFINITY,
            reshuffle: false,
            repair: true,
            whole: 0,
            relay: false,
            split_limit: f64::INFINITY,
            rebalance: false,
            rebalance_pairs: false,
            rebalance_in_node: false,
            nodes: false,
            node_fill: false,
            fill: false,
            node_heads: false,
        }
    }
}

/// What the block distributor decided, for reports and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    /// Per-rank token cap applied.
    pub cap: u64,
    /// Zig-zag pairs heavier than `pair_limit` × the mean rank load, assigned as two blocks.
    pub broken_pairs: usize,
    /// Halvings of blocks heavier than `split_limit` × the mean rank load.
    pub heavy_splits: usize,
    /// Units (blocks or zig-zag pairs) distributed.
    pub units: usize,
    /// f of the heaviest unit (seconds, forward + backward): no rank can carry less, so
    /// `(max(heaviest, mean) − mean) / max(heaviest, mean)` bounds the achievable imbalance.
    pub heaviest_unit: f64,
    /// Where every chunk went and the resulting f-loads.
    pub assignment: Assignment,
    /// The units themselves, weighed, in the order LPT received them (the ILP cross-check
    /// assigns the same units).
    pub unit_list: Vec<blocks::Unit>,
}

impl Fcp {
    /// Parse `key=value` parameters of a scheme entry.
    pub fn from_spec(spec: &SchemeSpec) -> Result<Fcp, SchemeError> {
        let bad = |message: String| SchemeError::BadParam {
            scheme: spec.name.clone(),
            message,
        };
        let name = spec.name.as_str();
        let boolean = |k: &str, v: &str| param_bool(name, k, v);
        let positive = |k: &str, v: &str| param_positive(name, k, v);
        let mut f = Fcp::default();
        for (k, v) in &spec.params {
            match k.as_str() {
                "block" => f.block = positive(k, v)?,
                "coalesce" => {
                    f.coalesce = u32::try_from(positive(k, v)?)
                        .map_err(|_| bad(format!("`coalesce` {v} is too large")))?
                }
                "coalescer" => f.coalescer = boolean(k, v)?,
                "pair_limit" => f.pair_limit = param_non_negative(name, k, v, false)?,
                "pipeline" => f.pipeline = boolean(k, v)?,
                "lookahead" => {
                    f.lookahead = v.parse().map_err(|_| {
                        bad(format!("`lookahead` must be an integer ≥ 0, not `{v}`"))
                    })?
                }
                "solver" => f.solver = boolean(k, v)?,
                "reshuffle" => f.reshuffle = boolean(k, v)?,
                "repair" => f.repair = boolean(k, v)?,
                "relay" => f.relay = boolean(k, v)?,
                "rebalance" => f.rebalance = boolean(k, v)?,
                "rebalance_pairs" => f.rebalance_pairs = boolean(k, v)?,
                "rebalance_in_node" => f.rebalance_in_node = boolean(k, v)?,
                "nodes" => f.nodes = boolean(k, v)?,
                "node_fill" => f.node_fill = boolean(k, v)?,
                "fill" => f.fill = boolean(k, v)?,
                "node_heads" => f.node_heads = boolean(k, v)?,
                "split_limit" => f.split_limit = param_non_negative(name, k, v, false)?,
                "whole" => {
                    f.whole = v
                        .parse::<u64>()
                        .map_err(|_| bad(format!("`whole` must be an integer ≥ 0, not `{v}`")))?
                }
                "comm_aware" => f.comm_aware = boolean(k, v)?,
                "affinity" => f.affinity = param_non_negative(name, k, v, true)?,
                _ => return Err(SchemeError::not_taken(name, k, &PARAMS)),
            }
        }
        Ok(f)
    }

    /// Sub-stages merged per stage, after the `coalescer` switch.
    pub fn coalesce_degree(&self) -> u32 {
        if self.coalescer {
            self.coalesce
        } else {
            1
        }
    }

    /// The per-rank token cap for `batch`: `ctx.tokens_per_rank`, which every batch packed for
    /// this group (`--pack budget`: at most N × T tokens) fits. A batch larger than N × T (not
    /// packed for the group) gets the tightest even cap ⌈tokens / N⌉ instead of an error.
    pub fn cap(batch: &Batch, ctx: &PlanContext<'_>) -> u64 {
        ctx.tokens_per_rank
            .max(batch.tokens().div_ceil(u64::from(ctx.ranks.max(1))))
    }

    /// Refuse, before any work, a block size that cuts the batch into more block pairs than
    /// a plan may hold: every pair the mask allows is one task ([`MAX_PLAN_ITEMS`]). A
    /// `block=1` on 32K tokens used to plan for over a minute and 8 GB before anything said
    /// the block was absurd. Documents kept whole (up to `whole` tokens) are one block.
    fn check_block_pairs(&self, batch: &Batch, mask: Mask) -> Result<(), PlanError> {
        let pairs_of = |block: u64| block_pairs(batch, mask, block, self.whole);
        let pairs = pairs_of(self.block.max(1));
        if pairs <= MAX_PLAN_ITEMS {
            return Ok(());
        }
        Err(PlanError::Planning(format!(
            "fcp: block={} cuts this batch into {pairs} block pairs (one task each), more than the \
             {MAX_PLAN_ITEMS} a plan may hold{}",
            self.block,
            block_hint(self.block, |b| pairs_of(b) <= MAX_PLAN_ITEMS)
        )))
    }

    /// The block distributor alone (§4.1): blocks, units, f weights and LPT under the cap.
    pub fn distribute(
        &self,
        batch: &Batch,
        ctx: &PlanContext<'_>,
    ) -> Result<Distribution, PlanError> {
        if ctx.ranks == 0 {
            return Err(PlanError::Planning("fcp: the CP group has no rank".into()));
        }
        self.check_block_pairs(batch, ctx.mask)?;
        // With the reshuffler, short documents are packed with those the same rank holds in
        // the user's layout, and every unit knows that rank (its home).
        let cuts = self
            .reshuffle
            .then(|| layout_cuts(batch.tokens(), ctx.ranks));
        let group: Vec<u32> = match &cuts {
            Some(c) => {
                let mut at = 0u64;
                batch
                    .doc_lens
                    .iter()
                    .map(|&l| {
                        let g = c.partition_point(|&x| x <= at).saturating_sub(1) as u32;
                        at += l;
                        g
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        let mut units = blocks::make_units_grouped(batch, self.block, ctx.mask, &group, self.whole);
        let mut weigher = blocks::Weigher::new(ctx.hardware, ctx.model, ctx.mask)?;
        weigher.weigh(&mut units, &batch.doc_lens)?;
        let per_rank = |x: f64| x / f64::from(ctx.ranks);
        let mean = per_rank(units.iter().map(|u| u.weight).sum());
        blocks::set_comm(&mut units, &batch.doc_lens, self.block, ctx.mask);
        let mean_comm = per_rank(units.iter().map(|u| u.comm).sum());
        // A pair is too coarse when it weighs more than `pair_limit` of a rank's mean compute
        // share or — comm-aware — of its mean K/V traffic share: a pair of a k-block document
        // moves about 2(k − 1) blocks, which for the longest documents exceeds a whole rank's
        // share, whatever its compute.
        let comm_limit = if self.comm_aware {
            mean_comm * self.pair_limit
        } else {
            f64::INFINITY
        };
        let broken_pairs = blocks::break_heavy_pairs(
            &mut units,
            |u| u.weight > mean * self.pair_limit || u.comm > comm_limit,
            &mut weigher,
            &batch.doc_lens,
        )?;
        let heavy_splits = blocks::split_heavy_blocks(
            &mut units,
            |u| u.weight > mean * self.split_limit,
            MIN_SPLIT_TOKENS,
            &mut weigher,
            &batch.doc_lens,
        )?;
        blocks::set_comm(&mut units, &batch.doc_lens, self.block, ctx.mask);
        if let Some(c) = &cuts {
            blocks::set_homes(&mut units, &batch.doc_lens, c);
        }
        let cap = Fcp::cap(batch, ctx);
        let heaviest_unit = units.iter().map(|u| u.weight).fold(0.0, f64::max);
        let lpt_opts = lpt::Options {
            comm_aware: self.comm_aware,
            affinity: if self.reshuffle { self.affinity } else { 0.0 },
            fill: self.fill,
        };
        let mut assignment = if self.nodes {
            let gpn = ctx.hardware.gpus_per_node;
            node_lpt::assign_by_node(&units, ctx.ranks, gpn, cap, lpt_opts, self.node_fill)
        } else {
            lpt::assign_with(&units, ctx.ranks, cap, lpt_opts)
        };
        if self.rebalance {
            self.rebalance_compute(&mut assignment, batch, ctx, cap);
        }
        if self.repair {
            Fcp::repair_traffic(&mut assignment, batch, ctx, cap);
        }
        shard::check_spread(
            self.name(),
            &assignment.owned,
            batch.doc_lens.len(),
            ctx.mask,
        )?;
        Ok(Distribution {
            cap,
            broken_pairs,
            heavy_splits,
            units: units.len(),
            heaviest_unit,
            assignment,
            unit_list: units,
        })
    }

    /// The compute rebalance over an LPT assignment (what `rebalance` turns on in
    /// [`Fcp::distribute`]), with this configuration's `rebalance_pairs` and
    /// `rebalance_in_node`.
    pub fn rebalance_compute(
        &self,
        assignment: &mut Assignment,
        batch: &Batch,
        ctx: &PlanContext<'_>,
        cap: u64,
    ) {
        let gpn = ctx.hardware.gpus_per_node;
        let in_node = self.nodes && self.rebalance_in_node && ctx.ranks > gpn;
        // Items holding a piece of a cut document stay on their node; items of whole
        // documents move no K/V and may go anywhere.
        let anchored: Vec<bool> = if in_node {
            let doc_lens = &batch.doc_lens;
            assignment
                .items
                .iter()
                .map(|it| {
                    it.chunks
                        .iter()
                        .any(|c| c.start > 0 || c.end < doc_lens[c.doc as usize])
                })
                .collect()
        } else {
            Vec::new()
        };
        let defaults = rebalance::Options::default();
        let out = rebalance::rebalance_anchored(
            &assignment.items,
            &anchored,
            &mut assignment.item_rank,
            ctx.ranks,
            cap,
            rebalance::Options {
                max_steps: 4 * ctx.ranks as usize,
                pairs: self.rebalance_pairs,
                // Within nodes every rank is a partner for single-item exchanges; two-item
                // ones are costlier (the default partners plus the busiest rank's node).
                partners: if in_node && !self.rebalance_pairs {
                    ctx.ranks as usize
                } else {
                    defaults.partners
                },
                node: if in_node { gpn } else { 0 },
                ..defaults
            },
        );
        if out.steps > 0 {
            assignment.regroup();
        }
    }

    /// The traffic repair over an LPT assignment (what `repair` turns on in [`Fcp::distribute`]):
    /// `hybrid` runs it only on the candidates it keeps.
    pub fn repair_traffic(
        assignment: &mut Assignment,
        batch: &Batch,
        ctx: &PlanContext<'_>,
        cap: u64,
    ) {
        repair::repair(
            &assignment.items,
            &mut assignment.item_rank,
            ctx.ranks,
            cap,
            batch.doc_lens.len(),
            ctx.mask,
            repair::Options {
                max_steps: 2 * ctx.ranks as usize,
                ..repair::Options::default()
            },
        );
        assignment.regroup();
    }

    /// What [`Fcp::build`] reads of these parameters besides the placement (pipelining,
    /// lookahead, solver, coalescing, reshuffler, relay): two specs equal here build the same
    /// tasks and transfers from the same placement, so a search builds such a pair once.
    pub fn build_key(&self) -> (bool, u32, bool, u32, bool, bool) {
        (
            self.pipeline,
            self.lookahead,
            self.solver,
            self.coalesce_degree(),
            self.reshuffle,
            self.relay,
        )
    }

    /// The communication planner and pipeline (§4.2–4.3) over a given placement: `owned[r]`
    /// are the chunks rank `r` holds, `cap` the token cap they respect. The heuristic and the
    /// ILP cross-check both build their plans here; `extra` adds parameters first.
    pub fn build(
        &self,
        batch: &Batch,
        ctx: &PlanContext<'_>,
        owned: &[Vec<TokenRange>],
        cap: u64,
        extra: impl FnOnce(&mut PlanBuilder),
    ) -> Plan {
        let mut b = PlanBuilder::new(self.name(), self.params(), batch, ctx);
        extra(&mut b);
        b.memory_cap(cap);
        let input = self
            .reshuffle
            .then(|| user_layout(&batch.doc_lens, ctx.ranks));
        // Bytes per token the reshuffler moves in (Q + K/V) and out (O + fp32 LSE).
        let m = ctx.model;
        let bytes_in =
            (m.q_heads + 2 * m.kv_heads) as f64 * m.head_dim as f64 * m.dtype_bytes as f64;
        let bytes_out = m.q_heads as f64 * (m.head_dim as f64 * m.dtype_bytes as f64 + 4.0);
        schedule::schedule(
            &mut b,
            owned,
            batch.doc_lens.len(),
            ctx.mask,
            schedule::Options {
                pipeline: self.pipeline,
                lookahead: self.lookahead,
                solver: self.solver,
                coalesce: self.coalesce_degree(),
                local_first: bytes_in / (bytes_in + bytes_out),
                relay: (self.relay && ctx.ranks > ctx.hardware.gpus_per_node)
                    .then_some(ctx.hardware.gpus_per_node),
            },
            input.as_deref(),
        );
        b.finish()
    }
}

impl Planner for Fcp {
    fn name(&self) -> &'static str {
        "fcp"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        let mut p = BTreeMap::from([
            (
                "affinity".to_string(),
                serde_json::Number::from_f64(self.affinity)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
            ),
            ("block".to_string(), self.block.into()),
            ("coalesce".to_string(), self.coalesce.into()),
            ("coalescer".to_string(), self.coalescer.into()),
            ("comm_aware".to_string(), self.comm_aware.into()),
            ("node_fill".to_string(), self.node_fill.into()),
            ("nodes".to_string(), self.nodes.into()),
            ("pair_limit".to_string(), limit_json(self.pair_limit)),
            ("lookahead".to_string(), self.lookahead.into()),
            ("pipeline".to_string(), self.pipeline.into()),
            ("rebalance".to_string(), self.rebalance.into()),
            (
                "rebalance_in_node".to_string(),
                self.rebalance_in_node.into(),
            ),
            ("rebalance_pairs".to_string(), self.rebalance_pairs.into()),
            ("relay".to_string(), self.relay.into()),
            ("repair".to_string(), self.repair.into()),
            ("reshuffle".to_string(), self.reshuffle.into()),
            ("solver".to_string(), self.solver.into()),
            ("split_limit".to_string(), limit_json(self.split_limit)),
            ("whole".to_string(), self.whole.into()),
        ]);
        // Recorded only when on, so plans made without them are unchanged.
        if self.node_heads {
            p.insert("node_heads".to_string(), true.into());
        }
        if self.fill {
            p.insert("fill".to_string(), true.into());
        }
        p
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        if self.node_heads {
            return node_heads::plan(self, batch, ctx);
        }
        let dist = self.distribute(batch, ctx)?;
        Ok(self.build(batch, ctx, &dist.assignment.owned, dist.cap, |_| {}))
    }
}

/// Block pairs (tasks) the mask allows when `batch` is cut into `block`-token blocks, the
/// documents of at most `whole` tokens kept as one block: what [`Fcp::check_block_pairs`]
/// bounds, and `hybrid` sums over its candidates for the same reason.
pub fn block_pairs(batch: &Batch, mask: Mask, block: u64, whole: u64) -> u64 {
    let block = block.max(1);
    batch
        .doc_lens
        .iter()
        .map(|&len| {
            let k = if len <= whole { 1 } else { len.div_ceil(block) };
            match mask {
                Mask::Causal => k.saturating_mul(k.saturating_add(1)) / 2,
                Mask::Full => k.saturating_mul(k),
            }
        })
        .fold(0u64, u64::saturating_add)
}

/// `"; use block=B or more"` for the smallest power-of-two block `B` above `block` that
/// `fits`, or nothing when none up to 2^39 does: a refusal of a block size says what would
/// work.
pub fn block_hint(block: u64, fits: impl Fn(u64) -> bool) -> String {
    (0..40)
        .map(|e| 1u64 << e)
        .find(|&b| b > block && fits(b))
        .map_or(String::new(), |b| format!("; use block={b} or more"))
}

/// The user's layout the reshuffler starts from: the packed batch (documents back to back, in
/// order) cut into `ranks` contiguous pieces of equal size (±1 token).
pub fn user_layout(doc_lens: &[u64], ranks: u32) -> Vec<Vec<TokenRange>> {
    let cuts = layout_cuts(doc_lens.iter().sum(), ranks);
    // One sweep over documents and cuts together (O(D + N)).
    let mut out = vec![Vec::new(); cuts.len() - 1];
    let (mut r, mut offset) = (0usize, 0u64);
    for (doc, &len) in doc_lens.iter().enumerate() {
        let end = offset + len;
        let mut pos = offset;
        while pos < end && r < out.len() {
            let stop = end.min(cuts[r + 1]);
            if stop > pos {
                out[r].push(TokenRange::new(doc as u32, pos - offset, stop - offset));
                pos = stop;
            }
            if pos >= cuts[r + 1] {
                r += 1;
            }
        }
        offset = end;
    }
    out
}

/// Where the user's layout cuts the packed batch: rank `i` holds `[cuts[i], cuts[i + 1])`.
fn layout_cuts(total: u64, ranks: u32) -> Vec<u64> {
    let n = u128::from(ranks.max(1));
    (0..=n)
        .map(|i| (i * u128::from(total) / n) as u64)
        .collect()
}

#[cfg(test)]
mod tests;
