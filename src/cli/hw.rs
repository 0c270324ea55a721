//! `fcp hw ...`: list, show and query the bundled (or user) hardware, model and kernel profiles.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use fcp::hardware::{
    bundled, Hardware, KernelLookup, KernelProfile, KernelQuery, Pass, NUMERIC_FIELDS,
};
use fcp::plan::{allowed_pairs, Mask};
use fcp::report::tenths;
use fcp::Model;

/// Hardware commands.
#[derive(Debug, Args)]
pub struct HwArgs {
    #[command(subcommand)]
    command: HwCommand,
}

#[derive(Debug, Subcommand)]
enum HwCommand {
    /// List the bundled hardware profiles, models, kernel profiles and NCCL tables.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a hardware profile's values with their sources, a model, and sample kernel lookups.
    Show {
        /// Bundled name (h100, h200, b200) or path to a TOML file.
        #[arg(long)]
        hardware: String,
        /// Bundled model (llama3-70b, llama3-8b, mha-16, mha-32) or path to a TOML file.
        #[arg(long, default_value = "llama3-70b")]
        model: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Look up kernel throughput (and efficiency) for one tile shape.
    Kernel(KernelArgs),
    /// Link bandwidth needed to hide one block's K/V transfer behind its attention compute.
    OverlapBandwidth {
        /// Bundled name (h100, h200, b200) or path to a TOML file.
        #[arg(long, default_value = "h100")]
        hardware: String,
        /// Bundled model or path to a TOML file.
        #[arg(long, default_value = "llama3-70b")]
        model: String,
        /// Block size in tokens.
        #[arg(long, default_value_t = 4096)]
        block: u64,
        /// Print JSON (key `gbps`).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct KernelArgs {
    /// Bundled name (h100, h200, b200) or path to a TOML file.
    #[arg(long)]
    hardware: String,
    /// Kernel profile to use instead of the hardware's own (bundled name or CSV path).
    #[arg(long)]
    profile: Option<String>,
    /// fwd or bwd.
    #[arg(long, value_parser = parse_pass, default_value = "fwd")]
    pass: Pass,
    /// causal or full.
    #[arg(long, value_parser = parse_mask, default_value = "causal")]
    mask: Mask,
    /// Head dimension (default: the model's, or 128).
    #[arg(long)]
    head_dim: Option<u32>,
    /// Query tokens of the tile (of the whole launch with --varlen).
    #[arg(long)]
    q_len: u64,
    /// Key/value tokens of the tile (default: q-len).
    #[arg(long)]
    kv_len: Option<u64>,
    /// The tile runs as (part of) a varlen launch.
    #[arg(long)]
    varlen: bool,
    /// Also print the tile's time for this model (queries = the last q-len positions, keys =
    /// the first kv-len positions of one document).
    #[arg(long)]
    model: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_pass(s: &str) -> Result<Pass, String> {
    s.parse()
}

fn parse_mask(s: &str) -> Result<Mask, String> {
    match s {
        "causal" => Ok(Mask::Causal),
        "full" => Ok(Mask::Full),
        _ => Err(format!("unknown mask `{s}` (expected causal or full)")),
    }
}

/// Run `fcp hw ...`.
pub fn run(args: HwArgs) -> anyhow::Result<()> {
    match args.command {
        HwCommand::List { json } => list(json),
        HwCommand::Show {
            hardware,
            model,
            json,
        } => show(&hardware, &model, json),
        HwCommand::Kernel(k) => kernel(k),
        HwCommand::OverlapBandwidth {
            hardware,
            model,
            block,
            json,
        } => overlap(&hardware, &model, block, json),
    }
}

fn list(as_json: bool) -> anyhow::Result<()> {
    let mut hardware = Vec::new();
    for name in bundled::names(bundled::HARDWARE) {
        let hw = Hardware::load(name)?;
        hardware.push(json!({"name": name, "description": hw.description,
            "kernel_profile": hw.kernel_profile, "nccl_table": hw.nccl_table}));
    }
    let mut models = Vec::new();
    for name in bundled::names(bundled::MODELS) {
        let m = Model::load(name)?;
        models.push(
            json!({"name": name, "q_heads": m.q_heads, "kv_heads": m.kv_heads,
            "head_dim": m.head_dim, "dtype_bytes": m.dtype_bytes}),
        );
    }
    let mut kernels = Vec::new();
    for name in bundled::names(bundled::KERNEL_PROFILES) {
        let p = KernelProfile::load(name)?;
        kernels.push(json!({"name": name, "rows": p.rows().len(), "series": p.series()}));
    }
    let nccl = bundled::names(bundled::NCCL_TABLES);
    if as_json {
        let v = json!({"hardware": hardware, "models": models, "kernel_profiles": kernels,
            "nccl_tables": nccl});
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!("hardware:");
    for h in &hardware {
        outln!(
            "  {:<6} {}  (kernels: {})",
            str_of(&h["name"]),
            str_of(&h["description"]),
            str_of(&h["kernel_profile"])
        );
    }
    outln!("models:");
    for m in &models {
        outln!(
            "  {:<11} q_heads {:>3}  kv_heads {:>3}  head_dim {:>4}  dtype_bytes {}",
            str_of(&m["name"]),
            m["q_heads"],
            m["kv_heads"],
            m["head_dim"],
            m["dtype_bytes"]
        );
    }
    outln!("kernel profiles:");
    for k in &kernels {
        let series: Vec<String> = k["series"]
            .as_array()
            .map(|a| a.iter().map(|s| str_of(s).to_string()).collect())
            .unwrap_or_default();
        outln!(
            "  {:<15} {:>3} rows: {}",
            str_of(&k["name"]),
            k["rows"],
            series.join(", ")
        );
    }
    outln!("nccl tables:");
    for n in nccl {
        outln!("  {n}");
    }
    Ok(())
}

fn overlap(hardware: &str, model: &str, block: u64, as_json: bool) -> anyhow::Result<()> {
    let hw = Hardware::load(hardware)?;
    let model = Model::load(model)?;
    let o = fcp::hardware::overlap_bandwidth(&hw, &hw.kernel_profile()?, &model, block)?;
    if as_json {
        let v = json!({
            "hardware": hw.name,
            "model": model.name,
            "block": o.block,
            "kv_bytes": o.kv_bytes,
            "compute_us": o.compute_s * 1e6,
            "gbps": o.gbps,
            "nic_gbs": hw.nic_gbs,
            "nvlink_gbs": hw.nvlink_gbs,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            "{} / {} · block {}: K/V {:.2} MiB per block, {:.1} us of attention per remote block",
            hw.name,
            model.name,
            o.block,
            o.kv_bytes as f64 / (1 << 20) as f64,
            o.compute_s * 1e6
        );
        outln!(
            "needs {:.1} GB/s to hide the transfer: {:.0}% of the NIC ({} GB/s), {:.0}% of NVLink ({} GB/s)",
            o.gbps,
            100.0 * o.gbps / hw.nic_gbs,
            hw.nic_gbs,
            100.0 * o.gbps / hw.nvlink_gbs,
            hw.nvlink_gbs
        );
    }
    Ok(())
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

/// The lengths `hw show` samples the kernel profile at.
const SAMPLE_LENS: &[u64] = &[1024, 4096, 16384, 65536];

fn show(hardware: &str, model_arg: &str, as_json: bool) -> anyhow::Result<()> {
    let hw = Hardware::load(hardware)?;
    let model = Model::load(model_arg)?;
    let model_source = Model::source_of(model_arg);
    let profile = hw
        .kernel_profile()
        .context("loading the hardware's kernel profile")?;
    let mut lookups = Vec::new();
    for pass in [Pass::Fwd, Pass::Bwd] {
        for mask in [Mask::Causal, Mask::Full] {
            for &len in SAMPLE_LENS {
                let q = KernelQuery {
                    pass,
                    mask,
                    head_dim: model.head_dim,
                    q_len: len,
                    kv_len: len,
                    varlen: false,
                };
                lookups.push((q, profile.lookup(&q)));
            }
        }
    }
    if as_json {
        let lk: Vec<Value> = lookups
            .iter()
            .map(|(q, r)| match r {
                Ok(l) => lookup_json(&hw, q, l),
                Err(e) => json!({"query": q, "error": e.to_string()}),
            })
            .collect();
        let v = json!({
            "hardware": hw,
            "effective_peak_tflops": hw.effective_peak_tflops(),
            "model": model,
            "model_source": model_source,
            "kernel_profile": profile.name,
            "kernel_scale": hw.kernel_scale(),
            "nccl_scale": hw.nccl_scale(),
            "lookups": lk,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!("hardware {}: {}", hw.name, hw.description);
    let values = [
        ("peak_tflops", format!("{} TFLOP/s", num(hw.peak_tflops))),
        ("sm_count", hw.sm_count.to_string()),
        ("gpus_per_node", hw.gpus_per_node.to_string()),
        ("nvlink_gbs", format!("{} GB/s", num(hw.nvlink_gbs))),
        (
            "nvlink_latency_us",
            format!("{} us", num(hw.nvlink_latency_us)),
        ),
        ("nic_gbs", format!("{} GB/s", num(hw.nic_gbs))),
        ("nic_latency_us", format!("{} us", num(hw.nic_latency_us))),
        ("comm_sms", hw.comm_sms.to_string()),
        (
            "launch_overhead_us",
            format!("{} us", num(hw.launch_overhead_us)),
        ),
        (
            "gemm_tflops",
            hw.gemm_tflops
                .map_or("-".to_string(), |g| format!("{} TFLOP/s", num(g))),
        ),
        (
            "hbm_gb",
            hw.hbm_gb
                .map_or("-".to_string(), |g| format!("{} GB", num(g))),
        ),
        (
            "hbm_gbs",
            hw.hbm_gbs
                .map_or("-".to_string(), |g| format!("{} GB/s", num(g))),
        ),
    ];
    debug_assert_eq!(values.len(), NUMERIC_FIELDS.len());
    for (field, value) in values {
        outln!(
            "  {field:<19} {value:<14} {}",
            hw.source_of(field).unwrap_or("(no source given)")
        );
    }
    outln!(
        "  effective peak      {:.1} TFLOP/s ({} of {} SMs for compute)",
        hw.effective_peak_tflops(),
        hw.sm_count - hw.comm_sms,
        hw.sm_count
    );
    // A what-if peak or NVLink speed scales the tables measured against the profile's own.
    let scaled = |scale: f64, field: &str| match scale {
        1.0 => String::new(),
        s => format!("   what-if: × {} with {field}", num(s)),
    };
    // Their `[sources]` entries too, as `--json` gives them (bug hunt: the text dropped them).
    let cited = |field: &str| {
        hw.source_of(field)
            .map_or(String::new(), |s| format!("   {s}"))
    };
    outln!(
        "  kernel_profile      {}{}{}",
        hw.kernel_profile,
        scaled(hw.kernel_scale(), "peak_tflops"),
        cited("kernel_profile")
    );
    outln!(
        "  nccl_table          {}{}{}",
        hw.nccl_table.as_deref().unwrap_or("(none)"),
        match hw.nccl_table {
            Some(_) => scaled(hw.nccl_scale(), "nvlink_gbs"),
            None => String::new(),
        },
        cited("nccl_table")
    );
    outln!(
        "model {}: q_heads {}, kv_heads {}, head_dim {}, dtype_bytes {}  {}",
        model.name,
        model.q_heads,
        model.kv_heads,
        model.head_dim,
        model.dtype_bytes,
        model_source.unwrap_or_default()
    );
    match (model.linear, model.stack, model.params_per_gpu()) {
        (Some(l), Some(st), Some(p)) => outln!(
            "  hidden {}, ffn_hidden {} × {} matrices, layers {}, vocab {}{} · {} parameters ({:.2} B)",
            l.hidden,
            l.ffn_hidden,
            l.ffn_matrices,
            st.layers,
            st.vocab,
            if st.tied_embeddings { ", tied embeddings" } else { "" },
            p,
            p as f64 / 1e9
        ),
        // The layer's widths without the stack's depth (bug hunt: given, in `--json`, and
        // left out of the text).
        (Some(l), _, _) => outln!(
            "  hidden {}, ffn_hidden {} × {} matrices (no layers and vocab: the whole model is not counted)",
            l.hidden,
            l.ffn_hidden,
            l.ffn_matrices
        ),
        _ => {}
    }
    outln!(
        "kernel lookups ({}, head_dim {}, non-varlen, q_len = kv_len):",
        profile.name,
        model.head_dim
    );
    outln!("  pass mask    len     TFLOP/s  eff     clamped");
    for (q, r) in &lookups {
        match r {
            Ok(l) => outln!(
                "  {:<4} {:<7} {:<7} {:>7}  {:>5}%  {}",
                q.pass.to_string(),
                q.mask.to_string(),
                q.q_len,
                tenths(hw.achieved_tflops(l.tflops)),
                tenths(100.0 * hw.efficiency(l.tflops)),
                clamp_str(l)
            ),
            Err(e) => outln!(
                "  {:<4} {:<7} {:<7} {e}",
                q.pass.to_string(),
                q.mask.to_string(),
                q.q_len
            ),
        }
    }
    Ok(())
}

fn clamp_str(l: &KernelLookup) -> &'static str {
    match l.clamped {
        fcp::hardware::Clamp::None => "-",
        fcp::hardware::Clamp::BelowMin => "below table",
        fcp::hardware::Clamp::AboveMax => "above table",
    }
}

fn lookup_json(hw: &Hardware, q: &KernelQuery, l: &KernelLookup) -> Value {
    json!({
        "query": q,
        "tflops": l.tflops,
        "achieved_tflops": hw.achieved_tflops(l.tflops),
        "efficiency": hw.efficiency(l.tflops),
        "length": l.length,
        "clamped": l.clamped,
        "varlen_fallback": l.varlen_fallback,
        "used": l.used,
        "sources": l.sources,
    })
}

fn kernel(a: KernelArgs) -> anyhow::Result<()> {
    let hw = Hardware::load(&a.hardware)?;
    let profile = match &a.profile {
        // Scaled as the profile's own table is under a what-if peak (bug hunt: `--profile`
        // showed the unscaled table, and refused a slower peak).
        Some(p) => hw.check_kernel_profile(KernelProfile::load(p)?.scaled(hw.kernel_scale()))?,
        None => hw.kernel_profile()?,
    };
    let model = a.model.as_deref().map(Model::load).transpose()?;
    let head_dim = a
        .head_dim
        .or(model.as_ref().map(|m| m.head_dim))
        .unwrap_or(128);
    let kv_len = a.kv_len.unwrap_or(a.q_len);
    // The document-length limit every other command holds to. Regression: `--q-len` of
    // 2⁶⁴ − 1 printed a length of 2⁶⁴ and a 5·10²⁹ µs tile.
    let max = fcp::trace::MAX_DOC_LEN;
    for (flag, len) in [("--q-len", a.q_len), ("--kv-len", kv_len)] {
        if !(1..=max).contains(&len) {
            anyhow::bail!("{flag} must be in 1..={max} tokens, got {len}");
        }
    }
    let q = KernelQuery {
        pass: a.pass,
        mask: a.mask,
        head_dim,
        q_len: a.q_len,
        kv_len,
        varlen: a.varlen,
    };
    let l = profile.lookup(&q)?;
    let tile = match &model {
        Some(m) => {
            // Queries are the last q_len positions of a span of max(q_len, kv_len) tokens,
            // keys the first kv_len: a chunk attending to its prefix.
            let span = a.q_len.max(kv_len);
            let pairs = allowed_pairs(a.mask, span - a.q_len, span, 0, kv_len);
            let m = Model {
                head_dim,
                ..m.clone()
            };
            let t = fcp::hardware::kernel_time_s(&hw, &profile, &m, &q, pairs)?;
            Some((m.name.clone(), pairs, t))
        }
        None => None,
    };
    if a.json {
        let mut v = lookup_json(&hw, &q, &l);
        v["hardware"] = json!(hw.name);
        v["profile"] = json!(profile.name);
        if let Some((name, pairs, t)) = &tile {
            v["model"] = json!(name);
            v["pairs"] = json!(pairs.to_string());
            v["tile_time_us"] = json!(t * 1e6);
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!(
        "{} {} hd {} q_len {} kv_len {}{} on {} ({}):",
        q.pass,
        q.mask,
        head_dim,
        q.q_len,
        kv_len,
        if q.varlen { " varlen" } else { "" },
        hw.name,
        profile.name
    );
    outln!(
        "  tflops      {} TFLOP/s (table, all SMs)",
        tenths(l.tflops)
    );
    if hw.comm_sms > 0 {
        outln!(
            "  achieved    {} TFLOP/s with {} of {} SMs",
            tenths(hw.achieved_tflops(l.tflops)),
            hw.sm_count - hw.comm_sms,
            hw.sm_count
        );
    }
    outln!(
        "  efficiency  {}% of {} TFLOP/s peak",
        tenths(100.0 * hw.efficiency(l.tflops)),
        hw.peak_tflops
    );
    outln!("  clamped     {}", clamp_str(&l));
    outln!("  used        {}", l.used);
    for s in &l.sources {
        outln!("  source      {s}");
    }
    if let Some((name, pairs, t)) = tile {
        outln!(
            "  tile time   {:.1} us for {name} ({pairs} pairs, incl. {} us launch)",
            t * 1e6,
            hw.launch_overhead_us
        );
    }
    Ok(())
}

/// A profile's number as written, readably: `-0` as `0`, and values too small or large for
/// plain digits in exponent form (bug hunt: `gemm_tflops = 1e-300` printed 300 digits). A
/// number no one wrote, such as a rate a what-if peak scaled (1606.023852840105), is shown to
/// three decimals.
fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if (1e-4..1e12).contains(&x.abs()) {
        let plain = format!("{x}");
        match plain.split_once('.') {
            Some((_, frac)) if frac.len() > 6 && x.abs() >= 1.0 => fcp::report::trimmed(x, 3),
            _ => plain,
        }
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::num;

    /// Regression (bug hunt): `-0.0` printed `-0` and `1e-300` some 300 digits.
    #[test]
    fn profile_numbers_print_readably() {
        assert_eq!(num(-0.0), "0");
        assert_eq!(num(1e-300), "1e-300");
        assert_eq!(num(3.35e15), "3.35e15");
        assert_eq!(num(989.5), "989.5");
        assert_eq!(num(0.5), "0.5");
        assert_eq!(num(1606.023852840105), "1606.024");
        assert_eq!(num(2.0000000001), "2");
        assert_eq!(num(0.123456789), "0.123456789");
    }
}
