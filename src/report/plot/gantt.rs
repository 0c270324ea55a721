//! Per-rank Gantt chart of one simulated plan.
//!
//! Each rank is a row with three lanes: sends on top, the compute stream in the middle,
//! receives at the bottom. On the compute lane, kernels are solid; **waiting** (the stream had
//! work left but its data had not arrived) is light red while one of the rank's messages is
//! moving (exposed communication) and yellow while none is (it waits for a peer still
//! computing: imbalance, see [`crate::sim::waits`]); **idle** (the rank was done while slower
//! ranks still ran) is grey. Training shows the forward pass, then the backward pass after a
//! dashed line. A whole-layer run (`fcp plot gantt --layer`) also draws each rank's
//! projections and MLP on its compute lane, in purple; the legend lists them only then.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::sim::waits::{split_waits, union};
use crate::sim::{PassOutcome, RankTimeline};

use super::{caption_size, draw_err, render, PlotError, FAMILY};

/// What to write on the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct GanttOptions {
    /// Caption.
    pub title: String,
    /// Names of the passes in `outcomes` (`fwd`, `bwd`).
    pub pass_names: Vec<String>,
    /// The token-linear bars hold TP collectives too (a whole layer under `--tp`): the legend
    /// says so.
    pub tp: bool,
}

const COMPUTE: RGBColor = RGBColor(31, 119, 180);
const SEND: RGBColor = RGBColor(255, 127, 14);
const RECV: RGBColor = RGBColor(44, 160, 44);
const WAIT: RGBColor = RGBColor(244, 160, 160);
const IDLE: RGBColor = RGBColor(200, 200, 200);
const PEERS: RGBColor = RGBColor(240, 215, 110);
const LINEAR: RGBColor = RGBColor(148, 103, 189);

/// Bars `(start_ms, end_ms, row)`.
type Bar = (f64, f64, f64);

struct Bars {
    compute: Vec<(f64, f64, f64)>,
    linear: Vec<(f64, f64, f64)>,
    send: Vec<(f64, f64, f64)>,
    recv: Vec<(f64, f64, f64)>,
    wait: Vec<(f64, f64, f64)>,
    peers: Vec<(f64, f64, f64)>,
    idle: Vec<(f64, f64, f64)>,
}

/// Draw the passes' timelines to `path` (`.png` or `.svg`).
pub fn gantt(path: &Path, outcomes: &[PassOutcome], opts: &GanttOptions) -> Result<(), PlotError> {
    let n = outcomes.first().map_or(0, |o| o.timeline.len());
    if n == 0 {
        return Err(PlotError::Empty("the plan has no rank".into()));
    }
    let ms = |ns: u64| ns as f64 * 1e-6;
    let mut bars = Bars {
        compute: vec![],
        linear: vec![],
        send: vec![],
        recv: vec![],
        wait: vec![],
        peers: vec![],
        idle: vec![],
    };
    let mut offset = 0u64;
    let mut boundaries = Vec::new();
    for o in outcomes {
        for (r, tl) in o.timeline.iter().enumerate() {
            let RankTimeline {
                compute,
                send,
                recv,
                linear,
            } = tl;
            // Row centre: rank 0 on top.
            let y = (n - 1 - r) as f64;
            let finish = o.ranks[r].finish_ns;
            for (a, b) in union(compute.clone()) {
                bars.compute.push((ms(offset + a), ms(offset + b), y));
            }
            for &(a, b) in linear {
                bars.linear.push((ms(offset + a), ms(offset + b), y));
            }
            let (in_flight, on_peers) = split_waits(tl, finish);
            for (a, b) in in_flight {
                bars.wait.push((ms(offset + a), ms(offset + b), y));
            }
            for (a, b) in on_peers {
                bars.peers.push((ms(offset + a), ms(offset + b), y));
            }
            if o.end_ns > finish {
                bars.idle
                    .push((ms(offset + finish), ms(offset + o.end_ns), y));
            }
            for (a, b) in union(send.clone()) {
                bars.send.push((ms(offset + a), ms(offset + b), y));
            }
            for (a, b) in union(recv.clone()) {
                bars.recv.push((ms(offset + a), ms(offset + b), y));
            }
        }
        offset += o.end_ns;
        boundaries.push(ms(offset));
    }
    let total = ms(offset).max(1e-6);
    let height = (160 + 34 * n as u32).clamp(420, 1800);
    render!(path, (1200, height), |root| draw(
        root,
        &bars,
        n,
        total,
        &boundaries,
        opts
    ))
}

/// Pixels kept right of the chart for the legend (its longest label is about 270 px).
const LEGEND_WIDTH: i32 = 300;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    bars: &Bars,
    n: usize,
    total: f64,
    boundaries: &[f64],
    opts: &GanttOptions,
) -> Result<(), PlotError> {
    // The legend has its own strip on the right, so it never hides a bar and the time axis
    // ends where the last pass ends (it used to run on 45% past it to make room).
    // The title spans the legend's strip too (over the plot alone a long one lost both ends).
    let width = root.dim_in_pixel().0;
    let size = caption_size(root, &opts.title, 24, width.saturating_sub(32));
    let body = root
        .titled(&opts.title, (FAMILY, f64::from(size)))
        .map_err(draw_err)?;
    let (plot, legend) = body.split_horizontally(width as i32 - LEGEND_WIDTH);
    let mut ch = ChartBuilder::on(&plot)
        .margin(16)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..total, -0.5f64..(n as f64 - 0.5))
        .map_err(draw_err)?;
    // Enough decimals for ticks about a tenth of the span apart (bug hunt: a 0.01 ms plan's
    // ticks all read 0.0).
    // One decimal from 1 ms up, more below.
    let decimals = super::tick_decimals(total, 1);
    let rank_fmt = |v: &f64| {
        let k = v.round();
        if (v - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < n {
            format!("rank {}", n - 1 - k as usize)
        } else {
            String::new()
        }
    };
    ch.configure_mesh()
        .x_desc("time (ms)")
        .y_desc("")
        .y_labels(n.min(32) + 1)
        .y_label_formatter(&rank_fmt)
        .x_label_formatter(&|v| format!("{v:.decimals$}"))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 18))
        .disable_y_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(draw_err)?;
    // Lanes inside a row of height 1 centred on y: send on top, compute mid, receive bottom.
    let lanes: [(&str, &Vec<Bar>, RGBColor, f64, f64); 7] = [
        (
            "idle (done, others still running)",
            &bars.idle,
            IDLE,
            -0.28,
            0.28,
        ),
        (
            "exposed comm (a transfer in flight)",
            &bars.wait,
            WAIT,
            -0.28,
            0.28,
        ),
        (
            "waiting on a peer (nothing in flight)",
            &bars.peers,
            PEERS,
            -0.28,
            0.28,
        ),
        (
            "compute (attention kernels)",
            &bars.compute,
            COMPUTE,
            -0.28,
            0.28,
        ),
        (
            if opts.tp {
                "projections + MLP + TP collectives"
            } else {
                "projections + MLP (token-linear)"
            },
            &bars.linear,
            LINEAR,
            -0.28,
            0.28,
        ),
        ("send", &bars.send, SEND, 0.31, 0.45),
        ("receive", &bars.recv, RECV, -0.45, -0.31),
    ];
    // Only whole-layer charts list the token-linear work.
    let lanes = lanes
        .into_iter()
        .filter(|l| !(l.2 == LINEAR && l.1.is_empty()));
    for (i, (label, items, color, lo, hi)) in lanes.enumerate() {
        ch.draw_series(
            items
                .iter()
                .map(move |&(a, b, y)| Rectangle::new([(a, y + lo), (b, y + hi)], color.filled())),
        )
        .map_err(draw_err)?;
        let y = 70 + 26 * i as i32;
        legend
            .draw(&Rectangle::new([(4, y - 6), (22, y + 6)], color.filled()))
            .map_err(draw_err)?;
        legend
            .draw(&Text::new(
                label,
                (30, y),
                TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(draw_err)?;
    }
    let names = &opts.pass_names;
    for (i, &t) in boundaries.iter().enumerate() {
        if i + 1 < boundaries.len() {
            ch.draw_series(DashedLineSeries::new(
                vec![(t, -0.5), (t, n as f64 - 0.5)],
                8,
                5,
                BLACK.stroke_width(2),
            ))
            .map_err(draw_err)?;
        }
        let start = if i == 0 { 0.0 } else { boundaries[i - 1] };
        if let Some(name) = names.get(i) {
            ch.draw_series(std::iter::once(Text::new(
                format!("{name} pass"),
                (start + (t - start) * 0.02, n as f64 - 0.5),
                (FAMILY, 16),
            )))
            .map_err(draw_err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::report::plot::tick_decimals;

    /// Regression (bug hunt): a plan of 0.01 ms labelled every tick 0.0.
    #[test]
    fn regression_short_timelines_get_ticks_that_differ() {
        for (span, want) in [
            (0.01, 3),
            (0.5, 2),
            (1.0, 1),
            (250.0, 1),
            (1e-9, 6),
            (0.0, 1),
        ] {
            assert_eq!(tick_decimals(span, 1), want, "{span}");
        }
        // Ticks a tenth of the span apart read differently at that many decimals.
        for span in [0.013, 0.2, 3.7, 0.0009] {
            let d = tick_decimals(span, 1);
            let (a, b) = (format!("{:.d$}", span * 0.3), format!("{:.d$}", span * 0.4));
            assert_ne!(a, b, "{span}");
        }
    }
}
