//! FCP's bottom-up coalescer: consecutive congestion-free sub-stages merged into one stage.

use std::ops::Range;

use super::Coloring;

/// Sub-stages grouped `degree` at a time: stage `s` runs sub-stages
/// `s·degree .. (s+1)·degree`. If every sub-stage is a matching, every worker sends and
/// receives at most `degree` blocks per stage, so no stage creates a hotspot; the stage's
/// computation can run as one larger (varlen) launch, which is how FCP decouples the
/// scheduling granularity (block size) from the execution granularity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stages {
    /// Sub-stages per stage (≥ 1).
    pub degree: u32,
    /// Number of sub-stages coalesced.
    pub num_substages: u32,
    /// Number of stages: ⌈num_substages / degree⌉.
    pub num_stages: u32,
    /// Stage of each edge, indexed by edge id.
    pub stage_of_edge: Vec<u32>,
}

impl Stages {
    /// Stage that sub-stage `round` belongs to.
    pub fn stage_of_round(&self, round: u32) -> u32 {
        round / self.degree
    }

    /// Sub-stages making up `stage`.
    pub fn rounds_in(&self, stage: u32) -> Range<u32> {
        let start = stage * self.degree;
        start..(start + self.degree).min(self.num_substages)
    }
}

/// Merge every `degree` consecutive colours of `coloring` into one stage (`degree` 0 is read
/// as 1: no coalescing). Edges keep their colour; only the stage is added.
///
/// ```
/// use fcp::comm::{coalesce, color_edges, TransferGraph};
/// let mut g = TransferGraph::new(2);
/// for _ in 0..5 { g.add_edge(0, 1); }
/// let st = coalesce(&color_edges(&g), 2);
/// assert_eq!(st.num_stages, 3); // sub-stages {0,1}, {2,3}, {4}
/// ```
pub fn coalesce(coloring: &Coloring, degree: u32) -> Stages {
    let degree = degree.max(1);
    Stages {
        degree,
        num_substages: coloring.num_colors,
        num_stages: coloring.num_colors.div_ceil(degree),
        stage_of_edge: coloring.colors.iter().map(|&c| c / degree).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_cover_rounds_once() {
        let c = Coloring {
            colors: vec![0, 1, 2, 3, 4, 5, 6],
            num_colors: 7,
        };
        let st = coalesce(&c, 3);
        assert_eq!(st.num_stages, 3);
        assert_eq!(st.rounds_in(2), 6..7);
        assert_eq!(st.stage_of_edge, vec![0, 0, 0, 1, 1, 1, 2]);
        assert_eq!(coalesce(&c, 0).num_stages, 7);
    }
}
