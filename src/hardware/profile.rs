//! The GPU + network profile: compute peak, SMs, links, overheads, each with its source.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bundled::{self, Source};
use super::spec;
use super::{HardwareError, KernelProfile};
use crate::report::shown;

/// One GPU type in one node type, as the cost model needs it.
///
/// Units are the ones people quote (TFLOP/s, GB/s, µs) so the TOML reads like a datasheet; the
/// `*_s` / `*_bytes_per_s` helpers convert to the SI units the simulator works in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// Profile name (bundled name, or the `name` key / file stem of a user file).
    #[serde(default)]
    pub name: String,
    /// One-line human description.
    #[serde(default)]
    pub description: String,
    /// Dense BF16 tensor-core peak of one GPU, TFLOP/s (10^12 FLOP/s). Not the sparse figure.
    pub peak_tflops: f64,
    /// Streaming multiprocessors per GPU.
    pub sm_count: u32,
    /// GPUs per node sharing the NVLink domain.
    pub gpus_per_node: u32,
    /// NVLink bandwidth per GPU per direction, GB/s (10^9 B/s).
    pub nvlink_gbs: f64,
    /// Start-up latency of one intra-node transfer, µs.
    pub nvlink_latency_us: f64,
    /// NIC bandwidth per GPU per direction, GB/s (10^9 B/s).
    pub nic_gbs: f64,
    /// Start-up latency of one inter-node transfer, µs.
    pub nic_latency_us: f64,
    /// SMs reserved for communication kernels; attention runs on the rest.
    #[serde(default)]
    pub comm_sms: u32,
    /// Fixed cost of one attention kernel launch, µs.
    pub launch_overhead_us: f64,
    /// Dense BF16 matrix-multiply throughput one GPU sustains on large GEMMs, TFLOP/s: what
    /// the whole-layer simulation (`--layer`) prices the projections and MLP at. A measured
    /// figure (best-shape `torch.matmul`), not the peak; absent, the layer is not simulated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_tflops: Option<f64>,
    /// Memory of one GPU, GB (10^9 bytes), as the datasheet gives it: what a training step's
    /// weights, gradients, optimizer state and activations must fit in
    /// ([`crate::footprint`]); absent, the footprint is reported without a verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_gb: Option<f64>,
    /// Memory bandwidth of one GPU, GB/s (10^9 B/s): what the optimizer step, a stream over
    /// the parameters, runs at ([`crate::sim::step`]). Bundled profiles give the datasheet
    /// figure, which a streaming kernel approaches but does not pass, so the step it prices is
    /// a floor; absent, the optimizer step is not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_gbs: Option<f64>,
    /// Kernel throughput table: a bundled name (`h100-fa3`) or a CSV path (relative paths are
    /// resolved against the TOML's directory at load time).
    pub kernel_profile: String,
    /// Measured NCCL bus-bandwidth table for collectives, if one exists for this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_table: Option<String>,
    /// Where each number comes from, keyed by field name.
    #[serde(default)]
    pub sources: BTreeMap<String, String>,
    /// The `peak_tflops` and `nvlink_gbs` the profile's tables were measured against, kept
    /// when what-if overrides replace either, so the tables follow them
    /// ([`Hardware::kernel_scale`], [`Hardware::nccl_scale`]); `None` for a profile as read.
    #[serde(skip)]
    table_basis: Option<TableBasis>,
}

/// What a profile's kernel and NCCL tables were measured against (see
/// [`Hardware::kernel_scale`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct TableBasis {
    peak_tflops: f64,
    nvlink_gbs: f64,
}

/// The numeric fields, in display order; bundled profiles must cite a source for each.
pub const NUMERIC_FIELDS: &[&str] = &[
    "peak_tflops",
    "sm_count",
    "gpus_per_node",
    "nvlink_gbs",
    "nvlink_latency_us",
    "nic_gbs",
    "nic_latency_us",
    "comm_sms",
    "launch_overhead_us",
    "gemm_tflops",
    "hbm_gb",
    "hbm_gbs",
];

/// A point-to-point link as the simulator costs it: `latency + bytes / bandwidth`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Link {
    /// Bytes per second, one direction.
    pub bandwidth_bytes_per_s: f64,
    /// Start-up latency, seconds.
    pub latency_s: f64,
}

impl Link {
    /// Time to move `bytes` over this link alone (no sharing).
    pub fn time_s(&self, bytes: u64) -> f64 {
        if bytes == 0 {
            return 0.0;
        }
        self.latency_s + bytes as f64 / self.bandwidth_bytes_per_s
    }
}

impl Hardware {
    /// Load a bundled profile by name (`h100`, `h200`, `b200`) or a user TOML by path (anything
    /// containing `/` or ending in `.toml`).
    ///
    /// Either may carry what-if overrides of its numeric fields after a `:`
    /// (`h100:nic_gbs=100,gpus_per_node=4`, [`spec::split_overrides`]): the profile with
    /// those fields replaced and then checked as a file giving them would be, named by the
    /// profile's name and the overrides (so a plan made on a bundled profile so changed
    /// records it, and `simulate` reloads the same), each replaced field's source saying it
    /// was set so. A question such as "what would a faster NIC buy?" is then one flag, or one
    /// more entry in a sweep's `hardware` axis, not a TOML file.
    pub fn load(name_or_path: &str) -> Result<Hardware, HardwareError> {
        let (base, overrides) = spec::split_overrides(name_or_path);
        let src = bundled::resolve(base, bundled::HARDWARE, "hardware", ".toml")?;
        let mut hw = Self::parse_source(&src)?;
        let label = match overrides {
            Some(overrides) => {
                hw.set_overrides(overrides, name_or_path)?;
                format!("{} with {overrides}", src.label)
            }
            None => src.label,
        };
        hw.validate(&label)?;
        Ok(hw)
    }

    /// Replace the fields `overrides` (`key=value,...`, from `spec`) names: each one of
    /// [`NUMERIC_FIELDS`], given once, its value a number (a whole one for counts). Set on the
    /// parsed profile, not its text, so errors in the file keep their lines (bug hunt).
    ///
    /// The tables follow the fields they were measured against: a new `peak_tflops` scales
    /// the kernel table's throughputs, and `gemm_tflops` unless it is given too, by new / old
    /// (kernels as efficient on the faster GPU); a new `nvlink_gbs` scales the NCCL table's bus
    /// bandwidths by new / old. Otherwise `h100:peak_tflops=2000` changed nothing but the MFU,
    /// and `h100:nvlink_gbs=20` slowed Ulysses' all-to-alls 3× but not Llama3's all-gathers.
    fn set_overrides(&mut self, overrides: &str, spec: &str) -> Result<(), HardwareError> {
        let basis = TableBasis {
            peak_tflops: self.peak_tflops,
            nvlink_gbs: self.nvlink_gbs,
        };
        let overrides_list = spec::overrides(overrides, spec, NUMERIC_FIELDS)?;
        let gemm_given = overrides_list.iter().any(|o| o.key == "gemm_tflops");
        for o in overrides_list {
            match o.key {
                "peak_tflops" => self.peak_tflops = o.real()?,
                "sm_count" => self.sm_count = o.count()?,
                "gpus_per_node" => self.gpus_per_node = o.count()?,
                "nvlink_gbs" => self.nvlink_gbs = o.real()?,
                "nvlink_latency_us" => self.nvlink_latency_us = o.real()?,
                "nic_gbs" => self.nic_gbs = o.real()?,
                "nic_latency_us" => self.nic_latency_us = o.real()?,
                "comm_sms" => self.comm_sms = o.count()?,
                "launch_overhead_us" => self.launch_overhead_us = o.real()?,
                "gemm_tflops" => self.gemm_tflops = Some(o.real()?),
                "hbm_gb" => self.hbm_gb = Some(o.real()?),
                "hbm_gbs" => self.hbm_gbs = Some(o.real()?),
                _ => unreachable!("NUMERIC_FIELDS lists every key above"),
            }
            self.sources.insert(
                o.key.to_string(),
                format!("what-if: set to {} by `{spec}`", o.value),
            );
        }
        if self.peak_tflops != basis.peak_tflops || self.nvlink_gbs != basis.nvlink_gbs {
            self.table_basis = Some(basis);
        }
        let scale = self.kernel_scale();
        if let (false, true, Some(g)) = (gemm_given, scale != 1.0, self.gemm_tflops) {
            // Held to the new peak: 989.4 × (1001.2 / 989.4) rounds one step past 1001.2, and
            // a GEMM rate equal to the peak was refused as above it (bug hunt).
            // And to the 0.1 TFLOP/s floor both rates share: a peak of 0.1, in range, scaled
            // the GEMM rate under it, and the override was refused for a field it never set
            // (bug hunt).
            self.gemm_tflops = Some(
                (g * scale)
                    .min(self.peak_tflops)
                    .max(0.1f64.min(self.peak_tflops)),
            );
            self.sources.insert(
                "gemm_tflops".to_string(),
                format!(
                    "what-if: {} scaled with peak_tflops (× {}) by `{spec}`",
                    shown(g),
                    crate::report::trimmed(scale, 3)
                ),
            );
        }
        self.name = format!("{}:{}", self.name, spec::canonical_overrides(overrides));
        self.description = format!("{} (what-if: {overrides})", self.description);
        Ok(())
    }

    /// Parse and validate a hardware TOML given as text; `label` names it in errors.
    pub fn from_toml_str(text: &str, label: &str) -> Result<Hardware, HardwareError> {
        let src = Source {
            name: label.to_string(),
            label: label.to_string(),
            dir: None,
            text: text.to_string(),
        };
        let hw = Self::parse_source(&src)?;
        hw.validate(&src.label)?;
        Ok(hw)
    }

    /// The profile `src` holds, unchecked: its name filled in, its tables' relative paths
    /// made relative to its file.
    fn parse_source(src: &Source) -> Result<Hardware, HardwareError> {
        let mut hw: Hardware = toml::from_str(&src.text)
            .map_err(|e| bundled::toml_error(&src.label, &src.text, &e))?;
        if hw.name.is_empty() {
            hw.name = src.name.clone();
        }
        // A relative profile path in a user file means "next to this file".
        if let Some(dir) = &src.dir {
            for p in std::iter::once(&mut hw.kernel_profile).chain(hw.nccl_table.as_mut()) {
                let path = std::path::Path::new(p.as_str());
                if bundled::is_path(p, ".csv") && path.is_relative() {
                    *p = dir.join(path).display().to_string();
                }
            }
        }
        Ok(hw)
    }

    fn validate(&self, file: &str) -> Result<(), HardwareError> {
        let bad = |field: &str, message: String| HardwareError::Invalid {
            file: file.to_string(),
            field: field.to_string(),
            message,
        };
        // Bug hunt: a typo here (`peak_tflop`) passed, and the field it meant showed "(no
        // source given)"; unknown keys are refused everywhere else in the file.
        let cited = ["kernel_profile", "nccl_table"];
        if let Some(k) = self
            .sources
            .keys()
            .find(|k| !NUMERIC_FIELDS.contains(&k.as_str()) && !cited.contains(&k.as_str()))
        {
            return Err(bad(
                &format!("sources.{k}"),
                format!(
                    "cites a source for `{k}`, which is no field of a hardware profile (fields: {}, {})",
                    NUMERIC_FIELDS.join(", "),
                    cited.join(", ")
                ),
            ));
        }
        let positive = [
            ("peak_tflops", self.peak_tflops),
            ("nvlink_gbs", self.nvlink_gbs),
            ("nic_gbs", self.nic_gbs),
        ];
        for (field, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(
                    field,
                    format!("must be a positive number, got {}", shown(v)),
                ));
            }
        }
        // Ranges far outside any GPU or link, so a typo (a unit off by 10⁹) is an error and not
        // a simulation that never ends or times that overflow.
        let ranged = [
            ("peak_tflops", self.peak_tflops, 0.1, 1e6, "TFLOP/s"),
            ("nvlink_gbs", self.nvlink_gbs, 0.01, 1e6, "GB/s"),
            ("nic_gbs", self.nic_gbs, 0.01, 1e6, "GB/s"),
        ];
        for (field, v, lo, hi, unit) in ranged {
            if !(lo..=hi).contains(&v) {
                return Err(bad(
                    field,
                    format!("{} {unit} is outside {lo}..={hi:e} {unit}", shown(v)),
                ));
            }
        }
        let non_negative = [
            ("nvlink_latency_us", self.nvlink_latency_us),
            ("nic_latency_us", self.nic_latency_us),
            ("launch_overhead_us", self.launch_overhead_us),
        ];
        for (field, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(
                    field,
                    format!("must be a number >= 0, got {}", shown(v)),
                ));
            }
            if v > 1e6 {
                return Err(bad(field, format!("{} µs is more than a second", shown(v))));
            }
        }
        if let Some(g) = self.gemm_tflops {
            // At least the 0.1 TFLOP/s `peak_tflops` may be: a rate of 1e-300 overflowed the
            // layer's time (bug hunt).
            if !(g.is_finite() && g >= 0.1 && g <= self.peak_tflops) {
                return Err(bad(
                    "gemm_tflops",
                    format!(
                        "{} TFLOP/s must be at least 0.1 and at most peak_tflops {} (it is a measured rate, below the peak)",
                        shown(g),
                        shown(self.peak_tflops)
                    ),
                ));
            }
        }
        // Optional fields, each within a range no GPU comes near the ends of.
        let optional = [
            (
                "hbm_gb",
                self.hbm_gb,
                0.001,
                "GB",
                "one GPU's memory, in 10^9 bytes",
            ),
            (
                "hbm_gbs",
                self.hbm_gbs,
                // A CPU rehearsal's calibration measures its copy at 0.3 GB/s under load
                // (bug hunt: the 1 GB/s floor this had refused the profile it wrote).
                0.001,
                "GB/s",
                "one GPU's memory bandwidth, in 10^9 bytes a second",
            ),
        ];
        for (field, v, lo, unit, what) in optional {
            if let Some(v) = v.filter(|v| !(v.is_finite() && (lo..=1e6).contains(v))) {
                return Err(bad(
                    field,
                    format!("{} {unit} is outside {lo}..=1e6 {unit} ({what})", shown(v)),
                ));
            }
        }
        if self.sm_count == 0 {
            return Err(bad("sm_count", "must be >= 1".into()));
        }
        if self.gpus_per_node == 0 {
            return Err(bad("gpus_per_node", "must be >= 1".into()));
        }
        if self.comm_sms >= self.sm_count {
            return Err(bad(
                "comm_sms",
                format!(
                    "{} leaves no SM for compute (sm_count {})",
                    self.comm_sms, self.sm_count
                ),
            ));
        }
        if self.kernel_profile.trim().is_empty() {
            return Err(bad("kernel_profile", "must name a kernel profile".into()));
        }
        // The tables a profile names are read with it, so that a typo is an error where the
        // profile is given (`hw show`, `plan`), naming its file. Regression: `nccl_table =
        // "nope"` passed `hw show` and `plan` and failed first in `simulate`, without the file.
        // And held to the peak here, where the file is known: checked only when the table was
        // first read, the error named the profile's `name` key (`h100`, for a lab file that
        // kept it), and `plan` accepted the file (bug hunt).
        let table = KernelProfile::load(&self.kernel_profile)
            .map_err(|e| bad("kernel_profile", e.to_string()))?;
        self.table_under_peak(table.scaled(self.kernel_scale()), file)?;
        if let Some(t) = &self.nccl_table {
            super::NcclTable::load(t).map_err(|e| bad("nccl_table", e.to_string()))?;
        }
        Ok(())
    }

    /// Fraction of SMs left to attention kernels: `(sm_count − comm_sms) / sm_count`.
    pub fn compute_sm_fraction(&self) -> f64 {
        (self.sm_count - self.comm_sms.min(self.sm_count)) as f64 / self.sm_count as f64
    }

    /// Peak TFLOP/s available to attention once communication SMs are reserved:
    /// `peak × (sm_count − comm_sms) / sm_count`.
    pub fn effective_peak_tflops(&self) -> f64 {
        self.peak_tflops * self.compute_sm_fraction()
    }

    /// Kernel efficiency of a measured throughput: `tflops / peak`. The tables were measured
    /// with every SM, so this is the fraction of the (full-GPU) peak the kernel reaches; it is
    /// equally `achieved_tflops / effective_peak_tflops` after SM reservation.
    pub fn efficiency(&self, table_tflops: f64) -> f64 {
        table_tflops / self.peak_tflops
    }

    /// Throughput a kernel reaches when `comm_sms` are taken away: the table value scaled by the
    /// SM fraction (attention throughput is proportional to the SMs running it once the grid
    /// fills the GPU).
    pub fn achieved_tflops(&self, table_tflops: f64) -> f64 {
        table_tflops * self.compute_sm_fraction()
    }

    /// GEMM throughput for the token-linear work once `comm_sms` are reserved, FLOP/s (the
    /// measured rate scaled by the SM fraction, as attention's is); `None` without
    /// `gemm_tflops`.
    pub fn gemm_flops_per_s(&self) -> Option<f64> {
        self.gemm_tflops
            .map(|g| g * 1e12 * self.compute_sm_fraction())
    }

    /// One GPU's memory bandwidth in bytes a second (`hbm_gbs` × 10^9), when the profile
    /// gives it.
    pub fn hbm_bytes_per_s(&self) -> Option<f64> {
        self.hbm_gbs.map(|g| g * 1e9)
    }

    /// One GPU's memory in bytes (`hbm_gb` × 10^9), when the profile gives it.
    pub fn hbm_bytes(&self) -> Option<u64> {
        self.hbm_gb.map(|g| (g * 1e9).round() as u64)
    }

    /// Per-launch overhead in seconds.
    pub fn launch_overhead_s(&self) -> f64 {
        self.launch_overhead_us * 1e-6
    }

    /// The NVLink path between two GPUs of one node.
    pub fn intra_node_link(&self) -> Link {
        Link {
            bandwidth_bytes_per_s: self.nvlink_gbs * 1e9,
            latency_s: self.nvlink_latency_us * 1e-6,
        }
    }

    /// The NIC path between GPUs of different nodes (one NIC per GPU).
    pub fn inter_node_link(&self) -> Link {
        Link {
            bandwidth_bytes_per_s: self.nic_gbs * 1e9,
            latency_s: self.nic_latency_us * 1e-6,
        }
    }

    /// The link between global ranks `a` and `b` with `gpus_per_node` consecutive ranks per node.
    pub fn link_between(&self, a: u32, b: u32) -> Link {
        if a / self.gpus_per_node == b / self.gpus_per_node {
            self.intra_node_link()
        } else {
            self.inter_node_link()
        }
    }

    /// Load the kernel throughput table this profile names. A table that measures more than
    /// `peak_tflops` is refused: the peak would then be wrong (a sparse or FP8 figure against a
    /// BF16 table, a typo), and every MFU and efficiency reported from it would pass 100%.
    pub fn kernel_profile(&self) -> Result<KernelProfile, HardwareError> {
        self.check_kernel_profile(
            KernelProfile::load(&self.kernel_profile)?.scaled(self.kernel_scale()),
        )
    }

    /// What the kernel table's throughputs are multiplied by: `peak_tflops` over the peak the
    /// table was measured against, 1 unless a what-if override changed the peak
    /// ([`Hardware::load`]).
    pub fn kernel_scale(&self) -> f64 {
        self.table_basis
            .map_or(1.0, |b| self.peak_tflops / b.peak_tflops)
    }

    /// What the NCCL table's bus bandwidths are multiplied by: `nvlink_gbs` over the link speed
    /// the table was measured on, 1 unless a what-if override changed it.
    pub fn nccl_scale(&self) -> f64 {
        self.table_basis
            .map_or(1.0, |b| self.nvlink_gbs / b.nvlink_gbs)
    }

    /// `table`, if this profile's peak is at least what it measures ([`Hardware::kernel_profile`]):
    /// for a table given apart from the profile (`fcp hw kernel --profile`), which used to
    /// skip the check and print 140 % efficiency for the B200 table on the H100 peak.
    pub fn check_kernel_profile(
        &self,
        table: KernelProfile,
    ) -> Result<KernelProfile, HardwareError> {
        self.table_under_peak(table, &self.name)
    }

    /// [`Hardware::check_kernel_profile`], naming `file` in the error.
    fn table_under_peak(
        &self,
        table: KernelProfile,
        file: &str,
    ) -> Result<KernelProfile, HardwareError> {
        let fastest = table
            .rows()
            .iter()
            .max_by(|a, b| a.tflops.total_cmp(&b.tflops));
        if let Some(row) = fastest.filter(|r| r.tflops > self.peak_tflops) {
            return Err(HardwareError::Invalid {
                file: file.to_string(),
                field: "peak_tflops".into(),
                message: format!(
                    "{} TFLOP/s is below the {} TFLOP/s that kernel profile {} measures ({} {} hd {} at {} × {} tokens); set it to the GPU's dense BF16 peak",
                    self.peak_tflops,
                    row.tflops,
                    table.name,
                    row.pass,
                    row.mask,
                    row.head_dim,
                    row.q_len,
                    row.kv_len
                ),
            });
        }
        Ok(table)
    }

    /// Load the NCCL bus-bandwidth table this profile names, if any.
    pub fn nccl_table(&self) -> Result<Option<super::NcclTable>, HardwareError> {
        self.nccl_table
            .as_deref()
            .map(|t| super::NcclTable::load(t).map(|t| t.scaled(self.nccl_scale())))
            .transpose()
    }

    /// Source of a field, or `None` if the file does not cite one.
    pub fn source_of(&self, field: &str) -> Option<&str> {
        self.sources.get(field).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
peak_tflops = 1000.0
sm_count = 100
gpus_per_node = 8
nvlink_gbs = 400.0
nvlink_latency_us = 2.0
nic_gbs = 50.0
nic_latency_us = 4.0
comm_sms = 20
launch_overhead_us = 5.0
kernel_profile = "h100-fa3"
"#;

    /// Regression: a lab file with `peak_tflops = 500` against the H100 table (756 TFLOP/s at
    /// its best) reported 109% MFU and 140% kernel efficiency without a word.
    #[test]
    fn a_peak_below_the_kernel_table_is_refused() {
        let low = MINIMAL.replace("peak_tflops = 1000.0", "peak_tflops = 500.0");
        // Refused where the file is read, naming it (bug hunt: the error named the profile's
        // `name`, and `plan` took the file).
        let e = Hardware::from_toml_str(&low, "lab.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lab.toml"), "{e}");
        assert!(e.contains("invalid `peak_tflops`"), "{e}");
        assert!(e.contains("756"), "{e}");
        Hardware::from_toml_str(MINIMAL, "ok.toml")
            .unwrap()
            .kernel_profile()
            .unwrap();
    }

    /// Regression (fuzzing): `nic_gbs = 1e308` was echoed as 309 digits in the error.
    #[test]
    fn huge_values_are_shown_in_exponent_form() {
        let big = MINIMAL.replace("nic_gbs = 50.0", "nic_gbs = 1e308");
        let e = Hardware::from_toml_str(&big, "lab.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("1e308 GB/s"), "{e}");
        assert!(e.len() < 200, "{e}");
        assert_eq!(shown(50.0), "50");
        assert_eq!(shown(1e-30), "1e-30");
    }

    #[test]
    fn the_gemm_rate_is_optional_and_below_the_peak() {
        let hw = Hardware::from_toml_str(MINIMAL, "x").unwrap();
        assert_eq!(hw.gemm_flops_per_s(), None);
        let with = |g: &str| Hardware::from_toml_str(&format!("gemm_tflops = {g}\n{MINIMAL}"), "x");
        assert!(with("500.0").unwrap().gemm_flops_per_s().is_some());
        // 1e-300 and 0.01: a rate this low overflowed the layer's time (bug hunt).
        for bad in ["0.0", "-1.0", "1e9", "nan", "1e-300", "0.01"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("gemm_tflops"), "{bad}: {e}");
        }
        assert!(with("0.1").is_ok());
        for name in bundled::names(bundled::HARDWARE) {
            let hw = Hardware::load(name).unwrap();
            assert!(hw.gemm_tflops.unwrap() < hw.peak_tflops, "{name}");
        }
    }

    #[test]
    fn the_memory_bandwidth_is_optional_and_in_range() {
        let hw = Hardware::from_toml_str(MINIMAL, "x").unwrap();
        assert_eq!(hw.hbm_bytes_per_s(), None);
        let with = |b: &str| Hardware::from_toml_str(&format!("hbm_gbs = {b}\n{MINIMAL}"), "x");
        assert_eq!(with("3350.0").unwrap().hbm_bytes_per_s(), Some(3.35e12));
        for bad in ["0.0", "-1.0", "0.0005", "2e6", "nan", "inf"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("hbm_gbs"), "{bad}: {e}");
        }
        for name in bundled::names(bundled::HARDWARE) {
            assert!(Hardware::load(name).unwrap().hbm_gbs.is_some(), "{name}");
        }
    }

    #[test]
    fn what_if_overrides_replace_fields_checked_and_cited() {
        let base = Hardware::load("h100").unwrap();
        let hw = Hardware::load("h100:nic_gbs=12.5,gpus_per_node=4").unwrap();
        assert_eq!((hw.nic_gbs, hw.gpus_per_node), (12.5, 4));
        // Named one way however the overrides were written: keys in order.
        assert_eq!(hw.name, "h100:gpus_per_node=4,nic_gbs=12.5");
        assert!(hw
            .description
            .ends_with("(what-if: nic_gbs=12.5,gpus_per_node=4)"));
        let cited = hw.source_of("nic_gbs").unwrap();
        assert!(cited.contains("what-if: set to 12.5"), "{cited}");
        // Everything else is the profile's own.
        assert_eq!(
            Hardware {
                name: base.name.clone(),
                description: base.description.clone(),
                nic_gbs: base.nic_gbs,
                gpus_per_node: base.gpus_per_node,
                sources: base.sources.clone(),
                ..hw.clone()
            },
            base
        );
        // Regression (bug hunt): overrides were applied to the file's text, re-written, so an
        // error in the file named a line of the re-written text.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lab.toml");
        let h100 = bundled::HARDWARE[0].1;
        let line = h100.lines().count() + 1;
        std::fs::write(&file, format!("{h100}nic_gbz = 3\n")).unwrap();
        let e = Hardware::load(&format!("{}:nic_gbs=5", file.display()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("line {line} (`nic_gbz = 3`)")), "{e}");
        for (spec, says) in [
            ("h100:nic_gb=1", "is not a field an override may set"),
            (
                "h100:kernel_profile=x",
                "is not a field an override may set",
            ),
            ("h100:nic_gbs=1,nic_gbs=2", "is set twice"),
            ("h100:nic_gbs=fast", "`fast` is not a number"),
            ("h100:gpus_per_node=2.5", "`2.5` is not a whole number"),
            (
                "h100:gpus_per_node=-1",
                "`-1` is not a whole number from 0 to 4294967295",
            ),
            (
                "h100:NIC_GBS=1",
                "`NIC_GBS`: is not a field an override may set",
            ),
            ("h100::nic_gbs=1", "`:nic_gbs`: is not a field"),
            ("h100:nic_gbs=-1", "must be a positive number"),
            ("h100:gemm_tflops=5000", "gemm_tflops"),
            ("h100:nic_gbs=1,", "is not key=value"),
        ] {
            let e = Hardware::load(spec).unwrap_err().to_string();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    /// Regression: `h100:peak_tflops=2000` changed only the MFU (attention is priced from the
    /// kernel table, the layer's GEMMs from `gemm_tflops`), and `h100:peak_tflops=500` was
    /// refused as below the table; `h100:nvlink_gbs=20` slowed point-to-point messages but
    /// not the collectives the NCCL table prices. The tables now follow the fields they were
    /// measured against.
    #[test]
    fn what_if_peak_and_nvlink_scale_the_tables_measured_against_them() {
        let base = Hardware::load("h100").unwrap();
        let fastest = |hw: &Hardware| {
            let t = hw.kernel_profile().unwrap();
            t.rows().iter().map(|r| r.tflops).fold(0.0, f64::max)
        };
        let busbw = |hw: &Hardware| hw.nccl_table().unwrap().unwrap().rows[0].busbw_gbs;
        assert_eq!((base.kernel_scale(), base.nccl_scale()), (1.0, 1.0));

        let fast = Hardware::load("h100:peak_tflops=1978.8").unwrap();
        let k = 1978.8 / base.peak_tflops;
        assert!((fast.kernel_scale() - k).abs() < 1e-12);
        assert!((fastest(&fast) - k * fastest(&base)).abs() < 1e-9);
        let g = base.gemm_tflops.unwrap();
        assert!((fast.gemm_tflops.unwrap() - k * g).abs() < 1e-9);
        let cited = fast.source_of("gemm_tflops").unwrap();
        assert!(cited.contains("scaled with peak_tflops (× 2)"), "{cited}");
        assert_eq!(busbw(&fast), busbw(&base));

        // A slower GPU is a question, not an error; a GEMM rate given too is taken as given.
        // A peak at the floor holds the scaled GEMM rate to the floor too (bug hunt: it was
        // refused as `gemm_tflops` 0.08).
        let floor = Hardware::load("h100:peak_tflops=0.1").unwrap();
        assert_eq!(floor.gemm_tflops, Some(0.1));
        let slow = Hardware::load("h100:peak_tflops=494.7,gemm_tflops=300").unwrap();
        assert!((fastest(&slow) - fastest(&base) / 2.0).abs() < 1e-9);
        assert_eq!(slow.gemm_tflops, Some(300.0));

        let narrow = Hardware::load("h100:nvlink_gbs=95").unwrap();
        assert!((busbw(&narrow) - busbw(&base) * 95.0 / base.nvlink_gbs).abs() < 1e-9);
        assert_eq!(fastest(&narrow), fastest(&base));
        assert_eq!(narrow.gemm_tflops, base.gemm_tflops);

        // A GEMM rate equal to the peak stays equal to it, rounding aside (bug hunt).
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lab.toml");
        let h100 = bundled::HARDWARE[0].1;
        assert!(h100.contains("gemm_tflops = 794.5"));
        std::fs::write(
            &file,
            h100.replace("gemm_tflops = 794.5", "gemm_tflops = 989.4"),
        )
        .unwrap();
        let scaled = Hardware::load(&format!("{}:peak_tflops=1001.2", file.display())).unwrap();
        assert_eq!(scaled.gemm_tflops, Some(1001.2));

        // Other overrides leave the tables as measured.
        let nic = Hardware::load("h100:nic_gbs=12.5").unwrap();
        assert_eq!((nic.kernel_scale(), nic.nccl_scale()), (1.0, 1.0));
    }

    #[test]
    fn bundled_load() {
        for name in bundled::names(bundled::HARDWARE) {
            let hw = Hardware::load(name).unwrap();
            assert_eq!(hw.name, name);
            for f in NUMERIC_FIELDS {
                assert!(hw.source_of(f).is_some(), "{name}: no source for {f}");
            }
            hw.kernel_profile().unwrap();
            hw.nccl_table().unwrap();
        }
        let h = Hardware::load("h100").unwrap();
        assert_eq!(h.peak_tflops, 989.4);
        assert_eq!(h.sm_count, 132);
    }

    #[test]
    fn minimal_toml_and_derived_values() {
        let hw = Hardware::from_toml_str(MINIMAL, "t").unwrap();
        assert_eq!(hw.name, "t");
        assert!((hw.effective_peak_tflops() - 800.0).abs() < 1e-9);
        assert!((hw.achieved_tflops(500.0) - 400.0).abs() < 1e-9);
        assert!((hw.efficiency(500.0) - 0.5).abs() < 1e-12);
        let l = hw.link_between(0, 7);
        assert_eq!(l, hw.intra_node_link());
        assert_eq!(hw.link_between(7, 8), hw.inter_node_link());
        // 4 us + 50e9 B / 50e9 B/s
        assert!((hw.inter_node_link().time_s(50_000_000_000) - 1.000004).abs() < 1e-9);
        assert_eq!(hw.inter_node_link().time_s(0), 0.0);
    }

    #[test]
    fn missing_key_is_named() {
        let text = MINIMAL.replace("nic_gbs = 50.0\n", "");
        let e = Hardware::from_toml_str(&text, "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nic_gbs") && e.contains("x.toml"), "{e}");
    }

    #[test]
    fn unknown_key_and_bad_values_are_named() {
        let e = Hardware::from_toml_str(&format!("{MINIMAL}nvlnk = 3\n"), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nvlnk"), "{e}");
        let e = Hardware::from_toml_str(&MINIMAL.replace("comm_sms = 20", "comm_sms = 100"), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("comm_sms"), "{e}");
        let e = Hardware::from_toml_str(&MINIMAL.replace("nic_gbs = 50.0", "nic_gbs = -1.0"), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nic_gbs"), "{e}");
        // Regression (bug hunt): a typo among the sources passed without a word.
        let e = Hardware::from_toml_str(&format!("{MINIMAL}[sources]\npeak_tflop = \"x\"\n"), "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sources.peak_tflop"), "{e}");
        let ok = format!("{MINIMAL}[sources]\npeak_tflops = \"x\"\nkernel_profile = \"y\"\n");
        assert!(Hardware::from_toml_str(&ok, "x").is_ok());
    }

    /// Regression: `nvlink_gbs = 1e-20` made `fcp simulate` run for ever, and a latency of
    /// 10¹⁸ µs gave a time below the lower bound (the sums overflowed).
    #[test]
    fn values_no_hardware_has_are_refused() {
        for (from, to, field) in [
            ("nvlink_gbs = 400.0", "nvlink_gbs = 1e-20", "nvlink_gbs"),
            ("nic_gbs = 50.0", "nic_gbs = 1e9", "nic_gbs"),
            ("peak_tflops = 1000.0", "peak_tflops = 1e300", "peak_tflops"),
            (
                "nvlink_latency_us = 2.0",
                "nvlink_latency_us = 1e18",
                "nvlink_latency_us",
            ),
            (
                "launch_overhead_us = 5.0",
                "launch_overhead_us = 2e6",
                "launch_overhead_us",
            ),
        ] {
            let text = MINIMAL.replace(from, to);
            assert_ne!(text, MINIMAL, "{from}");
            let e = Hardware::from_toml_str(&text, "x").unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
