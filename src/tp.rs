//! Tensor parallelism (TP) under context parallelism: each CP rank is a group of `tp` GPUs in
//! one node that split every layer between them, the way Megatron-LM runs Llama-3-405B at
//! TP 8 × CP 16 (Llama 3 paper, arXiv:2407.21783 §3.3, Table 4).
//!
//! Megatron splits the Q/K/V and MLP-in projections by columns and the output and MLP-out
//! projections by rows (Shoeybi et al. 2019, arXiv:1909.08053 §3), so each GPU runs
//! `q_heads / tp` query heads, `kv_heads / tp` KV heads and `ffn_hidden / tp` of the MLP.
//! With sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198 §4.2.2) the
//! `hidden`-wide work between them (norms, residual adds) is split by tokens, and each
//! column-parallel GEMM starts with an all-gather of its input while each row-parallel one
//! ends with a reduce-scatter of its output.
//!
//! For a CP plan that means ([`split`]):
//! - one GPU's attention is the plan's over `1/tp` of the heads: less compute, and less K/V
//!   to exchange (the kernel profile prices the narrower launch);
//! - the CP group of one TP index holds one GPU of each TP group: `gpus_per_node / tp` of its
//!   ranks share a node, each on its own NVLink port and NIC;
//! - the whole layer (`--layer`) pays the TP collectives of [`stages`], on the rank's
//!   tokens, over NVLink inside the node: exposed, or with `--tp-overlap` hidden behind the
//!   GEMM each one feeds or drains as far as that GEMM lasts.
//!
//! Each of the `tp` CP groups runs the same plan on its own heads, so simulating one GPU's
//! share is simulating the step.

use crate::hardware::{Collective, Hardware, HardwareError, Pass};
use crate::model::{Gemm, Model, Recompute};

/// The tensor-parallel degree a model, plan, report or sweep has when it says none: 1 (serde
/// default).
pub fn one() -> u32 {
    1
}

/// Whether a tensor-parallel degree is 1: left out of JSON and TOML, so that every output
/// without TP keeps its earlier form byte for byte.
pub fn is_one(tp: &u32) -> bool {
    *tp == 1
}

/// The largest tensor-parallel degree accepted: far beyond any NVLink domain, low enough that
/// a typo is an error rather than a model of zero heads.
pub const MAX_TP: u32 = 1024;

/// One GPU's share of `model` under `tp`-way tensor parallelism, and the CP group it sees on
/// `hw`: what planning and simulating a CP plan under TP takes. `tp` = 1 returns both as
/// they are. Errors when the split is not one Megatron runs: a TP group larger than a node
/// (its collectives would leave NVLink), or heads or MLP width that `tp` does not divide.
pub fn split(hw: &Hardware, model: &Model, tp: u32) -> Result<(Hardware, Model), HardwareError> {
    let bad = |message: String| {
        HardwareError::TensorParallel(format!("tensor-parallel degree {tp}: {message}"))
    };
    if !(1..=MAX_TP).contains(&tp) {
        return Err(bad(format!("must be 1 to {MAX_TP}")));
    }
    if model.tp != 1 {
        return Err(bad(format!(
            "model {} is already one GPU's share of TP {}",
            model.name, model.tp
        )));
    }
    if tp == 1 {
        return Ok((hw.clone(), model.clone()));
    }
    if hw.gpus_per_node % tp != 0 {
        return Err(bad(format!(
            "a TP group sits in one node's NVLink domain, and {tp} does not divide the {} GPUs per node of {}",
            hw.gpus_per_node, hw.name
        )));
    }
    let divides = |field: &str, v: u32| {
        if v % tp == 0 {
            Ok(v / tp)
        } else {
            Err(bad(format!(
                "model {} has {field} {v}, which {tp} does not divide (each GPU runs an equal share)",
                model.name
            )))
        }
    };
    let mut shard = model.clone();
    shard.q_heads = divides("q_heads", model.q_heads)?;
    // Megatron splits KV heads (query groups) between the GPUs too: it needs them divisible.
    shard.kv_heads = divides("kv_heads", model.kv_heads)?;
    if let Some(l) = shard.linear.as_mut() {
        l.ffn_hidden = divides("ffn_hidden", l.ffn_hidden)?;
    }
    shard.tp = tp;
    let mut slice = hw.clone();
    slice.gpus_per_node = hw.gpus_per_node / tp;
    slice.description = format!(
        "{} (the CP group of one TP-{tp} index: {} GPU(s) per node)",
        hw.description, slice.gpus_per_node
    );
    Ok((slice, shard))
}

/// One GEMM of a layer pass, with the TP collective Megatron runs on its input (an all-gather,
/// before it) or its output (a reduce-scatter, after it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stage {
    /// The GEMM.
    pub gemm: Gemm,
    /// Runs of its forward FLOPs: 1 forward, 2 backward (input and weight gradients). The
    /// collective overlaps one run at most: the forward GEMM, or the input-gradient GEMM.
    pub runs: f64,
    /// The collective on its input or output; `None` for a GEMM alone.
    pub collective: Option<Collective>,
}

const fn stage(gemm: Gemm, runs: f64, collective: Option<Collective>) -> Stage {
    Stage {
        gemm,
        runs,
        collective,
    }
}

/// The GEMMs and TP collectives of one layer pass, before and after attention, in order
/// (sequence parallelism, Korthikanti et al. 2022 §4.2.2, Fig. 5):
/// - forward: an all-gather into the Q/K/V projection; after attention the output projection
///   into a reduce-scatter, an all-gather into the MLP, the MLP's last matrix into a
///   reduce-scatter;
/// - backward, in reverse with each collective's conjugate: before attention an all-gather
///   of the MLP's output gradient, a reduce-scatter of its input gradient, an all-gather of
///   the output projection's; after it a reduce-scatter of the Q/K/V projection's input
///   gradient. The all-gathers that rebuild the column-parallel GEMMs' inputs for their
///   weight gradients are taken as hidden behind the input-gradient GEMMs, as Megatron
///   overlaps them (§4.2.2);
/// - under [`Recompute::Mlp`] the backward pass first reruns the MLP forward, gathering its
///   input again (its kept copy is the sequence-parallel shard). A forward pass rerun under
///   [`Recompute::Full`] is a forward pass.
///
/// Their FLOPs add up to [`Model::linear_flops_per_token`] plus
/// [`Model::rerun_flops_per_token`] (test `stages_hold_the_layers_flops`).
pub fn stages(pass: Pass, recompute: Recompute) -> [Vec<Stage>; 2] {
    use Collective::{AllGather as Ag, ReduceScatter as Rs};
    match pass {
        Pass::Fwd => [
            vec![stage(Gemm::Qkv, 1.0, Some(Ag))],
            vec![
                stage(Gemm::Out, 1.0, Some(Rs)),
                stage(Gemm::MlpIn, 1.0, Some(Ag)),
                stage(Gemm::MlpOut, 1.0, Some(Rs)),
            ],
        ],
        Pass::Bwd => {
            let mut before = Vec::new();
            if recompute == Recompute::Mlp {
                before.push(stage(Gemm::MlpIn, 1.0, Some(Ag)));
                before.push(stage(Gemm::MlpOut, 1.0, None));
            }
            before.extend([
                stage(Gemm::MlpOut, 2.0, Some(Ag)),
                stage(Gemm::MlpIn, 2.0, Some(Rs)),
                stage(Gemm::Out, 2.0, Some(Ag)),
            ]);
            [before, vec![stage(Gemm::Qkv, 2.0, Some(Rs))]]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Hardware {
        Hardware::load("h100").unwrap()
    }

    #[test]
    fn split_divides_heads_mlp_and_the_node() {
        let m = Model::load("llama3-70b").unwrap();
        let (hw, s) = split(&h100(), &m, 8).unwrap();
        assert_eq!((s.q_heads, s.kv_heads, s.tp), (8, 1, 8));
        assert_eq!(s.linear.unwrap().ffn_hidden, 28672 / 8);
        assert_eq!(s.linear.unwrap().hidden, m.linear.unwrap().hidden);
        assert_eq!(hw.gpus_per_node, 1);
        assert_eq!(
            (hw.nvlink_gbs, hw.nic_gbs),
            (h100().nvlink_gbs, h100().nic_gbs)
        );
        let (hw, s) = split(&h100(), &m, 2).unwrap();
        assert_eq!((s.q_heads, s.kv_heads, hw.gpus_per_node), (32, 4, 4));
        // TP 1 changes nothing.
        let (hw, s) = split(&h100(), &m, 1).unwrap();
        assert_eq!((hw, s), (h100(), m));
    }

    #[test]
    fn a_shard_is_a_tp_th_of_the_layer() {
        let m = Model::load("llama3-70b").unwrap();
        let (_, s) = split(&h100(), &m, 4).unwrap();
        for pass in [Pass::Fwd, Pass::Bwd] {
            let (a, b) = (
                m.linear_flops_per_token(pass).unwrap().total(),
                s.linear_flops_per_token(pass).unwrap().total(),
            );
            assert!((a / b - 4.0).abs() < 1e-12, "{a} {b}");
        }
        assert_eq!(m.kv_bytes_per_token(), 4 * s.kv_bytes_per_token());
        for r in [Recompute::None, Recompute::Mlp, Recompute::Full] {
            let (a, b) = (
                m.saved_bytes_per_token(r).unwrap(),
                s.saved_bytes_per_token(r).unwrap(),
            );
            // Everything is spread over the group but the 8 bytes of fp32 norm statistics.
            assert!(a.abs_diff(4 * b) <= 4 * 8, "{r:?}: {a} vs 4 × {b}");
        }
    }

    #[test]
    fn splits_megatron_does_not_run_are_errors() {
        let m = Model::load("llama3-70b").unwrap();
        let e = |tp, m: &Model| split(&h100(), m, tp).unwrap_err().to_string();
        assert!(
            e(3, &m).contains("does not divide the 8 GPUs per node"),
            "{}",
            e(3, &m)
        );
        assert!(e(16, &m).contains("does not divide the 8 GPUs per node"));
        assert!(e(0, &m).contains("must be 1 to 1024"));
        let (_, s) = split(&h100(), &m, 2).unwrap();
        assert!(e(2, &s).contains("already one GPU's share of TP 2"));
        let small = Model {
            kv_heads: 2,
            ..m.clone()
        };
        assert!(e(4, &small).contains("kv_heads 2, which 4 does not divide"));
    }

    #[test]
    fn each_pass_gathers_and_scatters_twice() {
        let count = |v: &[Stage], c| v.iter().filter(|s| s.collective == Some(c)).count();
        for r in [Recompute::None, Recompute::Full] {
            for pass in [Pass::Fwd, Pass::Bwd] {
                let [b, a] = stages(pass, r);
                let all: Vec<Stage> = b.into_iter().chain(a).collect();
                assert_eq!(count(&all, Collective::AllGather), 2, "{pass:?}");
                assert_eq!(count(&all, Collective::ReduceScatter), 2, "{pass:?}");
            }
        }
        let [b, _] = stages(Pass::Bwd, Recompute::Mlp);
        assert_eq!(count(&b, Collective::AllGather), 3);
    }

    #[test]
    fn stages_hold_the_layers_flops() {
        for name in ["llama3-70b", "llama3-8b"] {
            let m = Model::load(name).unwrap();
            for r in [Recompute::None, Recompute::Mlp, Recompute::Full] {
                for pass in [Pass::Fwd, Pass::Bwd] {
                    let [b, a] = stages(pass, r);
                    let sum = |v: &[Stage]| -> f64 {
                        v.iter()
                            .map(|s| s.runs * m.gemm_flops_per_token(s.gemm).unwrap())
                            .sum()
                    };
                    let f = m.linear_flops_per_token(pass).unwrap();
                    let rerun = match pass {
                        Pass::Fwd => 0.0,
                        Pass::Bwd => m.rerun_flops_per_token(r).unwrap(),
                    };
                    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * y;
                    assert!(close(sum(&b), f.before + rerun), "{name} {r:?} {pass:?}");
                    assert!(close(sum(&a), f.after), "{name} {r:?} {pass:?}");
                }
            }
        }
    }
}
