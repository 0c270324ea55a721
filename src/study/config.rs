//! The sweep config: one TOML file describing a grid of cells.
//!
//! ```toml
//! name = "fcp-fig9"
//! batches = 4              # K batches per cell
//! pass = "both"            # fwd | bwd | both
//! mask = "causal"          # causal | full
//! pack = "budget"          # budget | window | carry | wlb
//! layer = false            # true: also the whole layer (projections and MLP), `layer_*` metrics
//! recompute = "none"       # with layer: none | mlp | full (what the backward pass recomputes)
//! tp = 1                   # tensor-parallel degree: each CP rank is a TP group of this many GPUs
//! tp_overlap = false       # with layer and tp > 1: TP collectives overlap their GEMMs
//!
//! [memory]                 # optional, with layer: each GPU's memory over a training step
//! zero = 1                 # 0 | 1 | 2 | 3: ZeRO stage of the model state (3: FSDP, weights gathered per layer)
//! dp = 1                   # data-parallel replicas (sharded state spreads over dp × ranks)
//! pp = 1                   # pipeline stages (must divide the model's layers)
//! vp = 1                   # chunks of layers a stage holds, interleaved (Megatron's virtual pipeline stages)
//! micro_batches = 8        # optional: also price a training step of this many micro-batches
//! dp_overlap = false       # with micro_batches: DP collectives overlap the first and last micro-batch
//! steps = 3                # with micro_batches: the cell's batches are 3 steps' windows, each priced
//!
//! [wlb]                    # optional, with pack = "wlb" (as `--wlb-*`; docs/traces.md)
//! group = 8                # micro-batches a step balances (default: micro_batches × dp, else 8)
//! max_len = 262144         # most tokens a micro-batch holds (default: twice the context)
//! outlier = 65536          # outliers from this length (default: half the context)
//! breakpoint = 104448      # attention vs linear work (default: from the cell's model)
//!
//! [grid]
//! traces = ["gen:wlb-llm:seed=1"]
//! schemes = ["ring", "zigzag", "fcp"]
//! ranks = [16, 32, 64]
//! tokens_per_rank = [32768]
//! block = [4096]           # optional: passed as `block=` to schemes that take it
//! context = [131072]       # window and wlb packing only
//! hardware = ["h100"]
//! model = ["llama3-70b"]
//! ```
//!
//! A cell is one point of the grid; its [`CellKey`] names it in results and baselines.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::model::Recompute;
use crate::plan::Mask;
use crate::planners::planner_for;
use crate::sim::PassSel;
use crate::trace::{PackMode, WlbSettings};

use super::StudyError;

fn default_batches() -> usize {
    4
}
fn default_pass() -> String {
    "both".into()
}
fn default_mask() -> String {
    "causal".into()
}
fn default_pack() -> String {
    "budget".into()
}
fn default_hardware() -> Vec<String> {
    vec!["h100".into()]
}
fn default_model() -> Vec<String> {
    vec!["llama3-70b".into()]
}

/// A sweep reads a trace file twice: once to hash it, so that a rerun reuses a cell only if
/// its trace is unchanged, and once to load it. Standard input and pipes are read once and
/// gone. (Regression, bug hunt: `traces = ["-"]` hashed as 0, so a rerun with other data on
/// stdin reused the old cells; `/dev/stdin` was emptied by the hash and loaded as empty.) A
/// path that does not exist is left to the loader's error.
fn check_rereadable(path: &str) -> Result<(), StudyError> {
    let missing = path != "-" && std::fs::metadata(path).is_err();
    if missing || crate::input::can_read_twice(Path::new(path)) {
        return Ok(());
    }
    Err(StudyError::Config(format!(
        "trace `{path}` is not a regular file: a sweep reads its trace twice (to tell on a rerun whether it changed, then to load it), so save it to a file first (`... > trace.csv`)"
    )))
}

/// The most batches a study cell may run.
pub const MAX_BATCHES: usize = 100_000;

/// A sweep: shared settings and the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Name shown in outputs.
    #[serde(default)]
    pub name: Option<String>,
    /// Free text: what the study reproduces.
    #[serde(default)]
    pub description: Option<String>,
    /// K: batches per cell (the first K batches of the packed trace).
    #[serde(default = "default_batches")]
    pub batches: usize,
    /// Passes: fwd, bwd or both.
    #[serde(default = "default_pass")]
    pub pass: String,
    /// Mask inside each document: causal or full.
    #[serde(default = "default_mask")]
    pub mask: String,
    /// Packing: budget (FCP), window (FlashCP), carry or wlb (WLB-LLM).
    #[serde(default = "default_pack")]
    pub pack: String,
    /// With `pack = "wlb"`: WLB packing's settings, each defaulting as on the command line
    /// ([`WlbSettings::resolve`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wlb: Option<WlbSettings>,
    /// Also simulate the whole layer around attention ([`crate::sim::Simulator::with_layer`]):
    /// every cell gains the [`super::LAYER_METRICS`]; every model and hardware of the grid must
    /// give the layer's cost.
    #[serde(default)]
    pub layer: bool,
    /// With `layer`: what the backward pass recomputes ([`Recompute`]).
    #[serde(default, skip_serializing_if = "Recompute::is_off")]
    pub recompute: Recompute,
    /// Tensor-parallel degree every cell's model and hardware are split by
    /// ([`crate::tp::split`]): each CP rank is a group of `tp` GPUs in one node.
    #[serde(default = "crate::tp::one", skip_serializing_if = "crate::tp::is_one")]
    pub tp: u32,
    /// With `layer`: TP collectives overlap the GEMMs they feed or drain
    /// ([`crate::sim::LayerCost::with_tp_overlap`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tp_overlap: bool,
    /// With `layer`: count each GPU's memory over a training step ([`crate::footprint`]);
    /// cells gain the [`super::MEMORY_METRICS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySetting>,
    /// The axes.
    pub grid: Grid,
}

/// A sweep's `[memory]` table: how the model state is held ([`crate::footprint::Training`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySetting {
    /// ZeRO stage (0 to 3).
    #[serde(default = "default_zero")]
    pub zero: u8,
    /// Data-parallel replicas.
    #[serde(default = "crate::tp::one")]
    pub dp: u32,
    /// Pipeline stages.
    #[serde(default = "crate::tp::one")]
    pub pp: u32,
    /// Chunks of layers each stage holds, interleaved (Megatron's virtual pipeline stages);
    /// 1, the plain 1F1B schedule, when absent.
    #[serde(default = "crate::tp::one", skip_serializing_if = "is_one")]
    pub vp: u32,
    /// Hybrid sharding: the replicas a shard group spans (a divisor of `dp`); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_dp: Option<u32>,
    /// Also price a training step of this many micro-batches of each batch
    /// ([`crate::sim::step`]); cells gain `step_ms`, `dp_exposed_ms` and `tokens_per_gpu_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batches: Option<u32>,
    /// With `micro_batches`: the data-parallel collectives overlap the first and last
    /// micro-batch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dp_overlap: bool,
    /// With `micro_batches`: the cell's `batches` are this many consecutive steps' windows
    /// (`micro_batches × dp` each), each step priced on its own, as `fcp compare --steps`:
    /// the step metrics' mean, p50, p95 and max are over the steps. One step, of the first
    /// windows, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
}

/// A setting's error as the `[memory]` table spells it: its keys, not the CLI's flags
/// (`--shard-dp 3 must divide --dp 8` reads `shard_dp = 3 must divide dp = 8`).
pub(crate) fn config_keys(message: &str) -> String {
    [
        ("--shard-dp ", "shard_dp = "),
        ("--micro-batches ", "micro_batches = "),
        ("--zero ", "zero = "),
        ("--dp ", "dp = "),
        ("--pp ", "pp = "),
        ("--vp ", "vp = "),
    ]
    .iter()
    .fold(message.to_string(), |m, (flag, key)| m.replace(flag, key))
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn default_zero() -> u8 {
    crate::footprint::Training::default().zero
}

impl MemorySetting {
    /// The training setting, refused outside what is modelled.
    pub fn training(&self) -> Result<crate::footprint::Training, StudyError> {
        // Counted for the step's micro-batches when one is priced.
        let t = crate::footprint::Training::new(self.zero, self.dp, self.pp)
            .and_then(|t| t.with_virtual_stages(self.vp))
            .map(|t| t.with_micro_batches(self.micro_batches));
        match self.shard_dp {
            Some(s) => t.and_then(|t| t.with_shard_dp(s)),
            None => t,
        }
        .map_err(|e| StudyError::Config(format!("[memory]: {}", config_keys(&e.to_string()))))
    }

    /// The windows one priced step trains, `micro_batches × dp`; `None` without a step.
    pub fn step_windows(&self) -> Option<u64> {
        self.micro_batches
            .map(|b| u64::from(b) * u64::from(self.dp))
    }

    /// The training step to price, when `micro_batches` asks for one.
    pub fn step(&self) -> Result<Option<crate::sim::step::StepOptions>, StudyError> {
        let training = self.training()?;
        match self.micro_batches {
            Some(m) => crate::sim::step::StepOptions::new(m, self.dp_overlap, training)
                .map(Some)
                .map_err(|e| {
                    StudyError::Config(format!("[memory]: {}", config_keys(&e.to_string())))
                }),
            None if self.dp_overlap => Err(StudyError::Config(
                "[memory]: dp_overlap = true overlaps a training step's collectives: it needs micro_batches".into(),
            )),
            None => Ok(None),
        }
    }
}

/// The axes of a sweep; the cells are their Cartesian product.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// Trace specs (see [`super::traces`]).
    pub traces: Vec<String>,
    /// Scheme entries (`ring`, `fcp:coalesce=8`). Unknown schemes are kept and produce error
    /// rows, so a study can list a scheme before it lands.
    pub schemes: Vec<String>,
    /// CP group sizes.
    pub ranks: Vec<u32>,
    /// Tokens per rank. Empty: 32768, or in window packing the window split over the ranks.
    #[serde(default)]
    pub tokens_per_rank: Vec<u64>,
    /// Block sizes, given as `block=` to the schemes that take such a parameter (FCP); schemes
    /// without one run once, with no block.
    #[serde(default)]
    pub block: Vec<u64>,
    /// Context windows (window packing only).
    #[serde(default)]
    pub context: Vec<u64>,
    /// Hardware profiles (names or TOML files).
    #[serde(default = "default_hardware")]
    pub hardware: Vec<String>,
    /// Models (presets or TOML files).
    #[serde(default = "default_model")]
    pub model: Vec<String>,
}

/// Names one cell of a grid. Field order is the column order of the results.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CellKey {
    /// Trace spec.
    pub trace: String,
    /// Scheme entry, with `block=` added when the block axis applies.
    pub scheme: String,
    /// CP group size.
    pub ranks: u32,
    /// Tokens per rank.
    pub tokens_per_rank: u64,
    /// Block size of the block axis, when it applied to the scheme.
    pub block: Option<u64>,
    /// Context window (window packing).
    pub context: Option<u64>,
    /// Hardware profile.
    pub hardware: String,
    /// Model.
    pub model: String,
}

impl CellKey {
    /// A short human label: `trace · scheme · N ranks × T tok · hw · model`.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} · {} · {} ranks × {} tok",
            self.trace, self.scheme, self.ranks, self.tokens_per_rank
        );
        if let Some(c) = self.context {
            s.push_str(&format!(" · context {c}"));
        }
        s.push_str(&format!(" · {} · {}", self.hardware, self.model));
        s
    }
}

/// The first value of `list` that an earlier one repeats.
pub(crate) fn repeated<T: PartialEq>(list: &[T]) -> Option<&T> {
    list.iter()
        .enumerate()
        .find(|(i, v)| list[..*i].contains(v))
        .map(|(_, v)| v)
}

impl SweepConfig {
    /// Read and validate a config file.
    pub fn load(path: &Path) -> Result<SweepConfig, StudyError> {
        let text = crate::input::read_text(path, "a TOML config", false)
            .map_err(|e| StudyError::io(path, e))?;
        Self::parse(&text).map_err(|e| match e {
            StudyError::Config(m) => StudyError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parse and validate TOML text.
    pub fn parse(text: &str) -> Result<SweepConfig, StudyError> {
        let cfg: SweepConfig = toml::from_str(text)
            .map_err(|e| StudyError::Config(crate::jsonpos::toml_message(text, &e)))?;
        // The optional axes read an empty list as "left out"; one written empty is a slip
        // (bug hunt: `tokens_per_rank = []` ran the default while `ranks = []` was refused).
        if let Ok(raw) = text.parse::<toml::Table>() {
            let grid = raw.get("grid").and_then(|g| g.as_table());
            for (name, left_out) in [
                (
                    "tokens_per_rank",
                    "32768, or each rank's share of the window",
                ),
                ("block", "each scheme's own block size"),
                ("context", "no windows"),
            ] {
                let listed = grid.and_then(|g| g.get(name)).and_then(|v| v.as_array());
                if listed.is_some_and(|a| a.is_empty()) {
                    return Err(StudyError::Config(format!(
                        "grid.{name} = [] lists no value; leave it out for the default ({left_out})"
                    )));
                }
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check every axis and setting; say what to fix.
    pub fn validate(&self) -> Result<(), StudyError> {
        let bad = |m: String| Err(StudyError::Config(m));
        if self.batches == 0 {
            return bad("`batches` must be at least 1".into());
        }
        // More batches than any trace packs into; a billion spun the progress bar for minutes.
        if self.batches > MAX_BATCHES {
            return bad(format!(
                "`batches` is {}, more than the {MAX_BATCHES} a study may run",
                self.batches
            ));
        }
        self.pass_sel()?;
        self.mask_kind()?;
        if self.recompute != Recompute::None && !self.layer {
            return bad(format!(
                "recompute = \"{}\" prices the whole layer: it needs layer = true",
                self.recompute.name()
            ));
        }
        if self.tp_overlap && !self.layer {
            return bad(
                "tp_overlap = true prices the whole layer's TP collectives: it needs layer = true"
                    .into(),
            );
        }
        if let Some(m) = &self.memory {
            if !self.layer {
                return bad(
                    "[memory] counts every layer's activations, priced with the layer: it needs layer = true"
                        .into(),
                );
            }
            if let Some(steps) = m.steps {
                let Some(per) = m.step_windows() else {
                    return bad(format!(
                        "[memory] steps = {steps} prices training steps: it needs micro_batches"
                    ));
                };
                if steps == 0 {
                    return bad("[memory] steps = 0: must be at least 1".into());
                }
                // Bug hunt: a u64 product wrapped round to `batches` and passed.
                let all = u128::from(steps) * u128::from(per);
                if all != self.batches as u128 {
                    return bad(format!(
                        "[memory] steps = {steps} prices {steps} steps of micro_batches × dp = {per} windows each: it needs batches = {all} (now {})",
                        self.batches
                    ));
                }
            }
            if m.step()?.is_some() && matches!(self.pass_sel(), Ok(p) if p != PassSel::Both) {
                return bad(format!(
                    "[memory] micro_batches prices a training step, forward and backward: it needs pass = \"both\", not \"{}\"",
                    self.pass
                ));
            }
        }
        // It would change no number but rename every cell (and fail a baseline's settings).
        if self.tp_overlap && self.tp == 1 {
            return bad("tp_overlap = true overlaps TP collectives: it needs tp > 1".into());
        }
        if !(1..=crate::tp::MAX_TP).contains(&self.tp) {
            return bad(format!(
                "`tp` is {}: must be 1 to {}",
                self.tp,
                crate::tp::MAX_TP
            ));
        }
        let mode = self.pack_mode(None, None)?;
        let g = &self.grid;
        for (name, empty) in [
            ("traces", g.traces.is_empty()),
            ("schemes", g.schemes.is_empty()),
            ("ranks", g.ranks.is_empty()),
            ("hardware", g.hardware.is_empty()),
            ("model", g.model.is_empty()),
        ] {
            if empty {
                return bad(format!("grid.{name} must list at least one value"));
            }
        }
        // A value listed twice made every cell of it twice (two rows, one `cells/` file);
        // profiles count as listed twice when their what-if overrides are the same written
        // two ways (`h100:nic_gbs=10` and `h100:nic_gbs=10.0`), and inputs when they name
        // one file two ways (`lab.toml` and `./lab.toml`).
        let same_file = |spec: &str| -> String {
            let (base, overrides) = crate::hardware::spec::split_overrides(spec);
            match std::fs::canonicalize(base) {
                Ok(p) if p.is_file() => match overrides {
                    Some(o) => format!("{}:{o}", p.display()),
                    None => p.display().to_string(),
                },
                _ => spec.to_string(),
            }
        };
        let canonical = |l: &[String]| -> Vec<String> {
            l.iter()
                .map(|s| same_file(&crate::hardware::spec::canonical_spec(s)))
                .collect()
        };
        // A generated trace is the same whatever order or spelling its keys take
        // (`gen:pile` and `gen:pile:seed=01`; bug hunt: they ran as separate, equal cells).
        let traces: Vec<String> = g
            .traces
            .iter()
            .map(|t| match super::traces::TraceSpec::parse(t) {
                Ok(spec @ super::traces::TraceSpec::Gen { .. }) => format!("{spec:?}"),
                _ => same_file(t),
            })
            .collect();
        for (name, list, written) in [
            ("traces", traces, &g.traces),
            ("schemes", g.schemes.clone(), &g.schemes),
            ("hardware", canonical(&g.hardware), &g.hardware),
            ("model", canonical(&g.model), &g.model),
        ] {
            let Some(j) = (0..list.len()).find(|&j| list[..j].contains(&list[j])) else {
                continue;
            };
            let i = list[..j].iter().position(|v| *v == list[j]).unwrap_or(0);
            return bad(if written[i] == written[j] {
                format!("grid.{name} lists `{}` twice", written[j])
            } else {
                format!(
                    "grid.{name} lists `{}` and `{}`, one input written two ways; list it once",
                    written[i], written[j]
                )
            });
        }
        if let Some((a, b)) = schemes_planning_alike(&g.schemes, &g.block) {
            return bad(format!(
                "grid.schemes `{a}` and `{b}` plan alike (the same scheme and parameters{}); \
                 list it once",
                if g.block.is_empty() {
                    ""
                } else {
                    " at a grid.block size"
                }
            ));
        }
        for (name, list) in [
            ("tokens_per_rank", &g.tokens_per_rank),
            ("block", &g.block),
            ("context", &g.context),
        ] {
            if let Some(v) = repeated(list) {
                return bad(format!("grid.{name} lists {v} twice"));
            }
        }
        if let Some(v) = repeated(&g.ranks) {
            return bad(format!("grid.ranks lists {v} twice"));
        }
        if g.ranks.contains(&0) {
            return bad("grid.ranks must be ≥ 1".into());
        }
        if let Some(r) = g.ranks.iter().find(|&&r| r > crate::planners::MAX_RANKS) {
            return bad(format!(
                "grid.ranks {r} is more than the {} ranks a plan may have",
                crate::planners::MAX_RANKS
            ));
        }
        if g.tokens_per_rank.contains(&0) || g.block.contains(&0) || g.context.contains(&0) {
            return bad("grid.tokens_per_rank, grid.block and grid.context must be ≥ 1".into());
        }
        if mode.reads_context() && g.context.is_empty() {
            return bad(format!(
                "pack = \"{}\" needs grid.context (the window sizes)",
                self.pack
            ));
        }
        mode.check_context(
            !g.context.is_empty(),
            "grid.context",
            "pack = \"window\" or \"wlb\"",
        )
        .map_err(|e| StudyError::Config(e.to_string()))?;
        if self.wlb.is_some() && !matches!(mode, PackMode::Wlb(_)) {
            return bad(format!(
                "[wlb] sets WLB packing: it needs pack = \"wlb\", not \"{}\"",
                self.pack
            ));
        }
        // Bug hunt: a zero or a group too large was blamed on grid.context; said with the
        // key at fault.
        if let Some(w) = self.wlb {
            for (key, v) in w.fields() {
                if v == Some(0) {
                    return bad(format!("[wlb] {key} = 0: must be at least 1"));
                }
            }
        }
        if let PackMode::Wlb(p) = mode {
            if p.group > crate::trace::WLB_MAX_GROUP {
                let from = match self.wlb.and_then(|w| w.group) {
                    Some(g) => format!("[wlb] group = {g}"),
                    None => format!(
                        "{} micro-batches a step ([memory] micro_batches × dp; [wlb] group sets fewer)",
                        p.group
                    ),
                };
                return bad(format!(
                    "{from} is more than the {} WLB packing balances",
                    crate::trace::WLB_MAX_GROUP
                ));
            }
        }
        // Every window's WLB parameters, checked before any cell runs (a limit under one of
        // the windows).
        if matches!(mode, PackMode::Wlb(_)) {
            for &c in &g.context {
                if let PackMode::Wlb(p) = self.pack_mode(Some(c), None)? {
                    p.check(c)
                        .map_err(|e| StudyError::Config(format!("grid.context {c}: {e}")))?;
                }
            }
        }
        for t in &g.traces {
            if let super::traces::TraceSpec::File(path) = super::traces::TraceSpec::parse(t)? {
                check_rereadable(&path)?;
            }
        }
        Ok(())
    }

    /// Passes to simulate.
    pub fn pass_sel(&self) -> Result<PassSel, StudyError> {
        match self.pass.as_str() {
            "fwd" => Ok(PassSel::Fwd),
            "bwd" => Ok(PassSel::Bwd),
            "both" => Ok(PassSel::Both),
            o => Err(StudyError::Config(format!(
                "pass `{o}`: expected fwd, bwd or both"
            ))),
        }
    }

    /// Mask inside documents.
    pub fn mask_kind(&self) -> Result<Mask, StudyError> {
        match self.mask.as_str() {
            "causal" => Ok(Mask::Causal),
            "full" => Ok(Mask::Full),
            o => Err(StudyError::Config(format!(
                "mask `{o}`: expected causal or full"
            ))),
        }
    }

    /// Packing mode of a cell with windows of `context` tokens (window and wlb packing) and a
    /// model of attention breakpoint `breakpoint` (WLB's weighing). WLB's group defaults to
    /// the training step `[memory]` prices (`micro_batches × dp` windows), as `fcp compare`'s
    /// does; without a context, the mode's kind only (WLB at the default window).
    pub fn pack_mode(
        &self,
        context: Option<u64>,
        breakpoint: Option<u64>,
    ) -> Result<PackMode, StudyError> {
        match self.pack.as_str() {
            "budget" => Ok(PackMode::Budget),
            "window" => Ok(PackMode::Window),
            "carry" => Ok(PackMode::Carry),
            "wlb" => {
                let step_group = self
                    .memory
                    .and_then(|m| m.step_windows())
                    .map(|w| u32::try_from(w).unwrap_or(u32::MAX));
                Ok(PackMode::Wlb(self.wlb.unwrap_or_default().resolve(
                    context.unwrap_or(crate::trace::DEFAULT_CONTEXT),
                    step_group,
                    breakpoint,
                )))
            }
            o => Err(StudyError::Config(format!(
                "pack `{o}`: expected budget, window, carry or wlb"
            ))),
        }
    }

    /// The settings outside the key that change a cell's numbers; part of every cell file so
    /// a resumed sweep never reuses a cell computed under other settings.
    pub fn settings_tag(&self) -> String {
        format!(
            "batches={};pass={};mask={};pack={}{}",
            self.batches,
            self.pass,
            self.mask,
            self.pack,
            // Only when on, so that the cells of every earlier sweep keep their names.
            if self.layer { ";layer=true" } else { "" },
        ) + &self.wlb_tag()
            + &if self.recompute.is_off() {
                String::new()
            } else {
                format!(";recompute={}", self.recompute.name())
            }
            + &if self.tp == 1 {
                String::new()
            } else {
                format!(";tp={}", self.tp)
            }
            + if self.tp_overlap {
                ";tp_overlap=true"
            } else {
                ""
            }
            + &self.memory.map_or(String::new(), |m| {
                format!(
                    ";memory=zero{},dp{},pp{}{}{}",
                    m.zero,
                    m.dp,
                    m.pp,
                    // One chunk a stage is the default: the same cells.
                    if m.vp > 1 {
                        format!(",vp{}", m.vp)
                    } else {
                        String::new()
                    },
                    // Spanning every replica is the default: the same cells.
                    m.shard_dp
                        .filter(|&s| s != m.dp)
                        .map_or(String::new(), |s| format!(",shard{s}")),
                ) + &m.micro_batches.map_or(String::new(), |b| {
                    // `step`, not the earlier `mb`: a cell's step now runs its batches in turn,
                    // not copies of each, so cells priced the old way are not resumed.
                    format!(
                        ",step{b}{}{}",
                        if m.dp_overlap { ",dpoverlap" } else { "" },
                        // One step is the default: the same cells.
                        m.steps
                            .filter(|&s| s > 1)
                            .map_or(String::new(), |s| format!(",steps{s}"))
                    )
                })
            })
    }

    /// The `[wlb]` settings given, for [`Self::settings_tag`]: what they leave out follows
    /// from the rest of the tag and the cell's key (its context and model).
    fn wlb_tag(&self) -> String {
        let Some(w) = self.wlb.filter(|w| !w.is_empty()) else {
            return String::new();
        };
        let parts: Vec<String> = w
            .fields()
            .into_iter()
            .filter_map(|(name, v)| v.map(|v| format!("{name}{v}")))
            .collect();
        format!(";wlb={}", parts.join(","))
    }

    /// Every cell, in grid order (traces outermost, models innermost).
    pub fn cells(&self) -> Vec<CellKey> {
        let g = &self.grid;
        let window = self.pack_mode(None, None).is_ok_and(|m| m.reads_context());
        let contexts: Vec<Option<u64>> = if window {
            g.context.iter().map(|&c| Some(c)).collect()
        } else {
            vec![None]
        };
        let mut out = Vec::new();
        for trace in &g.traces {
            for scheme in &g.schemes {
                let blocks = blocks_of(scheme, &g.block);
                for &ranks in &g.ranks {
                    for &context in &contexts {
                        let tprs: Vec<u64> = match (g.tokens_per_rank.is_empty(), context) {
                            (false, _) => g.tokens_per_rank.clone(),
                            (true, Some(c)) => match self.pack_mode(Some(c), None) {
                                Ok(mode) => vec![mode.default_tokens_per_rank(ranks, c)],
                                Err(_) => vec![],
                            },
                            (true, None) => vec![crate::trace::DEFAULT_TOKENS_PER_RANK],
                        };
                        for &tokens_per_rank in &tprs {
                            for &block in &blocks {
                                for hardware in &g.hardware {
                                    for model in &g.model {
                                        out.push(CellKey {
                                            trace: trace.clone(),
                                            scheme: with_block(scheme, block),
                                            ranks,
                                            tokens_per_rank,
                                            block,
                                            context,
                                            hardware: hardware.clone(),
                                            model: model.clone(),
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// Two scheme entries whose cells would plan alike: the same scheme and parameters once read,
/// after the block axis is applied, as `compare` tells schemes apart. Their cells were run twice
/// under two names (`fcp:block=2048,coalesce=8` beside `fcp:coalesce=8,block=2048`, or `fcp`
/// with `block = [4096]` beside `fcp:block=4096`). Entries that do not parse are left to their
/// error rows.
fn schemes_planning_alike<'a>(schemes: &'a [String], block: &[u64]) -> Option<(&'a str, &'a str)> {
    let mut seen: Vec<(&str, crate::planners::PlanningIdentity)> = Vec::new();
    for scheme in schemes {
        for b in blocks_of(scheme, block) {
            let Ok(id) = crate::planners::planning_identity(&with_block(scheme, b)) else {
                continue;
            };
            if let Some((first, _)) = seen.iter().find(|(e, i)| *i == id && *e != scheme) {
                return Some((first, scheme));
            }
            seen.push((scheme, id));
        }
    }
    None
}

/// The block sizes of the grid's block axis that `scheme` runs at (`None`: the axis does not
/// apply to it, or is empty).
fn blocks_of(scheme: &str, block: &[u64]) -> Vec<Option<u64>> {
    if block.is_empty() || !takes_block(scheme) {
        vec![None]
    } else {
        block.iter().map(|&b| Some(b)).collect()
    }
}

/// Whether the scheme entry accepts a `block` parameter it does not already set.
fn takes_block(scheme: &str) -> bool {
    if scheme.split_once(':').is_some_and(|(_, p)| {
        p.split(',')
            .any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.trim() == "block"))
    }) {
        return false;
    }
    planner_for(&with_block(scheme, Some(1))).is_ok()
}

/// The scheme entry with `block=` appended.
fn with_block(scheme: &str, block: Option<u64>) -> String {
    match block {
        None => scheme.to_string(),
        Some(b) if scheme.contains(':') => format!("{scheme},block={b}"),
        Some(b) => format!("{scheme}:block={b}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = r#"
        batches = 2
        [grid]
        traces = ["default"]
        schemes = ["ring", "fcp", "flashcp"]
        ranks = [4, 8]
        block = [2048, 4096]
    "#;

    #[test]
    fn block_axis_applies_only_to_schemes_that_take_it() {
        let cfg = SweepConfig::parse(CFG).unwrap();
        let cells = cfg.cells();
        let names: Vec<_> = cells.iter().map(|c| c.scheme.as_str()).collect();
        assert_eq!(
            names,
            [
                "ring",
                "ring",
                "fcp:block=2048",
                "fcp:block=4096",
                "fcp:block=2048",
                "fcp:block=4096",
                "flashcp",
                "flashcp"
            ]
        );
        assert!(cells.iter().all(|c| c.tokens_per_rank == 32768));
    }

    /// Regression (bug hunt): `tokens_per_rank = []` ran a cell at the default 32768 while
    /// an empty `ranks` was refused; the optional axes now refuse a list written empty, and
    /// left out they keep their defaults.
    #[test]
    fn regression_an_optional_axis_written_empty_was_run_at_its_default() {
        let grid = "[grid]\ntraces=[\"default\"]\nschemes=[\"zigzag\"]\nranks=[4]\n";
        for axis in ["tokens_per_rank", "block", "context"] {
            let e = SweepConfig::parse(&format!("{grid}{axis} = []\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("grid.{axis} = [] lists no value")),
                "{e}"
            );
        }
        let cfg = SweepConfig::parse(grid).unwrap();
        assert_eq!(cfg.cells()[0].tokens_per_rank, 32768);
        // A baseline's recorded grid (JSON, which writes the left-out axes as `[]`) still reads.
        let json = serde_json::to_string(&cfg.grid).unwrap();
        assert!(json.contains("\"block\":[]"), "{json}");
        assert_eq!(serde_json::from_str::<Grid>(&json).unwrap(), cfg.grid);
    }

    /// Regression (bug hunt): one model's what-if overrides written two ways ran as two.
    #[test]
    fn regression_a_profile_spec_written_two_ways_ran_twice() {
        let grid = "[grid]\ntraces=[\"default\"]\nschemes=[\"zigzag\"]\nranks=[4]\n";
        for (axis, a, b) in [
            (
                "model",
                "llama3-8b:kv_heads=16,layers=16",
                "llama3-8b: layers=16 ,kv_heads=16",
            ),
            ("hardware", "h100:nic_gbs=10", "h100:nic_gbs=1e1"),
            (
                "hardware",
                "h100:launch_overhead_us=0",
                "h100:launch_overhead_us=-0",
            ),
        ] {
            let e = SweepConfig::parse(&format!("{grid}{axis} = [{a:?}, {b:?}]\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "grid.{axis} lists `{a}` and `{b}`, one input written two ways"
                )),
                "{e}"
            );
        }
        // One file named two ways, with or without the same overrides.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lab.toml");
        std::fs::write(&file, crate::hardware::bundled::HARDWARE[0].1).unwrap();
        let plain = file.display().to_string();
        let dotted = format!("{}/./lab.toml", dir.path().display());
        for (a, b) in [
            (plain.clone(), dotted.clone()),
            (
                format!("{plain}:nic_gbs=10"),
                format!("{dotted}:nic_gbs=1e1"),
            ),
        ] {
            let e = SweepConfig::parse(&format!(
                "{grid}hardware = [{a:?}, {b:?}]
"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("one input written two ways"), "{e}");
        }
        assert!(SweepConfig::parse(&format!(
            "{grid}hardware = [{plain:?}, \"{plain}:nic_gbs=10\"]
"
        ))
        .is_ok());
    }

    /// Regression (bug hunt): one generated trace written two ways (keys in another order,
    /// a default spelled out, `01` for `1`, `2048` for `2048.0`) ran as two equal cells.
    #[test]
    fn regression_a_generated_trace_written_two_ways_ran_twice() {
        for (a, b) in [
            ("gen:pile", "gen:pile:seed=1"),
            ("gen:pile:seed=1", "gen:pile:seed=01"),
            ("gen:pile:docs=1000,seed=3", "gen:pile:seed=3,docs=1000"),
            ("gen:exponential:mean=2048", "gen:exponential:mean=2048.0"),
        ] {
            let e = SweepConfig::parse(&format!(
                "[grid]\ntraces=[{a:?}, {b:?}]\nschemes=[\"zigzag\"]\nranks=[4]\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("one input written two ways"), "{e}");
        }
        assert!(SweepConfig::parse(
            "[grid]\ntraces=[\"gen:pile\", \"gen:pile:seed=2\"]\nschemes=[\"zigzag\"]\nranks=[4]\n"
        )
        .is_ok());
    }

    #[test]
    fn recomputation_needs_the_layer_and_names_its_cells() {
        let grid = "[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]\n";
        let e = SweepConfig::parse(&format!("recompute = \"full\"\n{grid}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs layer = true"), "{e}");
        let e = SweepConfig::parse(&format!("layer = true\nrecompute = \"some\"\n{grid}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none") && e.contains("full"), "{e}");
        let cfg =
            SweepConfig::parse(&format!("layer = true\nrecompute = \"mlp\"\n{grid}")).unwrap();
        assert!(cfg.settings_tag().ends_with(";layer=true;recompute=mlp"));
        // Without it, the tag (and every earlier sweep's cell names) is unchanged.
        let cfg = SweepConfig::parse(&format!("layer = true\n{grid}")).unwrap();
        assert!(cfg.settings_tag().ends_with(";layer=true"));
    }

    #[test]
    fn a_memory_table_needs_the_layer_a_modelled_setting_and_names_its_cells() {
        let grid = "[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]\n";
        let parse = |top: &str, memory: &str| {
            SweepConfig::parse(&format!("{top}\n[memory]\n{memory}\n{grid}"))
                .map_err(|e| e.to_string())
        };
        let e = parse("", "zero = 1").unwrap_err();
        assert!(e.contains("needs layer = true"), "{e}");
        let e = parse("layer = true", "zero = 4").unwrap_err();
        assert!(e.contains("[memory]") && e.contains("stage 4"), "{e}");
        let e = parse("layer = true", "zeros = 1").unwrap_err();
        assert!(e.contains("zeros"), "{e}");
        // Defaults: Megatron's distributed optimizer, one replica, one stage.
        let cfg = parse("layer = true", "").unwrap();
        assert_eq!(
            cfg.memory.unwrap().training().unwrap(),
            crate::footprint::Training::default()
        );
        assert!(cfg
            .settings_tag()
            .ends_with(";layer=true;memory=zero1,dp1,pp1"));
        let cfg = parse("layer = true", "zero = 2\ndp = 4\npp = 2").unwrap();
        assert!(cfg.settings_tag().ends_with(";memory=zero2,dp4,pp2"));
        // Hybrid sharding names its group; spanning every replica is the default.
        let cfg = parse("layer = true", "zero = 3\ndp = 4\nshard_dp = 2").unwrap();
        assert!(cfg.settings_tag().ends_with(";memory=zero3,dp4,pp1,shard2"));
        assert_eq!(cfg.memory.unwrap().training().unwrap().shard_ranks(8), 16);
        // Regression (bug hunt): `shard_dp = dp`, the default, named other cells.
        let all = parse("layer = true", "zero = 3\ndp = 4\nshard_dp = 4").unwrap();
        assert!(all.settings_tag().ends_with(";memory=zero3,dp4,pp1"));
        let e = parse("layer = true", "zero = 3\ndp = 4\nshard_dp = 3").unwrap_err();
        // Said with the table's keys, not the command line's flags.
        assert!(e.contains("shard_dp = 3 must divide dp = 4"), "{e}");
        let e = parse("layer = true", "pp = 0").unwrap_err();
        assert!(e.contains("pp = 0: pipeline stages must be 1"), "{e}");
        // A priced step names its cells; without one, earlier sweeps' names are unchanged.
        let cfg = parse(
            "layer = true",
            "pp = 2\nmicro_batches = 8\ndp_overlap = true",
        )
        .unwrap();
        assert!(cfg
            .settings_tag()
            .ends_with(";memory=zero1,dp1,pp2,step8,dpoverlap"));
        assert_eq!(
            cfg.memory.unwrap().step().unwrap().unwrap().micro_batches,
            8
        );
        let e = parse("layer = true", "pp = 4\nmicro_batches = 2").unwrap_err();
        assert!(
            e.contains("micro_batches = 2 is fewer than the 4 pipeline stages"),
            "{e}"
        );
        // Interleaved stages name their cells; one chunk is the default, the same cells.
        let cfg = parse("layer = true", "pp = 2\nvp = 2\nmicro_batches = 4").unwrap();
        assert!(cfg
            .settings_tag()
            .ends_with(";memory=zero1,dp1,pp2,vp2,step4"));
        assert_eq!(cfg.memory.unwrap().training().unwrap().vp, 2);
        let one = parse("layer = true", "pp = 2\nvp = 1").unwrap();
        assert!(one.settings_tag().ends_with(";memory=zero1,dp1,pp2"));
        let e = parse("layer = true", "pp = 4\nvp = 2\nmicro_batches = 6").unwrap_err();
        assert!(e.contains("micro_batches = 6 is not a multiple"), "{e}");
        assert!(e.contains("(vp = 2)"), "{e}");
        let e = parse("layer = true", "vp = 2").unwrap_err();
        assert!(e.contains("vp = 2 interleaves"), "{e}");
        // Several steps name their cells and need the step's windows, every one.
        let cfg = parse(
            "batches = 12\nlayer = true",
            "dp = 2\nmicro_batches = 2\nsteps = 3",
        )
        .unwrap();
        assert!(cfg.settings_tag().ends_with(",step2,steps3"));
        let one = parse(
            "batches = 4\nlayer = true",
            "dp = 2\nmicro_batches = 2\nsteps = 1",
        )
        .unwrap();
        assert!(one.settings_tag().ends_with(",step2"));
        let e = parse("batches = 12\nlayer = true", "steps = 3").unwrap_err();
        assert!(
            e.contains("steps = 3 prices training steps: it needs micro_batches"),
            "{e}"
        );
        let e = parse(
            "batches = 10\nlayer = true",
            "dp = 2\nmicro_batches = 2\nsteps = 3",
        )
        .unwrap_err();
        assert!(e.contains("it needs batches = 12 (now 10)"), "{e}");
        let e = parse("batches = 4\nlayer = true", "micro_batches = 4\nsteps = 0").unwrap_err();
        assert!(e.contains("steps = 0: must be at least 1"), "{e}");
        // Regression (bug hunt): the product wrapped round to `batches` and passed.
        let e = parse(
            "batches = 4\nlayer = true",
            "micro_batches = 11162\ndp = 769546\nsteps = 2147549185",
        )
        .unwrap_err();
        assert!(e.contains("it needs batches = "), "{e}");
        let e = parse("layer = true", "dp_overlap = true").unwrap_err();
        assert!(e.contains("needs micro_batches"), "{e}");
        let e = parse("layer = true\npass = \"fwd\"", "micro_batches = 4").unwrap_err();
        assert!(e.contains("pass = \"both\""), "{e}");
    }

    /// Regression (bug hunt): a stdin trace hashed as 0, so a rerun with other data reused
    /// the old cells.
    #[test]
    fn a_trace_that_cannot_be_read_twice_is_refused() {
        for t in ["-", "/dev/null"] {
            let e = SweepConfig::parse(&format!(
                "[grid]\ntraces=[\"{t}\"]\nschemes=[\"ring\"]\nranks=[2]\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("not a regular file"), "{t}: {e}");
        }
    }

    #[test]
    fn window_packing_derives_tokens_per_rank() {
        let cfg = SweepConfig::parse(
            r#"
            pack = "window"
            [grid]
            traces = ["default"]
            schemes = ["zigzag"]
            ranks = [8]
            context = [65536, 131072]
        "#,
        )
        .unwrap();
        let tprs: Vec<_> = cfg.cells().iter().map(|c| c.tokens_per_rank).collect();
        assert_eq!(tprs, [8192, 16384]);
    }

    /// `pack = "wlb"` packs each window of `grid.context` with WLB's settings: the `[wlb]`
    /// table's, else the step's group and the defaults for the window, as the command line
    /// fills them in. The settings given name the cells.
    #[test]
    fn wlb_packing_takes_its_settings_from_the_table_then_the_step() {
        let grid = "[grid]\ntraces=[\"default\"]\nschemes=[\"zigzag\"]\nranks=[8]\n";
        let parse = |text: String| SweepConfig::parse(&text).map_err(|e| e.to_string());
        let cfg = parse(format!("pack = \"wlb\"\n{grid}context = [65536]")).unwrap();
        let wlb = |cfg: &SweepConfig, c| match cfg.pack_mode(Some(c), Some(1000)).unwrap() {
            PackMode::Wlb(p) => p,
            m => panic!("{m:?}"),
        };
        let p = wlb(&cfg, 65536);
        assert_eq!((p.group, p.max_len, p.outlier), (8, 131072, 32768));
        assert_eq!(p.breakpoint, Some(1000));
        // Per-rank tokens: the share of the longest micro-batch.
        assert_eq!(cfg.cells()[0].tokens_per_rank, 16384);
        assert!(cfg.settings_tag().contains(";pack=wlb"));
        assert!(!cfg.settings_tag().contains(";wlb="));
        // A priced step sets the group: its micro-batches on every replica.
        let cfg = parse(format!(
            "pack = \"wlb\"\nlayer = true\n[memory]\ndp = 2\nmicro_batches = 3\n{grid}context = [65536]"
        ))
        .unwrap();
        assert_eq!(wlb(&cfg, 65536).group, 6);
        // The table's settings win, and name the cells.
        let cfg = parse(format!(
            "pack = \"wlb\"\n[wlb]\ngroup = 4\nmax_len = 65536\nbreakpoint = 7\n{grid}context = [65536]"
        ))
        .unwrap();
        let p = wlb(&cfg, 65536);
        assert_eq!((p.group, p.max_len, p.breakpoint), (4, 65536, Some(7)));
        assert_eq!(cfg.cells()[0].tokens_per_rank, 8192);
        assert!(cfg
            .settings_tag()
            .ends_with(";pack=wlb;wlb=group4,max_len65536,breakpoint7"));
        // Refused: a table without WLB packing, WLB without windows, a limit under a
        // window, an unknown key, a zero.
        for (text, says) in [
            (
                format!("[wlb]\ngroup = 4\n{grid}"),
                "[wlb] sets WLB packing: it needs pack = \"wlb\", not \"budget\"",
            ),
            (
                format!("pack = \"wlb\"\n{grid}"),
                "pack = \"wlb\" needs grid.context",
            ),
            (
                format!("pack = \"wlb\"\n[wlb]\nmax_len = 65536\n{grid}context = [32768, 131072]"),
                "grid.context 131072: WLB packing: a micro-batch limit of 65536 tokens is shorter",
            ),
            (
                format!("pack = \"wlb\"\n[wlb]\ngrup = 4\n{grid}context = [65536]"),
                "grup",
            ),
            (
                format!("pack = \"wlb\"\n[wlb]\noutlier = 0\n{grid}context = [65536]"),
                "[wlb] outlier = 0: must be at least 1",
            ),
            (
                format!("pack = \"wlb\"\n[wlb]\ngroup = 65537\n{grid}context = [65536]"),
                "[wlb] group = 65537 is more than the 65536",
            ),
            (
                format!(
                    "pack = \"wlb\"\nlayer = true\n[memory]\nmicro_batches = 65536\ndp = 2\n{grid}context = [65536]"
                ),
                "131072 micro-batches a step ([memory] micro_batches × dp; [wlb] group sets fewer)",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn bad_configs_say_what_to_fix() {
        let e = SweepConfig::parse("[grid]\ntraces=[]\nschemes=[\"ring\"]\nranks=[2]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("grid.traces"), "{e}");
        let e = SweepConfig::parse(
            "pack=\"window\"\n[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("grid.context"), "{e}");
        let e = SweepConfig::parse(
            "[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]\nrank=[3]",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field"), "{e}");
        let e = SweepConfig::parse(
            "[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[8, 70000]",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("grid.ranks 70000"), "{e}");
    }

    /// Regression (user report): `ranks = [4, 8, 4]` ran every cell of 4 ranks twice (two
    /// result rows, one `cells/` file). Every axis refuses a repeated value, naming it.
    #[test]
    fn a_value_listed_twice_in_a_sweep_axis_is_refused() {
        let base = "[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]\n";
        for (line, want) in [
            ("ranks=[4, 8, 4]", "grid.ranks lists 4 twice"),
            (
                "schemes=[\"ring\", \"fcp\", \"ring\"]",
                "grid.schemes lists `ring` twice",
            ),
            (
                "schemes=[\"fcp:block=2048,coalesce=8\", \"fcp:coalesce=8,block=2048\"]",
                "grid.schemes `fcp:block=2048,coalesce=8` and `fcp:coalesce=8,block=2048` plan alike (the same scheme and parameters); list it once",
            ),
            (
                "schemes=[\"fcp\", \"fcp:block=4096\"]\nblock=[4096, 8192]",
                "grid.schemes `fcp` and `fcp:block=4096` plan alike (the same scheme and parameters at a grid.block size); list it once",
            ),
            (
                "traces=[\"default\", \"default\"]",
                "grid.traces lists `default` twice",
            ),
            (
                "tokens_per_rank=[512, 512]",
                "grid.tokens_per_rank lists 512 twice",
            ),
            ("block=[64, 128, 64]", "grid.block lists 64 twice"),
            (
                "model=[\"mha-16\", \"mha-16\"]",
                "grid.model lists `mha-16` twice",
            ),
            (
                "hardware=[\"h100\", \"h100\"]",
                "grid.hardware lists `h100` twice",
            ),
        ] {
            let key = line.split('=').next().unwrap();
            let text: String = base
                .lines()
                .filter(|l| !l.starts_with(&format!("{key}=")))
                .chain([line])
                .collect::<Vec<_>>()
                .join("\n");
            let e = SweepConfig::parse(&text).unwrap_err().to_string();
            assert_eq!(e, want, "{text}");
        }
        let e = SweepConfig::parse(
            "pack=\"window\"\n[grid]\ntraces=[\"default\"]\nschemes=[\"ring\"]\nranks=[2]\ncontext=[4096, 4096]",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "grid.context lists 4096 twice");
    }

    /// Every sweep config shipped in `configs/studies/` parses and names cells (the dpcp ones
    /// are another command's, `fcp dpcp`).
    #[test]
    fn every_bundled_study_config_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/studies");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".toml") || name.contains("dpcp") {
                continue;
            }
            let cfg = SweepConfig::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!cfg.cells().is_empty(), "{name}");
            read += 1;
        }
        assert!(read >= 7, "{read}");
    }
}
