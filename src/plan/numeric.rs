//! Numeric check: run the plan's tasks on small random Q/K/V in f64, merge the partial outputs
//! with their log-sum-exp the way a CP runtime does, and compare with attention computed directly
//! per document under the mask.
//!
//! The structural verifier already proves exact coverage; this check proves the plan's tiles
//! compose into the right attention output (mask direction, tile boundaries, merge order), the
//! way the GPU executor will run them. To keep a 64K-token plan to seconds, long documents are
//! checked on a sample of query rows: every row at a task boundary (where off-by-one errors
//! live) plus evenly spaced rows, up to `max_rows_per_doc`; each checked row sees all its keys.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::verify::{head_segments, task_covers_heads};
use super::{Mask, Plan};

/// Settings of the numeric check.
#[derive(Debug, Clone, Copy)]
pub struct NumericOptions {
    /// Head dimension of the random tensors.
    pub head_dim: usize,
    /// At most this many query rows per document are checked (all rows of shorter documents).
    pub max_rows_per_doc: usize,
    /// Seed of the random tensors.
    pub seed: u64,
}

impl Default for NumericOptions {
    fn default() -> Self {
        NumericOptions {
            head_dim: 4,
            max_rows_per_doc: 2048,
            seed: 0x5eed,
        }
    }
}

/// Outcome of the numeric check.
#[derive(Debug, Clone, PartialEq)]
pub struct NumericReport {
    /// Largest absolute difference between plan output and reference, over every checked
    /// element (infinite when a checked row received no partial output at all).
    pub max_abs_error: f64,
    /// Query rows checked (per head segment).
    pub rows_checked: u64,
    /// Query rows in the batch.
    pub rows_total: u64,
    /// Rows that got no partial output from any task.
    pub rows_uncovered: u64,
}

/// Partial attention of one query row: output normalised by its own softmax and the log-sum-exp.
#[derive(Clone)]
struct Partial {
    lse: f64,
    out: Vec<f64>,
}

impl Partial {
    fn merge(&mut self, other: &Partial) {
        if other.lse == f64::NEG_INFINITY {
            return;
        }
        if self.lse == f64::NEG_INFINITY {
            *self = other.clone();
            return;
        }
        let m = self.lse.max(other.lse);
        let a = (self.lse - m).exp();
        let b = (other.lse - m).exp();
        let lse = m + (a + b).ln();
        for (x, y) in self.out.iter_mut().zip(&other.out) {
            *x = (*x * a + *y * b) / (a + b);
        }
        self.lse = lse;
    }
}

/// Attention of query `q` against keys/values rows `k0..k1` (already clipped to the mask).
fn attend(q: &[f64], k: &[f64], v: &[f64], k0: usize, k1: usize, d: usize) -> Partial {
    let scale = 1.0 / (d as f64).sqrt();
    let mut m = f64::NEG_INFINITY;
    let mut scores = Vec::with_capacity(k1 - k0);
    for j in k0..k1 {
        let s: f64 = q
            .iter()
            .zip(&k[j * d..(j + 1) * d])
            .map(|(a, b)| a * b)
            .sum::<f64>()
            * scale;
        m = m.max(s);
        scores.push(s);
    }
    let mut sum = 0.0;
    let mut out = vec![0.0; d];
    for (idx, j) in (k0..k1).enumerate() {
        let p = (scores[idx] - m).exp();
        sum += p;
        for (o, x) in out.iter_mut().zip(&v[j * d..(j + 1) * d]) {
            *o += p * x;
        }
    }
    if sum == 0.0 {
        return Partial {
            lse: f64::NEG_INFINITY,
            out,
        };
    }
    for o in &mut out {
        *o /= sum;
    }
    Partial {
        lse: m + sum.ln(),
        out,
    }
}

/// Rows of a document to check: every task boundary row plus evenly spaced rows.
fn sample_rows(len: u64, boundaries: &[u64], max_rows: usize) -> Vec<u64> {
    if len as usize <= max_rows {
        return (0..len).collect();
    }
    let mut rows: Vec<u64> = boundaries.iter().copied().filter(|&r| r < len).collect();
    rows.push(0);
    rows.push(len - 1);
    rows.sort_unstable();
    rows.dedup();
    let even = max_rows.saturating_sub(rows.len()).max(2) as u64;
    for i in 0..even {
        rows.push(i * (len - 1) / (even - 1));
    }
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// Run the numeric check.
pub fn check_numeric(plan: &Plan, opts: &NumericOptions) -> NumericReport {
    let d = opts.head_dim.max(1);
    let segments = head_segments(plan);
    let mut report = NumericReport {
        max_abs_error: 0.0,
        rows_checked: 0,
        rows_total: plan.total_tokens() + plan.pad_tokens(),
        rows_uncovered: 0,
    };
    // Tasks of each document, for its rows.
    let mut by_doc: Vec<Vec<&super::Task>> = vec![Vec::new(); plan.documents.len()];
    for t in plan
        .ranks
        .iter()
        .flat_map(|r| &r.steps)
        .flat_map(|s| &s.tasks)
    {
        if t.q.doc == t.kv.doc && (t.q.doc as usize) < by_doc.len() {
            by_doc[t.q.doc as usize].push(t);
        }
    }
    for (doc, tasks) in by_doc.iter().enumerate() {
        let len = plan.documents[doc].extent();
        let mut bounds: Vec<u64> = Vec::new();
        for t in tasks {
            bounds.extend([t.q.start, t.q.end.saturating_sub(1), t.q.end]);
        }
        let rows = sample_rows(len, &bounds, opts.max_rows_per_doc);
        for (si, seg) in segments.iter().enumerate() {
            let mut rng =
                ChaCha8Rng::seed_from_u64(opts.seed ^ ((doc as u64) << 20) ^ ((si as u64) << 52));
            let n = len as usize;
            let mut gen = |count: usize| -> Vec<f64> {
                (0..count).map(|_| rng.gen_range(-1.0..1.0)).collect()
            };
            let k = gen(n * d);
            let v = gen(n * d);
            // Q only for the checked rows.
            let q: Vec<Vec<f64>> = rows.iter().map(|_| gen(d)).collect();
            let mut acc: Vec<Partial> = vec![
                Partial {
                    lse: f64::NEG_INFINITY,
                    out: vec![0.0; d],
                };
                rows.len()
            ];
            for t in tasks.iter().filter(|t| task_covers_heads(t, *seg)) {
                let lo = rows.partition_point(|&r| r < t.q.start);
                let hi = rows.partition_point(|&r| r < t.q.end);
                for i in lo..hi {
                    let row = rows[i];
                    let limit = plan.mask.kv_limit(row, len).min(t.kv.end);
                    if t.kv.start >= limit {
                        continue;
                    }
                    let p = attend(&q[i], &k, &v, t.kv.start as usize, limit as usize, d);
                    acc[i].merge(&p);
                }
            }
            for (i, &row) in rows.iter().enumerate() {
                let limit = match plan.mask {
                    Mask::Causal => row + 1,
                    Mask::Full => len,
                };
                let reference = attend(&q[i], &k, &v, 0, limit as usize, d);
                report.rows_checked += 1;
                if acc[i].lse == f64::NEG_INFINITY {
                    report.rows_uncovered += 1;
                    report.max_abs_error = f64::INFINITY;
                    continue;
                }
                for (a, b) in acc[i].out.iter().zip(&reference.out) {
                    report.max_abs_error = report.max_abs_error.max((a - b).abs());
                }
                report.max_abs_error = report.max_abs_error.max((acc[i].lse - reference.lse).abs());
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_two_halves_equals_whole() {
        let d = 3;
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let q: Vec<f64> = (0..d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let k: Vec<f64> = (0..10 * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let v: Vec<f64> = (0..10 * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let whole = attend(&q, &k, &v, 0, 10, d);
        let mut a = attend(&q, &k, &v, 0, 4, d);
        a.merge(&attend(&q, &k, &v, 4, 10, d));
        for (x, y) in a.out.iter().zip(&whole.out) {
            assert!((x - y).abs() < 1e-12);
        }
        assert!((a.lse - whole.lse).abs() < 1e-12);
    }

    #[test]
    fn sampled_rows_include_boundaries_and_ends() {
        let rows = sample_rows(1_000_000, &[12345, 777_777], 100);
        assert!(rows.contains(&0) && rows.contains(&999_999));
        assert!(rows.contains(&12345) && rows.contains(&777_777));
        assert!(rows.len() <= 102);
        assert_eq!(sample_rows(5, &[], 100), vec![0, 1, 2, 3, 4]);
    }

    fn zigzag_plan() -> Plan {
        use crate::planners::testing::with_ctx;
        use crate::planners::{Planner, Zigzag};
        let batch = crate::trace::Batch::new(0, vec![40, 3, 77]);
        with_ctx(3, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap()
    }

    #[test]
    fn valid_plan_matches_reference() {
        let r = check_numeric(&zigzag_plan(), &NumericOptions::default());
        assert!(r.max_abs_error < 1e-12, "{r:?}");
        assert_eq!(r.rows_checked, 120);
        assert_eq!(r.rows_uncovered, 0);
    }

    #[test]
    fn missing_or_duplicated_tiles_show_up_as_error() {
        let mut p = zigzag_plan();
        let t = p.ranks[2].steps[1].tasks.pop().unwrap();
        let r = check_numeric(&p, &NumericOptions::default());
        assert!(r.max_abs_error > 1e-6, "removed tile: {r:?}");
        p.ranks[2].steps[1].tasks.push(t);
        p.ranks[0].steps[0].tasks.push(t);
        let r = check_numeric(&p, &NumericOptions::default());
        assert!(r.max_abs_error > 1e-6, "duplicated tile: {r:?}");
    }

    #[test]
    fn sampled_check_of_long_document_is_exact_on_sampled_rows() {
        use crate::planners::testing::with_ctx;
        use crate::planners::{Planner, Ring};
        let batch = crate::trace::Batch::new(0, vec![20_000]);
        let p = with_ctx(4, Mask::Causal, |ctx| Ring.plan(&batch, ctx)).unwrap();
        let opts = NumericOptions {
            max_rows_per_doc: 64,
            ..NumericOptions::default()
        };
        let r = check_numeric(&p, &opts);
        assert!((48..=80).contains(&r.rows_checked), "{r:?}");
        assert!(r.max_abs_error < 1e-9, "{r:?}");
    }
}
