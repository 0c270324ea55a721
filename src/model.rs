//! The attention shape a plan is costed for: head counts, head dimension, dtype.
//!
//! Planners that are bound by head counts (Ulysses) and every cost estimate need it.

use serde::{Deserialize, Serialize};

use crate::hardware::{bundled, HardwareError};

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
}

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
    source: Option<String>,
}

impl Model {
    /// Load a bundled preset (`llama3-70b`, `llama3-8b`, `mha-16`, `mha-32`) or a user TOML by
    /// path (anything containing `/` or ending in `.toml`), and validate it.
    pub fn load(name_or_path: &str) -> Result<Model, HardwareError> {
        let src = bundled::resolve(name_or_path, bundled::MODELS, "model", ".toml")?;
        Self::from_toml_str_named(&src.text, &src.label, &src.name)
    }

    /// Parse and validate a model TOML given as text; `label` names it in errors and is the
    /// name when the file has no `name` key.
    pub fn from_toml_str(text: &str, label: &str) -> Result<Model, HardwareError> {
        Self::from_toml_str_named(text, label, label)
    }

    fn from_toml_str_named(text: &str, label: &str, name: &str) -> Result<Model, HardwareError> {
        let f: ModelFile =
            toml::from_str(text).map_err(|e| bundled::toml_error(label, text, &e))?;
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
        Ok(())
    }

    /// Source string of a bundled preset, for display.
    pub fn bundled_source(name: &str) -> Option<String> {
        let (_, text) = bundled::MODELS.iter().find(|(n, _)| *n == name)?;
        let f: ModelFile = toml::from_str(text).ok()?;
        f.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_load() {
        for name in bundled::names(bundled::MODELS) {
            let m = Model::load(name).unwrap();
            assert_eq!(m.name, name);
            assert_eq!(m.dtype_bytes, 2);
            assert!(Model::bundled_source(name).is_some());
        }
        let m = Model::load("llama3-70b").unwrap();
        assert_eq!((m.q_heads, m.kv_heads, m.head_dim), (64, 8, 128));
        assert_eq!(m.kv_bytes_per_token(), 2 * 8 * 128 * 2);
        let m = Model::load("mha-32").unwrap();
        assert_eq!((m.q_heads, m.kv_heads), (32, 32));
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
