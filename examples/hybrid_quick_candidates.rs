//! What the quick search's head-parallel candidates are chosen from: every head-parallel-node
//! configuration without two-item exchanges (8K and 16K node blocks × whole documents on a
//! node or not × fill rule × lookahead 0 and 1 × split limit none and 0.5) for the first
//! budget-packed batch of a trace, with its planning time (one thread), its estimate, its
//! simulated attention time and that time over the lower bound (`hybrid::QUICK_NODE_HEADS`,
//! `docs/schemes/hybrid.md` § Quick search).
//!
//! ```text
//! fcp trace gen --source prolong --seed 1 -o prolong.csv
//! RAYON_NUM_THREADS=1 cargo run --release --example hybrid_quick_candidates -- prolong.csv 256 b200
//! ```

use std::time::Instant;

use fcp::planners::fcp::Fcp;
use fcp::planners::{hybrid, Planner};
use fcp::sim::{ComputeModel, PassSel, Simulator};

mod support;

fn main() {
    let cell = support::Cell::from_args("hybrid_quick_candidates");
    let (batch, ctx, hw, model) = (&cell.batch, cell.ctx(), &cell.hw, &cell.model);
    let sim = Simulator::new(hw.clone(), model.clone()).expect("simulator");
    let profile = hw.kernel_profile().expect("kernel profile");
    let cap = Fcp::cap(batch, &ctx);
    println!(
        "| block | whole | fill | lookahead | split_limit | plan ms | estimate ms | simulated ms | vs_lower_bound |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for block in hybrid::NODE_HEADS_BLOCKS {
        for whole in [0, cap] {
            for fill in [false, true] {
                if fill && whole == 0 {
                    continue;
                }
                for lookahead in [0, hybrid::LOOKAHEAD] {
                    for split_limit in [f64::INFINITY, hybrid::SPLIT_LIMIT] {
                        let fcp = Fcp {
                            block,
                            whole,
                            split_limit,
                            rebalance: true,
                            lookahead,
                            node_heads: true,
                            fill,
                            ..Fcp::default()
                        };
                        let start = Instant::now();
                        let plan = fcp.plan(batch, &ctx).expect("a head-parallel plan");
                        let took = start.elapsed().as_secs_f64() * 1e3;
                        let mut cm = ComputeModel::new(hw, &profile, model);
                        let estimate =
                            hybrid::estimate(&plan, &ctx, &mut cm, None).expect("estimate");
                        let m = sim
                            .simulate(&plan, PassSel::Both)
                            .expect("simulation")
                            .metrics;
                        println!(
                            "| {block} | {whole} | {fill} | {lookahead} | {split_limit} | {took:.1} | {:.2} | {:.2} | {:.3} |",
                            estimate * 1e3,
                            m.attention_time_ms,
                            m.attention_time_ms / m.lower_bound_ms
                        );
                    }
                }
            }
        }
    }
}
