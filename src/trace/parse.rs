//! Reading traces: CSV with a `doc_len` column (optionally `batch`), JSONL with one
//! `{"doc_lens": [...]}` batch per line, from a file or stdin (`-`).
//!
//! Parsing never panics on user input: every problem becomes a [`TraceError`] that names the
//! line, so a user can fix a hand-edited trace quickly.

use std::io::{BufRead, Read};
use std::path::Path;

use super::{Trace, TraceDoc, TraceError, MAX_DOC_LEN};
use std::cell::RefCell;
use std::rc::Rc;

use crate::input::{LineEnds, LineLog, LineLogging, TextOnly};
use crate::jsonpos::{value_as_written, Seg};

/// What a trace file is, for [`TextOnly`]'s refusals.
const TRACE: &str = "a CSV or JSONL trace";

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

    /// What ends a line for this format's reader, so the line limit counts lines as it does.
    fn line_ends(self) -> LineEnds {
        match self {
            Format::Csv => LineEnds::Csv,
            Format::Jsonl => LineEnds::Lf,
        }
    }
}

impl Trace {
    /// Read a trace from `path`; `-` reads stdin. The format follows the extension
    /// (`.jsonl`/`.json` → JSONL, else CSV); stdin is sniffed by its first character.
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        DocReader::open(path)?.collect_trace()
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
        DocReader::csv(text.as_bytes())?.collect_trace()
    }

    /// Parse JSONL: each non-blank line is an object with a `doc_lens` array of positive
    /// integers and becomes one pinned batch (batch ids 0, 1, ... in line order). Other keys
    /// are ignored. A file that is a single JSON array of lengths (DistCA's `dist_*.json`
    /// format) is accepted too, as unpinned documents.
    pub fn from_jsonl_str(text: &str) -> Result<Trace, TraceError> {
        DocReader::jsonl(text.as_bytes())?.collect_trace()
    }
}

/// A trace read one document at a time, so `fcp trace stats` and `fcp trace pack` handle a
/// 10M-document file in bounded memory. The whole-trace parsers above are this reader
/// collected, so both paths accept and reject exactly the same inputs with the same messages.
///
/// Yields documents in order, then — if there were none — one [`TraceError::Empty`]; after an
/// error it yields nothing more. A JSON array of lengths (one value spanning the file) is the
/// one form read whole.
pub struct DocReader<R: BufRead> {
    inner: Inner<R>,
    /// Whether documents carry batch ids (known from the header / format before the first).
    pinned: bool,
    yielded: bool,
    done: bool,
    /// The path, for I/O errors met while reading (`None`: in-memory text).
    path: Option<String>,
}

enum Inner<R: BufRead> {
    Csv {
        rdr: csv::Reader<LineLogging<R>>,
        /// Where the lines are, for errors naming them ([`LineLogging`]).
        lines: Rc<RefCell<LineLog>>,
        len_col: usize,
        batch_col: Option<usize>,
        record: csv::StringRecord,
    },
    Jsonl {
        src: R,
        line: u64,
        batch: u64,
        buf: String,
        pending: std::vec::IntoIter<TraceDoc>,
    },
    Array(std::vec::IntoIter<u64>),
}

impl DocReader<Box<dyn BufRead>> {
    /// Open `path` (`-`: stdin, sniffed by its first non-blank character; otherwise the format
    /// the extension names).
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let io_err = |source| TraceError::Io {
            path: path.display().to_string(),
            source,
        };
        let (src, format): (Box<dyn BufRead>, Format) = if path == Path::new("-") {
            // Read up to the first non-blank byte to sniff the format, then put it back.
            let mut stdin = std::io::stdin().lock();
            let mut head = Vec::new();
            loop {
                let buf = stdin.fill_buf().map_err(io_err)?;
                if buf.is_empty() {
                    break;
                }
                let blank = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
                let found = blank < buf.len();
                let take = if found { buf.len() } else { blank };
                head.extend_from_slice(&buf[..take]);
                stdin.consume(take);
                if found {
                    break;
                }
            }
            let format = Format::sniff(&String::from_utf8_lossy(strip_bom(&head)));
            let text = TextOnly::with_line_ends(
                std::io::Cursor::new(head).chain(stdin),
                TRACE,
                format.line_ends(),
            );
            (
                Box::new(std::io::BufReader::with_capacity(1 << 16, text)),
                format,
            )
        } else {
            let f = crate::read_guard::open(path).map_err(io_err)?;
            let format = Format::from_path(path);
            (
                Box::new(std::io::BufReader::with_capacity(
                    1 << 16,
                    TextOnly::with_line_ends(f, TRACE, format.line_ends()),
                )),
                format,
            )
        };
        // I/O errors surface through the parsers without a path; name it here.
        let named = |e: TraceError| match e {
            TraceError::Io { source, .. } => io_err(source),
            e => e,
        };
        let mut r = match format {
            Format::Csv => DocReader::csv(src),
            Format::Jsonl => DocReader::jsonl(src),
        }
        .map_err(named)?;
        r.path = Some(path.display().to_string());
        Ok(r)
    }
}
/// A CSV line of spaces alone: blank, as an empty line is (a quoted empty value `""` is not).
fn is_blank(record: &csv::StringRecord) -> bool {
    record.len() == 1 && !record[0].is_empty() && record[0].trim().is_empty()
}

impl<R: BufRead> DocReader<R> {
    /// Read CSV (see [`Trace::from_csv_str`]); the header is read and checked here.
    pub fn csv(mut src: R) -> Result<Self, TraceError> {
        // A UTF-8 byte-order mark (Excel) would otherwise glue itself to the first header.
        skip_bom(&mut src);
        let (src, lines) = LineLogging::new(src);
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .comment(Some(b'#'))
            .from_reader(src);
        // Fields are trimmed here rather than by the reader, which made a line of spaces and
        // a quoted empty value alike. The header is the first line with something on it: lines of spaces are blank lines,
        // before the header as after it (bug hunt: one before the header was read as an
        // empty header, and the file as holding no documents).
        let mut headers = csv::StringRecord::new();
        loop {
            let more = rdr.read_record(&mut headers);
            let line = lines
                .borrow_mut()
                .line_of_record_ending(rdr.position().byte());
            if !more.map_err(|e| csv_error(e, line))? {
                return Err(TraceError::Empty);
            }
            if !is_blank(&headers) {
                break;
            }
        }
        let headers: csv::StringRecord = headers.iter().map(str::trim).collect();
        let len_col = headers.iter().position(|h| h == "doc_len").ok_or_else(|| {
            TraceError::MissingColumn {
                found: headers.iter().collect::<Vec<_>>().join(","),
            }
        })?;
        for name in ["doc_len", "batch"] {
            if headers.iter().filter(|h| *h == name).count() > 1 {
                return Err(TraceError::Json {
                    line: 1,
                    message: format!(
                        "the header names `{name}` twice; which column holds the lengths is ambiguous"
                    ),
                });
            }
        }
        let batch_col = headers.iter().position(|h| h == "batch");
        Ok(DocReader {
            inner: Inner::Csv {
                rdr,
                lines,
                len_col,
                batch_col,
                record: csv::StringRecord::new(),
            },
            pinned: batch_col.is_some(),
            yielded: false,
            done: false,
            path: None,
        })
    }

    /// Read JSONL (see [`Trace::from_jsonl_str`]). A JSON array of lengths is detected by its
    /// first non-blank line and read whole.
    pub fn jsonl(mut src: R) -> Result<Self, TraceError> {
        // Editors that write a byte-order mark write it before JSON too.
        skip_bom(&mut src);
        // Skip blank lines to see the first value, counting them for line numbers; keep them
        // so a JSON array's error positions match the file.
        let mut head = String::new();
        let mut start;
        let mut line = 0u64;
        loop {
            start = head.len();
            let n = src
                .read_line(&mut head)
                .map_err(|e| jsonl_io(line + 1, e))?;
            if n == 0 || !head[start..].trim().is_empty() {
                break;
            }
            line += 1;
        }
        if head[start..].trim_start().starts_with('[') {
            src.read_to_string(&mut head)
                .map_err(|e| jsonl_io(line + 1, e))?;
            let lens = super::parse_json_lengths(&head)?;
            return Ok(DocReader {
                inner: Inner::Array(lens.into_iter()),
                pinned: false,
                yielded: false,
                done: false,
                path: None,
            });
        }
        let buf = head.split_off(start);
        let mut r = DocReader {
            inner: Inner::Jsonl {
                src,
                line,
                batch: 0,
                buf: String::new(),
                pending: Vec::new().into_iter(),
            },
            pinned: true,
            yielded: false,
            done: false,
            path: None,
        };
        // The first non-blank line has been read; parse it as the first batch.
        if let Inner::Jsonl {
            line,
            batch,
            pending,
            ..
        } = &mut r.inner
        {
            if !buf.trim().is_empty() {
                *line += 1;
                *pending = jsonl_batch(&buf, *line, *batch)?.into_iter();
                *batch += 1;
            }
        }
        Ok(r)
    }

    /// Whether the documents carry batch ids (a CSV `batch` column, or JSONL batches).
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Read everything into a [`Trace`].
    pub fn collect_trace(self) -> Result<Trace, TraceError> {
        Ok(Trace {
            docs: self.collect::<Result<Vec<_>, _>>()?,
        })
    }

    /// The next document, `None` at the end of the input.
    fn read(&mut self) -> Result<Option<TraceDoc>, TraceError> {
        match &mut self.inner {
            Inner::Csv {
                rdr,
                lines,
                len_col,
                batch_col,
                record,
            } => {
                let line = loop {
                    let more = rdr.read_record(record);
                    let line = lines
                        .borrow_mut()
                        .line_of_record_ending(rdr.position().byte());
                    if !more.map_err(|e| csv_error(e, line))? {
                        return Ok(None);
                    }
                    if !is_blank(record) {
                        break line;
                    }
                };
                let value = record.get(*len_col).unwrap_or("").trim();
                let len = parse_len(value).ok_or_else(|| TraceError::BadLength {
                    line,
                    value: quote(value),
                })?;
                let batch = match batch_col {
                    None => None,
                    Some(c) => {
                        let v = record.get(*c).unwrap_or("").trim();
                        Some(v.parse::<u64>().map_err(|_| TraceError::BadBatch {
                            line,
                            value: v.to_string(),
                        })?)
                    }
                };
                Ok(Some(TraceDoc { len, batch }))
            }
            Inner::Jsonl {
                src,
                line,
                batch,
                buf,
                pending,
            } => loop {
                if let Some(d) = pending.next() {
                    return Ok(Some(d));
                }
                buf.clear();
                if src.read_line(buf).map_err(|e| jsonl_io(*line + 1, e))? == 0 {
                    return Ok(None);
                }
                *line += 1;
                if buf.trim().is_empty() {
                    continue;
                }
                *pending = jsonl_batch(buf, *line, *batch)?.into_iter();
                *batch += 1;
            },
            Inner::Array(lens) => Ok(lens.next().map(|len| TraceDoc { len, batch: None })),
        }
    }
}

impl<R: BufRead> Iterator for DocReader<R> {
    type Item = Result<TraceDoc, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = match self.read() {
            Ok(Some(d)) => {
                self.yielded = true;
                return Some(Ok(d));
            }
            Ok(None) if self.yielded => None,
            Ok(None) => Some(Err(TraceError::Empty)),
            Err(e) => Some(Err(match (&self.path, e) {
                (Some(path), TraceError::Io { source, .. }) => TraceError::Io {
                    path: path.clone(),
                    source,
                },
                (_, e) => e,
            })),
        };
        self.done = true;
        item
    }
}

/// An I/O error met reading JSONL (invalid UTF-8, a failing disk), at `line`.
/// The UTF-8 byte-order mark some editors (Excel, Notepad) put at the start of a text file.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Consume a byte-order mark at the start of `src`, if there is one.
fn skip_bom<R: BufRead>(src: &mut R) {
    if src.fill_buf().is_ok_and(|b| b.starts_with(BOM)) {
        src.consume(BOM.len());
    }
}

/// `head` without a leading byte-order mark.
fn strip_bom(head: &[u8]) -> &[u8] {
    head.strip_prefix(BOM).unwrap_or(head)
}

/// An error reading JSONL line `line`: a refusal of the whole input (a NUL byte met while
/// reading ahead, bug hunt: it was put on the line being read) names its byte and the
/// path; anything else (bytes that are not UTF-8) is the line's.
fn jsonl_io(line: u64, e: std::io::Error) -> TraceError {
    if crate::input::is_refusal(&e) {
        // The reader names the path (see `DocReader::next`).
        return TraceError::Io {
            path: "input".into(),
            source: e,
        };
    }
    TraceError::Json {
        line,
        message: e.to_string(),
    }
}

/// A JSONL line as read: an object, keeping the first key it names twice (serde_json's own
/// `Value` keeps the last value of a repeated key without a word, so
/// `{"doc_lens": [..], "doc_lens": [..]}` dropped a batch's lengths), or anything else.
enum JsonlLine {
    Object {
        map: serde_json::Map<String, serde_json::Value>,
        twice: Option<String>,
    },
    Other,
}

impl<'de> serde::Deserialize<'de> for JsonlLine {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct Line;
        impl<'de> Visitor<'de> for Line {
            type Value = JsonlLine;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<JsonlLine, A::Error> {
                let mut map = serde_json::Map::new();
                let mut twice = None;
                while let Some(key) = m.next_key::<String>()? {
                    if map.contains_key(&key) {
                        m.next_value::<IgnoredAny>()?;
                        twice.get_or_insert(key);
                    } else {
                        let v = m.next_value()?;
                        map.insert(key, v);
                    }
                }
                Ok(JsonlLine::Object { map, twice })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<JsonlLine, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(JsonlLine::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<JsonlLine, E> {
                Ok(JsonlLine::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<JsonlLine, E> {
                Ok(JsonlLine::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<JsonlLine, E> {
                Ok(JsonlLine::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<JsonlLine, E> {
                Ok(JsonlLine::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<JsonlLine, E> {
                Ok(JsonlLine::Other)
            }
            fn visit_unit<E>(self) -> Result<JsonlLine, E> {
                Ok(JsonlLine::Other)
            }
        }
        d.deserialize_any(Line)
    }
}

/// The documents of one JSONL line, pinned to `batch`.
fn jsonl_batch(raw: &str, line: u64, batch: u64) -> Result<Vec<TraceDoc>, TraceError> {
    let raw = raw.trim();
    let json_err = |message: String| TraceError::Json { line, message };
    let value: JsonlLine =
        serde_json::from_str(raw).map_err(|e| json_err(format!("invalid JSON: {e}")))?;
    if let JsonlLine::Object {
        twice: Some(key), ..
    } = &value
    {
        return Err(json_err(format!(
            "the object names `{key}` twice; which value it means is ambiguous"
        )));
    }
    let lens = match &value {
        JsonlLine::Object { map, .. } => map.get("doc_lens").and_then(|v| v.as_array()),
        JsonlLine::Other => None,
    }
    .ok_or_else(|| json_err("expected an object with a `doc_lens` array".into()))?;
    if lens.is_empty() {
        return Err(json_err("`doc_lens` is empty".into()));
    }
    lens.iter()
        .enumerate()
        .map(|(i, v)| {
            let len = v
                .as_u64()
                .filter(|&n| (1..=MAX_DOC_LEN).contains(&n))
                .ok_or_else(|| TraceError::BadLength {
                    line,
                    // As written: `1e3`, not the `1000.0` serde_json parsed it into.
                    value: quote(&value_as_written(
                        raw,
                        &[Seg::Key("doc_lens"), Seg::Index(i)],
                        v,
                    )),
                })?;
            Ok(TraceDoc {
                len,
                batch: Some(batch),
            })
        })
        .collect()
}

/// A length: an integer in 1..=[`MAX_DOC_LEN`], nothing else (no sign, no fraction, no
/// exponent).
fn parse_len(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>()
        .ok()
        .filter(|&n| (1..=MAX_DOC_LEN).contains(&n))
}

/// The offending text for an error message, cut to a readable length.
fn quote(value: &str) -> String {
    const MAX: usize = 40;
    match value.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}… ({} bytes)", &value[..at], value.len()),
        None => value.to_string(),
    }
}

/// A csv error on `line` (csv's own count is wrong past blank lines and `\r\n` endings).
fn csv_error(e: csv::Error, line: u64) -> TraceError {
    let message = crate::input::csv_what(&e, None);
    match e.into_kind() {
        // The reader names the path (see `DocReader::next`).
        csv::ErrorKind::Io(source) => TraceError::Io {
            path: "input".into(),
            source,
        },
        _ => TraceError::Csv { line, message },
    }
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
    /// Regression (bug hunt): a line of spaces before the header was read as an empty header
    /// ("trace is empty"), and one between lengths as an empty length, where an empty line
    /// is skipped; both are blank lines now, and a quoted empty value is still refused.
    fn lines_of_spaces_are_blank_lines() {
        let t = Trace::from_csv_str("  \ndoc_len\n5\n \t\n6\n").unwrap();
        assert_eq!(t.lens(), vec![5, 6]);
        assert!(matches!(
            Trace::from_csv_str("  \n\t\n"),
            Err(TraceError::Empty)
        ));
        assert!(matches!(
            Trace::from_csv_str("doc_len\n5\n\"\"\n"),
            Err(TraceError::BadLength { line: 3, .. })
        ));
        let t = Trace::from_csv_str(" doc_len , batch \n 5 , 0 \n").unwrap();
        assert_eq!(t.lens(), vec![5]);
    }

    #[test]
    fn csv_errors_name_the_line() {
        for (text, line) in [
            ("doc_len\n5\n0\n", 3),
            ("doc_len\n5\n-3\n", 3),
            ("doc_len\n5\n2.5\n", 3),
            ("doc_len\nabc\n", 2),
            ("doc_len\n\"\"\n", 2),
            // Regression (bug hunt): csv's own count missed `\r\n` endings and skipped
            // blank lines (line 4 for 5, line 3 for 11).
            ("doc_len\r\n1\r\n2\r\n3\r\nabc\r\n", 5),
            ("doc_len\n1\n\n\n\n\n\n\n\n\nabc\n", 11),
            ("# a comment\ndoc_len\n# another\n\n1\nabc", 6),
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
        match Trace::from_csv_str("doc_len,x\r\n5,1\r\n# c\r\n\r\n6\r\n") {
            Err(TraceError::Csv { line: 5, .. }) => {}
            other => panic!("{other:?}"),
        }
        match Trace::from_csv_str("doc_len,batch\n5,x\n") {
            Err(TraceError::BadBatch { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    /// Regression (bug hunt): with old-Mac `\r` line endings, which the csv reader splits
    /// lines at, every error was on "line 1".
    #[test]
    fn cr_only_line_endings_name_the_true_line() {
        match Trace::from_csv_str("doc_len\r1\r2\r3\r4\r5\r-7\r") {
            Err(TraceError::BadLength { line: 7, .. }) => {}
            other => panic!("{other:?}"),
        }
        match Trace::from_csv_str("doc_len,x\r\r5,1\r\n\r6\r") {
            Err(TraceError::Csv { line: 5, .. }) => {}
            other => panic!("{other:?}"),
        }
        let t = Trace::from_csv_str("doc_len\r1\r\r2\n3\r\n4").unwrap();
        assert_eq!(lens(&t), vec![1, 2, 3, 4]);
    }

    /// Regression (bug hunt): a `#` comment in a file with old-Mac `\r` endings ran on to
    /// the end of the file (the csv crate ends comments at `\n` only): the trace was refused
    /// as empty, or lost every row after the comment.
    #[test]
    fn comments_end_at_a_lone_cr() {
        let t = Trace::from_csv_str("# from the cluster\rdoc_len\r1\r# two more\r2\r3\r").unwrap();
        assert_eq!(lens(&t), vec![1, 2, 3]);
        match Trace::from_csv_str("# c\rdoc_len\r1\r# c\r-2\r") {
            Err(TraceError::BadLength { line: 5, .. }) => {}
            other => panic!("{other:?}"),
        }
        // Mixed endings keep their lines.
        let t = Trace::from_csv_str("doc_len\r\n# c\r\n4\r# d\n5\r\n").unwrap();
        assert_eq!(lens(&t), vec![4, 5]);
    }

    /// Regression (bug hunt): a `#` comment on a last line with no line end was read as a
    /// document of length ``, whatever the line endings.
    #[test]
    fn a_comment_on_an_unended_last_line_is_a_comment() {
        for text in [
            "doc_len\n5000\n3000\n# end",
            "doc_len\r\n5000\r\n3000\r\n# end",
            "doc_len\r5000\r3000\r#",
        ] {
            let t = Trace::from_csv_str(text).unwrap();
            assert_eq!(lens(&t), vec![5000, 3000], "{text:?}");
        }
        // A last line without an end is still read, and errors name it.
        assert_eq!(lens(&Trace::from_csv_str("doc_len\n7").unwrap()), vec![7]);
        match Trace::from_csv_str("doc_len\n7\nx") {
            Err(TraceError::BadLength { line: 3, .. }) => {}
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
    fn a_line_past_the_limit_is_refused_wherever_it_starts() {
        use std::io::BufReader;
        let text = |body: &str| -> Vec<u8> { body.as_bytes().to_vec() };
        let read = |bytes: Vec<u8>, jsonl: bool| {
            let src = BufReader::new(TextOnly::with_line_limit(
                std::io::Cursor::new(bytes),
                TRACE,
                40,
            ));
            let r = if jsonl {
                DocReader::jsonl(src)
            } else {
                DocReader::csv(src)
            };
            r.and_then(DocReader::collect_trace)
        };
        // The limit counts from each line's start: many short lines pass.
        let ok = format!("doc_len\n{}", "100\n".repeat(30));
        assert_eq!(read(text(&ok), false).unwrap().docs.len(), 30);
        let long = format!("doc_len\n100\n{}", "7".repeat(60));
        let err = read(text(&long), false).unwrap_err().to_string();
        assert!(
            err.contains("the line starting at byte 12 runs on"),
            "{err}"
        );
        let long = format!(
            "{{\"doc_lens\": [1]}}\n{{\"doc_lens\": [{}",
            "1, ".repeat(30)
        );
        let err = read(text(&long), true).unwrap_err().to_string();
        assert!(
            err.contains("the line starting at byte 18 runs on"),
            "{err}"
        );
    }

    #[test]
    fn jsonl_batches() {
        let t = Trace::from_jsonl_str("{\"doc_lens\": [3, 4]}\n\n{\"doc_lens\": [5], \"x\": 1}\n")
            .unwrap();
        assert_eq!(lens(&t), vec![3, 4, 5]);
        assert_eq!(t.docs[2].batch, Some(1));
    }

    /// Regression: lengths up to u64::MAX were read (their sum saturated in `trace stats`), a
    /// 200 KB field was echoed whole, and a second `doc_len` column was silently ignored.
    #[test]
    fn lengths_beyond_the_cap_long_fields_and_duplicate_columns_are_errors() {
        let big = format!("doc_len\n{}\n", MAX_DOC_LEN + 1);
        assert!(Trace::from_csv_str(&big).is_err());
        let ok = format!("doc_len\n{MAX_DOC_LEN}\n");
        assert_eq!(lens(&Trace::from_csv_str(&ok).unwrap()), vec![MAX_DOC_LEN]);
        assert!(Trace::from_jsonl_str(&format!("[{}]", u64::MAX)).is_err());
        let long = format!("doc_len\n{}\n", "x".repeat(200_000));
        let e = Trace::from_csv_str(&long).unwrap_err().to_string();
        assert!(e.len() < 200, "{e}");
        assert!(e.contains("200000 bytes"), "{e}");
        let e = Trace::from_csv_str("doc_len,doc_len\n1,2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`doc_len` twice"), "{e}");
    }

    /// Regression (user report): `{"doc_lens": [1], "doc_lens": [2]}` read as `[2]` without a
    /// word (serde_json keeps a repeated key's last value).
    #[test]
    fn a_key_named_twice_in_a_jsonl_object_is_refused() {
        let text = "{\"doc_lens\": [5]}\n{\"doc_lens\": [1, 2], \"doc_lens\": [3]}\n";
        let e = Trace::from_jsonl_str(text).unwrap_err().to_string();
        assert_eq!(
            e,
            "line 2: the object names `doc_lens` twice; which value it means is ambiguous"
        );
        let e = Trace::from_jsonl_str("{\"doc_lens\": [5], \"src\": 1, \"src\": 2}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1: the object names `src` twice"), "{e}");
        // Keys inside other values, and non-objects, read as before.
        let t =
            Trace::from_jsonl_str("{\"m\": {\"a\": 1}, \"doc_lens\": [4, 6], \"n\": [{\"a\": 2}]}")
                .unwrap();
        assert_eq!(lens(&t), vec![4, 6]);
        let e = Trace::from_jsonl_str("{\"doc_lens\": [5]}\n7\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("expected an object with a `doc_lens` array"),
            "{e}"
        );
    }

    /// Regression (user report): `1e3` was quoted back as `1000.0`, which the user never wrote.
    #[test]
    fn a_float_length_is_quoted_as_written() {
        let e = Trace::from_jsonl_str("{\"doc_lens\": [5]}\n{\"doc_lens\": [7, 1e3]}")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("line 2: document length `1e3` is"), "{e}");
        let e = Trace::from_jsonl_str("[7, 8, -2.50]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("element 2 (`-2.50`)"), "{e}");
        let e = Trace::from_jsonl_str("[7, \"x\"]").unwrap_err().to_string();
        assert!(e.contains("element 1 (`\"x\"`)"), "{e}");
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
