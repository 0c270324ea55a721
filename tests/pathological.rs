//! Pathological batches for every planner (issue 11): each gives a plan that verifies —
//! structurally and numerically — or a clear planning error, never a panic or an invalid plan.

use fcp::hardware::Hardware;
use fcp::plan::{check_numeric, verify, Mask, NumericOptions};
use fcp::planners::{planner_for, PlanContext, SCHEMES};
use fcp::{Batch, Model};

fn cases() -> Vec<(&'static str, Vec<u64>, u32)> {
    vec![
        ("one document fills the batch", vec![4096], 4),
        ("all 1-token documents", vec![1; 64], 8),
        ("more ranks than tokens", vec![3], 64),
        (
            "more ranks than tokens, several documents",
            vec![1, 2, 1],
            16,
        ),
        ("a single rank", vec![700, 1, 3000], 1),
        ("odd group size", vec![1000, 999, 17], 7),
    ]
}

fn check(scheme: &str, what: &str, lens: &[u64], ranks: u32) {
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-8b").unwrap();
    let tokens: u64 = lens.iter().sum();
    let ctx = PlanContext {
        ranks,
        tokens_per_rank: tokens.div_ceil(u64::from(ranks)).max(1),
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
    };
    match planner_for(scheme)
        .unwrap()
        .plan(&Batch::new(0, lens.to_vec()), &ctx)
    {
        Ok(plan) => {
            let v = verify(&plan);
            assert!(v.is_empty(), "{scheme}, {what}: {v:?}");
            let opts = NumericOptions {
                max_rows_per_doc: 128,
                ..NumericOptions::default()
            };
            let r = check_numeric(&plan, &opts);
            assert!(r.max_abs_error < 1e-9, "{scheme}, {what}: {r:?}");
        }
        Err(e) => {
            // A refusal must say why (Ulysses: heads not divisible by N).
            let msg = e.to_string();
            assert!(msg.len() > 20, "{scheme}, {what}: unhelpful error `{msg}`");
        }
    }
}

#[test]
fn every_planner_survives_pathological_batches() {
    for scheme in SCHEMES {
        for (what, lens, ranks) in cases() {
            check(scheme, what, &lens, ranks);
        }
    }
}

#[test]
fn fcp_block_larger_than_every_document() {
    for (what, lens, ranks) in cases() {
        check("fcp:block=16384", what, &lens, ranks);
    }
}
