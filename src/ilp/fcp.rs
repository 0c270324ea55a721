//! FCP's block assignment as an ILP (§4.1): units (blocks or zig-zag pairs, weighed by f(B)
//! from the shared cost model) × ranks binary, each unit on one rank, tokens per rank ≤ the
//! cap, minimise the max f-load (the imbalance max/mean), plus optionally λ × the largest
//! per-rank K/V a rank must send (a segment is sent when a later segment of its document sits
//! elsewhere — the causal rule, used as a proxy under a full mask too).
//!
//! The units are exactly the heuristic's (`Fcp::distribute`'s blocks, weights and broken
//! pairs), so LPT's assignment is the warm start whenever LPT placed every unit whole. The
//! ILP's assignment goes through FCP's own communication planner (`schedule::schedule`).

use crate::plan::{PlanError, TokenRange};
use crate::planners::fcp::{blocks, Fcp};
use crate::planners::{PlanContext, Planner};
use crate::trace::Batch;

use super::search::{self, Item, Problem};
use super::{ilp_side, plan_params, side, Options, Report};

/// The instance: units, LPT's assignment of them (`None` when LPT had to cut a unit, which
/// no whole-unit assignment can express), the problem.
pub struct Instance {
    /// Units, one per item.
    pub units: Vec<blocks::Unit>,
    /// LPT's rank for every unit, when every unit went whole to one rank.
    pub warm: Option<Vec<u32>>,
    /// The assignment problem.
    pub problem: Problem,
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
        .map(|u| Item {
            tokens: u.tokens(),
            work: u.weight,
            segs: u
                .blocks
                .iter()
                .flat_map(|b| b.chunks.iter().map(|c| (c.doc, c.start, c.len())))
                .collect(),
        })
        .collect();
    let tokens = batch.tokens();
    let problem = Problem {
        items,
        ranks: ctx.ranks,
        lo: 0,
        hi: cap,
        alpha,
        lambda,
        comm_ref: (tokens / u64::from(ctx.ranks)).max(1) as f64,
        load_cap,
        chain: false,
        forced_exchange: Vec::new(),
    };
    Ok(Instance {
        units,
        warm,
        problem,
    })
}

/// Solve FCP's block-assignment ILP for `batch`; the report carries the ILP's plan (an `fcp`
/// plan with `scheme.params.ilp`).
pub fn solve(
    f: &Fcp,
    batch: &Batch,
    ctx: &PlanContext<'_>,
    opts: &Options,
) -> Result<Report, PlanError> {
    let inst = instance(f, batch, ctx, opts)?;
    let p = &inst.problem;
    let o = match (&inst.warm, opts.microlp) {
        (Some(w), true) => super::milp_outcome(p, w, opts.time_limit),
        _ => search::solve(p, inst.warm.as_deref(), opts.time_limit),
    };
    let heuristic = side(p, inst.warm.as_deref().unwrap_or(&o.assign));
    let heuristic = if inst.warm.is_some() {
        heuristic
    } else {
        // LPT cut a unit: its plan is outside the whole-unit space; report it as not comparable.
        super::Side {
            objective: None,
            ..heuristic
        }
    };
    let ilp = ilp_side(p, &o);
    if ilp.objective.is_none() {
        // No whole-unit assignment fits the cap within the limit (LPT had to cut a unit): the
        // best plan known is the heuristic's own, returned as such — never nothing.
        let mut plan = f.plan(batch, ctx)?;
        plan.scheme.params.insert(
            "ilp".to_string(),
            serde_json::json!(
                "no whole-unit assignment fits the token cap within the time limit; this is the heuristic's plan"
            ),
        );
        // Report what that plan really does, not the empty search's placeholder values.
        let max_over_mean = crate::plan::summarize(&plan, ctx.model).max_over_mean;
        let mut recv = vec![0u64; ctx.ranks as usize];
        for t in &plan.transfers {
            if t.tensor == crate::plan::TransferTensor::Kv {
                recv[t.dst as usize] += t.tokens();
            }
        }
        let comm_tokens = recv.iter().copied().max().unwrap_or(0);
        let per_rank = (batch.tokens() / u64::from(ctx.ranks)).max(1);
        let comm_saving = 1.0 - comm_tokens as f64 / per_rank as f64;
        let heuristic = super::Side {
            objective: None,
            imbalance: max_over_mean,
            comm_saving,
            comm_tokens,
        };
        let ilp = super::IlpSide {
            imbalance: max_over_mean,
            comm_saving,
            comm_tokens,
            ..ilp
        };
        return Ok(Report {
            heuristic,
            ilp,
            mode: opts.mode,
            lambda: opts.lambda,
            target_imbalance: opts.target_imbalance,
            plan,
        });
    }
    let mut owned: Vec<Vec<TokenRange>> = vec![Vec::new(); ctx.ranks as usize];
    for (u, &r) in inst.units.iter().zip(&o.assign) {
        for b in &u.blocks {
            owned[r as usize].extend(b.chunks.iter().copied());
        }
    }
    let plan = f.build(batch, ctx, &owned, Fcp::cap(batch, ctx), |b| {
        for (k, v) in plan_params(&ilp, opts) {
            b.param(&k, v);
        }
    });
    Ok(Report {
        heuristic,
        ilp,
        mode: opts.mode,
        lambda: opts.lambda,
        target_imbalance: opts.target_imbalance,
        plan,
    })
}
