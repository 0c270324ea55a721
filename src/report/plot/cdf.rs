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
    // The shortest length of the bucket the last point closes: a bucket spans 1/40 of an
    // octave from it, and its last length stands for it. (Regression, bug hunt: measured from
    // the point just replaced instead, a run of lengths closer than 1/40 octave apart, which is
    // every length above about 58 in a dense trace, collapsed into one jump at its end, and the
    // bundled trace plotted 5 % of documents at or below 4K against a median of 3,224.)
    let mut bucket_start = 0u64;
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
            // Thin: one point per 1/40 of an octave, the CDF at its bucket's longest length.
            match out.last_mut() {
                Some(last) if (l as f64).log2() - (bucket_start as f64).log2() < 0.025 => {
                    *last = p;
                }
                _ => {
                    bucket_start = l;
                    out.push(p);
                }
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

    /// Regression (bug hunt): every length 1..20,000 plotted flat at 0 and jumped to 100 % at
    /// 20K, because thinning measured each bucket from the point it had just replaced.
    #[test]
    fn a_dense_trace_keeps_its_shape_when_thinned() {
        let lens: Vec<u64> = (1..=20_000).collect();
        let p = cdf_points(&lens);
        assert!(p.len() > 300 && p.len() < 700, "{} points", p.len());
        // Each kept point is the exact CDF at its length, and none jumps more than a bucket.
        for w in p.windows(2) {
            assert!((w[1].docs - w[1].len as f64 / 20_000.0).abs() < 1e-12);
            assert!(
                w[1].docs - w[0].docs < 0.02,
                "{:?} → {:?}",
                w[0].len,
                w[1].len
            );
        }
        let median = p.iter().find(|q| q.docs >= 0.5).unwrap();
        assert!((9_800..=10_300).contains(&median.len), "{}", median.len);
        assert_eq!(p.last().unwrap().len, 20_000);
    }
}
