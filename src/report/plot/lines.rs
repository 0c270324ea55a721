//! Line charts: a metric against one axis, one line (with markers) per series.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::study::{CellKey, CellResult};

use super::{caption_size, draw_err, render, tokens_label, PlotError, COLORS, FAMILY};

/// How y values are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YFormat {
    /// Plain numbers.
    Plain,
    /// Fractions shown as percentages.
    Percent,
    /// A multiple (`1.5×`).
    Times,
    /// Bytes, in binary units (`1.50 GiB`).
    Bytes,
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points, in any order: the line joins them in order of x.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Caption.
    pub title: String,
    /// X axis description (with unit).
    pub x_label: String,
    /// Y axis description (with unit).
    pub y_label: String,
    /// Log₂ x axis, ticks at the data's x values (ranks, block sizes, context lengths).
    pub x_log2: bool,
    /// Print x ticks as token counts (4K, 128K).
    pub x_tokens: bool,
    /// Y tick format.
    pub y_format: YFormat,
    /// Start the y axis at zero.
    pub y_from_zero: bool,
    /// Draw a marker at every point (off for dense curves such as CDFs).
    pub markers: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// Draw `chart` to `path` (`.png` or `.svg`).
pub fn line_chart(path: &Path, chart: &LineChart) -> Result<(), PlotError> {
    if chart.series.iter().all(|s| s.points.is_empty()) {
        return Err(PlotError::Empty(chart.title.clone()));
    }
    render!(path, (1100, 650), |root| draw(root, chart))
}

/// The colour of line `i` and whether it is dashed (with triangle markers): the palette's
/// ten colours solid, then the same ten dashed. All twelve schemes on one chart used to draw
/// the eleventh and twelfth in the first two lines' colour and style.
fn line_style(i: usize) -> (RGBColor, bool) {
    (COLORS[i % COLORS.len()], (i / COLORS.len()) % 2 == 1)
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &LineChart) -> Result<(), PlotError> {
    // The distinct x values of the data (ranks 16, 32, ... are what was run).
    let mut xs: Vec<f64> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    // A small grid on a log axis is drawn evenly spaced, one tick per value that ran (its
    // index is its position): ranks and block sizes are powers of two, so this is the log
    // scale, and 64K/96K/128K contexts still get one labelled tick each. Dense data (CDFs)
    // get a true log₂ axis.
    let categorical = c.x_log2 && xs.len() <= 16;
    let tx = |x: f64| {
        if categorical {
            xs.iter().position(|&v| v == x).unwrap_or(0) as f64
        } else if c.x_log2 {
            x.max(1e-9).log2()
        } else {
            x
        }
    };
    let pts = c.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if c.y_from_zero {
        y0 = y0.min(0.0);
    }
    let xpad = ((x1 - x0) * 0.05).max(0.25);
    let ypad = ((y1 - y0) * 0.08).max(if y1.abs() > 0.0 {
        y1.abs() * 0.05
    } else {
        0.05
    });
    let (ylo, yhi) = (
        if c.y_from_zero && y0 >= 0.0 {
            0.0
        } else {
            y0 - ypad
        },
        y1 + ypad,
    );
    let x_ticks = if categorical {
        // Integer ticks only (plotters picks a step of 1 for this many labels).
        xs.len() + 1
    } else {
        12
    };
    let size = caption_size(root, &c.title, 26, root.dim_in_pixel().0.saturating_sub(36));
    let mut ch = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, f64::from(size)))
        .margin(18)
        .x_label_area_size(60)
        .y_label_area_size(90)
        .build_cartesian_2d((x0 - xpad)..(x1 + xpad), ylo..yhi)
        .map_err(draw_err)?;
    let x_fmt = |v: &f64| {
        let x = if categorical {
            let k = v.round();
            if (v - k).abs() > 1e-6 || k < 0.0 || k as usize >= xs.len() {
                return String::new();
            }
            xs[k as usize]
        } else if c.x_log2 {
            2f64.powf(*v)
        } else {
            *v
        };
        if c.x_tokens {
            tokens_label(x)
        } else if x.fract().abs() < 1e-9 {
            format!("{}", x.round())
        } else {
            format!("{x:.2}")
        }
    };
    let y_fmt = |v: &f64| y_label(c.y_format, *v, yhi - ylo);
    let mut mesh = ch.configure_mesh();
    mesh.x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style((FAMILY, 17))
        .axis_desc_style((FAMILY, 20))
        .light_line_style(RGBColor(235, 235, 235));
    if c.x_log2 {
        mesh.x_labels(x_ticks);
    }
    mesh.draw().map_err(draw_err)?;
    for (i, s) in c.series.iter().enumerate() {
        let (color, dashed) = line_style(i);
        let stroke = color.stroke_width(3);
        // Joined in order of x, whatever order the caller listed them in (a DP×CP config
        // may list its CP sizes in any order: the line used to zig-zag between them).
        let mut pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (tx(x), y)).collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let drawn = if dashed {
            ch.draw_series(DashedLineSeries::new(pts.clone(), 12, 7, stroke))
        } else {
            ch.draw_series(LineSeries::new(pts.clone(), stroke))
        };
        drawn
            .map_err(draw_err)?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                if dashed {
                    PathElement::new(vec![(x, y), (x + 9, y)], stroke)
                } else {
                    PathElement::new(vec![(x, y), (x + 24, y)], stroke)
                }
            });
        if c.markers {
            if dashed {
                ch.draw_series(
                    pts.iter()
                        .map(|&p| TriangleMarker::new(p, 7, color.filled())),
                )
                .map_err(draw_err)?;
            } else {
                ch.draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled())))
                    .map_err(draw_err)?;
            }
        }
    }
    // The legend goes to the corner with the fewest points under it.
    let corners = [
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let (xr, yr) = ((x1 + xpad) - (x0 - xpad), yhi - ylo);
    let crowd = |right: bool, top: bool| {
        c.series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|&&(x, y)| {
                let fx = (tx(x) - (x0 - xpad)) / xr;
                let fy = (y - ylo) / yr;
                (if right { fx > 0.55 } else { fx < 0.45 })
                    && (if top { fy > 0.6 } else { fy < 0.4 })
            })
            .count()
    };
    let pos = corners
        .into_iter()
        .min_by_key(|&(_, right, top)| crowd(right, top))
        .map_or(SeriesLabelPosition::UpperLeft, |c| c.0);
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FAMILY, 17))
        .position(pos)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// A y tick label on an axis spanning `span`: as many decimals as ticks a tenth of it apart
/// need to read differently, and never `-0` (bug hunt: imbalances of 0.01–1.3 % were labelled
/// `0% 0% 0% 1% 1% 1% 1%`, token imbalances of 10⁻⁴ `-0.00 0.00 0.00`).
fn y_label(format: YFormat, v: f64, span: f64) -> String {
    let fixed = |v: f64, span: f64| {
        let d = super::tick_decimals(span, 0);
        let s = format!("{v:.d$}");
        match s.strip_prefix('-') {
            Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest.to_string(),
            _ => s,
        }
    };
    match format {
        YFormat::Plain => fixed(v, span),
        YFormat::Percent => format!("{}%", fixed(v * 100.0, span * 100.0)),
        YFormat::Times => format!("{}×", fixed(v, span)),
        YFormat::Bytes => crate::report::human_bytes(v.max(0.0).round() as u64),
    }
}

/// The axis of sweep results a chart puts on x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepAxis {
    /// CP group size.
    Ranks,
    /// Block size (the scheme's `block=` is dropped from the series name).
    Block,
    /// Tokens per rank.
    TokensPerRank,
    /// Context window.
    Context,
}

impl SweepAxis {
    fn value(self, k: &CellKey) -> Option<f64> {
        match self {
            SweepAxis::Ranks => Some(f64::from(k.ranks)),
            SweepAxis::Block => k.block.map(|b| b as f64),
            SweepAxis::TokensPerRank => Some(k.tokens_per_rank as f64),
            SweepAxis::Context => k.context.map(|c| c as f64),
        }
    }

    /// The axis as `plot lines --x` spells it (`tokens-per-rank`), for messages.
    pub fn flag(self) -> &'static str {
        match self {
            SweepAxis::Ranks => "ranks",
            SweepAxis::Block => "block",
            SweepAxis::TokensPerRank => "tokens-per-rank",
            SweepAxis::Context => "context",
        }
    }

    /// Axis description with its unit.
    pub fn label(self) -> &'static str {
        match self {
            SweepAxis::Ranks => "GPUs in the CP group (ranks)",
            SweepAxis::Block => "block size (tokens)",
            SweepAxis::TokensPerRank => "tokens per GPU",
            SweepAxis::Context => "context window (tokens)",
        }
    }
}

/// The scheme entry without a `block=` parameter.
fn scheme_sans_block(s: &str) -> String {
    let Some((name, params)) = s.split_once(':') else {
        return s.to_string();
    };
    let kept: Vec<&str> = params
        .split(',')
        .filter(|kv| !kv.trim_start().starts_with("block="))
        .collect();
    if kept.is_empty() {
        name.to_string()
    } else {
        format!("{name}:{}", kept.join(","))
    }
}

/// Lines from sweep rows: x from `axis`, y from `value(row)`; one line per combination of
/// the key fields that vary across the rows (besides x), named by them — usually the scheme.
/// Rows with errors or without a value are skipped.
pub fn sweep_chart(
    rows: &[CellResult],
    axis: SweepAxis,
    value: &dyn Fn(&CellResult) -> Option<f64>,
) -> Vec<Series> {
    let ok: Vec<&CellResult> = rows.iter().filter(|r| r.error.is_none()).collect();
    // In window packing without a tokens-per-rank axis, each cell's tokens per rank is its
    // window over its ranks: it follows the x axis (ranks or context) and names no line of
    // its own. (It used to, and a chart against ranks drew one single-point line per cell.)
    let derived_tpr = ok.iter().all(|r| {
        r.key
            .context
            .is_some_and(|c| c.div_ceil(u64::from(r.key.ranks)) == r.key.tokens_per_rank)
    });
    let fields = |k: &CellKey| -> Vec<String> {
        let scheme = if axis == SweepAxis::Block {
            scheme_sans_block(&k.scheme)
        } else {
            k.scheme.clone()
        };
        let mut f = vec![k.trace.clone(), scheme];
        if axis != SweepAxis::Ranks {
            f.push(format!("{} ranks", k.ranks));
        }
        if axis != SweepAxis::TokensPerRank && !derived_tpr {
            f.push(format!(
                "{} tok/GPU",
                tokens_label(k.tokens_per_rank as f64)
            ));
        }
        if axis != SweepAxis::Context {
            f.push(
                k.context
                    .map(|c| format!("ctx {}", tokens_label(c as f64)))
                    .unwrap_or_default(),
            );
        }
        f.push(k.hardware.clone());
        f.push(k.model.clone());
        f
    };
    let all: Vec<Vec<String>> = ok.iter().map(|r| fields(&r.key)).collect();
    // Which fields vary? Those make the legend; the scheme always does.
    let n = all.first().map_or(0, Vec::len);
    let varies: Vec<bool> = (0..n)
        .map(|i| i == 1 || all.iter().any(|f| f[i] != all[0][i]))
        .collect();
    let mut series: Vec<Series> = Vec::new();
    for (r, f) in ok.iter().zip(&all) {
        let label = f
            .iter()
            .zip(&varies)
            .filter(|(s, v)| **v && !s.is_empty())
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>()
            .join(" · ");
        let (Some(x), Some(y)) = (axis.value(&r.key), value(r)) else {
            continue;
        };
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push((x, y)),
            None => series.push(Series {
                label,
                points: vec![(x, y)],
            }),
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (bug hunt): small imbalances labelled every other tick alike, and `-0.00`.
    #[test]
    fn regression_y_ticks_of_small_values_read_differently() {
        for (format, lo, hi) in [
            (YFormat::Percent, 0.0001, 0.013),
            (YFormat::Percent, 0.0, 0.05),
            (YFormat::Plain, -0.00002, 0.0003),
            (YFormat::Times, 1.0, 1.02),
            (YFormat::Plain, 100.0, 400.0),
        ] {
            let span = hi - lo;
            let labels: Vec<String> = (0..=10)
                .map(|k| y_label(format, lo + span * f64::from(k) / 10.0, span))
                .collect();
            for w in labels.windows(2) {
                assert_ne!(w[0], w[1], "{labels:?}");
            }
            let negative_zero = |l: &String| {
                l.starts_with('-') && l[1..].trim_end_matches(['%', '×']).parse::<f64>() == Ok(0.0)
            };
            assert!(!labels.iter().any(negative_zero), "{labels:?}");
        }
        assert_eq!(y_label(YFormat::Plain, -0.00001, 0.01), "0.000");
        assert_eq!(y_label(YFormat::Plain, 250.0, 300.0), "250");
        assert_eq!(y_label(YFormat::Percent, 0.25, 0.3), "25%");
    }

    #[test]
    fn block_is_dropped_from_names() {
        assert_eq!(scheme_sans_block("fcp:block=4096"), "fcp");
        assert_eq!(
            scheme_sans_block("fcp:coalesce=8,block=4096"),
            "fcp:coalesce=8"
        );
        assert_eq!(scheme_sans_block("ring"), "ring");
    }

    fn cell(scheme: &str, ranks: u32, tpr: u64, context: Option<u64>) -> CellResult {
        let mut metrics = std::collections::BTreeMap::new();
        let v = f64::from(ranks);
        metrics.insert(
            "mfu".to_string(),
            crate::study::Agg {
                mean: v,
                p50: v,
                p95: v,
                max: v,
            },
        );
        CellResult {
            key: CellKey {
                trace: "t".into(),
                scheme: scheme.into(),
                ranks,
                tokens_per_rank: tpr,
                block: None,
                context,
                hardware: "h100".into(),
                model: "llama3-70b".into(),
            },
            settings: String::new(),
            batches: 1,
            error: None,
            metrics,
        }
    }

    /// Regression (bug hunt): in window packing, a chart against ranks drew one single-point
    /// line per cell, each named by its derived tokens per rank.
    #[test]
    fn a_window_sweep_against_ranks_draws_one_line_per_scheme() {
        let rows: Vec<CellResult> = ["ring", "fcp"]
            .iter()
            .flat_map(|s| [2, 4, 8].map(|r| cell(s, r, 32768 / u64::from(r), Some(32768))))
            .collect();
        let series = sweep_chart(&rows, SweepAxis::Ranks, &|r| r.mean("mfu"));
        let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["ring", "fcp"]);
        assert!(series.iter().all(|s| s.points.len() == 3));
        // A tokens-per-rank axis of its own still names lines.
        let rows: Vec<CellResult> = [4096, 8192]
            .iter()
            .flat_map(|&t| [2, 4].map(|r| cell("ring", r, t, Some(32768))))
            .collect();
        let series = sweep_chart(&rows, SweepAxis::Ranks, &|r| r.mean("mfu"));
        assert_eq!(series.len(), 2, "{series:?}");
    }

    /// Regression (bug hunt): the DP×CP chart joined its points in the config's CP order
    /// (`cp = [8, 1, 16, 2, 4]` zig-zagged); every line is now drawn in order of x.
    #[test]
    fn lines_join_their_points_in_order_of_x() {
        let dir = tempfile::tempdir().unwrap();
        let chart = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_log2: false,
            x_tokens: false,
            y_format: YFormat::Plain,
            y_from_zero: false,
            markers: false,
            series: vec![Series {
                label: "a".into(),
                points: vec![(8.0, 1.0), (1.0, 2.0), (16.0, 3.0), (2.0, 4.0), (4.0, 5.0)],
            }],
        };
        let p = dir.path().join("a.svg");
        line_chart(&p, &chart).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let line = svg
            .lines()
            .find(|l| l.contains("<polyline") && l.contains("stroke-width=\"3\""))
            .expect("the series' polyline");
        let xs: Vec<f64> = line
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .split_whitespace()
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(xs.len(), 5, "{line}");
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{line}");
    }

    /// Regression (bug hunt): with all twelve schemes on one chart the eleventh and twelfth
    /// lines looked exactly like the first two.
    #[test]
    fn twenty_lines_are_told_apart() {
        let styles: Vec<_> = (0..20).map(line_style).collect();
        for (i, a) in styles.iter().enumerate() {
            for b in &styles[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn writes_png_and_svg() {
        let dir = tempfile::tempdir().unwrap();
        let chart = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_log2: true,
            x_tokens: false,
            y_format: YFormat::Percent,
            y_from_zero: true,
            markers: true,
            series: vec![Series {
                label: "a".into(),
                points: vec![(16.0, 0.1), (32.0, 0.2)],
            }],
        };
        for f in ["a.png", "a.svg"] {
            let p = dir.path().join(f);
            line_chart(&p, &chart).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            assert!(bytes.len() > 1000, "{f}");
        }
        assert!(std::fs::read(dir.path().join("a.png"))
            .unwrap()
            .starts_with(b"\x89PNG"));
    }
}
