//! Text renderings of comparison rows.

use super::compare::{CompareRow, StepsSummary};

/// A value from a user's file or flag, as a message shows it: `1e308` stays `1e308` rather
/// than the 309 digits `{}` would print, and `1e-30` does not become thirty zeros.
pub fn shown(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && a.is_finite() && !(1e-4..1e9).contains(&a) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// A rate or share to one decimal, as the tables print GPU figures, or to three significant
/// digits where one decimal would read `0.0`: a CPU calibration's 1.7e-4 TFLOP/s printed as
/// `0.0 TFLOP/s` and `0.0%` beside its own rows in full (bug hunt).
pub fn tenths(v: f64) -> String {
    if v != 0.0 && v.is_finite() && v.abs() < 0.05 {
        format!("{v:.2e}")
    } else {
        format!("{v:.1}")
    }
}

/// A value as [`shown`] writes it, but only where `{}` would print more than 16 characters:
/// every value whose plain form is short prints exactly as it always has (`0.03`, `0.00001`,
/// `1000000000`), while `1e308` is no longer 309 digits.
pub fn shown_when_long(v: f64) -> String {
    let plain = format!("{v}");
    if plain.len() > 16 {
        shown(v)
    } else {
        plain
    }
}

/// `v` to at most `decimals` decimals, trailing zeros and a trailing point dropped
/// (`2.0214…` → `2.021`, `2.0` → `2`): a derived figure no one wrote, shown readably.
pub fn trimmed(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_string()
}

/// Human-readable byte count (KiB, MiB, GiB).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Whether any row has whole-layer metrics (the comparison simulated the layer).
fn has_layer(rows: &[CompareRow]) -> bool {
    rows.iter()
        .any(|r| r.mean.as_ref().is_some_and(|m| m.layer.is_some()))
}

/// Whether any row priced tensor-parallel collectives (the layer under `--tp`).
fn has_tp(rows: &[CompareRow]) -> bool {
    rows.iter().any(|r| {
        r.mean
            .as_ref()
            .and_then(|m| m.layer.as_ref())
            .is_some_and(|l| l.tp_comm_max_ms.is_some())
    })
}

/// Whether any row counted the GPU memory of a training step (`--memory`).
fn has_footprint(rows: &[CompareRow]) -> bool {
    rows.iter().any(|r| footprint(r).is_some())
}

/// The fullest GPU's footprint of a row, when counted.
fn footprint(r: &CompareRow) -> Option<crate::footprint::Footprint> {
    r.mean.as_ref()?.layer.as_ref()?.footprint
}

/// Under ZeRO 3, a row's per-layer weight gathers and gradient reduce-scatter, ms: all of
/// them and what its work left exposed.
fn zero3(r: &CompareRow) -> Option<(f64, f64)> {
    let l = r.mean.as_ref()?.layer.as_ref()?;
    l.zero3_comm_ms.zip(l.zero3_exposed_ms)
}

/// `yes`, `NO`, or `-` when the GPU's memory is unknown.
pub fn fits_word(f: Option<&crate::footprint::Footprint>) -> &'static str {
    match f.and_then(|f| f.fits) {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    }
}

/// A table for people: means, p95 of attention time, speedup; failed schemes show their reason.
/// When the whole layer was simulated, columns follow: its time, its speedup, the token
/// imbalance and the activations kept; under tensor parallelism, the TP collectives too.
pub fn compare_table(rows: &[CompareRow], baseline: &str) -> String {
    let layer = has_layer(rows);
    let tp = has_tp(rows);
    let mut s = format!(
        "{:<24} {:>10} {:>10} {:>8} {:>6} {:>7} {:>7} {:>8} {:>11} {:>11} {:>9} {:>9}",
        "scheme",
        "time_ms",
        "p95_ms",
        "speedup",
        "MFU",
        "comp_im",
        "comm_im",
        "vs_LB",
        "comm/batch",
        "peak_mem",
        "max/mean",
        "comm_save"
    );
    if layer {
        s.push_str(&format!(
            " {:>10} {:>8} {:>6} {:>10}",
            "layer_ms", "layer_x", "tok_im", "act/layer"
        ));
    }
    if tp {
        s.push_str(&format!(" {:>8}", "tp_ms"));
    }
    let mem = has_footprint(rows);
    if mem {
        s.push_str(&format!(" {:>11} {:>5}", "mem/GPU", "fits"));
    }
    let z3 = rows.iter().any(|r| zero3(r).is_some());
    if z3 {
        s.push_str(&format!(" {:>8}", "zero3_ms"));
    }
    let stepped = rows.iter().any(|r| r.priced.figures().is_some());
    // Several steps priced: their mean, and the slowest beside it.
    let multi = rows.iter().any(|r| r.priced.over_steps.is_some());
    if stepped {
        s.push_str(&format!(" {:>10}", "step_ms"));
        if multi {
            s.push_str(&format!(" {:>10}", "max_step"));
        }
        s.push_str(&format!(" {:>10}", "tok/s/GPU"));
    }
    s.push('\n');
    for r in rows {
        match (&r.mean, &r.p95) {
            (Some(m), Some(p)) => {
                s.push_str(&format!(
                "{:<24} {:>10.3} {:>10.3} {:>8} {:>5.1}% {:>7.3} {:>7.3} {:>7.2}× {:>11} {:>11} {:>9.3} {:>9}",
                r.scheme,
                m.attention_time_ms,
                p.attention_time_ms,
                // No speedup when the baseline could not run: a dash, not `NaN×`.
                r.speedup.map_or("-".to_string(), |x| format!("{x:.2}×")),
                100.0 * m.mfu,
                m.compute_imbalance,
                m.comm_imbalance,
                m.vs_lower_bound,
                human_bytes(m.comm_bytes_total),
                human_bytes(m.mem_max_bytes),
                m.max_over_mean,
                r.comm_saving
                    .map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x))
                ));
                if let Some(l) = &m.layer {
                    s.push_str(&format!(
                        " {:>10.3} {:>8} {:>6.3} {:>10}",
                        l.layer_time_ms,
                        r.layer_speedup
                            .map_or("-".to_string(), |x| format!("{x:.2}×")),
                        l.token_imbalance,
                        human_bytes(l.act_max_bytes)
                    ));
                    if let Some(t) = l.tp_comm_max_ms {
                        s.push_str(&format!(" {t:>8.3}"));
                    }
                    if let Some(f) = &l.footprint {
                        s.push_str(&format!(
                            " {:>11} {:>5}",
                            human_bytes(f.total_bytes),
                            fits_word(Some(f))
                        ));
                    }
                }
                if let Some((_, exposed)) = zero3(r) {
                    s.push_str(&format!(" {exposed:>8.3}"));
                }
                if stepped {
                    let x = r.priced.figures();
                    let cell =
                        |f: &dyn Fn(&StepsSummary) -> String| x.as_ref().map_or("-".into(), f);
                    s.push_str(&format!(
                        " {:>10}",
                        cell(&|x| format!("{:.1}", x.mean_step_ms))
                    ));
                    if multi {
                        s.push_str(&format!(
                            " {:>10}",
                            cell(&|x| format!("{:.1}", x.max_step_ms))
                        ));
                    }
                    s.push_str(&format!(" {:>10}", cell(&|x| rate(x.tokens_per_gpu_s))));
                }
                s.push('\n');
            }
            _ => s.push_str(&format!(
                "{:<24} cannot run: {}\n",
                r.scheme,
                r.error.as_deref().unwrap_or("unknown error")
            )),
        }
    }
    let note = if rows
        .iter()
        .any(|r| r.scheme == baseline && r.mean.is_none())
    {
        format!("speedup: none, {baseline} could not run")
    } else {
        format!("speedup = {baseline}'s mean attention time / the scheme's")
    };
    let note = if layer {
        format!("{note}; layer = attention plus projections and MLP, layer_x its speedup, act/layer the activations one layer keeps on the fullest rank")
    } else {
        note
    };
    let note = if tp {
        format!("{note}; tp_ms the TP collectives of the rank spending longest in them, in the layer time")
    } else {
        note
    };
    let note = if mem {
        format!("{note}; mem/GPU what the fullest GPU holds over a training step in the fullest batch (weights, gradients, optimizer state, every layer's activations, the largest transient), fits whether it is within the GPU's memory")
    } else {
        note
    };
    let note = if z3 {
        format!("{note}; zero3_ms what ZeRO 3's per-layer collectives (weight gathers; in a backward pass the gradients' reduce-scatter too) leave exposed, in the layer time")
    } else {
        note
    };
    let steps = rows
        .iter()
        .find_map(|r| r.priced.over_steps)
        .map_or(1, |o| o.steps);
    let note = match rows.iter().find_map(|r| r.priced.first()) {
        Some(x) => {
            use crate::sim::step::{Deal, MicroBatchOrder};
            // Bug hunt: the footer said "in order" of a step run in hill order.
            let how = match (x.deal, x.micro_batch_order) {
                (Deal::Stream, MicroBatchOrder::Stream) => "in order",
                (Deal::Stream, MicroBatchOrder::Hill) => "each replica's in hill order",
                (Deal::Lpt, MicroBatchOrder::Stream) => "dealt to the replicas LPT",
                (Deal::Lpt, MicroBatchOrder::Hill) => {
                    "dealt to the replicas LPT, each replica's in hill order"
                }
            };
            let what = "(the pipeline, the output layer and the data-parallel collectives it leaves exposed: docs/cost-model.md § Training step)";
            if steps > 1 {
                format!("{note}; step_ms the mean of {steps} consecutive training steps, each with its share of the batches as its micro-batches, {how} {what}, max_step the slowest of them, tok/s/GPU the real tokens they train per GPU-second")
            } else {
                // Bug hunt: `--steps` that priced one step (a short trace) showed `max_step`
                // with no word about it.
                let max = if rows.iter().any(|r| r.priced.over_steps.is_some()) {
                    ", max_step the slowest of the steps priced (one here)"
                } else {
                    ""
                };
                format!("{note}; step_ms a training step with the batches as its micro-batches, {how} {what}{max}, tok/s/GPU the real tokens it trains per GPU-second")
            }
        }
        None => note,
    };
    s.push_str(&format!("(means over batches; {note})\n"));
    s
}

/// CSV with one row per scheme: the mean of every plan metric, p95 attention time, speedup,
/// and the error (empty when the scheme ran). When the whole layer was simulated, its columns
/// ([`LAYER_CSV_COLUMNS`]) follow `error`, so the others keep their places; under tensor
/// parallelism `tp_comm_max_ms` (with the layer), `tp` and, when TP collectives overlapped
/// their GEMMs, `tp_overlap` end each row; with the GPU memory counted (`--memory`),
/// `gpu_mem_bytes`, `hbm_bytes`, `fits` and the setting it was counted under (`zero`, `dp`,
/// `pp`) after them, `shard_dp` under hybrid sharding and `vp` under an interleaved
/// pipeline; under ZeRO 3, `zero3_comm_ms`
/// and `zero3_exposed_ms` last.
pub fn compare_csv(rows: &[CompareRow]) -> String {
    let layer = has_layer(rows);
    let tp = has_tp(rows);
    let tp_col = rows.iter().any(|r| r.tp > 1);
    let overlap = |r: &CompareRow| {
        r.mean
            .as_ref()
            .and_then(|m| m.layer.as_ref())
            .is_some_and(|l| l.tp_overlap)
    };
    let overlap_col = rows.iter().any(overlap);
    let mut s = String::from(
        "scheme,batches,attention_time_ms,attention_time_ms_p95,speedup,mfu,compute_imbalance,comm_imbalance,max_over_mean,comm_bytes_total,mem_max_bytes,lower_bound_ms,vs_lower_bound,comm_saving,error",
    );
    if layer {
        s.push(',');
        s.push_str(&LAYER_CSV_COLUMNS.join(","));
    }
    if tp {
        s.push_str(",tp_comm_max_ms");
    }
    if tp_col {
        s.push_str(",tp");
    }
    if overlap_col {
        s.push_str(",tp_overlap");
    }
    let mem = has_footprint(rows);
    if mem {
        s.push_str(",gpu_mem_bytes,hbm_bytes,fits,zero,dp,pp");
    }
    // Under hybrid sharding, the replicas a shard group spans.
    let shard = rows
        .iter()
        .any(|r| footprint(r).is_some_and(|f| f.training.shard_dp.is_some()));
    if shard {
        s.push_str(",shard_dp");
    }
    // Under an interleaved pipeline, the chunks a stage holds.
    let vp = rows
        .iter()
        .any(|r| footprint(r).is_some_and(|f| f.training.vp > 1));
    if vp {
        s.push_str(",vp");
    }
    let z3 = rows.iter().any(|r| zero3(r).is_some());
    if z3 {
        s.push_str(",zero3_comm_ms,zero3_exposed_ms");
    }
    let stepped = rows.iter().any(|r| r.priced.figures().is_some());
    if stepped {
        s.push_str(",micro_batches,step_ms,tokens_per_gpu_s");
    }
    // Several steps priced (`fcp compare --steps`): `step_ms` is their mean.
    let multi = rows.iter().any(|r| r.priced.over_steps.is_some());
    if multi {
        s.push_str(",steps,max_step_ms,slowest_step");
    }
    s.push('\n');
    for r in rows {
        let q = |t: &str| format!("\"{}\"", t.replace('"', "\"\""));
        match (&r.mean, &r.p95) {
            (Some(m), Some(p)) => s.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},",
                q(&r.scheme),
                r.batches,
                m.attention_time_ms,
                p.attention_time_ms,
                r.speedup.map_or(String::new(), |x| x.to_string()),
                m.mfu,
                m.compute_imbalance,
                m.comm_imbalance,
                m.max_over_mean,
                m.comm_bytes_total,
                m.mem_max_bytes,
                m.lower_bound_ms,
                m.vs_lower_bound,
                r.comm_saving.map_or(String::new(), |x| x.to_string())
            )),
            _ => s.push_str(&format!(
                "{},0,,,,,,,,,,,,,{}",
                q(&r.scheme),
                q(r.error.as_deref().unwrap_or(""))
            )),
        }
        if layer {
            let l = r.mean.as_ref().and_then(|m| m.layer.as_ref());
            let cells: Vec<String> = match l {
                Some(l) => vec![
                    l.layer_time_ms.to_string(),
                    r.layer_speedup.map_or(String::new(), |x| x.to_string()),
                    l.linear_mean_ms.to_string(),
                    l.linear_max_ms.to_string(),
                    l.token_imbalance.to_string(),
                    l.layer_lower_bound_ms.to_string(),
                    l.layer_vs_lower_bound.to_string(),
                    l.layer_mfu.to_string(),
                    l.act_max_bytes.to_string(),
                ],
                None => vec![String::new(); LAYER_CSV_COLUMNS.len()],
            };
            s.push(',');
            s.push_str(&cells.join(","));
        }
        if tp {
            let t = r.mean.as_ref().and_then(|m| m.layer.as_ref());
            let t = t.and_then(|l| l.tp_comm_max_ms);
            s.push_str(&format!(",{}", t.map_or(String::new(), |t| t.to_string())));
        }
        if tp_col {
            s.push_str(&format!(",{}", r.tp));
        }
        if overlap_col {
            s.push_str(&format!(",{}", overlap(r)));
        }
        if mem {
            let f = footprint(r);
            let cell = |v: Option<String>| v.unwrap_or_default();
            s.push_str(&format!(
                ",{},{},{},{},{},{}",
                cell(f.map(|f| f.total_bytes.to_string())),
                cell(f.and_then(|f| f.hbm_bytes).map(|h| h.to_string())),
                cell(f.and_then(|f| f.fits).map(|x| x.to_string())),
                cell(f.map(|f| f.training.zero.to_string())),
                cell(f.map(|f| f.training.dp.to_string())),
                cell(f.map(|f| f.training.pp.to_string()))
            ));
        }
        if shard {
            let f = footprint(r);
            s.push_str(&format!(
                ",{}",
                f.map_or(String::new(), |f| f.training.shard_replicas().to_string())
            ));
        }
        if vp {
            let f = footprint(r);
            s.push_str(&format!(
                ",{}",
                f.map_or(String::new(), |f| f.training.vp.to_string())
            ));
        }
        if z3 {
            let z = zero3(r);
            s.push_str(&format!(
                ",{},{}",
                z.map_or(String::new(), |z| z.0.to_string()),
                z.map_or(String::new(), |z| z.1.to_string())
            ));
        }
        if stepped {
            s.push_str(&match (r.priced.first(), r.priced.figures()) {
                (Some(one), Some(x)) => format!(
                    ",{},{},{}",
                    one.micro_batches, x.mean_step_ms, x.tokens_per_gpu_s
                ),
                _ => ",,,".to_string(),
            });
        }
        if multi {
            s.push_str(&match r.priced.over_steps {
                Some(x) => format!(",{},{},{}", x.steps, x.max_step_ms, x.slowest_step),
                None => ",,,".to_string(),
            });
        }
        s.push('\n');
    }
    s
}

/// A throughput to three significant figures at least: whole tokens when there are many
/// (bug hunt: a tiny window's 0.4 tokens/s read "0").
pub fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}")
    }
}

/// Columns [`compare_csv`] adds when the whole layer was simulated.
pub const LAYER_CSV_COLUMNS: &[&str] = &[
    "layer_time_ms",
    "layer_speedup",
    "linear_mean_ms",
    "linear_max_ms",
    "token_imbalance",
    "layer_lower_bound_ms",
    "layer_vs_lower_bound",
    "layer_mfu",
    "act_max_bytes",
];

#[cfg(test)]
mod tests {
    use super::tenths;

    #[test]
    fn tenths_keep_small_rates_readable() {
        assert_eq!(tenths(558.04), "558.0");
        assert_eq!(tenths(0.05), "0.1");
        assert_eq!(tenths(0.0), "0.0");
        assert_eq!(tenths(0.000173532), "1.74e-4");
        assert_eq!(tenths(-0.01), "-1.00e-2");
    }

    use super::*;

    /// Regression (user report): `fcp regress` printed a tolerance of 1e308 as 309 digits.
    #[test]
    fn long_values_are_shown_compactly_and_short_ones_as_before() {
        assert_eq!(shown_when_long(1e308), "1e308");
        assert_eq!(shown_when_long(1e-30), "1e-30");
        for (v, s) in [
            (0.03, "0.03"),
            (1e-5, "0.00001"),
            (1e9, "1000000000"),
            (0.0, "0"),
        ] {
            assert_eq!(shown_when_long(v), s);
        }
        assert_eq!(shown_when_long(f64::NAN), "NaN");
    }
}
