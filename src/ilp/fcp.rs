//! FCP's block assignment as an ILP (§4.1): units (blocks or zig-zag pairs, weighed by f(B)
//! from the shared cost model) × ranks binary, each unit on one rank, tokens per rank ≤ the
//! cap, minimise the max f-load (the imbalance max/mean), plus optionally λ × the largest
//! per-rank K/V a rank must send (a segment is sent when a later segment of its document sits
//! elsewhere — the causal rule, used as a proxy under a full mask too).
//!
//! The units are exactly the heuristic's (`Fcp::distribute`'s blocks, weights and broken
//! pairs), so LPT's assignment is the warm start whenever LPT placed every unit whole. When
//! LPT had to cut a unit its plan lies outside the ILP's whole-unit space: the ILP then starts
//! from nothing, its optimum is only over whole-unit assignments (the report says so), and
//! the heuristic is still measured on its own placement. The ILP's assignment goes through
//! FCP's own communication planner (`schedule::schedule`).

use crate::plan::{PlanError, TokenRange};
use crate::planners::fcp::{blocks, Assignment, Fcp};
use crate::planners::PlanContext;
use crate::trace::Batch;

use super::search::{Item, Problem};
use super::{ilp_side, no_plan_note, plan_params, side, IlpSide, Options, Report, Side};

/// The instance: units, LPT's assignment of them (`None` when LPT had to cut a unit, which
/// no whole-unit assignment can express), LPT's placement as it is, the problem.
pub struct Instance {
    /// Units, one per item.
    pub units: Vec<blocks::Unit>,
    /// LPT's rank for every unit, when every unit went whole to one rank.
    pub warm: Option<Vec<u32>>,
    /// LPT's placement, cut units included: the heuristic's plan is built from it, and the
    /// heuristic's side of the report is measured on it ([`heuristic_side`]).
    pub heuristic: Assignment,
    /// The assignment problem.
    pub problem: Problem,
}

impl Instance {
    /// Units LPT could not place whole (a zig-zag pair split, a block cut across ranks).
    pub fn cut_units(&self) -> usize {
        self.heuristic.split_pairs + self.heuristic.split_blocks
    }
}

/// One item of the problem: `chunks` moved together, weighing `work`.
fn item<'a>(chunks: impl IntoIterator<Item = &'a TokenRange>, work: f64) -> Item {
    let segs: Vec<(u32, u64, u64)> = chunks
        .into_iter()
        .map(|c| (c.doc, c.start, c.len()))
        .collect();
    Item {
        tokens: segs.iter().map(|s| s.2).sum(),
        work,
        segs,
    }
}

/// Build the instance for `batch` with the FCP planner `f`.
pub fn instance(
    f: &Fcp,
    batch: &Batch,
    ctx: &PlanContext<'_>,
    opts: &Options,
) -> Result<Instance, PlanError> {
    if ctx.ranks == 0 {
        return Err(PlanError::Planning("fcp: the CP group has no rank".into()));
    }
    // Exactly the heuristic's units and LPT's assignment of them.
    let dist = f.distribute(batch, ctx)?;
    let (units, a, cap) = (dist.unit_list, dist.assignment, dist.cap);
    let warm = if a.split_pairs == 0 && a.split_blocks == 0 {
        units
            .iter()
            .map(|u| {
                let c = u.blocks[0].chunks[0];
                a.owned
                    .iter()
                    .position(|own| own.contains(&c))
                    .map(|r| r as u32)
            })
            .collect::<Option<Vec<u32>>>()
    } else {
        None
    };
    let (alpha, lambda, load_cap) = opts.weights();
    let items = units
        .iter()
        .map(|u| item(u.blocks.iter().flat_map(|b| &b.chunks), u.weight))
        .collect();
    let problem = Problem {
        items,
        ranks: ctx.ranks,
        lo: 0,
        hi: cap,
        alpha,
        lambda,
        // The cap, the most tokens a rank may hold (and so exchange): see `Problem::comm_ref`.
        comm_ref: cap.max(1) as f64,
        load_cap,
        chain: false,
        forced_exchange: Vec::new(),
    };
    Ok(Instance {
        units,
        warm,
        heuristic: a,
        problem,
    })
}

/// The heuristic's side, measured on LPT's placement itself — every piece as placed, a cut
/// unit's pieces with their share of its f weight — in the ILP's units (same token cap, load
/// cap, λ and comm reference). Every branch of [`solve`] reports the heuristic through this
/// alone: one plan gets one set of numbers, whether or not LPT cut a unit and whether or not
/// the ILP found a plan, and they compare with the ILP's column. When LPT placed every unit
/// whole this is `side(problem, warm)`.
pub fn heuristic_side(p: &Problem, a: &Assignment) -> Side {
    let placed = Problem {
        items: a
            .items
            .iter()
            .map(|it| item(&it.chunks, it.weight))
            .collect(),
        ranks: p.ranks,
        lo: p.lo,
        hi: p.hi,
        alpha: p.alpha,
        lambda: p.lambda,
        comm_ref: p.comm_ref,
        load_cap: p.load_cap,
        chain: false,
        forced_exchange: Vec::new(),
    };
    side(&placed, &a.item_rank)
}

/// Solve FCP's block-assignment ILP for `batch`; the report carries the ILP's plan (an `fcp`
/// plan with `scheme.params.ilp`), or the heuristic's when the ILP found none.
pub fn solve(
    f: &Fcp,
    batch: &Batch,
    ctx: &PlanContext<'_>,
    opts: &Options,
) -> Result<Report, PlanError> {
    let inst = instance(f, batch, ctx, opts)?;
    let p = &inst.problem;
    // Without a whole-unit warm start both solvers start from nothing (microlp included:
    // `--microlp` is honoured either way).
    let o = super::outcome(p, inst.warm.as_deref(), opts)?;
    let heuristic = heuristic_side(p, &inst.heuristic);
    let ilp = ilp_side(p, &o);
    let mut notes = Vec::new();
    let cut = inst.cut_units();
    if cut > 0 {
        // The ILP's "optimal" is over whole-unit assignments; LPT's plan is not one of them
        // and may well be better. Say so, so nobody reads the status as beating it.
        let mut note = format!(
            "LPT cut {cut} unit(s) across ranks to fit the token cap ({} tokens per rank); the \
             ILP places whole units only, so its optimum and bound are over whole-unit \
             assignments, not over every plan",
            p.hi
        );
        if let (Some(h), Some(i)) = (heuristic.objective, ilp.objective) {
            if h < i {
                note += &format!(
                    "; the heuristic's plan, outside that space, is better (objective {h:.4} \
                     vs {i:.4})"
                );
            }
        }
        notes.push(note);
    }
    if ilp.objective.is_none() {
        // No whole-unit assignment meets the constraints (or none was found in time): the
        // best plan known is the heuristic's own, returned as such — never nothing — and the
        // ILP's column describes that plan.
        // The plan records the ILP's status and every note, as any other (bug hunt: it
        // carried the last note alone, as a bare string).
        notes.push(no_plan_note(
            p,
            inst.warm.as_deref(),
            &o,
            "whole-unit assignment",
            opts,
        ));
        let plan = f.build(batch, ctx, &inst.heuristic.owned, p.hi, |b| {
            for (k, v) in plan_params(&ilp, opts, &notes, None) {
                b.param(&k, v);
            }
        });
        let ilp = IlpSide {
            imbalance: heuristic.imbalance,
            comm_saving: heuristic.comm_saving,
            comm_tokens: heuristic.comm_tokens,
            ..ilp
        };
        return Ok(Report::new(heuristic, ilp, opts, notes, plan));
    }
    let mut owned: Vec<Vec<TokenRange>> = vec![Vec::new(); ctx.ranks as usize];
    for (u, &r) in inst.units.iter().zip(&o.assign) {
        for b in &u.blocks {
            owned[r as usize].extend(b.chunks.iter().copied());
        }
    }
    let plan = f.build(batch, ctx, &owned, Fcp::cap(batch, ctx), |b| {
        for (k, v) in plan_params(&ilp, opts, &notes, None) {
            b.param(&k, v);
        }
    });
    Ok(Report::new(heuristic, ilp, opts, notes, plan))
}
