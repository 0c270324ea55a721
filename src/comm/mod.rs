//! Communication scheduling shared by point-to-point CP planners (FCP §4.2).
//!
//! A planner describes what must move as a [`TransferGraph`]: a bipartite multigraph with one
//! send node S(i) and one receive node R(j) per worker, and one edge S(i) → R(j) per block that
//! worker `i` must send to worker `j`. This module then answers two questions:
//!
//! * **In which sub-stage does each edge move?** [`color_edges`] partitions the edges into
//!   exactly Δ matchings (Δ = the largest number of edges at any send or receive node), a
//!   bipartite edge colouring. A matching is a congestion-free sub-stage: every worker sends at
//!   most one block and receives at most one (FCP Lemma 1), and no schedule can use fewer than
//!   Δ sub-stages (Lemma 2), so Δ is optimal (König's edge-colouring theorem).
//!   [`sequential_by_receiver`] is the naive order used to measure what the solver buys.
//! * **Which sub-stages run together?** [`coalesce`] merges `c` consecutive sub-stages into one
//!   stage (FCP's bottom-up coalescer): each worker then sends and receives at most `c` blocks
//!   per stage, and the stage's computation can be one larger kernel launch.
//!
//! The module knows nothing about tokens or plans: planners map their blocks to edges and read
//! the colours back.

mod coalesce;
mod coloring;
mod graph;

pub use coalesce::{coalesce, Stages};
pub use coloring::{check_matchings, color_edges, sequential_by_receiver, Coloring};
pub use graph::TransferGraph;
