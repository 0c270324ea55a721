//! Summary statistics of document lengths: what decides how hard a trace is for CP is the
//! tail, so besides percentiles we report the share of documents, tokens and Σlen² (the
//! causal-attention work) held by documents longer than 4K, 32K and 128K tokens.
//!
//! Percentiles are **nearest-rank**: pN is the smallest length L such that at least N % of
//! the documents are ≤ L, i.e. `sorted[ceil(N/100 · n) − 1]`.

use serde::Serialize;

use super::TraceError;

/// Thresholds (tokens) of the "above" shares: 4K, 32K, 128K.
pub const THRESHOLDS: [u64; 3] = [4096, 32768, 131072];

/// Share of a trace held by documents strictly longer than `threshold` tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AboveShare {
    /// Length threshold in tokens (documents with `len > threshold` count).
    pub threshold: u64,
    /// Fraction of documents (0..=1).
    pub docs: f64,
    /// Fraction of tokens (0..=1).
    pub tokens: f64,
    /// Fraction of Σlen² (0..=1), a proxy for causal attention FLOPs.
    pub sq: f64,
}

/// Summary of a trace's document lengths. Serialises to the JSON of `fcp trace stats --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStats {
    /// Number of documents.
    pub docs: u64,
    /// Total tokens.
    pub tokens: u64,
    /// Mean length.
    pub mean: f64,
    /// Median (nearest-rank).
    pub p50: u64,
    /// 90th percentile (nearest-rank).
    pub p90: u64,
    /// 99th percentile (nearest-rank).
    pub p99: u64,
    /// Longest document.
    pub max: u64,
    /// Shares above each of [`THRESHOLDS`], in that order.
    pub above: Vec<AboveShare>,
}

/// Nearest-rank percentile of sorted data: the smallest value with at least `pct` % of the
/// data at or below it. `sorted` must be non-empty and ascending; `pct` in `[0, 100]`.
pub fn percentile_sorted(sorted: &[u64], pct: f64) -> u64 {
    let n = sorted.len();
    let rank = ((pct / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Statistics of a list of lengths. Errors on an empty list.
pub fn stats(lens: &[u64]) -> Result<TraceStats, TraceError> {
    if lens.is_empty() {
        return Err(TraceError::Empty);
    }
    let mut sorted = lens.to_vec();
    sorted.sort_unstable();
    let tokens: u128 = lens.iter().map(|&l| u128::from(l)).sum();
    let sq: u128 = lens.iter().map(|&l| u128::from(l) * u128::from(l)).sum();
    let above = THRESHOLDS
        .iter()
        .map(|&t| {
            let long = lens.iter().filter(|&&l| l > t);
            let (n, tok, s) = long.fold((0u64, 0u128, 0u128), |(n, tok, s), &l| {
                let l = u128::from(l);
                (n + 1, tok + l, s + l * l)
            });
            AboveShare {
                threshold: t,
                docs: n as f64 / lens.len() as f64,
                tokens: tok as f64 / tokens as f64,
                sq: s as f64 / sq as f64,
            }
        })
        .collect();
    Ok(TraceStats {
        docs: lens.len() as u64,
        tokens: u64::try_from(tokens).unwrap_or(u64::MAX),
        mean: tokens as f64 / lens.len() as f64,
        p50: percentile_sorted(&sorted, 50.0),
        p90: percentile_sorted(&sorted, 90.0),
        p99: percentile_sorted(&sorted, 99.0),
        max: sorted[sorted.len() - 1],
        above,
    })
}

impl TraceStats {
    /// A human-readable table.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("docs    {:>14}\n", self.docs));
        s.push_str(&format!("tokens  {:>14}\n", self.tokens));
        s.push_str(&format!("mean    {:>14.1}\n", self.mean));
        s.push_str(&format!("p50     {:>14}\n", self.p50));
        s.push_str(&format!("p90     {:>14}\n", self.p90));
        s.push_str(&format!("p99     {:>14}\n", self.p99));
        s.push_str(&format!("max     {:>14}\n", self.max));
        s.push_str("\nshare above   docs    tokens  sum(len^2)\n");
        for a in &self.above {
            s.push_str(&format!(
                "> {:<9} {:>6.2}%  {:>6.2}%  {:>6.2}%\n",
                a.threshold,
                100.0 * a.docs,
                100.0 * a.tokens,
                100.0 * a.sq
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile_sorted(&v, 50.0), 5);
        assert_eq!(percentile_sorted(&v, 90.0), 9);
        assert_eq!(percentile_sorted(&v, 99.0), 10);
        assert_eq!(percentile_sorted(&v, 0.0), 1);
        assert_eq!(percentile_sorted(&v, 100.0), 10);
        assert_eq!(percentile_sorted(&[7], 50.0), 7);
        let w: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&w, 99.0), 99);
        assert_eq!(percentile_sorted(&w, 90.0), 90);
    }

    #[test]
    fn stats_on_hand_made_data() {
        // 3 short docs and one of 5000 tokens.
        let s = stats(&[1000, 10, 5000, 990]).unwrap();
        assert_eq!(s.docs, 4);
        assert_eq!(s.tokens, 7000);
        assert_eq!(s.mean, 1750.0);
        assert_eq!(s.p50, 990);
        assert_eq!(s.p90, 5000);
        assert_eq!(s.max, 5000);
        let a = &s.above[0];
        assert_eq!(a.threshold, 4096);
        assert_eq!(a.docs, 0.25);
        assert!((a.tokens - 5000.0 / 7000.0).abs() < 1e-12);
        let sq = 1000f64.powi(2) + 100.0 + 5000f64.powi(2) + 990f64.powi(2);
        assert!((a.sq - 25e6 / sq).abs() < 1e-12);
        assert_eq!(s.above[1].docs, 0.0);
        assert_eq!(s.above[2].threshold, 131072);
    }

    #[test]
    fn threshold_is_strict() {
        let s = stats(&[4096, 4097]).unwrap();
        assert_eq!(s.above[0].docs, 0.5);
    }

    #[test]
    fn json_keys() {
        let s = stats(&[1, 2, 3]).unwrap();
        let v = serde_json::to_value(&s).unwrap();
        for k in [
            "docs", "tokens", "mean", "p50", "p90", "p99", "max", "above",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert_eq!(v["above"][1]["threshold"], 32768);
    }

    #[test]
    fn empty_is_an_error() {
        assert!(matches!(stats(&[]), Err(TraceError::Empty)));
    }
}
