//! Property tests of the congestion-free schedule: on random bipartite multigraphs the edge
//! colouring uses exactly Δ colours, colours every edge once, and every colour class is a
//! matching; coalescing `c` sub-stages never puts more than `c` sends or receives on a worker.

use fcp::comm::{check_matchings, coalesce, color_edges, sequential_by_receiver, TransferGraph};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let ci = std::env::var_os("CI").is_some();
    ProptestConfig {
        cases: if ci { 64 } else { 192 },
        max_shrink_iters: if ci { 0 } else { 1024 },
        ..ProptestConfig::default()
    }
}

/// A random multigraph: 1..24 workers, up to 300 edges, skewed towards hot senders and
/// receivers (and many parallel edges) so alternating-path swaps are exercised.
fn multigraph() -> impl Strategy<Value = TransferGraph> {
    (1u32..24).prop_flat_map(|n| {
        let node = prop_oneof![3 => 0..n.min(3), 2 => 0..n];
        prop::collection::vec((node.clone(), node), 0..300).prop_map(move |edges| {
            let mut g = TransferGraph::new(n);
            for (s, d) in edges {
                g.add_edge(s, d);
            }
            g
        })
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn colouring_is_delta_matchings(g in multigraph()) {
        let c = color_edges(&g);
        prop_assert_eq!(c.num_colors, g.max_degree());
        prop_assert_eq!(c.colors.len(), g.len());
        prop_assert!(c.colors.iter().all(|&k| k < c.num_colors));
        if let Err(e) = check_matchings(&g, &c) {
            prop_assert!(false, "{}", e);
        }
        // Classes partition the edges: each edge in exactly one class.
        let mut seen = vec![0u32; g.len()];
        for class in c.classes() {
            let mut senders = std::collections::HashSet::new();
            let mut receivers = std::collections::HashSet::new();
            for e in class {
                seen[e] += 1;
                let (s, d) = g.edges()[e];
                prop_assert!(senders.insert(s), "sender {} twice", s);
                prop_assert!(receivers.insert(d), "receiver {} twice", d);
            }
        }
        prop_assert!(seen.iter().all(|&k| k == 1));
        // Deterministic.
        prop_assert_eq!(color_edges(&g), c);
    }

    #[test]
    fn coalesced_stages_respect_the_degree(g in multigraph(), degree in 1u32..8) {
        let c = color_edges(&g);
        let st = coalesce(&c, degree);
        prop_assert_eq!(st.num_stages, g.max_degree().div_ceil(degree));
        let n = g.workers() as usize;
        let stages = st.num_stages as usize;
        let mut sends = vec![0u32; n * stages.max(1)];
        let mut recvs = vec![0u32; n * stages.max(1)];
        for (e, &(s, d)) in g.edges().iter().enumerate() {
            let stage = st.stage_of_edge[e] as usize;
            prop_assert_eq!(stage as u32, st.stage_of_round(c.colors[e]));
            prop_assert!(st.rounds_in(stage as u32).contains(&c.colors[e]));
            sends[stage * n + s as usize] += 1;
            recvs[stage * n + d as usize] += 1;
        }
        prop_assert!(sends.iter().chain(&recvs).all(|&k| k <= degree));
    }

    #[test]
    fn naive_order_never_overloads_receivers(g in multigraph()) {
        let c = sequential_by_receiver(&g);
        let max_in = (0..g.workers()).map(|w| g.in_degree(w)).max().unwrap_or(0);
        prop_assert_eq!(c.num_colors, max_in);
        let mut seen = std::collections::HashSet::new();
        for (e, &(_, d)) in g.edges().iter().enumerate() {
            prop_assert!(seen.insert((d, c.colors[e])));
        }
    }
}
