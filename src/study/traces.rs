//! Trace specs as written in study configs.
//!
//! * `default` — the bundled trace (`traces/default.csv`).
//! * `gen:SOURCE[:key=value,...]` — generated: SOURCE is a `fcp trace gen` source
//!   (`wlb-llm`, `prolong`, `magi`, `pile`, `redpajama`, `lognormal`) or `exponential`.
//!   Keys: `seed` (default 1), `docs` (at most [`MAX_GEN_DOCS`]; default: as many as the
//!   largest cell needs, so every cell of a sweep sees a prefix of the same stream), and for
//!   `exponential` `mean` (required), `max` (cap), for `lognormal` `mean`, `sigma`, `max`;
//!   `max` is at most [`MAX_DOC_LEN`], as in every other trace.
//! * anything else — a trace file (CSV or JSONL), relative to the working directory.
//!
//! `exponential` is the "balancing compute" note's length model (seeds/003):
//! `min(floor(Exp(mean)), max)` (`max` defaults to [`MAX_DOC_LEN`]), raised to 1 token because
//! a document is never empty.

use std::path::Path;

use crate::trace::{
    default_trace, generate, pack_first, Lognormal, PackOptions, Source, Trace, MAX_DOC_LEN,
};

use super::StudyError;

/// The most documents a `gen:` trace holds: it is generated in memory (about 32 bytes a
/// document, half a gigabyte at the cap), and `docs=100000000000` ran the machine out of
/// memory. It is where the default `docs` stops growing too, and above the 10M-document traces
/// of docs/performance.md. (`fcp trace gen` writes each length as it draws it, so its `--docs`
/// needs no cap.)
pub const MAX_GEN_DOCS: usize = 1 << 24;

/// A parsed trace spec.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceSpec {
    /// The bundled trace.
    Default,
    /// A file.
    File(String),
    /// Generated documents.
    Gen {
        /// Source name (`exponential` or a [`Source`] name).
        source: String,
        /// RNG seed.
        seed: u64,
        /// Number of documents; `None`: enough for the sweep.
        docs: Option<usize>,
        /// Mean length (exponential, lognormal).
        mean: Option<f64>,
        /// Lognormal sigma.
        sigma: Option<f64>,
        /// Length cap.
        max: Option<u64>,
    },
}

impl TraceSpec {
    /// Parse a spec (does not read or generate anything). A file of that name wins, as in
    /// `compare --trace` (bug hunt: with a file named `gen:pile:seed=1` in the working
    /// directory, a sweep cell generated the trace and `compare` read the file, so the cell
    /// could not be rerun as one command).
    pub fn parse(text: &str) -> Result<TraceSpec, StudyError> {
        let bad = |m: String| StudyError::Config(format!("trace `{text}`: {m}"));
        if Path::new(text).exists() {
            return Ok(TraceSpec::File(text.to_string()));
        }
        if text == "default" {
            return Ok(TraceSpec::Default);
        }
        let Some(rest) = text.strip_prefix("gen:") else {
            return Ok(TraceSpec::File(text.to_string()));
        };
        let (source, params) = match rest.split_once(':') {
            Some((s, p)) => (s, p),
            None => (rest, ""),
        };
        Source::from_name(source).map_err(|e| bad(e.to_string()))?;
        let (mut seed, mut docs, mut mean, mut sigma, mut max) = (1, None, None, None, None);
        let mut given: Vec<&str> = Vec::new();
        for kv in params.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("`{kv}` is not key=value")))?;
            // Bug hunt: `docs=10,docs=20` took the last without a word; keys are given once,
            // as everywhere else.
            if given.contains(&k) {
                return Err(bad(format!("`{k}` is given twice")));
            }
            given.push(k);
            let int = || {
                v.parse::<u64>()
                    .ok()
                    .filter(|&x| x >= 1)
                    .ok_or_else(|| bad(format!("`{k}` must be an integer ≥ 1, not `{v}`")))
            };
            let real = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| bad(format!("`{k}` must be a positive number, not `{v}`")))
            };
            match k {
                "seed" => seed = v.parse().map_err(|_| bad(format!("bad seed `{v}`")))?,
                "docs" => {
                    let n = int()?;
                    if n > MAX_GEN_DOCS as u64 {
                        return Err(bad(format!(
                            "`docs` is {n}, more than the {MAX_GEN_DOCS} documents a generated \
                             trace may hold"
                        )));
                    }
                    docs = Some(n as usize);
                }
                "mean" => mean = Some(real()?),
                "sigma" => sigma = Some(real()?),
                "max" => {
                    let n = int()?;
                    if n > MAX_DOC_LEN {
                        return Err(bad(format!(
                            "`max` is {n}, above the {MAX_DOC_LEN} tokens a document may have"
                        )));
                    }
                    max = Some(n);
                }
                _ => {
                    return Err(bad(format!(
                        "unknown key `{k}` (seed, docs, mean, sigma, max)"
                    )))
                }
            }
        }
        match source {
            "exponential" if mean.is_none() => return Err(bad("exponential needs mean=".into())),
            // Bug hunt: `sigma` was dropped without a word, so one trace ran as several cells.
            "exponential" if sigma.is_some() => {
                return Err(bad(
                    "exponential takes mean and max; sigma applies to lognormal".into(),
                ))
            }
            "exponential" | "lognormal" => {}
            _ if mean.is_some() || sigma.is_some() || max.is_some() => {
                return Err(bad(format!(
                    "{source} is a fixed distribution; mean/sigma/max apply to exponential and lognormal"
                )))
            }
            _ => {}
        }
        Ok(TraceSpec::Gen {
            source: source.to_string(),
            seed,
            docs,
            mean,
            sigma,
            max,
        })
    }

    /// Load or generate the trace; a generated one without `docs` grows until it holds at
    /// least `need_tokens` tokens (doubling, so every size is a prefix of the same stream).
    pub fn load(&self, need_tokens: u64) -> Result<Trace, StudyError> {
        self.grow(|t| Ok(t.tokens() >= need_tokens))
    }

    /// [`TraceSpec::load`] for `batches` batches under each of `packings`: a generated trace
    /// grows until each packs into more than `batches` batches (the last one asked for then
    /// closed, as in any longer prefix) and holds the tokens they may take. Raw tokens alone
    /// stopped short where packing drops some (budget truncation, window rests, WLB cuts):
    /// magi at a 16K budget packed 98 batches of the 101 asked for (bug hunt). `batches` of
    /// `usize::MAX` (every batch) grows by tokens, as `load`.
    pub fn load_for(&self, packings: &[PackOptions], batches: usize) -> Result<Trace, StudyError> {
        let mut need = 0u64;
        for p in packings {
            need = need.max(p.tokens_to_fill(batches)?);
        }
        self.grow(|t| {
            if t.tokens() < need {
                return Ok(false);
            }
            if batches == usize::MAX {
                return Ok(true);
            }
            for p in packings {
                if pack_first(t, p, 0)?.total_batches <= batches {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The trace; a generated one without `docs` doubled from 1,024 documents until `enough`
    /// (or [`MAX_GEN_DOCS`]).
    fn grow(
        &self,
        enough: impl Fn(&Trace) -> Result<bool, StudyError>,
    ) -> Result<Trace, StudyError> {
        match self {
            TraceSpec::Default => Ok(default_trace()),
            TraceSpec::File(p) => Ok(Trace::load(Path::new(p))?),
            TraceSpec::Gen { docs: Some(n), .. } => self.generate(*n),
            TraceSpec::Gen { docs: None, .. } => {
                let mut n = 1024usize;
                loop {
                    let t = self.generate(n)?;
                    if n >= MAX_GEN_DOCS || enough(&t)? {
                        return Ok(t);
                    }
                    n *= 2;
                }
            }
        }
    }

    fn generate(&self, docs: usize) -> Result<Trace, StudyError> {
        let TraceSpec::Gen {
            source,
            seed,
            mean,
            sigma,
            max,
            ..
        } = self
        else {
            return Err(StudyError::Config("not a generated trace".into()));
        };
        match source.as_str() {
            "exponential" => Ok(generate(
                &Source::Exponential {
                    mean: mean.unwrap_or(1024.0),
                    max: max.unwrap_or(MAX_DOC_LEN),
                },
                docs,
                *seed,
            )?),
            "lognormal" if mean.is_some() || sigma.is_some() || max.is_some() => {
                let d = Lognormal::megatron_default();
                let sigma = sigma.unwrap_or(d.sigma);
                let mean = mean.unwrap_or_else(|| (d.mu + d.sigma * d.sigma / 2.0).exp());
                let p = Lognormal::from_mean(mean, sigma, d.min, max.unwrap_or(d.max))?;
                Ok(generate(&Source::Lognormal(p), docs, *seed)?)
            }
            name => Ok(generate(&Source::from_name(name)?, docs, *seed)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::PackMode;

    /// Regression (bug hunt): a generated trace grew until its raw tokens filled the batches,
    /// but budget packing drops what does not fit: magi at 2 × 8K packed 98 of the 101
    /// batches asked for. It grows until the packing itself yields them, each batch as in a
    /// longer prefix of the same stream.
    #[test]
    fn regression_a_generated_trace_grows_until_it_packs_the_batches() {
        let spec = TraceSpec::parse("gen:magi:seed=1").unwrap();
        let budget = PackOptions {
            mode: PackMode::Budget,
            ranks: 2,
            tokens_per_rank: 8192,
            context: None,
        };
        let by_tokens = spec.load(budget.tokens_to_fill(101).unwrap()).unwrap();
        assert!(pack_first(&by_tokens, &budget, 0).unwrap().total_batches < 101);
        let t = spec.load_for(std::slice::from_ref(&budget), 101).unwrap();
        let packed = pack_first(&t, &budget, 101).unwrap();
        assert!(packed.total_batches > 101);
        let longer = spec.load_for(std::slice::from_ref(&budget), 1000).unwrap();
        assert_eq!(
            pack_first(&longer, &budget, 101).unwrap().batches,
            packed.batches
        );
    }

    /// Regression (bug hunt): a file named like a spec is read, as `compare --trace` reads it.
    #[test]
    fn regression_a_file_named_like_a_spec_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gen:pile:seed=1");
        std::fs::write(&path, "doc_len\n100\n").unwrap();
        let text = path.display().to_string();
        assert_eq!(
            TraceSpec::parse(&text).unwrap(),
            TraceSpec::File(text.clone())
        );
        assert!(matches!(
            TraceSpec::parse("gen:pile:seed=1").unwrap(),
            TraceSpec::Gen { .. }
        ));
    }

    #[test]
    fn specs_parse_and_generate_prefix_consistently() {
        assert_eq!(TraceSpec::parse("default").unwrap(), TraceSpec::Default);
        assert!(matches!(
            TraceSpec::parse("traces/x.csv").unwrap(),
            TraceSpec::File(_)
        ));
        let s = TraceSpec::parse("gen:exponential:mean=1024,max=8192,seed=3").unwrap();
        let small = s.generate(100).unwrap().lens();
        let big = s.load(1_000_000).unwrap().lens();
        assert_eq!(&big[..100], &small[..]);
        assert!(big.iter().all(|&l| (1..=8192).contains(&l)));
        let mean = big.iter().sum::<u64>() as f64 / big.len() as f64;
        assert!((mean - 1024.0).abs() < 80.0, "{mean}");
        assert!(TraceSpec::parse("gen:nope").is_err());
        assert!(TraceSpec::parse("gen:exponential").is_err());
        assert!(TraceSpec::parse("gen:wlb-llm:mean=3").is_err());
        // Regression (bug hunt): `sigma` was dropped from an exponential without a word.
        let e = TraceSpec::parse("gen:exponential:mean=2048,sigma=0.1").unwrap_err();
        assert!(e.to_string().contains("sigma applies to lognormal"), "{e}");
        assert!(TraceSpec::parse("gen:wlb-llm:docs=0").is_err());
        let w = TraceSpec::parse("gen:wlb-llm:docs=50").unwrap();
        assert_eq!(w.load(u64::MAX).unwrap().docs.len(), 50);
    }

    /// Regression (bug hunt): `gen:exponential:mean=1e30` clamped to u64::MAX, not to the 2³²
    /// tokens every other trace holds, so `fcp plot cdf` titled its plot with a token total
    /// that had wrapped around; a `max` above 2³² was taken too.
    #[test]
    fn exponential_lengths_are_capped_at_max_doc_len() {
        let huge = TraceSpec::parse("gen:exponential:mean=1e30,docs=3").unwrap();
        let t = huge.load(0).unwrap();
        assert_eq!(t.lens(), vec![MAX_DOC_LEN; 3]);
        assert_eq!(t.tokens(), 3 * MAX_DOC_LEN);
        let at_cap = format!("gen:exponential:mean=1e30,docs=2,max={MAX_DOC_LEN}");
        assert_eq!(
            TraceSpec::parse(&at_cap).unwrap().load(0).unwrap().lens(),
            vec![MAX_DOC_LEN; 2]
        );
        for source in ["exponential:mean=5,", "lognormal:"] {
            let spec = format!("gen:{source}max={}", MAX_DOC_LEN + 1);
            let e = TraceSpec::parse(&spec).unwrap_err().to_string();
            assert!(
                e.contains("`max` is 4294967297, above the 4294967296 tokens a document may have"),
                "{e}"
            );
        }
    }

    /// Regression (bug hunt): `gen:wlb-llm:docs=10,docs=20` generated 20 documents without a
    /// word about the 10.
    #[test]
    fn a_key_given_twice_is_refused() {
        let e = TraceSpec::parse("gen:wlb-llm:docs=10,docs=20")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`docs` is given twice"), "{e}");
        assert!(TraceSpec::parse("gen:wlb-llm:docs=10,seed=2").is_ok());
    }

    /// Regression (bug hunt): `docs=100000000000` had no bound and generated in memory until
    /// the machine ran out; it is a config error naming the limit, as `batches` is.
    #[test]
    fn docs_beyond_max_gen_docs_is_a_config_error() {
        let e = TraceSpec::parse("gen:wlb-llm:docs=100000000000")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`docs` is 100000000000, more than the 16777216 documents"),
            "{e}"
        );
        assert!(matches!(
            TraceSpec::parse(&format!("gen:magi:docs={MAX_GEN_DOCS}")),
            Ok(TraceSpec::Gen {
                docs: Some(MAX_GEN_DOCS),
                ..
            })
        ));
        let over = format!("gen:exponential:mean=9,docs={}", MAX_GEN_DOCS + 1);
        assert!(TraceSpec::parse(&over).is_err());
    }
}
