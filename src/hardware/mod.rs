//! GPU and network profiles, kernel efficiency tables and the cost queries planners and the
//! simulator share.
//!
//! * [`Hardware`]: one GPU/node type from a TOML (`configs/hardware/`), every number sourced.
//! * [`KernelProfile`]: attention throughput by tile shape from a CSV (`kernels-profile/`).
//! * [`NcclTable`]: measured NCCL bus bandwidth by message size (`configs/nccl/`).
//! * [`cost`]: the one tile-cost function everyone uses.
//!
//! Bundled profiles are compiled in, so bare names work from any directory; anything that looks
//! like a path is read from disk. See `docs/hardware.md` and `docs/kernel-profile.md`.

pub mod bundled;
pub mod cost;
mod error;
mod kernel;
mod network;
mod profile;
pub mod spec;

pub use cost::{kernel_time_s, overlap_bandwidth, tile_flops, tile_time_s, OverlapBandwidth};
pub use error::HardwareError;
pub use kernel::{Clamp, KernelLookup, KernelProfile, KernelQuery, KernelRow, LenKind, Pass};
pub use network::{BusBw, Collective, NcclRow, NcclTable};
pub use profile::{Hardware, Link, NUMERIC_FIELDS};
