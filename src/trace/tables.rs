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

/// The quantile values of a quantile table, checked to be ≥ 1 and non-decreasing.
pub fn quantile_values(name: &str, text: &str) -> Result<Vec<u64>, TraceError> {
    let rows: Vec<QuantileRow> = read_table(name, text)?;
    let values: Vec<u64> = rows.iter().map(|r| r.doc_len).collect();
    if values.len() < 2 || values[0] == 0 || values.windows(2).any(|w| w[0] > w[1]) {
        return Err(TraceError::Table {
            name: name.to_string(),
            line: 0,
            message: "quantiles must be ≥ 1, non-decreasing, and at least two".into(),
        });
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_tables_parse() {
        let bins: Vec<HistBin> = read_table("magi", MAGI_HISTOGRAM).unwrap();
        assert_eq!(bins.len(), 14);
        assert_eq!(bins.iter().map(|b| b.count).sum::<u64>(), 13_463_214);
        assert_eq!(quantile_values("wlb", WLB_LLM_QUANTILES).unwrap().len(), 1001);
        assert_eq!(quantile_values("prolong", PROLONG_QUANTILES).unwrap().len(), 1001);
        let pile: Vec<Component> = read_table("pile", PILE_MIXTURE).unwrap();
        assert_eq!(pile.len(), 22);
        let rp: Vec<Component> = read_table("redpajama", REDPAJAMA_MIXTURE).unwrap();
        assert_eq!(rp.len(), 7);
    }
}
