//! `auto`: per batch, plan with every candidate scheme, simulate each plan (forward and
//! backward) and keep the fastest. The one planner that simulates — that is its purpose: the
//! simulator is the most faithful cost model we have, and a scheme that is best on one batch
//! (Ulysses when every document is short, `hybrid` on a long tail) is not best on every batch.
//!
//! Candidates, in order (ties go to the earlier): `hybrid`, `fcp`, `flashcp`, `magi`,
//! `ulysses`, `wlb-llm`, `bytescale`, `per-doc`, `llama3`, and — up to 64 ranks, where their N²
//! steps still simulate quickly — `zigzag` and `ring`. A candidate that refuses the batch is
//! skipped. Every plan is verified before it is simulated, so `auto` never returns an invalid
//! plan.
//!
//! `budget_ms` (0 = none) stops trying further candidates once planning has taken that long;
//! the candidates already tried are ordered so the likeliest winners come first. With a budget
//! that is hit, the choice depends on the machine's speed, so the plan is deterministic only
//! without one (the default).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::plan::{verify, Plan, PlanError};
use crate::sim::{PassSel, Simulator};
use crate::trace::Batch;

use super::{planner_for, PlanContext, Planner, SchemeError, SchemeSpec};

/// Candidate schemes, in the order tried.
pub const CANDIDATES: [&str; 11] = [
    "hybrid",
    "fcp",
    "flashcp",
    "magi",
    "ulysses",
    "wlb-llm",
    "bytescale",
    "per-doc",
    "llama3",
    "zigzag",
    "ring",
];

/// Schemes tried only up to this many ranks (their plans have O(N²) steps).
const QUADRATIC: [&str; 2] = ["zigzag", "ring"];
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
                _ => {
                    return Err(SchemeError::BadParam {
                        scheme: spec.name.clone(),
                        message: format!("takes no parameter `{k}` (known: budget_ms)"),
                    })
                }
            }
        }
        Ok(a)
    }
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
        let sim = Simulator::new(ctx.hardware.clone(), ctx.model.clone())
            .map_err(|e| PlanError::Planning(format!("auto: {e}")))?;
        let mut best: Option<(f64, &str, Plan)> = None;
        let mut tried = Vec::new();
        for name in CANDIDATES {
            if QUADRATIC.contains(&name) && ctx.ranks > QUADRATIC_MAX_RANKS {
                continue;
            }
            if self.budget_ms > 0
                && best.is_some()
                && start.elapsed().as_millis() >= u128::from(self.budget_ms)
            {
                break;
            }
            let planner = planner_for(name).map_err(|e| PlanError::Planning(e.to_string()))?;
            let Ok(plan) = planner.plan(batch, ctx) else {
                continue;
            };
            if !verify(&plan).is_empty() {
                continue;
            }
            let Ok(report) = sim.simulate(&plan, PassSel::Both) else {
                continue;
            };
            tried.push(name);
            let t = report.metrics.attention_time_ms;
            if best.as_ref().is_none_or(|b| t < b.0) {
                best = Some((t, name, plan));
            }
        }
        let (_, chosen, mut plan) = best.ok_or_else(|| {
            PlanError::Planning("auto: no candidate scheme planned this batch".into())
        })?;
        let mut params = self.params();
        params.insert("chosen".to_string(), chosen.into());
        params.insert("tried".to_string(), tried.join(",").into());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;
    use crate::planners::testing::{assert_valid, with_ctx};

    #[test]
    fn auto_keeps_the_fastest_simulated_candidate() {
        let batch = Batch::new(0, vec![3000, 500, 200, 200, 100, 40]);
        with_ctx(4, Mask::Causal, |ctx| {
            let plan = Auto::default().plan(&batch, ctx).unwrap();
            assert_valid(&plan);
            assert_eq!(plan.scheme.name, "auto");
            let chosen = plan.scheme.params["chosen"].as_str().unwrap().to_string();
            let sim = Simulator::new(ctx.hardware.clone(), ctx.model.clone()).unwrap();
            let t = |p: &Plan| {
                sim.simulate(p, PassSel::Both)
                    .unwrap()
                    .metrics
                    .attention_time_ms
            };
            let mine = t(&plan);
            for name in CANDIDATES {
                let other = planner_for(name).unwrap().plan(&batch, ctx);
                if let Ok(other) = other {
                    assert!(mine <= t(&other), "{chosen} slower than {name}");
                }
            }
        });
    }
}
