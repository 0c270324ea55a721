//! Trace length CDF (FCP Fig. 2 style): for each length L, the share of documents, of tokens
//! and of Σlen² (causal attention work) held by documents of length ≤ L.
//!
//! Under naive CP every document is sharded over every rank, so each document's communication
//! is proportional to its tokens: the token curve is also the communication-volume curve.

use std::path::Path;

use super::{line_chart, LineChart, PlotError, Series, YFormat};

/// One step of the CDF.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CdfPoint {
    /// Document length.
    pub len: u64,
    /// Share of documents with length ≤ `len`.
    pub docs: f64,
    /// Share of tokens.
    pub tokens: f64,
    /// Share of Σlen².
    pub sq: f64,
}

/// The CDF at every distinct length (at most ~400 points, evenly spread in log length).
pub fn cdf_points(lens: &[u64]) -> Vec<CdfPoint> {
    let mut v: Vec<u64> = lens.iter().copied().filter(|&l| l > 0).collect();
    v.sort_unstable();
    let n = v.len() as f64;
    let tok: f64 = v.iter().map(|&l| l as f64).sum();
    let sq: f64 = v.iter().map(|&l| (l as f64) * (l as f64)).sum();
    let mut out: Vec<CdfPoint> = Vec::new();
    let (mut c_tok, mut c_sq) = (0.0, 0.0);
    for (i, &l) in v.iter().enumerate() {
        c_tok += l as f64;
        c_sq += (l as f64) * (l as f64);
        let last_of_len = v.get(i + 1) != Some(&l);
        if last_of_len {
            let p = CdfPoint {
                len: l,
                docs: (i + 1) as f64 / n,
                tokens: c_tok / tok,
                sq: c_sq / sq,
            };
            // Thin: keep a point when log length moved by ≥ 1/40 of an octave.
            match out.last() {
                Some(prev)
                    if (l as f64).log2() - (prev.len as f64).log2() < 0.025 && i + 1 < v.len() =>
                {
                    *out.last_mut().unwrap_or_else(|| unreachable!()) = p;
                }
                _ => out.push(p),
            }
        }
    }
    out
}

/// Draw the CDF of `lens` to `path`.
pub fn length_cdf(path: &Path, lens: &[u64], title: &str) -> Result<(), PlotError> {
    let pts = cdf_points(lens);
    if pts.is_empty() {
        return Err(PlotError::Empty("the trace has no document".into()));
    }
    // A staircase: the share stays flat between lengths that occur and jumps at each.
    let curve = |f: fn(&CdfPoint) -> f64| -> Vec<(f64, f64)> {
        let mut v = Vec::with_capacity(2 * pts.len());
        let mut prev = 0.0;
        for p in &pts {
            v.push((p.len as f64, prev));
            v.push((p.len as f64, f(p)));
            prev = f(p);
        }
        v
    };
    let chart = LineChart {
        title: title.to_string(),
        x_label: "document length (tokens, log scale)".into(),
        y_label: "cumulative share".into(),
        x_log2: true,
        x_tokens: true,
        y_format: YFormat::Percent,
        y_from_zero: true,
        markers: false,
        series: vec![
            Series {
                label: "documents".into(),
                points: curve(|p| p.docs),
            },
            Series {
                label: "tokens (≈ naive-CP communication)".into(),
                points: curve(|p| p.tokens),
            },
            Series {
                label: "Σ len² (attention FLOPs)".into(),
                points: curve(|p| p.sq),
            },
        ],
    };
    line_chart(path, &chart)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_end_at_one_and_are_ordered() {
        let p = cdf_points(&[1, 1, 2, 4, 100]);
        let last = p.last().unwrap();
        assert_eq!(last.len, 100);
        assert!((last.docs - 1.0).abs() < 1e-12 && (last.sq - 1.0).abs() < 1e-12);
        // Long documents hold more of the work than of the documents.
        assert!(p[0].docs > p[0].tokens && p[0].tokens > p[0].sq);
    }
}
