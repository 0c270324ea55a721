//! Errors of the trace module. Every message names what to fix (and, for file input, the
//! line), because these reach the user verbatim through `fcp trace ...`.

use thiserror::Error;

/// Anything that can go wrong reading, generating or packing a trace.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file (or stdin) could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path as given (`-` for stdin).
        path: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A CSV row the parser could not split into fields (e.g. wrong number of fields).
    #[error("line {line}: malformed CSV row: {message}")]
    Csv {
        /// 1-based line number in the input.
        line: u64,
        /// What the CSV reader reported.
        message: String,
    },
    /// The CSV header lacks the `doc_len` column.
    #[error("CSV header has no `doc_len` column (found: {found})")]
    MissingColumn {
        /// The header fields that were found, comma-separated.
        found: String,
    },
    /// A document length that is not an integer ≥ 1.
    #[error("line {line}: document length `{value}` is not a whole number of tokens from 1 to 4294967296 (2^32)")]
    BadLength {
        /// 1-based line number in the input.
        line: u64,
        /// The offending text.
        value: String,
    },
    /// A `batch` value that is not a non-negative integer.
    #[error("line {line}: batch id `{value}` is not a non-negative integer")]
    BadBatch {
        /// 1-based line number in the input.
        line: u64,
        /// The offending text.
        value: String,
    },
    /// A JSONL line that is not `{"doc_lens": [..]}`.
    #[error("line {line}: {message}")]
    Json {
        /// 1-based line number in the input.
        line: u64,
        /// What is wrong with the line.
        message: String,
    },
    /// The input held no documents at all.
    #[error("trace is empty: no documents found")]
    Empty,
    /// A packing parameter that must be positive was zero.
    #[error("{what} must be greater than 0")]
    ZeroParameter {
        /// The parameter's name as the user knows it (e.g. `--ranks`).
        what: &'static str,
    },
    /// A batch of `ranks` × `tokens_per_rank` tokens, more than a 64-bit count holds. Not a
    /// [`TraceError::BadParameter`]: packing has no generator, and the message said it did.
    #[error(
        "cannot pack: {ranks} ranks × {tokens_per_rank} tokens per rank is more tokens than a \
         batch can hold (2^64)"
    )]
    BatchTooLarge {
        /// Ranks of the CP group.
        ranks: u32,
        /// Tokens each rank holds.
        tokens_per_rank: u64,
    },
    /// Window packing was asked for without a context length.
    #[error("window packing needs a context length (--context)")]
    MissingContext,
    /// A context length was given with a packing mode that ignores it (budget, carry).
    #[error("{context} applies only to {window}")]
    ContextWithoutWindow {
        /// The setting as the user knows it (`--context`, `grid.context`).
        context: String,
        /// The mode it needs, as the user would ask for it (`--pack window`).
        window: String,
    },
    /// `--source` named no known generator.
    #[error("unknown source `{name}` (known: {known})")]
    UnknownSource {
        /// The name given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A WLB packing parameter out of range (`--pack wlb`).
    #[error("WLB packing: {0}")]
    WlbParameter(String),
    /// A generator parameter out of range (σ ≤ 0, min > max, ...).
    #[error("invalid generator parameter: {0}")]
    BadParameter(String),
    /// A bundled or derived table is malformed (a bug in `traces/`, not user input).
    #[error("table {name}, line {line}: {message}")]
    Table {
        /// Which table.
        name: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
}
