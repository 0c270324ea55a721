//! Studies: parameter sweeps over the planners and the simulator, the CI regression gate, and
//! the DP×CP straggler study.
//!
//! * [`config`] — the sweep config (TOML): a grid of traces × schemes × ranks × tokens per
//!   rank × block size × context × hardware × model, each cell over K batches.
//! * [`traces`] — trace specs as written in configs (`default`, a file, `gen:SOURCE:k=v`).
//! * [`sweep`] — expands the grid into cells, plans and simulates them in parallel (rayon),
//!   aggregates every plan metric (mean, p50, p95, max) and writes resumable results.
//! * [`regress`] — evaluates the cells a baseline file names and reports every cell that got
//!   worse than the committed numbers beyond a tolerance.
//! * [`dpcp`] — a cluster of G GPUs as G/CP data-parallel groups: straggler effect across
//!   groups as CP grows, and a document balancer across groups before planning.
//! * [`tpcp`] — the GPUs of one sequence split between tensor and context parallelism: each
//!   split's whole layer, per scheme.
//!
//! Results never depend on the thread count: every cell and batch is computed independently
//! and gathered back in grid order.

pub mod config;
pub mod dpcp;
pub mod regress;
pub mod sweep;
pub mod tpcp;
pub mod traces;

pub use config::{CellKey, Grid, SweepConfig};
pub use sweep::{
    cell_file_name, is_metric, load_results, results_csv, results_json, run_cells, run_sweep, Agg,
    CellResult, LayerMetricFn, MetricFn, Progress, SweepOutcome, LAYER_METRICS, MEMORY_METRICS,
    METRICS, TP_METRICS,
};

/// Errors of studies (bad configs, unreadable inputs, output failures).
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// The config or an input is invalid; the message says what to fix.
    #[error("{0}")]
    Config(String),
    /// A trace could not be read or generated.
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
    /// A hardware or model profile could not be loaded.
    #[error(transparent)]
    Hardware(#[from] crate::hardware::HardwareError),
    /// The simulator could not be built.
    #[error(transparent)]
    Sim(#[from] crate::sim::SimError),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A results or baseline file did not parse.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl StudyError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> StudyError {
        StudyError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
