//! Errors of the hardware, model and kernel-profile loaders and of the cost queries.
//!
//! Every message names the file (or bundled name) and what is wrong, so a user can fix the input
//! without reading code.

use std::path::PathBuf;

/// What can go wrong loading a profile or asking it a question.
#[derive(Debug, thiserror::Error)]
pub enum HardwareError {
    /// A bare name that is not bundled; `known` lists the bundled names.
    #[error("unknown {kind} `{name}` (known: {known}; or give a file path)")]
    UnknownName {
        /// What was looked up: "hardware", "model", "kernel profile", "NCCL table".
        kind: &'static str,
        /// The name given.
        name: String,
        /// Comma-separated bundled names.
        known: String,
    },
    /// A user file could not be read.
    #[error("cannot read {kind} file {}: {source}", path.display())]
    Io {
        /// What was being read.
        kind: &'static str,
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML/CSV for its format (syntax, a missing or unknown key, a wrong
    /// type). `message` names the key or line.
    #[error("{file}: {message}")]
    Parse {
        /// File path or `bundled:NAME`.
        file: String,
        /// What is wrong, with the key or line.
        message: String,
    },
    /// A tensor-parallel split the model or node cannot take ([`crate::tp::split`]).
    #[error("{0}")]
    TensorParallel(String),
    /// The file parses but a value is out of range or inconsistent.
    #[error("{file}: invalid `{field}`: {message}")]
    Invalid {
        /// File path or `bundled:NAME`.
        file: String,
        /// The offending key or column.
        field: String,
        /// Why it is invalid.
        message: String,
    },
    /// A kernel profile has no rows for the pass/mask/head-dim asked for.
    #[error(
        "kernel profile {profile} has no row for {pass} {mask} hd {head_dim} (it has: {available})"
    )]
    NoKernelRow {
        /// Profile name.
        profile: String,
        /// `fwd` or `bwd`.
        pass: String,
        /// `causal` or `full`.
        mask: String,
        /// Head dimension asked for.
        head_dim: u32,
        /// The (pass, mask, head_dim) combinations the profile does have.
        available: String,
    },
    /// An NCCL table has no rows for the collective and GPU count asked for.
    #[error("NCCL table {table} has no rows for {op} on {ngpu} GPUs (it has: {available})")]
    NoNcclRow {
        /// Table name.
        table: String,
        /// Collective name.
        op: String,
        /// GPU count asked for.
        ngpu: u32,
        /// The (op, ngpu) combinations the table does have.
        available: String,
    },
    /// A query that cannot be answered (a zero length, a zero head dim).
    #[error("invalid query: {0}")]
    InvalidQuery(String),
}
