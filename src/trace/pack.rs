//! Packing a trace into batches, the way each scheme we model feeds its CP group.
//!
//! * [`PackMode::Budget`] (FCP): a batch holds whole documents up to `ranks × tokens_per_rank`
//!   tokens; batch totals need not divide by the rank count, which is the point of FCP.
//! * [`PackMode::Window`] (FlashCP): fixed context windows of `context` tokens; the document
//!   crossing a window boundary is cut to fill the window and its rest is dropped.
//! * [`PackMode::Carry`] (the "balancing compute" note, seeds/003): budget-sized batches; a
//!   document crossing the boundary is split and its remainder opens the next batch, so no
//!   token is lost.
//! * [`PackMode::Wlb`] (WLB-LLM): each training step's documents, read a window's worth per
//!   micro-batch, repacked into micro-batches of unequal length and equal work, outliers
//!   delayed until every micro-batch can take one ([`super::wlb`]).
//!
//! A trace with pinned batch ids (CSV `batch` column or JSONL) is grouped by id instead, in
//! order of first appearance; documents longer than the mode's batch limit are still cut to
//! it and counted in [`Packed::truncated`].

use std::collections::HashMap;

use super::wlb::{MicroBatch, WlbState};
use super::{Batch, Trace, TraceError, WlbParams};

/// How documents are grouped into batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackMode {
    /// Whole documents up to a token budget (FCP).
    Budget,
    /// Fixed context windows; the boundary-crossing document is truncated (FlashCP).
    Window,
    /// Budget-sized batches; a boundary-crossing document carries over to the next batch.
    Carry,
    /// WLB-LLM's variable-length micro-batches of equal work, with outlier delay; `context`
    /// is the window each micro-batch reads from the stream.
    Wlb(WlbParams),
}

impl PackMode {
    /// The CLI name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            PackMode::Budget => "budget",
            PackMode::Window => "window",
            PackMode::Carry => "carry",
            PackMode::Wlb(_) => "wlb",
        }
    }

    /// Refuse a context window given with a mode that has none: budget and carry packing
    /// would ignore it without a word. `context` and `window` name the setting and the mode as
    /// the user wrote them (`--context` and `--pack window` on the command line, `grid.context`
    /// and `pack = "window"` in a sweep config), so every front end says it the same way.
    pub fn check_context(
        self,
        context_given: bool,
        context: &str,
        window: &str,
    ) -> Result<(), TraceError> {
        if context_given && !self.reads_context() {
            return Err(TraceError::ContextWithoutWindow {
                context: context.to_string(),
                window: window.to_string(),
            });
        }
        Ok(())
    }

    /// Whether this mode sizes its batches by a context window.
    pub fn reads_context(self) -> bool {
        matches!(self, PackMode::Window | PackMode::Wlb(_))
    }

    /// Tokens per rank when the user gives none: in window packing each rank's even share of
    /// the window (`context` split over `ranks`, rounded up), which is also the cap a
    /// memory-capped scheme plans under; in WLB packing the share of the longest micro-batch
    /// (`max_len`); otherwise 32K, the FCP paper's setting (§6.1). Every front end (command
    /// line, sweep) derives it here, so one cell reads the same in each.
    pub fn default_tokens_per_rank(self, ranks: u32, context: u64) -> u64 {
        // At least 1: a zero context is the packer's error to name, not a zero cap.
        let share = |tokens: u64| tokens.div_ceil(u64::from(ranks.max(1))).max(1);
        match self {
            PackMode::Window => share(context),
            PackMode::Wlb(p) => share(p.max_len),
            PackMode::Budget | PackMode::Carry => DEFAULT_TOKENS_PER_RANK,
        }
    }
}

/// Tokens per rank in budget and carry packing when none is given (FCP paper §6.1).
pub const DEFAULT_TOKENS_PER_RANK: u64 = 32768;

/// The context window of window and WLB packing when none is given (`--context`'s
/// default): 128K tokens.
pub const DEFAULT_CONTEXT: u64 = 131_072;

/// Parameters of [`pack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackOptions {
    /// Packing mode.
    pub mode: PackMode,
    /// Ranks of the CP group (budget and carry modes: budget = ranks × tokens_per_rank).
    pub ranks: u32,
    /// Tokens each rank holds (budget and carry modes).
    pub tokens_per_rank: u64,
    /// Context window in tokens; required by window mode, ignored otherwise.
    pub context: Option<u64>,
}

impl PackOptions {
    /// Tokens of a trace that fill its first `batches` batches as a longer trace would: a
    /// generated trace grows to this many before it is packed. Each batch holds at most the
    /// batch limit; WLB packing reads a step at a time and can delay outliers, so it asks for
    /// the steps those batches come from and one more, at the micro-batch limit.
    pub fn tokens_to_fill(&self, batches: usize) -> Result<u64, TraceError> {
        let limit = self.batch_limit()?;
        let batches = batches as u64;
        Ok(match self.mode {
            PackMode::Wlb(p) => {
                let group = u64::from(p.group);
                (batches.div_ceil(group) + 1)
                    .saturating_mul(group)
                    .saturating_mul(limit)
            }
            _ => limit.saturating_mul(batches),
        })
    }

    /// The most tokens one batch may hold under these options (validated).
    pub fn batch_limit(&self) -> Result<u64, TraceError> {
        if self.ranks == 0 {
            return Err(TraceError::ZeroParameter { what: "ranks" });
        }
        if self.tokens_per_rank == 0 {
            return Err(TraceError::ZeroParameter {
                what: "tokens per rank",
            });
        }
        match self.mode {
            PackMode::Window => match self.context {
                None => Err(TraceError::MissingContext),
                Some(0) => Err(TraceError::ZeroParameter { what: "context" }),
                Some(c) => Ok(c),
            },
            PackMode::Wlb(p) => {
                p.check(self.context.ok_or(TraceError::MissingContext)?)?;
                Ok(p.max_len)
            }
            PackMode::Budget | PackMode::Carry => u64::from(self.ranks)
                .checked_mul(self.tokens_per_rank)
                .ok_or(TraceError::BatchTooLarge {
                    ranks: self.ranks,
                    tokens_per_rank: self.tokens_per_rank,
                }),
        }
    }
}

/// The outcome of [`pack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Batches in order, indices 0, 1, ... (the first ones only under [`pack_first`]).
    pub batches: Vec<Batch>,
    /// Documents that were cut, over the whole trace (their cut-off tokens are not in any
    /// batch).
    pub truncated: usize,
    /// Per batch kept: how many of its documents were cut. A command planning some batches
    /// says how many of *theirs* were cut, not the trace's.
    pub cuts: Vec<usize>,
    /// Batches the whole trace packs into, kept or not.
    pub total_batches: usize,
}

impl Packed {
    /// Total tokens over all batches.
    pub fn tokens(&self) -> u64 {
        self.batches.iter().map(Batch::tokens).sum()
    }
}

/// Pack `trace` into batches according to `opts`. Errors on zero ranks, tokens per rank or
/// context (and a missing context in window mode).
pub fn pack(trace: &Trace, opts: &PackOptions) -> Result<Packed, TraceError> {
    pack_first(trace, opts, usize::MAX)
}

/// [`pack`], keeping the first `keep` batches only (the rest are counted, not held). A
/// command that plans the first K batches needs no more in memory. (Regression, bug hunt: a
/// two-line trace holding a 2³²-token document, carry-packed one token a batch, built four
/// billion batches before the first was taken, and ran out of memory.)
pub fn pack_first(trace: &Trace, opts: &PackOptions, keep: usize) -> Result<Packed, TraceError> {
    pack_from(trace, opts, 0, keep)
}

/// [`pack_first`] holding only batches `skip..keep` (the others are counted): a command that
/// plans batch K needs that one in memory, not the K before it. (Bug hunt: `fcp plan --batch
/// K` held K + 1 batches, 867 MB at K = 10⁷, and ran out of memory before saying a K past
/// the last batch was out of range.) [`Packed::batches`] and its cuts start at batch `skip`.
pub fn pack_from(
    trace: &Trace,
    opts: &PackOptions,
    skip: usize,
    keep: usize,
) -> Result<Packed, TraceError> {
    let limit = opts.batch_limit()?;
    if trace.is_pinned() {
        return Ok(pack_pinned(trace, limit, skip, keep));
    }
    let mut packer = Packer::new(opts)?;
    packer.keep = Some(keep);
    packer.skip = skip;
    let mut batches = Vec::new();
    let mut emit = |b: Batch| batches.push(b);
    for d in &trace.docs {
        packer.push(d.len, &mut emit);
    }
    packer.end(&mut emit);
    Ok(Packed {
        batches,
        truncated: packer.truncated,
        cuts: packer.cuts,
        total_batches: packer.index,
    })
}

/// Packing one document at a time (unpinned documents): each batch is handed to `emit` as soon
/// as it closes, so packing a trace of any length holds one batch in memory. [`pack`] is this
/// with the batches collected.
#[derive(Debug, Clone)]
pub struct Packer {
    mode: PackMode,
    limit: u64,
    current: Vec<u64>,
    fill: u64,
    index: usize,
    truncated: usize,
    /// Documents cut in the batch being filled.
    cut_here: usize,
    /// Per batch kept: documents cut in it.
    cuts: Vec<usize>,
    /// `None`: every batch is emitted (streaming). `Some(k)`: the first k are emitted with
    /// their cuts recorded, the rest only counted ([`pack_first`]).
    keep: Option<usize>,
    /// Batches before this one are only counted ([`pack_from`]).
    skip: usize,
    /// WLB packing's step, queue and leftovers ([`PackMode::Wlb`]).
    wlb: Option<WlbState>,
}

impl Packer {
    /// A packer for `opts` (validated as [`PackOptions::batch_limit`] does).
    pub fn new(opts: &PackOptions) -> Result<Packer, TraceError> {
        let limit = opts.batch_limit()?;
        let wlb = match (opts.mode, opts.context) {
            (PackMode::Wlb(p), Some(context)) => Some(WlbState::new(p, context)?),
            _ => None,
        };
        Ok(Packer {
            mode: opts.mode,
            limit,
            current: Vec::new(),
            fill: 0,
            index: 0,
            truncated: 0,
            cut_here: 0,
            cuts: Vec::new(),
            keep: None,
            skip: 0,
            wlb,
        })
    }

    /// Add the next document; `emit` receives every batch this closes, in order.
    pub fn push(&mut self, len: u64, emit: &mut impl FnMut(Batch)) {
        let limit = self.limit;
        match self.mode {
            // Budget: whole documents; one longer than the budget is cut to it, and opens a
            // batch of its own.
            PackMode::Budget => {
                let cut = len > limit;
                let len = len.min(limit);
                if self.fill + len > limit {
                    self.close(emit);
                }
                if cut {
                    self.cut();
                }
                self.add(len);
            }
            // Window: the crossing document fills the window and its rest is dropped.
            PackMode::Window => {
                let space = limit - self.fill;
                if len > space {
                    self.cut();
                    self.add(space);
                } else {
                    self.add(len);
                }
                if self.fill == limit {
                    self.close(emit);
                }
            }
            // WLB: the step's micro-batches close together, when the next step begins.
            PackMode::Wlb(_) => {
                if let Some(mut state) = self.wlb.take() {
                    state.push(len, &mut |mb| self.emit_micro_batch(mb, emit));
                    self.wlb = Some(state);
                }
            }
            // Carry: the crossing document's remainder opens the next batch.
            PackMode::Carry => {
                let mut rest = len;
                while rest > 0 {
                    // Past the batches kept, whole batches of one document are only counted:
                    // a 2³²-token document one token a batch would otherwise loop 2³² times
                    // (bug hunt: 88 s for `--batches 1`).
                    if self.fill == 0 && rest >= limit && self.past_keep() {
                        let whole = rest / limit;
                        self.index = self.index.saturating_add(whole as usize);
                        rest -= whole * limit;
                        continue;
                    }
                    // Likewise before the batches kept, up to the first of them.
                    if self.fill == 0 && rest >= limit && self.index < self.skip {
                        let whole = (rest / limit).min((self.skip - self.index) as u64);
                        self.index += whole as usize;
                        rest -= whole * limit;
                        continue;
                    }
                    let take = rest.min(limit - self.fill);
                    self.add(take);
                    rest -= take;
                    if self.fill == limit {
                        self.close(emit);
                    }
                }
            }
        }
    }

    /// Close the last batch (if any) and return how many documents were cut.
    pub fn finish(mut self, emit: &mut impl FnMut(Batch)) -> usize {
        self.end(emit);
        self.truncated
    }

    /// The stream has ended: close the batch being filled, or run WLB packing's last steps.
    fn end(&mut self, emit: &mut impl FnMut(Batch)) {
        match self.wlb.take() {
            Some(mut state) => state.finish(&mut |mb| self.emit_micro_batch(mb, emit)),
            None => self.close(emit),
        }
    }

    /// Hand on one micro-batch WLB packing closed, as a batch of its own.
    fn emit_micro_batch(&mut self, mb: MicroBatch, emit: &mut impl FnMut(Batch)) {
        for _ in 0..mb.cuts {
            self.cut();
        }
        for &len in &mb.lens {
            self.add(len);
        }
        self.close(emit);
    }

    fn add(&mut self, len: u64) {
        self.current.push(len);
        self.fill += len;
    }

    fn cut(&mut self) {
        self.truncated += 1;
        self.cut_here += 1;
    }

    /// Whether the batch being filled is past those kept (it is counted, not emitted).
    fn past_keep(&self) -> bool {
        self.keep.is_some_and(|k| self.index >= k)
    }

    fn close(&mut self, emit: &mut impl FnMut(Batch)) {
        if !self.current.is_empty() {
            if self.past_keep() || self.index < self.skip {
                self.current.clear();
            } else {
                if self.keep.is_some() {
                    self.cuts.push(self.cut_here);
                }
                emit(Batch::new(self.index, std::mem::take(&mut self.current)));
            }
            self.cut_here = 0;
            self.index += 1;
            self.fill = 0;
        }
    }
}

fn pack_pinned(trace: &Trace, limit: u64, skip: usize, keep: usize) -> Packed {
    let mut order: Vec<u64> = Vec::new();
    let mut groups: HashMap<u64, (Vec<u64>, usize)> = HashMap::new();
    let mut truncated = 0;
    for doc in &trace.docs {
        let id = doc.batch.unwrap_or(u64::MAX);
        let group = groups.entry(id).or_insert_with(|| {
            order.push(id);
            (Vec::new(), 0)
        });
        if doc.len > limit {
            truncated += 1;
            group.1 += 1;
        }
        group.0.push(doc.len.min(limit));
    }
    let total_batches = order.len();
    let (batches, cuts) = order
        .iter()
        .take(keep)
        .enumerate()
        .skip(skip)
        .map(|(i, id)| {
            let (lens, cut) = groups.remove(id).unwrap_or_default();
            (Batch::new(i, lens), cut)
        })
        .unzip();
    Packed {
        batches,
        truncated,
        cuts,
        total_batches,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generated trace grows to what fills the batches: K windows, or under WLB packing
    /// the steps the K micro-batches come from and one more, at the micro-batch limit.
    #[test]
    fn tokens_to_fill_cover_the_batches_and_wlbs_steps() {
        let opts = |mode| PackOptions {
            mode,
            ranks: 4,
            tokens_per_rank: 10,
            context: Some(100),
        };
        assert_eq!(opts(PackMode::Budget).tokens_to_fill(3).unwrap(), 120);
        assert_eq!(opts(PackMode::Window).tokens_to_fill(3).unwrap(), 300);
        let wlb = PackMode::Wlb(WlbParams::defaults(4, 100, None));
        // 5 micro-batches: 2 steps of 4, and one more, of at most 200 tokens each.
        assert_eq!(opts(wlb).tokens_to_fill(5).unwrap(), 3 * 4 * 200);
        assert!(opts(PackMode::Window).tokens_to_fill(usize::MAX).is_ok());
    }

    fn opts(mode: PackMode, ranks: u32, tpr: u64, context: Option<u64>) -> PackOptions {
        PackOptions {
            mode,
            ranks,
            tokens_per_rank: tpr,
            context,
        }
    }

    fn lens(p: &Packed) -> Vec<Vec<u64>> {
        p.batches.iter().map(|b| b.doc_lens.clone()).collect()
    }

    #[test]
    fn budget_packs_whole_docs_and_truncates_giants() {
        let t = Trace::from_lens(&[3, 4, 2, 25, 1, 9]);
        let p = pack(&t, &opts(PackMode::Budget, 2, 5, None)).unwrap();
        assert_eq!(lens(&p), vec![vec![3, 4, 2], vec![10], vec![1, 9]]);
        assert_eq!(p.truncated, 1);
        assert!(p.batches.iter().enumerate().all(|(i, b)| b.index == i));
    }

    #[test]
    fn each_batch_counts_the_documents_cut_in_it() {
        // Budget: the giant is cut and opens a batch of its own.
        let t = Trace::from_lens(&[3, 4, 2, 25, 1, 9]);
        let p = pack(&t, &opts(PackMode::Budget, 2, 5, None)).unwrap();
        assert_eq!(p.cuts, vec![0, 1, 0]);
        assert_eq!(p.total_batches, 3);
        // Window: the crossing document is in the window it fills.
        let t = Trace::from_lens(&[3, 4, 5, 10, 1, 25]);
        let p = pack(&t, &opts(PackMode::Window, 1, 1, Some(10))).unwrap();
        assert_eq!(p.cuts.iter().sum::<usize>(), p.truncated);
        assert_eq!(p.cuts.len(), p.batches.len());
        assert_eq!(p.cuts[0], 1, "{:?}", lens(&p));
    }

    /// Regression (bug hunt): `fcp plan --batch K` held the K batches before it; a window of
    /// batches is the same as that slice of packing everything, in every mode, and batch 2³²
    /// of a carry-packed 2³²-token document is found without holding the others.
    #[test]
    fn packing_a_window_of_batches_is_that_slice() {
        let t = Trace::from_lens(&[3, 4, 2, 25, 1, 9, 7, 7, 30]);
        for mode in [PackMode::Budget, PackMode::Carry, PackMode::Window] {
            let o = opts(mode, 2, 5, Some(10));
            let all = pack(&t, &o).unwrap();
            let n = all.batches.len();
            for skip in 0..n + 2 {
                for keep in skip..n + 2 {
                    let w = pack_from(&t, &o, skip, keep).unwrap();
                    let (a, b) = (skip.min(n), keep.min(n));
                    assert_eq!(w.batches[..], all.batches[a..b], "{mode:?} {skip}..{keep}");
                    assert_eq!(w.cuts[..], all.cuts[a..b], "{mode:?} {skip}..{keep}");
                    assert_eq!((w.total_batches, w.truncated), (n, all.truncated));
                }
            }
        }
        let t = Trace::from_lens(&[1 << 32, 1]);
        let p = pack_from(
            &t,
            &opts(PackMode::Carry, 1, 1, None),
            1 << 32,
            (1 << 32) + 1,
        )
        .unwrap();
        assert_eq!(lens(&p), vec![vec![1]]);
        assert_eq!(p.batches[0].index, 1 << 32);
        assert_eq!(p.total_batches, (1 << 32) + 1);
    }

    /// Regression (bug hunt): a two-line trace with a 2³²-token document, carry-packed one
    /// token a batch, built every batch before the first was taken and ran out of memory.
    #[test]
    fn packing_the_first_batches_holds_no_more_than_them() {
        // Past the batches kept, whole batches are counted at once: 2³² of them here.
        let t = Trace::from_lens(&[1 << 32, 1]);
        let p = pack_first(&t, &opts(PackMode::Carry, 1, 1, None), 2).unwrap();
        assert_eq!(lens(&p), vec![vec![1], vec![1]]);
        assert_eq!(p.cuts, vec![0, 0]);
        assert_eq!(p.total_batches, (1 << 32) + 1);
        // Counting agrees with packing everything where that is cheap.
        let t = Trace::from_lens(&[7, 25, 3]);
        let o = opts(PackMode::Carry, 1, 4, None);
        let all = pack(&t, &o).unwrap();
        for keep in 0..all.batches.len() + 2 {
            let first = pack_first(&t, &o, keep).unwrap();
            assert_eq!(first.total_batches, all.batches.len(), "keep {keep}");
            assert_eq!(
                first.batches[..],
                all.batches[..keep.min(all.batches.len())]
            );
        }
        // The same batches as packing everything, and the same counts.
        let t = Trace::from_lens(&[3, 4, 2, 25, 1, 9]);
        let all = pack(&t, &opts(PackMode::Budget, 2, 5, None)).unwrap();
        let first = pack_first(&t, &opts(PackMode::Budget, 2, 5, None), 2).unwrap();
        assert_eq!(first.batches, all.batches[..2]);
        assert_eq!(first.cuts, all.cuts[..2]);
        assert_eq!(
            (first.truncated, first.total_batches),
            (all.truncated, all.total_batches)
        );
    }

    #[test]
    fn budget_keeps_last_partial_batch() {
        let t = Trace::from_lens(&[6, 6, 1]);
        let p = pack(&t, &opts(PackMode::Budget, 1, 10, None)).unwrap();
        assert_eq!(lens(&p), vec![vec![6], vec![6, 1]]);
        assert_eq!(p.truncated, 0);
    }

    #[test]
    fn window_truncates_the_crossing_doc() {
        let t = Trace::from_lens(&[3, 4, 5, 10, 1, 25]);
        let p = pack(&t, &opts(PackMode::Window, 1, 1, Some(8))).unwrap();
        // 3+4=7, 5 crosses → 1 (rest dropped); 10 → 8 (truncated); 1, then 25 crosses → 7.
        assert_eq!(lens(&p), vec![vec![3, 4, 1], vec![8], vec![1, 7]]);
        assert_eq!(p.truncated, 3);
        assert!(p.batches.iter().all(|b| b.tokens() <= 8));
    }

    #[test]
    fn window_exact_fit_is_not_truncated() {
        let t = Trace::from_lens(&[4, 4, 4]);
        let p = pack(&t, &opts(PackMode::Window, 1, 1, Some(8))).unwrap();
        assert_eq!(lens(&p), vec![vec![4, 4], vec![4]]);
        assert_eq!(p.truncated, 0);
    }

    #[test]
    fn carry_splits_and_conserves_tokens() {
        let t = Trace::from_lens(&[3, 6, 25, 2]);
        let p = pack(&t, &opts(PackMode::Carry, 2, 4, None)).unwrap();
        // budget 8: [3,5] [1,7] [8] [8] [2,2]
        assert_eq!(
            lens(&p),
            vec![vec![3, 5], vec![1, 7], vec![8], vec![8], vec![2, 2]]
        );
        assert_eq!(p.truncated, 0);
        assert_eq!(p.tokens(), t.tokens());
        assert!(p.batches.iter().all(|b| b.tokens() <= 8));
    }

    #[test]
    fn carry_conserves_tokens_on_many_docs() {
        let raw: Vec<u64> = (1..500u64).map(|i| (i * 7919) % 3001 + 1).collect();
        let t = Trace::from_lens(&raw);
        for budget in [1u64, 7, 100, 1000, 5000] {
            let p = pack(&t, &opts(PackMode::Carry, 1, budget, None)).unwrap();
            assert_eq!(p.tokens(), t.tokens());
            let n = p.batches.len();
            assert!(p.batches[..n - 1].iter().all(|b| b.tokens() == budget));
        }
    }

    #[test]
    fn pinned_batches_group_by_first_appearance() {
        let t = Trace::from_csv_str("doc_len,batch\n5,7\n6,2\n100,7\n1,2\n").unwrap();
        let p = pack(&t, &opts(PackMode::Budget, 1, 50, None)).unwrap();
        assert_eq!(lens(&p), vec![vec![5, 50], vec![6, 1]]);
        assert_eq!(p.truncated, 1);
        let w = pack(&t, &opts(PackMode::Window, 1, 1, Some(4))).unwrap();
        assert_eq!(lens(&w), vec![vec![4, 4], vec![4, 1]]);
        assert_eq!(w.truncated, 3);
    }

    #[test]
    fn zero_parameters_are_errors() {
        let t = Trace::from_lens(&[1]);
        assert!(pack(&t, &opts(PackMode::Budget, 0, 5, None)).is_err());
        assert!(pack(&t, &opts(PackMode::Carry, 1, 0, None)).is_err());
        assert!(pack(&t, &opts(PackMode::Window, 1, 1, Some(0))).is_err());
        assert!(matches!(
            pack(&t, &opts(PackMode::Window, 1, 1, None)),
            Err(TraceError::MissingContext)
        ));
        assert!(pack(&t, &opts(PackMode::Budget, u32::MAX, u64::MAX, None)).is_err());
    }

    /// Regression (bug hunt): `fcp trace pack --ranks 4294967295 --tokens-per-rank
    /// 18446744073709551615` said "invalid generator parameter", though nothing was generated.
    #[test]
    fn an_overflowing_batch_is_a_packing_error_not_a_generator_one() {
        let t = Trace::from_lens(&[1]);
        let e = pack(&t, &opts(PackMode::Carry, u32::MAX, u64::MAX, None)).unwrap_err();
        assert!(matches!(e, TraceError::BatchTooLarge { .. }), "{e:?}");
        let e = e.to_string();
        assert!(!e.contains("generator"), "{e}");
        assert_eq!(
            e,
            "cannot pack: 4294967295 ranks × 18446744073709551615 tokens per rank is more \
             tokens than a batch can hold (2^64)"
        );
    }
}
