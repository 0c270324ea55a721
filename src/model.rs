//! The attention shape a plan is costed for: head counts, head dimension, dtype; and, where
//! known, the dimensions of the rest of the layer (projections and MLP), whose work grows
//! with a rank's token count rather than with the square of its documents.
//!
//! Planners that are bound by head counts (Ulysses) and every cost estimate need the attention
//! shape; the whole-layer simulation (`fcp simulate --layer`) needs the rest.

use serde::{Deserialize, Serialize};

use crate::hardware::{bundled, spec, HardwareError};

/// The most query or key/value heads, and the largest head dimension, a model may have.
pub const MAX_HEADS: u32 = 1 << 16;
/// The widest `hidden` or `ffn_hidden` a model may have.
pub const MAX_WIDTH: u32 = 1 << 24;
/// The most parameters a model may have (about 10¹⁵): bytes of weights, gradients and
/// optimizer state stay within a u64.
pub const MAX_PARAMS: f64 = (1u64 << 50) as f64;

/// Attention shape of one transformer layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Preset or file name the model was loaded from.
    pub name: String,
    /// Number of query heads.
    pub q_heads: u32,
    /// Number of key/value heads (GQA when smaller than `q_heads`).
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Bytes per element of Q/K/V/O (2 for bf16).
    pub dtype_bytes: u32,
    /// The projections and MLP around attention, when the model file gives them: what the
    /// whole-layer simulation needs to price the token-linear part of a layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear: Option<LinearShape>,
    /// Tensor-parallel degree this shape is one GPU's share of ([`crate::tp::split`]): the
    /// head counts and `ffn_hidden` above are already divided by it, and with sequence
    /// parallelism the `hidden`-wide activations are spread over it. 1 (left out of JSON):
    /// the whole layer runs on each CP rank's GPU.
    #[serde(default = "crate::tp::one", skip_serializing_if = "crate::tp::is_one")]
    pub tp: u32,
    /// The whole network around the layer, when the model file gives it: what a GPU's memory
    /// for a training step needs ([`crate::footprint`]): how many layers it holds and the
    /// embedding and output layer beside them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<Stack>,
}

/// The network a layer is one of: its depth and its vocabulary. The parameters a GPU holds,
/// and so its weights, gradients and optimizer state, come from these and the layer's
/// widths ([`Model::params_per_gpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stack {
    /// Transformer layers (`num_hidden_layers`).
    pub layers: u32,
    /// Vocabulary size: the input embedding and the output layer are `vocab × hidden`.
    pub vocab: u32,
    /// The output layer reuses the input embedding's weights (`tie_word_embeddings`).
    pub tied_embeddings: bool,
}

/// Dimensions of the token-linear part of one transformer layer: the Q/K/V projection before
/// attention, the output projection and the MLP after it. Their cost is the same per token
/// whatever the document lengths, so it is balanced by token counts alone, which is why
/// FlashCP holds equal tokens per rank (seed paper §3.1, "Equal Token Constraint") and FCP
/// caps them (seed paper §4, memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearShape {
    /// Model (residual stream) width.
    pub hidden: u32,
    /// MLP inner width.
    pub ffn_hidden: u32,
    /// Weight matrices of `hidden × ffn_hidden` in the MLP: 3 for a gated MLP (SwiGLU: gate,
    /// up, down, as in Llama), 2 for a plain one.
    pub ffn_matrices: u32,
}

/// Parameters of a network's parts on one GPU ([`Model::param_parts`]): what each pipeline
/// stage holds is made of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamParts {
    /// One transformer layer: projections, MLP and its two norms.
    pub layer: u64,
    /// The input embedding (`vocab × hidden`, this GPU's rows).
    pub embedding: u64,
    /// The output layer, 0 when tied to the embedding.
    pub output: u64,
    /// The final norm.
    pub final_norm: u64,
}

/// FLOPs per token of the token-linear work of one layer, split at attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearFlops {
    /// Before attention: the Q/K/V projection (forward), or the output projection and MLP
    /// (backward, which runs the layer in reverse).
    pub before: f64,
    /// After attention: the output projection and MLP (forward), or the Q/K/V projection
    /// (backward).
    pub after: f64,
}

impl LinearFlops {
    /// Before and after attention together.
    pub fn total(&self) -> f64 {
        self.before + self.after
    }
}

/// What the backward pass recomputes instead of keeping it from the forward pass: the memory
/// a layer holds per token against the FLOPs it reruns. The granularities are Megatron-Core's
/// (`recompute_granularity` = `selective` with `recompute_modules = ["mlp"]`, or `full`; see
/// the NeMo Megatron-Bridge guide "Activation Recomputation"). Its `core_attn` module is left
/// out: with FlashAttention the attention core keeps no score matrix to drop, so recomputing
/// it frees next to nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep everything the backward pass reads ([`Model::saved_bytes_per_token`]).
    #[default]
    None,
    /// Drop the MLP's `ffn_hidden`-wide tensors and rerun the MLP's forward GEMMs at the
    /// start of the backward pass (its input, the second norm's output, is kept).
    Mlp,
    /// Keep only each layer's input; the backward pass reruns the whole layer's forward pass
    /// (attention and its communication included) before its own work.
    Full,
}

impl Recompute {
    /// Every granularity, as written on the command line and in reports.
    pub const NAMES: [&'static str; 3] = ["none", "mlp", "full"];

    /// Nothing is recomputed (the default, left out of reports and settings so that their
    /// earlier forms stay byte-identical).
    pub fn is_off(&self) -> bool {
        *self == Recompute::None
    }

    /// Name as written on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Mlp => "mlp",
            Recompute::Full => "full",
        }
    }
}

impl std::str::FromStr for Recompute {
    type Err = String;
    fn from_str(s: &str) -> Result<Recompute, String> {
        match s {
            "none" => Ok(Recompute::None),
            "mlp" => Ok(Recompute::Mlp),
            "full" => Ok(Recompute::Full),
            _ => Err(format!(
                "unknown recompute `{s}`: one of {}",
                Recompute::NAMES.join(", ")
            )),
        }
    }
}

/// The GEMMs of a layer's token-linear work, in forward order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gemm {
    /// The Q/K/V projection.
    Qkv,
    /// The output projection.
    Out,
    /// The MLP's matrices from `hidden` to `ffn_hidden` (gate and up for a gated MLP).
    MlpIn,
    /// The MLP's matrix back to `hidden` (down).
    MlpOut,
}

/// Forward FLOPs per token of the token-linear work's three parts.
struct LinearParts {
    qkv: f64,
    out: f64,
    mlp: f64,
}

impl Model {
    /// Forward FLOPs per token of the Q/K/V projection, the output projection and the MLP: 2
    /// FLOPs per multiply-add of each weight matrix.
    fn linear_parts(&self) -> Option<LinearParts> {
        let l = self.linear?;
        let (h, hd) = (l.hidden as f64, self.head_dim as f64);
        Some(LinearParts {
            qkv: 2.0 * h * (self.q_heads as f64 + 2.0 * self.kv_heads as f64) * hd,
            out: 2.0 * self.q_heads as f64 * hd * h,
            mlp: 2.0 * l.ffn_matrices as f64 * h * l.ffn_hidden as f64,
        })
    }

    /// Weights of one layer's projections and MLP on one GPU (its share under [`Model::tp`]):
    /// half the forward FLOPs per token, one multiply-add per weight. Norm weights (2 ×
    /// `hidden`) are left out. `None` without a [`LinearShape`].
    pub fn weights_per_layer(&self) -> Option<u64> {
        let LinearParts { qkv, out, mlp } = self.linear_parts()?;
        Some(((qkv + out + mlp) / 2.0).round() as u64)
    }

    /// Parameters one GPU holds for the whole network (its share under [`Model::tp`]): see
    /// [`Model::param_parts`]. `None` without a [`Stack`].
    pub fn params_per_gpu(&self) -> Option<u64> {
        let p = self.param_parts()?;
        Some(p.layer * u64::from(self.stack?.layers) + p.embedding + p.output + p.final_norm)
    }

    /// The parameters of the network's parts on one GPU (its share under [`Model::tp`]):
    /// a layer's projections and MLP ([`Model::weights_per_layer`]) and its two norms; the
    /// input embedding and, unless tied, the output layer, both split by vocabulary rows over
    /// the TP group as Megatron's vocab-parallel embedding does; the final norm. Norms are
    /// whole on every GPU of the group. `None` without a [`Stack`].
    pub fn param_parts(&self) -> Option<ParamParts> {
        let s = self.stack?;
        let hidden = u64::from(self.linear?.hidden);
        let table = u64::from(s.vocab).div_ceil(u64::from(self.tp.max(1))) * hidden;
        Some(ParamParts {
            layer: self.weights_per_layer()? + 2 * hidden,
            embedding: table,
            output: if s.tied_embeddings { 0 } else { table },
            final_norm: hidden,
        })
    }

    /// Forward FLOPs per token of one of the layer's GEMMs (the MLP's input-side matrices
    /// together: gate and up for a gated MLP). `None` without a [`LinearShape`].
    pub fn gemm_flops_per_token(&self, gemm: Gemm) -> Option<f64> {
        let LinearParts { qkv, out, mlp } = self.linear_parts()?;
        let m = f64::from(self.linear?.ffn_matrices);
        Some(match gemm {
            Gemm::Qkv => qkv,
            Gemm::Out => out,
            Gemm::MlpIn => mlp * (m - 1.0) / m,
            Gemm::MlpOut => mlp / m,
        })
    }

    /// FLOPs per token of the layer's token-linear work in `pass`, split at attention: 2 FLOPs
    /// per multiply-add of each weight matrix forward, twice that backward (the input and the
    /// weight gradients). `None` when the model file gives no [`LinearShape`].
    pub fn linear_flops_per_token(&self, pass: crate::hardware::Pass) -> Option<LinearFlops> {
        let LinearParts { qkv, out, mlp } = self.linear_parts()?;
        Some(match pass {
            crate::hardware::Pass::Fwd => LinearFlops {
                before: qkv,
                after: out + mlp,
            },
            crate::hardware::Pass::Bwd => LinearFlops {
                before: 2.0 * (out + mlp),
                after: 2.0 * qkv,
            },
        })
    }

    /// The document length, in tokens, at which a causal document's attention costs as many
    /// forward FLOPs as its token-linear work (Q/K/V and output projections, MLP): attention
    /// runs `len²/2` query–key pairs at `4 · q_heads · head_dim` FLOPs each, the linear work
    /// `linear_flops_per_token` a token, so a document of `len` tokens does
    /// `len + len²/breakpoint` tokens' worth of linear work in all. WLB packing weighs
    /// documents by it ([`crate::trace::WlbParams::breakpoint`]). `None` without a
    /// [`LinearShape`]. 104,448 tokens for Llama-3-70B: shorter documents are mostly MLP.
    pub fn attention_breakpoint(&self) -> Option<u64> {
        let linear = self
            .linear_flops_per_token(crate::hardware::Pass::Fwd)?
            .total();
        let per_pair = 4.0 * f64::from(self.q_heads) * f64::from(self.head_dim);
        let b = (linear / (per_pair / 2.0)).round();
        (b >= 1.0 && b.is_finite()).then_some(b as u64)
    }

    /// Forward FLOPs per token the backward pass reruns at its start under `recompute`: the
    /// MLP's under [`Recompute::Mlp`], none otherwise ([`Recompute::Full`] reruns the whole
    /// forward pass, attention included, which the simulator runs as a pass of its own).
    /// `None` when the model file gives no [`LinearShape`].
    pub fn rerun_flops_per_token(&self, recompute: Recompute) -> Option<f64> {
        let parts = self.linear_parts()?;
        Some(match recompute {
            Recompute::Mlp => parts.mlp,
            Recompute::None | Recompute::Full => 0.0,
        })
    }
}

impl Model {
    /// Bytes of K plus V for one token (all KV heads).
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * self.kv_heads as u64 * self.head_dim as u64 * self.dtype_bytes as u64
    }

    /// Bytes of Q (or O) for one token (all query heads).
    pub fn q_bytes_per_token(&self) -> u64 {
        self.q_heads as u64 * self.head_dim as u64 * self.dtype_bytes as u64
    }

    /// Bytes one layer keeps per token from its forward pass for its backward pass under
    /// `recompute`: what decides whether a rank's share of a batch fits, since it is held for
    /// every layer the GPU runs until the backward pass reaches it. `None` when the model file
    /// gives no [`LinearShape`].
    ///
    /// [`Recompute::Mlp`] drops the MLP's `ffn_hidden`-wide tensors from the list below;
    /// [`Recompute::Full`] keeps the layer's input alone, `hidden` wide (the layer being
    /// recomputed holds its whole set for a moment, once per GPU, not once per layer).
    ///
    /// Counted without recomputation, in the activation dtype unless noted, for a pre-norm
    /// layer without dropout (Llama):
    /// - the two norms' inputs (the residual stream) and outputs (the inputs of the Q/K/V
    ///   projection and of the MLP): 4 × `hidden`;
    /// - attention's Q, K, V and output O (O is also the output projection's input);
    /// - the MLP's `ffn_hidden`-wide tensors, one per weight matrix: gate and up outputs and
    ///   their product (the down projection's input) for a gated MLP, the first projection's
    ///   output and its activation for a plain one;
    /// - fp32 statistics: the attention kernel's log-sum-exp per query head, each norm's
    ///   inverse root mean square.
    ///
    /// Under tensor parallelism ([`Model::tp`]) the heads and `ffn_hidden` are the GPU's
    /// share already, and the `hidden`-wide tensors are sequence-parallel: each GPU of the
    /// group keeps 1/`tp` of them (Korthikanti et al. 2022 §4.2.2, Eq. 4).
    ///
    /// Cross-check: for a GPT layer (4 × `hidden` MLP, 2 matrices, MHA) this is 32 × `hidden`
    /// bytes at 16 bits plus the statistics; Korthikanti et al. 2022 (arXiv:2205.05198, §4.1,
    /// Eq. 1) count 34 × `hidden` with FlashAttention-style attention, the other 2 being the
    /// two dropout masks a Llama layer does not have.
    pub fn saved_bytes_per_token(&self, recompute: Recompute) -> Option<u64> {
        let l = self.linear?;
        let dtype = u64::from(self.dtype_bytes);
        let mlp = match recompute {
            Recompute::None => u64::from(l.ffn_matrices) * u64::from(l.ffn_hidden),
            Recompute::Mlp => 0,
            Recompute::Full => return Some(self.stream_bytes(1)),
        };
        let stats = 4 * u64::from(self.q_heads) + 2 * 4;
        Some(
            2 * self.q_bytes_per_token()
                + self.kv_bytes_per_token()
                + self.stream_bytes(4)
                + mlp * dtype
                + stats,
        )
    }
}

impl Model {
    /// Bytes per token of `tensors` tensors `hidden` wide (the residual stream and the norms'
    /// outputs) on one GPU: spread over the tensor-parallel group by sequence parallelism,
    /// rounded up. 0 without a [`LinearShape`].
    pub fn stream_bytes(&self, tensors: u64) -> u64 {
        let Some(l) = self.linear else { return 0 };
        (tensors * u64::from(l.hidden) * u64::from(self.dtype_bytes))
            .div_ceil(u64::from(self.tp.max(1)))
    }
}

/// The fields of a model file a what-if override may set ([`Model::load`]).
pub const OVERRIDABLE: &[&str] = &[
    "q_heads",
    "kv_heads",
    "head_dim",
    "dtype_bytes",
    "hidden",
    "ffn_hidden",
    "ffn_matrices",
    "layers",
    "vocab",
];

/// The on-disk form of a model: the struct's fields plus an optional source, so files can cite
/// where the shape comes from without changing [`Model`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    #[serde(default)]
    name: String,
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    dtype_bytes: u32,
    #[serde(default)]
    hidden: Option<u32>,
    #[serde(default)]
    ffn_hidden: Option<u32>,
    #[serde(default)]
    ffn_matrices: Option<u32>,
    #[serde(default)]
    layers: Option<u32>,
    #[serde(default)]
    vocab: Option<u32>,
    #[serde(default)]
    tied_embeddings: Option<bool>,
    #[serde(default)]
    source: Option<String>,
}

/// The file's [`Stack`]: `layers` and `vocab` together or neither, and only with the layer's
/// widths (the embedding is `vocab × hidden`); `tied_embeddings` (default false, as in Llama
/// 3) only with them.
fn stack(
    f: &ModelFile,
    linear: Option<LinearShape>,
    label: &str,
) -> Result<Option<Stack>, HardwareError> {
    let bad = |field: &str, message: &str| HardwareError::Invalid {
        file: label.to_string(),
        field: field.to_string(),
        message: message.to_string(),
    };
    match (f.layers, f.vocab) {
        (None, None) => match f.tied_embeddings {
            Some(_) => Err(bad("tied_embeddings", "needs layers and vocab")),
            None => Ok(None),
        },
        (Some(_), None) => Err(bad(
            "vocab",
            "missing: layers and vocab go together (the embedding is vocab × hidden)",
        )),
        (None, Some(_)) => Err(bad(
            "layers",
            "missing: layers and vocab go together (the number of transformer layers)",
        )),
        (Some(layers), Some(vocab)) => {
            if linear.is_none() {
                return Err(bad(
                    "layers",
                    "needs hidden and ffn_hidden (a layer's weights come from its widths)",
                ));
            }
            if !(1..=100_000).contains(&layers) {
                return Err(bad("layers", "must be 1 to 100000"));
            }
            if !(1..=100_000_000).contains(&vocab) {
                return Err(bad("vocab", "must be 1 to 100000000"));
            }
            Ok(Some(Stack {
                layers,
                vocab,
                tied_embeddings: f.tied_embeddings.unwrap_or(false),
            }))
        }
    }
}

/// The file's [`LinearShape`]: `hidden` and `ffn_hidden` together or neither; `ffn_matrices`
/// (default 3) only with them.
fn linear_shape(f: &ModelFile, label: &str) -> Result<Option<LinearShape>, HardwareError> {
    let bad = |field: &str, message: &str| HardwareError::Invalid {
        file: label.to_string(),
        field: field.to_string(),
        message: message.to_string(),
    };
    match (f.hidden, f.ffn_hidden) {
        (None, None) => match f.ffn_matrices {
            Some(_) => Err(bad(
                "ffn_matrices",
                "needs hidden and ffn_hidden (the MLP's widths)",
            )),
            None => Ok(None),
        },
        (Some(_), None) => Err(bad(
            "ffn_hidden",
            "missing: hidden and ffn_hidden go together (the MLP's inner width)",
        )),
        (None, Some(_)) => Err(bad(
            "hidden",
            "missing: hidden and ffn_hidden go together (the model width)",
        )),
        (Some(hidden), Some(ffn_hidden)) => {
            let ffn_matrices = f.ffn_matrices.unwrap_or(3);
            if hidden == 0 {
                return Err(bad("hidden", "must be >= 1"));
            }
            if ffn_hidden == 0 {
                return Err(bad("ffn_hidden", "must be >= 1"));
            }
            if !(1..=4).contains(&ffn_matrices) {
                return Err(bad(
                    "ffn_matrices",
                    "must be 1 to 4 (3 for a gated MLP such as SwiGLU, 2 for a plain one)",
                ));
            }
            Ok(Some(LinearShape {
                hidden,
                ffn_hidden,
                ffn_matrices,
            }))
        }
    }
}

impl Model {
    /// Load a bundled preset (`llama3-70b`, `llama3-8b`, `mha-16`, `mha-32`) or a user TOML by
    /// path (anything containing `/` or ending in `.toml`), and validate it.
    ///
    /// Either may carry what-if overrides of its shape after a `:` (`llama3-70b:kv_heads=16`,
    /// [`OVERRIDABLE`]), as a hardware profile may ([`crate::hardware::Hardware::load`]): the
    /// model with those fields replaced and then checked, named by its name and the overrides.
    pub fn load(name_or_path: &str) -> Result<Model, HardwareError> {
        let (base, overrides) = spec::split_overrides(name_or_path);
        let src = bundled::resolve(base, bundled::MODELS, "model", ".toml")?;
        let Some(overrides) = overrides else {
            return Self::from_toml_str_named(&src.text, &src.label, &src.name);
        };
        let mut f: ModelFile = toml::from_str(&src.text)
            .map_err(|e| bundled::toml_error(&src.label, &src.text, &e))?;
        for o in spec::overrides(overrides, name_or_path, OVERRIDABLE)? {
            let v = o.count()?;
            match o.key {
                "q_heads" => f.q_heads = v,
                "kv_heads" => f.kv_heads = v,
                "head_dim" => f.head_dim = v,
                "dtype_bytes" => f.dtype_bytes = v,
                "hidden" => f.hidden = Some(v),
                "ffn_hidden" => f.ffn_hidden = Some(v),
                "ffn_matrices" => f.ffn_matrices = Some(v),
                "layers" => f.layers = Some(v),
                "vocab" => f.vocab = Some(v),
                _ => unreachable!("OVERRIDABLE lists every key above"),
            }
        }
        let name = if f.name.is_empty() {
            &src.name
        } else {
            &f.name
        };
        f.name = format!("{name}:{}", spec::canonical_overrides(overrides));
        Self::from_file(f, &format!("{} with {overrides}", src.label), "")
    }

    /// Parse and validate a model TOML given as text; `label` names it in errors and is the
    /// name when the file has no `name` key.
    pub fn from_toml_str(text: &str, label: &str) -> Result<Model, HardwareError> {
        Self::from_toml_str_named(text, label, label)
    }

    fn from_toml_str_named(text: &str, label: &str, name: &str) -> Result<Model, HardwareError> {
        let f: ModelFile =
            toml::from_str(text).map_err(|e| bundled::toml_error(label, text, &e))?;
        Self::from_file(f, label, name)
    }

    /// The model file `f` describes, checked; `name` when it names none.
    fn from_file(f: ModelFile, label: &str, name: &str) -> Result<Model, HardwareError> {
        let linear = linear_shape(&f, label)?;
        let stack = stack(&f, linear, label)?;
        let model = Model {
            name: if f.name.is_empty() {
                name.to_string()
            } else {
                f.name
            },
            q_heads: f.q_heads,
            kv_heads: f.kv_heads,
            head_dim: f.head_dim,
            dtype_bytes: f.dtype_bytes,
            linear,
            tp: 1,
            stack,
        };
        model.validate(label)?;
        Ok(model)
    }

    /// Check the shape is usable: heads ≥ 1, `q_heads` a multiple of `kv_heads` (GQA groups),
    /// `head_dim` ≥ 1, `dtype_bytes` ≥ 1.
    pub fn validate(&self, label: &str) -> Result<(), HardwareError> {
        let bad = |field: &str, message: String| HardwareError::Invalid {
            file: label.to_string(),
            field: field.to_string(),
            message,
        };
        if self.q_heads == 0 {
            return Err(bad("q_heads", "must be >= 1".into()));
        }
        if self.kv_heads == 0 {
            return Err(bad("kv_heads", "must be >= 1".into()));
        }
        if self.q_heads % self.kv_heads != 0 {
            return Err(bad(
                "kv_heads",
                format!(
                    "q_heads {} is not a multiple of kv_heads {}",
                    self.q_heads, self.kv_heads
                ),
            ));
        }
        if self.head_dim == 0 {
            return Err(bad("head_dim", "must be >= 1".into()));
        }
        if self.dtype_bytes == 0 {
            return Err(bad("dtype_bytes", "must be >= 1".into()));
        }
        // Bug hunt: sizes no model has overflowed the integer counts (a parameter count of
        // 2⁶⁴ printed as 0.05 B, an MFU of 119.8 %). Bounds far above any model's keep every
        // count in range.
        for (field, v, max) in [
            ("q_heads", self.q_heads, MAX_HEADS),
            ("kv_heads", self.kv_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEADS),
            ("dtype_bytes", self.dtype_bytes, 8),
        ] {
            if v > max {
                return Err(bad(field, format!("{v} is more than {max}")));
            }
        }
        if let Some(l) = self.linear {
            for (field, v) in [("hidden", l.hidden), ("ffn_hidden", l.ffn_hidden)] {
                if v > MAX_WIDTH {
                    return Err(bad(field, format!("{v} is more than {MAX_WIDTH}")));
                }
            }
        }
        if let (Some(parts), Some(s), Some(l)) = (self.linear_parts(), self.stack, self.linear) {
            let per_layer = (parts.qkv + parts.out + parts.mlp) / 2.0;
            let total =
                per_layer * f64::from(s.layers) + 2.0 * f64::from(s.vocab) * f64::from(l.hidden);
            if total > MAX_PARAMS {
                // Bug hunt: named `layers` when widths set from a what-if override made it.
                return Err(bad(
                    "shape",
                    format!("the model would have {total:.3e} parameters (from its layers, widths, heads and vocab), more than the {MAX_PARAMS:.0e} fcp counts"),
                ));
            }
        }
        Ok(())
    }

    /// Source string of a bundled preset, for display.
    pub fn bundled_source(name: &str) -> Option<String> {
        let (_, text) = bundled::MODELS.iter().find(|(n, _)| *n == name)?;
        let f: ModelFile = toml::from_str(text).ok()?;
        f.source
    }

    /// The `source` a model file cites, for a preset name or a user file's path (what
    /// [`Model::load`] takes). A user file's own citation, not the preset's its `name` may
    /// repeat (bug hunt: `hw show --model my.toml` printed nothing of the file's `source`, or
    /// the bundled model's when the file reused its name).
    pub fn source_of(name_or_path: &str) -> Option<String> {
        let (base, overrides) = spec::split_overrides(name_or_path);
        let src = bundled::resolve(base, bundled::MODELS, "model", ".toml").ok()?;
        let f: ModelFile = toml::from_str(&src.text).ok()?;
        let what_if = overrides.map(|o| format!("what-if: {o} set by `{name_or_path}`"));
        // Bug hunt: a file without a `source` printed "; what-if: …".
        match (f.source, what_if) {
            (Some(s), Some(w)) => Some(format!("{s}; {w}")),
            (s, w) => s.or(w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_if_overrides_reshape_a_model_checked_and_named() {
        let base = Model::load("llama3-70b").unwrap();
        let m = Model::load("llama3-70b:kv_heads=16,layers=40").unwrap();
        assert_eq!(m.name, "llama3-70b:kv_heads=16,layers=40");
        assert_eq!((m.kv_heads, m.stack.unwrap().layers), (16, 40));
        assert_eq!(
            (m.q_heads, m.head_dim, m.linear),
            (base.q_heads, base.head_dim, base.linear)
        );
        // More K/V heads, more K/V parameters in every layer.
        assert!(m.param_parts().unwrap().layer > base.param_parts().unwrap().layer);
        assert!(Model::source_of("llama3-70b:kv_heads=16")
            .unwrap()
            .ends_with("what-if: kv_heads=16 set by `llama3-70b:kv_heads=16`"));
        for (spec, says) in [
            ("llama3-70b:kv_heads=7", "not a multiple of kv_heads 7"),
            ("llama3-70b:heads=8", "is not a field an override may set"),
            ("llama3-70b:layers=1.5", "`1.5` is not a whole number"),
            ("llama3-70b:layers=4,layers=8", "is set twice"),
            ("llama3-70b:head_dim=0", "head_dim"),
        ] {
            let e = Model::load(spec).unwrap_err().to_string();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    /// Regression (bug hunt): a model of 2⁶⁴ parameters read as 0.05 B (the count wrapped),
    /// and 2³² − 1 heads gave an MFU above 100 %; sizes past any model's are refused.
    #[test]
    fn sizes_past_any_model_are_refused() {
        let base = "name = \"m\"\nq_heads = 8\nkv_heads = 8\nhead_dim = 128\ndtype_bytes = 2\n";
        assert!(Model::from_toml_str(base, "m").is_ok());
        for (from, to, field) in [
            ("q_heads = 8", "q_heads = 4294967295", "q_heads"),
            ("head_dim = 128", "head_dim = 70000", "head_dim"),
            ("dtype_bytes = 2", "dtype_bytes = 16", "dtype_bytes"),
        ] {
            let e = Model::from_toml_str(&base.replace(from, to), "m")
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
        let wide = format!("{base}hidden = 16777216\nffn_hidden = 16776702\nffn_matrices = 1\nlayers = 65536\nvocab = 1\n");
        let e = Model::from_toml_str(&wide, "m").unwrap_err().to_string();
        assert!(
            e.contains("parameters (from its layers, widths, heads and vocab), more than"),
            "{e}"
        );
    }

    /// Llama-3-70B's attention outweighs its projections and MLP past 104,448 tokens (its
    /// linear work is 2 × 855.6M weights = 1.711 GFLOPs a token, a causal pair 4 · 64 · 128
    /// FLOPs, half the pairs of a length-l document): the number `--pack wlb` weighs by.
    #[test]
    fn attention_breakpoint_balances_attention_and_linear_flops() {
        let m = Model::load("llama3-70b").unwrap();
        let b = m.attention_breakpoint().unwrap();
        assert_eq!(b, 104_448);
        let l = b as f64;
        let linear = m
            .linear_flops_per_token(crate::hardware::Pass::Fwd)
            .unwrap()
            .total();
        let attention = 4.0 * 64.0 * 128.0 * l * l / 2.0;
        assert!((attention / (linear * l) - 1.0).abs() < 1e-4);
        assert_eq!(Model::load("mha-16").unwrap().attention_breakpoint(), None);
    }

    #[test]
    fn presets_load() {
        for name in bundled::names(bundled::MODELS) {
            let m = Model::load(name).unwrap();
            assert_eq!(m.name, name);
            assert_eq!(m.dtype_bytes, 2);
            assert!(Model::bundled_source(name).is_some());
            assert_eq!(Model::source_of(name), Model::bundled_source(name));
        }
        let m = Model::load("llama3-70b").unwrap();
        assert_eq!((m.q_heads, m.kv_heads, m.head_dim), (64, 8, 128));
        assert_eq!(m.kv_bytes_per_token(), 2 * 8 * 128 * 2);
        let m = Model::load("mha-32").unwrap();
        assert_eq!((m.q_heads, m.kv_heads), (32, 32));
    }

    #[test]
    fn a_layer_saves_what_korthikanti_counts_less_the_dropout_masks() {
        // A GPT layer at 16 bits: MHA, 4 × hidden MLP of 2 matrices. Korthikanti et al. 2022
        // Eq. 1 without the attention-score terms: 34 × hidden bytes, 2 of them dropout masks.
        let gpt = Model::from_toml_str(
            "q_heads = 32\nkv_heads = 32\nhead_dim = 128\ndtype_bytes = 2\n\
             hidden = 4096\nffn_hidden = 16384\nffn_matrices = 2\n",
            "gpt",
        )
        .unwrap();
        let stats = 4 * 32 + 8;
        assert_eq!(
            gpt.saved_bytes_per_token(Recompute::None),
            Some(32 * 4096 + stats)
        );
        // Llama 3 70B: Q and O 2 × 8192, K and V 2 × 1024, norms 4 × 8192, SwiGLU 3 × 28672.
        let m = Model::load("llama3-70b").unwrap();
        let wide = 2 * 8192 + 2 * 1024 + 4 * 8192 + 3 * 28672;
        assert_eq!(
            m.saved_bytes_per_token(Recompute::None),
            Some(2 * wide + 4 * 64 + 8)
        );
        assert_eq!(
            Model::load("mha-16")
                .unwrap()
                .saved_bytes_per_token(Recompute::None),
            None
        );
    }

    #[test]
    fn recomputing_keeps_less_and_reruns_what_it_dropped() {
        let m = Model::load("llama3-70b").unwrap();
        let none = m.saved_bytes_per_token(Recompute::None).unwrap();
        // The MLP's three 28,672-wide tensors go; its input (a norm output) stays.
        let mlp = m.saved_bytes_per_token(Recompute::Mlp).unwrap();
        assert_eq!(none - mlp, 3 * 28672 * 2);
        // Full: the layer's input alone, 8,192 wide at 16 bits.
        assert_eq!(m.saved_bytes_per_token(Recompute::Full), Some(8192 * 2));
        // What is rerun: the MLP's forward GEMMs under `mlp`, nothing extra per token under
        // `full` (its rerun is a whole forward pass) or `none`.
        assert_eq!(
            m.rerun_flops_per_token(Recompute::Mlp),
            Some(2.0 * 3.0 * 8192.0 * 28672.0)
        );
        assert_eq!(m.rerun_flops_per_token(Recompute::Full), Some(0.0));
        assert_eq!(m.rerun_flops_per_token(Recompute::None), Some(0.0));
        for name in Recompute::NAMES {
            assert_eq!(name.parse::<Recompute>().unwrap().name(), name);
        }
        let err = "selective".parse::<Recompute>().unwrap_err();
        assert!(err.contains("none, mlp, full"), "{err}");
    }

    #[test]
    fn the_layers_flops_per_token_follow_its_widths() {
        use crate::hardware::Pass;
        let m = Model::load("llama3-70b").unwrap();
        let fwd = m.linear_flops_per_token(Pass::Fwd).unwrap();
        // Q/K/V: 8192 × (64 + 2·8) heads × 128; output: 8192²; SwiGLU: 3 × 8192 × 28672.
        assert_eq!(fwd.before, 2.0 * 8192.0 * 80.0 * 128.0);
        assert_eq!(fwd.after, 2.0 * (8192.0 * 8192.0 + 3.0 * 8192.0 * 28672.0));
        let bwd = m.linear_flops_per_token(Pass::Bwd).unwrap();
        assert_eq!((bwd.before, bwd.after), (2.0 * fwd.after, 2.0 * fwd.before));
        assert!(Model::load("mha-16").unwrap().linear.is_none());
        let base = "q_heads = 8\nkv_heads = 8\nhead_dim = 64\ndtype_bytes = 2\n";
        let l = Model::from_toml_str(&format!("{base}hidden = 512\nffn_hidden = 2048\n"), "m")
            .unwrap()
            .linear
            .unwrap();
        assert_eq!(l.ffn_matrices, 3, "gated by default");
        for (extra, field) in [
            ("hidden = 512\n", "ffn_hidden"),
            ("ffn_hidden = 512\n", "hidden"),
            ("ffn_matrices = 2\n", "ffn_matrices"),
            ("hidden = 0\nffn_hidden = 5\n", "hidden"),
            (
                "hidden = 5\nffn_hidden = 5\nffn_matrices = 9\n",
                "ffn_matrices",
            ),
        ] {
            let e = Model::from_toml_str(&format!("{base}{extra}"), "m")
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
    }

    #[test]
    fn validation() {
        let ok = "q_heads = 12\nkv_heads = 4\nhead_dim = 64\ndtype_bytes = 2\n";
        assert_eq!(Model::from_toml_str(ok, "m").unwrap().name, "m");
        let e = Model::from_toml_str(&ok.replace("kv_heads = 4", "kv_heads = 5"), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a multiple"), "{e}");
        let e = Model::from_toml_str(&ok.replace("q_heads = 12", "q_heads = 0"), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("q_heads"), "{e}");
        let e = Model::from_toml_str(&ok.replace("head_dim = 64", "head_dim = 0"), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("head_dim"), "{e}");
        let e = Model::from_toml_str(&ok.replace("head_dim = 64\n", ""), "m.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("head_dim") && e.contains("m.toml"), "{e}");
        let e = Model::load("gpt-9").unwrap_err().to_string();
        assert!(e.contains("llama3-70b") && e.contains("mha-16"), "{e}");
    }
}
