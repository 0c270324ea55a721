//! The regression gate: evaluate a fixed set of cells and compare them with committed numbers.
//!
//! A baseline file holds the grid it was made from (a [`SweepConfig`]), a default tolerance
//! and, per cell, the mean over its batches of the gated metrics: `compute_imbalance`,
//! `comm_imbalance` (FCP's (max − mean)/max ratios, in 0..1) and `attention_time_ms`; when the
//! grid simulates the whole layer (`layer = true`), `token_imbalance` and `layer_time_ms` too.
//!
//! A cell **regresses** when
//! * an imbalance ratio rose by more than `tolerance` (absolute: the ratios are already
//!   fractions, and near-zero ratios make relative changes meaningless), or
//! * its attention time rose by more than `tolerance` relative (`cur > base × (1 + tol)`), or
//! * it now fails (an error) where the baseline had numbers, or it is missing.
//!
//! A cell the gate cannot check also fails it: one the baseline recorded as failing, and one
//! the grid holds but the baseline has no numbers for (added to the grid without `--update`).
//! `--update` refuses to record failing cells (a misspelt scheme would otherwise be recorded
//! as an error and "pass" for ever), and a baseline with no cells checks nothing and fails.
//!
//! The simulator is deterministic, so any change is a code change: improvements pass and are
//! listed so the baseline can be refreshed with `fcp regress --update`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::output::write_all_atomic;

use super::config::{CellKey, SweepConfig};
use super::sweep::{run_cells, CellResult, Progress};
use super::StudyError;

/// Baseline format version.
pub const BASELINE_VERSION: u32 = 1;

/// Default tolerance written into new baselines.
pub const DEFAULT_TOLERANCE: f64 = 0.03;

/// The metrics the gate compares, and whether each is compared absolutely (ratios) or
/// relatively (times).
pub const GATED: &[(&str, Cmp)] = &[
    ("compute_imbalance", Cmp::Absolute),
    ("comm_imbalance", Cmp::Absolute),
    ("attention_time_ms", Cmp::Relative),
    ("token_imbalance", Cmp::Absolute),
    ("layer_time_ms", Cmp::Relative),
];

/// How a gated metric is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// Worse when `cur > base + tol`.
    Absolute,
    /// Worse when `cur > base × (1 + tol)`.
    Relative,
}

/// A committed baseline. Unknown keys are refused: `--update` rewrites the file from these
/// fields, and a key of the user's it did not know was silently dropped (bug hunt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// [`BASELINE_VERSION`].
    pub version: u32,
    /// Tolerance used when `--tolerance` is not given.
    pub tolerance: f64,
    /// The cells to evaluate.
    pub grid: SweepConfig,
    /// The grid's settings outside the cells when the numbers were recorded
    /// ([`SweepConfig::settings_tag`]: batches, pass, mask, packing, layer). Checked against
    /// the grid's now: numbers recorded for training must not gate an edited forward-only
    /// grid. Absent in baselines recorded before it was kept (nothing to check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// Recorded numbers, one entry per cell of the grid.
    pub cells: Vec<BaselineCell>,
}

/// The recorded numbers of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineCell {
    /// The cell.
    #[serde(flatten)]
    pub key: CellKey,
    /// Recorded error (a cell that failed when the baseline was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Mean over batches of each gated metric.
    #[serde(default)]
    pub compute_imbalance: Option<f64>,
    /// Mean over batches.
    #[serde(default)]
    pub comm_imbalance: Option<f64>,
    /// Mean over batches.
    #[serde(default)]
    pub attention_time_ms: Option<f64>,
    /// Mean over batches (grids with `layer = true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_imbalance: Option<f64>,
    /// Mean over batches (grids with `layer = true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_time_ms: Option<f64>,
}

impl BaselineCell {
    fn get(&self, metric: &str) -> Option<f64> {
        match metric {
            "compute_imbalance" => self.compute_imbalance,
            "comm_imbalance" => self.comm_imbalance,
            "attention_time_ms" => self.attention_time_ms,
            "token_imbalance" => self.token_imbalance,
            "layer_time_ms" => self.layer_time_ms,
            _ => None,
        }
    }

    fn from_result(r: &CellResult) -> BaselineCell {
        BaselineCell {
            key: r.key.clone(),
            error: r.error.clone(),
            compute_imbalance: r.mean("compute_imbalance"),
            comm_imbalance: r.mean("comm_imbalance"),
            attention_time_ms: r.mean("attention_time_ms"),
            token_imbalance: r.mean("token_imbalance"),
            layer_time_ms: r.mean("layer_time_ms"),
        }
    }
}

/// One difference the gate found.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The cell.
    pub cell: CellKey,
    /// The metric (or `error` / `missing`).
    pub metric: String,
    /// Recorded value.
    pub baseline: Option<f64>,
    /// Value now.
    pub current: Option<f64>,
    /// What happened, for people.
    pub message: String,
}

/// The gate's verdict.
#[derive(Debug, Clone, Default)]
pub struct RegressReport {
    /// Cells worse beyond tolerance (non-empty: the gate fails).
    pub regressions: Vec<Finding>,
    /// Cells better beyond tolerance (informational: refresh with `--update`).
    pub improvements: Vec<Finding>,
    /// Cells compared.
    pub cells: usize,
}

impl Baseline {
    /// Read a baseline file.
    pub fn load(path: &Path) -> Result<Baseline, StudyError> {
        // Not noted as an input (`crate::read_guard`): `--update` exists to replace it.
        let text = std::fs::File::open(path)
            .and_then(|f| crate::input::read_all(f, "a JSON baseline", false))
            .map_err(|e| StudyError::io(path, e))?;
        let b: Baseline = serde_json::from_str(&text).map_err(|e| StudyError::Parse {
            path: path.display().to_string(),
            message: format!(
                "not a regression baseline: {}",
                crate::jsonpos::json_error(&text, &e)
            ),
        })?;
        if b.version != BASELINE_VERSION {
            return Err(StudyError::Parse {
                path: path.display().to_string(),
                message: format!(
                    "baseline version {} (this fcp reads {BASELINE_VERSION})",
                    b.version
                ),
            });
        }
        if !(b.tolerance.is_finite() && b.tolerance >= 0.0) {
            return Err(StudyError::Parse {
                path: path.display().to_string(),
                message: format!(
                    "`tolerance` must be a number ≥ 0, got {}",
                    crate::report::shown(b.tolerance)
                ),
            });
        }
        // Named with the file, as a sweep's and dpcp's config errors are (bug hunt).
        b.grid.validate().map_err(|e| StudyError::Parse {
            path: path.display().to_string(),
            message: format!("its grid: {e}"),
        })?;
        // A cell recorded twice was checked twice, against two sets of numbers: one copy could
        // pass while the other failed, and the count of cells compared was off.
        for (i, cell) in b.cells.iter().enumerate() {
            if let Some(first) = b.cells[..i].iter().position(|c| c.key == cell.key) {
                return Err(StudyError::Parse {
                    path: path.display().to_string(),
                    message: format!(
                        "the cell {} is recorded twice (cells[{first}] and cells[{i}]); a baseline records each cell once: delete one, or record them again with --update",
                        cell.key.label()
                    ),
                });
            }
            // Recorded times and ratios are ≥ 0: a negative one gated as if it were a
            // measurement and reported a regression against it (bug hunt).
            if let Some((metric, v)) = GATED
                .iter()
                .filter_map(|&(m, _)| cell.get(m).map(|v| (m, v)))
                .find(|(_, v)| !(v.is_finite() && *v >= 0.0))
            {
                return Err(StudyError::Parse {
                    path: path.display().to_string(),
                    message: format!(
                        "the cell {} records {metric} {}; recorded numbers are ≥ 0: record them again with --update",
                        cell.key.label(),
                        crate::report::shown(v)
                    ),
                });
            }
        }
        Ok(b)
    }

    /// A baseline recording `results` for `grid`.
    pub fn from_results(grid: SweepConfig, tolerance: f64, results: &[CellResult]) -> Baseline {
        Baseline {
            version: BASELINE_VERSION,
            tolerance,
            settings: Some(grid.settings_tag()),
            grid,
            cells: results.iter().map(BaselineCell::from_result).collect(),
        }
    }

    /// Write atomically as pretty JSON, creating its folder if need be (`--update` of
    /// `ci/cp-gate.json` in a fresh checkout: docs audit, it failed on the missing `ci/`).
    pub fn save(&self, path: &Path) -> Result<(), StudyError> {
        let mut text = serde_json::to_string_pretty(self).map_err(|e| StudyError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        text.push('\n');
        let dir = path.parent().unwrap_or(Path::new(""));
        write_all_atomic(dir, [(path.to_path_buf(), text.into_bytes())])
            .map_err(|e| StudyError::io(path, e))
    }
}

/// The grid `fcp regress --update` records when no baseline exists yet: the bundled trace,
/// 4 and 8 ranks of 16K tokens, the main schemes, 2 batches — seconds even in a debug build.
pub fn default_grid() -> SweepConfig {
    SweepConfig::parse(
        r#"
        name = "regress"
        description = "CI regression gate: bundled trace, small CP groups, main schemes"
        batches = 2
        layer = true
        [grid]
        traces = ["default"]
        schemes = ["ring", "zigzag", "llama3", "per-doc", "ulysses", "bytescale", "wlb-llm", "magi", "fcp", "flashcp", "hybrid"]
        ranks = [4, 8]
        tokens_per_rank = [16384]
        "#,
    )
    .unwrap_or_else(|e| unreachable!("the built-in regress grid is valid: {e}"))
}

/// Evaluate the cells of `grid`.
pub fn evaluate(
    grid: &SweepConfig,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Vec<CellResult>, StudyError> {
    run_cells(grid, &grid.cells(), progress)
}

/// Compare `current` with the baseline's recorded cells.
pub fn check(baseline: &Baseline, current: &[CellResult], tolerance: f64) -> RegressReport {
    let mut rep = RegressReport::default();
    // Regression (bug hunt): `grid.pass` edited to "fwd" without --update compared forward
    // numbers with recorded training ones and passed with "44 improvements".
    let now = baseline.grid.settings_tag();
    let edited = baseline.settings.as_ref().filter(|s| **s != now);
    for base in &baseline.cells {
        rep.cells += 1;
        let finding = |metric: &str, b: Option<f64>, c: Option<f64>, message: String| Finding {
            cell: base.key.clone(),
            metric: metric.to_string(),
            baseline: b,
            current: c,
            message,
        };
        if let Some(recorded) = edited {
            rep.regressions.push(finding(
                "settings",
                None,
                None,
                format!(
                    "recorded under {recorded}, but the grid now says {now}: the numbers do not compare; record them again with --update"
                ),
            ));
            continue;
        }
        let Some(cur) = current.iter().find(|r| r.key == base.key) else {
            rep.regressions.push(finding(
                "missing",
                None,
                None,
                "the cell was not evaluated".into(),
            ));
            continue;
        };
        if let Some(e) = &base.error {
            rep.regressions.push(finding(
                "unchecked",
                None,
                None,
                format!(
                    "recorded as failing ({e}), so nothing is gated: fix the cell or drop it from the grid, then --update"
                ),
            ));
            continue;
        }
        if let Some(e) = &cur.error {
            rep.regressions
                .push(finding("error", None, None, format!("now fails: {e}")));
            continue;
        }
        for &(metric, cmp) in GATED {
            let (b, c) = match (base.get(metric), cur.mean(metric)) {
                (Some(b), Some(c)) => (b, c),
                (None, None) => continue,
                (None, Some(_)) => {
                    rep.regressions.push(finding(
                        metric,
                        None,
                        None,
                        format!("the baseline records no {metric}, so it is not gated: --update"),
                    ));
                    continue;
                }
                (Some(b), None) => {
                    rep.regressions.push(finding(
                        metric,
                        Some(b),
                        None,
                        format!("{metric} is no longer reported"),
                    ));
                    continue;
                }
            };
            let (worse, better) = match cmp {
                Cmp::Absolute => (c > b + tolerance, c < b - tolerance),
                Cmp::Relative => (c > b * (1.0 + tolerance), c < b * (1.0 - tolerance)),
            };
            let delta = match cmp {
                Cmp::Absolute => format!("{:+.4}", c - b),
                Cmp::Relative if b > 0.0 => format!("{:+.1}%", (c / b - 1.0) * 100.0),
                Cmp::Relative => "n/a".into(),
            };
            let msg = format!("{metric} {b:.4} → {c:.4} ({delta})");
            if worse {
                rep.regressions.push(finding(metric, Some(b), Some(c), msg));
            } else if better {
                rep.improvements
                    .push(finding(metric, Some(b), Some(c), msg));
            }
        }
    }
    for cur in current {
        if !baseline.cells.iter().any(|b| b.key == cur.key) {
            rep.cells += 1;
            rep.regressions.push(Finding {
                cell: cur.key.clone(),
                metric: "unrecorded".into(),
                baseline: None,
                current: None,
                message: "in the grid but not in the baseline: record it with --update".into(),
            });
        }
    }
    rep
}

/// The cells of `results` that failed, as `label: error` lines: `--update` records none of
/// them.
pub fn failures(results: &[CellResult]) -> Vec<String> {
    results
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.key.label())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> SweepConfig {
        SweepConfig::parse(
            "batches = 1\n[grid]\ntraces=[\"default\"]\nschemes=[\"zigzag\",\"fcp\"]\nranks=[4]\ntokens_per_rank=[8192]",
        )
        .unwrap()
    }

    #[test]
    fn settings_edited_without_update_fail_every_cell() {
        let g = grid();
        let results = run_cells(&g, &g.cells(), &|_| {}).unwrap();
        let mut base = Baseline::from_results(g, DEFAULT_TOLERANCE, &results);
        assert!(check(&base, &results, DEFAULT_TOLERANCE)
            .regressions
            .is_empty());
        base.grid.pass = "fwd".into();
        let rep = check(&base, &results, DEFAULT_TOLERANCE);
        assert_eq!(rep.regressions.len(), base.cells.len());
        assert!(rep.regressions.iter().all(|f| f.metric == "settings"));
        assert!(
            rep.regressions[0].message.contains("pass=fwd"),
            "{:?}",
            rep.regressions[0]
        );
        // A baseline recorded before settings were kept checks none.
        base.settings = None;
        assert!(check(&base, &results, DEFAULT_TOLERANCE)
            .regressions
            .iter()
            .all(|f| f.metric != "settings"));
    }

    #[test]
    fn a_worsened_cell_is_named_and_the_baseline_passes() {
        let g = grid();
        let cur = evaluate(&g, &|_| {}).unwrap();
        let base = Baseline::from_results(g, DEFAULT_TOLERANCE, &cur);
        let ok = check(&base, &cur, DEFAULT_TOLERANCE);
        assert!(ok.regressions.is_empty() && ok.improvements.is_empty());
        assert_eq!(ok.cells, 2);

        // Worsen fcp's plan: 10% slower and 0.1 more compute imbalance.
        let mut worse = cur.clone();
        let m = worse[1].metrics.get_mut("attention_time_ms").unwrap();
        m.mean *= 1.10;
        worse[1].metrics.get_mut("compute_imbalance").unwrap().mean += 0.1;
        let bad = check(&base, &worse, DEFAULT_TOLERANCE);
        assert_eq!(bad.regressions.len(), 2, "{:?}", bad.regressions);
        assert!(bad.regressions.iter().all(|f| f.cell.scheme == "fcp"));
        // Within a looser tolerance it passes.
        assert!(check(&base, &worse, 0.2).regressions.is_empty());

        // A cell that now fails is a regression.
        let mut failing = cur.clone();
        failing[0].error = Some("boom".into());
        let r = check(&base, &failing, DEFAULT_TOLERANCE);
        assert_eq!(r.regressions[0].metric, "error");
    }

    /// Regression (docs audit): `fcp regress --baseline ci/cp-gate.json --update`, which the
    /// docs say creates the file, failed in a fresh checkout on the missing `ci/`.
    #[test]
    fn saving_a_baseline_creates_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ci").join("gate.json");
        let base = Baseline::from_results(grid(), DEFAULT_TOLERANCE, &[]);
        base.save(&path).unwrap();
        assert_eq!(Baseline::load(&path).unwrap(), base);
    }

    /// With `layer = true` the whole layer is gated too: a plan that piles tokens on a rank
    /// (the layer slower, attention unchanged) fails the gate.
    #[test]
    fn with_the_layer_a_slower_layer_or_more_token_imbalance_fails() {
        let mut g = grid();
        g.layer = true;
        let cur = evaluate(&g, &|_| {}).unwrap();
        let base = Baseline::from_results(g, DEFAULT_TOLERANCE, &cur);
        assert!(base.cells.iter().all(|c| c.layer_time_ms.is_some()));
        assert!(check(&base, &cur, DEFAULT_TOLERANCE).regressions.is_empty());
        let mut worse = cur.clone();
        worse[1].metrics.get_mut("layer_time_ms").unwrap().mean *= 1.05;
        worse[0].metrics.get_mut("token_imbalance").unwrap().mean += 0.2;
        let bad = check(&base, &worse, DEFAULT_TOLERANCE);
        let mut named: Vec<_> = bad.regressions.iter().map(|f| f.metric.as_str()).collect();
        named.sort();
        assert_eq!(named, ["layer_time_ms", "token_imbalance"]);
        // A grid without the layer records none and gates none of it.
        let plain = Baseline::from_results(
            grid(),
            DEFAULT_TOLERANCE,
            &evaluate(&grid(), &|_| {}).unwrap(),
        );
        assert!(plain.cells.iter().all(|c| c.layer_time_ms.is_none()));
        assert!(!serde_json::to_string(&plain)
            .unwrap()
            .contains("layer_time_ms"));
    }

    #[test]
    fn default_grid_is_small_and_gates_every_main_scheme() {
        let cells = default_grid().cells();
        assert!(cells.len() <= 24);
        assert!(default_grid().layer, "the whole layer is gated too");
        for s in ["fcp", "flashcp", "hybrid"] {
            assert!(cells.iter().any(|c| c.scheme == s), "{s}");
        }
    }

    /// Regression: a misspelt scheme was recorded as a failing cell, and every later check
    /// passed it; a cell added to the grid without `--update` was never checked.
    #[test]
    fn cells_the_gate_cannot_check_fail_it() {
        let g = grid();
        let cur = evaluate(&g, &|_| {}).unwrap();
        let mut base = Baseline::from_results(g.clone(), DEFAULT_TOLERANCE, &cur);
        base.cells[0].error = Some("unknown scheme `zigzagg`".into());
        let r = check(&base, &cur, DEFAULT_TOLERANCE);
        assert_eq!(r.regressions.len(), 1);
        assert_eq!(r.regressions[0].metric, "unchecked");
        // The grid grew by a cell the baseline does not record.
        let mut fewer = Baseline::from_results(g, DEFAULT_TOLERANCE, &cur);
        fewer.cells.pop();
        let r = check(&fewer, &cur, DEFAULT_TOLERANCE);
        assert_eq!(r.cells, 2);
        assert_eq!(r.regressions.len(), 1);
        assert_eq!(r.regressions[0].metric, "unrecorded");
        assert_eq!(r.regressions[0].cell.scheme, "fcp");
        // A baseline whose numbers were blanked gates nothing either.
        let mut blank = Baseline::from_results(grid(), DEFAULT_TOLERANCE, &cur);
        blank.cells[1].attention_time_ms = None;
        let r = check(&blank, &cur, DEFAULT_TOLERANCE);
        assert_eq!(r.regressions.len(), 1);
        assert_eq!(r.regressions[0].metric, "attention_time_ms");
    }

    #[test]
    fn failures_name_the_failing_cells() {
        let g = SweepConfig::parse(
            "batches = 1\n[grid]\ntraces=[\"default\"]\nschemes=[\"zigzag\",\"fcpp\"]\nranks=[4]\ntokens_per_rank=[8192]",
        )
        .unwrap();
        let cur = evaluate(&g, &|_| {}).unwrap();
        let f = failures(&cur);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("fcpp"), "{f:?}");
    }
}
