//! Attention-kernel throughput tables (`kernels-profile/*.csv`) and the lookup the cost model
//! uses: TFLOP/s for a tile shape, interpolated linearly in log2(length) between measured rows.
//!
//! Format and rules are documented in `docs/kernel-profile.md`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::bundled;
use super::HardwareError;
use crate::plan::Mask;

/// Forward or backward attention pass. Backward TFLOP/s in the tables count 2.5× the forward
/// FLOPs (FlashAttention convention), matching [`super::cost::tile_flops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// Forward.
    Fwd,
    /// Backward (dQ, dK, dV).
    Bwd,
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pass::Fwd => "fwd",
            Pass::Bwd => "bwd",
        })
    }
}

impl FromStr for Pass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fwd" => Ok(Pass::Fwd),
            "bwd" => Ok(Pass::Bwd),
            _ => Err(format!("unknown pass `{s}` (expected fwd or bwd)")),
        }
    }
}

/// What the length axis of a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LenKind {
    /// Per-sequence length (the batch was filled with several sequences of this length).
    Seq,
    /// Total tokens of one launch (batch 1, or one packed varlen batch of that many tokens).
    Total,
}

impl fmt::Display for LenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LenKind::Seq => "seq",
            LenKind::Total => "total",
        })
    }
}

/// One measured throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRow {
    /// Pass measured.
    pub pass: Pass,
    /// Mask measured.
    pub mask: Mask,
    /// Head dimension.
    pub head_dim: u32,
    /// Whether the kernel was the varlen (packed) variant.
    pub varlen: bool,
    /// What `q_len`/`kv_len` measure.
    pub len_kind: LenKind,
    /// Query length of the measured tile.
    pub q_len: u64,
    /// Key/value length of the measured tile.
    pub kv_len: u64,
    /// Measured TFLOP/s (allowed-pair FLOPs / time; bwd counts 2.5× fwd FLOPs).
    pub tflops: f64,
    /// Where the number comes from (paper figure, repo@commit path; "(chart)" if read off a plot).
    pub source: String,
}

impl KernelRow {
    /// The length the row is keyed by: the geometric mean `sqrt(q_len · kv_len)` (see
    /// [`KernelQuery::length`]).
    pub fn length(&self) -> f64 {
        (self.q_len as f64 * self.kv_len as f64).sqrt()
    }
}

/// A question to a kernel profile: how fast is this tile?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelQuery {
    /// Forward or backward.
    pub pass: Pass,
    /// Mask of the tile.
    pub mask: Mask,
    /// Head dimension.
    pub head_dim: u32,
    /// Query tokens of the tile (of the whole launch for varlen).
    pub q_len: u64,
    /// Key/value tokens of the tile (of the whole launch for varlen).
    pub kv_len: u64,
    /// Whether the tile runs as (part of) a varlen launch.
    pub varlen: bool,
}

impl KernelQuery {
    /// The length the query is matched at: the geometric mean `sqrt(q_len · kv_len)`.
    ///
    /// Why: a q × kv tile does q·kv units of work, the same as a square tile of side
    /// sqrt(q·kv). Throughput grows with both the number of query blocks (parallelism) and the
    /// kv loop length (amortised prologue/epilogue); the geometric mean weighs both equally and
    /// reduces to the measured length for the square tiles the published tables report.
    pub fn length(&self) -> f64 {
        (self.q_len as f64 * self.kv_len as f64).sqrt()
    }
}

/// Whether a lookup had to clamp to the table's ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Clamp {
    /// The length lies within the measured rows.
    None,
    /// Shorter than the shortest row: the shortest row's value is used, and a full-mask tile
    /// runs no faster than a causal one of twice its side ([`KernelProfile::lookup`] says why).
    BelowMin,
    /// Longer than the longest row: the longest row's value is used (throughput has
    /// plateaued); a causal tile is priced as cut into pieces of that row's side
    /// ([`KernelProfile::lookup`] says why).
    AboveMax,
}

/// The answer to a [`KernelQuery`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelLookup {
    /// Interpolated TFLOP/s as measured (all SMs).
    pub tflops: f64,
    /// The length the query was matched at (geometric mean of q and kv).
    pub length: f64,
    /// Whether the value was clamped to a table end.
    pub clamped: Clamp,
    /// True when the query asked for varlen (or non-varlen) but the profile only had the other
    /// kind for this pass/mask/head_dim, so those rows were used.
    pub varlen_fallback: bool,
    /// Human description of the row(s) used.
    pub used: String,
    /// Sources of the row(s) used.
    pub sources: Vec<String>,
}

/// A loaded kernel throughput table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelProfile {
    /// Profile name (bundled name or file stem).
    pub name: String,
    /// Rows in file order (read with [`KernelProfile::rows`]; private so that the index
    /// below always describes them).
    rows: Vec<KernelRow>,
    /// Per (pass, mask, head_dim, varlen) series, its rows' lengths and indices by length, built once
    /// when the profile is read: a lookup is a binary search, not scans of every row (they
    /// were 8% of `hybrid`'s quick search at 256 ranks, whose tiles come in thousands of
    /// distinct shapes). Validation keeps lengths unique within a series.
    #[serde(skip)]
    series: Vec<(SeriesKey, Vec<(f64, usize)>)>,
}

type SeriesKey = (Pass, Mask, u32, bool);

fn mask_key(m: Mask) -> u8 {
    match m {
        Mask::Causal => 0,
        Mask::Full => 1,
    }
}

impl KernelProfile {
    /// Load a bundled profile (`h100-fa3`, `h100-fa3-paper`, `b200-fa4`) or a CSV by path
    /// (anything containing `/` or ending in `.csv`).
    pub fn load(name_or_path: &str) -> Result<KernelProfile, HardwareError> {
        let src = bundled::resolve(
            name_or_path,
            bundled::KERNEL_PROFILES,
            "kernel profile",
            ".csv",
        )?;
        Self::from_csv_str(&src.name, &src.label, &src.text)
    }

    /// Parse and validate CSV text; `label` names it in errors.
    pub fn from_csv_str(
        name: &str,
        label: &str,
        text: &str,
    ) -> Result<KernelProfile, HardwareError> {
        let (rows, lines): (Vec<KernelRow>, Vec<u64>) = crate::input::csv_rows(text)
            .map_err(|message| HardwareError::Parse {
                file: label.to_string(),
                message,
            })?
            .into_iter()
            .unzip();
        let mut profile = KernelProfile {
            name: name.to_string(),
            rows,
            series: Vec::new(),
        };
        profile.validate(label, &lines)?;
        profile.series = index_series(&profile.rows);
        Ok(profile)
    }

    /// The profile with every throughput multiplied by `factor`: the table of a GPU whose peak
    /// is `factor` times the one it was measured on, its kernels as efficient
    /// ([`crate::Hardware::kernel_scale`], a what-if `peak_tflops`). Lengths, and so the index,
    /// are unchanged.
    pub fn scaled(mut self, factor: f64) -> KernelProfile {
        if factor != 1.0 {
            for r in &mut self.rows {
                r.tflops *= factor;
            }
        }
        self
    }

    /// The rows, in file order.
    pub fn rows(&self) -> &[KernelRow] {
        &self.rows
    }

    /// Check every row; `lines`: each row's line in the file, for the messages.
    fn validate(&self, label: &str, lines: &[u64]) -> Result<(), HardwareError> {
        let bad = |field: &str, message: String| HardwareError::Invalid {
            file: label.to_string(),
            field: field.to_string(),
            message,
        };
        if self.rows.is_empty() {
            return Err(bad("rows", "the profile has no data rows".into()));
        }
        let mut kinds: BTreeMap<(Pass, u8, u32, bool), LenKind> = BTreeMap::new();
        let mut seen: BTreeMap<(Pass, u8, u32, bool, u64), u64> = BTreeMap::new();
        for (r, &line) in self.rows.iter().zip(lines) {
            if r.head_dim == 0 {
                return Err(bad("head_dim", format!("line {line}: must be >= 1")));
            }
            if r.q_len == 0 || r.kv_len == 0 {
                return Err(bad("q_len/kv_len", format!("line {line}: must be >= 1")));
            }
            // 1 kFLOP/s to 1 EFLOP/s: a CPU calibration's tiny tiles sit well inside it (a
            // loaded CI machine measured a 4 × 4 tile at 1.7e-7, which the 1 MFLOP/s floor
            // this had refused; bug hunt), and a row of 1e-300 printed as 300 digits.
            if !(r.tflops.is_finite() && (1e-9..=1e6).contains(&r.tflops)) {
                return Err(bad(
                    "tflops",
                    format!(
                        "line {line}: must be within 1e-9..=1e6 TFLOP/s, got {}",
                        crate::report::shown(r.tflops)
                    ),
                ));
            }
            if r.source.trim().is_empty() {
                return Err(bad(
                    "source",
                    format!("line {line}: every row must cite a source"),
                ));
            }
            let key = (r.pass, mask_key(r.mask), r.head_dim, r.varlen);
            match kinds.get(&key) {
                Some(k) if *k != r.len_kind => {
                    return Err(bad(
                        "len_kind",
                        format!(
                            "line {line}: {} {} hd {} mixes len_kind {k} and {}; one series per pass/mask/head_dim/varlen",
                            r.pass, r.mask, r.head_dim, r.len_kind
                        ),
                    ))
                }
                _ => {
                    kinds.insert(key, r.len_kind);
                }
            }
            // Length key rounded to whole tokens: two rows at one length are ambiguous.
            let len_key = r.length().round() as u64;
            if let Some(prev) = seen.insert((key.0, key.1, key.2, key.3, len_key), line) {
                return Err(bad(
                    "q_len/kv_len",
                    format!("line {line}: same series and length as line {prev}"),
                ));
            }
        }
        Ok(())
    }

    /// The (pass, mask, head_dim, varlen) series present, for messages and listings.
    pub fn series(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.rows {
            let s = series_label(&(r.pass, r.mask, r.head_dim, r.varlen));
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }

    /// Find the row(s) a query is answered from, without building any string: the one
    /// interpolation rule shared by [`KernelProfile::lookup`] (which adds the description) and
    /// [`KernelProfile::tflops_for`] (the planners' and the simulator's hot path). A binary
    /// search in the query's series, no allocation.
    fn locate(&self, q: &KernelQuery) -> Result<Located<'_>, HardwareError> {
        if q.q_len == 0 || q.kv_len == 0 {
            return Err(HardwareError::InvalidQuery(format!(
                "tile {}x{} is empty; q_len and kv_len must be >= 1",
                q.q_len, q.kv_len
            )));
        }
        let find = |varlen: bool| {
            self.series
                .iter()
                .find(|(k, _)| *k == (q.pass, q.mask, q.head_dim, varlen))
                .map(|(_, rows)| rows)
        };
        // Varlen rows are preferred for a varlen query and non-varlen rows otherwise.
        let (rows, varlen_fallback) = match (find(q.varlen), find(!q.varlen)) {
            (Some(rows), _) => (rows, false),
            (None, Some(rows)) => (rows, true),
            (None, None) => {
                return Err(HardwareError::NoKernelRow {
                    profile: self.name.clone(),
                    pass: q.pass.to_string(),
                    mask: q.mask.to_string(),
                    head_dim: q.head_dim,
                    available: self.series().join(", "),
                })
            }
        };
        let len = q.length();
        let row = |i: usize| rows.get(i).map(|&(_, r)| &self.rows[r]);
        let split = rows.partition_point(|&(l, _)| l <= len);
        let (first, last) = (&self.rows[rows[0].1], &self.rows[rows[rows.len() - 1].1]);
        let at = at_length(
            len,
            first,
            last,
            split.checked_sub(1).and_then(row),
            row(split),
        );
        Ok(Located {
            at,
            len,
            varlen_fallback,
            first,
        })
    }

    /// TFLOP/s for a tile — the same value as [`KernelProfile::lookup`]`(q)?.tflops`, without
    /// the human description (no string is built, nothing is allocated on success). For the hot
    /// paths: FCP's f(B) weigher and the simulator's compute model call this per tile shape.
    pub fn tflops_for(&self, q: &KernelQuery) -> Result<f64, HardwareError> {
        let loc = self.locate(q)?;
        Ok(match self.full_below_cap(q, &loc) {
            Some(cap) => cap.tflops,
            None => match self.causal_above(q, &loc) {
                Some(cut) => cut.tflops,
                None => loc.tflops(),
            },
        })
    }

    /// A causal query above its series' longest row, priced as if cut into square pieces of
    /// that row's side where that is faster than the clamp (see [`KernelProfile::lookup`]);
    /// `None` otherwise: for other queries, for varlen rows (a launch of many documents
    /// plateaus as measured), or when the profile has no non-varlen full-mask rows for the
    /// query.
    fn causal_above<'a>(&'a self, q: &KernelQuery, loc: &Located<'a>) -> Option<Pieces<'a>> {
        let At::Above(causal) = loc.at else {
            return None;
        };
        if q.mask != Mask::Causal || causal.varlen {
            return None;
        }
        let full = self
            .locate(&KernelQuery {
                mask: Mask::Full,
                q_len: causal.q_len,
                kv_len: causal.kv_len,
                varlen: false,
                ..*q
            })
            .ok()?;
        if full.first.varlen {
            return None;
        }
        // Pieces of side `side` along a diagonal of `d` tokens hold d·side/2 of the tile's
        // q·kv − d²/2 allowed pairs; the rest are unmasked pieces.
        let side = causal.length();
        let (ql, kl) = (q.q_len as f64, q.kv_len as f64);
        let d = ql.min(kl);
        let diagonal = (d * side / (2.0 * ql * kl - d * d)).min(1.0);
        let tflops = 1.0 / (diagonal / causal.tflops + (1.0 - diagonal) / full.tflops());
        if tflops <= causal.tflops {
            return None;
        }
        Some(Pieces {
            tflops,
            diagonal,
            causal,
            full,
        })
    }

    /// A full-mask query below its series' shortest row: the causal series' throughput at
    /// twice the length where that is below the clamped value (see [`KernelProfile::lookup`]);
    /// `None` otherwise, or when the profile has no causal rows for the query.
    fn full_below_cap<'a>(&'a self, q: &KernelQuery, loc: &Located<'a>) -> Option<Cap<'a>> {
        let At::Below(full) = loc.at else {
            return None;
        };
        if q.mask != Mask::Full {
            return None;
        }
        // Doubling both sides doubles the geometric-mean length the series is keyed by. The
        // causal rows are read from the series kind the full rows came from: a varlen query
        // answered from non-varlen full rows was held to the varlen causal rows (60 TFLOP/s at
        // 512 against 558 at 1,024; bug hunt).
        let causal = KernelQuery {
            mask: Mask::Causal,
            q_len: q.q_len.saturating_mul(2),
            kv_len: q.kv_len.saturating_mul(2),
            varlen: loc.first.varlen,
            ..*q
        };
        let causal = self.locate(&causal).ok()?;
        // `locate` falls back to the other kind where a kind has no rows: a profile without
        // causal rows of the full rows' kind keeps the plain clamp, as documented (bug hunt:
        // a non-varlen full tile was held to varlen causal rows, 60 TFLOP/s against 558).
        if causal.first.varlen != loc.first.varlen {
            return None;
        }
        let tflops = causal.tflops();
        (tflops < full.tflops).then_some(Cap {
            tflops,
            full,
            causal,
        })
    }

    /// TFLOP/s for a tile, interpolated linearly in log2(length) between the two nearest rows of
    /// the matching series and clamped at the table ends (reported in [`KernelLookup::clamped`]).
    ///
    /// Below the shortest row a **full-mask** tile is further held to the causal rows at twice
    /// its length: it runs no faster than a causal tile of twice its side, whose kv loops are
    /// as long on average. Why: the bundled tables start at 1,024 tokens, where full-mask rows
    /// run about twice as fast as causal ones (558 vs 283 TFLOP/s forward on H100); clamping
    /// both let a short causal document cut into a diagonal and an off-diagonal tile cost less
    /// than the document whole, and cutting beat the whole-document lower bound. With the hold,
    /// every piece of a document shorter than the shortest row runs at that row's causal rate,
    /// so a cut costs what the whole does (pairs add up exactly). The tables themselves follow
    /// the rule within a few percent where both are measured (H100 forward: full 1,024 = 558
    /// against causal 2,048 = 585; full 2,048 = 672 against causal 4,096 = 662). Clamping a
    /// causal tile is kept: in varlen launches of 4K tokens or more, short documents run at
    /// about the shortest causal row's rate, not below it (`examples/short_tiles.rs` checks the
    /// per-tile model against the measured varlen rows; `docs/kernel-profile.md` § Lookup).
    ///
    /// Above the longest row a **causal** tile is priced as if cut into square pieces of that
    /// row's side: the pieces along the diagonal run at the longest causal row's rate and the
    /// rest at the full-mask rows' rate at that side, weighted by their share of the pairs
    /// (`1/t = s/t_causal + (1 − s)/t_full`, `s` = side/length for a square tile), where that
    /// beats the clamp: a longer launch runs no slower than its longest row, nor than the
    /// pieces it could be cut into (B200's forward causal row outruns its full one at 32K,
    /// 1,390 against 1,300 TFLOP/s, and keeps the clamp). Why: the tables end at 32K, where
    /// causal rows run a few percent under full ones (H100 forward 680 against 701); clamping
    /// a 128K causal document to 680 let four 32K pieces cost 2 % less than the whole, and a
    /// plan that cut long documents beat the lower bound. A longer causal launch only dilutes
    /// its diagonal, so its rate tends to the full-mask one; with the pieces rule a cut whose
    /// pieces are at least the longest row costs exactly the whole. Full-mask tiles and
    /// varlen rows (launches of many documents) keep the clamp.
    ///
    /// Rows match on pass, mask and head_dim exactly; varlen rows are preferred for a varlen
    /// query and non-varlen rows otherwise, falling back to the other kind when only that exists.
    pub fn lookup(&self, q: &KernelQuery) -> Result<KernelLookup, HardwareError> {
        let loc = self.locate(q)?;
        let len = loc.len;
        let varlen_fallback = loc.varlen_fallback;
        let key = (q.pass, q.mask, q.head_dim, loc.first.varlen);
        let head = format!(
            "{}: {} len_kind={}",
            self.name,
            series_label(&key),
            loc.first.len_kind
        );
        let fallback_note = if varlen_fallback {
            format!(
                "; no {} rows, used {} rows",
                if q.varlen { "varlen" } else { "non-varlen" },
                if q.varlen { "non-varlen" } else { "varlen" }
            )
        } else {
            String::new()
        };
        // Every answer: its value, clamp, what was used (between the series and the fallback
        // note) and the rows' sources.
        let answer =
            |tflops: f64, clamped: Clamp, what: String, sources: Vec<String>| KernelLookup {
                tflops,
                length: len,
                clamped,
                varlen_fallback,
                used: format!("{head}: {what}{fallback_note}"),
                sources,
            };
        if let Some(Cap {
            tflops,
            full: r,
            causal: c,
        }) = self.full_below_cap(q, &loc)
        {
            let what = format!(
                "below the table (len {len:.0} < shortest {:.0}): held to a causal tile of twice its side, {} TFLOP/s at causal len {:.0} (under the shortest full row {}x{} = {} TFLOP/s)",
                r.length(),
                crate::report::tenths(tflops),
                c.len,
                r.q_len,
                r.kv_len,
                r.tflops
            );
            return Ok(answer(tflops, Clamp::BelowMin, what, sources_with(r, &c)));
        }
        if let Some(Pieces {
            tflops,
            diagonal,
            causal: c,
            full: f,
        }) = self.causal_above(q, &loc)
        {
            let what = format!(
                "above the table (len {len:.0} > longest {:.0}): priced as cut into pieces of that side, {:.1} % of pairs on the diagonal at the causal row {}x{} = {} TFLOP/s, the rest at the full-mask rows' {} TFLOP/s: {} TFLOP/s",
                c.length(),
                100.0 * diagonal,
                c.q_len,
                c.kv_len,
                c.tflops,
                crate::report::tenths(f.tflops()),
                crate::report::tenths(tflops)
            );
            return Ok(answer(tflops, Clamp::AboveMax, what, sources_with(c, &f)));
        }
        let tflops = loc.tflops();
        let sources = loc.at.sources().into_iter().cloned().collect();
        let row = |r: &KernelRow| format!("row {}x{} = {} TFLOP/s", r.q_len, r.kv_len, r.tflops);
        Ok(match loc.at {
            At::Exact(r) => answer(tflops, Clamp::None, format!("exact {}", row(r)), sources),
            At::Below(r) => {
                let what = format!(
                    "clamped below (len {len:.0} < shortest {:.0}) to {}",
                    r.length(),
                    row(r)
                );
                answer(tflops, Clamp::BelowMin, what, sources)
            }
            At::Above(r) => {
                let what = format!(
                    "clamped above (len {len:.0} > longest {:.0}) to {}",
                    r.length(),
                    row(r)
                );
                answer(tflops, Clamp::AboveMax, what, sources)
            }
            At::Between(a, b, t) => {
                let what = format!(
                    "log2-interpolated at len {len:.0} (t={t:.3}) between rows {}x{} = {} and {}x{} = {} TFLOP/s",
                    a.q_len, a.kv_len, a.tflops, b.q_len, b.kv_len, b.tflops
                );
                answer(tflops, Clamp::None, what, sources)
            }
        })
    }
}

/// The sources of a value blended from `row` and the rows `other` is answered from: `row`'s
/// first, then each of the others that differs from it.
fn sources_with(row: &KernelRow, other: &Located<'_>) -> Vec<String> {
    let mut sources = vec![row.source.clone()];
    sources.extend(
        other
            .at
            .sources()
            .into_iter()
            .filter(|s| **s != row.source)
            .cloned(),
    );
    sources
}

/// Where length `len` falls in a series: `first` and `last` its shortest and longest rows, `a`
/// the longest row no longer than `len` and `b` the shortest longer one (each the first such
/// row in file order).
fn at_length<'a>(
    len: f64,
    first: &'a KernelRow,
    last: &'a KernelRow,
    a: Option<&'a KernelRow>,
    b: Option<&'a KernelRow>,
) -> At<'a> {
    const EPS: f64 = 1e-9;
    if (len - first.length()).abs() <= EPS * len {
        At::Exact(first)
    } else if len < first.length() {
        At::Below(first)
    } else if len >= last.length() {
        if (len - last.length()).abs() <= EPS * len {
            At::Exact(last)
        } else {
            At::Above(last)
        }
    } else {
        // first.length() < len < last.length(): both brackets exist.
        let (a, b) = (a.expect("a row below"), b.expect("a row above"));
        if (len - a.length()).abs() <= EPS * len {
            At::Exact(a)
        } else {
            let t = (len.log2() - a.length().log2()) / (b.length().log2() - a.length().log2());
            At::Between(a, b, t)
        }
    }
}

/// The series of `rows` (in order of first appearance), each its rows' (length, index) sorted
/// by length; among rows of one length only the first in file order is kept.
fn index_series(rows: &[KernelRow]) -> Vec<(SeriesKey, Vec<(f64, usize)>)> {
    let mut series: Vec<(SeriesKey, Vec<(f64, usize)>)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let key = (r.pass, r.mask, r.head_dim, r.varlen);
        match series.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push((r.length(), i)),
            None => series.push((key, vec![(r.length(), i)])),
        }
    }
    for (_, ids) in &mut series {
        // Stable: file order decides among equal lengths.
        ids.sort_by(|x, y| x.0.total_cmp(&y.0));
        ids.dedup_by(|later, earlier| later.0 == earlier.0);
    }
    series
}

/// Where a query falls in its series.
enum At<'a> {
    /// On a row (within 1e-9 relative).
    Exact(&'a KernelRow),
    /// Shorter than the shortest row: clamped to it.
    Below(&'a KernelRow),
    /// Longer than the longest row: clamped to it.
    Above(&'a KernelRow),
    /// Between two rows, at fraction `t` of the way in log2(length).
    Between(&'a KernelRow, &'a KernelRow, f64),
}

/// A located query: the rows used, the length matched, and whether the other varlen kind
/// had to stand in.
struct Located<'a> {
    at: At<'a>,
    len: f64,
    varlen_fallback: bool,
    /// Shortest row of the series used (names the series in descriptions).
    first: &'a KernelRow,
}

impl<'a> At<'a> {
    /// The sources of the row or rows a value comes from (one each, in row order).
    fn sources(&self) -> Vec<&'a String> {
        match *self {
            At::Exact(r) | At::Below(r) | At::Above(r) => vec![&r.source],
            At::Between(a, b, _) if a.source == b.source => vec![&a.source],
            At::Between(a, b, _) => vec![&a.source, &b.source],
        }
    }
}

/// A full-mask tile below the table held to the causal rows at twice its length.
struct Cap<'a> {
    /// The causal rows' throughput at twice the length.
    tflops: f64,
    /// The full-mask series' shortest row (the clamp it replaces).
    full: &'a KernelRow,
    /// Where twice the length falls in the causal series.
    causal: Located<'a>,
}

/// A causal tile above the table priced as cut into pieces of the longest row's side.
struct Pieces<'a> {
    /// The blended throughput.
    tflops: f64,
    /// Share of the tile's pairs in the pieces along the diagonal.
    diagonal: f64,
    /// The causal series' longest row (the clamp it replaces).
    causal: &'a KernelRow,
    /// Where that row's shape falls in the full-mask series.
    full: Located<'a>,
}

impl Located<'_> {
    fn tflops(&self) -> f64 {
        match self.at {
            At::Exact(r) | At::Below(r) | At::Above(r) => r.tflops,
            At::Between(a, b, t) => a.tflops + t * (b.tflops - a.tflops),
        }
    }
}

fn series_label(k: &SeriesKey) -> String {
    format!(
        "{} {} hd {}{}",
        k.0,
        k.1,
        k.2,
        if k.3 { " varlen" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "pass,mask,head_dim,varlen,len_kind,q_len,kv_len,tflops,source
fwd,causal,128,false,total,1024,1024,100,a
fwd,causal,128,false,total,4096,4096,300,b
fwd,causal,128,false,total,2048,2048,200,c
fwd,causal,128,true,total,2048,2048,50,v
bwd,full,64,true,total,2048,2048,40,v
";

    fn p() -> KernelProfile {
        KernelProfile::from_csv_str("t", "t.csv", CSV).unwrap()
    }

    fn q(pass: Pass, mask: Mask, hd: u32, ql: u64, kl: u64, varlen: bool) -> KernelQuery {
        KernelQuery {
            pass,
            mask,
            head_dim: hd,
            q_len: ql,
            kv_len: kl,
            varlen,
        }
    }

    /// Regression (bug hunt): a varlen full-mask tile below the table, answered from the
    /// non-varlen full rows, was held to the *varlen* causal rows (60 TFLOP/s at 512 tokens on
    /// H100, against 558 at 1,024), while its note said non-varlen rows were used.
    #[test]
    fn a_varlen_full_tile_below_the_table_is_held_to_the_rows_it_was_answered_from() {
        let h100 = KernelProfile::load("h100-fa3").unwrap();
        let at = |varlen| {
            h100.lookup(&q(Pass::Fwd, Mask::Full, 128, 512, 512, varlen))
                .unwrap()
        };
        let (plain, varlen) = (at(false), at(true));
        assert!(varlen.varlen_fallback);
        assert_eq!(varlen.tflops, plain.tflops);
        assert!(
            varlen.used.contains("no varlen rows, used non-varlen rows"),
            "{}",
            varlen.used
        );
    }

    /// Regression (bug hunt): a non-varlen full tile below a profile's full rows, where the
    /// profile's causal rows are varlen only, was held to those (60 TFLOP/s against the 558
    /// clamp) while the documentation says a profile without causal rows of the series keeps
    /// the plain clamp.
    #[test]
    fn a_full_tile_below_the_table_is_never_held_to_causal_rows_of_the_other_kind() {
        let head = "pass,mask,head_dim,varlen,len_kind,q_len,kv_len,tflops,source";
        let text = format!(
            "{head}
fwd,full,128,false,total,1024,1024,558,x
fwd,full,128,false,total,2048,2048,672,x
             fwd,causal,128,true,total,2048,2048,60,x
fwd,causal,128,true,total,4096,4096,300,x
"
        );
        let p = KernelProfile::from_csv_str("mix", "mix.csv", &text).unwrap();
        let l = p
            .lookup(&q(Pass::Fwd, Mask::Full, 128, 512, 512, false))
            .unwrap();
        assert_eq!(l.tflops, 558.0, "{}", l.used);
    }

    /// Regression (bug hunt): errors counted data rows, not lines: a row on line 5 below two
    /// comments was "line 3", and a duplicate below a comment pointed at the comment.
    #[test]
    fn errors_name_the_files_own_lines_past_comments_and_blank_lines() {
        let head = "pass,mask,head_dim,varlen,len_kind,q_len,kv_len,tflops,source";
        let row =
            |len: u32, tflops: &str| format!("fwd,causal,128,false,total,{len},{len},{tflops},x");
        for (text, says) in [
            (
                format!(
                    "# node 7\n# torch 2.5\n{head}\n{}\n{}\n",
                    row(4096, "500"),
                    row(8192, "0")
                ),
                "line 5: must be within 1e-9..=1e6 TFLOP/s, got 0",
            ),
            (
                format!(
                    "{head}\r\n{}\r\n# old\r\n\r\n{}\r\n{}\r\n",
                    row(4096, "500"),
                    row(8192, "500"),
                    row(8192, "510")
                ),
                "line 6: same series and length as line 5",
            ),
            (
                format!("{head}\n\n\n{}\n", row(4096, "abc")),
                // Named by its column and counted from 1 (bug hunt: "field 7", from 0).
                "line 4: column `tflops` (field 8): invalid float literal",
            ),
            (
                format!("{head}\n\n{}\n", "fwd,causal"),
                "line 3: expected 9 fields, found 2",
            ),
        ] {
            let e = KernelProfile::from_csv_str("t", "t.csv", &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    /// Regression (bug hunt): a row of 1e-300 TFLOP/s loaded and `hw kernel` printed it with
    /// 300 digits; a CPU calibration's slowest tiles (about 1e-4) still load.
    #[test]
    fn regression_a_throughput_of_1e_300_is_refused() {
        let head = "pass,mask,head_dim,varlen,len_kind,q_len,kv_len,tflops,source";
        let load = |tflops: &str| {
            let text = format!("{head}\nfwd,causal,128,false,total,4096,4096,{tflops},x\n");
            KernelProfile::from_csv_str("t", "t.csv", &text)
        };
        for bad in ["1e-300", "1e-10", "2e6"] {
            let e = load(bad).unwrap_err().to_string();
            assert!(
                e.contains("line 2: must be within 1e-9..=1e6 TFLOP/s"),
                "{bad}: {e}"
            );
            assert!(e.len() < 200, "{e}");
        }
        for ok in ["1e-4", "1.7e-7", "1e-9", "1e6"] {
            assert!(load(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn table_point_returns_table_value() {
        let l = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 2048, 2048, false))
            .unwrap();
        assert_eq!(l.tflops, 200.0);
        assert_eq!(l.clamped, Clamp::None);
        assert!(l.used.contains("exact"), "{}", l.used);
        let l = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 4096, 4096, false))
            .unwrap();
        assert_eq!(l.tflops, 300.0);
        assert_eq!(l.clamped, Clamp::None);
    }

    #[test]
    fn between_points_is_log_linear() {
        // sqrt(1024 * 4096) = 2048 exactly: geometric-mean rule.
        let l = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 1024, 4096, false))
            .unwrap();
        assert_eq!(l.tflops, 200.0);
        // 1448 ≈ 2^10.5: halfway in log2 between 1024 and 2048.
        let l = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 1024, 2048, false))
            .unwrap();
        assert!((l.tflops - 150.0).abs() < 1e-9, "{}", l.tflops);
        assert!(l.used.contains("interpolated"), "{}", l.used);
        let l = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 3000, 3000, false))
            .unwrap();
        assert!(l.tflops > 200.0 && l.tflops < 300.0);
        assert_eq!(l.sources, vec!["c".to_string(), "b".to_string()]);
    }

    #[test]
    fn clamping_is_reported() {
        let lo = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 100, 100, false))
            .unwrap();
        assert_eq!((lo.tflops, lo.clamped), (100.0, Clamp::BelowMin));
        assert!(lo.used.contains("clamped below"), "{}", lo.used);
        let hi = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 1 << 20, 1 << 20, false))
            .unwrap();
        assert_eq!((hi.tflops, hi.clamped), (300.0, Clamp::AboveMax));
        // A single-row series clamps both ways.
        let v = p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 8192, 8192, true))
            .unwrap();
        assert_eq!(
            (v.tflops, v.clamped, v.varlen_fallback),
            (50.0, Clamp::AboveMax, false)
        );
    }

    #[test]
    fn a_full_tile_below_the_table_runs_no_faster_than_a_causal_one_twice_as_long() {
        let h100 = KernelProfile::load("h100-fa3").unwrap();
        let at = |mask, len| {
            h100.lookup(&q(Pass::Fwd, mask, 128, len, len, false))
                .unwrap()
        };
        // 300 × 300 full: the causal rows at 600, themselves clamped to 1,024's 283.
        let l = at(Mask::Full, 300);
        assert_eq!((l.tflops, l.clamped), (283.0, Clamp::BelowMin));
        assert!(
            l.used.contains("held to a causal tile of twice its side"),
            "{}",
            l.used
        );
        assert_eq!(l.tflops, at(Mask::Causal, 300).tflops);
        // 900 × 900: causal at 1,800, interpolated between 1,024 and 2,048, under 558.
        let (full, causal) = (at(Mask::Full, 900), at(Mask::Causal, 1800));
        assert_eq!(full.tflops, causal.tflops);
        assert!(
            full.tflops > 283.0 && full.tflops < 558.0,
            "{}",
            full.tflops
        );
        // Where the causal rows at twice the length are faster, the full row's clamp holds.
        let b200 = KernelProfile::load("b200-fa4").unwrap();
        let l = b200
            .lookup(&q(Pass::Fwd, Mask::Full, 128, 1000, 1000, false))
            .unwrap();
        assert_eq!(l.tflops, 205.0);
        assert!(l.used.contains("clamped below"), "{}", l.used);
        // No causal rows for the series (hd 64 backward): plain clamp.
        let l = h100
            .lookup(&q(Pass::Bwd, Mask::Full, 64, 300, 300, false))
            .unwrap();
        assert!(l.used.contains("clamped below"), "{}", l.used);
        // Inside the table nothing changes: the full row at 1,024 is 558.
        assert_eq!(at(Mask::Full, 1024).tflops, 558.0);
    }

    #[test]
    fn a_causal_tile_above_the_table_is_priced_as_its_pieces() {
        let h100 = KernelProfile::load("h100-fa3").unwrap();
        // 64K × 64K causal: half its pairs in 32K diagonal pieces (680), half unmasked (701).
        let l = h100
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 65536, 65536, false))
            .unwrap();
        let want = 1.0 / (0.5 / 680.0 + 0.5 / 701.0);
        assert!((l.tflops - want).abs() < 1e-9, "{} vs {want}", l.tflops);
        assert_eq!(l.clamped, Clamp::AboveMax);
        assert!(l.used.contains("priced as cut into pieces"), "{}", l.used);
        assert_eq!(
            l.tflops,
            h100.tflops_for(&q(Pass::Fwd, Mask::Causal, 128, 65536, 65536, false))
                .unwrap()
        );
        // 32K queries against 64K keys: a third of the pairs on the diagonal.
        let l = h100
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 32768, 65536, false))
            .unwrap();
        let want = 1.0 / (1.0 / 3.0 / 680.0 + 2.0 / 3.0 / 701.0);
        assert!((l.tflops - want).abs() < 1e-9, "{} vs {want}", l.tflops);
        // Full-mask tiles keep the clamp.
        let l = h100
            .lookup(&q(Pass::Fwd, Mask::Full, 128, 65536, 65536, false))
            .unwrap();
        assert_eq!((l.tflops, l.clamped), (701.0, Clamp::AboveMax));
        // Varlen rows (launches of many documents) keep the clamp.
        let l = h100
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 65536, 65536, true))
            .unwrap();
        assert_eq!((l.tflops, l.clamped), (583.0, Clamp::AboveMax));
        // Where the causal row outruns the full one (B200 forward, 1,390 vs 1,300), the
        // pieces would be slower: the clamp holds.
        let b200 = KernelProfile::load("b200-fa4").unwrap();
        let l = b200
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 65536, 65536, false))
            .unwrap();
        assert_eq!(l.tflops, 1390.0);
        assert!(l.used.contains("clamped above"), "{}", l.used);
    }

    #[test]
    fn varlen_falls_back_and_says_so() {
        let l = p()
            .lookup(&q(Pass::Bwd, Mask::Full, 64, 2048, 2048, false))
            .unwrap();
        assert!(l.varlen_fallback);
        assert!(l.used.contains("no non-varlen rows"), "{}", l.used);
    }

    #[test]
    fn missing_row_is_an_error() {
        let e = p()
            .lookup(&q(Pass::Bwd, Mask::Causal, 96, 1024, 1024, false))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("profile t has no row for bwd causal hd 96"),
            "{e}"
        );
        assert!(e.contains("fwd causal hd 128"), "{e}");
        assert!(p()
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 0, 10, false))
            .is_err());
    }

    #[test]
    fn bad_csv_is_an_error() {
        let e = KernelProfile::from_csv_str("t", "t.csv", "pass,mask\nfwd,causal\n").unwrap_err();
        assert!(e.to_string().contains("t.csv"), "{e}");
        let dup = format!("{CSV}fwd,causal,128,false,total,1024,1024,90,d\n");
        let e = KernelProfile::from_csv_str("t", "t.csv", &dup)
            .unwrap_err()
            .to_string();
        assert!(e.contains("same series"), "{e}");
        let mixed = format!("{CSV}fwd,causal,128,false,seq,512,512,90,d\n");
        let e = KernelProfile::from_csv_str("t", "t.csv", &mixed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("len_kind"), "{e}");
        let nosrc = CSV.replace(",a\n", ",\n");
        let e = KernelProfile::from_csv_str("t", "t.csv", &nosrc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("source"), "{e}");
        let badpass = CSV.replace("bwd,full", "back,full");
        let e = KernelProfile::from_csv_str("t", "t.csv", &badpass)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 6"), "{e}");
        // Regression: a short row read "line 2: fields, but the previous record has 9 fields".
        let short = format!("{CSV}fwd,causal,128\n");
        let e = KernelProfile::from_csv_str("t", "t.csv", &short)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected 9 fields, found 3"), "{e}");
    }

    #[test]
    fn bundled_profiles_load() {
        for name in bundled::names(bundled::KERNEL_PROFILES) {
            let p = KernelProfile::load(name).unwrap();
            assert!(!p.rows.is_empty(), "{name}");
        }
        let h = KernelProfile::load("h100-fa3").unwrap();
        let l = h
            .lookup(&q(Pass::Fwd, Mask::Causal, 128, 4096, 4096, false))
            .unwrap();
        assert_eq!(l.tflops, 662.0);
    }

    /// The plain scan of every row the index replaced (brackets picked by strict comparisons,
    /// so the first row in file order wins ties), kept as the oracle for [`KernelProfile::locate`]:
    /// `None` where no row of the query's pass, mask and head_dim exists or the tile is empty.
    fn scan(p: &KernelProfile, q: &KernelQuery) -> Option<f64> {
        if q.q_len == 0 || q.kv_len == 0 {
            return None;
        }
        let same = |r: &KernelRow| r.pass == q.pass && r.mask == q.mask && r.head_dim == q.head_dim;
        let rows = || p.rows().iter().filter(|r| same(r));
        let varlen = if rows().any(|r| r.varlen == q.varlen) {
            q.varlen
        } else {
            !q.varlen
        };
        let len = q.length();
        let [mut first, mut last, mut a, mut b]: [Option<&KernelRow>; 4] = [None; 4];
        for r in rows().filter(|r| r.varlen == varlen) {
            let l = r.length();
            if first.is_none_or(|f| l < f.length()) {
                first = Some(r);
            }
            if last.is_none_or(|f| l > f.length()) {
                last = Some(r);
            }
            if l <= len && a.is_none_or(|x| l > x.length()) {
                a = Some(r);
            }
            if l > len && b.is_none_or(|x| l < x.length()) {
                b = Some(r);
            }
        }
        let at = at_length(len, first?, last?, a, b);
        Some(
            Located {
                at,
                len,
                varlen_fallback: false,
                first: first?,
            }
            .tflops(),
        )
    }

    /// The index answers what the scan answers, bit for bit, errors included (the series
    /// lookup, before the full-mask hold below the table): on every bundled profile and on a
    /// small table with a non-square row, a series only in varlen and rows out of length order.
    #[test]
    fn the_index_gives_the_scan_s_answers() {
        let dup = format!(
            "{CSV}fwd,full,128,false,total,1024,4096,70,d1\n\
             fwd,full,128,false,total,8192,8192,400,e\n\
             fwd,full,128,false,total,512,512,20,f\n"
        );
        let mut profiles = vec![KernelProfile::from_csv_str("dup", "dup.csv", &dup).unwrap()];
        for name in bundled::names(bundled::KERNEL_PROFILES) {
            profiles.push(KernelProfile::load(name).unwrap());
        }
        let lens = [
            0u64, 1, 7, 100, 511, 512, 513, 1000, 1024, 2048, 3000, 4096, 5000,
        ];
        let lens = lens
            .iter()
            .copied()
            .chain([8192, 12345, 65536, 1 << 20, 1 << 22]);
        let lens: Vec<u64> = lens.collect();
        for p in &profiles {
            for pass in [Pass::Fwd, Pass::Bwd] {
                for mask in [Mask::Causal, Mask::Full] {
                    for hd in [64, 128, 256] {
                        for varlen in [false, true] {
                            for &ql in &lens {
                                for &kl in &lens {
                                    let query = q(pass, mask, hd, ql, kl, varlen);
                                    match (scan(p, &query), p.locate(&query).map(|l| l.tflops())) {
                                        (Some(a), Ok(b)) => {
                                            assert_eq!(a.to_bits(), b.to_bits(), "{query:?}")
                                        }
                                        (None, Err(_)) => {}
                                        (a, b) => panic!("{} {query:?}: {a:?} vs {b:?}", p.name),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tflops_for_equals_lookup() {
        // The cheap path and the described path share one interpolation: same numbers on every
        // bundled profile, at rows, between rows, clamped, and with varlen fallback.
        for name in bundled::names(bundled::KERNEL_PROFILES) {
            let p = KernelProfile::load(name).unwrap();
            for pass in [Pass::Fwd, Pass::Bwd] {
                for mask in [Mask::Causal, Mask::Full] {
                    for varlen in [false, true] {
                        for (ql, kl) in [
                            (1, 1),
                            (100, 3000),
                            (512, 512),
                            (4096, 4096),
                            (3000, 7777),
                            (1 << 21, 1 << 20),
                        ] {
                            let query = q(pass, mask, 128, ql, kl, varlen);
                            match (p.lookup(&query), p.tflops_for(&query)) {
                                (Ok(l), Ok(t)) => assert_eq!(l.tflops, t, "{name} {query:?}"),
                                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                                (a, b) => panic!("{name} {query:?}: {a:?} vs {b:?}"),
                            }
                        }
                    }
                }
            }
        }
    }
}
