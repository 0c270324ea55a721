//! The attention shape a plan is costed for: head counts, head dimension, dtype.
//!
//! Planners that are bound by head counts (Ulysses) and every cost estimate need it.

use serde::{Deserialize, Serialize};

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
