//! The plan IR: one batch on one CP group, explicit enough that the verifier, the simulator and
//! the GPU executor need nothing else. See `docs/plan-format.md`.

mod builder;
mod forwarding;
mod ir;
mod mask;
mod numeric;
mod runs;
mod summary;
mod verify;

pub use builder::PlanBuilder;
pub(crate) use forwarding::forwarding;
pub(crate) use ir::is_zero;
pub use ir::{
    Delivery, Document, HeadRange, Plan, PlanError, RankPlan, SchemeInfo, Step, Task, TokenRange,
    Transfer, TransferKind, TransferTensor, PLAN_VERSION, PLAN_VERSIONS,
};
pub use mask::{allowed_pairs, Mask};
pub use numeric::{
    check_numeric, NumericOptions, NumericReport, NumericTooLarge, NUMERIC_MAX_DOC_BYTES,
    NUMERIC_MAX_PAIRS,
};
pub(crate) use runs::{DocRuns, RunIndex};
pub use summary::{imbalance, max_over_mean, summarize, transfer_bytes, PlanSummary, RankLoad};
pub use verify::{verify, Violation, ViolationKind, MAX_GRAD_BYTES, MAX_PAD_SLOTS};
