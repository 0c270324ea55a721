//! How the per-tile compute model prices short documents, checked against the one measurement
//! of short documents the bundled tables hold: MagiAttention's H100 varlen-causal rows (launches
//! of `total` tokens whose documents are drawn from MagiAttention's length distribution, each
//! capped at total / 4; `kernels-profile/h100-fa3.csv`).
//!
//! For each total it fills 200 launches with documents from `gen:magi` (seed 3) cut the same way,
//! prices every document as one causal tile at its own length — what the simulator does — and
//! prints the launch's FLOP-weighted TFLOP/s next to the measured varlen row. Three rules for
//! documents shorter than the table's shortest row (1,024 tokens) are compared: the lookup's
//! clamp (the shortest row's rate, what `KernelProfile::lookup` does for causal tiles),
//! throughput falling in proportion to length, and block counting (a document costs the
//! kernel blocks its causal triangle touches, each at the shortest row's time per block, and
//! no less than the clamp: the padding of a tile that does not fill its blocks, with assumed
//! blocks of 128 × 128 forward and 64 × 128 backward). The mean |ln(model / measured)| over launches
//! of 4K tokens or more (the sizes a CP rank's steps have) says which rule fits
//! (`docs/kernel-profile.md` § Lookup).
//!
//! ```text
//! cargo run --release --example short_tiles
//! ```

use fcp::hardware::{KernelProfile, KernelQuery, Pass};
use fcp::plan::{allowed_pairs, Mask};
use fcp::trace::{generate, Source};

/// Kernel blocks of `bm` query rows × `bn` key columns that a causal `len × len` tile touches.
fn causal_blocks(len: u64, bm: u64, bn: u64) -> u64 {
    (0..len.div_ceil(bm))
        .map(|m| ((m + 1) * bm).min(len).div_ceil(bn))
        .sum()
}

fn main() {
    let trace = generate(&Source::from_name("magi").expect("magi"), 100_000, 3).expect("trace");
    let lens: Vec<u64> = trace.docs.iter().map(|d| d.len).collect();
    let profile = KernelProfile::load("h100-fa3").expect("bundled profile");
    let query = |pass, len, varlen| KernelQuery {
        pass,
        mask: Mask::Causal,
        head_dim: 128,
        q_len: len,
        kv_len: len,
        varlen,
    };
    println!("| pass | total | measured varlen | clamp (lookup) | proportional | blocks |");
    println!("|---|---|---|---|---|---|");
    let mut err = [0.0f64; 3];
    let mut counted = 0;
    for pass in [Pass::Fwd, Pass::Bwd] {
        let shortest = profile
            .rows()
            .iter()
            .filter(|r| r.pass == pass && r.mask == Mask::Causal && !r.varlen && r.head_dim == 128)
            .min_by_key(|r| r.q_len)
            .expect("causal rows");
        let (bm, bn) = if pass == Pass::Fwd {
            (128, 128)
        } else {
            (64, 128)
        };
        let pairs = |len| allowed_pairs(Mask::Causal, 0, len, 0, len) as f64;
        let per_block =
            pairs(shortest.q_len) / shortest.tflops / causal_blocks(shortest.q_len, bm, bn) as f64;
        let mut next = 0usize;
        for total in [1024u64, 2048, 4096, 8192, 16384, 32768] {
            let (mut flops, mut clamp_s, mut prop_s, mut block_s) = (0.0, 0.0, 0.0, 0.0);
            for _ in 0..200 {
                let mut left = total;
                while left > 0 {
                    let len = lens[next % lens.len()].min(total / 4).min(left);
                    next += 1;
                    left -= len;
                    // FLOPs up to the common factor 4·d·h (and 2.5 backward), which cancels.
                    let f = pairs(len);
                    let clamp = profile.tflops_for(&query(pass, len, false)).expect("row");
                    let prop = if len < shortest.q_len {
                        shortest.tflops * len as f64 / shortest.q_len as f64
                    } else {
                        clamp
                    };
                    flops += f;
                    clamp_s += f / clamp;
                    prop_s += f / prop;
                    block_s += if len < shortest.q_len {
                        (causal_blocks(len, bm, bn) as f64 * per_block).max(f / clamp)
                    } else {
                        f / clamp
                    };
                }
            }
            let measured = profile.tflops_for(&query(pass, total, true)).expect("row");
            let (clamp, prop, block) = (flops / clamp_s, flops / prop_s, flops / block_s);
            println!("| {pass} | {total} | {measured:.0} | {clamp:.0} | {prop:.0} | {block:.0} |");
            if total >= 4096 {
                for (e, model) in err.iter_mut().zip([clamp, prop, block]) {
                    *e += (model / measured).ln().abs();
                }
                counted += 1;
            }
        }
    }
    println!(
        "\nmean |ln(model / measured)|, totals ≥ 4K: clamp {:.3}, proportional {:.3}, blocks {:.3}",
        err[0] / counted as f64,
        err[1] / counted as f64,
        err[2] / counted as f64
    );
}
