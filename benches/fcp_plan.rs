//! Planning time of `fcp` (issue 5: aim for 1024 ranks × 32K tokens under 20 ms on one core)
//! and of `hybrid`, full and quick search (issue 8: aim for 256 ranks under 50 ms): the full
//! search on wlb-llm and magi, the quick one on all six traces of `docs/results/beyond.md`.
//!
//! `cargo bench --bench fcp_plan`

use criterion::{criterion_group, criterion_main, Criterion};
use fcp::hardware::Hardware;
use fcp::plan::Mask;
use fcp::planners::auto::Auto;
use fcp::planners::hybrid::Hybrid;
use fcp::planners::{Fcp, PlanContext, Planner};
use fcp::trace::{generate, pack, PackMode, PackOptions, Source};
use fcp::Model;

fn bench(c: &mut Criterion) {
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-70b").unwrap();
    let tpr = 32 * 1024;
    let mut group = c.benchmark_group("fcp_plan");
    group.sample_size(10);
    let batch_for = |source: &str, ranks: u32| {
        let budget = ranks as usize * tpr as usize;
        let trace = generate(&Source::from_name(source).unwrap(), budget / 1000, 1).unwrap();
        let opts = PackOptions {
            mode: PackMode::Budget,
            ranks,
            tokens_per_rank: tpr,
            context: None,
        };
        pack(&trace, &opts).unwrap().batches.swap_remove(0)
    };
    let ctx_for = |ranks: u32| PlanContext {
        ranks,
        tokens_per_rank: tpr,
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
        judge: fcp::planners::Judge::default(),
    };
    for source in ["wlb-llm", "magi"] {
        for ranks in [256u32, 1024] {
            let (batch, ctx) = (batch_for(source, ranks), ctx_for(ranks));
            group.bench_function(format!("{source}/{ranks}x32K"), |b| {
                b.iter(|| Fcp::default().plan(&batch, &ctx).unwrap())
            });
            group.bench_function(format!("{source}/{ranks}x32K/distribute"), |b| {
                b.iter(|| Fcp::default().distribute(&batch, &ctx).unwrap())
            });
            if ranks == 256 {
                group.bench_function(format!("{source}/{ranks}x32K/hybrid"), |b| {
                    b.iter(|| Hybrid::default().plan(&batch, &ctx).unwrap())
                });
            }
        }
    }
    let quick = Hybrid {
        quick: true,
        ..Hybrid::default()
    };
    for source in [
        "wlb-llm",
        "magi",
        "pile",
        "redpajama",
        "prolong",
        "lognormal",
    ] {
        let ranks = 256;
        let (batch, ctx) = (batch_for(source, ranks), ctx_for(ranks));
        group.bench_function(format!("{source}/{ranks}x32K/hybrid-quick"), |b| {
            b.iter(|| quick.plan(&batch, &ctx).unwrap())
        });
        // `auto` under a 50 ms budget: the quick search, then what the time left covers.
        let auto = Auto { budget_ms: 50 };
        group.bench_function(format!("{source}/{ranks}x32K/auto-budget-50ms"), |b| {
            b.iter(|| auto.plan(&batch, &ctx).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
