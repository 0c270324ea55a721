//! Hand-checked batches for the FlashCP planner.

use super::*;
use crate::plan::{summarize, TokenRange};
use crate::planners::planner_for;
use crate::planners::testing::{assert_valid, with_ctx};

fn sh(doc: u32, start: u64, end: u64, rank: u32) -> Shard {
    Shard {
        doc,
        start,
        end,
        rank,
    }
}

fn owned_tokens(plan: &Plan) -> Vec<u64> {
    plan.ranks
        .iter()
        .map(|r| r.owned.iter().map(TokenRange::len).sum())
        .collect()
}

#[test]
fn plans_verify_and_hold_equal_tokens() {
    for mask in [Mask::Causal, Mask::Full] {
        for n in [1, 2, 3, 4, 8, 16] {
            for lens in [
                vec![1],
                vec![3000],
                vec![1, 3, 16, 31, 100, 257],
                vec![900, 20, 20, 20, 7, 1, 1],
                vec![64; 9],
            ] {
                let batch = Batch::new(0, lens);
                let plan = with_ctx(n, mask, |ctx| FlashCp::default().plan(&batch, ctx)).unwrap();
                assert_valid(&plan);
                let total = batch.tokens();
                let (lo, hi) = (total / n as u64, total.div_ceil(n as u64));
                for t in owned_tokens(&plan) {
                    assert!(lo <= t && t <= hi, "n {n} {:?}: {t}", batch.doc_lens);
                }
                assert_eq!(plan.memory_cap_tokens, Some(hi));
                for key in ["comm_saving", "eq4_bytes", "eq5_bytes", "per_doc_docs"] {
                    assert!(plan.scheme.params.contains_key(key), "{key}");
                }
            }
        }
    }
}

/// Two equal documents on two ranks (Fig. 4 (1)): each stays whole on its own rank, computed
/// as one task, and nothing is sent.
#[test]
fn whole_documents_stay_whole_and_send_nothing() {
    let batch = Batch::new(0, vec![8, 8]);
    let plan = with_ctx(2, Mask::Causal, |ctx| FlashCp::default().plan(&batch, ctx)).unwrap();
    let t = TokenRange::new;
    assert_eq!(plan.ranks[0].owned, vec![t(0, 0, 8)]);
    assert_eq!(plan.ranks[1].owned, vec![t(1, 0, 8)]);
    assert!(plan.transfers.is_empty());
    assert_eq!(plan.ranks[0].steps[0].tasks.len(), 1);
    assert_eq!(plan.scheme.params["comm_saving"], 1.0);
    assert_eq!(plan.scheme.params["eq5_bytes"], 0);
    assert_eq!(plan.scheme.params["per_doc_docs"], 0);
    assert!(!plan.scheme.params.contains_key("note"));

    // 6, 5, 3, 2 on 2 ranks: LPT gives {6, 2} and {5, 3}, 8 tokens each, workloads 24 and 21
    // (max/mean 1.067): whole under R = 1.1, nothing split, nothing sent.
    let batch = Batch::new(0, vec![6, 5, 3, 2]);
    let fc = FlashCp {
        target_imbalance: 1.1,
    };
    let plan = with_ctx(2, Mask::Causal, |ctx| fc.plan(&batch, ctx)).unwrap();
    assert_eq!(plan.ranks[0].owned, vec![t(0, 0, 6), t(3, 0, 2)]);
    assert_eq!(plan.ranks[1].owned, vec![t(1, 0, 5), t(2, 0, 3)]);
    assert!(plan.transfers.is_empty());
    assert_valid(&plan);
}

/// 12 and 4 tokens on 2 ranks, R = 1.05 (worked by hand in the comments).
#[test]
fn whole_doc_sharding_then_longest_to_per_doc() {
    let lens = [12u64, 4];
    // Iteration 1, all Whole-Doc: LPT puts doc 0 (W 78) on rank 0, doc 1 (W 10) on rank 1;
    // tokens 12/4, so rank 0 must give 4. Prefixes swap (Fig. 4 (2), right): doc 0's [0, 8)
    // goes to rank 1 and doc 1 entire to rank 0 — workloads 52/36, the best pair max (a
    // one-way 4-token prefix leaves 68/20). 52/44 = 1.18 > 1.05.
    let first = attempt(&lens, Mask::Causal, 2, &[], &[0, 1], 1.05);
    assert_eq!(
        first.shards,
        vec![sh(0, 0, 8, 1), sh(0, 8, 12, 0), sh(1, 0, 4, 0)]
    );
    assert_eq!(first.loads, vec![52, 36]);
    assert_eq!(first.tokens, vec![8, 8]);
    assert!(!first.reached);
    // Iteration 2: doc 0 (the longest) goes Per-Doc: chunks of 3, rank 0 holds [0,3) and
    // [9,12) (W 6 + 33), rank 1 [3,6) and [6,9) (W 15 + 24). Doc 1 goes whole to rank 0 (tie,
    // lower rank): 49/39 and 10/6 tokens; rank 0 gives doc 1's prefix [0,2) (W 3): 46/42,
    // max/mean 46/44 = 1.045 ≤ 1.05.
    let s = algorithm1(&lens, Mask::Causal, 2, 1.05);
    assert_eq!(s.per_doc, vec![0]);
    assert_eq!(
        s.shards,
        vec![
            sh(0, 0, 3, 0),
            sh(0, 3, 6, 1),
            sh(0, 6, 9, 1),
            sh(0, 9, 12, 0),
            sh(1, 0, 2, 1),
            sh(1, 2, 4, 0)
        ]
    );
    assert_eq!(s.loads, vec![46, 42]);
    assert!(s.reached);
    assert!((s.imbalance - 46.0 / 44.0).abs() < 1e-12);
    let batch = Batch::new(0, lens.to_vec());
    let plan = with_ctx(2, Mask::Causal, |ctx| FlashCp::default().plan(&batch, ctx)).unwrap();
    assert_valid(&plan);
    assert_eq!(plan.scheme.params["per_doc_docs"], 1);
    assert_eq!(plan.scheme.params["whole_doc_split_docs"], 1);
}

/// A one-way prefix move (Fig. 4 (2), left) when it keeps the pair under the target: the
/// moved prefix is exactly the surplus, and its K/V (Δl tokens) is all that is exchanged.
#[test]
fn surplus_moves_as_a_prefix() {
    // N = 2, docs 10, 10, 4, 4, 4: LPT → rank 0 {10, 4, 4} (W 55+10+10 = 75, 18 tokens),
    // rank 1 {10, 4} (W 65, 14 tokens). Rank 0 must give 2 tokens, want (75−65)/2 = 5 work:
    // the prefix [0, 2) of a 4-token document (W 3) gives 72/68, max/mean 1.03, 2 tokens
    // exchanged; the swaps need more K/V.
    let s = algorithm1(&[10, 10, 4, 4, 4], Mask::Causal, 2, 1.05);
    assert!(s.per_doc.is_empty());
    assert_eq!(s.tokens, vec![16, 16]);
    assert_eq!(s.loads, vec![72, 68]);
    // Ties on exchanged K/V and pair max go to the first (longest) document.
    assert!(s.shards.contains(&sh(0, 0, 2, 1)), "{:?}", s.shards);
    assert!(s.shards.contains(&sh(0, 2, 10, 0)), "{:?}", s.shards);
    let v = volumes(&[10, 10, 4, 4, 4], &s.shards, Mask::Causal, 2, 1);
    assert_eq!(v.buffer_tokens, 2);
}

/// Eq. 4 and Eq. 5 by hand on a hand-made sharding, N = 4, 32 tokens.
#[test]
fn eq4_eq5_by_hand() {
    let lens = [16u64, 8, 8];
    let kvb = 10;
    // Doc 0 in three shards (ranks 1, 2, 0), doc 1 whole on 3, doc 2 whole on 1.
    let shards = vec![
        sh(0, 0, 4, 1),
        sh(0, 4, 8, 2),
        sh(0, 8, 16, 0),
        sh(1, 0, 8, 3),
        sh(2, 0, 8, 1),
    ];
    // Eq. 4: 2 passes · 32/4 tokens · 10 B · (4 − 1) = 480 B.
    // Eq. 5 (causal): Ŝ = doc 0's [0,4) on rank 1 and [4,8) on rank 2 → max 4 tokens → 240 B.
    let v = volumes(&lens, &shards, Mask::Causal, 4, kvb);
    assert_eq!((v.eq4_bytes, v.eq5_bytes, v.buffer_tokens), (480, 240, 4));
    assert!((v.saving() - 0.5).abs() < 1e-12);
    // Full mask: the last shard is read too → rank 0's 8 tokens → 480 B, no saving.
    let v = volumes(&lens, &shards, Mask::Full, 4, kvb);
    assert_eq!((v.eq5_bytes, v.buffer_tokens), (480, 8));
    assert_eq!(v.saving(), 0.0);
    // C/N is rounded down: 35 tokens on 4 ranks count as 8 each (not 8.75), 480 B again.
    let v = volumes(&[19, 8, 8], &shards, Mask::Causal, 4, kvb);
    assert_eq!(v.eq4_bytes, 480);
    // Splitting doc 2 as well puts its prefix in rank 1's buffer: 8 tokens, no saving.
    let mut more = shards.clone();
    more[4] = sh(2, 0, 4, 1);
    more.push(sh(2, 4, 8, 2));
    let v = volumes(&lens, &more, Mask::Causal, 4, kvb);
    assert_eq!((v.eq5_bytes, v.buffer_tokens), (480, 8));
}

/// The plan's all-gather moves exactly the Eq. 5 buffers: each rank's Ŝ to every other rank.
#[test]
fn plan_bytes_match_the_exchanged_buffers() {
    let batch = Batch::new(0, vec![3000, 700, 300, 120, 50, 9, 1]);
    let (plan, model) = with_ctx(4, Mask::Causal, |ctx| {
        (
            FlashCp::default().plan(&batch, ctx).unwrap(),
            ctx.model.clone(),
        )
    });
    assert_valid(&plan);
    let s = algorithm1(&batch.doc_lens, Mask::Causal, 4, 1.05);
    let ex = exchanged(&s.shards, Mask::Causal, 4);
    let want: u64 = ex
        .iter()
        .map(|v| v.iter().map(TokenRange::len).sum::<u64>() * 3)
        .sum::<u64>()
        * model.kv_bytes_per_token();
    assert_eq!(summarize(&plan, &model).comm_bytes_total, want);
    let v = volumes(&batch.doc_lens, &s.shards, Mask::Causal, 4, 1);
    assert_eq!(
        plan.scheme.params["eq5_bytes"],
        v.eq5_bytes * model.kv_bytes_per_token()
    );
}

#[test]
fn per_doc_leftovers_go_round_robin() {
    let mut cursor = 0;
    let a = per_doc_chunks(0, 5, 2, &mut cursor);
    assert_eq!(
        a,
        vec![
            sh(0, 0, 2, 0),
            sh(0, 2, 3, 1),
            sh(0, 3, 4, 1),
            sh(0, 4, 5, 0)
        ]
    );
    assert_eq!(cursor, 1);
    let b = per_doc_chunks(1, 5, 2, &mut cursor);
    assert_eq!(
        b,
        vec![
            sh(1, 0, 1, 0),
            sh(1, 1, 3, 1),
            sh(1, 3, 4, 1),
            sh(1, 4, 5, 0)
        ]
    );
    // Two documents of 5 tokens: 5 tokens on each rank.
    let per_rank = |r: u32| -> u64 {
        a.iter()
            .chain(&b)
            .filter(|x| x.rank == r)
            .map(|x| x.end - x.start)
            .sum()
    };
    assert_eq!((per_rank(0), per_rank(1)), (5, 5));
    // 7 leftovers on N = 4: ranks 1, 2, 3, 0 get one, ranks 1, 2, 3 a second (on the tail).
    let mut c = 1;
    let x = per_doc_chunks(0, 15, 4, &mut c);
    let sizes: Vec<u64> = x.iter().map(|s| s.end - s.start).collect();
    assert_eq!(sizes, vec![2, 2, 2, 2, 2, 2, 2, 1]);
    assert_eq!(c, 0);
}

/// When R cannot be met the plan says why.
#[test]
fn unreachable_target_has_a_note() {
    // Three 1-token documents on 2 ranks: workloads 2 and 1 at best.
    let batch = Batch::new(0, vec![1, 1, 1]);
    let plan = with_ctx(2, Mask::Causal, |ctx| FlashCp::default().plan(&batch, ctx)).unwrap();
    let note = plan.scheme.params["note"].as_str().unwrap().to_string();
    assert!(note.contains("unreachable"), "{note}");
    assert!(note.contains("shorter than 2N"), "{note}");
    assert_valid(&plan);
}

#[test]
fn scheme_param_is_parsed() {
    assert!(planner_for("flashcp").is_ok());
    let p = planner_for("flashcp:target_imbalance=1.2").unwrap();
    assert_eq!(p.params()["target_imbalance"], 1.2);
    for bad in ["flashcp:target_imbalance=0.9", "flashcp:target_imbalance=x"] {
        let e = planner_for(bad).err().unwrap().to_string();
        assert!(e.contains("must be a number ≥ 1"), "{e}");
    }
    assert!(planner_for("flashcp:block=3").is_err());
}
