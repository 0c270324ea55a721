//! Plan IR types and their JSON form. The format is documented in `docs/plan-format.md`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Mask;

/// Newest version of the plan format this build reads and writes. Bump on any incompatible
/// change.
///
/// Version 2 added [`Transfer::also_to`]. A plan is written with the oldest version that can
/// hold it ([`Plan::required_version`]): only plans with a multicast transfer say 2, so every
/// other plan stays byte-identical to what earlier builds wrote and readable by executors that
/// know version 1 only. A reader of version 1 would silently drop the extra receivers (it does
/// not know the key), which is why such plans must carry the new number.
pub const PLAN_VERSION: u32 = 2;

/// Every plan format version this build reads.
pub const PLAN_VERSIONS: std::ops::RangeInclusive<u32> = 1..=PLAN_VERSION;

/// Errors reading or writing plan files.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File involved.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file is not a plan in the expected JSON shape.
    #[error("{path}: not a valid fcp plan: {message}")]
    Parse {
        /// File involved.
        path: String,
        /// What serde said.
        message: String,
    },
    /// The plan was written by a different, incompatible format version.
    #[error("{path}: plan format version {found}, this fcp reads versions 1 to {PLAN_VERSION}")]
    Version {
        /// File involved.
        path: String,
        /// Version found in the file.
        found: String,
    },
    /// A planner could not produce a plan for its input.
    #[error("{0}")]
    Planning(String),
}

/// What a JSON value is, for messages: `an array`, `a number`, ...
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A token range `[start, end)` of one document. Serialised as `[doc, start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "(u32, u64, u64)")]
pub struct TokenRange {
    /// Document id (index into [`Plan::documents`]).
    pub doc: u32,
    /// First token position, inclusive.
    pub start: u64,
    /// Last token position, exclusive.
    pub end: u64,
}

impl TokenRange {
    /// A range of document `doc`.
    pub fn new(doc: u32, start: u64, end: u64) -> Self {
        TokenRange { doc, start, end }
    }
    /// Number of tokens.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
    /// True when the range holds no token.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

impl From<(u32, u64, u64)> for TokenRange {
    fn from(t: (u32, u64, u64)) -> Self {
        TokenRange::new(t.0, t.1, t.2)
    }
}
impl From<TokenRange> for (u32, u64, u64) {
    fn from(r: TokenRange) -> Self {
        (r.doc, r.start, r.end)
    }
}

/// Reads a fixed-length JSON array of whole numbers, `N` of them, each into a `u64` (the
/// caller narrows), saying what the array is when it has too few or too many. Bug hunt: a
/// range with a fourth number was "trailing characters".
struct Numbers<const N: usize>(&'static str);

impl<'de, const N: usize> serde::de::Visitor<'de> for Numbers<N> {
    type Value = [u64; N];

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.0)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<[u64; N], A::Error> {
        let mut out = [0u64; N];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = seq
                .next_element()?
                .ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
        }
        let mut n = N;
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            n += 1;
        }
        if n != N {
            return Err(serde::de::Error::invalid_length(n, &self));
        }
        Ok(out)
    }
}

/// `v` as a `T`, or an error saying it is out of `what`'s range.
fn narrow<T: TryFrom<u64>, E: serde::de::Error>(v: u64, what: &str) -> Result<T, E> {
    T::try_from(v).map_err(|_| E::custom(format!("{what} {v} is out of range")))
}

impl<'de> Deserialize<'de> for TokenRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let [doc, start, end] =
            d.deserialize_seq(Numbers::<3>("a token range: [doc, start, end], 3 numbers"))?;
        Ok(TokenRange::new(narrow(doc, "doc")?, start, end))
    }
}

impl<'de> Deserialize<'de> for HeadRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let [start, end] =
            d.deserialize_seq(Numbers::<2>("a head range: [start, end], 2 numbers"))?;
        Ok(HeadRange {
            start: narrow(start, "head")?,
            end: narrow(end, "head")?,
        })
    }
}

/// A range `[start, end)` of query heads, for schemes that split heads (Ulysses).
/// Serialised as `[start, end]`. Absent means all heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "(u32, u32)")]
pub struct HeadRange {
    /// First query head, inclusive.
    pub start: u32,
    /// Last query head, exclusive.
    pub end: u32,
}

impl From<(u32, u32)> for HeadRange {
    fn from(t: (u32, u32)) -> Self {
        HeadRange {
            start: t.0,
            end: t.1,
        }
    }
}
impl From<HeadRange> for (u32, u32) {
    fn from(h: HeadRange) -> Self {
        (h.start, h.end)
    }
}

/// One document of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// Id, equal to the document's index in [`Plan::documents`].
    pub id: u32,
    /// Length in tokens (≥ 1).
    pub len: u64,
    /// Padding tokens appended to the document by schemes whose implementations need
    /// divisible lengths (TransformerEngine's per-document 2N rule, Llama3 CP, Ulysses). Plans
    /// cover `len + pad` tokens, so padding costs the compute, memory and bytes it costs on a
    /// GPU; absent = 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad: u64,
}

/// Whether a count is 0: serde's test for leaving such a field out of a file.
pub(crate) fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl Document {
    /// Tokens the plan covers: the document plus its padding.
    pub fn extent(&self) -> u64 {
        self.len.saturating_add(self.pad)
    }
}

/// Scheme that produced the plan and the parameters it ran with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemeInfo {
    /// Scheme name as registered (`ring`, `zigzag`, `fcp`, ...).
    pub name: String,
    /// Parameters, sorted by key so output is deterministic.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
}

/// One attention work item: queries `q` attend to keys/values `kv` of the same document under
/// the plan's mask. Pairs the mask forbids are skipped by the kernel, not computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Query tokens.
    pub q: TokenRange,
    /// Key/value tokens.
    pub kv: TokenRange,
    /// Query heads computed; absent = all heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<HeadRange>,
}

/// Tasks a rank runs together; one step may be one varlen kernel launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Step {
    /// Work items of the step, in launch order.
    pub tasks: Vec<Task>,
}

/// Everything one rank owns and runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlan {
    /// Rank id, equal to its index in [`Plan::ranks`].
    pub rank: u32,
    /// Token ranges this rank owns, in its local buffer order: their Q, and the K/V it holds
    /// from the start.
    pub owned: Vec<TokenRange>,
    /// Compute steps in order; step `s` may start once every transfer with `arrive_by <= s`
    /// to this rank has landed.
    pub steps: Vec<Step>,
    /// Buffer slots this rank allocates for masked padding that holds no attention (MagiAttention
    /// pads the packed sequence to whole chunks per rank): memory without compute. Absent = 0.
    /// Padding that is attended like data is `Document::pad` instead.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad_slots: u64,
}

/// How a transfer is carried out, so the simulator can cost it with the right algorithm.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum TransferKind {
    /// Point-to-point send/receive.
    #[default]
    P2p,
    /// One piece of an all-gather among the ranks sharing its `collective` id.
    AllGather,
    /// One piece of an all-to-all.
    AllToAll,
    /// One piece of a reduce-scatter.
    ReduceScatter,
}

/// Which tensor a transfer moves.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum TransferTensor {
    /// Keys and values of the ranges.
    #[default]
    Kv,
    /// Queries of the ranges (head-parallel schemes move Q to where it is computed).
    Q,
    /// Partial attention outputs (with their log-sum-exp) of the ranges, returned to the
    /// owner of those queries, which merges them.
    Out,
}

/// Data moved from `src` to `dst`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Algorithm family; pieces of one collective call share `collective`.
    #[serde(default)]
    pub kind: TransferKind,
    /// Id of the collective call this piece belongs to (absent for p2p).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<u32>,
    /// Tensor moved.
    #[serde(default)]
    pub tensor: TransferTensor,
    /// Sending rank.
    pub src: u32,
    /// Receiving rank (the first, when the transfer has [`Transfer::also_to`]).
    pub dst: u32,
    /// Further ranks that receive the same data from `src` with the same timing, in order
    /// (plan format version 2). An all-gather among N ranks lists each member's shard once,
    /// to `dst` and `also_to`, rather than once per receiver: N pieces instead of N(N − 1),
    /// which took per-doc CP at 256 ranks past what a plan may hold and a 2,048-rank Llama3 CP
    /// plan to 712 MB. Every reader treats the transfer as one delivery per receiver
    /// ([`Plan::deliveries`]), in the order `dst`, then `also_to`. Empty for most transfers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_to: Vec<u32>,
    /// Token ranges moved (all must be available on `src` at `issue_at`).
    pub ranges: Vec<TokenRange>,
    /// Query heads moved; absent = all heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<HeadRange>,
    /// The transfer starts when `src` starts its step `issue_at` (a value past the last step
    /// means after all of `src`'s compute).
    pub issue_at: u32,
    /// The data must have arrived before `dst` starts its step `arrive_by`.
    pub arrive_by: u32,
    /// Communication round for congestion-free schedules (at most one send and one receive per
    /// rank in each round); absent = `issue_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
}

impl Transfer {
    /// A point-to-point K/V transfer.
    pub fn kv(src: u32, dst: u32, ranges: Vec<TokenRange>, issue_at: u32, arrive_by: u32) -> Self {
        Transfer {
            kind: TransferKind::P2p,
            collective: None,
            tensor: TransferTensor::Kv,
            src,
            dst,
            also_to: Vec::new(),
            ranges,
            heads: None,
            issue_at,
            arrive_by,
            round: None,
        }
    }

    /// The collective call this transfer is a piece of, `(collective, kind)`: every reader
    /// groups pieces so. `None` for a `p2p` transfer (a stray `collective` id included) or a
    /// piece without an id, which run as point-to-point messages.
    pub fn call(&self) -> Option<(u32, TransferKind)> {
        match (self.kind, self.collective) {
            (TransferKind::P2p, _) | (_, None) => None,
            (kind, Some(id)) => Some((id, kind)),
        }
    }

    /// Every rank that receives the transfer: `dst`, then `also_to`.
    pub fn receivers(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::once(self.dst).chain(self.also_to.iter().copied())
    }

    /// Number of receivers (1 for a point-to-point transfer).
    pub fn receiver_count(&self) -> usize {
        1 + self.also_to.len()
    }

    /// Tokens moved.
    pub fn tokens(&self) -> u64 {
        self.ranges.iter().map(TokenRange::len).sum()
    }

    /// Round used by the congestion-free check.
    pub fn round(&self) -> u32 {
        self.round.unwrap_or(self.issue_at)
    }
}

/// A plan: one batch on one CP group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Format version: one of [`PLAN_VERSIONS`]; written as [`Plan::required_version`].
    pub version: u32,
    /// Scheme and parameters.
    pub scheme: SchemeInfo,
    /// CP group size.
    pub num_ranks: u32,
    /// Mask inside each document.
    pub mask: Mask,
    /// Query heads of the model the plan was made for.
    pub q_heads: u32,
    /// Key/value heads of the model the plan was made for.
    pub kv_heads: u32,
    /// Per-rank token budget the scheme promises to respect (checked by the verifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cap_tokens: Option<u64>,
    /// Whether the scheme claims at most one send and one receive per rank per round.
    #[serde(default)]
    pub congestion_free: bool,
    /// Provenance: batch index in the packed trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_index: Option<u64>,
    /// Provenance: model preset or file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Provenance: hardware profile name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<String>,
    /// Provenance: the TOML file the hardware profile was read from, as given, when it was not
    /// a bundled profile. A file may carry a bundled name (`name = "h100"`, or a file stem
    /// such as `cluster/h100.toml`), so the name alone cannot say which profile to simulate
    /// with: reading the plan, `fcp simulate` asks for the file again instead of taking the
    /// bundled one of that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_file: Option<String>,
    /// Provenance: the TOML file the model was read from, as given, when it was not a preset
    /// (the same reason as `hardware_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_file: Option<String>,
    /// Provenance: the tensor-parallel degree the plan was made under (`--tp`), when above 1.
    /// Its `q_heads` and `kv_heads` are then one GPU's share of the model's; commands reading
    /// the plan split the model the same way ([`crate::tp::split`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    /// Documents of the batch.
    pub documents: Vec<Document>,
    /// The user's layout, when it differs from the planned one (a transparent reshuffler,
    /// FCP §4.3): per rank, the ranges the dataloader hands it. A rank then starts with the Q
    /// and K/V of these ranges only; its `owned` ranges arrive through `q`/`kv` transfers, and
    /// every output row must be returned to its input owner by `out` transfers. Absent: every
    /// rank starts with its `owned` ranges and outputs stay there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_layout: Option<Vec<Vec<TokenRange>>>,
    /// Per-rank layout and compute steps, indexed by rank.
    pub ranks: Vec<RankPlan>,
    /// Every data movement.
    pub transfers: Vec<Transfer>,
}

/// One receiver of one transfer: what a point-to-point reading of the plan sees. A transfer
/// with [`Transfer::also_to`] is one delivery per receiver; any other is one delivery.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// Index of the transfer in [`Plan::transfers`].
    pub index: usize,
    /// The transfer.
    pub transfer: &'a Transfer,
    /// The receiving rank of this delivery.
    pub dst: u32,
}

impl Plan {
    /// Every (transfer, receiver) pair in plan order, each transfer's receivers in the order
    /// of [`Transfer::receivers`]. Listing an all-gather's pieces one per pair (as version 1
    /// plans did) gives these deliveries in the same order, so the simulator and verifier
    /// read both forms alike.
    pub fn deliveries(&self) -> impl Iterator<Item = Delivery<'_>> + '_ {
        self.transfers
            .iter()
            .enumerate()
            .flat_map(|(index, transfer)| {
                transfer.receivers().map(move |dst| Delivery {
                    index,
                    transfer,
                    dst,
                })
            })
    }

    /// Number of deliveries ([`Plan::deliveries`]).
    pub fn delivery_count(&self) -> usize {
        self.transfers.iter().map(Transfer::receiver_count).sum()
    }

    /// The oldest format version that holds this plan: 2 when a transfer has more than one
    /// receiver, else 1.
    pub fn required_version(&self) -> u32 {
        if self.transfers.iter().any(|t| !t.also_to.is_empty()) {
            2
        } else {
            1
        }
    }

    /// Ranges rank `r` holds before any transfer: its `input_layout` entry when the plan has
    /// one, else its `owned` ranges.
    pub fn initial(&self, r: usize) -> &[TokenRange] {
        match &self.input_layout {
            Some(l) => l.get(r).map_or(&[], Vec::as_slice),
            None => &self.ranks[r].owned,
        }
    }

    /// Per rank: the rows its token-linear layers (projections, MLP) run on: the tokens it
    /// owns, attended padding included, plus its masked padding slots, which are rows of the
    /// same local tensor. Saturating.
    pub fn tokens_per_rank(&self) -> Vec<u64> {
        self.ranks
            .iter()
            .map(|r| {
                r.owned
                    .iter()
                    .map(TokenRange::len)
                    .fold(r.pad_slots, u64::saturating_add)
            })
            .collect()
    }

    /// Total tokens of the batch (without padding). Saturating, like [`Plan::pad_tokens`].
    pub fn total_tokens(&self) -> u64 {
        self.documents
            .iter()
            .map(|d| d.len)
            .fold(0, u64::saturating_add)
    }

    /// Padding tokens the scheme added: attended padding on documents plus masked buffer slots
    /// on ranks. Saturating: a hand-edited plan's `pad_slots` of 2⁶³ on two ranks (which the
    /// verifier refuses) reads as "more than any batch", never as a small number that wrapped
    /// around, nor as a panic.
    pub fn pad_tokens(&self) -> u64 {
        self.documents
            .iter()
            .map(|d| d.pad)
            .chain(self.ranks.iter().map(|r| r.pad_slots))
            .fold(0, u64::saturating_add)
    }

    /// Number of tasks over all ranks and steps.
    pub fn num_tasks(&self) -> usize {
        self.ranks
            .iter()
            .flat_map(|r| &r.steps)
            .map(|s| s.tasks.len())
            .sum()
    }

    /// Serialise to the canonical JSON text (compact, one trailing newline). Parsing this text
    /// and serialising again gives the same bytes.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string(self).expect("plan serialisation cannot fail");
        s.push('\n');
        s
    }

    /// Parse a plan from JSON text; `origin` names the source in error messages.
    ///
    /// A plan of the current version parses straight into [`Plan`]. Anything else goes through
    /// a generic JSON value first, so a plan of another version is reported as such rather than
    /// by whichever field changed shape. (Always parsing the value first cost a 278 MB FlashCP
    /// plan of 256 ranks 3 GB and a third of `fcp verify`'s time.)
    ///
    /// An error names the field it is about (`ranks[0].pad_slots: invalid value: integer
    /// `-1`, expected u64`) and quotes a number as the file writes it.
    ///
    /// A UTF-8 byte-order mark before the JSON (Notepad writes one) is skipped, as trace files'
    /// are.
    pub fn from_json(text: &str, origin: &str) -> Result<Plan, PlanError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // The typed error, kept without the plan so a plan of another version is not held
        // while its value is parsed.
        let typed_err = match serde_json::from_str::<Plan>(text) {
            Ok(plan) if PLAN_VERSIONS.contains(&plan.version) => return Ok(plan),
            Ok(_) => None,
            Err(e) => Some(e),
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PlanError::Parse {
                path: origin.to_string(),
                message: e.to_string(),
            })?;
        match value.get("version") {
            Some(v)
                if v.as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .is_some_and(|v| PLAN_VERSIONS.contains(&v)) => {}
            Some(v) => {
                return Err(PlanError::Version {
                    path: origin.to_string(),
                    found: v.to_string(),
                })
            }
            None if !value.is_object() => {
                return Err(PlanError::Parse {
                    path: origin.to_string(),
                    message: format!(
                        "a plan is a JSON object (`{{\"version\": ..., \"ranks\": ...}}`), not {}",
                        json_kind(&value)
                    ),
                })
            }
            None => {
                return Err(PlanError::Parse {
                    path: origin.to_string(),
                    message: "missing `version`".to_string(),
                })
            }
        }
        // A known version that did not parse: the typed error knows where it stopped.
        if let Some(e) = typed_err {
            return Err(PlanError::Parse {
                path: origin.to_string(),
                message: crate::jsonpos::json_error(text, &e),
            });
        }
        serde_json::from_value(value).map_err(|e| PlanError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })
    }

    /// Read a plan file (`-` for standard input).
    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        let origin = path.display().to_string();
        let text = if origin == "-" {
            crate::input::read_all(std::io::stdin(), "a JSON plan", false).map_err(|source| {
                PlanError::Io {
                    path: origin.clone(),
                    source,
                }
            })?
        } else {
            crate::input::read_text(path, "a JSON plan", false).map_err(|source| PlanError::Io {
                path: origin.clone(),
                source,
            })?
        };
        Plan::from_json(&text, &origin)
    }

    /// Write the plan atomically (no partial file on failure).
    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        crate::output::write_atomic(path, self.to_json().as_bytes()).map_err(|source| {
            PlanError::Io {
                path: path.display().to_string(),
                source,
            }
        })
    }
}
