//! FlashCP's ILP (§3.1 + §3.4): documents cut into pieces, each piece on one rank (Eq. 1),
//! equal tokens (Eq. 2, as `⌊C/N⌋..=⌈C/N⌉`), minimise max per-rank workload `W` (Eq. 3) plus
//! λ × Eq. 5's largest exchanged buffer, or Eq. 5 alone subject to imbalance ≤ R.
//!
//! Pieces: every document is cut at the multiples of the granularity **and** at every cut the
//! heuristic made, so Algorithm 1's plan is one of the ILP's solutions (the warm start, and
//! the incumbent a time-out returns) and the equal-token constraint stays exactly satisfiable
//! (the heuristic meets it to the token). Causal masks only: Eq. 5's `Ŝ` is the causal rule.

use std::collections::BTreeSet;

use crate::plan::{Mask, PlanError};
use crate::planners::flashcp::{algorithm1, shard_work, Shard, Sharding};
use crate::planners::{FlashCp, PlanContext};
use crate::trace::Batch;

use super::search::{Item, Problem};
use super::{ilp_side, no_plan_note, plan_params, side, Options, Report};

/// The instance: pieces `(doc, start, end)` in the problem's item order, the heuristic's
/// assignment of them, and the problem.
pub struct Instance {
    /// Pieces, one per item.
    pub pieces: Vec<(u32, u64, u64)>,
    /// Algorithm 1's rank for every piece.
    pub warm: Vec<u32>,
    /// The assignment problem.
    pub problem: Problem,
}

/// Build the instance for `batch`: pieces, warm start, bounds.
pub fn instance(
    batch: &Batch,
    ctx: &PlanContext<'_>,
    opts: &Options,
) -> Result<Instance, PlanError> {
    if ctx.mask != Mask::Causal {
        return Err(PlanError::Planning(
            "fcp ilp --scheme flashcp models Eq. 5's causal exchange rule; use --mask causal"
                .into(),
        ));
    }
    if opts.granularity == 0 {
        return Err(PlanError::Planning(
            "--granularity must be at least 1".into(),
        ));
    }
    let n = ctx.ranks;
    let lens = &batch.doc_lens;
    let heur = algorithm1(lens, ctx.mask, n, opts.target_imbalance);
    let mut pieces = Vec::new();
    let mut warm = Vec::new();
    // The heuristic's shards by document, gathered once (bug hunt: filtering every shard for
    // every document was quadratic, 27 s of a 250,000-document batch outside --time-limit).
    let mut by_doc: Vec<Vec<&Shard>> = vec![Vec::new(); lens.len()];
    for s in &heur.shards {
        if let Some(v) = by_doc.get_mut(s.doc as usize) {
            v.push(s);
        }
    }
    for (d, &len) in lens.iter().enumerate() {
        let mut cuts: BTreeSet<u64> = (0..=len).step_by(opts.granularity as usize).collect();
        cuts.insert(len);
        let mine = &by_doc[d];
        let d = d as u32;
        for s in mine {
            cuts.insert(s.start);
            cuts.insert(s.end);
        }
        let cuts: Vec<u64> = cuts.into_iter().collect();
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let owner = mine
                .iter()
                .find(|s| s.start <= a && b <= s.end)
                .map_or(0, |s| s.rank);
            pieces.push((d, a, b));
            warm.push(owner);
        }
    }
    let total: u64 = lens.iter().sum();
    let hi = total.div_ceil(u64::from(n));
    let (alpha, lambda, load_cap) = opts.weights();
    let items: Vec<Item> = pieces
        .iter()
        .map(|&(d, a, b)| Item {
            tokens: b - a,
            work: shard_work(ctx.mask, lens[d as usize], a, b) as f64,
            segs: vec![(d, a, b - a)],
        })
        .collect();
    let mut problem = Problem {
        items,
        ranks: n,
        lo: total / u64::from(n),
        hi,
        alpha,
        lambda,
        // ⌈C/N⌉, the most tokens a rank may hold (and so exchange): see `Problem::comm_ref`.
        comm_ref: hi.max(1) as f64,
        load_cap,
        chain: true,
        forced_exchange: Vec::new(),
    };
    // The most load (pairs) one rank may carry in any solution that beats the warm start.
    let mean = shard_work_total(lens, ctx.mask) / f64::from(n);
    let warm_value = problem.evaluate(&warm);
    let cap = match load_cap {
        Some(r) => Some(r),
        None if warm_value.feasible && alpha > 0.0 => Some(warm_value.objective / alpha),
        None => None,
    };
    problem.forced_exchange = lens
        .iter()
        .map(|&len| cap.map_or(0, |c| forced(len, c * mean, problem.hi, ctx.mask)))
        .collect();
    Ok(Instance {
        pieces,
        warm,
        problem,
    })
}

fn shard_work_total(lens: &[u64], mask: Mask) -> f64 {
    lens.iter().map(|&l| shard_work(mask, l, 0, l) as f64).sum()
}

/// Fewest tokens a document of `len` must exchange when its tail run (the last shard, on one
/// rank) may carry at most `cap` pairs and `hi` tokens: `len − s` for the longest such suffix.
fn forced(len: u64, cap: f64, hi: u64, mask: Mask) -> u64 {
    let fits = |s: u64| s <= hi && shard_work(mask, len, len - s, len) as f64 <= cap;
    if fits(len) {
        return 0;
    }
    // Suffix work grows with s: binary search the longest that fits.
    let (mut lo, mut hi_s) = (0u64, len);
    while lo < hi_s {
        let m = lo + (hi_s - lo).div_ceil(2);
        if fits(m) {
            lo = m;
        } else {
            hi_s = m - 1;
        }
    }
    len - lo
}

/// Contiguous pieces of a document on one rank merged back into shards.
pub(crate) fn shards_of(pieces: &[(u32, u64, u64)], assign: &[u32]) -> Vec<Shard> {
    let mut v: Vec<Shard> = pieces
        .iter()
        .zip(assign)
        .map(|(&(doc, start, end), &rank)| Shard {
            doc,
            start,
            end,
            rank,
        })
        .collect();
    v.sort_unstable_by_key(|s| (s.doc, s.start));
    let mut out: Vec<Shard> = Vec::new();
    for s in v {
        match out.last_mut() {
            Some(l) if l.doc == s.doc && l.rank == s.rank && l.end == s.start => l.end = s.end,
            _ => out.push(s),
        }
    }
    out
}

/// Solve FlashCP's ILP for `batch`; the report carries the ILP's plan (a `flashcp` plan
/// with `scheme.params.ilp`).
pub fn solve(batch: &Batch, ctx: &PlanContext<'_>, opts: &Options) -> Result<Report, PlanError> {
    let inst = instance(batch, ctx, opts)?;
    let p = &inst.problem;
    let heuristic = side(p, &inst.warm);
    let o = super::outcome(p, Some(&inst.warm), opts)?;
    let ilp = ilp_side(p, &o);
    // Nothing feasible (min-comm's R out of reach, or not reached in time): the search's
    // incumbent is still the warm start, so the plan below is the heuristic's; say why.
    let notes: Vec<String> = if ilp.objective.is_none() {
        vec![no_plan_note(
            p,
            Some(&inst.warm),
            &o,
            "assignment of the pieces",
            opts,
        )]
    } else {
        Vec::new()
    };
    let planner = FlashCp {
        target_imbalance: opts.target_imbalance,
    };
    let s = Sharding::from_shards(
        &batch.doc_lens,
        ctx.mask,
        ctx.ranks,
        shards_of(&inst.pieces, &o.assign),
        Vec::new(),
        opts.target_imbalance,
    );
    let plan = planner.plan_from(
        batch,
        ctx,
        &s,
        plan_params(&ilp, opts, &notes, Some(opts.granularity)),
    )?;
    Ok(Report::new(heuristic, ilp, opts, notes, plan))
}
