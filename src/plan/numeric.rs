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
use rayon::prelude::*;

use super::verify::{head_segments, task_covers_heads};
use super::Plan;

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
    /// Query rows checked, once per head segment whose covering tasks differ from the
    /// document's other segments.
    pub rows_checked: u64,
    /// Distinct query rows checked (each counted once, however many head segments): what
    /// compares with `rows_total`.
    pub rows_distinct: u64,
    /// Query rows in the batch.
    pub rows_total: u64,
    /// Rows that got no partial output from any task.
    pub rows_uncovered: u64,
}

/// The most query–key scores the numeric check computes (about two minutes on two cores): a
/// plan past it is refused before anything is allocated.
pub const NUMERIC_MAX_PAIRS: u64 = 1 << 34;

/// The most bytes of random K and V the numeric check holds for one document (f64, every
/// token of the document: a checked row sees all its keys).
pub const NUMERIC_MAX_DOC_BYTES: u64 = 1 << 32;

const GIB: f64 = (1u64 << 30) as f64;

/// Why the numeric check refused a plan: it is for plans small enough to run on random
/// tensors in f64 on the CPU. (Regression: a 2³²-token document asked for 128 GiB of K/V and
/// the process aborted.)
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the plan is too large for the numeric check: {reason}; {}", self.advice())]
pub struct NumericTooLarge {
    /// What is over its limit.
    pub reason: String,
    /// The row cap the check ran with.
    pub max_rows: usize,
    /// Whether fewer checked rows would bring it under (the scores are; a document's K/V,
    /// drawn whole, is not).
    pub rows_help: bool,
}

impl NumericTooLarge {
    /// What to do instead. Regression (bug hunt): a document too long for its K/V was told to
    /// lower `--max-rows`, which cannot help, even at 1.
    fn advice(&self) -> String {
        let structural = "the structural check (without --numeric), which is exact at any size";
        if self.rows_help {
            format!(
                "lower --max-rows (now {}) for fewer scores, or rely on {structural}",
                self.max_rows
            )
        } else {
            format!("rely on {structural}")
        }
    }
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

/// One query row's attention weights against keys `0..limit`: `p[j] = exp(s_j − m)`, with `s_j`
/// the scaled score and `m` the row's largest. The reference and every task's partial are sums
/// of these over key ranges, so each key costs one dot product and one `exp` per row however
/// many tiles cover it (half the work of scoring each tile on its own).
struct RowWeights {
    m: f64,
    p: Vec<f64>,
}

impl RowWeights {
    fn new(q: &[f64], k: &[f64], limit: usize, d: usize) -> RowWeights {
        let scale = 1.0 / (d as f64).sqrt();
        let mut p: Vec<f64> = (0..limit)
            .map(|j| {
                q.iter()
                    .zip(&k[j * d..(j + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for x in &mut p {
            *x = (*x - m).exp();
        }
        RowWeights { m, p }
    }

    /// Attention of the row over keys `k0..k1` alone, normalised by its own softmax: the
    /// partial output a kernel running that tile returns, with its log-sum-exp.
    fn partial(&self, v: &[f64], k0: usize, k1: usize, d: usize) -> Partial {
        let mut sum = 0.0;
        let mut out = vec![0.0; d];
        for j in k0..k1 {
            let w = self.p[j];
            sum += w;
            for (o, x) in out.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                *o += w * x;
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
            lse: self.m + sum.ln(),
            out,
        }
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
///
/// Head segments of a document covered by the same tasks compute the same composition, so only
/// one of them is checked (a plan without head-parallel tasks checks each document once, not
/// once per segment). The distinct ones share the document's random tensors and each row's
/// weights: a segment adds one pass of sums over its tiles, not a pass of dot products and
/// exponentials. Documents and the rows inside them run in parallel; each document draws its
/// tensors from its own seed and the report is a sum of counts and a maximum, so it does not
/// depend on the thread count.
pub fn check_numeric(plan: &Plan, opts: &NumericOptions) -> Result<NumericReport, NumericTooLarge> {
    let d = opts.head_dim.max(1);
    let segments = head_segments(plan);
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
    // The rows each document checks, then what checking them costs, before any tensor.
    let rows: Vec<Vec<u64>> = by_doc
        .iter()
        .enumerate()
        .map(|(doc, tasks)| {
            let len = plan.documents[doc].extent();
            let mut bounds: Vec<u64> = Vec::new();
            for t in tasks {
                bounds.extend([t.q.start, t.q.end.saturating_sub(1), t.q.end]);
            }
            sample_rows(len, &bounds, opts.max_rows_per_doc)
        })
        .collect();
    let too_large = |reason: String, rows_help: bool| NumericTooLarge {
        reason,
        max_rows: opts.max_rows_per_doc,
        rows_help,
    };
    let mut pairs = 0u64;
    for (doc, rows) in rows.iter().enumerate() {
        let len = plan.documents[doc].extent();
        let bytes = len.saturating_mul(2 * 8 * d as u64);
        if bytes > NUMERIC_MAX_DOC_BYTES {
            return Err(too_large(format!(
                "document {doc} ({len} tokens) needs {:.1} GiB of random K/V, more than the {} GiB allowed",
                bytes as f64 / GIB,
                NUMERIC_MAX_DOC_BYTES as f64 / GIB
            ), false));
        }
        for &row in rows {
            pairs = pairs.saturating_add(plan.mask.kv_limit(row, len));
        }
    }
    if pairs > NUMERIC_MAX_PAIRS {
        return Err(too_large(
            format!(
            "its checked rows see {pairs} keys in all, more than the {NUMERIC_MAX_PAIRS} allowed"
        ),
            true,
        ));
    }
    let parts: Vec<NumericReport> = by_doc
        .par_iter()
        .zip(rows.par_iter())
        .enumerate()
        .map(|(doc, (tasks, rows))| {
            // The distinct task sets of the document's head segments, in segment order.
            let mut sets: Vec<Vec<&super::Task>> = Vec::new();
            for seg in &segments {
                let covering: Vec<&super::Task> = tasks
                    .iter()
                    .copied()
                    .filter(|t| task_covers_heads(t, *seg))
                    .collect();
                let same = |o: &Vec<&super::Task>| {
                    o.len() == covering.len()
                        && o.iter().zip(&covering).all(|(a, b)| std::ptr::eq(*a, *b))
                };
                if !sets.iter().any(same) {
                    sets.push(covering);
                }
            }
            check_document(plan, doc, rows, &sets, d, opts)
        })
        .collect();
    let mut report = NumericReport {
        max_abs_error: 0.0,
        rows_checked: 0,
        rows_distinct: 0,
        rows_total: plan.total_tokens().saturating_add(plan.pad_tokens()),
        rows_uncovered: 0,
    };
    for r in parts {
        report.max_abs_error = report.max_abs_error.max(r.max_abs_error);
        report.rows_checked += r.rows_checked;
        report.rows_distinct += r.rows_distinct;
        report.rows_uncovered += r.rows_uncovered;
    }
    Ok(report)
}

/// Check one document: its sampled `rows` (boundaries of all its tasks among them), and for
/// each of the head segments' task `sets` the plan's partials merged by log-sum-exp against
/// attention computed directly.
fn check_document(
    plan: &Plan,
    doc: usize,
    rows: &[u64],
    sets: &[Vec<&super::Task>],
    d: usize,
    opts: &NumericOptions,
) -> NumericReport {
    let len = plan.documents[doc].extent();
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ ((doc as u64) << 20));
    let n = len as usize;
    let mut gen =
        |count: usize| -> Vec<f64> { (0..count).map(|_| rng.gen_range(-1.0..1.0)).collect() };
    let k = gen(n * d);
    let v = gen(n * d);
    // Q only for the checked rows.
    let q: Vec<Vec<f64>> = rows.iter().map(|_| gen(d)).collect();
    // Per row, per set, the tasks covering it in plan order (the order partials are merged in).
    let mut cover: Vec<Vec<Vec<&super::Task>>> = vec![vec![Vec::new(); sets.len()]; rows.len()];
    for (si, set) in sets.iter().enumerate() {
        for t in set {
            let lo = rows.partition_point(|&r| r < t.q.start);
            let hi = rows.partition_point(|&r| r < t.q.end);
            for c in &mut cover[lo..hi] {
                c[si].push(t);
            }
        }
    }
    // Per row: the largest error over the sets (infinite where a set left it uncovered) and
    // how many sets did.
    let per_row: Vec<(f64, u64)> = rows
        .par_iter()
        .zip(q.par_iter().zip(cover.par_iter()))
        .map(|(&row, (q, cover))| {
            // Every key the mask lets the row see; a tile is clipped to them, as a kernel is.
            let reference_limit = plan.mask.kv_limit(row, len);
            let w = RowWeights::new(q, &k, reference_limit as usize, d);
            let reference = w.partial(&v, 0, reference_limit as usize, d);
            let (mut worst, mut uncovered) = (0.0f64, 0u64);
            for tiles in cover {
                let mut acc = Partial {
                    lse: f64::NEG_INFINITY,
                    out: vec![0.0; d],
                };
                for t in tiles {
                    let limit = reference_limit.min(t.kv.end);
                    if t.kv.start < limit {
                        acc.merge(&w.partial(&v, t.kv.start as usize, limit as usize, d));
                    }
                }
                if acc.lse == f64::NEG_INFINITY {
                    uncovered += 1;
                    worst = f64::INFINITY;
                    continue;
                }
                for (a, b) in acc.out.iter().zip(&reference.out) {
                    worst = worst.max((a - b).abs());
                }
                worst = worst.max((acc.lse - reference.lse).abs());
            }
            (worst, uncovered)
        })
        .collect();
    NumericReport {
        max_abs_error: per_row.iter().map(|r| r.0).fold(0.0, f64::max),
        rows_checked: (rows.len() * sets.len()) as u64,
        rows_distinct: rows.len() as u64,
        rows_total: 0,
        rows_uncovered: per_row.iter().map(|r| r.1).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mask;

    #[test]
    fn merging_two_halves_equals_whole() {
        let d = 3;
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let q: Vec<f64> = (0..d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let k: Vec<f64> = (0..10 * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let v: Vec<f64> = (0..10 * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w = RowWeights::new(&q, &k, 10, d);
        let whole = w.partial(&v, 0, 10, d);
        let mut a = w.partial(&v, 0, 4, d);
        a.merge(&w.partial(&v, 4, 10, d));
        for (x, y) in a.out.iter().zip(&whole.out) {
            assert!((x - y).abs() < 1e-12);
        }
        assert!((a.lse - whole.lse).abs() < 1e-12);
    }

    /// Softmax attention written out directly, the oracle for [`RowWeights`].
    fn direct(q: &[f64], k: &[f64], v: &[f64], k0: usize, k1: usize) -> (f64, Vec<f64>) {
        let d = q.len();
        let scores: Vec<f64> = (k0..k1)
            .map(|j| (0..d).map(|i| q[i] * k[j * d + i]).sum::<f64>() / (d as f64).sqrt())
            .collect();
        let z: f64 = scores.iter().map(|s| s.exp()).sum();
        let out = (0..d)
            .map(|i| {
                (k0..k1)
                    .map(|j| scores[j - k0].exp() / z * v[j * d + i])
                    .sum()
            })
            .collect();
        (z.ln(), out)
    }

    #[test]
    fn a_tile_s_partial_is_attention_over_its_keys_alone() {
        let d = 4;
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut gen = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect() };
        let (q, k, v) = (gen(d), gen(50 * d), gen(50 * d));
        let w = RowWeights::new(&q, &k, 50, d);
        for (k0, k1) in [(0, 50), (0, 1), (17, 33), (49, 50)] {
            let p = w.partial(&v, k0, k1, d);
            let (lse, out) = direct(&q, &k, &v, k0, k1);
            assert!((p.lse - lse).abs() < 1e-12, "{k0}..{k1}");
            for (x, y) in p.out.iter().zip(&out) {
                assert!((x - y).abs() < 1e-12, "{k0}..{k1}");
            }
        }
        assert_eq!(w.partial(&v, 5, 5, d).lse, f64::NEG_INFINITY);
    }

    #[test]
    fn sampled_rows_include_boundaries_and_ends() {
        let rows = sample_rows(1_000_000, &[12345, 777_777], 100);
        assert!(rows.contains(&0) && rows.contains(&999_999));
        assert!(rows.contains(&12345) && rows.contains(&777_777));
        assert!(rows.len() <= 102);
        assert_eq!(sample_rows(5, &[], 100), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_check_past_its_score_budget_is_refused_before_it_starts() {
        use crate::planners::testing::with_ctx;
        use crate::planners::{Planner, Ring};
        // 140K rows of a full-mask document each see 140K keys: 1.96·10¹⁰ scores.
        let batch = crate::trace::Batch::new(0, vec![140_000]);
        let plan = with_ctx(2, Mask::Full, |ctx| Ring.plan(&batch, ctx)).unwrap();
        let opts = NumericOptions {
            max_rows_per_doc: 140_000,
            ..NumericOptions::default()
        };
        let e = check_numeric(&plan, &opts).unwrap_err();
        assert!(e.reason.contains("19600000000 keys"), "{e}");
        assert!(e.to_string().contains("--max-rows (now 140000)"), "{e}");
        // A sample of the same plan is well inside it.
        let few = NumericOptions {
            max_rows_per_doc: 16,
            ..NumericOptions::default()
        };
        assert!(check_numeric(&plan, &few).unwrap().max_abs_error < 1e-9);
    }

    fn zigzag_plan() -> Plan {
        use crate::planners::testing::with_ctx;
        use crate::planners::{Planner, Zigzag};
        let batch = crate::trace::Batch::new(0, vec![40, 3, 77]);
        with_ctx(3, Mask::Causal, |ctx| Zigzag.plan(&batch, ctx)).unwrap()
    }

    #[test]
    fn valid_plan_matches_reference() {
        let r = check_numeric(&zigzag_plan(), &NumericOptions::default()).unwrap();
        assert!(r.max_abs_error < 1e-12, "{r:?}");
        assert_eq!(r.rows_checked, 120);
        assert_eq!(r.rows_uncovered, 0);
    }

    #[test]
    fn missing_or_duplicated_tiles_show_up_as_error() {
        let mut p = zigzag_plan();
        let t = p.ranks[2].steps[1].tasks.pop().unwrap();
        let r = check_numeric(&p, &NumericOptions::default()).unwrap();
        assert!(r.max_abs_error > 1e-6, "removed tile: {r:?}");
        p.ranks[2].steps[1].tasks.push(t);
        p.ranks[0].steps[0].tasks.push(t);
        let r = check_numeric(&p, &NumericOptions::default()).unwrap();
        assert!(r.max_abs_error > 1e-6, "duplicated tile: {r:?}");
    }

    /// Splits one task of the zigzag plan into two head halves: its document is then checked
    /// once per half, every other document once, and losing either half is caught.
    #[test]
    fn head_segments_with_the_same_tasks_are_checked_once_and_a_lost_half_is_caught() {
        use crate::plan::HeadRange;
        let mut p = zigzag_plan();
        let h = p.q_heads;
        let t = p.ranks[1].steps[0].tasks[0];
        assert!(t.heads.is_none() && t.q.doc == 0);
        let half = |start, end| crate::plan::Task {
            heads: Some(HeadRange { start, end }),
            ..t
        };
        p.ranks[1].steps[0].tasks[0] = half(0, h / 2);
        p.ranks[2].steps[0].tasks.push(half(h / 2, h));
        let r = check_numeric(&p, &NumericOptions::default()).unwrap();
        assert!(r.max_abs_error < 1e-12, "{r:?}");
        // Document 0 (40 rows) twice, documents 1 and 2 (3 + 77 rows) once.
        assert_eq!(r.rows_checked, 2 * 40 + 3 + 77);
        // Regression (bug hunt): "checked 160 of 120 query rows"; the rows themselves once.
        assert_eq!((r.rows_distinct, r.rows_total), (120, 120));
        p.ranks[2].steps[0].tasks.pop();
        let r = check_numeric(&p, &NumericOptions::default()).unwrap();
        assert!(r.max_abs_error > 1e-6, "lost head half: {r:?}");
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
        let r = check_numeric(&p, &opts).unwrap();
        assert!((48..=80).contains(&r.rows_checked), "{r:?}");
        assert!(r.max_abs_error < 1e-9, "{r:?}");
    }
}
