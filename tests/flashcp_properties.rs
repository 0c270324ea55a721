//! Property tests of the FlashCP planner (issue 6 acceptance): on random batches and
//! N ∈ {1, 2, 4, 8, 16}, every plan holds equal tokens (±1), verifies structurally and
//! numerically, and meets the imbalance target R — measured by the simulator's
//! `max_over_mean` — or says in its `note` why the batch does not allow it.

mod support;

use fcp::hardware::Hardware;
use fcp::plan::{check_numeric, verify, Mask, NumericOptions, TokenRange};
use fcp::planners::{planner_for, PlanContext};
use fcp::sim::{PassSel, Simulator};
use fcp::trace::Batch;
use fcp::Model;
use proptest::prelude::*;

/// Long-tailed lengths: mostly short, sometimes 1 token, sometimes long.
fn doc_len() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..8,
        5 => 8u64..200,
        2 => 200u64..3000,
    ]
}

proptest! {
    #![proptest_config(support::proptest_config())]

    #[test]
    fn flashcp_is_balanced_or_says_why(
        lens in prop::collection::vec(doc_len(), 1..14),
        ranks in prop::sample::select(vec![1u32, 2, 4, 8, 16]),
        target in prop::sample::select(vec![1.0f64, 1.05, 1.2]),
        causal in any::<bool>(),
    ) {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        let hw = Hardware::load("h100").expect("bundled profile");
        let model = Model::load("llama3-8b").expect("bundled model");
        let ctx = PlanContext {
            ranks,
            tokens_per_rank: 4096,
            mask,
            model: &model,
            hardware: &hw,
            judge: fcp::planners::Judge::default(),
        };
        let batch = Batch::new(0, lens);
        let spec = format!("flashcp:target_imbalance={target}");
        let plan = planner_for(&spec).unwrap().plan(&batch, &ctx).unwrap();

        // Plans verify, structurally and numerically.
        let v = verify(&plan);
        prop_assert!(v.is_empty(), "{v:?}");
        let opts = NumericOptions { max_rows_per_doc: 64, ..NumericOptions::default() };
        let r = check_numeric(&plan, &opts).unwrap();
        prop_assert!(r.max_abs_error < 1e-9, "{r:?}");

        // Eq. 2: every rank holds total/N tokens, ±1 when N does not divide the total.
        let total = batch.tokens();
        let (lo, hi) = (total / ranks as u64, total.div_ceil(ranks as u64));
        for rp in &plan.ranks {
            let t: u64 = rp.owned.iter().map(TokenRange::len).sum();
            prop_assert!(lo <= t && t <= hi, "rank {} holds {t}, want {lo}..={hi}", rp.rank);
        }

        // max_over_mean ≤ R, or a note saying why not.
        let sim = Simulator::new(hw.clone(), model.clone()).unwrap();
        let m = sim.simulate(&plan, PassSel::Both).unwrap().metrics;
        let planned = plan.scheme.params["imbalance"].as_f64().unwrap();
        prop_assert!((m.max_over_mean - planned).abs() < 1e-9, "{} vs {planned}", m.max_over_mean);
        match plan.scheme.params.get("note") {
            None => prop_assert!(m.max_over_mean <= target + 1e-9, "{} > {target}", m.max_over_mean),
            Some(note) => {
                prop_assert!(m.max_over_mean > target, "note without need: {note}");
                prop_assert!(note.as_str().unwrap().contains("unreachable"), "{note}");
            }
        }

        // comm_saving = 1 − Eq5/Eq4 is recorded; Eq. 5's buffer is at most a rank's tokens
        // (so the saving can dip below 0 only by the ceil(total/N) − total/N rounding).
        let saving = plan.scheme.params["comm_saving"].as_f64().unwrap();
        prop_assert!(saving <= 1.0, "{saving}");
        let (e4, e5) = (
            plan.scheme.params["eq4_bytes"].as_u64().unwrap(),
            plan.scheme.params["eq5_bytes"].as_u64().unwrap(),
        );
        let per_token = 2 * model.kv_bytes_per_token() * (ranks as u64 - 1);
        prop_assert!(e5 <= per_token * hi, "{e5} > {per_token} · {hi}");
        if e4 > 0 {
            prop_assert!((saving - (1.0 - e5 as f64 / e4 as f64)).abs() < 1e-9);
        }
    }
}
