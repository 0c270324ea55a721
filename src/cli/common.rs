//! Arguments and loading steps shared by several commands.

use fcp::hardware::spec::split_overrides;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use fcp::hardware::Hardware;
use fcp::plan::Mask;
use fcp::trace::{pack_from, Batch, Trace};
use fcp::Model;

use super::trace::{PackArgs, WlbHints};

/// Where the batches come from and how the CP group is shaped.
#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    /// Trace file (CSV with a `doc_len` column, or JSONL with `doc_lens`; `-` for stdin), or
    /// a generated trace as a sweep names one (`gen:exponential:mean=1024,seed=1`,
    /// docs/studies.md). Defaults to the bundled trace.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// CP group size N.
    #[arg(long)]
    pub ranks: u32,
    /// Tokens per rank. Budget and carry packing: a batch holds ranks × this many tokens
    /// (default 32768, the FCP paper's setting, §6.1). Window packing: the per-rank token cap
    /// memory-capped schemes (fcp, hybrid) plan under (default and least: the window split
    /// evenly over the ranks, as `fcp sweep` derives it).
    #[arg(long)]
    pub tokens_per_rank: Option<u64>,
    #[command(flatten)]
    pub pack: PackArgs,
    /// Mask inside each document.
    #[arg(long, value_enum, default_value_t = MaskArg::Causal)]
    pub mask: MaskArg,
}

/// Hardware and model selection.
#[derive(Debug, Clone, Args)]
pub struct ProfileArgs {
    /// Hardware profile: a bundled name (h100, h200, b200) or a TOML file.
    #[arg(long, default_value = "h100")]
    pub hardware: String,
    /// Model preset (llama3-70b, llama3-8b, mha-16, mha-32) or a TOML file.
    #[arg(long, default_value = "llama3-70b")]
    pub model: String,
    /// Tensor-parallel degree: each CP rank is a group of this many GPUs in one node
    /// splitting the heads and the MLP (Megatron, with sequence parallelism). The plan is one
    /// GPU's share; where a command takes `--layer`, it adds the TP collectives.
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
}

/// Hardware and model for a command that reads a plan: by default the ones the plan was made
/// for. (Defaulting to h100 / llama3-70b instead simulated a B200 plan on an H100 without a
/// word, and refused a llama3-8b plan with advice to plan it again.)
#[derive(Debug, Clone, Args)]
pub struct PlanProfileArgs {
    /// Hardware profile: a bundled name (h100, h200, b200) or a TOML file. Defaults to the one
    /// the plan was made for (its `hardware` field), h100 when it names none.
    #[arg(long)]
    pub hardware: Option<String>,
    /// Model preset (llama3-70b, llama3-8b, mha-16, mha-32) or a TOML file. Defaults to the one
    /// the plan was made for (its `model` field), llama3-70b when it names none.
    #[arg(long)]
    pub model: Option<String>,
}

impl PlanProfileArgs {
    /// Load both profiles for `plan`, saying on stderr when a flag overrides what the plan
    /// records, and split them as the plan's `tp` says ([`fcp::tp::split`]).
    pub fn load(&self, plan: &fcp::plan::Plan) -> Result<(Hardware, Model)> {
        let hw_record = Recorded {
            kind: "hardware",
            name: plan.hardware.as_deref(),
            file: plan.hardware_file.as_deref(),
        };
        let model_record = Recorded {
            kind: "model",
            name: plan.model.as_deref(),
            file: plan.model_file.as_deref(),
        };
        let hw_name = hw_record.pick(
            self.hardware.as_deref(),
            "h100",
            fcp::hardware::bundled::HARDWARE,
        )?;
        let model_name = model_record.pick(
            self.model.as_deref(),
            "llama3-70b",
            fcp::hardware::bundled::MODELS,
        )?;
        let hw = Hardware::load(&hw_name)?;
        let model = Model::load(&model_name)?;
        hw_record.note(&hw_name, &hw.name);
        model_record.note(&model_name, &model.name);
        // The plan's heads are one GPU's share under its `tp`: split the model the same way
        // (there is no other split its heads fit).
        let tp = plan.tp.unwrap_or(1);
        fcp::tp::split(&hw, &model, tp)
            .with_context(|| format!("the plan records `tp` {tp} (made with `--tp {tp}`)"))
    }
}

/// What a plan records of one of its profiles.
struct Recorded<'a> {
    kind: &'static str,
    name: Option<&'a str>,
    file: Option<&'a str>,
}

impl Recorded<'_> {
    /// The profile to load: the flag, else the plan's record when it names a bundled profile
    /// (and was not read from a file of that name), else the default.
    fn pick(&self, flag: Option<&str>, default: &str, bundled: &[(&str, &str)]) -> Result<String> {
        let kind = self.kind;
        match (flag, self.name, self.file) {
            (Some(f), _, _) => Ok(f.to_string()),
            (None, Some(r), Some(file)) => bail!(
                "the plan was made for {kind} `{r}` read from the file {file}, not a bundled profile: pass --{kind} {file} again{}",
                if bundled.iter().any(|(n, _)| *n == split_overrides(r).0) {
                    format!(" (or --{kind} {r} for the bundled one)")
                } else {
                    String::new()
                }
            ),
            // A bundled profile with what-if overrides (`h100:nic_gbs=100`) reloads as made.
            (None, Some(r), None) if bundled.iter().any(|(n, _)| *n == split_overrides(r).0) => {
                Ok(r.to_string())
            }
            (None, Some(r), None) => bail!(
                "the plan was made for {kind} `{r}`, which is not bundled: pass --{kind} with its TOML file"
            ),
            (None, None, _) => Ok(default.to_string()),
        }
    }

    /// Say on stderr when the profile loaded (`arg`, named `used`) is not the one the plan
    /// was made for.
    fn note(&self, arg: &str, used: &str) {
        let kind = self.kind;
        let Some(r) = self.name else { return };
        let arg_is_file = fcp::hardware::spec::reads_file(arg);
        if r != used {
            eprintln!("note: the plan was made for {kind} `{r}`; using `{used}` as asked");
        } else if let (Some(file), false) = (self.file, arg_is_file) {
            eprintln!(
                "note: the plan was made for {kind} `{r}` read from {file}; using the bundled `{used}` as asked"
            );
        } else if arg_is_file && self.file.is_none() {
            // Bug hunt: a file of a bundled profile's name was taken for it without a word.
            eprintln!(
                "note: the plan was made for the bundled {kind} `{r}`; using {arg}, which has the same name, as asked"
            );
        } else if arg_is_file && self.file.is_some_and(|f| !same_spec(f, arg)) {
            // Bug hunt: two files of one `name` were taken for each other without a word.
            eprintln!(
                "note: the plan was made for {kind} `{r}` read from {}; using {arg}, which has the same name, as asked",
                self.file.unwrap_or_default()
            );
        }
    }
}

/// Whether two profile specs read the same file with the same what-if overrides (bug hunt:
/// `./lab.toml:nic_gbs=10` against `lab.toml:nic_gbs=10` was compared as written).
fn same_spec(a: &str, b: &str) -> bool {
    let (a, b) = (split_overrides(a), split_overrides(b));
    a.1 == b.1 && same_path(a.0, b.0)
}

/// Whether two paths name the same file (the same text, or the same file through links and
/// relative parts); a path that does not resolve is compared as written.
fn same_path(a: &str, b: &str) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Refuse an output path that names one of the inputs (the same file, through any path or
/// link): writing the output would destroy the input. Regression: `fcp plan --trace t.csv -o
/// t.csv` replaced the user's trace with the plan.
pub fn refuse_overwriting_input(
    output: &std::path::Path,
    inputs: &[&std::path::Path],
) -> Result<()> {
    let Ok(out) = std::fs::metadata(output) else {
        return Ok(()); // not there yet: nothing to destroy
    };
    if !out.is_file() {
        return Ok(()); // devices, pipes: writing them destroys nothing
    }
    for input in inputs {
        if let Ok(inp) = std::fs::metadata(input) {
            if same_file(&out, &inp) {
                bail!(
                    "the output {} is the input {}: writing it would destroy the input; choose another output",
                    output.display(),
                    input.display()
                );
            }
        }
    }
    Ok(())
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.len() == b.len()
        && a.modified().ok() == b.modified().ok()
        && a.created().ok() == b.created().ok()
}

/// Passes to simulate, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PassArg {
    /// Forward only (inference).
    Fwd,
    /// Backward only.
    Bwd,
    /// Forward and backward (training).
    Both,
}

impl From<PassArg> for fcp::sim::PassSel {
    fn from(p: PassArg) -> Self {
        match p {
            PassArg::Fwd => fcp::sim::PassSel::Fwd,
            PassArg::Bwd => fcp::sim::PassSel::Bwd,
            PassArg::Both => fcp::sim::PassSel::Both,
        }
    }
}

/// Activation recomputation as a command-line value (`--recompute`, with `--layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecomputeArg {
    /// Keep every activation the backward pass reads.
    None,
    /// Drop the MLP's wide tensors; the backward pass reruns the MLP's forward GEMMs.
    Mlp,
    /// Keep each layer's input alone; the backward pass reruns the layer's forward pass.
    Full,
}

impl From<RecomputeArg> for fcp::model::Recompute {
    fn from(r: RecomputeArg) -> Self {
        match r {
            RecomputeArg::None => fcp::model::Recompute::None,
            RecomputeArg::Mlp => fcp::model::Recompute::Mlp,
            RecomputeArg::Full => fcp::model::Recompute::Full,
        }
    }
}

/// How a training step holds its model state, for the GPU-memory count (`fcp tpcp` always
/// counts it; `simulate` and `compare` with `--memory`).
#[derive(Debug, Clone, Args)]
pub struct TrainingArgs {
    /// ZeRO stage of the model state: 0 replicated, 1 optimizer state sharded (Megatron's
    /// distributed optimizer; the default), 2 gradients sharded too, 3 weights too (FSDP's
    /// full sharding: every pass gathers its layer's weights, which the simulator times).
    /// Sharded state spreads over the data-parallel replicas' CP ranks (dp × CP GPUs).
    #[arg(long)]
    zero: Option<u8>,
    /// Data-parallel replicas of the TP × CP group (default 1): more replicas spread sharded
    /// state thinner.
    #[arg(long)]
    dp: Option<u32>,
    /// Pipeline stages the layers are split over (default 1, Megatron's 1F1B schedule; must
    /// divide the model's layers): each holds its share of the layers' state, while the first
    /// still keeps every layer's worth of activations in flight.
    #[arg(long)]
    pp: Option<u32>,
    /// With --pp: each pipeline stage holds this many chunks of layers, interleaved
    /// (Megatron's virtual pipeline stages, --num-virtual-stages-per-pipeline-rank; default
    /// 1). The bubble shrinks that many times, for as many times the sends and more
    /// activations in flight; micro-batches must be a multiple of --pp.
    #[arg(long)]
    vp: Option<u32>,
    /// Hybrid sharding (FSDP's HSDP, DeepSpeed's MiCS): shard the state over this many of the
    /// --dp replicas (a divisor; default all of them) and replicate it across the groups.
    /// Less sharding, but ZeRO 3's per-layer gathers stay in a smaller group (in one node
    /// while it fits).
    #[arg(long)]
    shard_dp: Option<u32>,
}

impl TrainingArgs {
    /// Whether any of `--zero`, `--dp`, `--pp`, `--vp`, `--shard-dp` was given.
    pub fn given(&self) -> bool {
        self.zero.is_some()
            || self.dp.is_some()
            || self.pp.is_some()
            || self.vp.is_some()
            || self.shard_dp.is_some()
    }

    /// The setting, Megatron's distributed optimizer over one replica unless told otherwise.
    pub fn training(&self) -> Result<fcp::footprint::Training> {
        let d = fcp::footprint::Training::default();
        let t = fcp::footprint::Training::new(
            self.zero.unwrap_or(d.zero),
            self.dp.unwrap_or(d.dp),
            self.pp.unwrap_or(d.pp),
        )?
        .with_virtual_stages(self.vp.unwrap_or(d.vp))?;
        Ok(match self.shard_dp {
            Some(s) => t.with_shard_dp(s)?,
            None => t,
        })
    }

    /// The setting when `memory` asks for the count; an error when `--zero` or `--dp` is
    /// given without it (they would change nothing).
    pub fn when(&self, memory: bool) -> Result<Option<fcp::footprint::Training>> {
        if !memory {
            if let Some(flag) = [
                ("--zero", self.zero.is_some()),
                ("--dp", self.dp.is_some()),
                ("--pp", self.pp.is_some()),
                ("--vp", self.vp.is_some()),
                ("--shard-dp", self.shard_dp.is_some()),
            ]
            .into_iter()
            .find_map(|(f, given)| given.then_some(f))
            {
                bail!("{flag} sets how the GPU-memory count holds model state: it needs --memory");
            }
            return Ok(None);
        }
        self.training().map(Some)
    }
}

/// `sim` counting each GPU's memory over a training step under `training`, when given, of
/// `step`'s micro-batches when one is priced.
pub fn memory_sim(
    sim: fcp::sim::Simulator,
    training: Option<fcp::footprint::Training>,
    step: Option<fcp::sim::step::StepOptions>,
) -> Result<fcp::sim::Simulator> {
    optimizer_note(sim.hardware(), step.is_some());
    Ok(match training {
        Some(t) => sim.with_training(t.with_micro_batches(step.map(|s| s.micro_batches)))?,
        None => sim,
    })
}

/// When a training step is priced on hardware that gives no memory bandwidth, say that its
/// optimizer step is left out (a profile written before `hbm_gbs` existed prices the rest as
/// it did). Said once a process.
pub fn optimizer_note(hw: &fcp::hardware::Hardware, stepped: bool) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if stepped && hw.hbm_gbs.is_none() {
        SAID.call_once(|| {
            eprintln!(
                "note: hardware {} gives no `hbm_gbs`: the training step leaves out the optimizer step (docs/hardware.md)",
                hw.name
            )
        });
    }
}

/// One line on what the fullest GPU holds: its total against the GPU's memory, the verdict,
/// and the parts.
pub fn footprint_words(f: &fcp::footprint::Footprint, cp: u32) -> String {
    use fcp::report::human_bytes;
    let verdict = match (f.hbm_bytes, f.fits) {
        (Some(h), Some(fits)) => {
            let share = f.hbm_fraction().unwrap_or(0.0);
            format!(
                " of {} ({} GB HBM, {:.1}%): {}",
                human_bytes(h),
                h as f64 / 1e9,
                100.0 * share,
                match (fits, share > TIGHT) {
                    (false, _) => "does NOT fit",
                    (true, true) => "fits, tightly: the CUDA context, NCCL buffers and fragmentation are not counted",
                    (true, false) => "fits",
                }
            )
        }
        _ => " (the hardware profile gives no hbm_gb to check it against)".to_string(),
    };
    let stage = if f.training.pp > 1 {
        format!(", pipeline stage {} of {}", f.stage + 1, f.training.pp)
    } else {
        String::new()
    };
    let chunk = f.layers / f.training.vp.max(1);
    let layers = if f.training.vp > 1 {
        format!(
            "{} layers' worth: {} of {} in flight",
            f.activation_layers,
            plural(f.activation_layers / chunk.max(1), "chunk", "chunks"),
            plural(chunk, "layer", "layers")
        )
    } else if f.activation_layers != f.layers {
        format!(
            "{} layers' worth: {} in flight × {}",
            f.activation_layers,
            plural(
                f.activation_layers / f.layers.max(1),
                "micro-batch",
                "micro-batches"
            ),
            plural(f.layers, "layer", "layers")
        )
    } else {
        plural(f.layers, "layer", "layers")
    };
    let sharding = match f.training.zero {
        0 => "ZeRO 0: all replicated".to_string(),
        z if u64::from(f.training.shard_replicas()) * u64::from(cp) <= 1 => {
            format!("ZeRO {z} on one GPU: nothing to shard")
        }
        1 | 2 => format!(
            "ZeRO {}: {} sharded over {}",
            f.training.zero,
            if f.training.zero == 2 {
                "gradients and optimizer"
            } else {
                "optimizer"
            },
            shard_words(f, cp)
        ),
        z => format!(
            "ZeRO {z}: all sharded over {}, gathered {} at a time",
            shard_words(f, cp),
            human_bytes(f.gathered_bytes)
        ),
    };
    format!(
        "GPU memory, training step: {}{verdict} · rank {}{stage} · weights {}, gradients {}, optimizer {} ({sharding}) · activations {} ({layers}) · transient {}",
        human_bytes(f.total_bytes),
        f.rank,
        human_bytes(f.weight_bytes),
        human_bytes(f.grad_bytes),
        human_bytes(f.optimizer_bytes),
        human_bytes(f.activation_bytes),
        human_bytes(f.transient_bytes),
    )
}

/// The GPUs a footprint's state is sharded over: `DP d × CP c`, or under hybrid sharding
/// `DP s of d × CP c (replicated over d/s groups)`.
fn shard_words(f: &fcp::footprint::Footprint, cp: u32) -> String {
    match f.training.shard_dp {
        Some(s) => format!(
            "DP {s} of {} × CP {cp} (replicated over {} groups)",
            f.training.dp,
            f.training.dp / s.max(1)
        ),
        None => format!("DP {} × CP {cp}", f.training.dp),
    }
}

/// One line on ZeRO 3's per-layer collectives: which ran (`backward`: a backward pass was
/// simulated, so the gradients' reduce-scatter too), their time, what the layer's work left
/// exposed and, when something was, what would hide it: sharding within fewer replicas only
/// where the shards span more than one (`shard_replicas`), and said the way `hybrid`
/// (`--shard-dp` given) or not sets it.
pub fn zero3_words(
    comm_ms: f64,
    exposed_ms: f64,
    backward: bool,
    shard_replicas: u32,
    hybrid: bool,
) -> String {
    let fewer = match (shard_replicas > 1, hybrid) {
        (false, _) => None,
        (true, true) => Some("a smaller --shard-dp"),
        (true, false) => Some("sharding within fewer replicas (--shard-dp)"),
    };
    let remedies = [
        fewer,
        Some("more tokens per GPU"),
        Some("--zero 2 (unsharded weights)"),
    ];
    let remedies: Vec<&str> = remedies.into_iter().flatten().collect();
    let remedies = match remedies.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => remedies.concat(),
    };
    format!(
        "ZeRO 3: weight all-gathers{} {comm_ms:.3} ms per layer, prefetched under its work; {exposed_ms:.3} ms exposed{}",
        if backward {
            " and gradient reduce-scatter"
        } else {
            ""
        },
        if exposed_ms > 0.0 {
            format!(
                " (the layer waits for its weights: {remedies} would hide them)"
            )
        } else {
            String::new()
        }
    )
}

/// Above this share of the GPU's memory a step that fits is called tight: what the count
/// leaves out (docs/cost-model.md § GPU memory) takes a few GB.
const TIGHT: f64 = 0.9;

/// A training step around the layer: its micro-batches, and whether data parallelism's
/// collectives overlap it.
#[derive(Debug, Clone, Args)]
pub struct StepArgs {
    /// Also price a training step of this many micro-batches (windows) per pipeline: the
    /// pipeline's bubble and the data-parallel gradient reduction and weight gather, once a
    /// step (docs/cost-model.md § Training step). At least --pp; `simulate` needs --layer
    /// --memory for it.
    #[arg(long)]
    micro_batches: Option<u32>,
    /// With --micro-batches: the gradients' reduction overlaps the last micro-batch's backward
    /// pass and the weights' gather the first one's forward pass (Megatron's
    /// --overlap-grad-reduce and --overlap-param-gather). Without it both add to the step.
    #[arg(long)]
    dp_overlap: bool,
}

impl StepArgs {
    /// The step to price under `training`, if --micro-batches asks for one.
    pub fn step(
        &self,
        training: fcp::footprint::Training,
    ) -> Result<Option<fcp::sim::step::StepOptions>> {
        match self.micro_batches {
            Some(m) => Ok(Some(fcp::sim::step::StepOptions::new(
                m,
                self.dp_overlap,
                training,
            )?)),
            None if self.dp_overlap => {
                bail!(
                    "--dp-overlap overlaps a training step's collectives: it needs --micro-batches"
                )
            }
            None => Ok(None),
        }
    }
}

/// The levers of a priced step that change nothing but its time: the order each replica
/// runs its micro-batches in and how the windows are dealt to the replicas.
#[derive(Debug, Clone, Args)]
pub struct LeverArgs {
    /// With --micro-batches: the order each replica runs its micro-batches in. `stream` as
    /// the data arrives; `hill` lightest at both ends and heaviest in the middle, each next
    /// to the ones most like it, which usually stalls a 1F1B pipeline less; `tpcp`'s answer
    /// says when the other order is faster (docs/cost-model.md § Training step).
    #[arg(long, value_enum, requires = "micro_batches")]
    micro_batch_order: Option<OrderArg>,
    /// With --micro-batches: how the step's DP × M windows are dealt to the --dp replicas.
    /// `stream` gives replica r windows r·M … r·M + M − 1; `lpt` gives the heaviest window to
    /// the replica with least work and room left, so fewer replicas wait for the slowest.
    #[arg(long, value_enum, requires = "micro_batches")]
    deal: Option<DealArg>,
}

impl LeverArgs {
    /// A note for each lever pulled that changes nothing under `training` (no pipeline to
    /// order, no replicas to deal to); said once the study ran, with its other notes.
    pub fn notes(&self, training: fcp::footprint::Training) {
        if self.micro_batch_order == Some(OrderArg::Hill) && training.pp == 1 {
            eprintln!("note: --micro-batch-order hill changes nothing without a pipeline (--pp 1): one stage runs its micro-batches back to back in any order");
        }
        if self.deal == Some(DealArg::Lpt) && training.dp == 1 {
            eprintln!(
                "note: --deal lpt changes nothing with one replica (--dp 1): it trains the whole step"
            );
        }
    }

    /// `step` with these levers pulled, under `training`.
    pub fn apply(
        &self,
        step: Option<fcp::sim::step::StepOptions>,
        training: fcp::footprint::Training,
    ) -> Result<Option<fcp::sim::step::StepOptions>> {
        use fcp::sim::step::{Deal, MicroBatchOrder};
        let Some(s) = step else {
            return Ok(None);
        };
        let order = match self.micro_batch_order {
            Some(OrderArg::Hill) => MicroBatchOrder::Hill,
            _ => MicroBatchOrder::Stream,
        };
        let deal = match self.deal {
            Some(DealArg::Lpt) => Deal::Lpt,
            _ => Deal::Stream,
        };
        Ok(Some(s.with_order(order).with_deal(deal, training)?))
    }
}

/// `--micro-batch-order`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OrderArg {
    Stream,
    Hill,
}

/// `--deal`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DealArg {
    Stream,
    Lpt,
}

/// What a priced step spends besides its micro-batches' layers: the pipeline's bubble (when
/// there is one), the data-parallel collectives, or why there are none once a step, and the
/// optimizer step.
pub fn step_parts(s: &fcp::sim::step::StepMetrics, zero3: bool) -> String {
    // Micro-batches of unequal lengths stall the pipeline beyond filling and draining it.
    let bubble = if s.bubble_ms > 0.0 {
        let mut parts = vec![if s.stall_ms >= 0.05 {
            format!(
                "filling and draining it, and {:.1} ms of stalls behind unequal micro-batches",
                s.stall_ms
            )
        } else {
            "filling and draining it".to_string()
        }];
        if s.pp_send_ms > 0.0 {
            parts.push(format!("{:.2} ms a send between stages", s.pp_send_ms));
        }
        format!(
            "{:.1} ms of the step the pipeline's bubble ({}); ",
            s.bubble_ms,
            parts.join(", ")
        )
    } else {
        String::new()
    };
    let wait = if s.dp_wait_ms >= 0.05 {
        format!(
            "; replicas wait {:.1} ms on the mean for the slowest",
            s.dp_wait_ms
        )
    } else {
        String::new()
    };
    let dp = if s.dp_comm_ms > 0.0 {
        format!(
            "data-parallel collectives {:.1} ms a step, {:.1} ms of them exposed{}",
            s.dp_comm_ms,
            s.dp_exposed_ms,
            if s.dp_overlap {
                " (overlapping the first and last micro-batch)"
            } else {
                " (--dp-overlap overlaps them)"
            }
        )
    } else if zero3 {
        "no data-parallel collectives once a step: ZeRO 3 runs them layer by layer, in the layer's time".to_string()
    } else {
        "no data-parallel collectives: no other GPU holds these weights".to_string()
    };
    let head = if s.output_layer_ms > 0.0 {
        format!(
            "the output layer {:.1} ms a micro-batch on the last stage; ",
            s.output_layer_ms
        )
    } else {
        String::new()
    };
    let optimizer = if s.optimizer_ms > 0.0 {
        format!(
            "; the optimizer step {:.1} ms (Adam over the GPU's share of the parameters at the HBM bandwidth)",
            s.optimizer_ms
        )
    } else {
        String::new()
    };
    format!("{head}{bubble}{dp}{wait}{optimizer}")
}

/// The note when a step draws `needed` micro-batches (`per` on each of `dp` replicas) from
/// `drawn` simulated windows or batches (`what`: their name, singular and plural), fewer than
/// it needs: they repeat, in turn. `advice` says how to give each its own.
pub fn repeats_note(
    needed: u64,
    per: u32,
    dp: u32,
    drawn: usize,
    what: (&str, &str),
    advice: &str,
) {
    eprintln!(
        "note: a step trains {needed} {}{} and they are drawn in turn from {}: {advice}",
        if needed == 1 {
            "micro-batch"
        } else {
            "micro-batches"
        },
        if dp > 1 {
            format!(" ({per} on each of {dp} replicas)")
        } else {
            String::new()
        },
        plural(drawn as u32, what.0, what.1),
    );
}

/// Under `--pack wlb` the trace's micro-batches come `group` to a WLB step from its start:
/// say when the steps priced (`per` windows from batch `from`) are not those steps, so a
/// priced step is not read as one WLB balanced.
pub fn wlb_alignment_note(group: usize, per: usize, from: usize) {
    if group != per {
        eprintln!("note: WLB packing balanced steps of {group} micro-batches (--wlb-group), the steps priced have {per} (--micro-batches × --dp): they are not WLB's steps");
    } else if from % group != 0 {
        eprintln!("note: --from-batch {from} is not a multiple of WLB's {group} micro-batches a step: each step priced straddles two of WLB's");
    }
}

/// The note when `--dp-overlap` overlaps nothing: `what` (a subject and its verb, "no split
/// runs") ran no data-parallel collectives once a step.
pub fn dp_overlap_idle_note(what: &str) {
    eprintln!("note: --dp-overlap changes nothing: {what} data-parallel collectives once a step (ZeRO 3 runs them per layer; one GPU per weight runs none)");
}

/// `fcp simulate`'s line for a priced step.
pub fn step_line(s: &fcp::sim::step::StepMetrics, zero3: bool) -> String {
    format!(
        "training step: {:.1} ms for {} of this batch, {} tokens/s per GPU · {} · {}",
        s.step_ms,
        plural(s.micro_batches, "micro-batch", "micro-batches"),
        rate(s.tokens_per_gpu_s),
        stage_words(s),
        step_parts(s, zero3)
    )
}

/// "L layers a stage", and the chunks they are interleaved in.
pub fn stage_words(s: &fcp::sim::step::StepMetrics) -> String {
    let layers = plural(s.stage_layers, "layer", "layers");
    if s.vp > 1 {
        format!(
            "{layers} a stage in {} interleaved chunks of {}",
            s.vp,
            plural(s.stage_layers / s.vp, "layer", "layers")
        )
    } else {
        format!("{layers} a stage")
    }
}

/// "1 micro-batch", "8 micro-batches".
pub fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub use fcp::report::rate;

/// ` · step of M micro-batches` (and whether DP's collectives overlap it) for report
/// headers, else nothing.
pub fn step_words(step: Option<fcp::sim::step::StepOptions>) -> String {
    use fcp::sim::step::{Deal, MicroBatchOrder};
    step.map_or(String::new(), |s| {
        format!(
            " · step of {}{}{}",
            plural(s.micro_batches, "micro-batch", "micro-batches"),
            match (s.order, s.deal) {
                (MicroBatchOrder::Stream, Deal::Stream) => "",
                (MicroBatchOrder::Hill, Deal::Stream) => " in hill order",
                (MicroBatchOrder::Stream, Deal::Lpt) => " dealt LPT",
                (MicroBatchOrder::Hill, Deal::Lpt) => " dealt LPT, in hill order",
            },
            if s.dp_overlap {
                ", DP collectives overlapped"
            } else {
                ""
            }
        )
    })
}

/// ` · memory ZeRO Z, DP D, PP P` for report headers when the GPU memory is counted.
pub fn memory_words(training: Option<fcp::footprint::Training>) -> String {
    training.map_or(String::new(), |t| {
        format!(
            " · memory ZeRO {}, DP {}, PP {}{}{}",
            t.zero,
            t.dp,
            t.pp,
            if t.vp > 1 {
                format!(" × {} chunks interleaved", t.vp)
            } else {
                String::new()
            },
            t.shard_dp
                .map_or(String::new(), |s| format!(", shards over DP {s}"))
        )
    })
}

/// ` · TP N` for report headers under tensor parallelism, else nothing.
pub fn tp_words(tp: u32) -> String {
    if tp > 1 {
        format!(" · TP {tp}")
    } else {
        String::new()
    }
}

/// `hardware / model` as report headers write them, with ` · TP N` under tensor parallelism.
pub fn profile_words(hw: &Hardware, model: &Model) -> String {
    format!("{} / {}{}", hw.name, model.name, tp_words(model.tp))
}

/// ` · TP collectives overlapped` for report headers when `--tp-overlap` changed anything
/// (a model split by TP), else nothing.
pub fn overlap_words(tp_overlap: bool, model: &Model) -> &'static str {
    if tp_overlap && model.tp > 1 {
        " · TP collectives overlapped"
    } else {
        ""
    }
}

/// " · recompute R" for a header or title when the backward pass recomputes, else nothing.
pub fn recompute_words(recompute: Option<RecomputeArg>) -> String {
    match recompute.map(fcp::model::Recompute::from) {
        None | Some(fcp::model::Recompute::None) => String::new(),
        Some(r) => format!(" · recompute {}", r.name()),
    }
}

/// How `auto` and `hybrid` judge plans under a command's flags: the passes, and — when the
/// command prices the whole layer (`layer`) — what it recomputes and whether TP collectives
/// overlap, so that they choose by what the command reports.
pub fn judge(
    pass: PassArg,
    layer: bool,
    recompute: Option<RecomputeArg>,
    tp_overlap: bool,
) -> fcp::planners::Judge {
    fcp::planners::Judge {
        pass: pass.into(),
        recompute: match (layer, recompute) {
            (true, Some(r)) => r.into(),
            _ => fcp::model::Recompute::None,
        },
        tp_overlap: layer && tp_overlap,
    }
}

/// `sim` with the whole layer on when `layer` says so, its backward pass recomputing as
/// `recompute` says (nothing when not given), its TP collectives overlapping their GEMMs when
/// `tp_overlap` says so.
pub fn layer_sim(
    sim: fcp::sim::Simulator,
    layer: bool,
    recompute: Option<RecomputeArg>,
    tp_overlap: bool,
) -> Result<fcp::sim::Simulator> {
    if !layer {
        return Ok(sim);
    }
    let sim = sim.with_recompute(recompute.map_or(fcp::model::Recompute::None, Into::into))?;
    if tp_overlap && sim.model().tp <= 1 {
        eprintln!("note: --tp-overlap changes nothing without tensor parallelism (--tp 1)");
    }
    Ok(sim.with_tp_overlap(tp_overlap))
}

/// Mask as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MaskArg {
    /// Causal inside each document.
    Causal,
    /// Full (bidirectional) inside each document.
    Full,
}

impl From<MaskArg> for Mask {
    fn from(m: MaskArg) -> Mask {
        match m {
            MaskArg::Causal => Mask::Causal,
            MaskArg::Full => Mask::Full,
        }
    }
}

impl ProfileArgs {
    /// Load both profiles, split for `--tp` ([`fcp::tp::split`]).
    pub fn load(&self) -> Result<(Hardware, Model)> {
        let hw = Hardware::load(&self.hardware)?;
        let model = Model::load(&self.model)?;
        Ok(fcp::tp::split(&hw, &model, self.tp)?)
    }

    /// Record in `plan` the files its profiles were read from (none for bundled ones), so
    /// that commands reading the plan do not take a bundled profile that shares the file's
    /// name. Regression: a plan made with `--hardware cluster/h100.toml` simulated on the
    /// bundled h100 without a word (2.5 ms instead of 460 ms).
    pub fn record_files(&self, plan: &mut fcp::plan::Plan) {
        let file = |arg: &str| fcp::hardware::spec::reads_file(arg).then(|| arg.to_string());
        plan.hardware_file = file(&self.hardware);
        plan.model_file = file(&self.model);
    }
}

/// Packed batches (the first ones asked for) and what packing cut.
pub struct Batches {
    /// The batches kept, from batch `first` on.
    pub batches: Vec<Batch>,
    /// Index of `batches[0]` in the trace's packing.
    pub first: usize,
    /// Per batch kept: documents packing cut in it.
    pub cuts: Vec<usize>,
    /// Batches the whole trace packs into.
    pub total: usize,
}

impl Batches {
    /// Drop the first `k` batches (`--from-batch`); an error if none would be left.
    pub fn skip(&mut self, k: usize) -> Result<()> {
        if k >= self.batches.len() {
            bail!(
                "--from-batch {k} leaves no batch: the trace packs into {} batch(es)",
                self.total
            );
        }
        self.batches.drain(..k);
        self.cuts.drain(..k.min(self.cuts.len()));
        self.first += k;
        Ok(())
    }

    /// Batch `index`, or an error naming how many batches the trace packs into.
    pub fn pick(&self, index: usize) -> Result<&Batch> {
        let at = index.checked_sub(self.first);
        at.and_then(|p| self.batches.get(p)).with_context(|| {
            format!(
                "--batch {index} is out of range: the trace packs into {} batches",
                self.total
            )
        })
    }

    /// Say on stderr how many documents of `used` (batch indices) packing cut, when any: a
    /// result for a batch whose long documents were cut describes less than the trace holds.
    /// (Regression, bug hunt: `compare`, `demo` and `ablation` cut documents without a word,
    /// and `plan` counted the whole trace's cuts, not its batch's.)
    pub fn note_cuts(&self, used: impl IntoIterator<Item = usize>) {
        let (mut cut, mut batches) = (0, 0);
        for i in used {
            let at = i.checked_sub(self.first);
            let c = at.and_then(|p| self.cuts.get(p)).copied().unwrap_or(0);
            cut += c;
            batches += usize::from(c > 0);
        }
        if cut > 0 {
            eprintln!(
                "note: packing cut {cut} document(s) in {batches} of the batches used (window: the one crossing each window's end; budget: any longer than a batch; wlb: any longer than --wlb-max-len); the cut-off tokens are in no batch"
            );
        }
    }

    /// [`Batches::note_cuts`] over every batch kept: what `compare`, `demo` and `ablation`
    /// run. (Bug hunt: ranging over the `--batches` asked for looped up to 2⁶⁴ times.)
    pub fn note_all_cuts(&self) {
        self.note_cuts(self.first..self.first + self.batches.len())
    }
}

impl BatchArgs {
    /// Tokens per rank: `--tokens-per-rank`, else the packing mode's default
    /// ([`fcp::trace::PackMode::default_tokens_per_rank`]). (Regression, bug hunt: window
    /// packing planned FCP under a 32K cap where each rank's share of a 128K window over 8
    /// ranks is 16K, and `compare` disagreed with the same cell of `fcp sweep`.)
    pub fn tokens_per_rank(&self) -> u64 {
        self.pack.tokens_per_rank(self.ranks, self.tokens_per_rank)
    }

    /// The planning context these arguments describe, for `hw` and `model`.
    pub fn ctx<'a>(&self, hw: &'a Hardware, model: &'a Model) -> fcp::planners::PlanContext<'a> {
        fcp::planners::PlanContext {
            ranks: self.ranks,
            tokens_per_rank: self.tokens_per_rank(),
            mask: self.mask.into(),
            model,
            hardware: hw,
            judge: fcp::planners::Judge::default(),
        }
    }

    /// The mask's name for headers.
    pub fn mask_name(&self) -> &'static str {
        match self.mask {
            MaskArg::Causal => "causal",
            MaskArg::Full => "full",
        }
    }

    /// Validate the shape and pack the trace, keeping its first `keep` batches
    /// ([`fcp::trace::pack_first`]).
    pub fn load(&self, keep: usize, hints: WlbHints) -> Result<Batches> {
        self.load_from(0, keep, hints)
    }

    /// [`BatchArgs::load`] keeping batches `skip..keep` only: one batch of a long trace
    /// (`--batch K`) holds that batch, not the K before it ([`fcp::trace::pack_from`]).
    pub fn load_from(&self, skip: usize, keep: usize, hints: WlbHints) -> Result<Batches> {
        self.pack.check_context()?;
        self.pack.check_wlb()?;
        self.pack.wlb_weight_note(hints);
        if self.ranks == 0 {
            bail!("--ranks must be at least 1");
        }
        if self.ranks > fcp::planners::MAX_RANKS {
            bail!(
                "--ranks {} is more than the {} ranks a plan may have",
                self.ranks,
                fcp::planners::MAX_RANKS
            );
        }
        if self.tokens_per_rank == Some(0) {
            bail!("--tokens-per-rank must be at least 1");
        }
        self.pack
            .check_tokens_per_rank(self.ranks, self.tokens_per_rank)?;
        let opts = self.pack.options(self.ranks, self.tokens_per_rank(), hints);
        let trace = match &self.trace {
            // A sweep's generated trace, grown as the sweep grows it (every size a prefix of
            // the same stream), so a cell's batches are these (bug hunt: a sweep cell on a
            // `gen:` trace could not be rerun with `compare`); `default`, the bundled trace,
            // as a sweep names it. A file of that name wins, as in a sweep.
            Some(p)
                if !p.exists()
                    && p.to_str()
                        .is_some_and(|s| s.starts_with("gen:") || s == "default") =>
            {
                let spec = fcp::study::traces::TraceSpec::parse(p.to_str().unwrap_or_default())?;
                spec.load_for(std::slice::from_ref(&opts), keep)?
            }
            Some(p) => Trace::load(p)?,
            None => fcp::trace::default_trace(),
        };
        let packed = pack_from(&trace, &opts, skip, keep).context("packing the trace")?;
        if packed.total_batches == 0 || (skip == 0 && packed.batches.is_empty()) {
            bail!("the trace packs into no batch");
        }
        Ok(Batches {
            first: skip,
            batches: packed.batches,
            cuts: packed.cuts,
            total: packed.total_batches,
        })
    }
}

pub use fcp::report::human_bytes as bytes;

/// Load a plan file and refuse it unless it verifies: numbers simulated or validated for a
/// broken plan would describe work that is not attention.
pub fn load_verified_plan(path: &std::path::Path) -> anyhow::Result<fcp::plan::Plan> {
    let plan = fcp::plan::Plan::load(path)?;
    let violations = fcp::plan::verify(&plan);
    if let Some(first) = violations.first() {
        anyhow::bail!(
            "{} is not a valid plan ({} violations, first: {first}); `fcp verify` lists them",
            path.display(),
            violations.len()
        );
    }
    Ok(plan)
}

/// ` to N receivers` when the plan's transfers reach more ranks than they number (an
/// all-gather lists each shard once, to every other member), else nothing.
pub fn receivers(plan: &fcp::Plan) -> String {
    let n = plan.delivery_count();
    if n == plan.transfers.len() {
        String::new()
    } else {
        format!(" to {n} receivers")
    }
}

#[cfg(test)]
mod tests {
    use super::zero3_words;

    /// Regression (bug hunt): the advice named remedies that change nothing: fewer replicas
    /// at DP 1, or fewer `--dp` replicas when `--shard-dp` already sets the group.
    #[test]
    fn zero3_advice_names_only_what_would_shrink_the_group() {
        let advice = |replicas, hybrid| zero3_words(10.0, 2.0, true, replicas, hybrid);
        assert!(advice(1, false).contains("waits for its weights: more tokens per GPU or --zero 2"));
        assert!(advice(4, false).contains("sharding within fewer replicas (--shard-dp), more"));
        assert!(advice(4, true).contains("a smaller --shard-dp, more"));
        let hidden = zero3_words(10.0, 0.0, false, 4, false);
        assert_eq!(
            hidden,
            "ZeRO 3: weight all-gathers 10.000 ms per layer, prefetched under its work; 0.000 ms exposed"
        );
    }
}
