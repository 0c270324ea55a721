//! The attention mask inside one document and the pair counting every cost rests on.

use serde::{Deserialize, Serialize};

/// Attention mask inside each document. Tokens of different documents never attend to each
/// other (packed varlen batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mask {
    /// Query at position `i` sees keys at positions `0..=i` of its document.
    #[default]
    Causal,
    /// Every query sees every key of its document.
    Full,
}

impl Mask {
    /// Whether query position `q` may attend to key position `k` (same document).
    pub fn allows(self, q: u64, k: u64) -> bool {
        match self {
            Mask::Causal => k <= q,
            Mask::Full => true,
        }
    }

    /// The largest key position + 1 that query `q` may see, in a document of length `len`.
    pub fn kv_limit(self, q: u64, len: u64) -> u64 {
        match self {
            Mask::Causal => q + 1,
            Mask::Full => len,
        }
    }
}

impl std::fmt::Display for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mask::Causal => "causal",
            Mask::Full => "full",
        })
    }
}

/// Number of (q, k) pairs that `mask` allows in the tile `q0..q1` × `k0..k1` of one document.
///
/// This is the quantity FLOPs are counted from (4 · pairs · d · h_q forward), so it is exact:
/// for causal masks it sums `clamp(q + 1 - k0, 0, k1 - k0)` over the query rows in closed form.
///
/// ```
/// use fcp::plan::{allowed_pairs, Mask};
/// // A whole causal document of 4 tokens: 1 + 2 + 3 + 4 pairs.
/// assert_eq!(allowed_pairs(Mask::Causal, 0, 4, 0, 4), 10);
/// // Late queries against early keys: every pair is allowed.
/// assert_eq!(allowed_pairs(Mask::Causal, 4, 6, 0, 4), 8);
/// // Early queries never see later keys.
/// assert_eq!(allowed_pairs(Mask::Causal, 0, 4, 4, 6), 0);
/// ```
pub fn allowed_pairs(mask: Mask, q0: u64, q1: u64, k0: u64, k1: u64) -> u128 {
    if q1 <= q0 || k1 <= k0 {
        return 0;
    }
    let (q0, q1, k0, k1) = (q0 as u128, q1 as u128, k0 as u128, k1 as u128);
    match mask {
        Mask::Full => (q1 - q0) * (k1 - k0),
        Mask::Causal => {
            // Row q sees min(q + 1, k1) - k0 keys when positive.
            // Rows q < k0 see nothing; rows q >= k1 - 1 see all k1 - k0 keys.
            let mut total = 0u128;
            // Partial rows: q in [max(q0, k0), min(q1, k1 - 1)) see q + 1 - k0 keys.
            let a = q0.max(k0);
            let b = q1.min(k1 - 1);
            if a < b {
                // sum_{q=a}^{b-1} (q + 1 - k0) = sum_{t=a+1-k0}^{b-k0} t
                let lo = a + 1 - k0;
                let hi = b - k0;
                total += (lo + hi) * (hi - lo + 1) / 2;
            }
            // Full rows: q in [max(q0, k1 - 1), q1).
            let c = q0.max(k1 - 1);
            if c < q1 {
                total += (q1 - c) * (k1 - k0);
            }
            total
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(mask: Mask, q0: u64, q1: u64, k0: u64, k1: u64) -> u128 {
        let mut n = 0;
        for q in q0..q1 {
            for k in k0..k1 {
                if mask.allows(q, k) {
                    n += 1;
                }
            }
        }
        n
    }

    #[test]
    fn closed_form_matches_brute_force() {
        for q0 in 0..7 {
            for q1 in q0..9 {
                for k0 in 0..7 {
                    for k1 in k0..9 {
                        for m in [Mask::Causal, Mask::Full] {
                            assert_eq!(
                                allowed_pairs(m, q0, q1, k0, k1),
                                brute(m, q0, q1, k0, k1),
                                "{m} q {q0}..{q1} k {k0}..{k1}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn whole_causal_document_is_triangle() {
        assert_eq!(
            allowed_pairs(Mask::Causal, 0, 1000, 0, 1000),
            1000 * 1001 / 2
        );
        assert_eq!(allowed_pairs(Mask::Full, 0, 1000, 0, 1000), 1_000_000);
    }
}
