//! Exact cross-checks of the sharding heuristics (issue 7): FlashCP's §3.4 ILP and FCP's block
//! assignment, solved to a proven optimum or to a time limit with a proven gap.
//!
//! * [`search`]: the exact branch and bound both formulations share (why a dedicated search
//!   and not a MILP solver: `docs/ilp.md`).
//! * [`milp`]: the same formulations written as MILPs with `good_lp` (microlp, pure Rust):
//!   the textbook statement, used to cross-check the search on small instances and measured
//!   against it.
//! * [`flashcp`], [`fcp`]: each scheme's instance (pieces or units, warm start from its
//!   heuristic) and the ILP's solution as a plan in our IR, built by the scheme's own code.
//!
//! Objectives are dimensionless so the heuristic and the ILP read in the same units:
//! `imbalance + λ · comm`, where imbalance is max/mean per-rank workload and comm is the
//! largest per-rank exchanged K/V buffer over the most tokens one rank may hold (FlashCP's
//! `Eq5/Eq4 = 1 − comm_saving`, with Eq. 4's `C/N` read as Eq. 2's `⌈C/N⌉`; FCP's token cap);
//! min-comm mode minimises `comm` alone subject to `imbalance ≤ R`.

pub mod fcp;
pub mod flashcp;
pub mod milp;
pub mod search;

use serde::Serialize;

use std::time::Duration;

use crate::plan::PlanError;

pub use search::{Outcome, Problem, Status};

/// What the solver minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `imbalance + λ · comm`.
    Objective,
    /// `comm` subject to `imbalance ≤ R`.
    MinComm,
}

/// Solver settings shared by both schemes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Cut documents at multiples of this many tokens (FlashCP; FCP uses its block size).
    pub granularity: u64,
    /// Weight of the comm term in objective mode.
    pub lambda: f64,
    /// Objective or min-comm.
    pub mode: Mode,
    /// R: the heuristic's target and min-comm's constraint.
    pub target_imbalance: f64,
    /// Seconds before the search returns its incumbent; a century or more (infinity, 1e20)
    /// means no limit (see [`time_limit`]).
    pub time_limit: f64,
    /// Solve with microlp's MILP instead of the search (for measurement: no bound, and a
    /// time-out keeps the better of microlp's incumbent and the warm start).
    pub microlp: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            granularity: 1024,
            lambda: 0.1,
            mode: Mode::Objective,
            target_imbalance: 1.05,
            time_limit: 10.0,
            microlp: false,
        }
    }
}

impl Options {
    /// `(α, λ, load cap)` of [`Problem`] for this mode.
    pub fn weights(&self) -> (f64, f64, Option<f64>) {
        match self.mode {
            Mode::Objective => (1.0, self.lambda, None),
            Mode::MinComm => (0.0, 1.0, Some(self.target_imbalance)),
        }
    }
}

/// `secs` as the limit both solvers hold: `None` (no limit) from a century up — infinity,
/// 1e19 s, 1e20 s: such a limit can never strike, and microlp converts its
/// limit with `Duration::from_secs_f64`, which panics on it. Negative or NaN reads as 0 (the
/// CLI refuses both before this).
pub fn time_limit(secs: f64) -> Option<Duration> {
    // A century: longer than any solve, and far below where microlp's `Instant::now() + limit`
    // overflows (bug hunt: 1e19 s fits a `Duration` and panicked there).
    const NEVER_S: f64 = 100.0 * 365.25 * 86_400.0;
    if secs >= NEVER_S {
        return None;
    }
    Duration::try_from_secs_f64(secs.max(0.0)).ok()
}

/// Solve `p` with the solver `opts` names (the search, or microlp with `--microlp`), from the
/// warm start when there is one. A model too large for microlp ([`milp::MAX_VARS`]) is
/// refused before it is built: building it ignores the time limit.
fn outcome(p: &Problem, warm: Option<&[u32]>, opts: &Options) -> Result<Outcome, PlanError> {
    if opts.microlp {
        let vars = milp::model_vars(p);
        if vars > milp::MAX_VARS {
            return Err(PlanError::Planning(format!(
                "ilp --microlp: this batch's model has {vars} variables ({} items on {} ranks), more than the {} microlp is given (it takes about a kilobyte each, before its time limit starts); use the default branch and bound, which keeps to --time-limit at any size",
                p.items.len(),
                p.ranks,
                milp::MAX_VARS
            )));
        }
        Ok(milp_outcome(p, warm, opts.time_limit))
    } else {
        Ok(search::solve(p, warm, opts.time_limit))
    }
}

/// Why the ILP has no plan (so the plan returned is the heuristic's): the constraints no
/// `what` (whole-unit assignment, assignment of the pieces) could meet, and the time limit
/// only when it struck. A constraint the warm start already meets is not a reason: the token
/// bounds are named only when there is no warm start within them, the load cap (min-comm's
/// R) whenever it is in force.
fn no_plan_note(
    p: &Problem,
    warm: Option<&[u32]>,
    o: &Outcome,
    what: &str,
    opts: &Options,
) -> String {
    let mut broken = Vec::new();
    if !warm.is_some_and(|w| p.tokens_fit(w)) {
        broken.push(if p.lo == 0 {
            format!("the token cap ({} tokens per rank)", p.hi)
        } else {
            format!("{}–{} tokens per rank", p.lo, p.hi)
        });
    }
    if let Some(r) = p.load_cap {
        broken.push(format!("imbalance ≤ R = {r}"));
    }
    if broken.is_empty() {
        broken.push("the constraints".to_string());
    }
    let broken = broken.join(" together with ");
    match o.status {
        Status::TimedOut => format!(
            "no {what} meeting {broken} was found before the {} s time limit struck; this is the \
             heuristic's plan",
            opts.time_limit
        ),
        _ => format!("no {what} meets {broken}; this is the heuristic's plan"),
    }
}

/// microlp's answer as an [`Outcome`]: optimal when it proved its answer; infeasible when it
/// proved there is none (never while the warm start is feasible: that would be a numerical
/// artefact of its `objective ≤ warm` cut, and the warm start is kept as merely feasible);
/// otherwise (a time-out: microlp returns nothing, or an unproven incumbent) the better of
/// its incumbent and the warm start, with the root bound. Without a warm start (FCP when LPT
/// cut a unit) the fallback is, as in [`search::solve`], an all-on-rank-0 placeholder that is
/// infeasible and so reads as "no plan".
fn milp_outcome(p: &Problem, warm: Option<&[u32]>, time_limit: f64) -> Outcome {
    let start = std::time::Instant::now();
    let r = milp::solve(p, warm, time_limit);
    let solve_s = start.elapsed().as_secs_f64();
    let fallback = warm.map_or_else(|| vec![0; p.items.len()], <[u32]>::to_vec);
    let fallback_value = p.evaluate(&fallback);
    let unproven = |finished: bool| {
        if finished {
            Status::Feasible
        } else {
            Status::TimedOut
        }
    };
    let (assign, status) = match r {
        Ok(r) if r.finished && r.objective.is_finite() => (r.assign, Status::Optimal),
        Ok(r) if r.objective < fallback_value.objective => (r.assign, unproven(r.finished)),
        Ok(r) => (fallback, unproven(r.finished)),
        Err(good_lp::ResolutionError::Infeasible) if !fallback_value.feasible => {
            (fallback, Status::Infeasible)
        }
        Err(good_lp::ResolutionError::Infeasible) => (fallback, Status::Feasible),
        Err(_) => (fallback, Status::TimedOut),
    };
    let value = p.evaluate(&assign);
    let bound = match status {
        Status::Optimal => value.objective,
        Status::Infeasible => f64::INFINITY,
        Status::Feasible | Status::TimedOut => p.root_bound().min(value.objective),
    };
    Outcome {
        assign,
        value,
        bound,
        gap: search::gap(value.objective, bound),
        status,
        solve_s,
        nodes: 0,
    }
}

/// One side of the comparison (the heuristic, or the ILP's incumbent).
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Objective in the units above (`null` when the plan breaks min-comm's constraint).
    pub objective: Option<f64>,
    /// max/mean per-rank workload.
    pub imbalance: f64,
    /// `1 − max exchanged tokens per rank / the most tokens a rank may hold`.
    pub comm_saving: f64,
    /// Max exchanged tokens per rank.
    pub comm_tokens: u64,
}

/// The ILP's side: its plan's values and how the search ended.
#[derive(Debug, Clone, Serialize)]
pub struct IlpSide {
    /// `optimal`, `feasible`, `timed_out` or `infeasible`.
    pub status: Status,
    /// Objective of the best plan found.
    pub objective: Option<f64>,
    /// Proven lower bound (infinite, `null` in JSON, when proven infeasible).
    pub bound: f64,
    /// `(objective − bound) / objective`.
    pub gap: Option<f64>,
    /// Wall seconds.
    pub solve_s: f64,
    /// max/mean per-rank workload.
    pub imbalance: f64,
    /// `1 − max exchanged tokens per rank / the most tokens a rank may hold`.
    pub comm_saving: f64,
    /// Max exchanged tokens per rank.
    pub comm_tokens: u64,
    /// Items placed (pieces or units).
    pub items: usize,
    /// Search nodes.
    pub nodes: u64,
}

/// The comparison `fcp ilp` prints, and the ILP's plan.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The heuristic's plan.
    pub heuristic: Side,
    /// The ILP's.
    pub ilp: IlpSide,
    /// Solver settings.
    pub mode: Mode,
    /// λ (objective mode).
    pub lambda: f64,
    /// R.
    pub target_imbalance: f64,
    /// What the numbers above do not say on their own: the ILP found no plan and why (the
    /// plan is then the heuristic's), or its optimum covers fewer plans than the heuristic's.
    pub notes: Vec<String>,
    /// The ILP's plan in our IR.
    #[serde(skip)]
    pub plan: crate::plan::Plan,
}

/// `assign` measured in `p`'s units.
fn side(p: &Problem, assign: &[u32]) -> Side {
    let v = p.evaluate(assign);
    Side {
        objective: v.feasible.then_some(v.objective),
        imbalance: v.imbalance,
        comm_saving: 1.0 - v.comm_tokens as f64 / p.comm_ref,
        comm_tokens: v.comm_tokens,
    }
}

fn ilp_side(p: &Problem, o: &Outcome) -> IlpSide {
    let s = side(p, &o.assign);
    IlpSide {
        status: o.status,
        objective: s.objective,
        bound: o.bound,
        gap: s.objective.map(|_| o.gap),
        solve_s: o.solve_s,
        imbalance: s.imbalance,
        comm_saving: s.comm_saving,
        comm_tokens: s.comm_tokens,
        items: p.items.len(),
        nodes: o.nodes,
    }
}

impl Report {
    fn new(
        heuristic: Side,
        ilp: IlpSide,
        opts: &Options,
        notes: Vec<String>,
        plan: crate::plan::Plan,
    ) -> Report {
        Report {
            heuristic,
            ilp,
            mode: opts.mode,
            lambda: opts.lambda,
            target_imbalance: opts.target_imbalance,
            notes,
            plan,
        }
    }
}

/// The ILP's summary as plan parameters (`scheme.params.ilp`), with the report's notes when
/// there are any.
fn plan_params(
    o: &IlpSide,
    opts: &Options,
    notes: &[String],
    granularity: Option<u64>,
) -> Vec<(String, serde_json::Value)> {
    let mut ilp = serde_json::json!({
        "status": o.status,
        "mode": opts.mode,
        "lambda": opts.lambda,
        "objective": o.objective.map(|x| (x * 1e12).round() / 1e12),
        "bound": (o.bound * 1e12).round() / 1e12,
    });
    // FlashCP's cut granularity; an FCP plan cuts at its block size, recorded as `block`
    // (bug hunt: FCP plans named a granularity they neither use nor accept).
    if let Some(g) = granularity {
        ilp["granularity"] = serde_json::json!(g);
    }
    if !notes.is_empty() {
        ilp["notes"] = serde_json::json!(notes);
    }
    vec![("ilp".to_string(), ilp)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (bug hunt): microlp panicked on `--time-limit inf` / `1e20` converting it to a
    /// `Duration`. Such limits mean none, for both solvers.
    #[test]
    fn time_limit_too_large_for_a_duration_is_no_limit() {
        assert_eq!(time_limit(f64::INFINITY), None);
        assert_eq!(time_limit(1e20), None);
        assert_eq!(time_limit(1e19), None);
        assert_eq!(time_limit(2.5), Some(Duration::from_millis(2500)));
        assert_eq!(time_limit(0.0), Some(Duration::ZERO));
        assert_eq!(time_limit(-1.0), Some(Duration::ZERO));
        let p = Problem {
            items: vec![search::Item {
                tokens: 1,
                work: 1.0,
                segs: vec![(0, 0, 1)],
            }],
            ranks: 1,
            lo: 0,
            hi: 1,
            alpha: 1.0,
            lambda: 0.0,
            comm_ref: 1.0,
            load_cap: None,
            chain: false,
            forced_exchange: Vec::new(),
        };
        for limit in [f64::INFINITY, 1e20] {
            let o = milp_outcome(&p, None, limit);
            assert_eq!(o.status, Status::Optimal);
        }
    }
}
