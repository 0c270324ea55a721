//! Planning time of every scheme at 8, 64, 256 and 1024 ranks × 32K tokens per rank (the first
//! batch of a WLB-LLM trace, budget-packed), sweep throughput (cells of plan + simulate per
//! second), and a four-scheme whole-layer comparison. The numbers in docs/performance.md come from
//!
//! `cargo bench --bench planners`
//!
//! Under `cargo test --benches` (CI) each case runs once, at 8 ranks only, so the bench keeps
//! working without taking minutes. A scheme that refuses a size (ring and zigzag at 1024 ranks
//! exceed the plan-size limit) is reported and skipped.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fcp::hardware::Hardware;
use fcp::plan::Mask;
use fcp::planners::{planner_for, PlanContext, SCHEMES};
use fcp::report::{compare, CompareOptions};
use fcp::sim::Simulator;
use fcp::study::{run_cells, SweepConfig};
use fcp::trace::{generate, pack, Batch, PackMode, PackOptions, Source};
use fcp::Model;

const TOKENS_PER_RANK: u64 = 32 * 1024;

/// Whether criterion is measuring (`cargo bench`) rather than smoke-testing (`cargo test`).
fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The budget-packed batches of `docs` WLB-LLM documents for `ranks` × 32K tokens.
fn packed(ranks: u32, docs: usize) -> Vec<Batch> {
    let trace = generate(&Source::WlbLlm, docs, 1).expect("generate");
    let opts = PackOptions {
        mode: PackMode::Budget,
        ranks,
        tokens_per_rank: TOKENS_PER_RANK,
        context: None,
    };
    pack(&trace, &opts).expect("pack").batches
}

/// Causal planning for `ranks` × 32K tokens of `model` on `hw`.
fn ctx<'a>(ranks: u32, model: &'a Model, hw: &'a Hardware) -> PlanContext<'a> {
    PlanContext {
        ranks,
        tokens_per_rank: TOKENS_PER_RANK,
        mask: Mask::Causal,
        model,
        hardware: hw,
        judge: fcp::planners::Judge::default(),
    }
}

/// The first budget-packed batch of a WLB-LLM trace for `ranks` × 32K tokens.
fn batch(ranks: u32) -> Batch {
    let budget = u64::from(ranks) * TOKENS_PER_RANK;
    packed(ranks, (budget / 1000) as usize + 16).swap_remove(0)
}

fn planning(c: &mut Criterion) {
    let hw = Hardware::load("h100").expect("bundled");
    let model = Model::load("llama3-70b").expect("bundled");
    // FCP_BENCH_RANKS=8,64 measures a subset (the 1024-rank cases take minutes).
    let sizes: Vec<u32> = match std::env::var("FCP_BENCH_RANKS") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        Err(_) if measuring() => vec![8, 64, 256, 1024],
        Err(_) => vec![8],
    };
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    for ranks in sizes {
        let batch = batch(ranks);
        let ctx = ctx(ranks, &model, &hw);
        for scheme in SCHEMES {
            let planner = planner_for(scheme).expect("registered");
            if let Err(e) = planner.plan(&batch, &ctx) {
                eprintln!("plan/{scheme}/{ranks}x32K: refused: {e}");
                continue;
            }
            group.bench_function(format!("{scheme}/{ranks}x32K"), |b| {
                b.iter(|| planner.plan(&batch, &ctx))
            });
        }
    }
    group.finish();
}

/// A small study: 2 traces × 4 schemes × 2 sizes × 4 batches = 64 plans simulated per run.
const SWEEP: &str = r#"
name = "bench"
batches = 4
[grid]
traces = ["default", "gen:pile:seed=3"]
schemes = ["zigzag", "fcp", "flashcp", "magi"]
ranks = [8, 16]
tokens_per_rank = [32768]
"#;

fn sweep(c: &mut Criterion) {
    let cfg = SweepConfig::parse(SWEEP).expect("config");
    let cells = cfg.cells();
    let mut group = c.benchmark_group("sweep");
    group.sample_size(10);
    group.throughput(Throughput::Elements((cells.len() * cfg.batches) as u64));
    group.bench_function("64 batches (plan + simulate)", |b| {
        b.iter(|| run_cells(&cfg, &cells, &|_| {}).expect("sweep"))
    });
    group.finish();
}

/// `compare` of four schemes on the whole layer over 8 batches of 16 ranks × 32K: what a
/// comparison or one `tpcp` split costs.
fn comparison(c: &mut Criterion) {
    let hw = Hardware::load("h100").expect("bundled");
    let model = Model::load("llama3-70b").expect("bundled");
    let ranks = 16;
    let budget = u64::from(ranks) * TOKENS_PER_RANK;
    let mut batches = packed(ranks, (8 * budget / 1000) as usize + 64);
    batches.truncate(if measuring() { 8 } else { 1 });
    let ctx = ctx(ranks, &model, &hw);
    let sim = Simulator::new(hw.clone(), model.clone())
        .expect("simulator")
        .with_layer()
        .expect("layer");
    let compare_opts = CompareOptions {
        schemes: ["zigzag", "fcp", "flashcp", "hybrid:quick=true"]
            .map(String::from)
            .to_vec(),
        baseline: None,
        verify: true,
    };
    let mut group = c.benchmark_group("compare");
    group.sample_size(10);
    group.throughput(Throughput::Elements(4 * batches.len() as u64));
    group.bench_function("4 schemes x 8 batches of 16x32K, whole layer", |b| {
        b.iter(|| compare(&batches, &ctx, &sim, &compare_opts))
    });
    group.finish();
}

criterion_group!(benches, planning, sweep, comparison);
criterion_main!(benches);
