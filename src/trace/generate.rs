//! Synthetic traces: deterministic samplers for the document-length distributions we have
//! evidence for (see `docs/traces.md` for each source and its citation).
//!
//! Same source, count and seed give the same lengths on every run and machine: the RNG is
//! `ChaCha8Rng::seed_from_u64(seed)` and every sampler uses it in a fixed order.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};

use super::tables::{self, Component, HistBin, QuantileTable};
use super::{Trace, TraceDoc, TraceError};

/// Longest document the mixture sources produce (512K tokens): the tail of books and IRC
/// logs is cut here, which is beyond any context we plan for.
pub const MIXTURE_CAP: u64 = 524_288;

/// A clipped lognormal: `ln len ~ N(mu, sigma²)`, rounded, then clipped to `[min, max]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Lognormal {
    /// Mean of `ln len`.
    pub mu: f64,
    /// Standard deviation of `ln len`.
    pub sigma: f64,
    /// Clip floor (≥ 1).
    pub min: u64,
    /// Clip ceiling (≥ min).
    pub max: u64,
}

impl Lognormal {
    /// Megatron DCP's benchmark default: arithmetic mean 1024, σ 1.5, clipped to [128, 8192]
    /// (Megatron-LM `examples/dynamic_context_parallel/benchmark_dcp.sh`, anchors-data §A1/§A3).
    pub fn megatron_default() -> Lognormal {
        Lognormal {
            mu: 1024f64.ln() - 1.5 * 1.5 / 2.0,
            sigma: 1.5,
            min: 128,
            max: 8192,
        }
    }

    /// From the arithmetic mean (before clipping): μ = ln(mean) − σ²/2.
    pub fn from_mean(mean: f64, sigma: f64, min: u64, max: u64) -> Result<Lognormal, TraceError> {
        if !(mean.is_finite() && mean > 0.0) {
            return Err(TraceError::BadParameter(format!(
                "mean must be finite and > 0, got {mean}"
            )));
        }
        Lognormal::from_mu(mean.ln() - sigma * sigma / 2.0, sigma, min, max)
    }

    /// From the median: μ = ln(median).
    pub fn from_median(
        median: f64,
        sigma: f64,
        min: u64,
        max: u64,
    ) -> Result<Lognormal, TraceError> {
        if !(median.is_finite() && median > 0.0) {
            return Err(TraceError::BadParameter(format!(
                "median must be finite and > 0, got {median}"
            )));
        }
        Lognormal::from_mu(median.ln(), sigma, min, max)
    }

    fn from_mu(mu: f64, sigma: f64, min: u64, max: u64) -> Result<Lognormal, TraceError> {
        if !(sigma.is_finite() && sigma > 0.0) {
            return Err(TraceError::BadParameter(format!(
                "sigma must be finite and > 0, got {sigma}"
            )));
        }
        if min == 0 {
            return Err(TraceError::BadParameter("min must be ≥ 1".into()));
        }
        if max > super::MAX_DOC_LEN {
            return Err(TraceError::BadParameter(format!(
                "max ({max}) is above the {} tokens a document may have",
                super::MAX_DOC_LEN
            )));
        }
        if min > max {
            return Err(TraceError::BadParameter(format!(
                "min ({min}) must not exceed max ({max})"
            )));
        }
        Ok(Lognormal {
            mu,
            sigma,
            min,
            max,
        })
    }
}

/// A document-length source for [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A clipped lognormal (default: Megatron DCP's benchmark setting).
    Lognormal(Lognormal),
    /// MagiAttention's 14-bin production histogram.
    Magi,
    /// DistCA's WLB-LLM length list, by its quantile table.
    WlbLlm,
    /// DistCA's ProLong length list, by its quantile table.
    Prolong,
    /// The Pile as a mixture of its 22 components.
    Pile,
    /// RedPajama-1T as a mixture of its 7 subsets.
    RedPajama,
    /// `min(floor(Exp(mean)), max)`, at least 1 token: the balancing-compute note's model
    /// (seeds/003), which `fcp dpcp`'s bundled study uses.
    Exponential {
        /// Mean of the exponential before flooring and capping.
        mean: f64,
        /// Cap on a document's length.
        max: u64,
    },
}

impl Source {
    /// Names accepted by [`Source::from_name`] and `fcp trace gen --source`.
    pub const NAMES: [&'static str; 7] = [
        "lognormal",
        "magi",
        "wlb-llm",
        "prolong",
        "pile",
        "redpajama",
        "exponential",
    ];

    /// Look a source up by name (`lognormal` gets Megatron's default parameters).
    pub fn from_name(name: &str) -> Result<Source, TraceError> {
        Ok(match name {
            "lognormal" => Source::Lognormal(Lognormal::megatron_default()),
            "magi" => Source::Magi,
            "wlb-llm" => Source::WlbLlm,
            "prolong" => Source::Prolong,
            "pile" => Source::Pile,
            "redpajama" => Source::RedPajama,
            "exponential" => Source::Exponential {
                mean: 1024.0,
                max: super::MAX_DOC_LEN,
            },
            _ => {
                return Err(TraceError::UnknownSource {
                    name: name.to_string(),
                    known: Source::NAMES.join(", "),
                })
            }
        })
    }

    /// The source's name.
    pub fn name(&self) -> &'static str {
        match self {
            Source::Lognormal(_) => "lognormal",
            Source::Magi => "magi",
            Source::WlbLlm => "wlb-llm",
            Source::Prolong => "prolong",
            Source::Pile => "pile",
            Source::RedPajama => "redpajama",
            Source::Exponential { .. } => "exponential",
        }
    }
}

/// Draw `docs` document lengths from `source` with RNG seed `seed` (deterministic).
pub fn generate(source: &Source, docs: usize, seed: u64) -> Result<Trace, TraceError> {
    if docs == 0 {
        return Err(TraceError::BadParameter("--docs must be ≥ 1".into()));
    }
    let lens: Vec<u64> = Generator::new(source, seed)?.take(docs).collect();
    Ok(Trace::from_lens(&lens))
}

/// An endless stream of document lengths from one source and seed: [`generate`] takes the first
/// `docs`, `fcp trace gen` writes them as they come, so a 10M-document trace needs no more
/// memory than a 10-document one. The n-th length is the same either way.
pub struct Generator {
    rng: ChaCha8Rng,
    sampler: Sampler,
}

/// A source's sampler, its table parsed once.
enum Sampler {
    Lognormal(LogNormal<f64>, u64, u64),
    Histogram(Vec<HistBin>),
    Quantiles(QuantileTable),
    Mixture(Mixture),
    Exponential(Exp<f64>, u64),
}

impl Generator {
    /// The stream for `source` seeded with `seed`; errors on bad parameters or tables.
    pub fn new(source: &Source, seed: u64) -> Result<Generator, TraceError> {
        let sampler = match source {
            Source::Lognormal(p) => Sampler::Lognormal(
                LogNormal::new(p.mu, p.sigma)
                    .map_err(|e| TraceError::BadParameter(format!("lognormal: {e}")))?,
                p.min,
                p.max,
            ),
            Source::Magi => Sampler::Histogram(tables::read_table("magi", tables::MAGI_HISTOGRAM)?),
            Source::WlbLlm => {
                Sampler::Quantiles(QuantileTable::parse("wlb-llm", tables::WLB_LLM_QUANTILES)?)
            }
            Source::Prolong => {
                Sampler::Quantiles(QuantileTable::parse("prolong", tables::PROLONG_QUANTILES)?)
            }
            Source::Pile | Source::RedPajama => {
                let (name, text) = match source {
                    Source::Pile => ("pile", tables::PILE_MIXTURE),
                    _ => ("redpajama", tables::REDPAJAMA_MIXTURE),
                };
                let comps: Vec<Component> = tables::read_table(name, text)?;
                Sampler::Mixture(Mixture::new(&comps)?)
            }
            Source::Exponential { mean, max } => Sampler::Exponential(
                Exp::new(1.0 / mean)
                    .map_err(|e| TraceError::BadParameter(format!("exponential: {e}")))?,
                // Every trace holds documents of at most MAX_DOC_LEN tokens (a larger cap
                // made `mean=1e30` lengths whose sum wrapped around).
                (*max).min(super::MAX_DOC_LEN),
            ),
        };
        Ok(Generator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            sampler,
        })
    }
}

impl Iterator for Generator {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let rng = &mut self.rng;
        Some(match &self.sampler {
            Sampler::Lognormal(d, min, max) => round_clip(d.sample(rng), *min, *max),
            Sampler::Histogram(bins) => sample_histogram(bins, rng),
            Sampler::Quantiles(q) => q.at(rng.gen::<f64>()),
            Sampler::Mixture(mix) => mix.sample(rng),
            Sampler::Exponential(exp, max) => (exp.sample(rng).floor() as u64).clamp(1, *max),
        })
    }
}

fn round_clip(x: f64, min: u64, max: u64) -> u64 {
    // `as` saturates for huge / NaN values, so this never panics.
    (x.round() as u64).clamp(min, max)
}

/// Pick a bin with probability ∝ count, then a length uniform in `[max(lo, 1), hi]`.
/// Uniform-within-bin reproduces the published mean (1,783) of the MagiAttention data.
pub fn sample_histogram(bins: &[HistBin], rng: &mut impl Rng) -> u64 {
    let total: u64 = bins.iter().map(|b| b.count).sum();
    if total == 0 {
        return 1;
    }
    let mut r = rng.gen_range(0..total);
    for b in bins {
        if r < b.count {
            let lo = b.lo.max(1);
            let hi = b.hi.max(lo);
            return rng.gen_range(lo..=hi);
        }
        r -= b.count;
    }
    bins.last().map_or(1, |b| b.hi.max(1))
}

/// A weighted mixture of lognormal components, each clipped to `[1, MIXTURE_CAP]`.
struct Mixture {
    cumulative: Vec<f64>,
    parts: Vec<LogNormal<f64>>,
}

impl Mixture {
    fn new(comps: &[Component]) -> Result<Mixture, TraceError> {
        let mut cumulative = Vec::with_capacity(comps.len());
        let mut parts = Vec::with_capacity(comps.len());
        let mut acc = 0.0;
        for c in comps {
            let p = Lognormal::from_mean(c.mean_tokens, c.sigma, 1, MIXTURE_CAP)?;
            parts.push(
                LogNormal::new(p.mu, p.sigma)
                    .map_err(|e| TraceError::BadParameter(format!("{}: {e}", c.component)))?,
            );
            if !(c.docs.is_finite() && c.docs >= 0.0) {
                return Err(TraceError::BadParameter(format!(
                    "{}: weight must be ≥ 0",
                    c.component
                )));
            }
            acc += c.docs;
            cumulative.push(acc);
        }
        if acc <= 0.0 {
            return Err(TraceError::BadParameter("mixture has zero weight".into()));
        }
        Ok(Mixture { cumulative, parts })
    }

    fn sample(&self, rng: &mut impl Rng) -> u64 {
        let total = self.cumulative[self.cumulative.len() - 1];
        let r = rng.gen::<f64>() * total;
        let i = self
            .cumulative
            .partition_point(|&c| c <= r)
            .min(self.parts.len() - 1);
        round_clip(self.parts[i].sample(rng), 1, MIXTURE_CAP)
    }
}

impl Trace {
    /// The trace as CSV: header `doc_len` (plus `batch` if pinned), one document per line.
    pub fn to_csv(&self) -> String {
        let pinned = self.is_pinned();
        let mut s = String::with_capacity(self.docs.len() * 7 + 16);
        s.push_str(if pinned {
            "doc_len,batch\n"
        } else {
            "doc_len\n"
        });
        for d in &self.docs {
            match (pinned, d.batch) {
                (true, Some(b)) => s.push_str(&format!("{},{}\n", d.len, b)),
                _ => s.push_str(&format!("{}\n", d.len)),
            }
        }
        s
    }

    /// A trace of unpinned documents with the given lengths.
    pub fn from_lens(lens: &[u64]) -> Trace {
        Trace {
            docs: lens
                .iter()
                .map(|&len| TraceDoc { len, batch: None })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::trace::stats::stats;

    /// Regression (user report): `--sigma inf` was told "must be > 0".
    #[test]
    fn an_infinite_parameter_is_told_it_must_be_finite() {
        let e = Lognormal::from_mean(1024.0, f64::INFINITY, 1, 10).unwrap_err();
        assert!(
            e.to_string()
                .contains("sigma must be finite and > 0, got inf"),
            "{e}"
        );
        let e = Lognormal::from_median(f64::INFINITY, 1.0, 1, 10).unwrap_err();
        assert!(
            e.to_string()
                .contains("median must be finite and > 0, got inf"),
            "{e}"
        );
    }

    #[test]
    fn deterministic_per_seed() {
        for name in Source::NAMES {
            let s = Source::from_name(name).unwrap();
            let a = generate(&s, 500, 7).unwrap();
            let b = generate(&s, 500, 7).unwrap();
            let c = generate(&s, 500, 8).unwrap();
            assert_eq!(a, b, "{name}");
            assert_ne!(a, c, "{name}");
            assert!(a.docs.iter().all(|d| d.len >= 1), "{name}");
        }
    }

    #[test]
    fn unknown_source_lists_known() {
        let e = Source::from_name("nope").unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("wlb-llm"), "{e}");
    }

    #[test]
    fn lognormal_clips_and_centres() {
        let p = Lognormal::from_median(1000.0, 0.5, 100, 5000).unwrap();
        let t = generate(&Source::Lognormal(p), 20_000, 1).unwrap();
        let s = stats(&t.lens()).unwrap();
        assert!(t.lens().iter().all(|&l| (100..=5000).contains(&l)));
        assert!((s.p50 as f64 - 1000.0).abs() < 30.0, "{}", s.p50);
        let m = Lognormal::megatron_default();
        assert!((m.mu.exp() - 332.0).abs() < 1.0);
    }

    #[test]
    fn bad_lognormal_parameters() {
        assert!(Lognormal::from_mean(0.0, 1.0, 1, 10).is_err());
        assert!(Lognormal::from_mean(10.0, 0.0, 1, 10).is_err());
        assert!(Lognormal::from_mean(10.0, 1.0, 0, 10).is_err());
        assert!(Lognormal::from_mean(10.0, 1.0, 11, 10).is_err());
        assert!(generate(&Source::Magi, 0, 1).is_err());
    }

    #[test]
    fn quantile_sampling_matches_table() {
        let mut text = String::from("quantile,doc_len\n");
        for i in 0..=100 {
            text.push_str(&format!("{},{}\n", i as f64 / 100.0, 100 + 10 * i));
        }
        let q = QuantileTable::parse("t", &text).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut v: Vec<u64> = (0..20_000).map(|_| q.at(rng.gen::<f64>())).collect();
        v.sort_unstable();
        let med = v[v.len() / 2];
        assert!((med as i64 - 600).abs() <= 15, "{med}");
        assert!(v[0] >= 100 && v[v.len() - 1] <= 1100);
    }

    #[test]
    fn histogram_sampling_stays_in_bins() {
        let bins = vec![
            HistBin {
                lo: 0,
                hi: 10,
                count: 1,
            },
            HistBin {
                lo: 100,
                hi: 200,
                count: 3,
            },
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let v: Vec<u64> = (0..4000)
            .map(|_| sample_histogram(&bins, &mut rng))
            .collect();
        assert!(v
            .iter()
            .all(|&l| (1..=10).contains(&l) || (100..=200).contains(&l)));
        let big = v.iter().filter(|&&l| l >= 100).count() as f64 / 4000.0;
        assert!((big - 0.75).abs() < 0.03, "{big}");
    }

    #[test]
    fn csv_round_trip() {
        let t = generate(&Source::Pile, 100, 2).unwrap();
        assert_eq!(Trace::from_csv_str(&t.to_csv()).unwrap(), t);
    }
}
