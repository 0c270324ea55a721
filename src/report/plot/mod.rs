//! Plots (plotters), as PNG or SVG by the output file's extension.
//!
//! * [`line_chart`] — any metric against an axis, one line per series: imbalance vs ranks (FCP
//!   Fig. 9), attention MFU weak scaling (Fig. 11), block size sensitivity (Fig. 12),
//!   speedups vs context (FlashCP Fig. 7), the DP×CP straggler curves. [`sweep_chart`] builds
//!   one from sweep results.
//! * [`gantt`] — per-rank timeline of one simulated plan: compute, send, receive, waiting, idle.
//! * [`length_cdf`] — a trace's length CDF with the cumulative share of tokens and of Σlen²
//!   (FCP Fig. 2 style).
//!
//! Text is rasterised with the bundled DejaVu Sans (`assets/fonts/`, Bitstream Vera licence),
//! so PNGs need no system font; SVGs carry text as text. Files are rendered in memory and
//! written atomically.

mod cdf;
mod gantt;
mod lines;

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::{DrawingArea, DrawingBackend};
use plotters::style::{register_font, FontStyle, RGBColor};

pub use cdf::{length_cdf, CdfPoint};
pub use gantt::{gantt, GanttOptions};
pub use lines::{line_chart, sweep_chart, LineChart, Series, SweepAxis, YFormat};

/// The bundled font (DejaVu Sans).
const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// The family every plot uses.
pub(crate) const FAMILY: &str = "sans-serif";

/// Errors drawing or writing a plot.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The output name has no `.png` or `.svg` extension.
    #[error("{0}: the plot file must end in .png or .svg")]
    Format(String),
    /// Nothing to draw.
    #[error("nothing to plot: {0}")]
    Empty(String),
    /// Drawing failed.
    #[error("drawing failed: {0}")]
    Draw(String),
    /// Writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
}

pub(crate) fn draw_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Output format, from the file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Raster, 8-bit RGB.
    Png,
    /// Vector.
    Svg,
}

impl Format {
    /// The format a path's extension names.
    pub fn of(path: &Path) -> Result<Format, PlotError> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("png") => Ok(Format::Png),
            Some("svg") => Ok(Format::Svg),
            _ => Err(PlotError::Format(path.display().to_string())),
        }
    }
}

fn ensure_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Draw("the bundled font did not load".into()))
    }
}

/// The font size of a caption of `title` no wider than `width` pixels: `size`, or smaller down
/// to 12 px (past which a very long `--title` is clipped). A default Gantt title under
/// `--layer --tp 2 --recompute full` ran past its plot area and lost the scheme's name at both
/// ends (bug hunt).
pub(crate) fn caption_size<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    size: u32,
    width: u32,
) -> u32 {
    (12..=size)
        .rev()
        .find(|&s| {
            area.estimate_text_size(title, &(FAMILY, f64::from(s)).into())
                .is_ok_and(|(w, _)| w <= width)
        })
        .unwrap_or(12)
}

/// Ten distinguishable colours (Tableau 10), picked in order.
pub(crate) const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Render with the backend the path's extension names and write the file atomically.
/// `$draw` is a closure over `&DrawingArea<_, Shift>`, expanded once per backend.
macro_rules! render {
    ($path:expr, $size:expr, $draw:expr) => {{
        use plotters::prelude::*;
        let path: &std::path::Path = $path;
        let (w, h): (u32, u32) = $size;
        $crate::report::plot::ensure_font_pub()?;
        let bytes: Vec<u8> = match $crate::report::plot::Format::of(path)? {
            $crate::report::plot::Format::Png => {
                let mut buf = vec![0u8; (w * h * 3) as usize];
                {
                    let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
                    root.fill(&WHITE).map_err($crate::report::plot::draw_err)?;
                    ($draw)(&root)?;
                    root.present().map_err($crate::report::plot::draw_err)?;
                }
                $crate::report::plot::encode_png(&buf, w, h)?
            }
            $crate::report::plot::Format::Svg => {
                let mut s = String::new();
                {
                    let root = SVGBackend::with_string(&mut s, (w, h)).into_drawing_area();
                    root.fill(&WHITE).map_err($crate::report::plot::draw_err)?;
                    ($draw)(&root)?;
                    root.present().map_err($crate::report::plot::draw_err)?;
                }
                s.into_bytes()
            }
        };
        $crate::output::write_atomic(path, &bytes).map_err(|e| {
            $crate::report::plot::PlotError::Io {
                path: path.display().to_string(),
                source: e,
            }
        })
    }};
}
pub(crate) use render;

#[doc(hidden)]
pub(crate) fn ensure_font_pub() -> Result<(), PlotError> {
    ensure_font()
}

pub(crate) fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, PlotError> {
    use image::ImageEncoder;
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(rgb, w, h, image::ColorType::Rgb8)
        .map_err(draw_err)?;
    Ok(out)
}

/// Decimals that tell apart axis ticks about a tenth of `span` apart (plotters' ticks are at
/// least that far apart), at least `min` and at most six.
pub(super) fn tick_decimals(span: f64, min: usize) -> usize {
    let step = span / 10.0;
    if !(step.is_finite() && step > 0.0) {
        return min;
    }
    ((-step.log10()).ceil().max(0.0) as usize).clamp(min, 6)
}

/// `1024 → "1K"`, `131072 → "128K"`, `1048576 → "1M"`: token counts as the papers write them.
pub fn tokens_label(v: f64) -> String {
    let v = v.round();
    if v >= 1048576.0 && (v % 1048576.0) == 0.0 {
        format!("{}M", v / 1048576.0)
    } else if v >= 1024.0 && (v % 1024.0) == 0.0 {
        format!("{}K", v / 1024.0)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (bug hunt): the default Gantt title under `--layer --tp 2 --recompute full`
    /// was wider than its 900-px plot area and lost both ends; the caption now shrinks to fit.
    #[test]
    fn regression_a_long_gantt_title_is_shrunk_to_fit() {
        use plotters::prelude::{IntoDrawingArea, SVGBackend};
        ensure_font().unwrap();
        let mut svg = String::new();
        let root = SVGBackend::with_string(&mut svg, (1200, 600)).into_drawing_area();
        let title = "fcp · 4 ranks · 11 docs · h100 / llama3-70b · TP 2 · attention 1.90 ms \
                     · layer 39.55 ms · recompute full";
        let width = |size: u32| {
            root.estimate_text_size(title, &(FAMILY, f64::from(size)).into())
                .unwrap()
                .0
        };
        assert!(width(24) > 868, "the title fits at 24 px: nothing to test");
        let size = caption_size(&root, title, 24, 868);
        assert!(
            size < 24 && width(size) <= 868,
            "{size}: {} px",
            width(size)
        );
        assert_eq!(caption_size(&root, "zigzag · 4 ranks", 24, 868), 24);
    }

    #[test]
    fn labels_and_formats() {
        assert_eq!(tokens_label(4096.0), "4K");
        assert_eq!(tokens_label(1048576.0), "1M");
        assert_eq!(tokens_label(1000.0), "1000");
        assert_eq!(Format::of(Path::new("a.PNG")).unwrap(), Format::Png);
        assert!(Format::of(Path::new("a.pdf")).is_err());
    }
}
