//! Property tests of packing: WLB-LLM's packing (`--pack wlb`) drops no token but those past a
//! micro-batch's limit, keeps every micro-batch within it, and packs the first batches as it
//! packs them all; and on a long-tailed trace it evens each step's work out where fixed windows
//! do not.

mod support;

use fcp::trace::{generate, pack, pack_first, PackMode, PackOptions, Source, Trace, WlbParams};
use proptest::prelude::*;

fn wlb(group: u32, max_len: u64, outlier: u64, breakpoint: Option<u64>) -> PackMode {
    PackMode::Wlb(WlbParams {
        group,
        max_len,
        outlier,
        breakpoint,
    })
}

fn opts(mode: PackMode, context: u64) -> PackOptions {
    PackOptions {
        mode,
        ranks: 1,
        tokens_per_rank: 1,
        context: Some(context),
    }
}

proptest! {
    #![proptest_config(support::proptest_config())]

    #[test]
    fn wlb_packing_keeps_every_token_within_the_limit(
        lens in prop::collection::vec(prop_oneof![4 => 1u64..50, 1 => 50u64..400], 1..200),
        group in 1u32..6,
        context in 1u64..120,
        extra in 0u64..200,
        outlier in 1u64..300,
        breakpoint in prop::option::of(1u64..500),
    ) {
        let max_len = context + extra;
        let o = opts(wlb(group, max_len, outlier, breakpoint), context);
        let t = Trace::from_lens(&lens);
        let p = pack(&t, &o).unwrap();
        // Every token a document has up to the limit, in exactly one batch.
        let kept: u64 = lens.iter().map(|&l| l.min(max_len)).sum();
        prop_assert_eq!(p.tokens(), kept);
        let mut got: Vec<u64> = p.batches.iter().flat_map(|b| b.doc_lens.clone()).collect();
        let mut want: Vec<u64> = lens.iter().map(|&l| l.min(max_len)).collect();
        got.sort_unstable();
        want.sort_unstable();
        prop_assert_eq!(got, want);
        prop_assert_eq!(p.truncated, lens.iter().filter(|&&l| l > max_len).count());
        prop_assert_eq!(p.cuts.iter().sum::<usize>(), p.truncated);
        for (i, b) in p.batches.iter().enumerate() {
            prop_assert_eq!(b.index, i);
            prop_assert!(!b.doc_lens.is_empty());
            prop_assert!(b.tokens() <= max_len, "batch {} holds {}", i, b.tokens());
        }
        // Packing the first k batches packs them as packing them all does.
        let k = p.batches.len() / 2;
        let first = pack_first(&t, &o, k).unwrap();
        prop_assert_eq!(&first.batches[..], &p.batches[..k]);
        prop_assert_eq!(first.total_batches, p.batches.len());
        prop_assert_eq!(first.truncated, p.truncated);
    }
}

/// Work of a document as WLB weighs it (breakpoint `b`).
fn work(len: u64, b: f64) -> f64 {
    let l = len as f64;
    l + l * l / b
}

/// On the WLB-LLM trace, each full step of 8 micro-batches is within a few percent of equal
/// work under WLB packing, while fixed windows of the same length leave their heaviest window
/// well above the step's mean.
#[test]
fn wlb_packing_evens_out_each_steps_work() {
    let t = generate(&Source::WlbLlm, 20_000, 1).unwrap();
    let (group, context, b) = (8u32, 131_072u64, 104_448u64);
    let spread = |mode: PackMode| {
        let p = pack(&t, &opts(mode, context)).unwrap();
        let steps: Vec<f64> = p
            .batches
            .chunks_exact(group as usize)
            // The last steps drain the outlier queue and the leftovers.
            .take(p.batches.len() / group as usize - 2)
            .map(|step| {
                let w: Vec<f64> = step
                    .iter()
                    .map(|x| x.doc_lens.iter().map(|&l| work(l, b as f64)).sum())
                    .collect();
                let mean = w.iter().sum::<f64>() / w.len() as f64;
                w.iter().copied().fold(0.0, f64::max) / mean
            })
            .collect();
        steps.iter().sum::<f64>() / steps.len() as f64
    };
    let wlb = spread(wlb(group, 2 * context, context / 2, Some(b)));
    let window = spread(PackMode::Window);
    assert!(wlb < 1.02, "wlb max/mean {wlb}");
    assert!(window > 1.15, "window max/mean {window}");
}
