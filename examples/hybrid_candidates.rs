//! How well `hybrid`'s estimate ranks its candidates: every candidate it builds for the first
//! budget-packed batch of a trace, with its estimate and its simulated attention time
//! (forward + backward), the rank correlation between the two, and whether the estimate's
//! pick is the simulator's fastest (`docs/schemes/hybrid.md`).
//!
//! ```text
//! fcp trace gen --source magi --seed 1 -o magi.csv
//! cargo run --release --example hybrid_candidates -- magi.csv 256 b200
//! ```
//!
//! Simulating every candidate takes minutes at 256 ranks; the planner itself simulates none
//! there.

use fcp::planners::hybrid::Hybrid;
use fcp::sim::{PassSel, Simulator};
use rayon::prelude::*;

mod support;

/// Ranks of `v` (0 = smallest; ties in index order).
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]).then(a.cmp(&b)));
    let mut r = vec![0.0; v.len()];
    for (k, &i) in order.iter().enumerate() {
        r[i] = k as f64;
    }
    r
}

/// Spearman's rank correlation.
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let d2: f64 = ranks(a)
        .iter()
        .zip(ranks(b))
        .map(|(x, y)| (x - y).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

fn main() {
    let cell = support::Cell::from_args("hybrid_candidates");
    let (batch, ctx) = (&cell.batch, cell.ctx());
    let sim = Simulator::new(cell.hw.clone(), cell.model.clone()).expect("simulator");
    let c = Hybrid::default()
        .candidates(batch, &ctx)
        .expect("hybrid plans");
    let sims: Vec<f64> = c
        .built
        .par_iter()
        .map(|(_, p)| {
            sim.simulate(p, PassSel::Both)
                .expect("simulation")
                .metrics
                .attention_time_ms
        })
        .collect();
    println!(
        "| node_heads | block | whole | relay | split_limit | rebalance_pairs | estimate ms | simulated ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for ((s, _), t) in c.built.iter().zip(&sims) {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.2} |",
            s.fcp.node_heads,
            s.fcp.block,
            s.fcp.whole,
            s.fcp.relay,
            s.fcp.split_limit,
            s.fcp.rebalance_pairs,
            s.seconds * 1e3,
            t
        );
    }
    let est: Vec<f64> = c.built.iter().map(|(s, _)| s.seconds * 1e3).collect();
    let pick = (0..est.len())
        .min_by(|&a, &b| est[a].total_cmp(&est[b]))
        .expect("at least one candidate");
    let best = sims.iter().copied().fold(f64::INFINITY, f64::min);
    // What simulating the estimate's k leaders would keep.
    let mut order: Vec<usize> = (0..est.len()).collect();
    order.sort_by(|&a, &b| est[a].total_cmp(&est[b]));
    let leaders = |k: usize| {
        order
            .iter()
            .take(k)
            .map(|&i| sims[i])
            .fold(f64::INFINITY, f64::min)
    };
    let ratio: f64 = est.iter().zip(&sims).map(|(e, s)| e / s).sum::<f64>() / est.len() as f64;
    println!(
        "\n{} candidates built ({} placements, {} pruned) · Spearman(estimate, simulated) {:.2} · \
         mean estimate/simulated {:.2} · estimate's pick simulates at {:.2} ms, the fastest of its \
         2 / 3 leaders at {:.2} / {:.2} ms, the fastest at {:.2} ms",
        est.len(),
        c.placements,
        c.pruned,
        spearman(&est, &sims),
        ratio,
        sims[pick],
        leaders(2),
        leaders(3),
        best
    );
}
