//! `auto`: per batch, plan with every candidate scheme, simulate each plan as the planning
//! context judges (`PlanContext::judge`: forward and backward unless a command judges one
//! pass, with its recomputation and TP overlap) and keep the fastest — on the whole layer
//! (attention plus the projections and MLP, [`crate::sim::LayerCost`]) wherever the model and
//! hardware give its cost, as `hybrid` does, else on attention; the plan records its
//! `objective`. The one planner that simulates — that is its purpose: the
//! simulator is the most faithful cost model we have, and a scheme that is best on one batch
//! (Ulysses when every document is short, `hybrid` on a long tail) is not best on every batch.
//!
//! Candidates, in order (ties go to the earlier): `hybrid`, `hybrid:quick=true`, `fcp`,
//! `flashcp`, `magi`, `ulysses`, `wlb-llm`, `bytescale`, `per-doc`, `llama3`, and — up to 64
//! ranks, where their rings' tiles still verify and simulate quickly — `usp`, `zigzag` and
//! `ring`. A candidate that
//! refuses the batch is skipped. Without a budget every plan is verified before it is scored,
//! so `auto` never returns an invalid plan; under one the check too runs only when the time
//! left covers it, and the plan records `verified`.
//!
//! **Under a planning-time budget** (`budget_ms` > 0) the quick search goes first and its plan
//! is what a budget shorter than the quick search returns (30–50 ms at 256 ranks on 2 cores,
//! `docs/results/beyond.md` § Planning time). Every further candidate is started only when
//! the time left covers what it is expected to take — [`COST_VS_QUICK`] times what the quick
//! search took in this call, so the expectation follows the machine and the batch — and plans
//! are compared by `hybrid`'s step-level estimate ([`crate::planners::hybrid::estimate`], a
//! few milliseconds at 256 ranks) instead of the simulator (a third of a second there). Which
//! candidates fit depends on the machine's speed, so with a budget the plan is deterministic
//! only when the budget is far from what the candidates take; the default is no budget.
use std::collections::BTreeMap;
use std::time::Instant;

use crate::plan::{verify, Plan, PlanError};
use crate::sim::{ComputeModel, Simulator};
use crate::trace::Batch;

use super::{hybrid, planner_for, PlanContext, Planner, SchemeError, SchemeSpec};

/// Candidate schemes, in the order tried.
pub const CANDIDATES: [&str; 14] = [
    "hybrid",
    QUICK,
    "fcp",
    "flashcp",
    "magi",
    "ulysses",
    "wlb-llm",
    "bytescale",
    "per-doc",
    "llama3",
    // Bug hunt: under a full mask the contiguous split is balanced and sends what llama3
    // does; it was left out, and `auto` kept a slower plan.
    "llama3-contig",
    "usp",
    "zigzag",
    "ring",
];

/// The quick search: the first candidate under a budget.
pub const QUICK: &str = "hybrid:quick=true";

/// What each candidate is expected to take (planning, verifying, estimating), as a multiple of
/// the quick search's time in the same call: a budgeted `auto` starts a candidate only when the
/// time left covers it. The largest ratio measured in-process (2 cores, H100, the six traces
/// of `docs/results/beyond.md` at 64 and 256 ranks; the quick search took 14–86 ms), about
/// doubled and rounded — a budget is a ceiling: `hybrid` 23–42 ×, `flashcp` 0.5–96 ×,
/// `per-doc` 49–236 × and `wlb-llm` 30–150 × (at 256 ranks both refuse the batch after
/// seconds), `zigzag` up to 1,700 × and `ring` up to 690 × (64 ranks), `ulysses` 7–23 ×,
/// `llama3` 1–12 × (`llama3-contig`, the same all-gather and fewer tiles, priced alike), `magi` 0.5–2.2 ×, `fcp` 0.3–0.4 ×, `bytescale` 0.07–0.23 ×; `usp` (the
/// same six traces at 16 and 64 ranks, H100) 1.8–350 ×, nearly all of it verifying its
/// millions of tiles.
pub const COST_VS_QUICK: [(&str, f64); 13] = [
    ("hybrid", 80.0),
    ("fcp", 1.0),
    ("flashcp", 200.0),
    ("magi", 5.0),
    ("ulysses", 50.0),
    ("wlb-llm", 300.0),
    ("bytescale", 0.5),
    ("per-doc", 500.0),
    ("llama3", 25.0),
    ("llama3-contig", 25.0),
    ("usp", 700.0),
    ("zigzag", 3500.0),
    ("ring", 1500.0),
];

/// What verifying a plan is expected to take, as a multiple of the quick search's time (the
/// verifier on the quick search's plans at 256 ranks: ≈ 30 ms against 36 ms on magi, H100,
/// 2 cores; rounded up).
pub const VERIFY_VS_QUICK: f64 = 1.0;

/// Schemes tried only up to this many ranks (their plans have O(N²) steps, `usp` (N/8)² tiles
/// for each of 8 head groups).
const QUADRATIC: [&str; 3] = ["usp", "zigzag", "ring"];
/// See [`QUADRATIC`].
const QUADRATIC_MAX_RANKS: u32 = 64;

/// The `auto` planner.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Auto {
    /// Planning-time budget in milliseconds (0 = try every candidate).
    pub budget_ms: u64,
}

impl Auto {
    /// Parse `budget_ms=...`.
    pub fn from_spec(spec: &SchemeSpec) -> Result<Auto, SchemeError> {
        let mut a = Auto::default();
        for (k, v) in &spec.params {
            match k.as_str() {
                "budget_ms" => {
                    a.budget_ms = v.parse().map_err(|_| SchemeError::BadParam {
                        scheme: spec.name.clone(),
                        message: format!("`budget_ms` must be an integer ≥ 0, not `{v}`"),
                    })?
                }
                _ => return Err(SchemeError::not_taken(&spec.name, k, &["budget_ms"])),
            }
        }
        Ok(a)
    }
}

/// How `auto` compares candidates' attention time.
enum Scorer<'a> {
    /// The context's passes simulated (no budget).
    Simulate(Box<Simulator>),
    /// `hybrid`'s cost estimate (under a budget).
    Estimate(ComputeModel<'a>),
}

impl Planner for Auto {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        BTreeMap::from([("budget_ms".to_string(), self.budget_ms.into())])
    }

    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError> {
        let start = Instant::now();
        let budgeted = self.budget_ms > 0;
        // The simulator only without a budget (building it costs about what the quick search
        // does at 256 ranks); under one, `hybrid`'s estimate and the cost model it reads.
        let profile = if budgeted {
            Some(
                ctx.hardware
                    .kernel_profile()
                    .map_err(|e| PlanError::Planning(format!("auto: cost model: {e}")))?,
            )
        } else {
            None
        };
        // The objective is `hybrid`'s: the whole layer wherever its cost is known.
        let layer = hybrid::judged_layer(ctx).ok();
        let mut scorer = match &profile {
            Some(profile) => Scorer::Estimate(ComputeModel::new(ctx.hardware, profile, ctx.model)),
            None => {
                let sim = hybrid::judging_simulator(ctx, layer.is_some())
                    .map_err(|e| PlanError::Planning(format!("auto: {e}")))?;
                Scorer::Simulate(Box::new(sim))
            }
        };
        // Under a budget the quick search first, the rest in their order.
        let order: Vec<&str> = if budgeted {
            std::iter::once(QUICK)
                .chain(CANDIDATES.into_iter().filter(|&c| c != QUICK))
                .collect()
        } else {
            CANDIDATES.to_vec()
        };
        let budget = std::time::Duration::from_millis(self.budget_ms);
        let mut quick_took: Option<std::time::Duration> = None;
        let mut best: Option<(f64, &str, Plan, bool)> = None;
        let mut tried = Vec::new();
        // Why each candidate that failed did, to say when none planned (bug hunt: "no
        // candidate scheme planned this batch" alone, where each had a clear reason).
        let mut why: Vec<String> = Vec::new();
        for name in order {
            if QUADRATIC.contains(&name) && ctx.ranks > QUADRATIC_MAX_RANKS {
                continue;
            }
            if let (true, Some(q)) = (budgeted, quick_took) {
                let factor = COST_VS_QUICK
                    .iter()
                    .find(|c| c.0 == name)
                    .map_or(1.0, |c| c.1);
                if start.elapsed() + q.mul_f64(factor) > budget {
                    continue;
                }
            }
            let planner = planner_for(name).map_err(|e| PlanError::Planning(e.to_string()))?;
            let planned = planner.plan(batch, ctx);
            if name == QUICK {
                quick_took = Some(start.elapsed());
            }
            let plan = match planned {
                Ok(plan) => plan,
                Err(e) => {
                    why.push(named(name, &e));
                    continue;
                }
            };
            // Under a budget the check runs when the time left covers it (the plan records
            // whether it ran): planners' plans verify by construction (`tests/properties.rs`
            // checks every scheme on random traces), and at 256 ranks the check costs about
            // what the quick search does.
            let check = !budgeted
                || quick_took
                    .is_some_and(|q| start.elapsed() + q.mul_f64(VERIFY_VS_QUICK) <= budget);
            if check && !verify(&plan).is_empty() {
                why.push(format!("{name}: its plan did not verify"));
                continue;
            }
            let t = match &mut scorer {
                Scorer::Estimate(cm) => match hybrid::estimate(&plan, ctx, cm, layer.as_ref()) {
                    Ok(seconds) => seconds * 1e3,
                    Err(e) => {
                        why.push(named(name, &e));
                        continue;
                    }
                },
                Scorer::Simulate(sim) => match hybrid::objective_of(sim, &plan, ctx.judge.pass) {
                    Ok(ms) => ms,
                    Err(e) => {
                        why.push(named(name, &e));
                        continue;
                    }
                },
            };
            tried.push(name);
            if best.as_ref().is_none_or(|b| t < b.0) {
                best = Some((t, name, plan, check));
            }
        }
        let (_, chosen, mut plan, verified) = best.ok_or_else(|| {
            let shown: Vec<&str> = why.iter().take(3).map(String::as_str).collect();
            let more = why.len().saturating_sub(shown.len());
            PlanError::Planning(format!(
                "auto: no candidate scheme planned this batch{}{}",
                if shown.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", shown.join("; "))
                },
                if more > 0 {
                    format!("; and {more} more")
                } else {
                    String::new()
                }
            ))
        })?;
        let mut params = self.params();
        params.insert("chosen".to_string(), chosen.into());
        params.insert("tried".to_string(), tried.join(",").into());
        let compared = if budgeted { "estimate" } else { "simulation" };
        params.insert("compared_by".to_string(), compared.into());
        let objective = if layer.is_some() {
            "layer"
        } else {
            "attention"
        };
        params.insert("objective".to_string(), objective.into());
        hybrid::record_judge(&mut params, ctx, layer.is_some());
        params.insert("verified".to_string(), verified.into());
        let inner = std::mem::take(&mut plan.scheme.params);
        params.insert(
            "chosen_params".to_string(),
            serde_json::Value::Object(inner.into_iter().collect()),
        );
        plan.scheme.name = self.name().to_string();
        plan.scheme.params = params;
        Ok(plan)
    }
}

/// `error`, led by the candidate's name unless it already is.
fn named(name: &str, error: &dyn std::fmt::Display) -> String {
    let e = error.to_string();
    if e.starts_with(&format!("{name}:")) {
        e
    } else {
        format!("{name}: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::testing::{assert_valid, simulated_layer_ms, with_ctx};

    /// Regression (bug hunt): when no candidate planned, auto said so and nothing more.
    #[test]
    fn regression_auto_says_why_no_candidate_planned() {
        let e = with_ctx(8, Mask::Causal, |ctx| {
            Auto::default().plan(&crate::trace::Batch::new(0, vec![1 << 32]), ctx)
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("no candidate scheme planned this batch ("),
            "{e}"
        );
        assert!(e.contains("more than the 33554432 a plan may hold"), "{e}");
        assert!(!e.contains("fcp: fcp:"), "{e}");
    }

    #[test]
    fn auto_keeps_the_fastest_simulated_candidate() {
        // Fastest on the whole layer: the bundled model gives its widths.
        let batch = Batch::new(0, vec![3000, 500, 200, 200, 100, 40]);
        with_ctx(4, Mask::Causal, |ctx| {
            let plan = Auto::default().plan(&batch, ctx).unwrap();
            assert_valid(&plan);
            assert_eq!(plan.scheme.name, "auto");
            let chosen = plan.scheme.params["chosen"].as_str().unwrap().to_string();
            assert_eq!(plan.scheme.params["objective"], "layer");
            let t = |p: &Plan| simulated_layer_ms(ctx, p);
            let mine = t(&plan);
            for name in CANDIDATES {
                let other = planner_for(name).unwrap().plan(&batch, ctx);
                if let Ok(other) = other {
                    assert!(mine <= t(&other), "{chosen} slower than {name}");
                }
            }
        });
    }

    #[test]
    fn auto_chooses_by_the_passes_of_its_context() {
        // One 128K-token document cut to 2 × 32K: llama3 is fastest forward, another
        // candidate in training. Judged on the forward pass alone, auto is no slower than
        // llama3 there, and the plan says which pass it was judged on.
        let batch = Batch::new(0, vec![65536]);
        with_ctx(2, Mask::Causal, |ctx| {
            let ctx = PlanContext {
                tokens_per_rank: 32768,
                judge: crate::planners::Judge {
                    pass: crate::sim::PassSel::Fwd,
                    ..Default::default()
                },
                ..ctx.clone()
            };
            let plan = Auto::default().plan(&batch, &ctx).unwrap();
            assert_eq!(plan.scheme.params["objective_pass"], "fwd");
            let sim = Simulator::new(ctx.hardware.clone(), ctx.model.clone())
                .unwrap()
                .with_layer()
                .unwrap();
            let fwd = |p: &Plan| {
                sim.layer_time_ms(p, crate::sim::PassSel::Fwd)
                    .unwrap()
                    .unwrap()
            };
            let llama3 = planner_for("llama3").unwrap().plan(&batch, &ctx).unwrap();
            assert!(
                fwd(&plan) <= fwd(&llama3),
                "{} vs {}",
                fwd(&plan),
                fwd(&llama3)
            );
            let trained = Auto::default()
                .plan(
                    &batch,
                    &PlanContext {
                        judge: crate::planners::Judge::default(),
                        ..ctx.clone()
                    },
                )
                .unwrap();
            assert!(!trained.scheme.params.contains_key("objective_pass"));
        });
    }

    #[test]
    fn under_a_budget_the_quick_search_goes_first_and_estimates_decide() {
        // A 1 ms budget: the quick search always runs first, and whatever else the time left
        // covered was compared with it by the estimate; the plan verifies either way.
        let batch = Batch::new(0, vec![3000, 500, 200, 200, 100, 40]);
        with_ctx(16, Mask::Causal, |ctx| {
            let plan = Auto { budget_ms: 1 }.plan(&batch, ctx).unwrap();
            assert_valid(&plan);
            let p = &plan.scheme.params;
            let tried: Vec<&str> = p["tried"].as_str().unwrap().split(',').collect();
            assert_eq!(tried[0], QUICK);
            assert!(tried.contains(&p["chosen"].as_str().unwrap()));
            assert_eq!(p["compared_by"], "estimate");
            assert!(p["verified"].is_boolean());
            // Without a budget every candidate is simulated.
            let all = Auto::default().plan(&batch, ctx).unwrap();
            assert_eq!(all.scheme.params["compared_by"], "simulation");
            assert_eq!(all.scheme.params["verified"], true);
            assert_eq!(
                all.scheme.params["tried"]
                    .as_str()
                    .unwrap()
                    .split(',')
                    .next(),
                Some("hybrid")
            );
        });
    }

    /// Regression (bug hunt): `llama3-contig` was no candidate, and under a full mask it
    /// planned faster than what `auto` kept. Every scheme is one now.
    #[test]
    fn regression_auto_left_a_scheme_out() {
        for name in crate::planners::SCHEMES {
            assert!(CANDIDATES.contains(name), "{name}");
        }
    }

    #[test]
    fn every_candidate_has_an_expected_cost() {
        for name in CANDIDATES.into_iter().filter(|&c| c != QUICK) {
            assert!(COST_VS_QUICK.iter().any(|c| c.0 == name), "{name}");
        }
    }
}
