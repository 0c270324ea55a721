//! The 1F1B pipeline schedule run op by op, so micro-batches of different lengths cost what
//! they cost.
//!
//! With equal micro-batches a 1F1B pipeline of `P` stages runs `m` of them in exactly
//! `(m + P − 1)` micro-batch slots (Narayanan et al. 2021, arXiv:2104.04473 §2.2). Packed
//! long-context windows are not equal: one window's attention can cost several times
//! another's, and a heavy micro-batch stalls the stages on either side of it, which is the
//! pipeline-level imbalance WLB-LLM (OSDI'25, arXiv:2503.17924) sets out to remove. So this
//! module runs the schedule itself: every stage executes its forward (`F`) and backward
//! (`B`) passes in Megatron's 1F1B order (`megatron/core/pipeline_parallel/schedules.py`,
//! `forward_backward_pipelining_without_interleaving`): stage `s` of `P` first runs
//! `min(P − 1 − s, m)` warm-up forwards, then alternates one forward and one backward, then
//! drains the remaining backwards. A forward waits for the same micro-batch's forward on the
//! stage before it, a backward for its backward on the stage after it (the last stage's
//! backward follows its own forward), each plus the point-to-point send between the stages.
//! Every op starts when both its stage and its input are free: the longest path through
//! that dependency graph is the pipeline's time.
//!
//! **Interleaved** ([`interleaved`], Megatron's virtual pipeline stages, §2.2.2 of the same
//! paper): each stage holds `v` chunks of `L / (P·v)` layers, chunk `c` of stage `s` being
//! virtual stage `c·P + s`, so a micro-batch goes round the stages `v` times and the last
//! stage's chunk feeds the first stage's next chunk. Each stage runs `v·m` chunk-sized ops
//! in Megatron's order (`forward_backward_pipelining_with_interleaving`,
//! `get_schedule_table`): micro-batches in groups of `P`, every chunk of a group in turn;
//! `2(P − 1 − s) + (v − 1)·P` warm-up forwards (at most all of them), then one forward and
//! one backward in turn, the backwards running the chunks in reverse. Equal micro-batches
//! then take `m + (P − 1)/v` slots: the bubble shrinks `v` times, for `v` times the sends.
//!
//! Every stage holds the same layers, so a micro-batch's work is the same on each, but for
//! the last stage's output layer and loss ([`Load::head`]); a micro-batch's sends carry its
//! own tokens' activations. The sends are dependencies only: they delay the receiver, not
//! the sender.

/// One micro-batch on one pipeline stage: its forward and backward passes through the
/// stage's layers, ms.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StageWork {
    /// Forward pass through the stage's layers, ms.
    pub forward_ms: f64,
    /// Backward pass (recomputation included), ms.
    pub backward_ms: f64,
}

impl StageWork {
    /// Both passes, ms.
    pub fn total_ms(&self) -> f64 {
        self.forward_ms + self.backward_ms
    }
}

/// One op of a stage: a micro-batch's forward or backward pass through one of its chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Op {
    forward: bool,
    micro_batch: usize,
    chunk: usize,
}

/// Chunks of micro-batches stage `stage` of `stages` (each holding `chunks` chunks) keeps in
/// flight at most, its forwards run before their backwards once enough micro-batches fill
/// the pipeline: the warm-up forwards and the first steady one. `P − s` without
/// interleaving; `2(P − 1 − s) + (v − 1)·P + 1` with it (Megatron's warm-up count; so the
/// first stage keeps `L·(1 + (P − 1)/(P·v))` layers' activations, Korthikanti et al. 2022,
/// arXiv:2205.05198 §4.2.3). Fewer micro-batches keep fewer: all `v·m` at most.
pub fn in_flight_chunks(stages: u32, chunks: u32, stage: u32) -> u64 {
    let (p, v, s) = (
        u64::from(stages),
        u64::from(chunks.max(1)),
        u64::from(stage),
    );
    let behind = p.saturating_sub(1 + s);
    if v == 1 {
        behind + 1
    } else {
        2 * behind + (v - 1) * p + 1
    }
}

/// The `k`-th op of stage `s` in a 1F1B schedule of `stages` stages of `chunks` chunks and
/// `m` micro-batches (a multiple of `stages` when interleaved).
fn op(stages: usize, chunks: usize, m: usize, s: usize, k: usize) -> Op {
    let total = m * chunks;
    let warm = (in_flight_chunks(stages as u32, chunks as u32, s as u32) as usize - 1).min(total);
    let (forward, j) = if k < warm {
        (true, k)
    } else {
        let r = k - warm;
        let steady = 2 * (total - warm);
        if r < steady {
            (r % 2 == 0, if r % 2 == 0 { warm + r / 2 } else { r / 2 })
        } else {
            (false, total - warm + (r - steady))
        }
    };
    // Megatron's schedule table: groups of `stages` micro-batches, each chunk in turn.
    let group = stages * chunks;
    let (micro_batch, chunk) = ((j / group) * stages + j % stages, (j % group) / stages);
    Op {
        forward,
        micro_batch,
        chunk: if forward { chunk } else { chunks - 1 - chunk },
    }
}

/// One micro-batch's load on the pipeline: its passes on every stage, the last stage's
/// extra work for it, and each send of its activations (or their gradients) between
/// neighbouring stages.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Load {
    /// Its passes through one stage's layers, on every stage.
    pub work: StageWork,
    /// What the last stage runs on it besides: the output layer and the loss (the first
    /// stage's embedding lookup is a gather, next to nothing).
    pub head: StageWork,
    /// One send between neighbouring stages, ms.
    pub send_ms: f64,
}

/// The time, ms, from the first stage's first forward to the last op of any stage, for
/// `work` (in micro-batch order) through `stages` stages with `hop_ms` for each send
/// between neighbouring stages. Zero micro-batches take no time.
pub fn one_f_one_b(stages: u32, work: &[StageWork], hop_ms: f64) -> f64 {
    one_f_one_b_with_head(stages, work, hop_ms, StageWork::default())
}

/// [`one_f_one_b`] with `head` more work for every micro-batch on the last stage.
pub fn one_f_one_b_with_head(stages: u32, work: &[StageWork], hop_ms: f64, head: StageWork) -> f64 {
    let loads: Vec<Load> = work
        .iter()
        .map(|&work| Load {
            work,
            head,
            send_ms: hop_ms,
        })
        .collect();
    schedule(stages, &loads)
}

/// The 1F1B schedule of `loads` (in micro-batch order) through `stages` stages, each
/// micro-batch with its own work, head and sends: the time, ms, from the first stage's
/// first forward to the last op of any stage. Zero micro-batches take no time.
pub fn schedule(stages: u32, loads: &[Load]) -> f64 {
    interleaved(stages, 1, loads)
}

/// [`schedule`] with each stage's layers in `chunks` chunks (Megatron's virtual pipeline
/// stages; 1 is the plain schedule): each chunk runs `1/chunks` of a micro-batch's work on
/// the stage, and every chunk boundary costs a send.
///
/// # Panics
/// When interleaved (`chunks > 1`) over micro-batches that are not a multiple of the
/// stages: Megatron refuses those too, and [`crate::sim::step::StepOptions::new`] does
/// before a step gets here.
pub fn interleaved(stages: u32, chunks: u32, loads: &[Load]) -> f64 {
    let (p, v, m) = (stages.max(1) as usize, chunks.max(1) as usize, loads.len());
    assert!(
        v == 1 || m % p == 0,
        "an interleaved schedule runs micro-batches in groups of the stages"
    );
    if m == 0 {
        return 0.0;
    }
    let last = p * v - 1;
    let share = 1.0 / v as f64;
    // End times per virtual stage and micro-batch, NaN until computed; each op is computed
    // once, in dependency order.
    let mut f_end = vec![f64::NAN; p * v * m];
    let mut b_end = vec![f64::NAN; p * v * m];
    let mut next = vec![0usize; p];
    let mut free = vec![0.0f64; p];
    let mut pending: Vec<usize> = (0..p).rev().collect();
    while let Some(s) = pending.pop() {
        while next[s] < 2 * v * m {
            let Op {
                forward,
                micro_batch: i,
                chunk,
            } = op(p, v, m, s, next[s]);
            let l = loads[i];
            let g = chunk * p + s;
            let input = match (forward, g) {
                (true, 0) => 0.0,
                (true, _) => f_end[(g - 1) * m + i] + l.send_ms,
                // The last virtual stage turns its own forward's output round.
                (false, _) if g == last => f_end[g * m + i],
                (false, _) => b_end[(g + 1) * m + i] + l.send_ms,
            };
            if input.is_nan() {
                break; // Its input is not computed yet; the stage that makes it wakes us.
            }
            let start = free[s].max(input);
            let extra = if g == last {
                l.head
            } else {
                StageWork::default()
            };
            free[s] = start
                + if forward {
                    l.work.forward_ms * share + extra.forward_ms
                } else {
                    l.work.backward_ms * share + extra.backward_ms
                };
            next[s] += 1;
            if forward {
                f_end[g * m + i] = free[s];
                if g < last {
                    pending.push((s + 1) % p);
                }
            } else {
                b_end[g * m + i] = free[s];
                if g > 0 {
                    pending.push((s + p - 1) % p);
                }
            }
        }
    }
    debug_assert!(next.iter().all(|&n| n == 2 * v * m), "1F1B never deadlocks");
    free.into_iter().fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(forward_ms: f64, backward_ms: f64) -> StageWork {
        StageWork {
            forward_ms,
            backward_ms,
        }
    }

    fn load(work: StageWork, send_ms: f64) -> Load {
        Load {
            work,
            head: StageWork::default(),
            send_ms,
        }
    }

    #[test]
    fn each_stage_runs_megatrons_1f1b_order() {
        let order = |s| {
            (0..8)
                .map(|k| op(4, 1, 4, s, k))
                .map(|o| (o.forward, o.micro_batch))
                .collect::<Vec<_>>()
        };
        let (f, b) = (true, false);
        // Stage 0 of 4 warms up with 3 forwards, the last stage with none.
        assert_eq!(
            order(0),
            [
                (f, 0),
                (f, 1),
                (f, 2),
                (f, 3),
                (b, 0),
                (b, 1),
                (b, 2),
                (b, 3)
            ]
        );
        assert_eq!(
            order(3),
            [
                (f, 0),
                (b, 0),
                (f, 1),
                (b, 1),
                (f, 2),
                (b, 2),
                (f, 3),
                (b, 3)
            ]
        );
        assert_eq!(
            order(2),
            [
                (f, 0),
                (f, 1),
                (b, 0),
                (f, 2),
                (b, 1),
                (f, 3),
                (b, 2),
                (b, 3)
            ]
        );
        // Fewer micro-batches than warm-up slots: all forwards, then all backwards.
        let short: Vec<_> = (0..4)
            .map(|k| op(4, 1, 2, 0, k))
            .map(|o| (o.forward, o.micro_batch))
            .collect();
        assert_eq!(short, [(f, 0), (f, 1), (b, 0), (b, 1)]);
    }

    #[test]
    fn equal_micro_batches_take_m_plus_p_minus_one_slots() {
        for (p, m) in [(1, 1), (1, 5), (2, 2), (4, 8), (8, 8), (3, 17)] {
            let t = one_f_one_b(p, &vec![w(1.0, 2.0); m], 0.0);
            assert_eq!(t, 3.0 * (m as f64 + f64::from(p) - 1.0), "P {p} m {m}");
        }
        assert_eq!(one_f_one_b(4, &[], 1.0), 0.0);
    }

    #[test]
    fn each_send_delays_the_pipeline_s_fill_and_drain() {
        // One micro-batch: P forwards and P backwards in a chain, 2(P − 1) sends between.
        assert_eq!(one_f_one_b(4, &[w(1.0, 2.0)], 0.5), 12.0 + 6.0 * 0.5);
    }

    #[test]
    fn a_heavy_micro_batch_stalls_the_stages_around_it() {
        // Without pipelining the order and the spread do not matter: the stage runs them all.
        let mixed = [w(1.0, 2.0), w(3.0, 6.0), w(1.0, 2.0), w(1.0, 2.0)];
        assert_eq!(one_f_one_b(1, &mixed, 0.0), 18.0);
        // Two stages, by hand. Stage 0: F0 0–1, F1 1–4, B0 4–6 (after stage 1's B0 2–4),
        // F2 6–7, B1 13–19 (stage 1 ran F1 4–7, B1 7–13), F3 19–20, B2 20–22, B3 23–25
        // (stage 1: F2 13–14, B2 14–16, F3 20–21, B3 21–23).
        assert_eq!(one_f_one_b(2, &mixed, 0.0), 25.0);
        // Four slots of the mean (4.5 ms) would take 22.5: the heavy one holds both up.
        assert_eq!(one_f_one_b(2, &[w(1.5, 3.0); 4], 0.0), 22.5);
        assert!(one_f_one_b(4, &mixed, 0.0) > one_f_one_b(4, &[w(1.5, 3.0); 4], 0.0));
    }

    #[test]
    fn the_last_stage_s_head_runs_on_every_micro_batch() {
        let head = w(0.5, 1.0);
        // One stage: every micro-batch carries the head.
        assert_eq!(
            one_f_one_b_with_head(1, &[w(1.0, 2.0); 4], 0.0, head),
            4.0 * 4.5
        );
        // One micro-batch through 3 stages: a chain of every op, the head once each way.
        assert_eq!(
            one_f_one_b_with_head(3, &[w(1.0, 2.0)], 0.0, head),
            9.0 + 1.5
        );
        // In the steady state the last stage is the slowest: it sets the pace.
        let t = one_f_one_b_with_head(4, &[w(1.0, 2.0); 16], 0.0, head);
        assert!(t >= 16.0 * 4.5 + 3.0 * 3.0, "{t}");
    }

    #[test]
    fn interleaved_stages_run_megatrons_schedule_table() {
        let order = |s| {
            (0..16)
                .map(|k| op(2, 2, 4, s, k))
                .map(|o| (o.forward, o.micro_batch, o.chunk))
                .collect::<Vec<_>>()
        };
        let (f, b) = (true, false);
        // Stage 0 of 2, 2 chunks: 2·1 + 1·2 = 4 warm-up forwards, the group of micro-batches
        // 0 and 1 through chunk 0 then chunk 1; the backwards run the chunks in reverse.
        assert_eq!(
            order(0),
            [
                (f, 0, 0),
                (f, 1, 0),
                (f, 0, 1),
                (f, 1, 1),
                (f, 2, 0),
                (b, 0, 1),
                (f, 3, 0),
                (b, 1, 1),
                (f, 2, 1),
                (b, 0, 0),
                (f, 3, 1),
                (b, 1, 0),
                (b, 2, 1),
                (b, 3, 1),
                (b, 2, 0),
                (b, 3, 0)
            ]
        );
        // The last stage warms up with one group through the first chunk.
        assert_eq!(&order(1)[..4], [(f, 0, 0), (f, 1, 0), (f, 0, 1), (b, 0, 1)]);
        // More warm-up than ops: every forward, then every backward.
        let all: Vec<_> = (0..8).map(|k| op(4, 2, 4, 0, k).forward).collect();
        assert_eq!(all, [true, true, true, true, true, true, true, true]);
        // One chunk is the plain schedule.
        for s in 0..4 {
            assert_eq!(in_flight_chunks(4, 1, s), u64::from(4 - s));
        }
        // The first stage keeps 2(P − 1) + (v − 1)P + 1 chunks: L(1 + (P − 1)/(P·v)) layers.
        assert_eq!(in_flight_chunks(4, 2, 0), 6 + 4 + 1);
        assert_eq!(in_flight_chunks(4, 2, 3), 4 + 1);
    }

    #[test]
    fn interleaving_shrinks_the_bubble_by_the_chunks() {
        let loads = |m| vec![load(w(2.0, 4.0), 0.0); m];
        for (p, v, m) in [
            (2, 2, 4),
            (4, 2, 8),
            (4, 4, 16),
            (8, 2, 16),
            (2, 3, 6),
            (4, 2, 4),
            (8, 4, 8),
        ] {
            let t = interleaved(p, v, &loads(m));
            let slots = m as f64 + f64::from(p - 1) / f64::from(v);
            assert!((t - 6.0 * slots).abs() < 1e-9, "P {p} v {v} m {m}: {t}");
        }
        // Each chunk boundary is a send: a lone group pays v·P − 1 of them each way.
        let sent = interleaved(2, 2, &[load(w(2.0, 4.0), 0.5); 2]);
        let quiet = interleaved(2, 2, &[load(w(2.0, 4.0), 0.0); 2]);
        assert!(sent >= quiet + 2.0 * 3.0 * 0.5 - 1e-9, "{sent} vs {quiet}");
        // The head runs once a micro-batch, on the last stage's last chunk.
        let headed = |v| {
            interleaved(
                1,
                v,
                &[Load {
                    work: w(2.0, 4.0),
                    head: w(1.0, 2.0),
                    send_ms: 0.0,
                }],
            )
        };
        assert_eq!(headed(1), 9.0);
        assert_eq!(headed(3), 9.0);
    }

    #[test]
    fn each_micro_batch_carries_its_own_head_and_sends() {
        let load = |f, b, head, send_ms| Load {
            work: w(f, b),
            head: w(head, 2.0 * head),
            send_ms,
        };
        // One stage: every op back to back, heads included; no sends.
        let one = [load(1.0, 2.0, 0.5, 9.0), load(2.0, 4.0, 0.25, 9.0)];
        assert_eq!(schedule(1, &one), 3.0 + 1.5 + 6.0 + 0.75);
        // Two stages, one micro-batch: a chain with its own two sends.
        assert_eq!(schedule(2, &[load(1.0, 2.0, 0.5, 0.25)]), 6.0 + 1.5 + 0.5);
        // The uniform wrappers are the same schedule.
        let even = [load(1.0, 2.0, 0.5, 0.25); 5];
        assert_eq!(
            schedule(3, &even),
            one_f_one_b_with_head(3, &[w(1.0, 2.0); 5], 0.25, w(0.5, 1.0))
        );
    }
}
