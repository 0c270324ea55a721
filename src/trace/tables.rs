//! Distribution tables bundled into the binary (`include_str!`), so `fcp` works from any
//! directory. Each file under `traces/` starts with `#` comment lines naming its source and
//! how it was derived; see `docs/traces.md`.

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::TraceError;

/// MagiAttention production histogram (14 bins).
pub const MAGI_HISTOGRAM: &str = include_str!("../../traces/magi-histogram.csv");
/// Quantiles of DistCA's `dist_wlbllm.json`.
pub const WLB_LLM_QUANTILES: &str = include_str!("../../traces/wlb-llm-quantiles.csv");
/// Quantiles of DistCA's `dist_prolong.json`.
pub const PROLONG_QUANTILES: &str = include_str!("../../traces/prolong-quantiles.csv");
/// The Pile's components (Gao et al. 2020, Table 1) as a lognormal mixture.
pub const PILE_MIXTURE: &str = include_str!("../../traces/pile-mixture.csv");
/// RedPajama-1T subsets as a lognormal mixture (assumed per-subset means).
pub const REDPAJAMA_MIXTURE: &str = include_str!("../../traces/redpajama-mixture.csv");

/// One histogram bin: lengths `lo..=hi` (inclusive) seen `count` times.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct HistBin {
    /// Smallest length in the bin.
    pub lo: u64,
    /// Largest length in the bin.
    pub hi: u64,
    /// Documents in the bin.
    pub count: u64,
}

/// One quantile row: `doc_len` at cumulative probability `quantile`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct QuantileRow {
    /// Cumulative probability in `[0, 1]`.
    pub quantile: f64,
    /// Nearest-rank quantile of the source data.
    pub doc_len: u64,
}

/// One mixture component: documents drawn lognormally around `mean_tokens`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Component {
    /// Component name (e.g. `Books3`).
    pub component: String,
    /// Relative number of documents (a weight; the table stores estimated doc counts).
    pub docs: f64,
    /// Arithmetic mean document length in tokens.
    pub mean_tokens: f64,
    /// Lognormal σ of the component.
    pub sigma: f64,
}

/// Read a bundled (or derived) CSV table with `#` comments into rows of `T`.
pub fn read_table<T: DeserializeOwned>(name: &str, text: &str) -> Result<Vec<T>, TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut rows = Vec::new();
    for row in rdr.deserialize() {
        let row: T = row.map_err(|e| TraceError::Table {
            name: name.to_string(),
            line: e.position().map_or(0, |p| p.line()),
            message: e.to_string(),
        })?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(TraceError::Table {
            name: name.to_string(),
            line: 0,
            message: "no rows".into(),
        });
    }
    Ok(rows)
}

/// An empirical inverse CDF: rows of (probability, length), both non-decreasing, from
/// probability 0 to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileTable {
    /// The rows, in order.
    pub rows: Vec<QuantileRow>,
}

impl QuantileTable {
    /// Parse and check a quantile table (`quantile,doc_len` rows, `#` comments).
    pub fn parse(name: &str, text: &str) -> Result<QuantileTable, TraceError> {
        let rows: Vec<QuantileRow> = read_table(name, text)?;
        let ok = rows.len() >= 2
            && rows[0].quantile == 0.0
            && rows[rows.len() - 1].quantile == 1.0
            && rows.iter().all(|r| r.doc_len >= 1)
            && rows
                .windows(2)
                .all(|w| w[0].quantile < w[1].quantile && w[0].doc_len <= w[1].doc_len);
        if !ok {
            return Err(TraceError::Table {
                name: name.to_string(),
                line: 0,
                message: "need ≥ 2 rows from quantile 0 to 1, increasing, lengths ≥ 1 and \
                          non-decreasing"
                    .into(),
            });
        }
        Ok(QuantileTable { rows })
    }

    /// The length at cumulative probability `u ∈ [0, 1]`, interpolated log-linearly between
    /// the neighbouring rows (lengths are closer to log-uniform than uniform between
    /// quantiles of a heavy tail).
    pub fn at(&self, u: f64) -> u64 {
        let r = &self.rows;
        let u = u.clamp(0.0, 1.0);
        let i = r
            .partition_point(|row| row.quantile <= u)
            .clamp(1, r.len() - 1)
            - 1;
        let (a, b) = (&r[i], &r[i + 1]);
        let t = ((u - a.quantile) / (b.quantile - a.quantile)).clamp(0.0, 1.0);
        let (la, lb) = ((a.doc_len as f64).ln(), (b.doc_len as f64).ln());
        let v = (la + t * (lb - la)).exp();
        (v.round() as u64).clamp(a.doc_len, b.doc_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_tables_parse() {
        let bins: Vec<HistBin> = read_table("magi", MAGI_HISTOGRAM).unwrap();
        assert_eq!(bins.len(), 14);
        assert_eq!(bins.iter().map(|b| b.count).sum::<u64>(), 13_463_214);
        let wlb = QuantileTable::parse("wlb", WLB_LLM_QUANTILES).unwrap();
        assert_eq!(wlb.rows.len(), 1091);
        assert_eq!(wlb.rows[1090].doc_len, 124_913);
        let pro = QuantileTable::parse("prolong", PROLONG_QUANTILES).unwrap();
        assert_eq!(pro.rows[1090].doc_len, 340_149);
        let pile: Vec<Component> = read_table("pile", PILE_MIXTURE).unwrap();
        assert_eq!(pile.len(), 22);
        let rp: Vec<Component> = read_table("redpajama", REDPAJAMA_MIXTURE).unwrap();
        assert_eq!(rp.len(), 7);
    }

    #[test]
    fn quantile_table_interpolates_log_linearly() {
        let t = QuantileTable::parse("t", "quantile,doc_len\n0,1\n0.5,100\n0.9,100\n1,10000\n")
            .unwrap();
        assert_eq!(t.at(0.0), 1);
        assert_eq!(t.at(0.25), 10);
        assert_eq!(t.at(0.5), 100);
        assert_eq!(t.at(0.7), 100);
        assert_eq!(t.at(0.95), 1000);
        assert_eq!(t.at(1.0), 10_000);
        assert!(QuantileTable::parse("t", "quantile,doc_len\n0,5\n0.5,4\n1,6\n").is_err());
        assert!(QuantileTable::parse("t", "quantile,doc_len\n0,5\n").is_err());
    }
}
