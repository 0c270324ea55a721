//! `fcp trace ...`: generate, summarise and pack document-length traces.
//!
//! Every command is a thin wrapper over `fcp::trace`; errors bubble up as `anyhow` errors,
//! which `cli::main` prints as `error: ...` with exit code 2. Files are written atomically, so
//! a failing command never leaves a partial (or empty) output file behind.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use fcp::output::{write_atomic, AtomicFile};
use fcp::trace::{self, DocReader, Lognormal, PackMode, PackOptions, Source, Trace, TraceError};

/// Trace commands.
#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Generate a synthetic trace (CSV with header `doc_len`), deterministic per seed.
    Gen(GenArgs),
    /// Summarise a trace: count, tokens, mean, percentiles, long-document shares.
    Stats(StatsArgs),
    /// Pack a trace into batches and print them.
    Pack(PackCmdArgs),
    /// Derive a quantile table from a JSON array of lengths (regenerates traces/*-quantiles.csv).
    #[command(hide = true)]
    DeriveQuantiles(DeriveArgs),
}

#[derive(Debug, Args)]
struct GenArgs {
    /// Source: lognormal, magi, wlb-llm, prolong, pile, redpajama, exponential (see
    /// docs/traces.md).
    #[arg(long)]
    source: String,
    /// Number of documents.
    #[arg(long, default_value_t = 10_000)]
    docs: usize,
    /// RNG seed (same arguments and seed give a byte-identical file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file (`-` for stdout).
    #[arg(short = 'o', long = "output", default_value = "-")]
    output: PathBuf,
    /// lognormal: arithmetic mean before clipping (default 1024, Megatron DCP); exponential:
    /// its mean (default 1024).
    #[arg(long, conflicts_with = "median")]
    mean: Option<f64>,
    /// lognormal: median (instead of --mean).
    #[arg(long)]
    median: Option<f64>,
    /// lognormal: σ of ln(length) (default 1.5).
    #[arg(long)]
    sigma: Option<f64>,
    /// lognormal: clip floor (default 128).
    #[arg(long)]
    min: Option<u64>,
    /// lognormal: clip ceiling (default 8192); exponential: cap (default 2³² tokens).
    #[arg(long)]
    max: Option<u64>,
}

#[derive(Debug, Args)]
struct StatsArgs {
    /// Trace file (CSV, or JSONL by extension); `-` for stdin.
    file: PathBuf,
    /// Print JSON (keys: docs tokens mean p50 p90 p99 max above).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PackCmdArgs {
    /// Trace file (CSV, or JSONL by extension); `-` for stdin.
    file: PathBuf,
    /// Ranks in the CP group.
    #[arg(long)]
    ranks: u32,
    /// Tokens each rank holds (budget and carry modes; default 32768). Window packing sizes
    /// batches by `--context` alone.
    #[arg(long)]
    tokens_per_rank: Option<u64>,
    #[command(flatten)]
    pack: PackArgs,
    /// Model whose FLOPs weigh attention against the linear layers in WLB packing
    /// (--wlb-breakpoint's default): a preset or a TOML file (default llama3-70b).
    #[arg(long)]
    model: Option<String>,
    /// Print JSON: {"batches": [{"index", "tokens", "doc_lens"}], "truncated"}.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DeriveArgs {
    /// JSON array of document lengths (e.g. DistCA's dist_wlbllm.json).
    #[arg(long)]
    input: PathBuf,
    /// Provenance written into the `# source:` line.
    #[arg(long)]
    source_note: String,
    /// Output CSV (`-` for stdout).
    #[arg(short = 'o', long = "output", default_value = "-")]
    output: PathBuf,
}

/// Packing mode names on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PackModeArg {
    /// Whole documents up to ranks × tokens-per-rank (FCP).
    Budget,
    /// Fixed --context windows; the crossing document is truncated (FlashCP).
    Window,
    /// Budget batches; the crossing document carries over to the next batch.
    Carry,
    /// WLB-LLM: each step's documents repacked into micro-batches of equal work, outliers
    /// delayed.
    Wlb,
}

/// What WLB packing takes from the command around it when the user does not say: how many
/// micro-batches a step has, and the model's attention breakpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct WlbHints {
    /// Windows of one training step (`--micro-batches × --dp`), where the command prices one.
    pub group: Option<u32>,
    /// [`fcp::model::Model::attention_breakpoint`] of the command's model.
    pub breakpoint: Option<u64>,
}

impl WlbHints {
    /// Hints from `model`, with a step of `group` windows if the command prices one.
    pub fn new(model: &fcp::model::Model, group: Option<u32>) -> WlbHints {
        WlbHints {
            group,
            breakpoint: model.attention_breakpoint(),
        }
    }
}

/// How a trace is packed into batches; flattened into every command that packs a trace.
#[derive(Debug, Clone, clap::Args)]
pub struct PackArgs {
    /// Packing: budget (FCP), window (FlashCP), carry (split docs carry over), wlb (WLB-LLM:
    /// each step's micro-batches of equal work and unequal length, outliers delayed).
    #[arg(long = "pack", value_enum, default_value_t = PackModeArg::Budget)]
    pub pack: PackModeArg,
    /// Context window in tokens (window mode). `None`: not given, [`DEFAULT_CONTEXT`]; told
    /// apart so that commands can refuse it with another mode ([`PackArgs::check_context`]).
    /// The help text states the default as clap would.
    #[arg(
        long,
        help = "Context window in tokens (window and wlb modes) [default: 131072]",
        long_help = "Context window in tokens (window and wlb modes)\n\n[default: 131072]"
    )]
    pub context: Option<u64>,
    #[command(flatten)]
    pub wlb: WlbArgs,
}

/// WLB packing's flags; flattened into [`PackArgs`], and into `fcp tpcp`, which packs its
/// own windows.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WlbArgs {
    /// WLB packing: micro-batches balanced together, every window of a training step
    /// (default: --micro-batches × --dp where the command prices a step, else 8).
    #[arg(long)]
    pub wlb_group: Option<u32>,
    /// WLB packing: the most tokens one micro-batch may hold (default: twice --context).
    #[arg(long)]
    pub wlb_max_len: Option<u64>,
    /// WLB packing: documents this long or longer wait as outliers until every micro-batch of
    /// a step can take one (default: half of --context).
    #[arg(long)]
    pub wlb_outlier: Option<u64>,
    /// WLB packing: the document length whose attention costs as much as its projections and
    /// MLP; a document's work is len + len²/this (default: from the model's FLOPs, 104,448
    /// for llama3-70b).
    #[arg(long)]
    pub wlb_breakpoint: Option<u64>,
}

impl WlbArgs {
    /// The settings as the library takes them.
    pub fn settings(&self) -> fcp::trace::WlbSettings {
        fcp::trace::WlbSettings {
            group: self.wlb_group,
            max_len: self.wlb_max_len,
            outlier: self.wlb_outlier,
            breakpoint: self.wlb_breakpoint,
        }
    }

    /// Refuse a flag given where WLB packing is not asked for (`wlb` false), which would
    /// ignore it; `ask` says how to ask for it.
    pub fn check(&self, wlb: bool, ask: &str) -> anyhow::Result<()> {
        if wlb {
            return Ok(());
        }
        match self
            .settings()
            .fields()
            .into_iter()
            .find(|(_, v)| v.is_some())
        {
            Some((key, _)) => anyhow::bail!("{} applies only to {ask}", flag(key)),
            None => Ok(()),
        }
    }

    /// The flags that repeat the settings given, after `--wlb-group` (which is always said,
    /// resolved).
    fn flags(&self) -> String {
        self.settings()
            .fields()
            .into_iter()
            .filter(|&(key, _)| key != "group")
            .filter_map(|(key, v)| v.map(|v| format!(" {} {v}", flag(key))))
            .collect()
    }
}

/// The flag of a WLB setting's key ([`fcp::trace::WlbSettings::fields`]): `max_len` is
/// `--wlb-max-len`.
fn flag(key: &str) -> String {
    format!("--wlb-{}", key.replace('_', "-"))
}

/// The context window of `--pack window` when `--context` is not given.
pub use fcp::trace::DEFAULT_CONTEXT;

impl Default for PackArgs {
    /// Budget packing, as the FCP paper does (§6.1).
    fn default() -> Self {
        PackArgs {
            pack: PackModeArg::Budget,
            context: None,
            wlb: WlbArgs::default(),
        }
    }
}

impl PackArgs {
    /// The context window: `--context`, else [`DEFAULT_CONTEXT`].
    pub fn context(&self) -> u64 {
        self.context.unwrap_or(DEFAULT_CONTEXT)
    }

    /// Refuse `--context` with a packing mode that ignores it, as `fcp sweep` refuses
    /// `grid.context` without `pack = "window"`. (`fcp trace pack` keeps taking it with every
    /// mode, so one command line can pack a trace each way, and notes that it is ignored.)
    pub fn check_context(&self) -> Result<(), TraceError> {
        self.mode(WlbHints::default()).check_context(
            self.context.is_some(),
            "--context",
            "--pack window or --pack wlb",
        )
    }

    /// Refuse a `--wlb-*` setting without `--pack wlb`, which would ignore it.
    pub fn check_wlb(&self) -> anyhow::Result<()> {
        self.wlb.check(self.pack == PackModeArg::Wlb, "--pack wlb")
    }

    /// Under `--pack wlb` with no breakpoint from the flag or the model (one without
    /// `hidden` and `ffn_hidden`), say that documents are weighed by attention alone (bug
    /// hunt: it happened without a word). Said once a process.
    pub fn wlb_weight_note(&self, hints: WlbHints) {
        static SAID: std::sync::Once = std::sync::Once::new();
        if self.pack == PackModeArg::Wlb
            && self.wlb.settings().breakpoint.is_none()
            && hints.breakpoint.is_none()
        {
            SAID.call_once(|| eprintln!("note: the model gives no `hidden` and `ffn_hidden`: WLB packing weighs each document by its attention alone (len²); --wlb-breakpoint weighs the linear layers in"));
        }
    }

    /// The library's packing mode, WLB's settings filled in from `hints` where not given.
    pub fn mode(&self, hints: WlbHints) -> PackMode {
        match self.pack {
            PackModeArg::Budget => PackMode::Budget,
            PackModeArg::Window => PackMode::Window,
            PackModeArg::Carry => PackMode::Carry,
            PackModeArg::Wlb => PackMode::Wlb(self.wlb.settings().resolve(
                self.context(),
                hints.group,
                hints.breakpoint,
            )),
        }
    }

    /// Tokens per rank: `given`, else this packing mode's default
    /// ([`fcp::trace::PackMode::default_tokens_per_rank`]).
    pub fn tokens_per_rank(&self, ranks: u32, given: Option<u64>) -> u64 {
        given.unwrap_or_else(|| {
            self.mode(WlbHints::default())
                .default_tokens_per_rank(ranks, self.context())
        })
    }

    /// Refuse a `--tokens-per-rank` below a rank's even share of a window under window or
    /// WLB packing, where it is the cap memory-capped schemes plan under: a full window cannot
    /// fit it, and the planners quietly planned under the share instead (bug hunt: three
    /// caps gave byte-identical plans recording another).
    pub fn check_tokens_per_rank(&self, ranks: u32, given: Option<u64>) -> anyhow::Result<()> {
        let (Some(t), PackModeArg::Window | PackModeArg::Wlb) = (given, self.pack) else {
            return Ok(());
        };
        let mode = self.mode(WlbHints::default());
        let share = mode.default_tokens_per_rank(ranks, self.context());
        if t < share {
            let window = match mode {
                PackMode::Wlb(p) => format!("--wlb-max-len {} tokens", p.max_len),
                _ => format!("--context {} window", self.context()),
            };
            anyhow::bail!(
                "--tokens-per-rank {t} is less than each of the {ranks} ranks' share of a {window} ({share}): under --pack {} it is the token cap fcp and hybrid plan under, and a full window cannot fit it; give at least {share}, or leave it out (the share is the default)",
                if matches!(mode, PackMode::Wlb(_)) { "wlb" } else { "window" }
            );
        }
        Ok(())
    }

    /// Library options for a CP group of `ranks` ranks holding `tokens_per_rank` tokens each.
    pub fn options(&self, ranks: u32, tokens_per_rank: u64, hints: WlbHints) -> PackOptions {
        PackOptions {
            mode: self.mode(hints),
            ranks,
            tokens_per_rank,
            context: Some(self.context()),
        }
    }

    /// The flags that make another command pack as this one did, `hints` resolved (empty
    /// for budget packing, the default).
    pub fn flags(&self, hints: WlbHints) -> String {
        match self.mode(hints) {
            PackMode::Budget => String::new(),
            PackMode::Window => format!(" --pack window --context {}", self.context()),
            PackMode::Carry => " --pack carry".to_string(),
            PackMode::Wlb(p) => format!(
                " --pack wlb --context {} --wlb-group {}{}",
                self.context(),
                p.group,
                self.wlb.flags()
            ),
        }
    }
}

/// Run a trace command.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    match args.command {
        TraceCommand::Gen(a) => gen(a),
        TraceCommand::Stats(a) => stats(a),
        TraceCommand::Pack(a) => pack(a),
        TraceCommand::DeriveQuantiles(a) => derive(a),
    }
}

fn gen(a: GenArgs) -> anyhow::Result<()> {
    let mut source = Source::from_name(&a.source)?;
    let tuned = a.mean.is_some()
        || a.median.is_some()
        || a.sigma.is_some()
        || a.min.is_some()
        || a.max.is_some();
    if let Source::Exponential { .. } = source {
        // Bug hunt: a sweep's `gen:exponential:...` could not be written out as a file.
        if a.median.is_some() || a.sigma.is_some() || a.min.is_some() {
            anyhow::bail!("--median/--sigma/--min apply only to --source lognormal; exponential takes --mean and --max");
        }
        let mean = a.mean.unwrap_or(1024.0);
        if !(mean.is_finite() && mean > 0.0) {
            anyhow::bail!("--mean must be a positive number, not {mean}");
        }
        let max = a.max.unwrap_or(trace::MAX_DOC_LEN);
        if max == 0 || max > trace::MAX_DOC_LEN {
            anyhow::bail!(
                "--max must be from 1 to {} tokens, not {max}",
                trace::MAX_DOC_LEN
            );
        }
        source = Source::Exponential { mean, max };
    } else if let Source::Lognormal(_) = source {
        let sigma = a.sigma.unwrap_or(1.5);
        let (min, max) = (a.min.unwrap_or(128), a.max.unwrap_or(8192));
        source = Source::Lognormal(match a.median {
            Some(m) => Lognormal::from_median(m, sigma, min, max)?,
            None => Lognormal::from_mean(a.mean.unwrap_or(1024.0), sigma, min, max)?,
        });
    } else if tuned {
        anyhow::bail!(
            "--mean/--median/--sigma/--min/--max apply only to --source lognormal (and --mean/--max to exponential), not {}",
            source.name()
        );
    }
    if a.docs == 0 {
        anyhow::bail!("--docs must be ≥ 1");
    }
    // Streamed: each length is written as it is drawn, so memory does not grow with --docs.
    let lens = trace::Generator::new(&source, a.seed)?.take(a.docs);
    let write = |out: &mut dyn Write| -> std::io::Result<()> {
        out.write_all(b"doc_len\n")?;
        for len in lens {
            writeln!(out, "{len}")?;
        }
        Ok(())
    };
    if a.output == Path::new("-") {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        write(&mut out)?;
        out.flush()?;
        return Ok(());
    }
    let ctx = || format!("cannot write {}", a.output.display());
    let mut f = AtomicFile::create(&a.output).with_context(ctx)?;
    write(&mut f).with_context(ctx)?;
    f.commit().with_context(ctx)
}

/// Streamed: one pass over the file with exact counts per distinct length (see
/// [`trace::StatsAccumulator`]), so a 10M-document trace needs megabytes, not gigabytes.
fn stats(a: StatsArgs) -> anyhow::Result<()> {
    let mut acc = trace::StatsAccumulator::default();
    for doc in DocReader::open(&a.file)? {
        acc.push(doc?.len);
    }
    let s = acc.finish()?;
    let text = if a.json {
        let mut j = serde_json::to_string_pretty(&s)?;
        j.push('\n');
        j
    } else {
        s.to_table()
    };
    emit(Path::new("-"), text.as_bytes())
}

/// Streamed for unpinned traces in a regular file: a first pass packs without keeping batches
/// to count them (the summary line comes first, and a bad line fails before anything is
/// printed), a second prints each batch as it closes. Pinned traces (batch ids may repeat
/// anywhere) and anything that cannot be read twice ([`fcp::input::can_read_twice`]) are read whole, once.
fn pack(a: PackCmdArgs) -> anyhow::Result<()> {
    // Other commands refuse `--context` without `--pack window`; `trace pack` has always
    // taken it with every mode (one command line packs a trace each way), so it only says so.
    if let Err(e) = a.pack.check_context() {
        let mode = a
            .pack
            .pack
            .to_possible_value()
            .map(|v| v.get_name().to_owned());
        eprintln!("note: {e}; ignored by --pack {}", mode.unwrap_or_default());
    }
    a.pack.check_wlb()?;
    // Bug hunt: a bad --model passed without a word unless it was used.
    let model = fcp::model::Model::load(a.model.as_deref().unwrap_or("llama3-70b"))?;
    let hints = if a.pack.pack == PackModeArg::Wlb {
        let hints = WlbHints::new(&model, None);
        a.pack.wlb_weight_note(hints);
        hints
    } else {
        if a.model.is_some() {
            eprintln!("note: --model weighs documents in WLB packing only; ignored by this --pack");
        }
        WlbHints::default()
    };
    let opts = a.pack.options(
        a.ranks,
        a.pack.tokens_per_rank(a.ranks, a.tokens_per_rank),
        hints,
    );
    let stream = fcp::input::can_read_twice(&a.file) && !DocReader::open(&a.file)?.is_pinned();
    if !stream {
        let p = trace::pack(&Trace::load(&a.file)?, &opts)?;
        return emit(Path::new("-"), packed_text(&p, a.json)?.as_bytes());
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let (mut batches, mut tokens) = (0usize, 0u64);
    let mut packer = trace::Packer::new(&opts)?;
    let mut count = |b: trace::Batch| {
        batches += 1;
        tokens += b.tokens();
    };
    for doc in DocReader::open(&a.file)? {
        packer.push(doc?.len, &mut count);
    }
    let truncated = packer.finish(&mut count);

    let mut w = PackWriter::start(&mut out, a.json, batches, tokens, truncated)?;
    let mut packer = trace::Packer::new(&opts)?;
    let mut failed: std::io::Result<()> = Ok(());
    let mut print = |b: trace::Batch| {
        if failed.is_ok() {
            failed = w.batch(&b);
        }
    };
    for doc in DocReader::open(&a.file)? {
        packer.push(doc?.len, &mut print);
    }
    packer.finish(&mut print);
    failed?;
    w.end()?;
    Ok(out.flush()?)
}

/// `fcp trace pack` output of packed batches in memory: the whole value pretty-printed at once.
fn packed_text(p: &trace::Packed, json: bool) -> anyhow::Result<String> {
    Ok(if json {
        let batches: Vec<_> = p
            .batches
            .iter()
            .map(|b| serde_json::json!({"index": b.index, "tokens": b.tokens(), "doc_lens": b.doc_lens}))
            .collect();
        let mut j = serde_json::to_string_pretty(
            &serde_json::json!({"batches": batches, "truncated": p.truncated}),
        )?;
        j.push('\n');
        j
    } else {
        let mut s = format!(
            "{} batches, {} tokens, {} truncated documents\n",
            p.batches.len(),
            p.tokens(),
            p.truncated
        );
        for b in &p.batches {
            s.push_str(&format!(
                "batch {:>5}: {:>5} docs {:>10} tokens\n",
                b.index,
                b.doc_lens.len(),
                b.tokens()
            ));
        }
        s
    })
}

/// Prints `fcp trace pack` output batch by batch, byte-identical to [`packed_text`] (a test
/// compares the two: a file is streamed, stdin is packed in memory).
struct PackWriter<'a, W: Write> {
    out: &'a mut W,
    json: bool,
    first: bool,
    truncated: usize,
}

impl<'a, W: Write> PackWriter<'a, W> {
    fn start(
        out: &'a mut W,
        json: bool,
        batches: usize,
        tokens: u64,
        truncated: usize,
    ) -> std::io::Result<Self> {
        if json {
            out.write_all(b"{\n  \"batches\": [")?;
            if batches == 0 {
                out.write_all(b"]")?;
            }
        } else {
            writeln!(
                out,
                "{batches} batches, {tokens} tokens, {truncated} truncated documents"
            )?;
        }
        Ok(PackWriter {
            out,
            json,
            first: true,
            truncated,
        })
    }

    fn batch(&mut self, b: &trace::Batch) -> std::io::Result<()> {
        if !self.json {
            return writeln!(
                self.out,
                "batch {:>5}: {:>5} docs {:>10} tokens",
                b.index,
                b.doc_lens.len(),
                b.tokens()
            );
        }
        let v = serde_json::json!({"index": b.index, "tokens": b.tokens(), "doc_lens": b.doc_lens});
        let text = serde_json::to_string_pretty(&v).map_err(std::io::Error::other)?;
        self.out
            .write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        for (i, line) in text.lines().enumerate() {
            if i > 0 {
                self.out.write_all(b"\n")?;
            }
            write!(self.out, "    {line}")?;
        }
        Ok(())
    }

    fn end(self) -> std::io::Result<()> {
        if !self.json {
            return Ok(());
        }
        if !self.first {
            self.out.write_all(b"\n  ]")?;
        }
        writeln!(self.out, ",\n  \"truncated\": {}\n}}", self.truncated)
    }
}

fn derive(a: DeriveArgs) -> anyhow::Result<()> {
    super::common::refuse_overwriting_input(&a.output, &[&a.input])?;
    let text = fcp::input::read_text(&a.input, "a JSON file of lengths", false)
        .with_context(|| format!("cannot read {}", a.input.display()))?;
    let lens =
        trace::parse_json_lengths(&text).with_context(|| format!("in {}", a.input.display()))?;
    let q = trace::derive_quantiles(&lens)?;
    let name = |p: &Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let comments = vec![
        format!("source: {}", a.source_note),
        format!(
            "derived by: fcp trace derive-quantiles --input {} --source-note '{}' -o {}",
            name(&a.input),
            a.source_note,
            name(&a.output)
        ),
        format!(
            "definition: nearest-rank quantiles of {} lengths at p = 0..0.99 step 0.001, then 0.99..1 step 0.0001 (p0 = min, p1 = exact max)",
            lens.len()
        ),
        "sampling: inverse CDF, log-linear interpolation between neighbouring rows".to_string(),
    ];
    emit(
        &a.output,
        trace::quantile_table_csv(&q, &comments).as_bytes(),
    )
}

/// Write to stdout (`-`) or atomically to a file.
fn emit(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        out.flush()?;
        return Ok(());
    }
    write_atomic(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_args_to_options() {
        let a = PackArgs {
            pack: PackModeArg::Window,
            context: Some(4096),
            ..PackArgs::default()
        };
        let o = a.options(8, 1000, WlbHints::default());
        assert_eq!(o.mode, PackMode::Window);
        assert_eq!(
            (o.ranks, o.tokens_per_rank, o.context),
            (8, 1000, Some(4096))
        );
    }

    /// WLB packing takes its group from the step and its breakpoint from the model unless the
    /// user says; its defaults follow the window; per-rank tokens default to the longest
    /// micro-batch's share.
    #[test]
    fn wlb_settings_come_from_the_user_then_the_command() {
        let mut a = PackArgs {
            pack: PackModeArg::Wlb,
            context: Some(4096),
            ..PackArgs::default()
        };
        let hints = WlbHints {
            group: Some(6),
            breakpoint: Some(1000),
        };
        let want = |group, max_len, outlier, breakpoint| {
            PackMode::Wlb(fcp::trace::WlbParams {
                group,
                max_len,
                outlier,
                breakpoint,
            })
        };
        assert_eq!(a.mode(hints), want(6, 8192, 2048, Some(1000)));
        assert_eq!(
            a.mode(WlbHints::default()),
            want(fcp::trace::DEFAULT_WLB_GROUP, 8192, 2048, None)
        );
        assert_eq!(a.tokens_per_rank(8, None), 1024);
        a.wlb = WlbArgs {
            wlb_group: Some(3),
            wlb_max_len: Some(5000),
            wlb_outlier: Some(100),
            wlb_breakpoint: Some(7),
        };
        assert_eq!(a.mode(hints), want(3, 5000, 100, Some(7)));
        assert_eq!(
            a.flags(hints),
            " --pack wlb --context 4096 --wlb-group 3 --wlb-max-len 5000 --wlb-outlier 100 \
             --wlb-breakpoint 7"
        );
        assert!(a.check_wlb().is_ok());
        a.pack = PackModeArg::Window;
        let e = a.check_wlb().unwrap_err().to_string();
        assert_eq!(e, "--wlb-group applies only to --pack wlb");
    }
}
