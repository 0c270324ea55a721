//! FCP balance report (run by hand; not part of the test gate):
//!
//! ```text
//! cargo test --release --test fcp_imbalance -- --ignored --nocapture
//! ```
//!
//! For the magi, wlb-llm and lognormal traces at 16/64/128/256 ranks × 32K tokens per rank
//! (H100, llama3-70b, causal), plans the first few budget-packed batches and prints the static
//! FLOPs imbalance and comm-bytes imbalance of `fcp::plan::summarize` ((max − mean)/max), the
//! f-load imbalance LPT itself sees, and the bound the heaviest unit sets.

use std::time::Instant;

use fcp::hardware::Hardware;
use fcp::plan::{imbalance, summarize, Mask};
use fcp::planners::{Fcp, PlanContext, Planner};
use fcp::trace::{generate, pack, PackMode, PackOptions, Source};
use fcp::Model;

const TPR: u64 = 32 * 1024;
const BATCHES: usize = 3;

#[test]
#[ignore = "report; run with --ignored --nocapture"]
fn fcp_imbalance_report() {
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-70b").unwrap();
    println!(
        "{:<10} {:>5} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
        "source",
        "N",
        "block",
        "batch",
        "flops_imb",
        "comm_imb",
        "f_imb",
        "unit_bnd",
        "Δ",
        "plan_ms"
    );
    for name in ["magi", "wlb-llm", "lognormal"] {
        let source = Source::from_name(name).unwrap();
        for ranks in [16u32, 64, 128, 256] {
            let blocks: &[u64] = if ranks == 64 && name != "lognormal" {
                &[4096, 2048]
            } else {
                &[4096]
            };
            let budget = ranks as u64 * TPR;
            // Enough documents for BATCHES full batches (means: magi ~1.8K, others larger).
            let docs = (budget as usize * BATCHES / 1500).max(1000);
            let trace = generate(&source, docs, 1).unwrap();
            let packed = pack(
                &trace,
                &PackOptions {
                    mode: PackMode::Budget,
                    ranks,
                    tokens_per_rank: TPR,
                    context: None,
                },
            )
            .unwrap();
            for &block in blocks {
                for batch in packed.batches.iter().take(BATCHES) {
                    let ctx = PlanContext {
                        ranks,
                        tokens_per_rank: TPR,
                        mask: Mask::Causal,
                        model: &model,
                        hardware: &hw,
                        judge: fcp::planners::Judge::default(),
                    };
                    let f = Fcp {
                        block,
                        ..Fcp::default()
                    };
                    let t0 = Instant::now();
                    let plan = f.plan(batch, &ctx).unwrap();
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    let s = summarize(&plan, &model);
                    let d = f.distribute(batch, &ctx).unwrap();
                    let loads = &d.assignment.loads;
                    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
                    let top = d.heaviest_unit.max(mean);
                    let bound = (top - mean) / top;
                    let delta = plan
                        .transfers
                        .iter()
                        .map(|t| t.round() + 1)
                        .max()
                        .unwrap_or(0);
                    println!(
                        "{:<10} {:>5} {:>6} {:>7} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>7} {:>8.1}",
                        name,
                        ranks,
                        block,
                        batch.index,
                        s.flops_imbalance,
                        s.comm_imbalance,
                        imbalance(loads),
                        bound,
                        delta,
                        ms
                    );
                }
            }
        }
    }
}
