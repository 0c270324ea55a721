//! Document-length traces: read (CSV/JSONL), generate, pack into batches, summarise.

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
