//! Document-length traces: read (CSV/JSONL), generate, pack into batches, summarise.
//!
//! A trace is a list of document lengths in tokens, optionally pinned to batches. Planners see
//! it only through [`pack`], which turns it into [`Batch`]es the way the modelled scheme
//! would (FCP's token budget, FlashCP's fixed windows, budget with carry-over, or WLB-LLM's
//! equal-work micro-batches). Formats,
//! sources and definitions are documented in `docs/traces.md`.

mod derive;
mod error;
mod generate;
mod pack;
mod parse;
mod stats;
mod tables;
mod wlb;

pub use derive::{
    derive_quantiles, parse_json_lengths, quantile_grid, quantile_table_csv, QUANTILE_GRID,
};
pub use error::TraceError;
pub use generate::{generate, sample_histogram, Generator, Lognormal, Source, MIXTURE_CAP};
pub use pack::{
    pack, pack_first, pack_from, PackMode, PackOptions, Packed, Packer, DEFAULT_CONTEXT,
    DEFAULT_TOKENS_PER_RANK,
};
pub use parse::{DocReader, Format};
pub use stats::{percentile_sorted, stats, AboveShare, StatsAccumulator, TraceStats, THRESHOLDS};
pub use tables::{
    read_table, Component, HistBin, QuantileRow, QuantileTable, MAGI_HISTOGRAM, PILE_MIXTURE,
    PROLONG_QUANTILES, REDPAJAMA_MIXTURE, WLB_LLM_QUANTILES,
};
pub use wlb::{
    WlbParams, WlbSettings, DEFAULT_GROUP as DEFAULT_WLB_GROUP, MAX_GROUP as WLB_MAX_GROUP,
};

/// The longest document a trace may hold: 2³² tokens, thousands of times the longest context
/// trained today, and small enough that a batch's token counts, attention pairs and simulated
/// nanoseconds never overflow.
pub const MAX_DOC_LEN: u64 = 1 << 32;

/// The bundled default trace (`traces/default.csv`), made by
/// `fcp trace gen --source wlb-llm --docs 4000 --seed 1 -o traces/default.csv`.
pub const DEFAULT_TRACE_CSV: &str = include_str!("../../traces/default.csv");

/// One packed batch: the documents one CP group processes together, in trace order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Index of the batch in the packed trace.
    pub index: usize,
    /// Document lengths in tokens (each ≥ 1).
    pub doc_lens: Vec<u64>,
}

impl Batch {
    /// A batch from document lengths.
    pub fn new(index: usize, doc_lens: Vec<u64>) -> Self {
        Batch { index, doc_lens }
    }
    /// Total tokens.
    pub fn tokens(&self) -> u64 {
        self.doc_lens.iter().sum()
    }
}

/// A document-length trace, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    /// The documents, in trace order.
    pub docs: Vec<TraceDoc>,
}

/// One document of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceDoc {
    /// Length in tokens (≥ 1).
    pub len: u64,
    /// Batch id the document is pinned to (CSV `batch` column, JSONL line); `None` lets
    /// [`pack`] place it.
    pub batch: Option<u64>,
}

impl Trace {
    /// Document lengths in order.
    pub fn lens(&self) -> Vec<u64> {
        self.docs.iter().map(|d| d.len).collect()
    }
    /// Total tokens.
    pub fn tokens(&self) -> u64 {
        self.docs.iter().map(|d| d.len).sum()
    }
    /// Whether documents carry batch ids (then [`pack`] groups by id).
    pub fn is_pinned(&self) -> bool {
        self.docs.iter().any(|d| d.batch.is_some())
    }
    /// Summary statistics (errors on an empty trace).
    pub fn stats(&self) -> Result<TraceStats, TraceError> {
        stats(&self.lens())
    }
}

/// The bundled default trace, used by the README's main command. It is 4,000 documents drawn
/// from the WLB-LLM distribution, so examples run without any input file.
pub fn default_trace() -> Trace {
    // The bundled file is checked by a unit test; an empty trace would only mean a broken build.
    Trace::from_csv_str(DEFAULT_TRACE_CSV).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_trace_is_bundled_and_regenerable() {
        let t = default_trace();
        assert_eq!(t.docs.len(), 4000);
        let again = generate(&Source::WlbLlm, 4000, 1).unwrap();
        assert_eq!(again.to_csv(), DEFAULT_TRACE_CSV);
        assert!(DEFAULT_TRACE_CSV.len() < 100_000);
    }
}
