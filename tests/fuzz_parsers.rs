//! Every parser takes arbitrary bytes and structured garbage without panicking: a bad input is
//! an error value, never a crash (issue 11, first increment). The verifier, too, must reject —
//! not panic on — any plan that parses, however inconsistent its numbers.

mod support;

use fcp::hardware::{Hardware, KernelProfile, NcclTable};
use fcp::plan::verify;
use fcp::trace::Trace;
use fcp::{Model, Plan};
use proptest::prelude::*;

/// Text that looks a little like each format, so the fuzzer reaches past the first byte.
fn near_text() -> impl Strategy<Value = String> {
    let tokens = prop::sample::select(vec![
        "doc_len",
        "batch",
        ",",
        "\n",
        "\"",
        "{",
        "}",
        "[",
        "]",
        ":",
        "=",
        "-1",
        "0",
        "1",
        "4096",
        "1e999",
        "NaN",
        "doc_lens",
        "name",
        "q_heads",
        "version",
        "ranks",
        "null",
        "\u{feff}",
        "fwd",
        "causal",
        "18446744073709551616",
        " ",
        "#",
    ]);
    prop::collection::vec(tokens, 0..40).prop_map(|v| v.concat())
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), near_text()]
}

proptest! {
    #![proptest_config(support::proptest_config())]

    #[test]
    fn trace_parsers_never_panic(text in any_text()) {
        let _ = Trace::from_csv_str(&text);
        let _ = Trace::from_jsonl_str(&text);
    }

    #[test]
    fn profile_parsers_never_panic(text in any_text()) {
        let _ = Hardware::from_toml_str(&text, "fuzz.toml");
        let _ = Model::from_toml_str(&text, "fuzz.toml");
        let _ = KernelProfile::from_csv_str("fuzz", "fuzz.csv", &text);
        let _ = NcclTable::from_csv_str("fuzz", "fuzz.csv", &text);
    }

    #[test]
    fn plan_parser_never_panics(text in any_text()) {
        if let Ok(plan) = Plan::from_json(&text, "fuzz") {
            let _ = verify(&plan);
        }
    }

    /// Take a real plan and overwrite one number anywhere in its JSON: whatever parses must be
    /// verified (accepted or rejected) without a panic.
    #[test]
    fn verifier_never_panics_on_corrupted_plans(
        which in any::<prop::sample::Index>(),
        value in prop_oneof![Just(0u64), Just(1), Just(7), Just(u32::MAX as u64), any::<u64>()],
    ) {
        let json = base_plan_json();
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let mut slots = Vec::new();
        collect_numbers(&mut v, &mut slots);
        let i = which.index(slots.len());
        set_nth_number(&mut v, i, value, &mut 0);
        if let Ok(plan) = Plan::from_json(&v.to_string(), "corrupted") {
            let _ = verify(&plan);
        }
    }
}

fn base_plan_json() -> String {
    use fcp::plan::Mask;
    use fcp::planners::{planner_for, PlanContext};
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-8b").unwrap();
    let ctx = PlanContext {
        ranks: 3,
        tokens_per_rank: 64,
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
        judge: fcp::planners::Judge::default(),
    };
    planner_for("zigzag")
        .unwrap()
        .plan(&fcp::Batch::new(0, vec![5, 17, 1]), &ctx)
        .unwrap()
        .to_json()
}

fn collect_numbers(v: &mut serde_json::Value, out: &mut Vec<()>) {
    match v {
        serde_json::Value::Number(_) => out.push(()),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| collect_numbers(x, out)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| collect_numbers(x, out)),
        _ => {}
    }
}

fn set_nth_number(v: &mut serde_json::Value, n: usize, value: u64, seen: &mut usize) {
    match v {
        serde_json::Value::Number(x) => {
            if *seen == n {
                *x = value.into();
            }
            *seen += 1;
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| set_nth_number(x, n, value, seen)),
        serde_json::Value::Object(o) => o
            .values_mut()
            .for_each(|x| set_nth_number(x, n, value, seen)),
        _ => {}
    }
}
