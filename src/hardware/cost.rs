//! The shared cost of one attention tile: the simulator and the cost-aware planners (FCP's f(B),
//! FlashCP's W_i) all call this, so every scheme is costed the same way (design.md, "Cost model
//! conventions").

use serde::Serialize;

use super::{Hardware, HardwareError, KernelProfile, KernelQuery, Pass};
use crate::model::Model;
use crate::plan::Mask;

/// FLOPs of a tile with `pairs` allowed (q, k) pairs: `4 · pairs · head_dim · q_heads` forward
/// (QKᵀ and PV, 2 FLOPs per multiply-add each); backward 2.5× forward, i.e.
/// `10 · pairs · head_dim · q_heads` (FlashAttention's convention, which the kernel tables'
/// TFLOP/s figures use too).
pub fn tile_flops(model: &Model, pass: Pass, pairs: u128) -> u128 {
    let fwd = 4 * pairs * model.head_dim as u128 * model.q_heads as u128;
    match pass {
        Pass::Fwd => fwd,
        // fwd is a multiple of 4, so 2.5× is exact in integers.
        Pass::Bwd => fwd * 5 / 2,
    }
}

/// Seconds for one attention tile run as one (non-varlen) kernel launch:
/// `FLOPs / (tflops · 1e12) + launch overhead`.
///
/// `tflops` is the profile's throughput for the tile shape (`q_len` × `kv_len`, see
/// [`KernelProfile::lookup`]) scaled by the SMs left after `hw.comm_sms` are reserved
/// ([`Hardware::achieved_tflops`]; with `comm_sms = 0` it is the table value). `pairs` is the
/// number of (q, k) pairs the mask allows in the tile (`crate::plan::allowed_pairs`). A tile
/// with no pairs costs nothing (no launch).
#[allow(clippy::too_many_arguments)] // the brief's shared signature; see `kernel_time_s`
pub fn tile_time_s(
    hw: &Hardware,
    profile: &KernelProfile,
    model: &Model,
    pass: Pass,
    mask: Mask,
    q_len: u64,
    kv_len: u64,
    pairs: u128,
) -> Result<f64, HardwareError> {
    let query = KernelQuery {
        pass,
        mask,
        head_dim: model.head_dim,
        q_len,
        kv_len,
        varlen: false,
    };
    kernel_time_s(hw, profile, model, &query, pairs)
}

/// [`tile_time_s`] for any [`KernelQuery`] (including varlen launches, where `q_len`/`kv_len`
/// are the launch's total tokens and `pairs` the sum over its tiles). The query's `head_dim`
/// should be the model's.
pub fn kernel_time_s(
    hw: &Hardware,
    profile: &KernelProfile,
    model: &Model,
    query: &KernelQuery,
    pairs: u128,
) -> Result<f64, HardwareError> {
    if pairs == 0 {
        return Ok(0.0);
    }
    let tflops = hw.achieved_tflops(profile.tflops_for(query)?);
    let flops = tile_flops(model, query.pass, pairs) as f64;
    Ok(flops / (tflops * 1e12) + hw.launch_overhead_s())
}

/// What hiding one block's K/V transfer takes: the block's K/V bytes, the time of its attention
/// against one remote block, and the link bandwidth at which the two are equal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OverlapBandwidth {
    /// Block size in tokens.
    pub block: u64,
    /// Bytes of K and V for one block.
    pub kv_bytes: u64,
    /// Forward time of one block of queries against one earlier block of K/V (a full-mask
    /// tile, the common case for remote blocks), seconds, without launch overhead.
    pub compute_s: f64,
    /// kv_bytes / compute_s, in GB/s: links at least this fast hide the transfer entirely.
    pub gbps: f64,
}

/// The link bandwidth needed to hide one block's K/V transfer behind that block's attention
/// compute (FCP paper §3.5: with 4K blocks on Hopper, ~22 GB/s, 44% of a 50 GB/s NIC).
pub fn overlap_bandwidth(
    hw: &Hardware,
    profile: &KernelProfile,
    model: &Model,
    block: u64,
) -> Result<OverlapBandwidth, HardwareError> {
    if block == 0 || block > crate::trace::MAX_DOC_LEN {
        return Err(HardwareError::InvalidQuery(format!(
            "block must be 1 to {} tokens, got {block}",
            crate::trace::MAX_DOC_LEN
        )));
    }
    let pairs = block as u128 * block as u128;
    let query = KernelQuery {
        pass: Pass::Fwd,
        mask: Mask::Full,
        head_dim: model.head_dim,
        q_len: block,
        kv_len: block,
        varlen: false,
    };
    let compute_s = kernel_time_s(hw, profile, model, &query, pairs)? - hw.launch_overhead_s();
    let kv_bytes = block * model.kv_bytes_per_token();
    Ok(OverlapBandwidth {
        block,
        kv_bytes,
        compute_s,
        gbps: kv_bytes as f64 / compute_s / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::allowed_pairs;

    fn llama70() -> Model {
        Model {
            name: "llama3-70b".into(),
            q_heads: 64,
            kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
            linear: None,
            tp: 1,
            stack: None,
        }
    }

    #[test]
    fn flops_by_hand() {
        let m = llama70();
        // 4 · 10 · 128 · 64 = 327 680; bwd 2.5× = 819 200.
        assert_eq!(tile_flops(&m, Pass::Fwd, 10), 327_680);
        assert_eq!(tile_flops(&m, Pass::Bwd, 10), 819_200);
        let odd = Model {
            q_heads: 1,
            head_dim: 1,
            ..m
        };
        // 4 · 1 = 4 → 10; 4 · 3 = 12 → 30.
        assert_eq!(tile_flops(&odd, Pass::Bwd, 1), 10);
        assert_eq!(tile_flops(&odd, Pass::Bwd, 3), 30);
    }

    #[test]
    fn tile_time_by_hand_h100() {
        let hw = Hardware::load("h100").unwrap();
        let prof = hw.kernel_profile().unwrap();
        let m = llama70();
        let pairs = allowed_pairs(Mask::Causal, 0, 4096, 0, 4096);
        assert_eq!(pairs, 8_390_656); // 4096 · 4097 / 2
                                      // fwd: 4 · 8 390 656 · 128 · 64 = 274 945 015 808 FLOPs at 662 TFLOP/s (h100-fa3 causal
                                      // fwd hd128 @4K) + 5 µs launch.
        let t = tile_time_s(&hw, &prof, &m, Pass::Fwd, Mask::Causal, 4096, 4096, pairs).unwrap();
        let want = 274_945_015_808.0 / 662e12 + 5e-6;
        assert!((t - want).abs() < 1e-12, "{t} vs {want}");
        assert!((t - 420.3e-6).abs() < 0.1e-6, "{t}");
        // bwd: 2.5× the FLOPs at 462 TFLOP/s.
        let t = tile_time_s(&hw, &prof, &m, Pass::Bwd, Mask::Causal, 4096, 4096, pairs).unwrap();
        let want = 687_362_539_520.0 / 462e12 + 5e-6;
        assert!((t - want).abs() < 1e-12, "{t} vs {want}");
        // No pairs: no launch.
        let z = tile_time_s(&hw, &prof, &m, Pass::Fwd, Mask::Causal, 4096, 4096, 0).unwrap();
        assert_eq!(z, 0.0);
    }

    #[test]
    fn comm_sms_slow_compute_proportionally() {
        let mut hw = Hardware::load("h100").unwrap();
        hw.comm_sms = 33; // a quarter of 132
        hw.launch_overhead_us = 0.0;
        let prof = hw.kernel_profile().unwrap();
        let m = llama70();
        let pairs = 4096u128 * 4096;
        let t = tile_time_s(&hw, &prof, &m, Pass::Fwd, Mask::Full, 4096, 4096, pairs).unwrap();
        // 4 · 4096² · 8192 = 549 755 813 888 FLOPs at 677 · 0.75 TFLOP/s.
        let want = 549_755_813_888.0 / (677e12 * 0.75);
        assert!((t - want).abs() < 1e-12, "{t} vs {want}");
    }

    #[test]
    fn missing_row_propagates() {
        let hw = Hardware::load("h100").unwrap();
        let prof = hw.kernel_profile().unwrap();
        let m = Model {
            head_dim: 96,
            ..llama70()
        };
        let e = tile_time_s(&hw, &prof, &m, Pass::Bwd, Mask::Causal, 10, 10, 55).unwrap_err();
        assert!(e.to_string().contains("no row for bwd causal hd 96"), "{e}");
    }

    #[test]
    fn overlap_bandwidth_by_hand() {
        let hw = Hardware::load("h100").unwrap();
        let prof = hw.kernel_profile().unwrap();
        let o = overlap_bandwidth(&hw, &prof, &llama70(), 4096).unwrap();
        // 4096 tokens × 2 (K, V) × 8 heads × 128 × 2 bytes.
        assert_eq!(o.kv_bytes, 16_777_216);
        // 4 · 4096² · 128 · 64 FLOPs at the full-mask 4K row (677 TFLOP/s).
        let want_s = 4.0 * 4096f64.powi(2) * 128.0 * 64.0 / 677e12;
        assert!((o.compute_s - want_s).abs() < 1e-12, "{o:?}");
        assert!((o.gbps - 16_777_216.0 / want_s / 1e9).abs() < 1e-9);
        assert!(overlap_bandwidth(&hw, &prof, &llama70(), 0).is_err());
    }
}
