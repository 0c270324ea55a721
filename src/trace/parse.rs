//! Reading traces: CSV with a `doc_len` column (optionally `batch`), JSONL with one
//! `{"doc_lens": [...]}` batch per line, from a file or stdin (`-`).
//!
//! Parsing never panics on user input: every problem becomes a [`TraceError`] that names the
//! line, so a user can fix a hand-edited trace quickly.

use std::io::Read;
use std::path::Path;

use super::{Trace, TraceDoc, TraceError};

/// Input formats a trace can come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CSV with a header naming a `doc_len` column.
    Csv,
    /// JSON Lines, one `{"doc_lens": [...]}` object (= one pinned batch) per line.
    Jsonl,
}

impl Format {
    /// The format a path implies: `.jsonl` / `.json` are JSONL, anything else CSV.
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("json") => {
                Format::Jsonl
            }
            _ => Format::Csv,
        }
    }

    /// Guess from content (used for stdin, which has no extension): JSONL if the first
    /// non-blank character is `{` (or `[`, a JSON array of lengths).
    pub fn sniff(text: &str) -> Format {
        match text.trim_start().chars().next() {
            Some('{' | '[') => Format::Jsonl,
            _ => Format::Csv,
        }
    }
}

impl Trace {
    /// Read a trace from `path`; `-` reads stdin. The format follows the extension
    /// (`.jsonl`/`.json` → JSONL, else CSV); stdin is sniffed by its first character.
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let io_err = |source| TraceError::Io {
            path: path.display().to_string(),
            source,
        };
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(io_err)?;
            return Trace::parse_str(&text, Format::sniff(&text));
        }
        let text = std::fs::read_to_string(path).map_err(io_err)?;
        Trace::parse_str(&text, Format::from_path(path))
    }

    /// Parse text in the given format.
    pub fn parse_str(text: &str, format: Format) -> Result<Trace, TraceError> {
        match format {
            Format::Csv => Trace::from_csv_str(text),
            Format::Jsonl => Trace::from_jsonl_str(text),
        }
    }

    /// Parse CSV: a header with a `doc_len` column (other columns are ignored) and an optional
    /// `batch` column that pins each document to a batch id. Lines starting with `#` are
    /// comments; fields are trimmed.
    pub fn from_csv_str(text: &str) -> Result<Trace, TraceError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(true)
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let headers = rdr.headers().map_err(csv_error)?.clone();
        if headers.is_empty() || (headers.len() == 1 && headers[0].is_empty()) {
            return Err(TraceError::Empty);
        }
        let len_col = headers.iter().position(|h| h == "doc_len").ok_or_else(|| {
            TraceError::MissingColumn {
                found: headers.iter().collect::<Vec<_>>().join(","),
            }
        })?;
        let batch_col = headers.iter().position(|h| h == "batch");
        let mut docs = Vec::new();
        for record in rdr.records() {
            let record = record.map_err(csv_error)?;
            let line = record.position().map_or(0, |p| p.line());
            let value = record.get(len_col).unwrap_or("");
            let len = parse_len(value).ok_or_else(|| TraceError::BadLength {
                line,
                value: value.to_string(),
            })?;
            let batch = match batch_col {
                None => None,
                Some(c) => {
                    let v = record.get(c).unwrap_or("");
                    Some(v.parse::<u64>().map_err(|_| TraceError::BadBatch {
                        line,
                        value: v.to_string(),
                    })?)
                }
            };
            docs.push(TraceDoc { len, batch });
        }
        if docs.is_empty() {
            return Err(TraceError::Empty);
        }
        Ok(Trace { docs })
    }

    /// Parse JSONL: each non-blank line is an object with a `doc_lens` array of positive
    /// integers and becomes one pinned batch (batch ids 0, 1, ... in line order). Other keys
    /// are ignored. A file that is a single JSON array of lengths (DistCA's `dist_*.json`
    /// format) is accepted too, as unpinned documents.
    pub fn from_jsonl_str(text: &str) -> Result<Trace, TraceError> {
        if text.trim_start().starts_with('[') {
            return Ok(Trace::from_lens(&super::parse_json_lengths(text)?));
        }
        let mut docs = Vec::new();
        let mut batch = 0u64;
        for (i, raw) in text.lines().enumerate() {
            let line = i as u64 + 1;
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let json_err = |message: String| TraceError::Json { line, message };
            let value: serde_json::Value =
                serde_json::from_str(raw).map_err(|e| json_err(format!("invalid JSON: {e}")))?;
            let lens = value
                .get("doc_lens")
                .and_then(|v| v.as_array())
                .ok_or_else(|| json_err("expected an object with a `doc_lens` array".into()))?;
            if lens.is_empty() {
                return Err(json_err("`doc_lens` is empty".into()));
            }
            for v in lens {
                let len = v
                    .as_u64()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| TraceError::BadLength {
                        line,
                        value: v.to_string(),
                    })?;
                docs.push(TraceDoc {
                    len,
                    batch: Some(batch),
                });
            }
            batch += 1;
        }
        if docs.is_empty() {
            return Err(TraceError::Empty);
        }
        Ok(Trace { docs })
    }
}

/// A length: an integer ≥ 1, nothing else (no sign, no fraction, no exponent).
fn parse_len(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok().filter(|&n| n >= 1)
}

fn csv_error(e: csv::Error) -> TraceError {
    let line = e.position().map_or(0, |p| p.line());
    let message = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("expected {expected_len} fields, found {len}"),
        _ => e.to_string(),
    };
    TraceError::Csv { line, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(t: &Trace) -> Vec<u64> {
        t.docs.iter().map(|d| d.len).collect()
    }

    #[test]
    fn csv_basic_and_extra_columns() {
        let t = Trace::from_csv_str("id,doc_len,note\n1,10,a\n2, 20 ,b\n").unwrap();
        assert_eq!(lens(&t), vec![10, 20]);
        assert!(t.docs.iter().all(|d| d.batch.is_none()));
    }

    #[test]
    fn csv_comments_and_batch_column() {
        let t = Trace::from_csv_str("# made by hand\ndoc_len,batch\n5,1\n# c\n6,0\n7,1\n").unwrap();
        assert_eq!(lens(&t), vec![5, 6, 7]);
        assert_eq!(t.docs[1].batch, Some(0));
        assert!(t.is_pinned());
    }

    #[test]
    fn csv_errors_name_the_line() {
        for (text, line) in [
            ("doc_len\n5\n0\n", 3),
            ("doc_len\n5\n-3\n", 3),
            ("doc_len\n5\n2.5\n", 3),
            ("doc_len\nabc\n", 2),
            ("doc_len\n\"\"\n", 2),
        ] {
            match Trace::from_csv_str(text) {
                Err(TraceError::BadLength { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        match Trace::from_csv_str("doc_len,x\n5,1\n6\n") {
            Err(e @ TraceError::Csv { line: 3, .. }) => assert!(e.to_string().contains("line 3")),
            other => panic!("{other:?}"),
        }
        match Trace::from_csv_str("doc_len,batch\n5,x\n") {
            Err(TraceError::BadBatch { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn csv_missing_column_and_empty() {
        assert!(matches!(
            Trace::from_csv_str("len\n5\n"),
            Err(TraceError::MissingColumn { .. })
        ));
        assert!(matches!(Trace::from_csv_str(""), Err(TraceError::Empty)));
        assert!(matches!(
            Trace::from_csv_str("doc_len\n"),
            Err(TraceError::Empty)
        ));
    }

    #[test]
    fn jsonl_batches() {
        let t = Trace::from_jsonl_str("{\"doc_lens\": [3, 4]}\n\n{\"doc_lens\": [5], \"x\": 1}\n")
            .unwrap();
        assert_eq!(lens(&t), vec![3, 4, 5]);
        assert_eq!(t.docs[2].batch, Some(1));
    }

    #[test]
    fn json_array_and_bom() {
        let t = Trace::from_jsonl_str(" [3, 4, 5]\n").unwrap();
        assert_eq!(lens(&t), vec![3, 4, 5]);
        assert!(!t.is_pinned());
        assert!(Trace::from_jsonl_str("[3, 0]").is_err());
        let t = Trace::from_csv_str("\u{feff}doc_len\n7\n").unwrap();
        assert_eq!(lens(&t), vec![7]);
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        for text in [
            "{\"doc_lens\": [1]}\n{\"doc_lens\": [0]}\n",
            "{\"doc_lens\": [1]}\n{\"doc_lens\": [1.5]}\n",
            "{\"doc_lens\": [1]}\n{\"doc_lens\": [-1]}\n",
            "{\"doc_lens\": [1]}\nnot json\n",
            "{\"doc_lens\": [1]}\n{\"lens\": [1]}\n",
            "{\"doc_lens\": [1]}\n{\"doc_lens\": []}\n",
        ] {
            let e = Trace::from_jsonl_str(text).unwrap_err();
            assert!(e.to_string().starts_with("line 2:"), "{text:?}: {e}");
        }
        assert!(matches!(
            Trace::from_jsonl_str("\n\n"),
            Err(TraceError::Empty)
        ));
    }

    #[test]
    fn format_detection() {
        assert_eq!(Format::from_path(Path::new("a.jsonl")), Format::Jsonl);
        assert_eq!(Format::from_path(Path::new("a.JSON")), Format::Jsonl);
        assert_eq!(Format::from_path(Path::new("a.csv")), Format::Csv);
        assert_eq!(Format::from_path(Path::new("a")), Format::Csv);
        assert_eq!(Format::sniff("  {\"doc_lens\":[1]}"), Format::Jsonl);
        assert_eq!(Format::sniff("doc_len\n1\n"), Format::Csv);
    }

    #[test]
    fn missing_file_is_an_error() {
        let e = Trace::load(Path::new("/nonexistent/fcp-trace.csv")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/fcp-trace.csv"));
    }
}
