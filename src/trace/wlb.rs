//! WLB-LLM's variable-length packing with outlier delay ([`PackMode::Wlb`]).
//!
//! Fixed windows give every micro-batch the same tokens but not the same work: attention grows
//! with the square of a document's length, so a window holding one 100K document costs several
//! times one holding a hundred 1K documents, and under a pipeline the heavy micro-batch stalls
//! every stage around it. WLB-LLM (Wang et al., OSDI'25, arXiv 2503.17924, §4 and its
//! Algorithm 1; DistCA reimplements it, `hao-ai-lab/DistCA`, anchors-cp.md §4) repacks the
//! documents of each training step:
//!
//! 1. A step reads `group × context` tokens of whole documents from the stream (what `group`
//!    fixed windows would have held; a document that would overflow opens the next step).
//! 2. **Outlier delay.** A document of `outlier` tokens or more joins a FIFO queue instead of
//!    the step. Once the queue holds `group` of them, the oldest `group` rejoin the step:
//!    outliers are trained a few steps late, but never two in one micro-batch while another
//!    has none.
//! 3. **Variable-length packing.** The step's documents (last step's leftovers first, then the
//!    ones read, then the released outliers), longest first, each go to the micro-batch with
//!    the least work if it stays within `max_len` tokens, else to the shortest one if it fits
//!    there, else they wait for the next step. Work is a document's token-linear work plus its
//!    attention, `len + len² / breakpoint` ([`WlbParams::breakpoint`]).
//!
//! When the stream ends, steps keep running on the queue and the leftovers until both are
//! empty: no token is dropped, except those past `max_len` of a longer document (cut, and
//! counted as [`PackMode::Window`] counts its cuts).
//!
//! [`PackMode::Wlb`]: super::PackMode::Wlb
//! [`PackMode::Window`]: super::PackMode::Window

use std::collections::VecDeque;

use super::TraceError;

/// The knobs of WLB-LLM's packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WlbParams {
    /// Micro-batches balanced together: every window of a training step (micro-batches per
    /// pipeline × data-parallel replicas).
    pub group: u32,
    /// Most tokens one micro-batch may hold (the memory limit; WLB-LLM's `L_max`).
    pub max_len: u64,
    /// Documents this long or longer are outliers, delayed until `group` of them can be spread
    /// one to a micro-batch.
    pub outlier: u64,
    /// The document length whose attention costs as much as its token-linear work (the
    /// projections and the MLP): work is `len + len² / breakpoint`. `None`: attention only
    /// (`len²`), for a model without linear layers. [`crate::model::Model::attention_breakpoint`]
    /// derives it from a model's FLOPs.
    pub breakpoint: Option<u64>,
}

impl WlbParams {
    /// WLB-LLM's defaults for windows of `context` tokens, as DistCA's reimplementation sets
    /// them (256K micro-batches and 64K outliers for 128K windows): `max_len` twice the
    /// window, outliers from half of it.
    pub fn defaults(group: u32, context: u64, breakpoint: Option<u64>) -> WlbParams {
        WlbParams {
            group,
            max_len: context.saturating_mul(2),
            outlier: (context / 2).max(1),
            breakpoint,
        }
    }

    /// Refuse parameters under which packing cannot run or cannot finish.
    pub fn check(&self, context: u64) -> Result<(), TraceError> {
        // The context first: the limit and the threshold default from it (bug hunt: a zero
        // context was reported as a zero micro-batch limit).
        for (what, v) in [
            ("context", context),
            ("WLB micro-batches per step", u64::from(self.group)),
            ("WLB micro-batch limit", self.max_len),
            ("WLB outlier threshold", self.outlier),
        ] {
            if v == 0 {
                return Err(TraceError::ZeroParameter { what });
            }
        }
        if self.group > MAX_GROUP {
            return Err(TraceError::WlbParameter(format!(
                "{} micro-batches per step is more than the {MAX_GROUP} WLB packing balances",
                self.group
            )));
        }
        if self.breakpoint == Some(0) {
            return Err(TraceError::ZeroParameter {
                what: "WLB attention breakpoint",
            });
        }
        if self.max_len < context {
            return Err(TraceError::WlbParameter(format!(
                "a micro-batch limit of {} tokens is shorter than the {context}-token window a \
                 step reads per micro-batch; every step would leave documents behind",
                self.max_len
            )));
        }
        Ok(())
    }

    /// A document's work in token-equivalents.
    fn work(&self, len: u64) -> f64 {
        let l = len as f64;
        match self.breakpoint {
            Some(b) => l + l * l / b as f64,
            None => l * l,
        }
    }
}

/// Most micro-batches one WLB step balances (each document scans them all).
pub const MAX_GROUP: u32 = 1 << 16;

/// Micro-batches a step balances when neither the user nor a priced training step says:
/// DistCA's reimplementation balances 4 (`hao-ai-lab/DistCA`, anchors-cp.md §4); 8 is the
/// smallest step that fills an 8-stage pipeline.
pub const DEFAULT_GROUP: u32 = 8;

/// WLB packing's settings as a user gives them, each optional: the command line's `--wlb-*`
/// flags, a sweep's `[wlb]` table. One place fills in what is left out, so a cell of a sweep
/// and the command line that reproduces it pack alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WlbSettings {
    /// [`WlbParams::group`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// [`WlbParams::max_len`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<u64>,
    /// [`WlbParams::outlier`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier: Option<u64>,
    /// [`WlbParams::breakpoint`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakpoint: Option<u64>,
}

impl WlbSettings {
    /// The parameters for windows of `context` tokens: the group the user gave, else the
    /// training step's windows (`step_group`, micro-batches × replicas, where one is priced),
    /// else [`DEFAULT_GROUP`]; the breakpoint the user gave, else the model's
    /// (`model_breakpoint`); the rest [`WlbParams::defaults`] for the window.
    pub fn resolve(
        &self,
        context: u64,
        step_group: Option<u32>,
        model_breakpoint: Option<u64>,
    ) -> WlbParams {
        let group = self.group.or(step_group).unwrap_or(DEFAULT_GROUP);
        let d = WlbParams::defaults(group, context, self.breakpoint.or(model_breakpoint));
        WlbParams {
            max_len: self.max_len.unwrap_or(d.max_len),
            outlier: self.outlier.unwrap_or(d.outlier),
            ..d
        }
    }

    /// Whether the user set nothing.
    pub fn is_empty(&self) -> bool {
        *self == WlbSettings::default()
    }

    /// Each setting by its key (a sweep's `[wlb]` key; `--wlb-` and the key with dashes is
    /// its flag), in order: what every front end names, checks and repeats.
    pub fn fields(&self) -> [(&'static str, Option<u64>); 4] {
        [
            ("group", self.group.map(u64::from)),
            ("max_len", self.max_len),
            ("outlier", self.outlier),
            ("breakpoint", self.breakpoint),
        ]
    }
}

/// A document waiting to be packed: its length (already cut to `max_len`) and whether it was
/// cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Doc {
    len: u64,
    cut: bool,
}

/// One micro-batch WLB packing closed: its documents and how many of them were cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MicroBatch {
    pub lens: Vec<u64>,
    pub cuts: usize,
}

/// The packing state between documents: the step being read, the outlier queue and the
/// leftovers of the last step.
#[derive(Debug, Clone)]
pub(super) struct WlbState {
    params: WlbParams,
    /// Tokens a step reads from the stream (`group × context`).
    step_tokens: u64,
    read: Vec<Doc>,
    read_tokens: u64,
    queue: VecDeque<Doc>,
    leftovers: Vec<Doc>,
}

impl WlbState {
    /// A state for windows of `context` tokens (parameters checked).
    pub fn new(params: WlbParams, context: u64) -> Result<WlbState, TraceError> {
        params.check(context)?;
        Ok(WlbState {
            params,
            step_tokens: u64::from(params.group).saturating_mul(context),
            read: Vec::new(),
            read_tokens: 0,
            queue: VecDeque::new(),
            leftovers: Vec::new(),
        })
    }

    /// Read the next document; `emit` gets the micro-batches of every step this closes.
    pub fn push(&mut self, len: u64, emit: &mut impl FnMut(MicroBatch)) {
        let doc = Doc {
            len: len.min(self.params.max_len),
            cut: len > self.params.max_len,
        };
        // The step has read its share: this document opens the next one. (A step that has
        // read nothing takes it whatever its length, so every step makes progress. One
        // without a document for each micro-batch reads on: see [`Self::fills_every_micro_batch`].)
        if self.read_tokens > 0
            && self.read_tokens.saturating_add(doc.len) > self.step_tokens
            && self.fills_every_micro_batch()
        {
            self.step(false, emit);
        }
        self.read_tokens = self.read_tokens.saturating_add(doc.len);
        if doc.len >= self.params.outlier {
            self.queue.push_back(doc);
        } else {
            self.read.push(doc);
        }
    }

    /// Whether the step could close now with every micro-batch holding a document: one for
    /// each, counting the leftovers, the documents read and the outliers it would release.
    /// Every document fits an empty micro-batch (it was cut to `max_len`), so the first
    /// `group` of them, longest first, each go to one. Regression (found writing `compare
    /// --steps`): a step that had read long outliers and one short document, the queue short
    /// of a group, closed with one micro-batch, so the micro-batches after it no longer came
    /// `group` at a time and a training step priced as `group` consecutive windows straddled
    /// two of WLB's steps.
    fn fills_every_micro_batch(&self) -> bool {
        let group = self.params.group as usize;
        let released = if self.queue.len() >= group { group } else { 0 };
        self.leftovers.len() + self.read.len() + released >= group
    }

    /// The stream has ended: run steps until every document read is packed.
    pub fn finish(&mut self, emit: &mut impl FnMut(MicroBatch)) {
        self.step(true, emit);
        while !self.queue.is_empty() || !self.leftovers.is_empty() {
            self.step(true, emit);
        }
    }

    /// Pack one step: its documents into `group` micro-batches, emitted in order (empty ones,
    /// which only a trace's last steps leave, are not).
    fn step(&mut self, draining: bool, emit: &mut impl FnMut(MicroBatch)) {
        let group = self.params.group as usize;
        let mut docs = std::mem::take(&mut self.leftovers);
        docs.append(&mut self.read);
        self.read_tokens = 0;
        // At the end of the stream the queue is released even short of a full group.
        let release = if self.queue.len() >= group || draining {
            self.queue.len().min(group)
        } else {
            0
        };
        docs.extend(self.queue.drain(..release));
        // Longest first; ties keep arrival order, so packing is deterministic.
        docs.sort_by_key(|d| std::cmp::Reverse(d.len));
        let mut bins: Vec<(f64, u64, MicroBatch)> = (0..group)
            .map(|_| {
                (
                    0.0,
                    0,
                    MicroBatch {
                        lens: Vec::new(),
                        cuts: 0,
                    },
                )
            })
            .collect();
        let max = self.params.max_len;
        for doc in docs {
            let least_work = argmin(&bins, |b| b.0);
            let shortest = argmin(&bins, |b| b.1 as f64);
            let to = [least_work, shortest]
                .into_iter()
                .find(|&i| bins[i].1 + doc.len <= max);
            match to {
                Some(i) => {
                    let bin = &mut bins[i];
                    bin.0 += self.params.work(doc.len);
                    bin.1 += doc.len;
                    bin.2.lens.push(doc.len);
                    bin.2.cuts += usize::from(doc.cut);
                }
                None => self.leftovers.push(doc),
            }
        }
        for (_, tokens, mb) in bins {
            if tokens > 0 {
                emit(mb);
            }
        }
    }
}

/// The index of the smallest `key` (the first of equals).
fn argmin<T>(items: &[T], key: impl Fn(&T) -> f64) -> usize {
    let mut best = 0;
    for (i, item) in items.iter().enumerate().skip(1) {
        if key(item) < key(&items[best]) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(lens: &[u64], params: WlbParams, context: u64) -> Vec<MicroBatch> {
        let mut state = WlbState::new(params, context).unwrap();
        let mut out = Vec::new();
        let mut emit = |m: MicroBatch| out.push(m);
        for &l in lens {
            state.push(l, &mut emit);
        }
        state.finish(&mut emit);
        out
    }

    fn params(group: u32, max_len: u64, outlier: u64) -> WlbParams {
        WlbParams {
            group,
            max_len,
            outlier,
            breakpoint: None,
        }
    }

    #[test]
    fn a_step_spreads_its_work_and_keeps_every_token() {
        // Two windows of 10 as the stream has them: [9, 1] and [5, 5] (work 82 vs 50).
        let out = pack(&[9, 1, 5, 5], params(2, 20, 100), 10);
        let lens: Vec<_> = out.iter().map(|m| m.lens.clone()).collect();
        // Longest first to the least work: 9 | 5, the second 5 joins the first 5 (25 < 81),
        // and the 1 the lighter pair (50 < 81): work 81 and 51 instead of 82 and 50.
        assert_eq!(lens, vec![vec![9], vec![5, 5, 1]]);
        let tokens: u64 = out.iter().flat_map(|m| &m.lens).sum();
        assert_eq!(tokens, 20);
    }

    #[test]
    fn outliers_wait_until_each_micro_batch_can_take_one() {
        // group 2, outliers ≥ 8: the first 8 waits alone; the second releases both, one each.
        let out = pack(&[8, 2, 2, 2, 2, 8, 2, 2], params(2, 16, 8), 8);
        let lens: Vec<_> = out.iter().map(|m| m.lens.clone()).collect();
        // Step 1 reads 8, 2, 2, 2, 2 (16 tokens); the second 8 opens step 2. Step 1 packs
        // its short documents without its lone outlier.
        assert_eq!(lens[0..2], [vec![2, 2], vec![2, 2]]);
        // Step 2: both outliers, one to each micro-batch, with the short ones around them.
        assert_eq!(lens[2..], [vec![8, 2], vec![8, 2]]);
    }

    /// Feed `lens` one at a time and record how many micro-batches each push closed.
    fn closed_per_push(lens: &[u64], params: WlbParams, context: u64) -> Vec<usize> {
        let mut state = WlbState::new(params, context).unwrap();
        lens.iter()
            .map(|&l| {
                let mut n = 0;
                state.push(l, &mut |_| n += 1);
                n
            })
            .collect()
    }

    #[test]
    fn a_step_without_a_document_for_each_micro_batch_reads_on() {
        // group 4, windows of 100 (a step reads 400), outliers ≥ 50. Two outliers of 130 queue,
        // a 49 is read, and the third 130 would pass the step's share (439 > 400): the step
        // holds one document for four micro-batches, so it reads on (it closed with one
        // micro-batch, out of step with the groups of four after it) until four short ones
        // are in; the next document then closes a full group.
        let lens = [130, 130, 49, 130, 49, 49, 49, 10];
        let closed = closed_per_push(&lens, params(4, 200, 50), 100);
        assert_eq!(closed, [0, 0, 0, 0, 0, 0, 0, 4]);
        let out = pack(&lens, params(4, 200, 50), 100);
        let tokens: u64 = out.iter().flat_map(|m| &m.lens).sum();
        assert_eq!(tokens, lens.iter().sum::<u64>());
    }

    proptest::proptest! {
        /// Before the stream ends, steps close `group` micro-batches at a time, none empty:
        /// what lets a training step be priced as `group` consecutive batches.
        #[test]
        fn steps_close_a_full_group_of_micro_batches(
            lens in proptest::collection::vec(1u64..300, 1..200),
            group in 1u32..6,
            outlier in 20u64..150,
        ) {
            let closed = closed_per_push(&lens, params(group, 200, outlier), 100);
            for n in closed {
                proptest::prop_assert!(n == 0 || n == group as usize);
            }
        }
    }

    #[test]
    fn too_long_documents_are_cut_and_counted() {
        let out = pack(&[30, 3], params(1, 10, 100), 10);
        assert_eq!(out[0].lens, vec![10]);
        assert_eq!(out[0].cuts, 1);
        assert_eq!(out.iter().map(|m| m.cuts).sum::<usize>(), 1);
        assert!(out.iter().all(|m| m.lens.iter().sum::<u64>() <= 10));
    }

    #[test]
    fn leftovers_and_the_queue_drain_when_the_stream_ends() {
        // Two micro-batches of at most 10: the third 6 fits in neither and waits a step.
        let out = pack(&[6, 6, 6], params(2, 10, 100), 10);
        let lens: Vec<_> = out.iter().map(|m| m.lens.clone()).collect();
        assert_eq!(lens, vec![vec![6], vec![6], vec![6]]);
        // Outliers short of a group are released at the end.
        let out = pack(&[9, 1], params(4, 10, 5), 10);
        let tokens: u64 = out.iter().flat_map(|m| &m.lens).sum();
        assert_eq!(tokens, 10);
    }

    #[test]
    fn work_weighs_attention_against_the_linear_layers() {
        let p = WlbParams {
            breakpoint: Some(100),
            ..params(1, 1, 1)
        };
        assert_eq!(p.work(100), 200.0);
        assert_eq!(params(1, 1, 1).work(3), 9.0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(WlbState::new(params(0, 1, 1), 1).is_err());
        assert!(WlbState::new(params(1, 0, 1), 1).is_err());
        assert!(WlbState::new(params(1, 1, 0), 1).is_err());
        assert!(WlbState::new(params(1, 1, 1), 0).is_err());
        assert!(WlbState::new(params(MAX_GROUP + 1, 1, 1), 1).is_err());
        let p = WlbParams {
            breakpoint: Some(0),
            ..params(1, 1, 1)
        };
        assert!(WlbState::new(p, 1).is_err());
        // A limit below the window would strand documents step after step.
        let e = WlbState::new(params(1, 9, 1), 10).unwrap_err().to_string();
        assert!(e.contains("shorter than the 10-token window"), "{e}");
    }
}
