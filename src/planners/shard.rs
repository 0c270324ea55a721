//! Sharding and transfer helpers shared by planners, so no scheme re-implements them.

use std::collections::BTreeMap;

use crate::plan::{PlanBuilder, TokenRange, Transfer};
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

/// Group ranges by document, keeping their order.
fn by_doc(ranges: &[TokenRange]) -> BTreeMap<u32, Vec<TokenRange>> {
    let mut m: BTreeMap<u32, Vec<TokenRange>> = BTreeMap::new();
    for r in ranges {
        m.entry(r.doc).or_default().push(*r);
    }
    m
}

/// Emit, on `rank` in `step`, every task between the queries `q` and the keys/values `kv` of the
/// same document that the mask allows.
pub fn cross_tasks(b: &mut PlanBuilder, rank: u32, step: u32, q: &[TokenRange], kv: &[TokenRange]) {
    let kv = by_doc(kv);
    for (doc, qs) in by_doc(q) {
        let Some(ks) = kv.get(&doc) else { continue };
        for qr in &qs {
            for kr in ks {
                b.task(rank, step, *qr, *kr);
            }
        }
    }
}

/// Ring attention over the given per-rank shards (already registered with
/// [`PlanBuilder::own`]): step 0 computes each rank's queries against its own K/V; in step
/// `s = 1..N` rank `r` receives from rank `r − 1` the K/V that rank `r − s` owns (sent while
/// step `s − 1` computes, the double-buffered pass of ring-flash-attention) and computes its
/// queries against it. All K/V travel the whole ring, as in ring-flash-attention, even where a
/// causal mask makes a piece useless downstream; the simulator charges what the scheme sends.
pub fn ring_pass(b: &mut PlanBuilder, shards: &[Vec<TokenRange>]) {
    let n = shards.len() as u32;
    for r in 0..n {
        cross_tasks(b, r, 0, &shards[r as usize], &shards[r as usize]);
    }
    for s in 1..n {
        for r in 0..n {
            let origin = (r + n - s) % n;
            let from = (r + n - 1) % n;
            let ranges = shards[origin as usize].clone();
            cross_tasks(b, r, s, &shards[r as usize], &ranges);
            b.transfer(Transfer::kv(from, r, ranges, s - 1, s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
