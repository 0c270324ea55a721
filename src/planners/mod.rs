//! Planners: one file per scheme, all behind the [`Planner`] trait, all emitting the same
//! [`Plan`] IR.

use std::collections::BTreeMap;

use crate::hardware::Hardware;
use crate::model::Model;
use crate::plan::{Mask, Plan, PlanError};
use crate::trace::Batch;

pub mod auto;
mod bytescale;
pub mod fcp;
pub(crate) mod flashcp;
pub mod hybrid;
mod llama3;
mod magi;
mod per_doc;
pub mod rebalance;
pub mod repair;
mod ring;
mod shard;
mod ulysses;
mod usp;
mod wlb_llm;
mod zigzag;

pub use bytescale::ByteScale;
pub use fcp::Fcp;
pub use flashcp::FlashCp;
pub use llama3::{Llama3, Llama3Contig};
pub use magi::Magi;
pub use per_doc::PerDoc;
pub use ring::Ring;
pub use ulysses::Ulysses;
pub use usp::Usp;
pub use wlb_llm::WlbLlm;
pub use zigzag::Zigzag;

/// The most attention tiles (tasks), and separately the most token ranges carried by transfers,
/// a plan may hold: each limit is about 2 GB in memory, more as JSON, and minutes to verify and
/// simulate. Schemes that cut every document across all N ranks (ring, zigzag, ByteScale's
/// per-document rings) need about N²/2 tiles per long document, and all-gather schemes list
/// every shard once per receiver (N² pieces of N·docs ranges); at 256–1024 ranks × 32K tokens
/// both reach billions, so those planners refuse such batches up front, saying why, instead of
/// exhausting memory.
pub const MAX_PLAN_ITEMS: u64 = 1 << 25;

/// The largest CP group a plan may have: 65,536 ranks, far past any CP degree in use (the
/// anchors top out at a few thousand GPUs per sequence). Planners size per-rank tables by N,
/// so a mistyped `--ranks 4294967295` used to abort on a 64 GB allocation instead of saying
/// what was wrong.
pub const MAX_RANKS: u32 = 1 << 16;

/// What every planner is given besides the batch.
#[derive(Debug, Clone)]
pub struct PlanContext<'a> {
    /// CP group size N.
    pub ranks: u32,
    /// Token budget per rank the batch was packed for (N × this is the batch budget).
    pub tokens_per_rank: u64,
    /// Mask inside each document.
    pub mask: Mask,
    /// Attention shape (head counts bound some schemes; costs depend on it).
    pub model: &'a Model,
    /// Hardware profile, for planners that weigh work by its cost.
    pub hardware: &'a Hardware,
    /// How the plan will be judged: what `auto` and `hybrid`, which choose among candidates
    /// by simulating them, simulate. Every other planner ignores it.
    pub judge: Judge,
}

/// How a command judges plans, for the planners that choose by simulating (`auto`, `hybrid`,
/// and `fcp:node_heads` merging tiles): the passes, and — where they price the whole layer —
/// what the backward pass recomputes and whether TP collectives overlap their GEMMs. The
/// default is a training step, nothing recomputed, collectives exposed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Judge {
    /// Passes simulated: both (training) unless a command judges one alone (`--pass fwd`).
    pub pass: crate::sim::PassSel,
    /// `--recompute`: what the backward pass reruns.
    pub recompute: crate::model::Recompute,
    /// `--tp-overlap`: TP collectives overlap the GEMMs they feed or drain.
    pub tp_overlap: bool,
}

/// A CP scheme: turns one batch into one plan.
///
/// Planners never simulate; a planner that needs a cost estimate asks the shared cost model in
/// [`crate::hardware`].
pub trait Planner {
    /// Registered scheme name, as written in plans and accepted by `--scheme`.
    fn name(&self) -> &'static str;
    /// Parameters the planner runs with, recorded in the plan.
    fn params(&self) -> BTreeMap<String, serde_json::Value> {
        BTreeMap::new()
    }
    /// Plan one batch.
    fn plan(&self, batch: &Batch, ctx: &PlanContext<'_>) -> Result<Plan, PlanError>;
}

/// Names of all registered schemes, in the order `--schemes all` runs them.
pub const SCHEMES: &[&str] = &[
    "ring",
    "zigzag",
    "llama3",
    "llama3-contig",
    "per-doc",
    "ulysses",
    "usp",
    "bytescale",
    "wlb-llm",
    "magi",
    "fcp",
    "flashcp",
    "hybrid",
];

/// Schemes that choose among the others per batch (`auto`): accepted everywhere a scheme is,
/// but not part of `--schemes all`, which already runs every one they choose from.
pub const META_SCHEMES: &[&str] = &["auto"];

/// A scheme entry as users write it: `name` or `name:key=value,key=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemeSpec {
    /// Scheme name.
    pub name: String,
    /// Parameters in the order given.
    pub params: Vec<(String, String)>,
}

/// Errors resolving a scheme entry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchemeError {
    /// No scheme of that name.
    #[error("unknown scheme `{name}` (known: {known})")]
    Unknown {
        /// Name given.
        name: String,
        /// Registered names.
        known: String,
    },
    /// A parameter value the scheme cannot use, or an entry it cannot read.
    #[error("scheme `{scheme}`: {message}")]
    BadParam {
        /// Scheme name.
        scheme: String,
        /// What is wrong.
        message: String,
    },
    /// An entry listed twice (`ring,ring`, or a name beside `all`): it would plan and print
    /// the same row twice (bug hunt; a sweep refuses an axis value listed twice alike).
    #[error("scheme list: `{scheme}` is listed twice; name each scheme once")]
    Duplicate {
        /// The entry, with its parameters.
        scheme: String,
    },
    /// An empty entry in a comma-separated list of schemes (`ring,,zigzag`): a scheme left
    /// out by mistake, which used to be skipped without a word.
    #[error(
        "scheme list `{list}`: entry {position} is empty; remove the extra comma or name a \
         scheme there"
    )]
    EmptyEntry {
        /// The list as given.
        list: String,
        /// 1-based position of the empty entry among the list's comma-separated entries.
        position: usize,
    },
    /// A parameter the scheme does not take at all: its own variant, so a caller adding
    /// parameters (`fcp plan`'s flags) can tell "not for this scheme" from "a bad value".
    #[error("scheme `{scheme}`: takes no parameter `{key}`{}", known_list(.known))]
    NotTaken {
        /// Scheme name.
        scheme: String,
        /// The parameter given.
        key: String,
        /// The parameters the scheme takes (empty: none).
        known: Vec<String>,
    },
}

impl SchemeError {
    /// `scheme` takes no parameter `key`; it takes `known`.
    pub fn not_taken(scheme: &str, key: &str, known: &[&str]) -> SchemeError {
        SchemeError::NotTaken {
            scheme: scheme.to_string(),
            key: key.to_string(),
            known: known.iter().map(|k| k.to_string()).collect(),
        }
    }
}

/// ` (known: a, b)`, or nothing for a scheme without parameters.
fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        String::new()
    } else {
        format!(" (known: {})", known.join(", "))
    }
}

impl SchemeSpec {
    /// Parse `name[:key=value,...]`. A key given twice is refused (`fcp:block=512,block=1024`
    /// used to plan with the last one without a word).
    pub fn parse(text: &str) -> Result<SchemeSpec, SchemeError> {
        let (name, rest) = match text.split_once(':') {
            Some((n, r)) => (n.trim(), Some(r)),
            None => (text.trim(), None),
        };
        let mut params = Vec::new();
        if let Some(rest) = rest {
            for item in rest.split(',').filter(|s| !s.trim().is_empty()) {
                let (k, v) = item.split_once('=').ok_or_else(|| SchemeError::BadParam {
                    scheme: name.to_string(),
                    message: format!("parameter `{item}` is not key=value"),
                })?;
                let k = k.trim();
                if params.iter().any(|(seen, _)| seen == k) {
                    return Err(SchemeError::BadParam {
                        scheme: name.to_string(),
                        message: format!("parameter `{k}` given twice"),
                    });
                }
                params.push((k.to_string(), v.trim().to_string()));
            }
        }
        Ok(SchemeSpec {
            name: name.to_string(),
            params,
        })
    }

    /// The value given for `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Set `key` to `value`: in place when the entry has it, appended otherwise (what a
    /// caller overriding a user's entry wants, e.g. the ablation's rows).
    pub fn set(&mut self, key: &str, value: &str) {
        match self.params.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value.to_string(),
            None => self.params.push((key.to_string(), value.to_string())),
        }
    }
}

impl std::fmt::Display for SchemeSpec {
    /// The entry as users write it, parameters in order: `parse` reads it back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { ':' } else { ',' })?;
        }
        Ok(())
    }
}

/// The parameters of one scheme entry, checked against the keys the scheme takes.
#[derive(Debug)]
struct Params {
    scheme: String,
    values: BTreeMap<String, String>,
}

impl SchemeSpec {
    /// The entry's parameters, refusing keys outside `known`.
    fn params_of(&self, known: &[&str]) -> Result<Params, SchemeError> {
        let mut values = BTreeMap::new();
        for (k, v) in &self.params {
            if !known.contains(&k.as_str()) {
                return Err(SchemeError::not_taken(&self.name, k, known));
            }
            // Keys are unique: `SchemeSpec::parse` refuses repeats.
            values.insert(k.clone(), v.clone());
        }
        Ok(Params {
            scheme: self.name.clone(),
            values,
        })
    }
}

impl Params {
    /// A positive integer parameter, `default` when absent.
    fn positive<T>(&mut self, key: &str, default: T) -> Result<T, SchemeError>
    where
        T: std::str::FromStr + PartialOrd + From<u8>,
    {
        match self.values.remove(key) {
            None => Ok(default),
            Some(text) => match text.parse::<T>() {
                Ok(v) if v >= T::from(1) => Ok(v),
                _ => Err(SchemeError::BadParam {
                    scheme: self.scheme.clone(),
                    message: format!("`{key}` must be a positive integer, got `{text}`"),
                }),
            },
        }
    }

    /// A ratio parameter that must be a finite number ≥ 1 (an imbalance target such as
    /// FlashCP's R), `default` when absent.
    fn ratio_at_least_one(&mut self, key: &str, default: f64) -> Result<f64, SchemeError> {
        match self.values.remove(key) {
            None => Ok(default),
            Some(text) => match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
                _ => Err(SchemeError::BadParam {
                    scheme: self.scheme.clone(),
                    message: format!("`{key}` must be a number ≥ 1, got `{text}`"),
                }),
            },
        }
    }
}

/// Parse one parameter value of `scheme`: a switch (`true`/`1`/`yes`/`on`,
/// `false`/`0`/`no`/`off`). Shared by the planners that parse their own entries (FCP,
/// `hybrid`), so every switch reads and fails alike.
pub(crate) fn param_bool(scheme: &str, key: &str, v: &str) -> Result<bool, SchemeError> {
    match v {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(SchemeError::BadParam {
            scheme: scheme.to_string(),
            message: format!("`{key}` must be true or false, not `{v}`"),
        }),
    }
}

/// Parse one parameter value of `scheme`: an integer ≥ 1.
pub(crate) fn param_positive(scheme: &str, key: &str, v: &str) -> Result<u64, SchemeError> {
    match v.parse::<u64>() {
        Ok(x) if x >= 1 => Ok(x),
        _ => Err(SchemeError::BadParam {
            scheme: scheme.to_string(),
            message: format!("`{key}` must be an integer ≥ 1, not `{v}`"),
        }),
    }
}

/// Parse one parameter value of `scheme`: a number ≥ 0; `inf` too unless `finite`.
pub(crate) fn param_non_negative(
    scheme: &str,
    key: &str,
    v: &str,
    finite: bool,
) -> Result<f64, SchemeError> {
    match v.parse::<f64>() {
        Ok(x) if x >= 0.0 && (x.is_finite() || !finite) => Ok(x),
        _ => Err(SchemeError::BadParam {
            scheme: scheme.to_string(),
            message: if finite {
                format!("`{key}` must be a finite number ≥ 0, not `{v}`")
            } else {
                format!("`{key}` must be a number ≥ 0 or `inf`, not `{v}`")
            },
        }),
    }
}

/// A limit parameter as JSON, for `scheme.params`: the number, or `"inf"` (JSON has no
/// infinity; the parsers above read `inf` back).
pub(crate) fn limit_json(f: f64) -> serde_json::Value {
    serde_json::Number::from_f64(f).map_or_else(|| "inf".into(), serde_json::Value::Number)
}

/// Build the planner a scheme entry names (`ring`, `zigzag`, `fcp:block=2048`, ...).
///
/// ```
/// use fcp::hardware::Hardware;
/// use fcp::plan::{verify, Mask};
/// use fcp::planners::{planner_for, PlanContext};
/// use fcp::{Batch, Model};
///
/// let hardware = Hardware::load("h100").unwrap();
/// let model = Model::load("llama3-8b").unwrap();
/// let ctx = PlanContext { ranks: 4, tokens_per_rank: 4096, mask: Mask::Causal, model: &model, hardware: &hardware, judge: fcp::planners::Judge::default() };
/// let plan = planner_for("zigzag").unwrap().plan(&Batch::new(0, vec![5000, 700, 3]), &ctx).unwrap();
/// assert!(verify(&plan).is_empty());
/// ```
/// What tells two scheme entries apart: the planner's name and its parameters once read. Two
/// entries with the same identity plan alike (`fcp:block=2048,coalesce=8` and
/// `fcp:coalesce=8,block=2048`), so `compare` and `sweep` refuse the second.
pub type PlanningIdentity = (&'static str, BTreeMap<String, serde_json::Value>);

/// The [`PlanningIdentity`] of a scheme entry.
pub fn planning_identity(spec: &str) -> Result<PlanningIdentity, SchemeError> {
    let p = planner_for(spec)?;
    Ok((p.name(), p.params()))
}

pub fn planner_for(spec: &str) -> Result<Box<dyn Planner>, SchemeError> {
    let spec = SchemeSpec::parse(spec)?;
    let no_params = |spec: &SchemeSpec| -> Result<(), SchemeError> {
        match spec.params.first() {
            None => Ok(()),
            Some((k, _)) => Err(SchemeError::not_taken(&spec.name, k, &[])),
        }
    };
    match spec.name.as_str() {
        "ring" => {
            no_params(&spec)?;
            Ok(Box::new(Ring))
        }
        "zigzag" => {
            no_params(&spec)?;
            Ok(Box::new(Zigzag))
        }
        "llama3" => {
            no_params(&spec)?;
            Ok(Box::new(Llama3))
        }
        "llama3-contig" => {
            let mut p = spec.params_of(&["heads_k_stride"])?;
            let d = Llama3Contig::default();
            Ok(Box::new(Llama3Contig {
                heads_k_stride: p.positive("heads_k_stride", d.heads_k_stride)?,
            }))
        }
        "per-doc" => {
            no_params(&spec)?;
            Ok(Box::new(PerDoc))
        }
        "ulysses" => {
            no_params(&spec)?;
            Ok(Box::new(Ulysses))
        }
        "usp" => {
            let mut p = spec.params_of(&["ulysses", "inner"])?;
            let ulysses = match p.values.contains_key("ulysses") {
                true => Some(p.positive("ulysses", 1)?),
                false => None,
            };
            let inner = match p.values.remove("inner").as_deref() {
                None | Some("ulysses") => usp::Inner::Ulysses,
                Some("ring") => usp::Inner::Ring,
                Some(other) => {
                    return Err(SchemeError::BadParam {
                        scheme: spec.name.clone(),
                        message: format!("`inner` must be ulysses or ring, not `{other}`"),
                    })
                }
            };
            Ok(Box::new(Usp { ulysses, inner }))
        }
        "bytescale" => {
            no_params(&spec)?;
            Ok(Box::new(ByteScale))
        }
        "wlb-llm" => {
            no_params(&spec)?;
            Ok(Box::new(WlbLlm))
        }
        "magi" => {
            let mut p = spec.params_of(&["chunk", "degree"])?;
            let d = Magi::default();
            Ok(Box::new(Magi {
                chunk: p.positive("chunk", d.chunk)?,
                degree: p.positive("degree", d.degree)?,
            }))
        }
        "fcp" => Ok(Box::new(Fcp::from_spec(&spec)?)),
        "flashcp" => Ok(Box::new(FlashCp::from_spec(&spec)?)),
        "hybrid" => Ok(Box::new(hybrid::Hybrid::from_spec(&spec)?)),
        "auto" => Ok(Box::new(auto::Auto::from_spec(&spec)?)),
        other => Err(SchemeError::Unknown {
            name: other.to_string(),
            known: SCHEMES
                .iter()
                .chain(META_SCHEMES)
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parses_params() {
        let s = SchemeSpec::parse("fcp:block=2048,coalesce=8").unwrap();
        assert_eq!(s.name, "fcp");
        assert_eq!(
            s.params,
            vec![
                ("block".into(), "2048".into()),
                ("coalesce".into(), "8".into())
            ]
        );
    }

    #[test]
    fn unknown_scheme_is_named() {
        let err = planner_for("nope").err().unwrap();
        assert!(err.to_string().contains("unknown scheme `nope`"));
    }

    #[test]
    fn scheme_params_are_checked() {
        assert!(planner_for("llama3-contig:heads_k_stride=2").is_ok());
        let e = planner_for("llama3-contig:stride=2")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("takes no parameter `stride` (known: heads_k_stride)"),
            "{e}"
        );
        let e = planner_for("llama3-contig:heads_k_stride=0")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("`heads_k_stride` must be a positive integer, got `0`"),
            "{e}"
        );
        let e = planner_for("llama3-contig:heads_k_stride=x")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("got `x`"), "{e}");
        let e = planner_for("llama3-contig:heads_k_stride=1,heads_k_stride=2")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
        // `set` overrides in place (the ablation's rows over a user's entry), and an entry
        // prints as it reads.
        let mut s = SchemeSpec::parse("fcp:block=512,pipeline=false").unwrap();
        s.set("pipeline", "true");
        s.set("solver", "false");
        assert_eq!(s.to_string(), "fcp:block=512,pipeline=true,solver=false");
        assert_eq!(SchemeSpec::parse(&s.to_string()).unwrap(), s);
        assert_eq!(SchemeSpec::parse("ring").unwrap().to_string(), "ring");
        // Refused when the entry is read, for every scheme (FCP and hybrid parse their own).
        for spec in ["fcp:block=512,block=1024", "hybrid:quick=true,quick=false"] {
            let e = SchemeSpec::parse(spec).unwrap_err().to_string();
            assert!(e.contains("given twice"), "{e}");
        }
        for name in SCHEMES {
            assert!(planner_for(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn ring_rejects_params() {
        assert!(planner_for("ring:block=3").is_err());
    }
}

/// Test support: a planning context for the bundled defaults.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Run `f` with a context of `ranks` ranks and `mask` for llama3-70b on h100.
    pub fn with_ctx<R>(ranks: u32, mask: Mask, f: impl FnOnce(&PlanContext<'_>) -> R) -> R {
        let model = Model::load("llama3-70b").expect("bundled model");
        let hardware = Hardware::load("h100").expect("bundled profile");
        let ctx = PlanContext {
            ranks,
            tokens_per_rank: 1024,
            mask,
            model: &model,
            hardware: &hardware,
            judge: crate::planners::Judge::default(),
        };
        f(&ctx)
    }

    /// Simulated attention time (forward + backward, ms) of `plan` in `ctx`: what the tests of
    /// planners that pick by simulation compare.
    pub fn simulated_ms(ctx: &PlanContext<'_>, plan: &Plan) -> f64 {
        use crate::sim::{PassSel, Simulator};
        Simulator::new(ctx.hardware.clone(), ctx.model.clone())
            .unwrap()
            .simulate(plan, PassSel::Both)
            .unwrap()
            .metrics
            .attention_time_ms
    }

    /// Simulated whole-layer time (forward + backward) of `plan` under `ctx`'s profiles.
    pub fn simulated_layer_ms(ctx: &PlanContext<'_>, plan: &Plan) -> f64 {
        use crate::sim::{PassSel, Simulator};
        let sim = Simulator::new(ctx.hardware.clone(), ctx.model.clone())
            .and_then(Simulator::with_layer)
            .unwrap();
        let m = sim.simulate(plan, PassSel::Both).unwrap().metrics;
        m.layer.unwrap().layer_time_ms
    }

    /// Plan each batch of document lengths on each rank count under both masks and assert
    /// every plan valid: the matrix every planner's unit tests run, in one place so that a
    /// planner's test names only what is particular to it (its rank counts and batches).
    pub fn assert_plans_verify(planner: &dyn Planner, ranks: &[u32], batches: &[&[u64]]) {
        for mask in [Mask::Causal, Mask::Full] {
            for &n in ranks {
                for lens in batches {
                    let batch = Batch::new(0, lens.to_vec());
                    let plan = with_ctx(n, mask, |ctx| planner.plan(&batch, ctx));
                    let plan = plan.unwrap_or_else(|e| {
                        panic!("{} on {n} ranks, {mask:?}, {lens:?}: {e}", planner.name())
                    });
                    assert_valid(&plan);
                }
            }
        }
    }

    /// Assert a plan passes the structural verifier and the numeric check.
    pub fn assert_valid(plan: &Plan) {
        use crate::plan::{check_numeric, verify, NumericOptions};
        let v = verify(plan);
        assert!(v.is_empty(), "{}: {v:#?}", plan.scheme.name);
        // Boundary rows are always checked; 256 evenly spaced rows per document keep the unit
        // tests fast on long documents.
        let opts = NumericOptions {
            max_rows_per_doc: 256,
            ..NumericOptions::default()
        };
        let r = check_numeric(plan, &opts).unwrap();
        assert!(r.max_abs_error < 1e-9, "{}: {r:?}", plan.scheme.name);
    }
}
