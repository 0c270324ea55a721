//! The exact solver: depth-first branch and bound over piece → rank assignments.
//!
//! Both formulations in this module's parent (FlashCP's pieces, FCP's units) are the same
//! combinatorial problem: put every item (tokens `t_i`, rank-independent workload `w_i`) on one
//! of N interchangeable ranks, keep every rank's tokens in `[lo, hi]`, and minimise
//! `α · max_r load_r + λ · max_r comm_r` (optionally subject to `max_r load_r ≤ cap`), where
//! `comm_r` counts the tokens of rank `r`'s segments that a later segment of the same document
//! on another rank reads (Eq. 5's `Ŝ`: every shard but the last of a split document).
//!
//! Why not hand the MILP (see [`super::milp`]) to a solver: the only solver `good_lp` offers
//! without system packages is microlp, which reports no lower bound and returns at best an
//! unproven incumbent when its time limit strikes (`docs/ilp.md`). This search
//! is exact on the same model, always holds an incumbent (the heuristic's plan), and proves a
//! bound:
//!
//! * **Incumbent**: the warm start (the heuristic's assignment), so a time-out returns a plan
//!   at least as good as the heuristic's, with its gap.
//! * **Symmetry breaking**: ranks are interchangeable, so among ranks in the same state (load,
//!   tokens, comm, and not the current document's tail rank) only the first is tried; the first
//!   item therefore goes to rank 0 only.
//! * **Bounds** at every node: the load part is the water level the remaining work reaches when
//!   poured onto the current loads (never below the current maximum); the comm part is the
//!   larger of the current maximum and the water level of the tokens the remaining documents
//!   must exchange (a document whose workload exceeds the load cap must leave a prefix on other
//!   ranks, at least `len − s` tokens for the longest suffix `s` that fits under the cap); a
//!   token-deficit test prunes nodes that can no longer reach `lo` on every rank.
//! * **Incremental comm** (`Problem::chain`): items of a document are visited last segment
//!   first, so whether a segment is exchanged is known when it is placed (it is unless every
//!   later segment of its document sits on the same rank).

use std::time::{Duration, Instant};

/// One item to place: one or more segments of documents, moved together.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Tokens.
    pub tokens: u64,
    /// Workload, in any unit (the objective divides by the mean rank load).
    pub work: f64,
    /// Segments `(doc, start, len)`: what decides which tokens are exchanged.
    pub segs: Vec<(u32, u64, u64)>,
}

/// The assignment problem.
#[derive(Debug, Clone)]
pub struct Problem {
    /// Items.
    pub items: Vec<Item>,
    /// Ranks N.
    pub ranks: u32,
    /// Fewest tokens a rank may hold.
    pub lo: u64,
    /// Most tokens a rank may hold.
    pub hi: u64,
    /// Weight of the max load term (max load is measured in units of the mean load, so the
    /// term is the imbalance ratio max/mean).
    pub alpha: f64,
    /// Weight of the comm term (max exchanged tokens per rank / `comm_ref`).
    pub lambda: f64,
    /// Tokens that make the comm term 1, so the term is `1 − saving`. Both formulations use
    /// `hi`, the most tokens one rank may hold (FlashCP: Eq. 2's `⌈C/N⌉`, Eq. 4's `C/N`
    /// rounded up; FCP: the token cap): a rank only exchanges tokens it holds, so the term
    /// never exceeds 1 and a valid plan's saving is never negative. (`⌊C/N⌋` read −0.1% when
    /// `N` does not divide `C` and a rank holding `⌈C/N⌉` tokens exchanged them all.)
    pub comm_ref: f64,
    /// Hard cap on max load / mean (min-comm mode's R); `None` for no cap.
    pub load_cap: Option<f64>,
    /// Items are single segments, each document's items contiguous and visited last segment
    /// first: comm is then exact at every node, not only at leaves.
    pub chain: bool,
    /// Per document, the fewest tokens it must exchange when no rank may carry more than
    /// the load cap (0 where unknown); used only with `chain`.
    pub forced_exchange: Vec<u64>,
}

/// How a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The search finished: the incumbent is optimal.
    Optimal,
    /// A solution without a proof of optimality from a solver that stopped on its own
    /// (reserved for MILP back ends; the search itself ends optimal, timed out or
    /// infeasible).
    Feasible,
    /// The time limit struck; the incumbent is returned with its gap.
    TimedOut,
    /// The solver finished and proved that no assignment meets the constraints (the token
    /// bounds, and in min-comm mode the load cap): there is no incumbent, and the bound is
    /// infinite. Not `Optimal`: an optimum needs a feasible point.
    Infeasible,
}

impl Status {
    /// `optimal`, `feasible`, `timed out`, `infeasible`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Optimal => "optimal",
            Status::Feasible => "feasible",
            Status::TimedOut => "timed out",
            Status::Infeasible => "infeasible",
        }
    }
}

/// `(objective − bound) / objective`, never negative; 0 where it means nothing (no feasible
/// objective, or a zero one). Both solvers report their gap through this.
pub fn gap(objective: f64, bound: f64) -> f64 {
    if objective.is_finite() && objective > 0.0 {
        ((objective - bound) / objective).max(0.0)
    } else {
        0.0
    }
}

/// The value of one assignment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Value {
    /// `α · imbalance + λ · comm` (infinite when infeasible).
    pub objective: f64,
    /// max / mean load.
    pub imbalance: f64,
    /// Max exchanged tokens on one rank.
    pub comm_tokens: u64,
    /// Every rank's tokens within `[lo, hi]` and the load cap met.
    pub feasible: bool,
}

/// A search's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Rank of every item (the best found).
    pub assign: Vec<u32>,
    /// Its value.
    pub value: Value,
    /// Proven lower bound on the objective.
    pub bound: f64,
    /// `(objective − bound) / objective` (0 when optimal).
    pub gap: f64,
    /// How it ended.
    pub status: Status,
    /// Seconds spent.
    pub solve_s: f64,
    /// Search nodes visited.
    pub nodes: u64,
}

const EPS: f64 = 1e-9;

impl Problem {
    fn mean(&self) -> f64 {
        let total: f64 = self.items.iter().map(|i| i.work).sum();
        (total / f64::from(self.ranks.max(1))).max(f64::MIN_POSITIVE)
    }

    /// Per rank, the tokens other ranks read from it: a segment is exchanged when a later
    /// segment of its document sits on another rank.
    pub fn exchanged(&self, assign: &[u32]) -> Vec<u64> {
        let mut segs: Vec<(u32, u64, u64, u32)> = Vec::new();
        for (i, it) in self.items.iter().enumerate() {
            for &(d, s, l) in &it.segs {
                segs.push((d, s, l, assign[i]));
            }
        }
        segs.sort_unstable();
        let mut out = vec![0u64; self.ranks as usize];
        // Walk each document from its last segment back, remembering whether every later
        // segment sat on one rank.
        let mut i = segs.len();
        while i > 0 {
            let doc = segs[i - 1].0;
            let mut tail: Option<u32> = Some(segs[i - 1].3);
            while i > 0 && segs[i - 1].0 == doc {
                let (_, _, l, r) = segs[i - 1];
                if tail != Some(r) {
                    tail = None;
                    out[r as usize] += l;
                }
                i -= 1;
            }
        }
        out
    }

    /// Whether every rank's tokens under `assign` are within `[lo, hi]`.
    pub fn tokens_fit(&self, assign: &[u32]) -> bool {
        let mut tokens = vec![0u64; self.ranks as usize];
        for (it, &r) in self.items.iter().zip(assign) {
            tokens[r as usize] += it.tokens;
        }
        tokens.iter().all(|&t| t >= self.lo && t <= self.hi)
    }

    /// Evaluate an assignment.
    pub fn evaluate(&self, assign: &[u32]) -> Value {
        let n = self.ranks as usize;
        let mean = self.mean();
        let mut loads = vec![0.0; n];
        for (it, &r) in self.items.iter().zip(assign) {
            loads[r as usize] += it.work;
        }
        let imbalance = loads.iter().copied().fold(0.0, f64::max) / mean;
        let comm_tokens = self.exchanged(assign).into_iter().max().unwrap_or(0);
        let feasible =
            self.tokens_fit(assign) && self.load_cap.is_none_or(|c| imbalance <= c + EPS);
        let objective = self.alpha * imbalance + self.lambda * comm_tokens as f64 / self.comm_ref;
        Value {
            objective: if feasible { objective } else { f64::INFINITY },
            imbalance,
            comm_tokens,
            feasible,
        }
    }

    /// The bound at the root: the load term at its ideal (the mean, or the heaviest item) and
    /// the comm term at the forced exchange spread evenly.
    pub fn root_bound(&self) -> f64 {
        let mean = self.mean();
        let heaviest = self.items.iter().map(|i| i.work).fold(0.0, f64::max) / mean;
        let forced: u64 = if self.chain {
            self.forced_exchange.iter().sum()
        } else {
            0
        };
        let comm = forced as f64 / f64::from(self.ranks.max(1));
        self.alpha * heaviest.max(1.0) + self.lambda * comm / self.comm_ref
    }
}

/// Water level reached by pouring `amount` onto `levels`, never below their maximum.
fn water(levels: &[f64], amount: f64) -> f64 {
    let mut v: Vec<f64> = levels.to_vec();
    v.sort_by(f64::total_cmp);
    let max = *v.last().unwrap_or(&0.0);
    let mut rest = amount;
    for k in 0..v.len() {
        let next = if k + 1 < v.len() {
            v[k + 1]
        } else {
            f64::INFINITY
        };
        let room = (next - v[k]) * (k + 1) as f64;
        if rest <= room {
            return (v[k] + rest / (k + 1) as f64).max(max);
        }
        rest -= room;
    }
    max
}

struct Search<'a> {
    p: &'a Problem,
    order: Vec<usize>,
    /// Work (in mean units) and tokens of items `order[k..]`.
    rest_work: Vec<f64>,
    rest_tokens: Vec<u64>,
    /// Forced exchange tokens of the documents whose first visited item is at `order[k..]`.
    rest_forced: Vec<f64>,
    work: Vec<f64>,
    loads: Vec<f64>,
    tokens: Vec<u64>,
    comm: Vec<u64>,
    assign: Vec<u32>,
    best: Vec<u32>,
    best_obj: f64,
    nodes: u64,
    start: Instant,
    /// `None`: no limit ([`super::time_limit`]).
    limit: Option<Duration>,
    timed_out: bool,
}

impl Search<'_> {
    fn bound(&self, k: usize) -> f64 {
        let load = water(&self.loads, self.rest_work[k]);
        let comm_now = self.comm.iter().copied().max().unwrap_or(0) as f64;
        let comm_levels: Vec<f64> = self.comm.iter().map(|&c| c as f64).collect();
        let comm = water(&comm_levels, self.rest_forced[k]).max(comm_now);
        self.p.alpha * load + self.p.lambda * comm / self.p.comm_ref
    }

    fn load_ok(&self, k: usize) -> bool {
        match self.p.load_cap {
            Some(c) => water(&self.loads, self.rest_work[k]) <= c + EPS,
            None => true,
        }
    }

    fn dfs(&mut self, k: usize, tail: Option<u32>) {
        self.nodes += 1;
        if self.nodes % 4096 == 0 && self.limit.is_some_and(|l| self.start.elapsed() > l) {
            self.timed_out = true;
        }
        if self.timed_out {
            return;
        }
        if k == self.order.len() {
            let v = self.p.evaluate(&self.assign);
            if v.feasible && v.objective < self.best_obj - EPS {
                self.best_obj = v.objective;
                self.best.clone_from(&self.assign);
            }
            return;
        }
        // Token deficit: the remaining tokens must lift every rank to `lo`.
        let deficit: u64 = self
            .tokens
            .iter()
            .map(|&t| self.p.lo.saturating_sub(t))
            .sum();
        if deficit > self.rest_tokens[k] {
            return;
        }
        if !self.load_ok(k) || self.bound(k) >= self.best_obj - EPS {
            return;
        }
        let i = self.order[k];
        let item = &self.p.items[i];
        let doc = item.segs.first().map(|s| s.0);
        // A new document starts when the previous visited item belonged to another one.
        let same_doc = k > 0 && self.p.items[self.order[k - 1]].segs.first().map(|s| s.0) == doc;
        let tail = if same_doc { tail } else { None };
        let fresh = !same_doc;
        let n = self.p.ranks as usize;
        let mut ranks: Vec<usize> = (0..n).collect();
        ranks.sort_by(|&a, &b| {
            let ta = tail == Some(a as u32);
            let tb = tail == Some(b as u32);
            tb.cmp(&ta)
                .then(self.loads[a].total_cmp(&self.loads[b]))
                .then(a.cmp(&b))
        });
        let mut tried: Vec<usize> = Vec::new();
        for r in ranks {
            if self.tokens[r] + item.tokens > self.p.hi {
                continue;
            }
            let is_tail = tail == Some(r as u32);
            // Symmetry: a rank in the same state as one already tried (neither the tail)
            // leads to the same subtrees up to renaming. Under `chain` the state is its load,
            // tokens and exchange so far; without it the exchange is only counted at the
            // leaves, from which documents' pieces each rank holds, so only two empty ranks
            // are alike (bug hunt: two ranks of equal load holding blocks of different
            // documents were taken for alike, and the search proved a worse FCP assignment
            // optimal, 1.1387 where microlp found 1.1298).
            if !is_tail
                && tried.iter().any(|&q| {
                    tail != Some(q as u32)
                        && self.loads[q] == self.loads[r]
                        && self.tokens[q] == self.tokens[r]
                        && self.comm[q] == self.comm[r]
                        && (self.p.chain || self.tokens[q] == 0)
                })
            {
                continue;
            }
            tried.push(r);
            // Exchanged: under `chain`, unless every later segment of the doc is on `r`.
            let (exch, next_tail) = if self.p.chain {
                if fresh || is_tail {
                    (0, Some(r as u32))
                } else {
                    (item.tokens, None)
                }
            } else {
                (0, None)
            };
            self.loads[r] += self.work[i];
            self.tokens[r] += item.tokens;
            self.comm[r] += exch;
            self.assign[i] = r as u32;
            self.dfs(k + 1, next_tail);
            self.loads[r] -= self.work[i];
            self.tokens[r] -= item.tokens;
            self.comm[r] -= exch;
            if self.timed_out {
                return;
            }
        }
    }
}

/// Solve `p` exactly within `time_limit` seconds (none when too large to hold, see
/// [`super::time_limit`]), starting from the incumbent `warm` (which must be feasible to
/// count). The result is never worse than `warm`; when the search finishes without any
/// feasible assignment the status is [`Status::Infeasible`].
pub fn solve(p: &Problem, warm: Option<&[u32]>, time_limit: f64) -> Outcome {
    let start = Instant::now();
    let n = p.ranks as usize;
    let mean = p.mean();
    // Visit order: documents by total work, heaviest first; inside a document (chain) its
    // segments last first. Without chain: items heaviest first.
    let mut order: Vec<usize> = (0..p.items.len()).collect();
    if p.chain {
        let mut doc_work: std::collections::BTreeMap<u32, f64> = Default::default();
        for it in &p.items {
            *doc_work.entry(it.segs[0].0).or_default() += it.work;
        }
        order.sort_by(|&a, &b| {
            let (sa, sb) = (p.items[a].segs[0], p.items[b].segs[0]);
            doc_work[&sb.0]
                .total_cmp(&doc_work[&sa.0])
                .then(sa.0.cmp(&sb.0))
                .then(sb.1.cmp(&sa.1))
        });
    } else {
        order.sort_by(|&a, &b| p.items[b].work.total_cmp(&p.items[a].work).then(a.cmp(&b)));
    }
    let m = order.len();
    let mut rest_work = vec![0.0; m + 1];
    let mut rest_tokens = vec![0u64; m + 1];
    let mut rest_forced = vec![0.0; m + 1];
    for k in (0..m).rev() {
        let it = &p.items[order[k]];
        rest_work[k] = rest_work[k + 1] + it.work / mean;
        rest_tokens[k] = rest_tokens[k + 1] + it.tokens;
        // A document's forced exchange counts until its first visited item is placed.
        let first_of_doc = k == 0
            || p.items[order[k - 1]].segs.first().map(|s| s.0) != it.segs.first().map(|s| s.0);
        let forced = if p.chain && first_of_doc {
            p.forced_exchange
                .get(it.segs[0].0 as usize)
                .copied()
                .unwrap_or(0) as f64
        } else {
            0.0
        };
        rest_forced[k] = rest_forced[k + 1] + forced;
    }
    let (best, best_obj) = match warm {
        Some(w) => {
            let v = p.evaluate(w);
            (w.to_vec(), v.objective)
        }
        None => (vec![0; p.items.len()], f64::INFINITY),
    };
    let root = p.root_bound();
    let mut s = Search {
        p,
        work: p.items.iter().map(|i| i.work / mean).collect(),
        order,
        rest_work,
        rest_tokens,
        rest_forced,
        loads: vec![0.0; n],
        tokens: vec![0; n],
        comm: vec![0; n],
        assign: vec![0; p.items.len()],
        best,
        best_obj,
        nodes: 0,
        start,
        limit: super::time_limit(time_limit),
        timed_out: false,
    };
    // The incumbent already meets the root bound: nothing to search.
    if s.best_obj > root + EPS {
        s.dfs(0, None);
    }
    let value = p.evaluate(&s.best);
    let (status, bound) = if s.timed_out {
        (Status::TimedOut, root.min(value.objective))
    } else if value.feasible {
        (Status::Optimal, value.objective)
    } else {
        // Finished with nothing feasible: a proof of infeasibility, not an optimum.
        (Status::Infeasible, f64::INFINITY)
    };
    Outcome {
        assign: s.best,
        value,
        bound,
        gap: gap(value.objective, bound),
        status,
        solve_s: start.elapsed().as_secs_f64(),
        nodes: s.nodes,
    }
}

/// Every assignment tried, for tests on small instances (N^items leaves; keep it ≤ 12 items).
pub fn brute_force(p: &Problem) -> Option<(Vec<u32>, Value)> {
    let m = p.items.len();
    let n = p.ranks;
    let mut assign = vec![0u32; m];
    let mut best: Option<(Vec<u32>, Value)> = None;
    loop {
        let v = p.evaluate(&assign);
        if v.feasible
            && best
                .as_ref()
                .is_none_or(|b| v.objective < b.1.objective - EPS)
        {
            best = Some((assign.clone(), v));
        }
        // Next assignment in base N.
        let mut k = 0;
        while k < m {
            assign[k] += 1;
            if assign[k] < n {
                break;
            }
            assign[k] = 0;
            k += 1;
        }
        if k == m {
            return best;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two 3-token items on one rank that may hold 4: nothing fits.
    fn impossible() -> Problem {
        let item = |doc| Item {
            tokens: 3,
            work: 1.0,
            segs: vec![(doc, 0, 3)],
        };
        Problem {
            items: vec![item(0), item(1)],
            ranks: 1,
            lo: 0,
            hi: 4,
            alpha: 1.0,
            lambda: 0.0,
            comm_ref: 4.0,
            load_cap: None,
            chain: false,
            forced_exchange: Vec::new(),
        }
    }

    /// Regression (bug hunt): a search that finished with nothing feasible said `Optimal`.
    #[test]
    fn search_with_nothing_feasible_is_infeasible_not_optimal() {
        let o = solve(&impossible(), None, 10.0);
        assert_eq!(o.status, Status::Infeasible);
        assert!(o.bound.is_infinite() && !o.value.feasible);
        assert_eq!(o.gap, 0.0);
    }

    /// Regression (bug hunt): an infinite limit is no limit, not a panic or an instant time-out.
    #[test]
    fn search_time_limit_inf_is_no_limit() {
        let mut p = impossible();
        p.hi = 6;
        for limit in [f64::INFINITY, 1e20] {
            let o = solve(&p, None, limit);
            assert_eq!(o.status, Status::Optimal);
        }
    }
}
