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
//! largest per-rank exchanged K/V buffer over `⌊C/N⌋` tokens (FlashCP's `Eq5/Eq4 =
//! 1 − comm_saving`); min-comm mode minimises `comm` alone subject to `imbalance ≤ R`.

pub mod fcp;
pub mod flashcp;
pub mod milp;
pub mod search;

use serde::Serialize;

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
    /// Seconds before the search returns its incumbent.
    pub time_limit: f64,
    /// Solve with microlp's MILP instead of the search (for measurement: no bound, and a
    /// time-out falls back to the warm start).
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

/// microlp's answer as an [`Outcome`]: optimal when it returned before the limit; on a
/// time-out (microlp returns nothing) the warm start with the root bound.
fn milp_outcome(p: &Problem, warm: &[u32], time_limit: f64) -> Outcome {
    let start = std::time::Instant::now();
    let r = milp::solve(p, Some(warm), time_limit);
    let solve_s = start.elapsed().as_secs_f64();
    let (assign, status) = match r {
        Some(r) if r.finished && r.objective.is_finite() => (r.assign, Status::Optimal),
        _ => (warm.to_vec(), Status::TimedOut),
    };
    let value = p.evaluate(&assign);
    let bound = if status == Status::Optimal {
        value.objective
    } else {
        p.root_bound().min(value.objective)
    };
    let gap = if value.objective.is_finite() && value.objective > 0.0 {
        ((value.objective - bound) / value.objective).max(0.0)
    } else {
        0.0
    };
    Outcome {
        assign,
        value,
        bound,
        gap,
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
    /// `1 − max exchanged tokens per rank / ⌊C/N⌋`.
    pub comm_saving: f64,
    /// Max exchanged tokens per rank.
    pub comm_tokens: u64,
}

/// The ILP's side: its plan's values and how the search ended.
#[derive(Debug, Clone, Serialize)]
pub struct IlpSide {
    /// `optimal`, `feasible` or `timed_out`.
    pub status: Status,
    /// Objective of the best plan found.
    pub objective: Option<f64>,
    /// Proven lower bound.
    pub bound: f64,
    /// `(objective − bound) / objective`.
    pub gap: Option<f64>,
    /// Wall seconds.
    pub solve_s: f64,
    /// max/mean per-rank workload.
    pub imbalance: f64,
    /// `1 − max exchanged tokens per rank / ⌊C/N⌋`.
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
    /// The ILP's plan in our IR.
    #[serde(skip)]
    pub plan: crate::plan::Plan,
}

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

/// The ILP's summary as plan parameters (`scheme.params.ilp`).
fn plan_params(o: &IlpSide, opts: &Options) -> Vec<(String, serde_json::Value)> {
    vec![(
        "ilp".to_string(),
        serde_json::json!({
            "status": o.status,
            "mode": opts.mode,
            "lambda": opts.lambda,
            "granularity": opts.granularity,
            "objective": o.objective.map(|x| (x * 1e12).round() / 1e12),
            "bound": (o.bound * 1e12).round() / 1e12,
        }),
    )]
}
