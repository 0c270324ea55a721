//! What the `hybrid_*` examples share: their arguments `TRACE.csv RANKS HARDWARE`, read into
//! the trace's first budget-packed batch at 32K tokens per rank, the hardware profile and
//! llama3-70b (the cells of `docs/results/beyond.md`).

use fcp::hardware::Hardware;
use fcp::plan::Mask;
use fcp::planners::PlanContext;
use fcp::trace::{pack, Batch, PackMode, PackOptions, Trace};
use fcp::Model;

/// Tokens per rank of every cell.
pub const TOKENS_PER_RANK: u64 = 32768;

/// One cell: a batch, its group size, hardware and model.
pub struct Cell {
    pub batch: Batch,
    pub ranks: u32,
    pub hw: Hardware,
    pub model: Model,
}

impl Cell {
    /// Read the cell from the command line; a usage line naming `example` and exit code 2 on
    /// bad arguments.
    pub fn from_args(example: &str) -> Cell {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let [path, ranks_arg, hw_name] = &args[..] else {
            eprintln!("usage: {example} TRACE.csv RANKS HARDWARE");
            std::process::exit(2);
        };
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            eprintln!("error: {path}: {e}");
            std::process::exit(2)
        });
        let trace = Trace::from_csv_str(&text).expect("a trace CSV with a doc_len column");
        let ranks: u32 = ranks_arg.parse().expect("RANKS is an integer");
        let opts = PackOptions {
            mode: PackMode::Budget,
            ranks,
            tokens_per_rank: TOKENS_PER_RANK,
            context: None,
        };
        let batch = pack(&trace, &opts)
            .expect("packable trace")
            .batches
            .swap_remove(0);
        Cell {
            batch,
            ranks,
            hw: Hardware::load(hw_name).expect("a hardware profile"),
            model: Model::load("llama3-70b").expect("bundled model"),
        }
    }

    /// The planning context of the cell (causal).
    pub fn ctx(&self) -> PlanContext<'_> {
        PlanContext {
            ranks: self.ranks,
            tokens_per_rank: TOKENS_PER_RANK,
            mask: Mask::Causal,
            model: &self.model,
            hardware: &self.hw,
            judge: fcp::planners::Judge::default(),
        }
    }
}
