//! `fcp` plans and simulates context parallelism (CP) for long-context LLM training.
//!
//! Data flows one way:
//!
//! ```text
//! trace ──pack──▶ Batch ──Planner──▶ Plan (IR) ──▶ verify
//!                                      └──▶ plan.json ──▶ scripts/replay (GPU)
//! ```
//!
//! * [`trace`] reads, generates, packs and summarises document-length traces.
//! * [`hardware`] and [`model`] describe the GPUs, the network and the attention shape.
//! * [`plan`] is the IR every planner emits and the verifier, simulator and executor read.
//! * [`planners`] holds one file per scheme behind the [`planners::Planner`] trait.
//! * [`tp`] splits a model and a node for tensor parallelism under CP.
//! * [`study`] runs sweeps, the regression gate and the DP×CP study over planners + simulator.

pub mod comm;
pub mod footprint;
pub mod hardware;
pub mod hashing;
pub mod ilp;
pub mod input;
mod jsonpos;
pub mod model;
pub mod output;
pub mod plan;
pub mod planners;
pub mod read_guard;
pub mod report;
pub mod sim;
pub mod study;
pub mod tp;
pub mod trace;

pub use model::Model;
pub use plan::{Mask, Plan, TokenRange};
pub use planners::{PlanContext, Planner};
pub use trace::Batch;
