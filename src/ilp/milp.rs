//! The assignment problem of [`super::search`] as a textbook MILP, solved by `good_lp`'s
//! microlp backend (pure Rust, no system packages).
//!
//! Variables and constraints (m items, N ranks, segments k of documents sorted by position):
//!
//! * `x[i][r] ∈ {0,1}`, `Σ_r x[i][r] = 1` (Eq. 1);
//! * `lo ≤ Σ_i t_i x[i][r] ≤ hi` (Eq. 2 for FlashCP; the token cap for FCP);
//! * `z ≥ Σ_i w_i x[i][r] / mean` (Eq. 3, linearised max), `z ≤ R` in min-comm mode;
//! * Eq. 5 linearised: a segment k of item i is exchanged (`e[k] = 1`) when the next segment
//!   k' of its document (item i') is on another rank or is itself exchanged:
//!   `e[k] ≥ x[i][r] − x[i'][r]` for every r and `e[k] ≥ e[k']`; the last segment has no
//!   such constraint. `y[k][r] ≥ e[k] + x[i][r] − 1` puts it on its rank's buffer and
//!   `c ≥ Σ_k len_k y[k][r]`;
//! * symmetry breaking: rank loads non-increasing (`load_0 ≥ load_1 ≥ …`), valid because
//!   ranks are interchangeable;
//! * the heuristic's value as an upper bound (`objective ≤ warm + ε`) and its assignment as
//!   microlp's warm start;
//! * minimise `α z + λ c / comm_ref`.
//!
//! microlp reports no lower bound, and when its time limit strikes it returns at best an
//! unproven incumbent (nothing when it has none), so [`super::search`] is the solver `fcp ilp`
//! uses; this model is the cross-check (tests on small instances) and the measurement in
//! `docs/ilp.md`.

// Index loops mirror the model's subscripts (x[i][r], y[k][r]); iterators would hide them.
#![allow(clippy::needless_range_loop)]

use std::time::Instant;

use good_lp::{
    constraint, microlp, solvers::SolutionStatus, variable, Expression, ProblemVariables,
    ResolutionError, Solution, SolverModel, Variable, WithInitialSolution, WithTimeLimit,
};

use super::search::Problem;

/// What microlp returned.
#[derive(Debug, Clone)]
pub struct MilpResult {
    /// Rank of every item.
    pub assign: Vec<u32>,
    /// Objective of that assignment (by [`Problem::evaluate`]).
    pub objective: f64,
    /// Seconds spent.
    pub solve_s: f64,
    /// Whether microlp proved its answer optimal (not an incumbent the time limit left).
    pub finished: bool,
}

/// Solve `p` with microlp, warm-started from `warm`, for at most `time_limit` seconds (none
/// when [`super::time_limit`] says it is too large to hold). The error says why microlp
/// returned nothing: [`ResolutionError::Infeasible`] is a proof that no assignment meets the
/// constraints; a time-out is [`ResolutionError::Other`].
/// The most variables [`solve`] builds a model of. microlp's model takes about a kilobyte a
/// variable before its time limit starts (flashcp at 64 ranks: 0.5 M variables, 0.6 GB; at
/// 128: 2.4 M, 2.6 GB and 3 s past a 1 s limit; at 256 it aborted out of memory: bug hunt).
pub const MAX_VARS: usize = 1_000_000;

/// Variables the MILP of `p` has: an assignment per item and rank, an exchange and a buffer
/// per document segment (per rank for the buffer), and the two objective terms.
pub fn model_vars(p: &Problem) -> usize {
    let n = p.ranks as usize;
    let segs: usize = p.items.iter().map(|i| i.segs.len()).sum();
    (p.items.len() + segs)
        .saturating_mul(n)
        .saturating_add(segs)
        .saturating_add(2)
}

pub fn solve(
    p: &Problem,
    warm: Option<&[u32]>,
    time_limit: f64,
) -> Result<MilpResult, ResolutionError> {
    let start = Instant::now();
    let n = p.ranks as usize;
    let m = p.items.len();
    let total: f64 = p.items.iter().map(|i| i.work).sum();
    let mean = (total / n.max(1) as f64).max(f64::MIN_POSITIVE);
    let mut vars = ProblemVariables::new();
    let x: Vec<Vec<Variable>> = (0..m)
        .map(|_| (0..n).map(|_| vars.add(variable().binary())).collect())
        .collect();
    let z = vars.add(variable().min(0.0));
    let c = vars.add(variable().min(0.0));
    // Segments in document order, each with its item.
    let mut segs: Vec<(u32, u64, u64, usize)> = Vec::new();
    for (i, it) in p.items.iter().enumerate() {
        for &(d, s, l) in &it.segs {
            segs.push((d, s, l, i));
        }
    }
    segs.sort_unstable();
    let e: Vec<Variable> = segs
        .iter()
        .map(|_| vars.add(variable().min(0.0).max(1.0)))
        .collect();
    let y: Vec<Vec<Variable>> = segs
        .iter()
        .map(|_| {
            (0..n)
                .map(|_| vars.add(variable().min(0.0).max(1.0)))
                .collect()
        })
        .collect();
    let objective: Expression = p.alpha * z + (p.lambda / p.comm_ref) * c;
    let mut model = vars.minimise(objective.clone()).using(microlp);
    for xi in &x {
        model.add_constraint(constraint!(xi.iter().copied().sum::<Expression>() == 1.0));
    }
    let load = |r: usize| -> Expression {
        (0..m)
            .map(|i| (p.items[i].work / mean) * x[i][r])
            .sum::<Expression>()
    };
    for r in 0..n {
        let tok: Expression = (0..m).map(|i| p.items[i].tokens as f64 * x[i][r]).sum();
        model.add_constraint(constraint!(tok.clone() <= p.hi as f64));
        model.add_constraint(constraint!(tok >= p.lo as f64));
        model.add_constraint(constraint!(z >= load(r)));
        if r + 1 < n {
            model.add_constraint(constraint!(load(r) >= load(r + 1)));
        }
    }
    if let Some(cap) = p.load_cap {
        model.add_constraint(constraint!(z <= cap + 1e-9));
    }
    for k in 0..segs.len() {
        let i = segs[k].3;
        if k + 1 < segs.len() && segs[k + 1].0 == segs[k].0 {
            let j = segs[k + 1].3;
            for r in 0..n {
                model.add_constraint(constraint!(e[k] >= x[i][r] - x[j][r]));
            }
            model.add_constraint(constraint!(e[k] >= e[k + 1]));
        }
        for r in 0..n {
            model.add_constraint(constraint!(y[k][r] >= e[k] + x[i][r] - 1.0));
        }
    }
    for r in 0..n {
        let buf: Expression = (0..segs.len()).map(|k| segs[k].2 as f64 * y[k][r]).sum();
        model.add_constraint(constraint!(c >= buf));
    }
    if let Some(w) = warm {
        let v = p.evaluate(w);
        if v.feasible {
            // Upper bound: never worse than the heuristic. (Ranks sorted by load so the warm
            // start also meets the symmetry-breaking order.)
            model.add_constraint(constraint!(objective <= v.objective + 1e-7));
            let mut loads = vec![0.0; n];
            for (it, &r) in p.items.iter().zip(w) {
                loads[r as usize] += it.work;
            }
            let mut by_load: Vec<usize> = (0..n).collect();
            by_load.sort_by(|&a, &b| loads[b].total_cmp(&loads[a]));
            let mut rename = vec![0u32; n];
            for (new, &old) in by_load.iter().enumerate() {
                rename[old] = new as u32;
            }
            let mut init: Vec<(Variable, f64)> = Vec::new();
            for (i, &r) in w.iter().enumerate() {
                for (q, &var) in x[i].iter().enumerate() {
                    init.push((var, f64::from(u8::from(rename[r as usize] as usize == q))));
                }
            }
            model = model.with_initial_solution(init);
        }
    }
    if let Some(limit) = super::time_limit(time_limit) {
        model = model.with_time_limit(limit.as_secs_f64());
    }
    let sol = model.solve()?;
    let assign: Vec<u32> = x
        .iter()
        .map(|xi| {
            (0..n)
                .max_by(|&a, &b| sol.value(xi[a]).total_cmp(&sol.value(xi[b])))
                .unwrap_or(0) as u32
        })
        .collect();
    Ok(MilpResult {
        objective: p.evaluate(&assign).objective,
        assign,
        solve_s: start.elapsed().as_secs_f64(),
        finished: matches!(sol.status(), SolutionStatus::Optimal),
    })
}
