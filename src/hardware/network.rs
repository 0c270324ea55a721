//! Measured NCCL bus bandwidth for collectives (`configs/nccl/*.csv`), so the simulator can cost
//! an all-gather or reduce-scatter by what NCCL actually reaches at that message size rather
//! than by the link's nominal bandwidth.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::bundled;
use super::HardwareError;

/// A collective with a measured bus-bandwidth curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// All-gather; `bytes` is the gathered (output) size, as in nccl-tests.
    AllGather,
    /// Reduce-scatter; `bytes` is the input size, as in nccl-tests.
    ReduceScatter,
    /// All-reduce.
    AllReduce,
}

impl Collective {
    /// nccl-tests' busbw factor: time = bytes · factor / busbw.
    /// (N−1)/N for all-gather and reduce-scatter, 2(N−1)/N for all-reduce.
    pub fn bus_factor(self, ngpu: u32) -> f64 {
        let n = ngpu.max(1) as f64;
        let ring = (n - 1.0) / n;
        match self {
            Collective::AllGather | Collective::ReduceScatter => ring,
            Collective::AllReduce => 2.0 * ring,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllReduce => "all_reduce",
        })
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all_gather" => Ok(Collective::AllGather),
            "reduce_scatter" => Ok(Collective::ReduceScatter),
            "all_reduce" => Ok(Collective::AllReduce),
            _ => Err(format!(
                "unknown collective `{s}` (expected all_gather, reduce_scatter or all_reduce)"
            )),
        }
    }
}

/// One nccl-tests measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclRow {
    /// Collective.
    pub op: Collective,
    /// GPUs in the communicator.
    pub ngpu: u32,
    /// Message size in bytes (nccl-tests `size`).
    pub size_bytes: u64,
    /// Bus bandwidth, GB/s (10^9 B/s).
    pub busbw_gbs: f64,
    /// Where the number comes from.
    pub source: String,
}

/// The answer to a bus-bandwidth query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BusBw {
    /// Interpolated bus bandwidth, GB/s.
    pub gbs: f64,
    /// Whether the size lay outside the measured range and an end value was used.
    pub clamped: bool,
}

/// A loaded NCCL bus-bandwidth table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclTable {
    /// Table name (bundled name or file stem).
    pub name: String,
    /// Rows in file order.
    pub rows: Vec<NcclRow>,
}

impl NcclTable {
    /// Load a bundled table (`h200-8gpu`) or a CSV by path.
    pub fn load(name_or_path: &str) -> Result<NcclTable, HardwareError> {
        let src = bundled::resolve(name_or_path, bundled::NCCL_TABLES, "NCCL table", ".csv")?;
        Self::from_csv_str(&src.name, &src.label, &src.text)
    }

    /// The table with every bus bandwidth multiplied by `factor`: the curves of a node whose
    /// links are `factor` times as fast as the ones measured ([`crate::Hardware::nccl_scale`],
    /// a what-if `nvlink_gbs`); a collective inside a node is bound by its links.
    pub fn scaled(mut self, factor: f64) -> NcclTable {
        if factor != 1.0 {
            for r in &mut self.rows {
                r.busbw_gbs *= factor;
            }
        }
        self
    }

    /// Parse and validate CSV text; `label` names it in errors.
    pub fn from_csv_str(name: &str, label: &str, text: &str) -> Result<NcclTable, HardwareError> {
        let parsed =
            crate::input::csv_rows::<NcclRow>(text).map_err(|message| HardwareError::Parse {
                file: label.to_string(),
                message,
            })?;
        let mut rows: Vec<NcclRow> = Vec::new();
        // Where each (op, GPUs, size) was first given: two rows for one point made the bandwidth
        // depend on their order (bug hunt: 6× apart at the table's end), so one is refused, as
        // kernel tables refuse a repeated series and length.
        let mut first_line: std::collections::BTreeMap<(Collective, u32, u64), u64> =
            std::collections::BTreeMap::new();
        let invalid = |field: &str, message: String| HardwareError::Invalid {
            file: label.to_string(),
            field: field.into(),
            message,
        };
        for (row, line) in parsed {
            if row.source.trim().is_empty() {
                return Err(invalid(
                    "source",
                    format!("line {line}: every row names where its number comes from"),
                ));
            }
            if let Some(prev) = first_line.insert((row.op, row.ngpu, row.size_bytes), line) {
                return Err(invalid(
                    "op/ngpu/size_bytes",
                    format!(
                        "line {line}: {} {} GPUs {} B was given already on line {prev}",
                        row.op, row.ngpu, row.size_bytes
                    ),
                ));
            }
            // busbw within the 0.01..=1e6 GB/s a profile's links may have: 1e-12 GB/s
            // overflowed a collective's time (bug hunt).
            if row.size_bytes == 0
                || row.ngpu < 2
                || !(row.busbw_gbs.is_finite() && (0.01..=1e6).contains(&row.busbw_gbs))
            {
                return Err(invalid(
                    "size_bytes/ngpu/busbw_gbs",
                    format!(
                        "line {line}: {} {} GPUs {} B: need size >= 1, ngpu >= 2, busbw 0.01..=1e6 GB/s",
                        row.op, row.ngpu, row.size_bytes
                    ),
                ));
            }
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(invalid("rows", "the table has no data rows".into()));
        }
        Ok(NcclTable {
            name: name.to_string(),
            rows,
        })
    }

    /// GPU counts measured for `op`, ascending.
    pub fn gpu_counts(&self, op: Collective) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .rows
            .iter()
            .filter(|r| r.op == op)
            .map(|r| r.ngpu)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Bus bandwidth for `op` on `ngpu` GPUs at `bytes`, interpolated linearly in log2(size)
    /// between the nearest measured sizes and clamped at the ends. The GPU count must be one
    /// that was measured (no extrapolation across communicator sizes).
    pub fn busbw_gbs(&self, op: Collective, ngpu: u32, bytes: u64) -> Result<BusBw, HardwareError> {
        let mut pts: Vec<(f64, f64)> = self
            .rows
            .iter()
            .filter(|r| r.op == op && r.ngpu == ngpu)
            .map(|r| (r.size_bytes as f64, r.busbw_gbs))
            .collect();
        if pts.is_empty() {
            let mut have: Vec<String> = self
                .rows
                .iter()
                .map(|r| format!("{} x{}", r.op, r.ngpu))
                .collect();
            have.dedup();
            return Err(HardwareError::NoNcclRow {
                table: self.name.clone(),
                op: op.to_string(),
                ngpu,
                available: have.join(", "),
            });
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let x = (bytes.max(1)) as f64;
        let (first, last) = (pts[0], pts[pts.len() - 1]);
        if x <= first.0 {
            return Ok(BusBw {
                gbs: first.1,
                clamped: x < first.0,
            });
        }
        if x >= last.0 {
            return Ok(BusBw {
                gbs: last.1,
                clamped: x > last.0,
            });
        }
        let i = pts
            .windows(2)
            .position(|w| w[0].0 <= x && x < w[1].0)
            .unwrap_or(0);
        let (a, b) = (pts[i], pts[i + 1]);
        let t = (x.log2() - a.0.log2()) / (b.0.log2() - a.0.log2());
        Ok(BusBw {
            gbs: a.1 + t * (b.1 - a.1),
            clamped: false,
        })
    }

    /// Time of one collective in seconds: `bytes · bus_factor / busbw` (nccl-tests' definition
    /// of bus bandwidth, inverted).
    pub fn collective_time_s(
        &self,
        op: Collective,
        ngpu: u32,
        bytes: u64,
    ) -> Result<f64, HardwareError> {
        if bytes == 0 {
            return Ok(0.0);
        }
        let bw = self.busbw_gbs(op, ngpu, bytes)?;
        Ok(bytes as f64 * op.bus_factor(ngpu) / (bw.gbs * 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (bug hunt, kernel tables): errors name the file's own line, past comments.
    #[test]
    fn nccl_table_errors_name_the_line() {
        let head = "op,ngpu,size_bytes,busbw_gbs,source";
        let text = format!("# measured\n{head}\n\nall_gather,8,1024,0,x\n");
        let e = NcclTable::from_csv_str("t", "t.csv", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 4: all_gather 8 GPUs 1024 B"), "{e}");
        let e = NcclTable::from_csv_str("t", "t.csv", &format!("{head}\n# c\nall_gather,8\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3: expected 5 fields, found 2"), "{e}");
    }

    /// Regression (bug hunt): a bus bandwidth of 1e-12 GB/s loaded, and a collective's time
    /// saturated `u64` nanoseconds; the layer's sums then wrapped to a normal-looking time.
    #[test]
    fn regression_a_bus_bandwidth_of_1e_12_is_refused() {
        let head = "op,ngpu,size_bytes,busbw_gbs,source";
        let load = |bw: &str| {
            NcclTable::from_csv_str("t", "t.csv", &format!("{head}\nall_gather,8,1024,{bw},x\n"))
        };
        for bad in ["1e-12", "0.001", "1e7", "inf"] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains("busbw 0.01..=1e6 GB/s"), "{bad}: {e}");
        }
        assert!(load("0.01").is_ok());
    }

    /// Regression (bug hunt): two rows for one (op, GPUs, size) were both kept, and which one
    /// priced a collective depended on their order in the file; a row without a source passed.
    #[test]
    fn nccl_table_refuses_a_point_given_twice_and_a_row_without_source() {
        let head = "op,ngpu,size_bytes,busbw_gbs,source";
        let text = format!(
            "{head}\nall_gather,8,1048576,100,x\nall_gather,8,1073741824,100,x\n\
             all_gather,8,1073741824,5,x\n"
        );
        let e = NcclTable::from_csv_str("t", "t.csv", &text)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 4: all_gather 8 GPUs 1073741824 B was given already on line 3"),
            "{e}"
        );
        // Another GPU count or op at the same size is another point.
        let ok = format!("{head}\nall_gather,8,1024,100,x\nall_gather,16,1024,90,x\n");
        assert!(NcclTable::from_csv_str("t", "t.csv", &ok).is_ok());
        let e =
            NcclTable::from_csv_str("t", "t.csv", &format!("{head}\nall_gather,8,1024,100, \n"))
                .unwrap_err()
                .to_string();
        assert!(e.contains("line 2: every row names where"), "{e}");
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn bundled_table_points_and_interpolation() {
        let t = NcclTable::load("h200-8gpu").unwrap();
        let at = |b| t.busbw_gbs(Collective::AllGather, 8, b).unwrap();
        assert_eq!(
            at(8 * MIB),
            BusBw {
                gbs: 97.0,
                clamped: false
            }
        );
        assert_eq!(at(128 * MIB).gbs, 331.0);
        // 8 MiB .. 16 MiB, halfway in log2 at sqrt(2)·8 MiB.
        let mid = at((8.0 * MIB as f64 * 2f64.sqrt()) as u64).gbs;
        assert!((mid - 132.0).abs() < 0.01, "{mid}");
        assert_eq!(
            at(1024),
            BusBw {
                gbs: 97.0,
                clamped: true
            }
        );
        assert!(at(64 << 30).clamped);
        assert_eq!(
            t.busbw_gbs(Collective::AllReduce, 8, 8 << 30).unwrap().gbs,
            479.0
        );
        assert_eq!(
            t.busbw_gbs(Collective::AllGather, 2, 128 * MIB)
                .unwrap()
                .gbs,
            285.0
        );
    }

    #[test]
    fn missing_combination_is_an_error() {
        let t = NcclTable::load("h200-8gpu").unwrap();
        let e = t
            .busbw_gbs(Collective::ReduceScatter, 4, MIB)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reduce_scatter on 4 GPUs") && e.contains("all_gather x8"),
            "{e}"
        );
    }

    #[test]
    fn collective_time() {
        let t = NcclTable::load("h200-8gpu").unwrap();
        // 128 MiB all-gather on 8: 7/8 · 134217728 B / 331e9 B/s.
        let s = t
            .collective_time_s(Collective::AllGather, 8, 128 * MIB)
            .unwrap();
        let want = 0.875 * 134_217_728.0 / 331e9;
        assert!((s - want).abs() < 1e-15, "{s} {want}");
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        assert_eq!(
            t.collective_time_s(Collective::AllGather, 8, 0).unwrap(),
            0.0
        );
    }
}
