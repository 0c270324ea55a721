//! Running a sweep: plan and simulate every cell of a grid over K batches, in parallel.
//!
//! Cells and their batches run on rayon's pool; each cell is computed independently and the
//! results are gathered back in grid order, so the output bytes never depend on the thread
//! count. With an output directory the sweep is resumable: every finished cell is written
//! atomically to `DIR/cells/<hash>.json` as soon as it is done, and a rerun skips the cells
//! whose file is there (and was computed under the same settings). The merged
//! `DIR/results.csv` and `DIR/results.json` are written atomically at the end, so an
//! interrupted sweep leaves finished cells intact and never a partial file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::hardware::Hardware;
use crate::hashing::stable_hash;
use crate::model::Model;
use crate::output::write_atomic;
use crate::planners::{planner_for, PlanContext};
use crate::report::{mean, percentile};
use crate::sim::step::MicroBatch;
use crate::sim::{LayerMetrics, PlanMetrics, Simulator};
use crate::trace::{pack_first, PackOptions, Trace};

use super::config::{CellKey, SweepConfig};
use super::traces::TraceSpec;
use super::StudyError;

/// Reads one metric of a plan as f64.
pub type MetricFn = fn(&PlanMetrics) -> f64;

/// The plan metrics a sweep aggregates, in column order, with how to read each.
pub const METRICS: &[(&str, MetricFn)] = &[
    ("attention_time_ms", |m| m.attention_time_ms),
    ("compute_imbalance", |m| m.compute_imbalance),
    ("comm_imbalance", |m| m.comm_imbalance),
    ("max_over_mean", |m| m.max_over_mean),
    ("mfu", |m| m.mfu),
    ("comm_bytes_total", |m| m.comm_bytes_total as f64),
    ("mem_max_bytes", |m| m.mem_max_bytes as f64),
    ("lower_bound_ms", |m| m.lower_bound_ms),
    ("vs_lower_bound", |m| m.vs_lower_bound),
    ("mean_compute_ms", |m| m.mean_compute_ms),
    ("max_compute_ms", |m| m.max_compute_ms),
];

/// Reads one whole-layer metric of a plan.
pub type LayerMetricFn = fn(&LayerMetrics) -> f64;

/// The whole-layer metrics a sweep with `layer = true` aggregates too, in column order after
/// [`METRICS`].
pub const LAYER_METRICS: &[(&str, LayerMetricFn)] = &[
    ("layer_time_ms", |l| l.layer_time_ms),
    ("linear_mean_ms", |l| l.linear_mean_ms),
    ("linear_max_ms", |l| l.linear_max_ms),
    ("token_imbalance", |l| l.token_imbalance),
    ("layer_lower_bound_ms", |l| l.layer_lower_bound_ms),
    ("layer_vs_lower_bound", |l| l.layer_vs_lower_bound),
    ("layer_mfu", |l| l.layer_mfu),
    ("act_max_bytes", |l| l.act_max_bytes as f64),
];

/// The whole-layer metrics of a sweep under tensor parallelism (`tp` > 1), after
/// [`LAYER_METRICS`]: cells without TP leave them out.
pub const TP_METRICS: &[(&str, LayerMetricFn)] =
    &[("tp_comm_max_ms", |l| l.tp_comm_max_ms.unwrap_or(0.0))];

/// The GPU-memory metrics of a sweep with a `[memory]` table, after the others: the fullest
/// GPU's footprint over a training step ([`crate::footprint`]) and its share of the GPU's
/// memory (present only when every hardware profile gives `hbm_gb`). A cell's `max` is its
/// fullest batch: the one that decides whether the cell fits. Under `zero = 3` also the
/// layer's weight gathers and gradient reduce-scatter ([`crate::sim::zero3`]), all of them and
/// the part its work does not hide. With `micro_batches`, the cell's training step of that
/// many micro-batches, its batches in order (cycling through them when it needs more;
/// [`crate::sim::step`]): its time, the data-parallel collectives it leaves exposed and the
/// real tokens it trains per GPU-second; one figure per cell, so its mean, p50, p95 and max
/// agree.
pub const MEMORY_METRICS: &[(&str, LayerMetricFn)] = &[
    ("gpu_mem_bytes", |l| {
        l.footprint.map_or(f64::NAN, |f| f.total_bytes as f64)
    }),
    ("gpu_mem_fraction", |l| {
        l.footprint
            .and_then(|f| f.hbm_fraction())
            .unwrap_or(f64::NAN)
    }),
    ("zero3_comm_ms", |l| l.zero3_comm_ms.unwrap_or(f64::NAN)),
    ("zero3_exposed_ms", |l| {
        l.zero3_exposed_ms.unwrap_or(f64::NAN)
    }),
    ("step_ms", |l| l.step.map_or(f64::NAN, |s| s.step_ms)),
    ("dp_exposed_ms", |l| {
        l.step.map_or(f64::NAN, |s| s.dp_exposed_ms)
    }),
    ("tokens_per_gpu_s", |l| {
        l.step.map_or(f64::NAN, |s| s.tokens_per_gpu_s)
    }),
];

/// The [`MEMORY_METRICS`] of the cell's training step: one figure per cell, not per batch.
const STEP_METRICS: [&str; 3] = ["step_ms", "dp_exposed_ms", "tokens_per_gpu_s"];

/// Whether `name` is a metric a sweep can report ([`METRICS`], [`LAYER_METRICS`],
/// [`TP_METRICS`] or [`MEMORY_METRICS`]).
pub fn is_metric(name: &str) -> bool {
    METRICS.iter().any(|(m, _)| *m == name)
        || LAYER_METRICS.iter().any(|(m, _)| *m == name)
        || TP_METRICS.iter().any(|(m, _)| *m == name)
        || MEMORY_METRICS.iter().any(|(m, _)| *m == name)
}

/// One metric over a cell's batches.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Agg {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 95th percentile (nearest rank).
    pub p95: f64,
    /// Largest value.
    pub max: f64,
}

impl Agg {
    fn of(values: &[f64]) -> Agg {
        Agg {
            mean: mean(values),
            p50: percentile(values, 50.0),
            p95: percentile(values, 95.0),
            max: percentile(values, 100.0),
        }
    }
}

/// One row of a sweep: the cell, how many batches ran, and every metric's aggregate — or the
/// reason the cell produced nothing (an unknown scheme, a plan that failed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    /// The cell.
    #[serde(flatten)]
    pub key: CellKey,
    /// Settings outside the key ([`SweepConfig::settings_tag`]).
    pub settings: String,
    /// Batches simulated.
    pub batches: usize,
    /// Why the cell has no metrics.
    pub error: Option<String>,
    /// Metric name → aggregate over batches (names of [`METRICS`]).
    pub metrics: BTreeMap<String, Agg>,
}

impl CellResult {
    /// The mean of a metric, if the cell ran.
    pub fn mean(&self, metric: &str) -> Option<f64> {
        self.metrics.get(metric).map(|a| a.mean)
    }
}

/// What a sweep reports while it runs.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// The total number of batches still to compute (sent once, before any work).
    Start {
        /// Batches to compute.
        batches: u64,
        /// Cells skipped because their file exists.
        skipped_cells: usize,
    },
    /// One batch of one cell is done.
    Batch,
}

/// The outcome of [`run_sweep`].
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    /// One row per cell, in grid order.
    pub rows: Vec<CellResult>,
    /// Cells computed by this run.
    pub computed: usize,
    /// Cells taken from files of an earlier run.
    pub skipped: usize,
}

/// The file name of a cell inside `DIR/cells/`: a stable hash of its key and settings.
pub fn cell_file_name(key: &CellKey, settings: &str) -> String {
    let text = format!(
        "{}\u{1f}{}",
        serde_json::to_string(key).unwrap_or_default(),
        settings
    );
    format!("{:016x}.json", stable_hash(text.as_bytes()))
}

/// The files a cell reads besides the bundled data: a trace file, hardware and model TOMLs and
/// the tables a hardware file names. Bundled names and generated traces read none.
fn input_files(key: &CellKey) -> Vec<PathBuf> {
    use crate::hardware::bundled::is_path;
    let mut files = Vec::new();
    if let Ok(TraceSpec::File(p)) = TraceSpec::parse(&key.trace) {
        files.push(PathBuf::from(p));
    }
    // The file a spec with what-if overrides (`my.toml:nic_gbs=100`) reads.
    let hardware_file = crate::hardware::spec::split_overrides(&key.hardware).0;
    if crate::hardware::spec::reads_file(&key.hardware) {
        files.push(PathBuf::from(hardware_file));
        if let Ok(hw) = Hardware::load(&key.hardware) {
            let tables = std::iter::once(&hw.kernel_profile).chain(hw.nccl_table.as_ref());
            files.extend(tables.filter(|t| is_path(t, ".csv")).map(PathBuf::from));
        }
    }
    if crate::hardware::spec::reads_file(&key.model) {
        files.push(PathBuf::from(
            crate::hardware::spec::split_overrides(&key.model).0,
        ));
    }
    files
}

/// The settings a cell's file records: the sweep's [`SweepConfig::settings_tag`], plus a hash
/// of the contents of every file the cell reads. Regression: after `nvlink_gbs` changed in a
/// hardware file, a rerun reused the cell computed with the old value (2.36 ms for 71.9 ms).
fn cell_settings(settings: &str, key: &CellKey, hashes: &mut HashMap<PathBuf, u64>) -> String {
    let files = input_files(key);
    if files.is_empty() {
        return settings.to_string();
    }
    let mut text = String::new();
    for f in files {
        // Each file is read once per sweep, however many cells share it.
        let content = *hashes
            .entry(f.clone())
            .or_insert_with(|| read_input(&f).map_or(0, |bytes| stable_hash(&bytes)));
        text.push_str(&format!("{}={content:016x};", f.display()));
    }
    format!("{settings};inputs={:016x}", stable_hash(text.as_bytes()))
}

/// The bytes of an input the sweep hashes, noted as an input ([`crate::read_guard`]): a rerun
/// whose cells are all cached reads the trace only here, and must not write its results over
/// it (bug hunt).
fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut crate::read_guard::open(path)?, &mut bytes)?;
    Ok(bytes)
}

/// A simulator with the profiles it was built from.
type Loaded = Arc<(Simulator, Hardware, Model)>;

/// Everything shared by the cells of one sweep: traces and simulators, loaded once.
struct Inputs {
    traces: HashMap<String, Arc<Trace>>,
    /// Per hardware and model: the simulator, or why the sweep's settings cannot run on that
    /// pair (its cells become error rows; the others still run).
    sims: HashMap<(String, String), Result<Loaded, String>>,
}

/// The traces `cells` read and a simulator for every hardware and model pair of `grid` (all
/// of the sweep's cells, whether computed now or reused: whether any pair suits the
/// settings is the grid's question, not the run's).
fn load_inputs(
    cfg: &SweepConfig,
    cells: &[CellKey],
    grid: &[CellKey],
) -> Result<Inputs, StudyError> {
    // Each trace, with every packing its cells read it under: a generated one grows until
    // each of them packs the sweep's batches.
    let mut need: HashMap<&str, Vec<PackOptions>> = HashMap::new();
    for c in cells {
        let packing = PackOptions {
            // WLB's breakpoint weighs documents; it does not change how many tokens fill K.
            mode: cfg.pack_mode(c.context, None)?,
            ranks: c.ranks,
            tokens_per_rank: c.tokens_per_rank,
            context: c.context,
        };
        let packings = need.entry(c.trace.as_str()).or_default();
        if !packings.contains(&packing) {
            packings.push(packing);
        }
    }
    let mut traces = HashMap::new();
    for (spec, packings) in need {
        let t = TraceSpec::parse(spec)?.load_for(&packings, cfg.batches)?;
        traces.insert(spec.to_string(), Arc::new(t));
    }
    let mut sims = HashMap::new();
    let mut unsuited: Option<StudyError> = None;
    for c in grid {
        let k = (c.hardware.clone(), c.model.clone());
        if let std::collections::hash_map::Entry::Vacant(e) = sims.entry(k) {
            // A name that loads nothing is a mistake in the config: the sweep stops. A pair
            // the settings do not suit (TP that does not divide the heads, a model without
            // the layer's widths) fails its own cells only.
            let (hw, model) = (Hardware::load(&c.hardware)?, Model::load(&c.model)?);
            match simulator_for(cfg, &hw, &model) {
                Ok(sim) => {
                    e.insert(Ok(sim));
                }
                Err(err) => {
                    e.insert(Err(format!("{} on {}: {err}", c.model, c.hardware)));
                    unsuited.get_or_insert(err);
                }
            }
        }
    }
    // When no pair suits the settings, the settings are the mistake: say so and stop.
    if let Some(err) = unsuited.filter(|_| sims.values().all(|s| s.is_err())) {
        return Err(err);
    }
    Ok(Inputs { traces, sims })
}

/// The simulator of one hardware and model under the sweep's settings, with the split of
/// them it plans on.
fn simulator_for(cfg: &SweepConfig, hw: &Hardware, model: &Model) -> Result<Loaded, StudyError> {
    let (hw, model) = crate::tp::split(hw, model, cfg.tp)?;
    let mut sim = Simulator::new(hw.clone(), model.clone())?;
    if cfg.layer {
        sim = sim
            .with_recompute(cfg.recompute)?
            .with_tp_overlap(cfg.tp_overlap);
    }
    if let Some(m) = &cfg.memory {
        // Regression (bug hunt): a pipeline not dividing a model's layers was said with
        // the command line's `--pp`, not the table's `pp`.
        sim = sim.with_training(m.training()?).map_err(|e| {
            StudyError::Config(format!(
                "[memory]: {}",
                super::config::config_keys(&e.to_string())
            ))
        })?;
    }
    Ok(Arc::new((sim, hw, model)))
}

/// Plan and simulate one cell over its batches (batches in parallel).
fn run_cell(
    cfg: &SweepConfig,
    key: &CellKey,
    inputs: &Inputs,
    tick: &(dyn Fn() + Sync),
) -> CellResult {
    let settings = cfg.settings_tag();
    let fail = |e: String| CellResult {
        key: key.clone(),
        settings: settings.clone(),
        batches: 0,
        error: Some(e),
        metrics: BTreeMap::new(),
    };
    let (Some(trace), Some(sim)) = (
        inputs.traces.get(&key.trace),
        inputs.sims.get(&(key.hardware.clone(), key.model.clone())),
    ) else {
        return fail("inputs not loaded".into());
    };
    let sim = match sim {
        Ok(sim) => sim,
        Err(e) => {
            // Still count the cell's batches as done for the progress bar.
            (0..cfg.batches).for_each(|_| tick());
            return fail(e.clone());
        }
    };
    let (sim, hw, model) = (&sim.0, &sim.1, &sim.2);
    // Validated by `SweepConfig::validate`.
    let (Ok(mode), Ok(mask), Ok(pass)) = (
        cfg.pack_mode(key.context, model.attention_breakpoint()),
        cfg.mask_kind(),
        cfg.pass_sel(),
    ) else {
        return fail("invalid settings".into());
    };
    if let Err(e) = planner_for(&key.scheme) {
        // Still count the cell's batches as done for the progress bar.
        (0..cfg.batches).for_each(|_| tick());
        return fail(e.to_string());
    }
    let opts = PackOptions {
        mode,
        ranks: key.ranks,
        tokens_per_rank: key.tokens_per_rank,
        context: key.context,
    };
    let packed = match pack_first(trace, &opts, cfg.batches) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string()),
    };
    let mut batches = packed.batches;
    // Batches per priced step, under `[memory] steps` (validated: `micro_batches` is set).
    let per_step = cfg
        .memory
        .filter(|m| m.steps.is_some())
        .and_then(|m| m.step_windows())
        .map(|w| usize::try_from(w).unwrap_or(usize::MAX).max(1));
    // A trace short of the steps: its whole steps, as `compare --steps` prices them (bug
    // hunt: the plan metrics averaged a part-step the step metrics left out).
    if let Some(per) = per_step.filter(|&per| batches.len() >= per) {
        batches.truncate(batches.len() / per * per);
    }
    // A cell that cannot fill K batches still counts them as done for the progress bar.
    (batches.len()..cfg.batches).for_each(|_| tick());
    let ctx = PlanContext {
        ranks: key.ranks,
        tokens_per_rank: key.tokens_per_rank,
        mask,
        model,
        hardware: hw,
        judge: crate::planners::Judge {
            pass,
            recompute: cfg.recompute,
            tp_overlap: cfg.tp_overlap,
        },
    };
    // Validated by `SweepConfig::validate`.
    let step = cfg.memory.and_then(|m| m.step().ok().flatten());
    let results: Vec<Result<PlanMetrics, String>> = batches
        .par_iter()
        .map(|b| {
            let r = planner_for(&key.scheme)
                .map_err(|e| e.to_string())
                .and_then(|p| p.plan(b, &ctx).map_err(|e| e.to_string()))
                .and_then(|plan| sim.simulate(&plan, pass).map_err(|e| e.to_string()))
                .map(|r| r.metrics)
                .map_err(|e| format!("batch {}: {e}", b.index));
            tick();
            r
        })
        .collect();
    if batches.is_empty() {
        return fail("the trace packs into no batch".into());
    }
    let all = results
        .into_iter()
        .collect::<Result<Vec<PlanMetrics>, String>>()
        .and_then(|mut all| {
            // The cell's training step: its batches as the micro-batches, in order, as
            // `compare` prices a scheme's (cycling when the step needs more). One figure per
            // cell, which every batch carries; under `[memory] steps`, one per step (its
            // whole steps, when the trace holds fewer), which each of its batches carries.
            if let Some(opts) = step {
                let windows: Option<Vec<MicroBatch>> = all
                    .iter()
                    .zip(&batches)
                    .map(|(m, b)| {
                        m.layer
                            .as_ref()
                            .map(|l| MicroBatch::of(l, b.tokens() as f64))
                    })
                    .collect();
                if let Some(windows) = windows {
                    let each: Vec<&[MicroBatch]> = match per_step {
                        Some(per) if windows.len() >= per => windows.chunks_exact(per).collect(),
                        _ => vec![&windows[..]],
                    };
                    let priced = each
                        .iter()
                        .map(|w| sim.step(w, key.ranks, opts))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| format!("the step: {e}"))?;
                    for (i, l) in all.iter_mut().filter_map(|m| m.layer.as_mut()).enumerate() {
                        let k = per_step.map_or(0, |per| i / per).min(priced.len() - 1);
                        l.step = Some(priced[k]);
                    }
                }
            }
            Ok(all)
        });
    match all {
        Err(e) => fail(e),
        Ok(all) => CellResult {
            key: key.clone(),
            settings,
            batches: all.len(),
            error: None,
            metrics: {
                let mut metrics: BTreeMap<String, Agg> = METRICS
                    .iter()
                    .map(|(name, get)| {
                        let v: Vec<f64> = all.iter().map(get).collect();
                        (name.to_string(), Agg::of(&v))
                    })
                    .collect();
                // The whole layer's, when every batch has them.
                let layers: Option<Vec<&LayerMetrics>> =
                    all.iter().map(|m| m.layer.as_ref()).collect();
                if let Some(layers) = layers {
                    let tp = layers.iter().all(|l| l.tp_comm_max_ms.is_some());
                    let tp_metrics = TP_METRICS.iter().filter(|_| tp);
                    for (name, get) in LAYER_METRICS.iter().chain(tp_metrics).chain(MEMORY_METRICS)
                    {
                        // The step is the cell's, one figure (every batch carries it), or one per
                        // step priced (the first of its batches carries it).
                        let v: Vec<f64> = if STEP_METRICS.contains(name) {
                            let per = per_step.unwrap_or(layers.len()).max(1);
                            let steps = (layers.len() / per).max(1);
                            layers
                                .iter()
                                .step_by(per)
                                .take(steps)
                                .map(|l| get(l))
                                .collect()
                        } else {
                            layers.iter().map(|l| get(l)).collect()
                        };
                        // A metric some batch lacks (no `[memory]`, no `hbm_gb`) is left out.
                        if v.iter().all(|x| x.is_finite()) {
                            metrics.insert(name.to_string(), Agg::of(&v));
                        }
                    }
                }
                metrics
            },
        },
    }
}

/// Compute `cells` (in parallel) and return one row per cell, in the order given. Nothing is
/// written; [`run_sweep`] adds the resumable files.
pub fn run_cells(
    cfg: &SweepConfig,
    cells: &[CellKey],
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Vec<CellResult>, StudyError> {
    cfg.validate()?;
    let inputs = load_inputs(cfg, cells, cells)?;
    progress(Progress::Start {
        batches: (cells.len() * cfg.batches) as u64,
        skipped_cells: 0,
    });
    let tick = || progress(Progress::Batch);
    Ok(cells
        .par_iter()
        .map(|k| run_cell(cfg, k, &inputs, &tick))
        .collect())
}

/// Run the whole grid of `cfg`, resumably under `dir` when given: `dir/cells/` holds one file
/// per finished cell, `dir/results.{csv,json}` the merged rows (written last).
pub fn run_sweep(
    cfg: &SweepConfig,
    dir: Option<&Path>,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<SweepOutcome, StudyError> {
    cfg.validate()?;
    let cells = cfg.cells();
    let base = cfg.settings_tag();
    let mut hashes = HashMap::new();
    let settings: Vec<String> = cells
        .iter()
        .map(|k| cell_settings(&base, k, &mut hashes))
        .collect();
    let cells_dir = dir.map(|d| d.join("cells"));
    let mut done: HashMap<usize, CellResult> = HashMap::new();
    if let Some(cd) = cells_dir.as_ref().filter(|cd| cd.is_dir()) {
        remove_stale_temps(cd);
        for (i, k) in cells.iter().enumerate() {
            let p = cd.join(cell_file_name(k, &settings[i]));
            if let Ok(text) = std::fs::read_to_string(&p) {
                // A file from other settings or inputs, or an unreadable one, is recomputed.
                if let Ok(r) = serde_json::from_str::<CellResult>(&text) {
                    if &r.key == k && r.settings == settings[i] {
                        done.insert(i, r);
                    }
                }
            }
        }
    }
    let todo: Vec<usize> = (0..cells.len()).filter(|i| !done.contains_key(i)).collect();
    let todo_keys: Vec<CellKey> = todo.iter().map(|&i| cells[i].clone()).collect();
    let inputs = load_inputs(cfg, &todo_keys, &cells)?;
    // Refused before any cell runs, not once they all have (bug hunt): the results would go
    // over an input.
    if let Some(d) = dir {
        for name in ["results.csv", "results.json"] {
            let p = d.join(name);
            crate::read_guard::refuse_over_input(&p, &p).map_err(|e| StudyError::io(&p, e))?;
        }
    }
    // Created once the inputs load. Regression: a sweep whose trace or hardware did not
    // load left an empty `cells/` behind.
    if let Some(cd) = &cells_dir {
        std::fs::create_dir_all(cd).map_err(|e| StudyError::io(cd, e))?;
    }
    progress(Progress::Start {
        batches: (todo.len() * cfg.batches) as u64,
        skipped_cells: done.len(),
    });
    let tick = || progress(Progress::Batch);
    let computed: Vec<Result<(usize, CellResult), StudyError>> = todo
        .par_iter()
        .map(|&i| {
            let mut r = run_cell(cfg, &cells[i], &inputs, &tick);
            r.settings.clone_from(&settings[i]);
            if let Some(cd) = &cells_dir {
                let p = cd.join(cell_file_name(&cells[i], &settings[i]));
                let text = serde_json::to_string_pretty(&r).map_err(|e| StudyError::Parse {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })?;
                write_atomic(&p, text.as_bytes()).map_err(|e| StudyError::io(&p, e))?;
            }
            Ok((i, r))
        })
        .collect();
    let skipped = done.len();
    let mut n_computed = 0;
    for r in computed {
        let (i, row) = r?;
        done.insert(i, row);
        n_computed += 1;
    }
    let rows: Vec<CellResult> = (0..cells.len()).filter_map(|i| done.remove(&i)).collect();
    if let Some(d) = dir {
        write_results(d, &rows)?;
    }
    Ok(SweepOutcome {
        rows,
        computed: n_computed,
        skipped,
    })
}

/// Temporary files a killed run left in the cells directory (never complete results).
fn remove_stale_temps(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".fcp-") && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Both merged files, all or nothing (bug hunt: a `results.json` that could not be written
/// left a new `results.csv` beside the old `results.json`).
fn write_results(dir: &Path, rows: &[CellResult]) -> Result<(), StudyError> {
    crate::output::write_all_atomic(
        dir,
        [
            ("results.csv", results_csv(rows)),
            ("results.json", results_json(rows)),
        ]
        .map(|(name, text)| (dir.join(name), text.into_bytes())),
    )
    .map_err(|e| StudyError::io(dir, e))
}

/// Rows as pretty JSON (a list), with a final newline.
pub fn results_json(rows: &[CellResult]) -> String {
    let mut s = serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into());
    s.push('\n');
    s
}

/// Rows as CSV: the key columns, `batches`, `error`, then `METRIC_{mean,p50,p95,max}` for
/// every metric of [`METRICS`], and of [`LAYER_METRICS`], [`TP_METRICS`] and
/// [`MEMORY_METRICS`] when a row has them. Empty fields for
/// what a row lacks.
pub fn results_csv(rows: &[CellResult]) -> String {
    let has = |m: &str| rows.iter().any(|r| r.metrics.contains_key(m));
    let (layer, tp) = (has(LAYER_METRICS[0].0), has(TP_METRICS[0].0));
    let names: Vec<&str> = METRICS
        .iter()
        .map(|(m, _)| *m)
        .chain(LAYER_METRICS.iter().map(|(m, _)| *m).filter(|_| layer))
        .chain(TP_METRICS.iter().map(|(m, _)| *m).filter(|_| tp))
        .chain(MEMORY_METRICS.iter().map(|(m, _)| *m).filter(|m| has(m)))
        .collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = [
        "trace",
        "scheme",
        "ranks",
        "tokens_per_rank",
        "block",
        "context",
        "hardware",
        "model",
        "batches",
        "error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for m in &names {
        for s in ["mean", "p50", "p95", "max"] {
            header.push(format!("{m}_{s}"));
        }
    }
    let _ = w.write_record(&header);
    let opt = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    for r in rows {
        let k = &r.key;
        let mut rec = vec![
            k.trace.clone(),
            k.scheme.clone(),
            k.ranks.to_string(),
            k.tokens_per_rank.to_string(),
            opt(k.block),
            opt(k.context),
            k.hardware.clone(),
            k.model.clone(),
            r.batches.to_string(),
            r.error.clone().unwrap_or_default(),
        ];
        for m in &names {
            match r.metrics.get(*m) {
                Some(a) => rec.extend([a.mean, a.p50, a.p95, a.max].map(|v| v.to_string())),
                None => rec.extend(std::iter::repeat_n(String::new(), 4)),
            }
        }
        let _ = w.write_record(&rec);
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// Read a `results.json` written by a sweep.
pub fn load_results(path: &Path) -> Result<Vec<CellResult>, StudyError> {
    let text = crate::input::read_text(path, "a JSON results file", false)
        .map_err(|e| StudyError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| StudyError::Parse {
        path: path.display().to_string(),
        message: format!("not a sweep results.json: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> SweepConfig {
        SweepConfig::parse(
            r#"
            batches = 2
            [grid]
            traces = ["default"]
            schemes = ["zigzag", "fcp", "no-such-scheme"]
            ranks = [2, 4]
            tokens_per_rank = [8192]
        "#,
        )
        .unwrap()
    }

    #[test]
    fn a_memory_table_adds_the_fullest_gpus_footprint() {
        let cfg = |memory: &str| {
            SweepConfig::parse(&format!(
                "batches = 2\nlayer = true\n{memory}\n[grid]\ntraces = [\"default\"]\nschemes = [\"zigzag\"]\nranks = [2]\ntokens_per_rank = [8192]\nmodel = [\"llama3-8b\"]\n"
            ))
            .unwrap()
        };
        let plain = cfg("");
        let rows = run_cells(&plain, &plain.cells(), &|_| {}).unwrap();
        assert!(!rows[0].metrics.contains_key("gpu_mem_bytes"));
        assert!(!results_csv(&rows).contains("gpu_mem_bytes"));
        let counted = cfg("[memory]\nzero = 1");
        let rows = run_cells(&counted, &counted.cells(), &|_| {}).unwrap();
        let bytes = rows[0].metrics["gpu_mem_bytes"];
        let fraction = rows[0].metrics["gpu_mem_fraction"];
        assert!(bytes.max >= bytes.mean && bytes.mean > 0.0);
        assert!((fraction.max - bytes.max / 80e9).abs() < 1e-12);
        // Its columns follow the others in the CSV.
        let csv = results_csv(&rows);
        let header = csv.lines().next().unwrap();
        assert!(header.ends_with("gpu_mem_fraction_p95,gpu_mem_fraction_max"));
        assert!(is_metric("gpu_mem_bytes") && is_metric("gpu_mem_fraction"));
        assert!(!rows[0].metrics.contains_key("zero3_comm_ms"));
        // ZeRO 3 adds its collectives, in the layer's time where exposed.
        let sharded = cfg("[memory]\nzero = 3\ndp = 64");
        let rows3 = run_cells(&sharded, &sharded.cells(), &|_| {}).unwrap();
        let (comm, exposed) = (
            rows3[0].metrics["zero3_comm_ms"],
            rows3[0].metrics["zero3_exposed_ms"],
        );
        assert!(comm.mean > 0.0 && exposed.mean <= comm.mean);
        let layer = |rows: &[CellResult]| rows[0].metrics["layer_time_ms"].mean;
        assert!((layer(&rows3) - (layer(&rows) + exposed.mean)).abs() < 1e-6);
        assert!(results_csv(&rows3)
            .lines()
            .next()
            .unwrap()
            .ends_with("zero3_exposed_ms_p95,zero3_exposed_ms_max"));
        assert!(!rows3[0].metrics.contains_key("step_ms"));
        // A priced step: 8 micro-batches of every batch through its 32 layers and the output
        // layer, and the gradients' reduction over the 2 CP ranks, all of it exposed
        // without overlap.
        let stepped = cfg("[memory]\nzero = 1\nmicro_batches = 8");
        let rows_s = run_cells(&stepped, &stepped.cells(), &|_| {}).unwrap();
        let m = &rows_s[0].metrics;
        let (step, dp) = (m["step_ms"], m["dp_exposed_ms"]);
        assert!(dp.mean > 0.0);
        let hw = Hardware::load("h100").unwrap();
        let head = crate::sim::step::output_layer(
            &Model::load("llama3-8b").unwrap(),
            8192,
            hw.gemm_flops_per_s().unwrap(),
        );
        // The optimizer step: each of the 2 CP ranks updates half the parameters (ZeRO 1).
        let llama8 = Model::load("llama3-8b").unwrap();
        let shard = crate::footprint::Training::new(1, 1, 1)
            .unwrap()
            .optimizer_params(&llama8, 2)
            .unwrap();
        let optimizer = shard as f64
            * crate::footprint::optimizer_step_bytes_per_param(llama8.dtype_bytes) as f64
            / hw.hbm_bytes_per_s().unwrap()
            * 1e3;
        // Each batch's output layer runs on its busiest rank's tokens: at most the 8,192 a
        // rank holds.
        let layers = 8.0 * 32.0 * layer(&rows) + dp.mean + optimizer;
        let full = layers + 8.0 * head.total_ms();
        assert!(
            step.mean > layers && step.mean <= full + 1e-6,
            "{} {full}",
            step.mean
        );
        assert!(m["tokens_per_gpu_s"].mean > 0.0);
        assert!(results_csv(&rows_s)
            .lines()
            .next()
            .unwrap()
            .ends_with("tokens_per_gpu_s_p95,tokens_per_gpu_s_max"));
        assert!(is_metric("step_ms") && is_metric("tokens_per_gpu_s"));
        // The cell-level step metrics are memory metrics by those names.
        for n in STEP_METRICS {
            assert!(MEMORY_METRICS.iter().any(|(m, _)| *m == n), "{n}");
        }
    }

    /// Regression: one model the settings do not suit (here, no layer widths under
    /// `layer = true`) aborted the whole sweep; now its cells are error rows and the rest run.
    /// A model name that loads nothing still stops the sweep: that is a typo; so does a
    /// grid no pair of which suits the settings.
    #[test]
    fn a_model_the_settings_do_not_suit_fails_its_cells_only() {
        let cfg = |models: &str| {
            SweepConfig::parse(&format!(
                "batches = 1\nlayer = true\n[grid]\ntraces = [\"default\"]\nschemes = [\"zigzag\"]\nranks = [2]\ntokens_per_rank = [4096]\nmodel = [{models}]\n"
            ))
            .unwrap()
        };
        let mixed = cfg("\"llama3-8b\", \"mha-16\"");
        let rows = run_cells(&mixed, &mixed.cells(), &|_| {}).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows[0].error.is_none() && rows[0].metrics.contains_key("layer_time_ms"));
        let e = rows[1].error.as_deref().unwrap();
        assert!(
            e.starts_with("mha-16 on h100:") && e.contains("hidden"),
            "{e}"
        );
        let typo = cfg("\"llama3-8b\", \"no-such-model\"");
        assert!(run_cells(&typo, &typo.cells(), &|_| {}).is_err());
        // Regression (bug hunt): a resumed sweep judged only the cells left to compute, so
        // adding an unsuited model to a finished grid stopped it where a fresh run did not.
        let dir = tempfile::tempdir().unwrap();
        let first = cfg("\"llama3-8b\"");
        run_sweep(&first, Some(dir.path()), &|_| {}).unwrap();
        let resumed = run_sweep(&mixed, Some(dir.path()), &|_| {}).unwrap();
        assert_eq!((resumed.computed, resumed.skipped), (1, 1));
        assert!(resumed.rows[1].error.as_deref().unwrap().contains("hidden"));
        let none = cfg("\"mha-16\"");
        let e = run_cells(&none, &none.cells(), &|_| {}).unwrap_err();
        assert!(e.to_string().contains("mha-16 gives no `hidden`"), "{e}");
    }

    /// Regression (bug hunt): a `[memory]` pipeline that does not divide a model's layers
    /// was said with the command line's `--pp 3`, not the table's `pp = 3`.
    #[test]
    fn a_pipeline_not_dividing_the_layers_is_said_with_the_tables_keys() {
        let cfg = SweepConfig::parse(
            "batches = 1\nlayer = true\n[memory]\npp = 3\n[grid]\ntraces = [\"default\"]\nschemes = [\"zigzag\"]\nranks = [2]\ntokens_per_rank = [4096]\nmodel = [\"llama3-8b\"]\n",
        )
        .unwrap();
        let e = run_cells(&cfg, &cfg.cells(), &|_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("[memory]: pp = 3 does not divide"), "{e}");
        assert!(!e.contains("--pp"), "{e}");
    }

    #[test]
    fn rows_follow_the_grid_and_unknown_schemes_are_error_rows() {
        let rows = run_cells(&tiny(), &tiny().cells(), &|_| {}).unwrap();
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[0].key.scheme, "zigzag");
        assert_eq!(rows[0].key.ranks, 2);
        assert_eq!(rows[0].batches, 2);
        let m = rows[0].metrics["attention_time_ms"];
        assert!(m.mean > 0.0 && m.p50 <= m.max && m.mean <= m.max);
        let bad = &rows[5];
        assert!(bad.error.as_deref().unwrap().contains("unknown scheme"));
        assert!(bad.metrics.is_empty());
        let csv = results_csv(&rows);
        assert!(csv.starts_with("trace,scheme,ranks,tokens_per_rank,block,context"));
        assert_eq!(csv.lines().count(), 7);
    }

    #[test]
    fn resumed_sweep_skips_finished_cells_and_gives_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny();
        let first = run_sweep(&cfg, Some(dir.path()), &|_| {}).unwrap();
        assert_eq!((first.computed, first.skipped), (6, 0));
        let csv1 = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        // Lose two cells and the merged files, as an interrupted run would.
        let cells: Vec<_> = std::fs::read_dir(dir.path().join("cells"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(cells.len(), 6);
        std::fs::remove_file(&cells[0]).unwrap();
        std::fs::remove_file(&cells[3]).unwrap();
        std::fs::remove_file(dir.path().join("results.csv")).unwrap();
        std::fs::write(dir.path().join("cells/.fcp-abc.tmp"), "{trunc").unwrap();
        let second = run_sweep(&cfg, Some(dir.path()), &|_| {}).unwrap();
        assert_eq!((second.computed, second.skipped), (2, 4));
        assert!(std::fs::read_to_string(dir.path().join("results.csv")).unwrap() == csv1);
        assert!(!dir.path().join("cells/.fcp-abc.tmp").exists());
    }

    /// Regression: a rerun reused cells computed from an earlier version of an input file.
    #[test]
    fn a_changed_input_file_is_recomputed_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.csv");
        std::fs::write(&trace, "doc_len\n3000\n1000\n500\n").unwrap();
        let hw = dir.path().join("hw.toml");
        let h100 = include_str!("../../configs/hardware/h100.toml")
            .replace("name = \"h100\"", "name = \"lab\"");
        std::fs::write(&hw, &h100).unwrap();
        let cfg = SweepConfig::parse(&format!(
            "batches = 1\n[grid]\ntraces = [{:?}]\nschemes = [\"zigzag\"]\nranks = [2]\ntokens_per_rank = [4096]\nhardware = [{:?}]",
            trace.display().to_string(),
            hw.display().to_string()
        ))
        .unwrap();
        let out = dir.path().join("out");
        let first = run_sweep(&cfg, Some(&out), &|_| {}).unwrap();
        let again = run_sweep(&cfg, Some(&out), &|_| {}).unwrap();
        assert_eq!((again.computed, again.skipped), (0, 1));
        let slow = h100.replace("nvlink_gbs = 380.0", "nvlink_gbs = 1.0");
        assert_ne!(slow, h100, "the bundled h100 file changed");
        std::fs::write(&hw, slow).unwrap();
        let changed = run_sweep(&cfg, Some(&out), &|_| {}).unwrap();
        assert_eq!((changed.computed, changed.skipped), (1, 0));
        let t = |o: &SweepOutcome| o.rows[0].mean("attention_time_ms").unwrap();
        assert!(t(&changed) > t(&first));
        std::fs::write(&trace, "doc_len\n3000\n1000\n501\n").unwrap();
        let retraced = run_sweep(&cfg, Some(&out), &|_| {}).unwrap();
        assert_eq!(retraced.computed, 1);
        // A file with what-if overrides is read, and rehashed, as the file itself.
        let spec = format!("{}:nvlink_gbs=50", hw.display());
        let key = CellKey {
            hardware: spec,
            ..cfg.cells()[0].clone()
        };
        assert!(input_files(&key).contains(&hw));
    }

    #[test]
    fn cell_names_are_stable() {
        let k = tiny().cells()[0].clone();
        assert_eq!(cell_file_name(&k, "a"), cell_file_name(&k.clone(), "a"));
        assert_ne!(cell_file_name(&k, "a"), cell_file_name(&k, "b"));
    }
}
