//! Simulated vs measured: reads the executor's `measured.json` (docs/executor.md), simulates
//! the same plan and reports, per rank and per step, how far the cost model is from what the
//! GPU (or CPU) did — the check that the simulator's numbers mean something.
//!
//! Relative errors are taken against the measurement, `|sim − measured| / measured`. Steps
//! without tasks are skipped (both sides are only launch or timer noise there), and so are
//! measurements of zero.

use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::report::shown;
use crate::sim::{PassSel, SimError, Simulator};

/// Format tag `measured.json` carries.
pub const MEASURED_FORMAT: &str = "fcp-measured";
/// Version of `measured.json` this build reads.
pub const MEASURED_VERSION: u32 = 1;

/// Errors reading a measurement or matching it to its plan (all exit 2 on the command line).
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The file is not a measurement this build reads, or does not fit the plan.
    #[error("{origin}: {message}")]
    Measured {
        /// File named in the message.
        origin: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// Simulating the plan failed.
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// One step of one pass on one rank, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredStep {
    /// Step index.
    pub step: u32,
    /// Time the step's kernels ran.
    pub compute_ms: f64,
    /// Time the rank waited for the step's inputs (null in single-device mode).
    #[serde(default)]
    pub wait_ms: Option<f64>,
}

/// One pass on one rank, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredPass {
    /// `fwd` or `bwd`.
    pub pass: String,
    /// Sum of the steps' compute.
    pub compute_ms: f64,
    /// Time at least one of the rank's messages or collectives was in flight.
    #[serde(default)]
    pub comm_ms: Option<f64>,
    /// Waits plus the tail after the last step (read to be checked; not compared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_comm_ms: Option<f64>,
    /// From the pass start until the rank's last compute or communication ended.
    #[serde(default)]
    pub end_ms: Option<f64>,
    /// Per step, in plan order.
    pub steps: Vec<MeasuredStep>,
}

/// One rank, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredRank {
    /// Rank id (equal to its index).
    pub rank: u32,
    /// Compute summed over the passes.
    pub compute_ms: f64,
    /// Communication time summed over the passes (null in single-device mode).
    #[serde(default)]
    pub comm_ms: Option<f64>,
    /// Exposed communication summed over the passes (read to be checked; not compared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_comm_ms: Option<f64>,
    /// End time summed over the passes (null in single-device mode).
    #[serde(default)]
    pub end_ms: Option<f64>,
    /// Timed passes in order.
    pub passes: Vec<MeasuredPass>,
}

/// What `scripts/replay.py` writes (docs/executor.md lists every field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Always [`MEASURED_FORMAT`].
    pub format: String,
    /// [`MEASURED_VERSION`].
    pub version: u32,
    /// The plan replayed, as the replay read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<MeasuredPlan>,
    /// `distributed` or `single-device`.
    pub mode: String,
    /// `fwd`, `bwd` or `both`.
    pub pass: String,
    /// Always `ms`, the simulator's unit.
    pub time_unit: String,
    /// Device name (`cpu` or the GPU's name).
    #[serde(default)]
    pub device: Option<String>,
    /// Attention kernels used.
    #[serde(default)]
    pub backend: Option<String>,
    /// Q/K/V dtype.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Slowest rank's end, summed over passes (null in single-device mode).
    #[serde(default)]
    pub attention_time_ms: Option<f64>,
    /// Per rank.
    pub ranks: Vec<MeasuredRank>,
    /// The replay's check of its outputs against dense attention, when it ran one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<MeasuredCheck>,
}

/// `plan` of a measured.json: which plan was replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredPlan {
    /// The plan file's path as given to the replay.
    #[serde(default)]
    pub path: Option<String>,
    /// Its scheme.
    #[serde(default)]
    pub scheme: Option<String>,
    /// Its CP group size.
    #[serde(default)]
    pub num_ranks: Option<u32>,
    /// The model it was made for (its provenance field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its batch's tokens, documents, tasks and transfers: together they tell one batch's
    /// plan from another's of the same scheme and step count (written since the bug hunt
    /// that found such a measurement compared without a word; older files lack them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<PlanFingerprint>,
}

/// What [`MeasuredPlan::fingerprint`] records of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFingerprint {
    /// Tokens of the batch (without padding).
    pub tokens: u64,
    /// Documents of the batch.
    pub docs: u64,
    /// Tasks over every rank and step.
    pub tasks: u64,
    /// Transfers.
    pub transfers: u64,
}

impl std::fmt::Display for PlanFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tokens in {} documents, {} tasks, {} transfers",
            self.tokens, self.docs, self.tasks, self.transfers
        )
    }
}

impl PlanFingerprint {
    /// The fingerprint of `plan`, as the replay computes it.
    pub fn of(plan: &Plan) -> PlanFingerprint {
        PlanFingerprint {
            tokens: plan.total_tokens(),
            docs: plan.documents.len() as u64,
            tasks: plan
                .ranks
                .iter()
                .flat_map(|r| &r.steps)
                .map(|s| s.tasks.len() as u64)
                .sum(),
            transfers: plan.transfers.len() as u64,
        }
    }
}

/// `check` of a measured.json: whether the replay's outputs matched dense attention. Timings
/// from a replay that computed the wrong thing say little about the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredCheck {
    /// Whether the check ran.
    #[serde(default)]
    pub ran: bool,
    /// Whether it passed (absent when it did not run).
    #[serde(default)]
    pub passed: Option<bool>,
    /// Largest relative error found.
    #[serde(default)]
    pub max_rel_error: Option<f64>,
}

impl Measured {
    /// Parse and check a measurement; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Measured, ValidateError> {
        let bad = |message: String| ValidateError::Measured {
            origin: origin.to_string(),
            message,
        };
        let m: Measured = serde_json::from_str(text)
            .map_err(|e| bad(format!("not a measured.json from scripts/replay.py: {e}")))?;
        if m.format != MEASURED_FORMAT {
            return Err(bad(format!(
                "format is `{}`, expected `{MEASURED_FORMAT}`",
                m.format
            )));
        }
        if m.version != MEASURED_VERSION {
            return Err(bad(format!(
                "measured.json version {}, this fcp reads version {MEASURED_VERSION}",
                m.version
            )));
        }
        if m.time_unit != "ms" {
            return Err(bad(format!(
                "time_unit is `{}`; only `ms` (the simulator's unit) is read",
                m.time_unit
            )));
        }
        if !matches!(m.mode.as_str(), "distributed" | "single-device") {
            return Err(bad(format!(
                "mode is `{}`, expected distributed or single-device",
                m.mode
            )));
        }
        let Some(sel) = pass_sel(&m.pass) else {
            return Err(bad(format!(
                "pass is `{}`, expected fwd, bwd or both",
                m.pass
            )));
        };
        let check = |what: String, x: f64| -> Result<(), ValidateError> {
            if x.is_finite() && x >= 0.0 {
                Ok(())
            } else {
                Err(bad(format!("{what} is {x}, expected a time ≥ 0")))
            }
        };
        if let Some(t) = m.attention_time_ms {
            check("attention_time_ms".into(), t)?;
        }
        for (i, r) in m.ranks.iter().enumerate() {
            if r.rank as usize != i {
                return Err(bad(format!("ranks[{i}] has rank {}", r.rank)));
            }
            check(format!("rank {i} compute_ms"), r.compute_ms)?;
            // Every time the file gives is checked, compared or not (bug hunt: a negative
            // `exposed_comm_ms` passed).
            for (k, v) in [
                ("comm_ms", r.comm_ms),
                ("exposed_comm_ms", r.exposed_comm_ms),
                ("end_ms", r.end_ms),
            ] {
                if let Some(v) = v {
                    check(format!("rank {i} {k}"), v)?;
                }
            }
            for p in &r.passes {
                check(format!("rank {i} {} compute_ms", p.pass), p.compute_ms)?;
                for (k, v) in [
                    ("comm_ms", p.comm_ms),
                    ("exposed_comm_ms", p.exposed_comm_ms),
                    ("end_ms", p.end_ms),
                ] {
                    if let Some(v) = v {
                        check(format!("rank {i} {} {k}", p.pass), v)?;
                    }
                }
                if let Some((j, s)) = p
                    .steps
                    .iter()
                    .enumerate()
                    .find(|(j, s)| s.step as usize != *j)
                {
                    return Err(bad(format!(
                        "rank {i} {}: steps[{j}] says step {}; steps are listed in plan order, one per step",
                        p.pass, s.step
                    )));
                }
                for s in &p.steps {
                    check(
                        format!("rank {i} {} step {} compute_ms", p.pass, s.step),
                        s.compute_ms,
                    )?;
                    if let Some(w) = s.wait_ms {
                        check(format!("rank {i} {} step {} wait_ms", p.pass, s.step), w)?;
                    }
                }
                pass_is_its_steps(i, p).map_err(bad)?;
            }
            // The passes first: a rank missing one was reported as totals that do not sum
            // (bug hunt).
            rank_passes_match(r, sel, &m.pass).map_err(bad)?;
            // A rank's totals are its passes' sums (docs/executor.md); a total that is not
            // was compared per rank while the per-step rows said otherwise (bug hunt).
            if !r.passes.is_empty() {
                let sum = |f: fn(&MeasuredPass) -> Option<f64>| -> Option<f64> {
                    r.passes.iter().map(f).sum()
                };
                for (k, total, passes) in [
                    (
                        "compute_ms",
                        Some(r.compute_ms),
                        sum(|p| Some(p.compute_ms)),
                    ),
                    ("comm_ms", r.comm_ms, sum(|p| p.comm_ms)),
                    (
                        "exposed_comm_ms",
                        r.exposed_comm_ms,
                        sum(|p| p.exposed_comm_ms),
                    ),
                    ("end_ms", r.end_ms, sum(|p| p.end_ms)),
                ] {
                    let (Some(total), Some(passes)) = (total, passes) else {
                        continue;
                    };
                    if !sums_to(total, passes) {
                        return Err(bad(format!(
                            "rank {i} {k} is {}, but its passes' {k} sum to {}; a rank's totals are its passes' sums",
                            shown(total),
                            shown(passes)
                        )));
                    }
                }
            }
        }
        // The end-to-end time is each pass's slowest rank end, summed (docs/executor.md);
        // one that is not was compared as the attention time (bug hunt: 1000 ms against
        // ends of 3 read as a 99.7 % error).
        let pass_ends: Option<f64> = (0..sel.passes().len())
            .map(|p| {
                m.ranks
                    .iter()
                    .map(|r| r.passes.get(p).and_then(|p| p.end_ms))
                    .try_fold(0.0f64, |acc, e| e.map(|e| acc.max(e)))
            })
            .sum();
        if let (Some(total), Some(ends), false) =
            (m.attention_time_ms, pass_ends, m.ranks.is_empty())
        {
            if !sums_to(total, ends) {
                return Err(bad(format!(
                    "attention_time_ms is {}, but each pass's slowest end_ms summed is {}; the end-to-end time is that sum",
                    shown(total),
                    shown(ends)
                )));
            }
        }
        // Distributed mode measures every rank's communication, waits and ends: a rank
        // without them was left out of the comm statistics, and the end-to-end check skipped
        // (bug hunt: one rank's nulls passed, with an attention time of 10⁶ ms).
        if m.mode == "distributed" {
            distributed_is_complete(&m).map_err(bad)?;
        }
        // Single-device mode replays each rank's compute alone: no message runs, so a
        // communication time or an end time there is not a measurement (bug hunt: they were
        // compared against the simulated distributed run).
        if m.mode == "single-device" {
            let comm = |r: &MeasuredRank| {
                r.comm_ms.is_some()
                    || r.exposed_comm_ms.is_some()
                    || r.end_ms.is_some()
                    || r.passes.iter().any(|p| {
                        p.comm_ms.is_some()
                            || p.exposed_comm_ms.is_some()
                            || p.end_ms.is_some()
                            || p.steps.iter().any(|s| s.wait_ms.is_some())
                    })
            };
            if let Some(i) = m.ranks.iter().position(comm) {
                return Err(bad(format!(
                    "mode is single-device, where no communication runs, yet rank {i} gives communication, wait or end times; they must be null there"
                )));
            }
            if m.attention_time_ms.is_some() {
                return Err(bad(
                    "mode is single-device, where no communication runs, yet attention_time_ms is given; it must be null there".into(),
                ));
            }
        }
        Ok(m)
    }

    /// Read a measurement file.
    pub fn load(path: &std::path::Path) -> Result<Measured, ValidateError> {
        let origin = path.display().to_string();
        let text = crate::input::read_text(path, "a JSON measurement", false).map_err(|e| {
            ValidateError::Measured {
                origin: origin.clone(),
                message: e.to_string(),
            }
        })?;
        Measured::from_json(&text, &origin)
    }
}

/// Relative tolerance of a total against the parts it sums (the replay's floats).
fn sums_to(total: f64, parts: f64) -> bool {
    (total - parts).abs() <= 1e-6 * total.abs().max(parts.abs()) + 1e-9
}

/// Whether a pass's compute is its steps' sum, and its end (when given) no earlier than its
/// compute and waits, which run one after another on the rank; else the message. Bug hunt:
/// steps scaled tenfold with their pass left alone read as 0 % per rank beside 90 % per step,
/// and ends of 1 µs after 30 ms of compute were compared.
fn pass_is_its_steps(rank: usize, p: &MeasuredPass) -> Result<(), String> {
    let steps: f64 = p.steps.iter().map(|s| s.compute_ms).sum();
    if !sums_to(p.compute_ms, steps) {
        return Err(format!(
            "rank {rank} {} compute_ms is {}, but its steps' compute_ms sum to {}; a pass's compute is its steps' sum",
            p.pass,
            shown(p.compute_ms),
            shown(steps)
        ));
    }
    if let Some(end) = p.end_ms {
        let busy = steps + p.steps.iter().filter_map(|s| s.wait_ms).sum::<f64>();
        if end < busy && !sums_to(end, busy) {
            return Err(format!(
                "rank {rank} {} end_ms is {}, before its steps' compute and waits ({} ms) are over; the steps run one after another from the pass start",
                p.pass,
                shown(end),
                shown(busy)
            ));
        }
    }
    Ok(())
}

/// Whether a distributed measurement gives every communication, wait and end time the
/// replay measures there, and the end-to-end time; else the message naming the first gap.
fn distributed_is_complete(m: &Measured) -> Result<(), String> {
    for r in &m.ranks {
        let gap = |what: &str| {
            format!(
                "mode is distributed, yet rank {} gives no {what}; a distributed replay measures it for every rank",
                r.rank
            )
        };
        if r.comm_ms.is_none() || r.end_ms.is_none() {
            return Err(gap("comm_ms or end_ms"));
        }
        for p in &r.passes {
            if p.comm_ms.is_none() || p.end_ms.is_none() {
                return Err(gap(&format!("{} comm_ms or end_ms", p.pass)));
            }
            if let Some(s) = p.steps.iter().find(|s| s.wait_ms.is_none()) {
                return Err(gap(&format!("{} step {} wait_ms", p.pass, s.step)));
            }
        }
    }
    if m.attention_time_ms.is_none() && !m.ranks.is_empty() {
        return Err(
            "mode is distributed, yet attention_time_ms is null; a distributed replay measures it"
                .into(),
        );
    }
    Ok(())
}

/// Whether rank `r` lists exactly the passes `pass` (`sel`) names, in order; else the message.
fn rank_passes_match(r: &MeasuredRank, sel: PassSel, pass: &str) -> Result<(), String> {
    let want = sel.passes().iter().map(|p| match p {
        crate::hardware::Pass::Fwd => "fwd",
        crate::hardware::Pass::Bwd => "bwd",
    });
    let got: Vec<&str> = r.passes.iter().map(|p| p.pass.as_str()).collect();
    if got.iter().copied().eq(want) {
        Ok(())
    } else {
        Err(format!(
            "rank {} has passes {got:?} but pass is `{pass}`",
            r.rank
        ))
    }
}

fn pass_sel(name: &str) -> Option<PassSel> {
    match name {
        "fwd" => Some(PassSel::Fwd),
        "bwd" => Some(PassSel::Bwd),
        "both" => Some(PassSel::Both),
        _ => None,
    }
}

/// Simulated and measured value of one quantity with their relative error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair {
    /// Simulated, ms.
    pub sim_ms: f64,
    /// Measured, ms.
    pub measured_ms: f64,
    /// |sim − measured| / measured; null when the measurement is zero.
    pub rel_error: Option<f64>,
}

impl Pair {
    fn new(sim_ms: f64, measured_ms: f64) -> Pair {
        let rel_error = (measured_ms > 0.0).then(|| (sim_ms - measured_ms).abs() / measured_ms);
        Pair {
            sim_ms,
            measured_ms,
            rel_error,
        }
    }
}

/// One step of one pass on one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRow {
    /// Rank.
    pub rank: u32,
    /// `fwd` or `bwd`.
    pub pass: String,
    /// Step index.
    pub step: u32,
    /// Tasks in the step (steps without any are left out of the statistics).
    pub tasks: usize,
    /// Kernel time.
    pub compute: Pair,
    /// Time waited for inputs before the step (simulated: the gap since the previous step).
    pub wait: Option<Pair>,
}

/// One rank, summed over passes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankRow {
    /// Rank.
    pub rank: u32,
    /// Compute time.
    pub compute: Pair,
    /// Communication time (messages or collectives in flight).
    pub comm: Option<Pair>,
    /// End of the rank's work from the pass start.
    pub end: Option<Pair>,
}

/// Mean and max of relative errors over a set of comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ErrorStats {
    /// Comparisons counted.
    pub n: usize,
    /// Mean relative error.
    pub mean: f64,
    /// Largest relative error.
    pub max: f64,
    /// Comparisons whose measured time is 0 where the simulation has time: no relative error
    /// exists, and a gate fails on them (bug hunt: one rank measured at 0 ms was left out of
    /// the mean, and `--max-compute-error` passed).
    pub zero_measured: usize,
}

impl ErrorStats {
    /// Over `pairs`; `None` when none has a simulated or a measured time.
    fn of(pairs: impl IntoIterator<Item = Pair>) -> Option<ErrorStats> {
        let pairs: Vec<Pair> = pairs.into_iter().collect();
        let v: Vec<f64> = pairs.iter().filter_map(|p| p.rel_error).collect();
        let zero_measured = pairs
            .iter()
            .filter(|p| p.rel_error.is_none() && p.sim_ms > 0.0)
            .count();
        if v.is_empty() && zero_measured == 0 {
            return None;
        }
        Some(ErrorStats {
            n: v.len(),
            mean: if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            },
            max: v.iter().copied().fold(0.0, f64::max),
            zero_measured,
        })
    }
}

/// Summary errors; `None` where the measurement has no such numbers (single-device mode has no
/// communication and no end-to-end time).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationSummary {
    /// Per-rank compute time.
    pub rank_compute: Option<ErrorStats>,
    /// Per-step compute time (steps with tasks).
    pub step_compute: Option<ErrorStats>,
    /// Per-rank communication time.
    pub rank_comm: Option<ErrorStats>,
    /// End-to-end attention time (the slowest rank, summed over passes).
    pub attention_time: Option<Pair>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationReport {
    /// Scheme of the plan.
    pub scheme: String,
    /// Hardware profile simulated.
    pub hardware: String,
    /// Model simulated.
    pub model: String,
    /// Tensor-parallel degree the model is split by (the plan's `tp`); absent when 1.
    #[serde(skip_serializing_if = "crate::tp::is_one")]
    pub tp: u32,
    /// Passes compared.
    pub pass: String,
    /// How the measurement was taken.
    pub mode: String,
    /// Device, kernels and dtype of the measurement.
    pub measured_on: String,
    /// Summary errors.
    pub summary: ValidationSummary,
    /// Per rank.
    pub ranks: Vec<RankRow>,
    /// Per rank, pass and step.
    pub steps: Vec<StepRow>,
}

const NS_TO_MS: f64 = 1e-6;

/// Simulate `plan` for the measured passes and compare.
pub fn validate(
    plan: &Plan,
    sim: &Simulator,
    measured: &Measured,
    origin: &str,
) -> Result<ValidationReport, ValidateError> {
    let bad = |message: String| ValidateError::Measured {
        origin: origin.to_string(),
        message,
    };
    let passes = pass_sel(&measured.pass).ok_or_else(|| bad("unknown pass".into()))?;
    // Regression (bug hunt): an fcp measurement was compared with a zigzag plan of the same
    // step count without a word; the replay records which plan it ran.
    if let Some(mp) = &measured.plan {
        let scheme_differs = mp.scheme.as_ref().is_some_and(|s| *s != plan.scheme.name);
        let ranks_differ = mp.num_ranks.is_some_and(|n| n != plan.num_ranks);
        if scheme_differs || ranks_differ {
            return Err(bad(format!(
                "it measured {} ({} on {} ranks), not this plan ({} on {} ranks)",
                mp.path.as_deref().unwrap_or("another plan"),
                mp.scheme.as_deref().unwrap_or("?"),
                mp.num_ranks.map_or("?".to_string(), |n| n.to_string()),
                plan.scheme.name,
                plan.num_ranks
            )));
        }
        // Regression (bug hunt): a measurement of a tiny-model plan was compared with a
        // llama3-70b plan of the same scheme; the model and the batch's fingerprint say so.
        let model_differs = match (&mp.model, &plan.model) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        };
        let batch_differs = mp
            .fingerprint
            .is_some_and(|f| f != PlanFingerprint::of(plan));
        if model_differs || batch_differs {
            return Err(bad(format!(
                "it measured {} ({} for {}: {}), not this plan ({} for {}: {})",
                mp.path.as_deref().unwrap_or("another plan"),
                mp.scheme.as_deref().unwrap_or("?"),
                mp.model.as_deref().unwrap_or("?"),
                mp.fingerprint.map_or("?".to_string(), |f| f.to_string()),
                plan.scheme.name,
                plan.model.as_deref().unwrap_or("?"),
                PlanFingerprint::of(plan)
            )));
        }
    }
    if measured.ranks.len() != plan.ranks.len() {
        return Err(bad(format!(
            "measured {} ranks but the plan has {}; was it replayed from this plan?",
            measured.ranks.len(),
            plan.ranks.len()
        )));
    }
    for r in &measured.ranks {
        rank_passes_match(r, passes, &measured.pass).map_err(bad)?;
        for p in &r.passes {
            let want = plan.ranks[r.rank as usize].steps.len();
            if p.steps.len() != want {
                return Err(bad(format!(
                    "rank {} {} has {} steps but the plan gives it {want}; was it replayed from this plan?",
                    r.rank,
                    p.pass,
                    p.steps.len()
                )));
            }
        }
    }
    let (report, outcomes) = sim.simulate_traced(plan, passes)?;
    let mut steps = Vec::new();
    let mut ranks = Vec::new();
    for (ri, mr) in measured.ranks.iter().enumerate() {
        let rp = &plan.ranks[ri];
        let mut sim_end = 0.0;
        for (pi, mp) in mr.passes.iter().enumerate() {
            let tl = &outcomes[pi].timeline[ri];
            sim_end += outcomes[pi].ranks[ri].finish_ns as f64 * NS_TO_MS;
            let mut prev_end = 0u64;
            for (si, ms) in mp.steps.iter().enumerate() {
                let (a, b) = tl.compute.get(si).copied().unwrap_or((prev_end, prev_end));
                let wait = ms
                    .wait_ms
                    .map(|w| Pair::new(a.saturating_sub(prev_end) as f64 * NS_TO_MS, w));
                prev_end = b;
                steps.push(StepRow {
                    rank: mr.rank,
                    pass: mp.pass.clone(),
                    step: si as u32,
                    tasks: rp.steps[si].tasks.len(),
                    compute: Pair::new((b - a) as f64 * NS_TO_MS, ms.compute_ms),
                    wait,
                });
            }
        }
        let sr = &report.ranks[ri];
        ranks.push(RankRow {
            rank: mr.rank,
            compute: Pair::new(sr.compute_ms, mr.compute_ms),
            comm: mr.comm_ms.map(|c| Pair::new(sr.comm_ms, c)),
            end: mr.end_ms.map(|e| Pair::new(sim_end, e)),
        });
    }
    let summary = ValidationSummary {
        rank_compute: ErrorStats::of(ranks.iter().map(|r| r.compute)),
        step_compute: ErrorStats::of(steps.iter().filter(|s| s.tasks > 0).map(|s| s.compute)),
        rank_comm: ErrorStats::of(ranks.iter().filter_map(|r| r.comm)),
        attention_time: measured
            .attention_time_ms
            .map(|t| Pair::new(report.metrics.attention_time_ms, t)),
    };
    let measured_on = format!(
        "{} · {} · {}",
        measured.device.as_deref().unwrap_or("?"),
        measured.backend.as_deref().unwrap_or("?"),
        measured.dtype.as_deref().unwrap_or("?")
    );
    Ok(ValidationReport {
        scheme: plan.scheme.name.clone(),
        hardware: report.hardware,
        model: report.model,
        tp: report.tp,
        pass: measured.pass.clone(),
        mode: measured.mode.clone(),
        measured_on,
        summary,
        ranks,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Hardware;
    use crate::model::Model;
    use crate::plan::Mask;
    use crate::planners::testing::with_ctx;
    use crate::planners::{Planner, Zigzag};
    use crate::trace::Batch;

    fn setup() -> (Plan, Simulator) {
        let plan = with_ctx(2, Mask::Causal, |c| {
            Zigzag.plan(&Batch::new(0, vec![4096, 1024]), c)
        })
        .unwrap();
        let sim = Simulator::new(
            Hardware::load("h100").unwrap(),
            Model::load("llama3-70b").unwrap(),
        )
        .unwrap();
        (plan, sim)
    }

    /// A measurement equal to the simulation scaled by `k`, so every relative error is
    /// |sim − k·sim| / (k·sim) = |1 − k| / k.
    fn scaled(plan: &Plan, sim: &Simulator, k: f64, pass: &str) -> Measured {
        let sel = pass_sel(pass).unwrap();
        let (rep, outs) = sim.simulate_traced(plan, sel).unwrap();
        let names: Vec<&str> = match pass {
            "both" => vec!["fwd", "bwd"],
            p => vec![p],
        };
        let ranks = (0..plan.ranks.len())
            .map(|r| {
                let passes: Vec<MeasuredPass> = names
                    .iter()
                    .enumerate()
                    .map(|(pi, n)| {
                        let tl = &outs[pi].timeline[r];
                        let mut prev = 0;
                        let steps: Vec<MeasuredStep> = tl
                            .compute
                            .iter()
                            .enumerate()
                            .map(|(s, &(a, b))| {
                                let wait = a - prev;
                                prev = b;
                                MeasuredStep {
                                    step: s as u32,
                                    compute_ms: k * (b - a) as f64 * 1e-6,
                                    wait_ms: Some(k * wait as f64 * 1e-6),
                                }
                            })
                            .collect();
                        let o = &outs[pi].ranks[r];
                        MeasuredPass {
                            pass: n.to_string(),
                            compute_ms: steps.iter().map(|s| s.compute_ms).sum(),
                            comm_ms: Some(k * o.comm_ns as f64 * 1e-6),
                            exposed_comm_ms: None,
                            end_ms: Some(k * o.finish_ns as f64 * 1e-6),
                            steps,
                        }
                    })
                    .collect();
                let sum = |f: fn(&MeasuredPass) -> Option<f64>| passes.iter().filter_map(f).sum();
                MeasuredRank {
                    rank: r as u32,
                    compute_ms: passes.iter().map(|p| p.compute_ms).sum(),
                    comm_ms: Some(sum(|p| p.comm_ms)),
                    exposed_comm_ms: None,
                    end_ms: Some(sum(|p| p.end_ms)),
                    passes,
                }
            })
            .collect();
        Measured {
            format: MEASURED_FORMAT.into(),
            version: 1,
            plan: Some(MeasuredPlan {
                path: Some("p.json".into()),
                scheme: Some(plan.scheme.name.clone()),
                num_ranks: Some(plan.num_ranks),
                model: plan.model.clone(),
                fingerprint: Some(PlanFingerprint::of(plan)),
            }),
            mode: "distributed".into(),
            pass: pass.into(),
            time_unit: "ms".into(),
            device: Some("test".into()),
            backend: None,
            dtype: None,
            attention_time_ms: Some(k * rep.metrics.attention_time_ms),
            ranks,
            check: None,
        }
    }

    #[test]
    fn a_measurement_of_another_plan_is_refused() {
        let (plan, sim) = setup();
        let mut m = scaled(&plan, &sim, 1.0, "both");
        m.plan.as_mut().unwrap().scheme = Some("fcp".into());
        let e = validate(&plan, &sim, &m, "m.json").unwrap_err().to_string();
        assert!(e.contains("it measured p.json (fcp on"), "{e}");
        m.plan = None;
        assert!(
            validate(&plan, &sim, &m, "m.json").is_ok(),
            "older files lack the block"
        );
    }

    #[test]
    fn a_measurement_equal_to_the_simulation_has_no_error() {
        let (plan, sim) = setup();
        let m = scaled(&plan, &sim, 1.0, "both");
        let r = validate(&plan, &sim, &m, "m.json").unwrap();
        let s = &r.summary;
        assert!(s.rank_compute.unwrap().max < 1e-12, "{s:?}");
        assert!(s.step_compute.unwrap().max < 1e-12, "{s:?}");
        assert!(s.attention_time.unwrap().rel_error.unwrap() < 1e-12);
        assert_eq!(
            r.steps.len(),
            2 * plan.ranks.iter().map(|r| r.steps.len()).sum::<usize>()
        );
    }

    #[test]
    fn scaled_measurements_give_the_expected_relative_error() {
        let (plan, sim) = setup();
        let m = scaled(&plan, &sim, 1.25, "fwd");
        let r = validate(&plan, &sim, &m, "m.json").unwrap();
        let want = 0.25 / 1.25;
        let rc = r.summary.rank_compute.unwrap();
        assert!(
            (rc.mean - want).abs() < 1e-9 && (rc.max - want).abs() < 1e-9,
            "{rc:?}"
        );
        let sc = r.summary.step_compute.unwrap();
        assert!((sc.mean - want).abs() < 1e-6, "{sc:?}");
        assert!((r.summary.rank_comm.unwrap().mean - want).abs() < 1e-9);
    }

    #[test]
    fn mismatched_measurements_are_clear_errors() {
        let (plan, sim) = setup();
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        m.ranks.pop();
        let e = validate(&plan, &sim, &m, "m.json").unwrap_err().to_string();
        assert!(e.contains("measured 1 ranks but the plan has 2"), "{e}");
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        m.ranks[1].passes[0].steps.pop();
        let e = validate(&plan, &sim, &m, "m.json").unwrap_err().to_string();
        assert!(e.contains("steps but the plan gives it"), "{e}");
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        m.pass = "both".into();
        let e = validate(&plan, &sim, &m, "m.json").unwrap_err().to_string();
        assert!(e.contains("has passes"), "{e}");
    }

    #[test]
    fn parser_rejects_wrong_format_version_unit_and_negative_times() {
        let (plan, sim) = setup();
        let good = serde_json::to_string(&scaled(&plan, &sim, 1.0, "fwd")).unwrap();
        assert!(Measured::from_json(&good, "m").is_ok());
        for (from, to, msg) in [
            ("\"fcp-measured\"", "\"other\"", "format is"),
            ("\"version\":1", "\"version\":7", "version 7"),
            ("\"time_unit\":\"ms\"", "\"time_unit\":\"ns\"", "time_unit"),
            (
                "\"pass\":\"fwd\",\"time",
                "\"pass\":\"up\",\"time",
                "pass is",
            ),
        ] {
            let text = good.replacen(from, to, 1);
            assert_ne!(text, good, "{from}");
            let e = Measured::from_json(&text, "m").unwrap_err().to_string();
            assert!(e.contains(msg), "{e}");
        }
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        m.ranks[0].passes[0].steps[0].compute_ms = -1.0;
        let text = serde_json::to_string(&m).unwrap();
        let e = Measured::from_json(&text, "m").unwrap_err().to_string();
        assert!(e.contains("expected a time"), "{e}");
        let e = Measured::from_json("{", "m").unwrap_err().to_string();
        assert!(e.contains("not a measured.json"), "{e}");
        // Regression: a negative pass time, an unknown mode and steps out of plan order were
        // read as if measured.
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        m.ranks[0].passes[0].compute_ms = -5.0;
        let e = Measured::from_json(&serde_json::to_string(&m).unwrap(), "m").unwrap_err();
        assert!(e.to_string().contains("fwd compute_ms is -5"), "{e}");
        // Regression (bug hunt): `exposed_comm_ms` was not read, so a negative one passed.
        for rank_level in [false, true] {
            let mut m = scaled(&plan, &sim, 1.0, "fwd");
            if rank_level {
                m.ranks[0].exposed_comm_ms = Some(-1.0);
            } else {
                m.ranks[0].passes[0].exposed_comm_ms = Some(-1.0);
            }
            let e = Measured::from_json(&serde_json::to_string(&m).unwrap(), "m").unwrap_err();
            assert!(e.to_string().contains("exposed_comm_ms is -1"), "{e}");
        }
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        m.mode = "bogus".into();
        let e = Measured::from_json(&serde_json::to_string(&m).unwrap(), "m").unwrap_err();
        assert!(e.to_string().contains("mode is `bogus`"), "{e}");
        let mut m = scaled(&plan, &sim, 1.0, "fwd");
        for s in &mut m.ranks[0].passes[0].steps {
            s.step = 7;
        }
        let e = Measured::from_json(&serde_json::to_string(&m).unwrap(), "m").unwrap_err();
        assert!(e.to_string().contains("plan order"), "{e}");
    }

    /// Regression (bug hunt): a rank missing a pass was reported as totals that do not sum to
    /// its passes, and an `attention_time_ms` that was not the passes' slowest ends summed
    /// was read and compared.
    #[test]
    fn regression_missing_passes_and_an_end_to_end_time_that_is_not_the_ends() {
        let (plan, sim) = setup();
        let json = |m: &Measured| serde_json::to_string(m).unwrap();
        let m = scaled(&plan, &sim, 1.0, "both");
        let mut short = m.clone();
        short.ranks[0].passes.pop();
        let e = Measured::from_json(&json(&short), "m")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0 has passes [\"fwd\"] but pass is `both`"),
            "{e}"
        );
        // Ends of 2 and 3 ms forward, 5 and 4 backward: 3 + 5 end to end.
        let mut wrong = m.clone();
        for (r, e) in wrong.ranks.iter_mut().zip([[2.0, 5.0], [3.0, 4.0]]) {
            r.passes[0].end_ms = Some(e[0]);
            r.passes[1].end_ms = Some(e[1]);
            r.end_ms = Some(e[0] + e[1]);
        }
        let ends = 8.0;
        wrong.attention_time_ms = Some(1000.0);
        let e = Measured::from_json(&json(&wrong), "m")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("attention_time_ms is 1000, but each pass's slowest end_ms summed is"),
            "{e}"
        );
        wrong.attention_time_ms = Some(ends);
        assert!(Measured::from_json(&json(&wrong), "m").is_ok());
    }

    /// Regression (bug hunt): a rank's total that was not its passes' sum was compared per
    /// rank while its step rows said otherwise, and a single-device file's communication
    /// times were compared against the simulated distributed run.
    #[test]
    fn regression_totals_must_be_the_passes_sums_and_single_device_has_no_comm() {
        let (plan, sim) = setup();
        let json = |m: &Measured| serde_json::to_string(m).unwrap();
        let m = scaled(&plan, &sim, 1.0, "both");
        assert!(Measured::from_json(&json(&m), "m").is_ok());
        let mut wrong = m.clone();
        wrong.ranks[1].compute_ms = 1000.0;
        let e = Measured::from_json(&json(&wrong), "m")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 1 compute_ms is 1000, but its passes' compute_ms sum to"),
            "{e}"
        );
        let mut wrong = m.clone();
        for p in &mut wrong.ranks[0].passes {
            p.end_ms = Some(100.0);
        }
        wrong.ranks[0].end_ms = Some(300.0);
        let e = Measured::from_json(&json(&wrong), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 0 end_ms is 300"), "{e}");
        // Single-device: the same file with its communication cleared reads; any one
        // communication, wait or end time left is refused.
        let mut single = m.clone();
        single.mode = "single-device".into();
        single.attention_time_ms = None;
        for r in &mut single.ranks {
            r.comm_ms = None;
            r.end_ms = None;
            for p in &mut r.passes {
                p.comm_ms = None;
                p.end_ms = None;
                p.steps.iter_mut().for_each(|s| s.wait_ms = None);
            }
        }
        assert!(Measured::from_json(&json(&single), "m").is_ok());
        let mut wrong = single.clone();
        wrong.ranks[1].passes[1].steps[0].wait_ms = Some(0.0);
        let e = Measured::from_json(&json(&wrong), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("yet rank 1 gives communication"), "{e}");
        let mut wrong = single.clone();
        wrong.attention_time_ms = Some(1.0);
        let e = Measured::from_json(&json(&wrong), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("yet attention_time_ms is given"), "{e}");
    }

    /// Regression (bug hunt): a pass whose steps did not sum to it, a pass ending before its
    /// steps' compute and waits were over, and a distributed file with one rank's
    /// communication left out were all compared.
    #[test]
    fn regression_passes_must_add_up_and_distributed_files_be_complete() {
        let (plan, sim) = setup();
        let json = |m: &Measured| serde_json::to_string(m).unwrap();
        let m = scaled(&plan, &sim, 1.0, "both");
        assert!(Measured::from_json(&json(&m), "m").is_ok());
        let mut wrong = m.clone();
        for p in &mut wrong.ranks[0].passes {
            for s in &mut p.steps {
                s.compute_ms *= 10.0;
            }
        }
        let e = Measured::from_json(&json(&wrong), "m")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0 fwd compute_ms is")
                && e.contains("a pass's compute is its steps' sum"),
            "{e}"
        );
        let mut early = m.clone();
        for r in &mut early.ranks {
            for p in &mut r.passes {
                p.end_ms = Some(0.001);
            }
            r.end_ms = Some(0.002);
        }
        early.attention_time_ms = Some(0.002);
        let e = Measured::from_json(&json(&early), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 0 fwd end_ms is 0.001, before"), "{e}");
        for gap in 0..4 {
            let mut holes = m.clone();
            let r = &mut holes.ranks[1];
            match gap {
                0 => r.comm_ms = None,
                1 => r.passes[1].end_ms = None,
                2 => r.passes[0].steps[1].wait_ms = None,
                _ => holes.attention_time_ms = None,
            }
            let e = Measured::from_json(&json(&holes), "m")
                .unwrap_err()
                .to_string();
            assert!(e.contains("mode is distributed, yet"), "{gap}: {e}");
        }
    }

    /// Regression (bug hunt): a measurement of a tiny-model plan was compared with a
    /// llama3-70b plan of the same scheme, and one of another batch of the same scheme and
    /// step count; the `plan` block's model and fingerprint now say so.
    #[test]
    fn regression_a_measurement_of_another_model_or_batch_is_refused() {
        let (plan, sim) = setup();
        let mut m = scaled(&plan, &sim, 1.0, "both");
        assert!(validate(&plan, &sim, &m, "m.json").is_ok());
        let mut other = plan.clone();
        other.model = Some("tiny-gqa".into());
        let e = validate(&other, &sim, &m, "m.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not this plan (zigzag for tiny-gqa"), "{e}");
        let fp = m.plan.as_mut().unwrap().fingerprint.as_mut().unwrap();
        fp.tokens += 1;
        let e = validate(&plan, &sim, &m, "m.json").unwrap_err().to_string();
        assert!(e.contains("5121 tokens in 2 documents"), "{e}");
        m.plan.as_mut().unwrap().fingerprint = None;
        assert!(
            validate(&plan, &sim, &m, "m.json").is_ok(),
            "older files lack the fingerprint"
        );
    }
}
