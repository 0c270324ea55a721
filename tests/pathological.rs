//! Pathological batches for every planner (issue 11): each gives a plan that verifies —
//! structurally and numerically — or a clear planning error, never a panic or an invalid plan.

use std::time::Instant;

use fcp::hardware::Hardware;
use fcp::plan::{check_numeric, verify, Mask, NumericOptions};
use fcp::planners::{planner_for, PlanContext, META_SCHEMES, SCHEMES};
use fcp::{Batch, Model};

/// One pathological batch: what it is, document lengths, CP group size, and the tokens per
/// rank it was packed for (`None`: just enough to hold the batch).
struct Case {
    what: &'static str,
    lens: Vec<u64>,
    ranks: u32,
    tokens_per_rank: Option<u64>,
}

fn case(what: &'static str, lens: Vec<u64>, ranks: u32) -> Case {
    Case {
        what,
        lens,
        ranks,
        tokens_per_rank: None,
    }
}

fn cases() -> Vec<Case> {
    vec![
        case("one document fills the batch", vec![4096], 4),
        case("all 1-token documents", vec![1; 64], 8),
        case("more ranks than tokens", vec![3], 64),
        case(
            "more ranks than tokens, several documents",
            vec![1, 2, 1],
            16,
        ),
        case("a single rank", vec![700, 1, 3000], 1),
        case("odd group size", vec![1000, 999, 17], 7),
        // The batch budget (context) is 4 × 256 = 1024 tokens; the document is 5× that. Packing
        // would have cut it, but a planner handed such a batch must still plan it or say why.
        Case {
            what: "a document longer than the context",
            lens: vec![5000, 7],
            ranks: 4,
            tokens_per_rank: Some(256),
        },
        // N = 1024 with small documents: ring and zigzag build N² tiles per document that
        // spans all ranks, so this is the case that finds quadratic blow-ups.
        // Ulysses refuses (32 heads do not divide by 1024); the others must plan and verify.
        case("N = 1024", vec![1030, 5, 1], 1024),
    ]
}

fn check(scheme: &str, c: &Case) {
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-8b").unwrap();
    let tokens: u64 = c.lens.iter().sum();
    let ctx = PlanContext {
        ranks: c.ranks,
        tokens_per_rank: c
            .tokens_per_rank
            .unwrap_or_else(|| tokens.div_ceil(u64::from(c.ranks)).max(1)),
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
        judge: fcp::planners::Judge::default(),
    };
    let what = c.what;
    let start = Instant::now();
    match planner_for(scheme)
        .unwrap()
        .plan(&Batch::new(0, c.lens.clone()), &ctx)
    {
        Ok(plan) => {
            let took = start.elapsed();
            let v = verify(&plan);
            assert!(v.is_empty(), "{scheme}, {what}: {v:?}");
            let opts = NumericOptions {
                max_rows_per_doc: 128,
                ..NumericOptions::default()
            };
            let r = check_numeric(&plan, &opts).unwrap();
            assert!(r.max_abs_error < 1e-9, "{scheme}, {what}: {r:?}");
            // Shown with --nocapture: the N = 1024 rows are what bounds this test's runtime.
            eprintln!(
                "{scheme:>14} {what:<40} planned in {took:?}, checked in {:?}",
                start.elapsed()
            );
        }
        Err(e) => {
            // A refusal must say why (Ulysses: heads not divisible by N).
            let msg = e.to_string();
            eprintln!("{scheme:>14} {what:<40} refused: {msg}");
            assert!(msg.len() > 20, "{scheme}, {what}: unhelpful error `{msg}`");
        }
    }
}

#[test]
fn every_planner_survives_pathological_batches() {
    for scheme in SCHEMES.iter().chain(META_SCHEMES) {
        for c in cases() {
            check(scheme, &c);
        }
    }
}

#[test]
fn fcp_block_larger_than_every_document() {
    for c in cases() {
        check("fcp:block=16384", &c);
    }
}

/// At full scale ring and zigzag would need over 500M tiles (1024 documents of 32K tokens,
/// each cut across all 1024 ranks), and per-doc's all-gather would list 2 billion shard ranges:
/// they refuse up front, saying why, instead of exhausting memory.
#[test]
fn schemes_refuse_plans_too_large_to_hold() {
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-8b").unwrap();
    let ctx = PlanContext {
        ranks: 1024,
        tokens_per_rank: 32768,
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
        judge: fcp::planners::Judge::default(),
    };
    let batch = Batch::new(0, vec![32768; 1024]);
    for (scheme, why) in [
        ("ring", "attention tiles"),
        ("zigzag", "attention tiles"),
        ("per-doc", "token ranges"),
    ] {
        let start = Instant::now();
        let err = match planner_for(scheme).unwrap().plan(&batch, &ctx) {
            Ok(_) => panic!("{scheme} built a plan too large to hold"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(why) && err.contains("1024 ranks"), "{err}");
        assert!(
            start.elapsed().as_secs() < 10,
            "{scheme} took {:?}",
            start.elapsed()
        );
    }
}
