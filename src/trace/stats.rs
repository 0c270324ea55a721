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
    sorted[nearest_rank(sorted.len() as u64, pct) as usize - 1]
}

/// The 1-based rank of the nearest-rank `pct` percentile among `n ≥ 1` values.
fn nearest_rank(n: u64, pct: f64) -> u64 {
    let rank = ((pct / 100.0) * n as f64).ceil() as u64;
    rank.clamp(1, n)
}

/// Statistics of a list of lengths. Errors on an empty list.
pub fn stats(lens: &[u64]) -> Result<TraceStats, TraceError> {
    let mut acc = StatsAccumulator::default();
    lens.iter().for_each(|&l| acc.push(l));
    acc.finish()
}

/// [`TraceStats`] computed one document at a time, in memory bounded by the number of
/// *distinct* lengths (a count per length), not the number of documents: a 10M-document trace
/// of lengths up to 512K holds at most 512K counters. Every figure is exact — percentiles walk
/// the counts, sums are kept in `u128` — so streamed and in-memory statistics are equal.
#[derive(Debug, Clone, Default)]
pub struct StatsAccumulator {
    counts: std::collections::BTreeMap<u64, u64>,
    docs: u64,
    tokens: u128,
    sq: u128,
}

impl StatsAccumulator {
    /// Count one document of `len` tokens.
    pub fn push(&mut self, len: u64) {
        *self.counts.entry(len).or_default() += 1;
        self.docs += 1;
        let l = u128::from(len);
        self.tokens += l;
        self.sq += l * l;
    }

    /// The statistics of everything pushed; errors if nothing was.
    pub fn finish(&self) -> Result<TraceStats, TraceError> {
        let n = self.docs;
        let (Some((_, _)), Some((&max, _))) =
            (self.counts.first_key_value(), self.counts.last_key_value())
        else {
            return Err(TraceError::Empty);
        };
        // One walk over the ascending counts answers all three percentiles.
        let ranks = [50.0, 90.0, 99.0].map(|p| nearest_rank(n, p));
        let mut pct = [0u64; 3];
        let mut seen = 0u64;
        let mut next = 0;
        for (&len, &c) in &self.counts {
            seen += c;
            while next < 3 && seen >= ranks[next] {
                pct[next] = len;
                next += 1;
            }
        }
        let above = THRESHOLDS
            .iter()
            .map(|&t| {
                let (k, tok, s) = self.counts.range(t + 1..).fold(
                    (0u64, 0u128, 0u128),
                    |(k, tok, s), (&l, &c)| {
                        let (l, c) = (u128::from(l), u128::from(c));
                        (k + c as u64, tok + c * l, s + c * l * l)
                    },
                );
                AboveShare {
                    threshold: t,
                    docs: k as f64 / n as f64,
                    tokens: tok as f64 / self.tokens as f64,
                    sq: s as f64 / self.sq as f64,
                }
            })
            .collect();
        Ok(TraceStats {
            docs: n,
            tokens: u64::try_from(self.tokens).unwrap_or(u64::MAX),
            mean: self.tokens as f64 / n as f64,
            p50: pct[0],
            p90: pct[1],
            p99: pct[2],
            max,
            above,
        })
    }
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

    /// The definitions applied directly to a sorted copy — what `stats` computed before it
    /// streamed — must agree with the accumulator exactly, floats included.
    #[test]
    fn streaming_equals_sorting() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for n in [1usize, 2, 3, 10, 99, 100, 101, 1000, 4321] {
            let lens: Vec<u64> = (0..n)
                .map(|_| match rng.gen_range(0..4) {
                    0 => rng.gen_range(1..10),
                    1 => rng.gen_range(1..5000),
                    2 => rng.gen_range(4000..200_000),
                    _ => 32768,
                })
                .collect();
            let mut sorted = lens.clone();
            sorted.sort_unstable();
            let tokens: u128 = lens.iter().map(|&l| u128::from(l)).sum();
            let sq: u128 = lens.iter().map(|&l| u128::from(l).pow(2)).sum();
            let s = stats(&lens).unwrap();
            assert_eq!(s.docs, n as u64);
            assert_eq!(u128::from(s.tokens), tokens);
            assert_eq!(s.mean, tokens as f64 / n as f64);
            assert_eq!(s.p50, percentile_sorted(&sorted, 50.0));
            assert_eq!(s.p90, percentile_sorted(&sorted, 90.0));
            assert_eq!(s.p99, percentile_sorted(&sorted, 99.0));
            assert_eq!(s.max, sorted[n - 1]);
            for a in &s.above {
                let long: Vec<u128> = lens
                    .iter()
                    .filter(|&&l| l > a.threshold)
                    .map(|&l| u128::from(l))
                    .collect();
                assert_eq!(a.docs, long.len() as f64 / n as f64);
                assert_eq!(a.tokens, long.iter().sum::<u128>() as f64 / tokens as f64);
                assert_eq!(
                    a.sq,
                    long.iter().map(|l| l * l).sum::<u128>() as f64 / sq as f64
                );
            }
        }
    }

    #[test]
    fn empty_is_an_error() {
        assert!(matches!(stats(&[]), Err(TraceError::Empty)));
    }
}
