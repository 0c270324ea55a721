//! Sharding and transfer helpers shared by planners, so no scheme re-implements them.

use std::collections::BTreeMap;

use crate::plan::{
    HeadRange, Mask, PlanBuilder, PlanError, TokenRange, Transfer, TransferKind, TransferTensor,
};
use crate::planners::MAX_PLAN_ITEMS;
use crate::trace::Batch;

/// Cut `[0, len)` into `parts` contiguous pieces whose sizes differ by at most one token, with
/// no padding: piece `i` is `[i·len/parts, (i+1)·len/parts)`. Documents shorter than `parts`
/// yield empty pieces, which callers skip. This is the "no per-document divisibility" behaviour
/// users of every CP library ask for (anchors-cp.md §6, item 1).
pub fn split_even(len: u64, parts: u64) -> Vec<(u64, u64)> {
    let parts = parts.max(1) as u128;
    let len = len as u128;
    (0..parts)
        .map(|i| ((i * len / parts) as u64, ((i + 1) * len / parts) as u64))
        .collect()
}

/// How a scheme's implementation pads a batch to the lengths it can shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// Every document to a multiple of this (TransformerEngine's per-document 2N rule).
    PerDocument(u64),
    /// The packed sequence to a multiple of this, padding appended to the last document.
    Total(u64),
}

/// The batch as the scheme's implementation pads it, and the padding added to each document.
/// Plan the padded batch, then call [`PlanBuilder::mark_padding`] with the padding so the plan
/// records real lengths and charges the padding.
pub fn pad_batch(batch: &Batch, rule: Padding) -> (Batch, Vec<u64>) {
    let up = |x: u64, m: u64| if m <= 1 { 0 } else { (m - x % m) % m };
    let mut pads = vec![0u64; batch.doc_lens.len()];
    match rule {
        Padding::PerDocument(m) => {
            for (p, &l) in pads.iter_mut().zip(&batch.doc_lens) {
                *p = up(l, m);
            }
        }
        Padding::Total(m) => {
            if let Some(last) = pads.last_mut() {
                *last = up(batch.tokens(), m);
            }
        }
    }
    let lens = batch
        .doc_lens
        .iter()
        .zip(&pads)
        .map(|(l, p)| l + p)
        .collect();
    (Batch::new(batch.index, lens), pads)
}

/// The contiguous layout of a document over `n` ranks: rank `r` holds piece `r` of
/// [`split_even`] (ring-flash-attention's varlen ring).
pub fn contiguous_pieces(len: u64, n: u32) -> Vec<Vec<(u64, u64)>> {
    split_even(len, n as u64)
        .into_iter()
        .map(|piece| vec![piece])
        .collect()
}

/// The zigzag layout of a document over `n` ranks: cut into 2N even pieces
/// ([`split_even`]), rank `r` holds pieces `r` and `2N − 1 − r` — one early and one late piece,
/// so under a causal mask every rank has the same work (ring-flash-attention's zigzag,
/// Megatron/TE's load-balanced CP, WLB-LLM's per-document CP).
pub fn zigzag_pieces(len: u64, n: u32) -> Vec<Vec<(u64, u64)>> {
    let n = n as usize;
    let pieces = split_even(len, 2 * n as u64);
    (0..n)
        .map(|r| vec![pieces[r], pieces[2 * n - 1 - r]])
        .collect()
}

/// Give every rank its pieces of every document: `pieces(len)` returns, for each rank, the
/// `(start, end)` pieces of a document of that length it owns. Empty pieces are skipped.
/// Registers ownership with the builder and returns each rank's shard in order.
pub fn assign_pieces(
    b: &mut PlanBuilder,
    batch: &Batch,
    ranks: u32,
    pieces: impl Fn(u64) -> Vec<Vec<(u64, u64)>>,
) -> Vec<Vec<TokenRange>> {
    let mut shards = vec![Vec::new(); ranks as usize];
    for (doc, &len) in batch.doc_lens.iter().enumerate() {
        for (r, mine) in pieces(len).into_iter().enumerate() {
            for (s, e) in mine {
                let range = TokenRange::new(doc as u32, s, e);
                if !range.is_empty() {
                    b.own(r as u32, range);
                    shards[r].push(range);
                }
            }
        }
    }
    shards
}

/// Parameters of schemes that run on ring-flash-attention: its backward pass accumulates dK/dV
/// in fp32 and passes them around the ring in fp32 (zhuzilin/ring-flash-attention,
/// `ring_flash_attn_varlen.py` backward), so gradients travel at 4 bytes per element.
pub fn ring_flash_params() -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([("grad_bytes".to_string(), serde_json::json!(4))])
}

/// Emit, on `rank` in `step`, every task between the queries `q` and the keys/values `kv` of the
/// same document that the mask allows: documents in ascending order, and within one the queries
/// and keys/values in the order given.
///
/// Grouped by a stable sort (a no-op on ranges in document order, as shards are) instead of a
/// map of vectors per call: ring and zigzag call this for every rank and step, and at 64 ranks
/// the maps' allocations were a tenth of `fcp plan`.
pub fn cross_tasks(b: &mut PlanBuilder, rank: u32, step: u32, q: &[TokenRange], kv: &[TokenRange]) {
    cross_tasks_heads(b, rank, step, q, kv, None);
}

/// [`cross_tasks`] for the query heads `heads` only (absent = all): a head-parallel rank's
/// share of the tiles (`usp`'s rings, each over one head group).
pub fn cross_tasks_heads(
    b: &mut PlanBuilder,
    rank: u32,
    step: u32,
    q: &[TokenRange],
    kv: &[TokenRange],
    heads: Option<HeadRange>,
) {
    same_doc_pairs(q, kv, |qr, kr| {
        b.task_heads(rank, step, qr, kr, heads);
    });
}

/// The tasks [`cross_tasks`] would emit for `q` × `kv` under `mask`, counted without building
/// them: a planner whose tile count follows a user's parameter refuses an oversized plan with
/// this before it holds a tile ([`crate::planners::MAX_PLAN_ITEMS`]).
///
/// Per document, not per pair: a causal pair has work when its keys start before its queries
/// end, so a sort of the key starts and a binary search per query range count them. Visiting
/// every pair cost as much as building the tiles the count is there to refuse (bug hunt:
/// `magi:chunk=1` on one 512K-token document ran past 60 s before refusing).
pub fn count_cross_tasks(mask: Mask, q: &[TokenRange], kv: &[TokenRange]) -> u64 {
    let mut tasks = 0u64;
    same_doc_groups(q, kv, |qs, ks| {
        let mut starts: Vec<u64> = ks
            .iter()
            .filter(|k| !k.is_empty())
            .map(|k| k.start)
            .collect();
        let queries = qs.iter().filter(|r| !r.is_empty());
        tasks += match mask {
            Mask::Full => queries.count() as u64 * starts.len() as u64,
            Mask::Causal => {
                starts.sort_unstable();
                queries
                    .map(|qr| starts.partition_point(|&s| s < qr.end) as u64)
                    .sum()
            }
        };
    });
    tasks
}

/// Every pair of a range of `q` and a range of `kv` in the same document: documents in
/// ascending order, and within one the queries and keys/values in the order given.
fn same_doc_pairs(
    q: &[TokenRange],
    kv: &[TokenRange],
    mut each: impl FnMut(TokenRange, TokenRange),
) {
    same_doc_groups(q, kv, |qs, ks| {
        for qr in qs {
            for kr in ks {
                each(*qr, *kr);
            }
        }
    });
}

/// The ranges of `q` and of `kv` of each document both touch, documents in ascending order,
/// each side in the order given.
fn same_doc_groups(
    q: &[TokenRange],
    kv: &[TokenRange],
    mut each: impl FnMut(&[TokenRange], &[TokenRange]),
) {
    let (q, kv) = (by_doc(q), by_doc(kv));
    let mut kv_docs = kv.chunk_by(|a, b| a.doc == b.doc).peekable();
    for qs in q.chunk_by(|a, b| a.doc == b.doc) {
        let doc = qs[0].doc;
        while kv_docs.next_if(|ks| ks[0].doc < doc).is_some() {}
        if let Some(ks) = kv_docs.peek().filter(|ks| ks[0].doc == doc) {
            each(qs, ks);
        }
    }
}

/// `ranges` stably sorted by document (borrowed when they already are).
fn by_doc(ranges: &[TokenRange]) -> std::borrow::Cow<'_, [TokenRange]> {
    if ranges.is_sorted_by_key(|r| r.doc) {
        return std::borrow::Cow::Borrowed(ranges);
    }
    let mut v = ranges.to_vec();
    v.sort_by_key(|r| r.doc);
    std::borrow::Cow::Owned(v)
}

/// The document ranges covering tokens `[start, end)` of the packed sequence (all documents of
/// the batch back to back, in order). Schemes that shard the packed buffer regardless of
/// document boundaries (Llama3 CP, Ulysses, MagiAttention) cut it with this.
pub fn packed_ranges(doc_lens: &[u64], start: u64, end: u64) -> Vec<TokenRange> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    for (doc, &len) in doc_lens.iter().enumerate() {
        let (s, e) = (start.max(offset), end.min(offset + len));
        if s < e {
            out.push(TokenRange::new(doc as u32, s - offset, e - offset));
        }
        offset += len;
        if offset >= end {
            break;
        }
    }
    out
}

/// Own `ranges` on `rank` (in order) and return them, skipping empty ones and joining
/// consecutive ranges that continue each other (two packed chunks that meet in the middle).
pub fn own_all(b: &mut PlanBuilder, rank: u32, ranges: &[TokenRange]) -> Vec<TokenRange> {
    let mut kept: Vec<TokenRange> = Vec::new();
    for r in ranges.iter().filter(|r| !r.is_empty()) {
        match kept.last_mut() {
            Some(last) if last.doc == r.doc && last.end == r.start => last.end = r.end,
            _ => kept.push(*r),
        }
    }
    for r in &kept {
        b.own(rank, *r);
    }
    kept
}

/// Sort ranges and merge those that touch or overlap (per document).
pub fn merge_ranges(ranges: &[TokenRange]) -> Vec<TokenRange> {
    let mut v: Vec<TokenRange> = ranges.iter().copied().filter(|r| !r.is_empty()).collect();
    v.sort_unstable();
    let mut out: Vec<TokenRange> = Vec::new();
    for r in v {
        match out.last_mut() {
            Some(last) if last.doc == r.doc && r.start <= last.end => {
                last.end = last.end.max(r.end)
            }
            _ => out.push(r),
        }
    }
    out
}

/// The parts of `wanted` not covered by `held` (both any order), merged and sorted.
///
/// Both sides merged are sorted and disjoint, so one pass over each: `first` skips the held
/// ranges that end before the current wanted one, which no later wanted range can overlap
/// either (a scan of every held range per wanted one made per-doc and wlb-llm take seconds to
/// plan at 256 ranks, 70% of it here).
pub fn subtract_ranges(wanted: &[TokenRange], held: &[TokenRange]) -> Vec<TokenRange> {
    let held = merge_ranges(held);
    let mut out = Vec::new();
    let mut first = 0;
    for w in merge_ranges(wanted) {
        while first < held.len() && (held[first].doc, held[first].end) <= (w.doc, w.start) {
            first += 1;
        }
        let mut pos = w.start;
        for h in held[first..]
            .iter()
            .take_while(|h| h.doc == w.doc && h.start < w.end)
        {
            if h.start > pos {
                out.push(TokenRange::new(w.doc, pos, h.start));
            }
            pos = pos.max(h.end);
        }
        if pos < w.end {
            out.push(TokenRange::new(w.doc, pos, w.end));
        }
    }
    out
}

/// The parts of `a` that lie inside `b`, sorted: the plain scan, kept as the tests' oracle for
/// [`Owners::split`].
#[cfg(test)]
pub fn intersect_ranges(a: &[TokenRange], b: &[TokenRange]) -> Vec<TokenRange> {
    let b = merge_ranges(b);
    let mut out = Vec::new();
    for x in merge_ranges(a) {
        for y in b.iter().filter(|y| y.doc == x.doc) {
            let (s, e) = (x.start.max(y.start), x.end.min(y.end));
            if s < e {
                out.push(TokenRange::new(x.doc, s, e));
            }
        }
    }
    out
}

/// Who owns each token: every rank's shard ranges, sorted by position. Shards are disjoint, so
/// the owners of any wanted range are found by binary search rather than by intersecting it
/// with every rank's shard (MagiAttention's dispatch did that, N² intersections: 19 GB and a
/// minute at 16K ranks for a plan of 50K transfers).
pub struct Owners {
    pieces: Vec<(TokenRange, u32)>,
}

impl Owners {
    /// Index `shards` (indexed by rank; ranges disjoint across ranks).
    pub fn new(shards: &[Vec<TokenRange>]) -> Owners {
        let mut pieces: Vec<(TokenRange, u32)> = shards
            .iter()
            .enumerate()
            .flat_map(|(r, own)| {
                own.iter()
                    .filter(|x| !x.is_empty())
                    .map(move |x| (*x, r as u32))
            })
            .collect();
        pieces.sort_unstable_by_key(|(x, _)| (x.doc, x.start));
        Owners { pieces }
    }

    /// The parts of `wanted` each rank owns, ranks ascending, each rank's parts sorted and merged
    /// where they touch: for every rank, what [`intersect_ranges`]`(wanted, shard)` returns (ranks
    /// owning none of it left out).
    pub fn split(&self, wanted: &[TokenRange]) -> Vec<(u32, Vec<TokenRange>)> {
        let mut by_rank: BTreeMap<u32, Vec<TokenRange>> = BTreeMap::new();
        for w in merge_ranges(wanted) {
            let first = self
                .pieces
                .partition_point(|(x, _)| (x.doc, x.end) <= (w.doc, w.start));
            for &(x, r) in self.pieces[first..]
                .iter()
                .take_while(|(x, _)| x.doc == w.doc && x.start < w.end)
            {
                let (s, e) = (x.start.max(w.start), x.end.min(w.end));
                if s >= e {
                    continue;
                }
                let parts = by_rank.entry(r).or_default();
                match parts.last_mut() {
                    Some(last) if last.doc == w.doc && last.end == s => last.end = e,
                    _ => parts.push(TokenRange::new(w.doc, s, e)),
                }
            }
        }
        by_rank.into_iter().collect()
    }
}

/// The keys/values the queries `q` need under `mask`, merged per document: the document prefix
/// `[0, q.end)` for a causal mask, the whole document for a full mask. This is the
/// `local_k_slice` of ring-flash-attention's llama3 varlen and what MagiAttention's static
/// solver fetches.
pub fn needed_kv(mask: crate::plan::Mask, doc_lens: &[u64], q: &[TokenRange]) -> Vec<TokenRange> {
    let need: Vec<TokenRange> = q
        .iter()
        .map(|r| match mask {
            crate::plan::Mask::Causal => TokenRange::new(r.doc, 0, r.end),
            crate::plan::Mask::Full => TokenRange::new(r.doc, 0, doc_lens[r.doc as usize]),
        })
        .collect();
    merge_ranges(&need)
}

/// One all-gather of K/V among `group`, collective id `id`: every member sends its whole shard
/// (`shards` is indexed by global rank) to every other member, issued at step 0 and due by
/// `arrive_by`. The pieces carry everything, as Llama3 CP and WLB-LLM gather the whole K/V
/// whether or not the receiver's queries need it (anchors-cp.md §0, §4).
pub fn all_gather(
    b: &mut PlanBuilder,
    group: &[u32],
    shards: &[Vec<TokenRange>],
    id: u32,
    arrive_by: u32,
) -> Result<(), PlanError> {
    all_gather_heads(b, group, shards, id, 0, arrive_by, None)
}

/// [`all_gather`] of the K/V heads in `heads` (query-head units, whole GQA groups), issued when
/// the sources start step `issue_at`: one slice of ring-flash-attention's head-strided gather.
///
/// Each member's shard is listed once, sent to the other members in group order (the first as
/// `dst`, the rest as `also_to`): N pieces rather than N(N − 1).
pub fn all_gather_heads(
    b: &mut PlanBuilder,
    group: &[u32],
    shards: &[Vec<TokenRange>],
    id: u32,
    issue_at: u32,
    arrive_by: u32,
    heads: Option<HeadRange>,
) -> Result<(), PlanError> {
    check_gather_size(b, group, shards)?;
    for &src in group {
        let mut receivers = group.iter().copied().filter(|&r| r != src);
        let Some(dst) = receivers.next() else {
            continue;
        };
        b.transfer(Transfer {
            kind: TransferKind::AllGather,
            collective: Some(id),
            tensor: TransferTensor::Kv,
            src,
            dst,
            also_to: receivers.collect(),
            ranges: shards[src as usize].clone(),
            heads,
            issue_at,
            arrive_by,
            round: None,
        });
    }
    Ok(())
}

/// Refuse an all-gather of `shards` among `group` that would take the plan past what it may
/// hold (see [`check_gather_totals`]), counting what the plan lists and delivers already.
fn check_gather_size(
    b: &PlanBuilder,
    group: &[u32],
    shards: &[Vec<TokenRange>],
) -> Result<(), PlanError> {
    let listed = group.iter().fold(0u64, |acc, &src| {
        acc.saturating_add(shards[src as usize].len() as u64)
    });
    let receivers = group.len().saturating_sub(1) as u64;
    let before = Sizes::of(b.transfers());
    check_gather_totals(
        group.len(),
        Sizes {
            listed: before.listed.saturating_add(listed),
            delivered: before
                .delivered
                .saturating_add(listed.saturating_mul(receivers)),
            deliveries: before
                .deliveries
                .saturating_add((group.len() as u64).saturating_mul(receivers)),
        },
    )
}

/// Refuse `gathers` all-gathers among `members` ranks that list `listed` token ranges in all
/// (or at least that many: a planner may call this with lower bounds before it shards
/// anything), every member's shard delivered to the `members − 1` others, when that is more
/// than a plan may hold ([`check_gather_totals`]).
pub fn check_gather_ranges(members: usize, gathers: u64, listed: u64) -> Result<(), PlanError> {
    let receivers = members.saturating_sub(1) as u64;
    check_gather_totals(
        members,
        Sizes {
            listed,
            delivered: listed.saturating_mul(receivers),
            deliveries: gathers
                .saturating_mul(members as u64)
                .saturating_mul(receivers),
        },
    )
}

/// The most token ranges a plan may deliver, counting a range once per receiver: 2³⁰. A
/// multicast lists each range once ([`MAX_PLAN_ITEMS`] bounds that), but the verifier and the
/// simulator read it once per receiver, one receiving rank at a time, so this bounds their
/// time rather than their memory. Per-doc CP at 256 ranks delivers 130 million ranges on the
/// bundled trace (`fcp simulate`, which verifies first, 22 s) and 625 million on the magi trace
/// (60 s); FlashCP at 1024 ranks 286 million.
pub const MAX_DELIVERED_RANGES: u64 = 1 << 30;

/// What a plan's transfers hold: token ranges listed, token ranges delivered (once per
/// receiver) and deliveries (one per transfer and receiver).
struct Sizes {
    listed: u64,
    delivered: u64,
    deliveries: u64,
}

impl Sizes {
    /// The sizes of `transfers`.
    fn of(transfers: &[Transfer]) -> Sizes {
        transfers.iter().fold(
            Sizes {
                listed: 0,
                delivered: 0,
                deliveries: 0,
            },
            |s, t| {
                let (ranges, receivers) = (t.ranges.len() as u64, t.receiver_count() as u64);
                Sizes {
                    listed: s.listed + ranges,
                    delivered: s.delivered + ranges * receivers,
                    deliveries: s.deliveries + receivers,
                }
            },
        )
    }
}

/// Refuse an all-gather among `members` ranks that leaves the plan past a limit: more than
/// [`MAX_PLAN_ITEMS`] listed token ranges or deliveries (the simulator costs each delivery as
/// a message: Llama3-contig at 4096 ranks has 134 million), or more than
/// [`MAX_DELIVERED_RANGES`] delivered token ranges.
fn check_gather_totals(members: usize, s: Sizes) -> Result<(), PlanError> {
    let (what, count, limit, verb) = if s.listed > MAX_PLAN_ITEMS {
        (
            "lists at least {} token ranges",
            s.listed,
            MAX_PLAN_ITEMS,
            "hold",
        )
    } else if s.deliveries > MAX_PLAN_ITEMS {
        (
            "makes at least {} deliveries (one per shard and receiver)",
            s.deliveries,
            MAX_PLAN_ITEMS,
            "make",
        )
    } else if s.delivered > MAX_DELIVERED_RANGES {
        (
            "delivers at least {} token ranges",
            s.delivered,
            MAX_DELIVERED_RANGES,
            "deliver",
        )
    } else {
        return Ok(());
    };
    let what = what.replace("{}", &count.to_string());
    Err(PlanError::Planning(format!(
        "this batch's all-gather on {members} ranks {what} (every rank's shard, one piece per \
         document, sent to each of the other ranks), more than the {limit} a plan may {verb}; \
         use fewer ranks, smaller batches, or a scheme that exchanges K/V point to point (fcp, \
         magi)"
    )))
}

/// Refuse a placement whose K/V exchange could not be held, before any step is scheduled. If
/// `r` ranks hold pieces of a causal document, then of any two of them one holds a piece
/// before some piece of the other, whose queries need it: at least one token range reaches
/// that rank, directly or by a relay hop, so the exchange lists at least `r(r − 1)/2` ranges
/// (`r(r − 1)` under a full mask, where both directions are needed). FCP at 65,536 ranks on a
/// one-token-per-rank batch spread documents over thousands of ranks each and built plans
/// until memory ran out (16 GB after a minute) instead of refusing.
pub fn check_spread(
    scheme: &str,
    owned: &[Vec<TokenRange>],
    docs: usize,
    mask: crate::plan::Mask,
) -> Result<(), PlanError> {
    let mut holders = vec![0u64; docs];
    let mut last = vec![u32::MAX; docs];
    for (r, ranges) in owned.iter().enumerate() {
        for t in ranges {
            let d = t.doc as usize;
            if d < docs && last[d] != r as u32 {
                last[d] = r as u32;
                holders[d] += 1;
            }
        }
    }
    let ranges = holders.iter().fold(0u64, |acc, &h| {
        let pairs = h.saturating_mul(h.saturating_sub(1));
        acc.saturating_add(if mask == crate::plan::Mask::Causal {
            pairs / 2
        } else {
            pairs
        })
    });
    if ranges > MAX_PLAN_ITEMS {
        let widest = holders.iter().max().copied().unwrap_or(0);
        return Err(PlanError::Planning(format!(
            "{scheme}: this placement spreads documents over up to {widest} ranks each, so its \
             K/V exchange lists at least {ranges} token ranges, more than the {MAX_PLAN_ITEMS} \
             a plan may hold; use fewer ranks, more tokens per rank, or larger blocks"
        )));
    }
    Ok(())
}

/// All-gather attention over per-rank shards (already owned): step 0 computes each rank's
/// queries against the K/V it owns while the all-gather (collective 0) runs; step 1 computes them
/// against the gathered K/V of other ranks, restricted to the ranges the mask lets its queries
/// see (each rank attends only to what its queries need; the pieces still carry everything).
pub fn gather_attend(b: &mut PlanBuilder, shards: &[Vec<TokenRange>]) -> Result<(), PlanError> {
    gather_attend_sending(b, shards, shards)
}

/// [`gather_attend`] where rank `r` contributes `sent[r]` to the all-gather rather than all it
/// owns (FlashCP's Eq. 5 leaves out shards no other rank reads). A gather too large to hold is
/// refused before any task is built: per-doc CP at 256 ranks used to spend most of a second
/// listing tasks for a plan it then refused.
pub fn gather_attend_sending(
    b: &mut PlanBuilder,
    owned: &[Vec<TokenRange>],
    sent: &[Vec<TokenRange>],
) -> Result<(), PlanError> {
    let n = owned.len() as u32;
    let group: Vec<u32> = (0..n).collect();
    check_gather_size(b, &group, sent)?;
    let mask = b.mask();
    let lens: Vec<u64> = b.documents().iter().map(|d| d.extent()).collect();
    // The tiles, counted before any is built (bug hunt: per-doc CP of 100,000 short documents
    // on 64 ranks passed the gather's check and built 38 million tiles, 5 GB, past the cap).
    let mut tiles = b.task_count();
    for own in owned {
        let remote = subtract_ranges(&needed_kv(mask, &lens, own), own);
        tiles = tiles
            .saturating_add(count_cross_tasks(mask, own, own))
            .saturating_add(count_cross_tasks(mask, own, &remote));
        if tiles > MAX_PLAN_ITEMS {
            return Err(PlanError::Planning(format!(
                "this batch needs more than {MAX_PLAN_ITEMS} attention tiles on {n} ranks (each \
                 rank pairs its pieces of every document with all the K/V of that document its \
                 queries need), more than a plan may hold; use fewer ranks, smaller batches, or \
                 a scheme that keeps short documents whole (fcp, flashcp, magi)"
            )));
        }
    }
    for (r, own) in owned.iter().enumerate() {
        cross_tasks(b, r as u32, 0, own, own);
        let remote = subtract_ranges(&needed_kv(mask, &lens, own), own);
        cross_tasks(b, r as u32, 1, own, &remote);
    }
    all_gather(b, &group, sent, 0, 1)
}

/// Ring attention over the given per-rank shards (already registered with
/// [`PlanBuilder::own`]): step 0 computes each rank's queries against its own K/V; in step
/// `s = 1..N` rank `r` receives from rank `r − 1` the K/V that rank `r − s` owns (sent while
/// step `s − 1` computes, the double-buffered pass of ring-flash-attention) and computes its
/// queries against it. All K/V travel the whole ring, as in ring-flash-attention, even where a
/// causal mask makes a piece useless downstream; the simulator charges what the scheme sends.
pub fn ring_pass(b: &mut PlanBuilder, shards: &[Vec<TokenRange>]) -> Result<(), PlanError> {
    let group: Vec<u32> = (0..shards.len() as u32).collect();
    ring_pass_group(b, &group, shards)
}

/// [`ring_pass`] inside a sub-group of ranks (ByteScale's per-group rings): `group` lists the
/// ring's ranks in ring order and `shards` is indexed by global rank. Refuses, before building
/// anything, a pass whose tiles would take the plan past [`MAX_PLAN_ITEMS`].
pub fn ring_pass_group(
    b: &mut PlanBuilder,
    group: &[u32],
    shards: &[Vec<TokenRange>],
) -> Result<(), PlanError> {
    ring_pass_heads(b, group, |i| &shards[group[i] as usize], None)
}

/// The query heads a head-parallel ring computes and the K/V heads it circulates (in
/// query-head units, whole GQA groups: [`kv_group`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingHeads {
    /// Query heads of every tile.
    pub q: HeadRange,
    /// K/V heads every hop carries.
    pub kv: HeadRange,
}

/// [`ring_pass_group`] over one head group (`heads`; absent = all heads), where `shard(i)` is
/// what the ring's `i`-th member (`group[i]`) holds: `usp` runs one ring per head group, each
/// member holding the union its Ulysses group gathered for those heads (one per group, not
/// a copy per rank).
pub fn ring_pass_heads<'a>(
    b: &mut PlanBuilder,
    group: &[u32],
    shard: impl Fn(usize) -> &'a [TokenRange],
    heads: Option<RingHeads>,
) -> Result<(), PlanError> {
    let n = group.len();
    check_ring_size(b, n, &shard)?;
    let (q_heads, kv_heads) = (heads.map(|h| h.q), heads.map(|h| h.kv));
    for (i, &r) in group.iter().enumerate() {
        cross_tasks_heads(b, r, 0, shard(i), shard(i), q_heads);
    }
    for s in 1..n {
        for i in 0..n {
            let r = group[i];
            let from = group[(i + n - 1) % n];
            let ranges = shard((i + n - s) % n).to_vec();
            cross_tasks_heads(b, r, s as u32, shard(i), &ranges, q_heads);
            b.transfer(Transfer {
                heads: kv_heads,
                ..Transfer::kv(from, r, ranges, s as u32 - 1, s as u32)
            });
        }
    }
    Ok(())
}

/// A ring pass pairs every piece of a document with every other piece of it: `p` pieces give
/// `p²` tiles, `p(p + 1)/2` of them non-empty under a causal mask. Counted from the shards in
/// O(pieces), so an oversized batch is refused in microseconds, not after minutes of building.
fn check_ring_size<'a>(
    b: &PlanBuilder,
    members: usize,
    shard: &impl Fn(usize) -> &'a [TokenRange],
) -> Result<(), PlanError> {
    let mut pieces = vec![0u64; b.documents().len()];
    for i in 0..members {
        for piece in shard(i) {
            if let Some(p) = pieces.get_mut(piece.doc as usize) {
                *p += 1;
            }
        }
    }
    ring_tiles_fit(b, members, 1, &pieces)
}

/// Refuse, before a document is cut, a ring pass over all `n` ranks whose tiles could not be
/// held: a document of `len` tokens is cut into at least min(len, n) non-empty pieces by both
/// [`contiguous_pieces`] and [`zigzag_pieces`], so [`check_ring_size`] would count at least
/// the tiles of that many. (Cutting first took ring and zigzag 2–3 s at 4096 ranks to refuse.)
pub fn check_ring_bound(b: &PlanBuilder, batch: &Batch, n: u32) -> Result<(), PlanError> {
    check_rings_bound(b, batch, n, 1, |len| len.min(u64::from(n)))
}

/// [`check_ring_bound`] for `rings` passes of `n` members each (one per head group, `usp`),
/// each building its own tiles, where a document of `len` tokens is cut into at least
/// `pieces(len)` pieces. Checking one ring of `n` pieces let `usp` at 256 ranks cut the
/// batch and hold 3.5 GB before its first ring was refused.
pub fn check_rings_bound(
    b: &PlanBuilder,
    batch: &Batch,
    n: u32,
    rings: u32,
    pieces: impl Fn(u64) -> u64,
) -> Result<(), PlanError> {
    let pieces: Vec<u64> = batch.doc_lens.iter().map(|&l| pieces(l)).collect();
    ring_tiles_fit(b, n as usize, rings, &pieces)
}

/// The tiles of a ring pass whose documents are cut into `pieces[doc]` pieces each (every
/// piece paired with every other the mask allows), on top of the tasks already built, against
/// [`MAX_PLAN_ITEMS`].
fn ring_tiles_fit(
    b: &PlanBuilder,
    members: usize,
    rings: u32,
    pieces: &[u64],
) -> Result<(), PlanError> {
    // Every member takes one step per member, tiles or not: at 65,536 ranks 4·10⁹ steps, which
    // took minutes to build for a one-token batch before anything refused it.
    let steps = (members as u64).saturating_mul(members as u64);
    if steps > MAX_PLAN_ITEMS {
        return Err(PlanError::Planning(format!(
            "a ring pass over {members} ranks takes {members} steps on each rank, {steps} in all, \
             more than the {MAX_PLAN_ITEMS} a plan may hold; use fewer ranks or a scheme without \
             a ring over all of them (fcp, flashcp, per-doc, llama3, magi)"
        )));
    }
    let causal = b.mask() == crate::plan::Mask::Causal;
    let tiles = pieces.iter().fold(0u64, |acc, &p| {
        let t = if causal {
            p.saturating_mul(p + 1) / 2
        } else {
            p.saturating_mul(p)
        };
        acc.saturating_add(t)
    });
    let total = tiles
        .saturating_mul(u64::from(rings))
        .saturating_add(b.task_count());
    if total > MAX_PLAN_ITEMS {
        let on = match rings {
            1 => format!("on {members} ranks"),
            k => format!("in {k} rings (one per head group) of {members} ranks"),
        };
        return Err(PlanError::Planning(format!(
            "this batch needs at least {total} attention tiles {on} (a ring pass cuts each \
             document into one piece per rank and pairs every piece with every other), more \
             than the {MAX_PLAN_ITEMS} a plan may hold; use fewer ranks, smaller batches, or a \
             scheme that does not split every document across all ranks (fcp, flashcp, \
             per-doc, llama3, magi)"
        )));
    }
    Ok(())
}

/// Query heads per K/V head (the GQA group) of `model`, for a head-parallel `scheme`; refused
/// when the query heads are not a whole multiple of the K/V heads, since its ranks could not
/// each read whole K/V heads.
pub fn gqa_group(scheme: &str, model: &crate::Model) -> Result<u32, PlanError> {
    let (hq, hk) = (model.q_heads, model.kv_heads);
    if hk == 0 || hq % hk != 0 {
        return Err(PlanError::Planning(format!(
            "{scheme} needs q_heads ({hq}) to be a multiple of kv_heads ({hk})"
        )));
    }
    Ok(hq / hk)
}

/// The query heads rank `r` of `n` computes.
pub fn head_group(q_heads: u32, n: u32, r: u32) -> HeadRange {
    let per = q_heads / n;
    HeadRange {
        start: r * per,
        end: (r + 1) * per,
    }
}

/// Refuse, before any is listed, the [`head_all_to_all`]s of groups of `members` ranks over
/// `shards` (indexed by rank, every rank in one group) when they would list more token ranges
/// than a plan may hold ([`MAX_PLAN_ITEMS`]): each piece lists its sender's whole shard, to each
/// of the `members − 1` others of its group, for Q, K/V and the outputs. `usp:ulysses=64` at
/// 128 ranks listed 49 million ranges (a 768 MB plan, 2 GB of memory) and at 256 ranks ran out
/// of memory (bug hunt). `what` names the scheme as the user wrote it.
pub fn check_head_all_to_alls(
    what: &str,
    shards: &[Vec<TokenRange>],
    members: u32,
) -> Result<(), PlanError> {
    let ranges: u64 = shards.iter().map(|s| s.len() as u64).sum();
    let listed = head_all_to_all_ranges(ranges, members);
    if listed <= MAX_PLAN_ITEMS {
        return Ok(());
    }
    Err(PlanError::Planning(format!(
        "{what} on {} ranks lists {listed} token ranges in its all-to-alls (each rank's shard \
         sent to every other rank of its group for Q, K/V and the outputs), more than the \
         {MAX_PLAN_ITEMS} a plan may hold; use a smaller Ulysses degree, fewer ranks or smaller \
         batches",
        shards.len()
    )))
}

/// The token ranges [`head_all_to_all`]s of groups of `members` ranks list over shards of
/// `ranges` ranges in all: what [`check_head_all_to_alls`] holds against [`MAX_PLAN_ITEMS`],
/// and what a default degree can check before anything is cut.
pub fn head_all_to_all_ranges(ranges: u64, members: u32) -> u64 {
    3u64.saturating_mul(u64::from(members.saturating_sub(1)))
        .saturating_mul(ranges)
}

/// Ulysses' all-to-alls among `members` (ranks, in head-group order; `shards` indexed by
/// rank): member `i` computes query heads `head_group(q_heads, members.len(), i)` of every
/// member's tokens, so each member sends every other its shard's Q for that head group
/// (collective `first_id`) and the K/V heads the group reads (`first_id + 1`, replicated
/// where a head group needs a whole K/V head another needs too), both due before step 0; the
/// outputs go back to the tokens' owners (`first_id + 2`) when the computing rank starts step
/// `out_at`, after its last tile. `gqa` is the query heads per K/V head. `ulysses` runs one
/// such group over all ranks; `usp` one inside each node.
pub fn head_all_to_all(
    b: &mut PlanBuilder,
    members: &[u32],
    shards: &[Vec<TokenRange>],
    (q_heads, gqa): (u32, u32),
    first_id: u32,
    out_at: u32,
) {
    let n = members.len() as u32;
    let piece = |tensor, id, src: u32, dst: u32, heads, at| Transfer {
        kind: TransferKind::AllToAll,
        collective: Some(first_id + id),
        tensor,
        src,
        dst,
        also_to: Vec::new(),
        ranges: shards[src as usize].clone(),
        heads: Some(heads),
        issue_at: at,
        arrive_by: at,
        round: None,
    };
    for &src in members {
        for (i, &dst) in members.iter().enumerate().filter(|&(_, &d)| d != src) {
            let h = head_group(q_heads, n, i as u32);
            b.transfer(piece(TransferTensor::Q, 0, src, dst, h, 0));
            b.transfer(piece(TransferTensor::Kv, 1, src, dst, kv_group(h, gqa), 0));
            // Outputs of `src`'s tokens computed on `dst` go back after its last tile.
            let mut out = piece(TransferTensor::Out, 2, src, dst, h, out_at);
            std::mem::swap(&mut out.src, &mut out.dst);
            b.transfer(out);
        }
    }
}

/// The K/V heads query heads `h` read, in query-head units rounded out to whole GQA groups of
/// `group` query heads. A K/V transfer's `heads` names the K/V heads it moves this way, so
/// `transfer_bytes` counts every replicated K/V head (N > kv_heads) instead of a share.
pub fn kv_group(h: HeadRange, group: u32) -> HeadRange {
    HeadRange {
        start: h.start / group * group,
        end: h.end.div_ceil(group) * group,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One document spread one token per rank over `ranks` ranks, and a second on rank 0.
    fn spread(ranks: u32) -> Vec<Vec<TokenRange>> {
        (0..ranks)
            .map(|r| {
                let mut v = vec![TokenRange::new(0, r as u64, r as u64 + 1)];
                if r == 0 {
                    v.push(TokenRange::new(1, 0, 5));
                }
                v
            })
            .collect()
    }

    proptest! {
        /// The tasks, in order, of grouping by a map of documents (the first version): for
        /// each document ascending, every query range by every key/value range, as given.
        #[test]
        fn cross_tasks_emit_the_map_grouping_in_order(
            q in prop::collection::vec((0u32..4, 0u64..40, 1u64..30), 0..12),
            kv in prop::collection::vec((0u32..4, 0u64..40, 1u64..30), 0..12),
        ) {
            use crate::plan::Mask;
            use crate::planners::testing::with_ctx;
            let range = |&(d, s, l): &(u32, u64, u64)| TokenRange::new(d, s, s + l);
            let (q, kv): (Vec<TokenRange>, Vec<TokenRange>) =
                (q.iter().map(range).collect(), kv.iter().map(range).collect());
            let batch = Batch::new(0, vec![100; 4]);
            let tasks = with_ctx(1, Mask::Full, |ctx| {
                let mut b = PlanBuilder::new("t", BTreeMap::new(), &batch, ctx);
                cross_tasks(&mut b, 0, 0, &q, &kv);
                b.finish().ranks[0].steps.first().map(|s| s.tasks.clone()).unwrap_or_default()
            });
            let group = |rs: &[TokenRange]| {
                let mut m: BTreeMap<u32, Vec<TokenRange>> = BTreeMap::new();
                for r in rs {
                    m.entry(r.doc).or_default().push(*r);
                }
                m
            };
            let kvs = group(&kv);
            let mut expected = Vec::new();
            for (doc, qs) in group(&q) {
                for qr in &qs {
                    for kr in kvs.get(&doc).into_iter().flatten() {
                        expected.push((*qr, *kr));
                    }
                }
            }
            let got: Vec<_> = tasks.iter().map(|t| (t.q, t.kv)).collect();
            prop_assert_eq!(got, expected);
            // The count a planner refuses by is the tasks built, under either mask.
            for mask in [Mask::Full, Mask::Causal] {
                let built = with_ctx(1, mask, |ctx| {
                    let mut b = PlanBuilder::new("t", BTreeMap::new(), &batch, ctx);
                    cross_tasks(&mut b, 0, 0, &q, &kv);
                    b.task_count()
                });
                prop_assert_eq!(count_cross_tasks(mask, &q, &kv), built, "{:?}", mask);
            }
        }
    }

    #[test]
    fn check_spread_counts_one_range_per_pair_of_holders() {
        use crate::plan::Mask;
        // 8192·8191/2 = 33,550,336 fits 2^25 = 33,554,432; 8193 ranks do not.
        assert!(check_spread("fcp", &spread(8192), 2, Mask::Causal).is_ok());
        let e = check_spread("fcp", &spread(8193), 2, Mask::Causal).unwrap_err();
        assert!(e.to_string().contains("up to 8193 ranks"), "{e}");
        // Full masks need both directions: 5794·5793 > 2^25 ≥ 5793·5792.
        assert!(check_spread("fcp", &spread(5793), 2, Mask::Full).is_ok());
        assert!(check_spread("fcp", &spread(5794), 2, Mask::Full).is_err());
        // Several ranges of one document on a rank count it once.
        let mut twice = spread(8192);
        twice[3].push(TokenRange::new(0, 9000, 9001));
        assert!(check_spread("fcp", &twice, 2, Mask::Causal).is_ok());
    }

    proptest! {
        #[test]
        fn subtract_ranges_leaves_exactly_the_tokens_wanted_and_not_held(
            wanted in prop::collection::vec((0u32..3, 0u64..40, 0u64..12), 0..12),
            held in prop::collection::vec((0u32..3, 0u64..40, 0u64..12), 0..12),
        ) {
            // Token by token: (doc, position) sets, against the one pass over merged ranges.
            let ranges = |v: &[(u32, u64, u64)]| -> Vec<TokenRange> {
                v.iter().map(|&(d, s, l)| TokenRange::new(d, s, s + l)).collect()
            };
            let (w, h) = (ranges(&wanted), ranges(&held));
            let tokens = |v: &[TokenRange]| -> std::collections::BTreeSet<(u32, u64)> {
                v.iter().flat_map(|r| (r.start..r.end).map(move |t| (r.doc, t))).collect()
            };
            let out = subtract_ranges(&w, &h);
            let expected: Vec<_> = tokens(&w).difference(&tokens(&h)).copied().collect();
            prop_assert_eq!(tokens(&out).into_iter().collect::<Vec<_>>(), expected);
            prop_assert_eq!(merge_ranges(&out), out.clone(), "merged and sorted");
        }
    }

    proptest! {
        #[test]
        fn owners_split_is_the_intersection_with_every_rank_s_shard(
            pieces in prop::collection::vec((0u32..3, 1u64..8, 0u32..4), 0..20),
            wanted in prop::collection::vec((0u32..3, 0u64..40, 0u64..12), 0..8),
        ) {
            // Consecutive pieces of each document, dealt to ranks (neighbours often alike).
            let mut shards = vec![Vec::new(); 4];
            let mut end = [0u64; 3];
            for &(doc, len, rank) in &pieces {
                let start = end[doc as usize];
                end[doc as usize] += len;
                shards[rank as usize].push(TokenRange::new(doc, start, start + len));
            }
            let w: Vec<TokenRange> =
                wanted.iter().map(|&(d, s, l)| TokenRange::new(d, s, s + l)).collect();
            let expected: Vec<(u32, Vec<TokenRange>)> = (0..4u32)
                .map(|r| (r, intersect_ranges(&w, &shards[r as usize])))
                .filter(|(_, x)| !x.is_empty())
                .collect();
            prop_assert_eq!(Owners::new(&shards).split(&w), expected);
        }
    }

    /// `check_ring_bound` counts min(len, n) pieces per document: never more than either cut
    /// makes, so it refuses nothing the exact check would let through.
    #[test]
    fn both_ring_cuts_make_at_least_min_len_n_pieces() {
        for n in 1..24u32 {
            for len in 1..80u64 {
                let count = |cut: Vec<Vec<(u64, u64)>>| {
                    cut.iter().flatten().filter(|(s, e)| e > s).count() as u64
                };
                assert_eq!(count(contiguous_pieces(len, n)), len.min(n as u64));
                assert!(
                    count(zigzag_pieces(len, n)) >= len.min(n as u64),
                    "{len} {n}"
                );
            }
        }
    }

    #[test]
    fn split_even_is_contiguous_and_balanced() {
        for len in 1..50u64 {
            for parts in 1..20u64 {
                let p = split_even(len, parts);
                assert_eq!(p.len() as u64, parts);
                assert_eq!(p[0].0, 0);
                assert_eq!(p.last().unwrap().1, len);
                for w in p.windows(2) {
                    assert_eq!(w[0].1, w[1].0);
                }
                let sizes: Vec<u64> = p.iter().map(|(a, b)| b - a).collect();
                let (mn, mx) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(mx - mn <= 1, "len {len} parts {parts}: {sizes:?}");
            }
        }
    }
}
