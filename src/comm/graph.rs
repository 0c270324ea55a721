//! The bipartite transfer multigraph: send side S(0..N), receive side R(0..N).

/// Edges `src → dst` between `workers` workers; several edges may join the same pair (one per
/// block moved). Edge ids are their insertion indices, so callers keep their own per-edge data
/// in a parallel vector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferGraph {
    workers: u32,
    edges: Vec<(u32, u32)>,
    out_deg: Vec<u32>,
    in_deg: Vec<u32>,
}

impl TransferGraph {
    /// An empty graph over `workers` workers.
    pub fn new(workers: u32) -> Self {
        TransferGraph {
            workers,
            edges: Vec::new(),
            out_deg: vec![0; workers as usize],
            in_deg: vec![0; workers as usize],
        }
    }

    /// Add the edge `src → dst` (one block moved) and return its id.
    ///
    /// # Panics
    /// If either worker is out of range: that is a planner bug, not a user input.
    pub fn add_edge(&mut self, src: u32, dst: u32) -> usize {
        assert!(
            src < self.workers && dst < self.workers,
            "edge {src}→{dst} outside {} workers",
            self.workers
        );
        self.edges.push((src, dst));
        self.out_deg[src as usize] += 1;
        self.in_deg[dst as usize] += 1;
        self.edges.len() - 1
    }

    /// Number of workers (nodes per side).
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// All edges as `(src, dst)`, indexed by edge id.
    pub fn edges(&self) -> &[(u32, u32)] {
        &self.edges
    }

    /// Number of edges.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// True when nothing moves.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Blocks worker `w` sends (degree of S(w)).
    pub fn out_degree(&self, w: u32) -> u32 {
        self.out_deg[w as usize]
    }

    /// Blocks worker `w` receives (degree of R(w)).
    pub fn in_degree(&self, w: u32) -> u32 {
        self.in_deg[w as usize]
    }

    /// Δ: the largest degree over both sides, the optimal number of congestion-free sub-stages.
    pub fn max_degree(&self) -> u32 {
        self.out_deg
            .iter()
            .chain(&self.in_deg)
            .copied()
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_count_parallel_edges() {
        let mut g = TransferGraph::new(3);
        assert_eq!(g.max_degree(), 0);
        g.add_edge(0, 1);
        g.add_edge(0, 1);
        g.add_edge(2, 1);
        assert_eq!(g.out_degree(0), 2);
        assert_eq!(g.in_degree(1), 3);
        assert_eq!(g.max_degree(), 3);
        assert_eq!(g.len(), 3);
    }
}
