//! Reading users' text files so that what is not text fails at once.
//!
//! Every file `fcp` reads from a user — traces, hardware and model TOML, kernel and NCCL
//! tables, plans, measurements, study configs, sweep results — is text. A binary or compressed
//! file, or a device that never ends (`/dev/zero`), is refused at its first bytes with an error
//! that says what it looks like, instead of being read into memory until the machine runs out:
//! `fcp hw show --hardware /dev/zero` and `fcp simulate /dev/zero` once grew past 4 GB in five
//! seconds before anything was parsed.

use std::io::Read;
use std::path::Path;

/// The longest line a line-oriented file (a trace, a TOML or CSV table) may have: a CSV row
/// holds one document, a JSONL line one batch's lengths (ten million of them fit). A line that
/// runs on past it is not such a file. Plans and other JSON documents are one line and have no
/// such limit.
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// Which bytes end a line: the line limit of [`TextOnly`] and the line numbers of
/// [`LineLogging`] must count lines as the reader behind them splits them, or a file with
/// old-Mac `\r` endings is one "line" to the limit (a 70 MB trace the csv reader reads fine
/// was refused) and every error in it is on "line 1".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnds {
    /// `\n` alone (so `\r\n` too): TOML and JSON Lines, whose readers split on `\n`. A lone
    /// `\r` must not end a line here, or text with no `\n` in it would pass the limit and be
    /// gathered into memory by a reader that is still waiting for one.
    Lf,
    /// As the csv crate reads: a lone `\r`, a `\n`, or `\r\n` each end one line.
    Csv,
}

impl LineEnds {
    /// Whether a line ends at byte `b`, given whether the byte before it was `\r`. For
    /// [`LineEnds::Csv`] a `\r\n` is one line end, placed at its `\r` (where the csv reader
    /// ends the record), so the `\n` after a `\r` does not end another line.
    fn ends_at(self, b: u8, prev_cr: bool) -> bool {
        match self {
            LineEnds::Lf => b == b'\n',
            LineEnds::Csv => b == b'\r' || (b == b'\n' && !prev_cr),
        }
    }

    /// Whether `b` is any byte of a line end (where the next line may start after).
    fn is_end_byte(self, b: u8) -> bool {
        b == b'\n' || (self == LineEnds::Csv && b == b'\r')
    }
}

/// A reader that stops with an error at the first NUL byte, or at a line longer than its
/// limit ([`MAX_LINE_BYTES`] unless given). No text file holds either, while every compressed
/// or binary file has a NUL within its first bytes; without the NUL check `fcp trace stats
/// /dev/zero` read forever (a CSV field never ends), and a gzipped trace was reported as a bad
/// header. Without the line limit, text that never ends a line (`yes 1 | tr -d '\n'`) was
/// gathered into memory until the machine ran out. The error says what the file looks like.
pub struct TextOnly<R> {
    inner: R,
    /// What the file should be ("a CSV or JSONL trace"), for the refusal.
    what: &'static str,
    offset: u64,
    /// Where the line being read started.
    line_start: u64,
    max_line: u64,
    /// What ends a line for the limit.
    ends: LineEnds,
    /// The refusal, repeated on every later read: a caller that drops the first error (a
    /// peek for a byte-order mark) must not read on past the bytes that were refused.
    refused: Option<String>,
}

impl<R> TextOnly<R> {
    /// Read `inner`, which should be `what`, with lines (ended by `\n`) of at most
    /// [`MAX_LINE_BYTES`].
    pub fn new(inner: R, what: &'static str) -> Self {
        TextOnly::with_line_limit(inner, what, MAX_LINE_BYTES)
    }

    /// Read `inner`, which should be `what`, with lines ended as `ends` says of at most
    /// [`MAX_LINE_BYTES`].
    pub fn with_line_ends(inner: R, what: &'static str, ends: LineEnds) -> Self {
        TextOnly {
            ends,
            ..TextOnly::new(inner, what)
        }
    }

    /// Read `inner`, which should be `what`, with lines (ended by `\n`) of at most `max_line`
    /// bytes.
    pub fn with_line_limit(inner: R, what: &'static str, max_line: u64) -> Self {
        TextOnly {
            inner,
            what,
            offset: 0,
            line_start: 0,
            max_line,
            ends: LineEnds::Lf,
            refused: None,
        }
    }

    /// Why the `got` bytes just read refuse the input, if they do.
    fn check(&mut self, got: &[u8]) -> Option<String> {
        let why = refusal(got, self.offset, self.what);
        if let Some(i) = got.iter().rposition(|&b| self.ends.is_end_byte(b)) {
            self.line_start = self.offset + i as u64 + 1;
        }
        self.offset += got.len() as u64;
        why.or_else(|| {
            (self.offset - self.line_start > self.max_line).then(|| {
                format!(
                    "the line starting at byte {} runs on for more than {} MiB without ending: \
                     this is not {}",
                    self.line_start,
                    self.max_line >> 20,
                    self.what
                )
            })
        })
    }
}

impl<R: Read> Read for TextOnly<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.refused.is_none() {
            let n = self.inner.read(buf)?;
            self.refused = self.check(&buf[..n]);
            if self.refused.is_none() {
                return Ok(n);
            }
        }
        let message = self.refused.clone().unwrap_or_default();
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            Refused(message),
        ))
    }
}

/// A [`TextOnly`] refusal, inside the `io::Error` a read returns: it names a byte of the
/// whole input, met while reading ahead, not a line a parser has counted to.
#[derive(Debug)]
pub struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Whether `e` is a [`TextOnly`] refusal (which names its byte), not an error of a line.
pub fn is_refusal(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Refused>())
}

/// Why `got`, read at byte `offset` of a file that should be `what`, cannot be one: a
/// compressed file's magic number at the start, or a NUL byte anywhere.
fn refusal(got: &[u8], offset: u64, what: &str) -> Option<String> {
    if offset == 0 {
        let kind = if got.starts_with(&[0x1f, 0x8b]) {
            Some("gzip-compressed")
        } else if got.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some("zstd-compressed")
        } else if got.starts_with(b"PAR1") {
            Some("a Parquet file")
        } else {
            None
        };
        if let Some(kind) = kind {
            return Some(format!(
                "this is {kind}, not {what}; convert or decompress it and pass the text"
            ));
        }
    }
    let i = got.iter().position(|&b| b == 0)?;
    Some(format!(
        "byte {} is NUL: this is a binary file, not {what}",
        offset + i as u64
    ))
}

/// Whether `path` is a regular file, which reads the same from its start each time it is
/// opened. Standard input (`-`) and other files that are not (a pipe given as `/dev/stdin`,
/// `<(...)`, a FIFO, a device) are gone once read: a streamed `trace pack` opened them for
/// each pass, so its probe ate the header and the later passes read the rest or nothing; a
/// sweep hashed its trace, emptying it. A path that cannot be looked up is not either.
pub fn can_read_twice(path: &Path) -> bool {
    path != Path::new("-") && std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Read the whole of `path`, which should be `what`, as text ([`TextOnly`]); `line_limit`:
/// whether lines (ended by `\n`) are held to [`MAX_LINE_BYTES`] (not for one-line JSON
/// documents).
pub fn read_text(path: &Path, what: &'static str, line_limit: bool) -> std::io::Result<String> {
    read_all(crate::read_guard::open(path)?, what, line_limit)
}

/// [`read_text`] with lines ended as `ends` says held to [`MAX_LINE_BYTES`]: a CSV table is
/// read by the csv crate, for which a lone `\r` ends a line too.
pub fn read_lines_text(path: &Path, what: &'static str, ends: LineEnds) -> std::io::Result<String> {
    read_to_string(TextOnly::with_line_ends(
        crate::read_guard::open(path)?,
        what,
        ends,
    ))
}

/// [`read_text`] of any reader (standard input).
pub fn read_all(src: impl Read, what: &'static str, line_limit: bool) -> std::io::Result<String> {
    let max = if line_limit { MAX_LINE_BYTES } else { u64::MAX };
    read_to_string(TextOnly::with_line_limit(src, what, max))
}

/// All of `src` as a string, without a UTF-8 byte-order mark at its start: an editor's
/// (Notepad writes one), skipped in every file as in traces and plans (bug hunt: a
/// measurement or a regress baseline saved with one was refused as "expected value at line 1
/// column 1").
fn read_to_string(mut src: impl Read) -> std::io::Result<String> {
    let mut text = String::new();
    src.read_to_string(&mut text)?;
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(text)
}

/// The line ends a [`LineLogging`] reader has passed and its consumer has not yet asked about:
/// what turns a record's byte offset into the line it is on.
#[derive(Debug, Default)]
pub struct LineLog {
    /// Offsets of line ends read ahead of the last question, in order (a `\r\n` is logged at
    /// its `\r`, where the csv reader ends the record).
    pending: std::collections::VecDeque<u64>,
    /// Line ends before the last byte asked about.
    before: u64,
}

impl LineLog {
    /// The 1-based line holding byte `byte`. Questions must come in increasing order of
    /// bytes (a parser's records do); the log then holds only the newlines read ahead.
    pub fn line_at(&mut self, byte: u64) -> u64 {
        while self.pending.front().is_some_and(|&n| n < byte) {
            self.pending.pop_front();
            self.before += 1;
        }
        self.before + 1
    }

    /// The line of a CSV record the csv reader has just read, given the reader's position
    /// after it (`csv::Reader::position`). The record's own position cannot serve: it is where
    /// the reader began looking for it, before any blank or comment lines it skipped, and with
    /// `\r\n` endings the `\n` of the line before.
    pub fn line_of_record_ending(&mut self, reader_byte: u64) -> u64 {
        self.line_at(reader_byte.saturating_sub(1))
    }
}

/// A reader that logs where its line ends are ([`LineLog`]), counted as the csv crate splits
/// lines ([`LineEnds::Csv`]: a lone `\r`, `\n` or `\r\n`). The csv crate's own line count
/// skips blank and comment lines and miscounts `\r\n` endings, so an error in an Excel trace
/// or a commented kernel table named the wrong line; its byte offsets are right, and this
/// turns them into lines.
///
/// It also passes every `\r` on as `\n` (byte for byte, so offsets still match the file),
/// and ends a last line that has no line end (after the file's last byte):
/// the csv crate ends a `#` comment only at `\n`, so a comment in a file with old-Mac `\r`
/// endings ran on to the end of the file and the trace read as empty. A `\r\n` becomes an
/// end and a blank line, which the reader skips; the log counts the file's own bytes.
pub struct LineLogging<R> {
    inner: R,
    offset: u64,
    /// Whether the last byte passed on was `\r` (a `\r\n` may straddle two reads).
    prev_cr: bool,
    /// Whether the last byte passed on ended a line (or nothing was read yet).
    at_line_start: bool,
    /// Whether the end of the input was reached and a missing last line end supplied.
    closed: bool,
    log: std::rc::Rc<std::cell::RefCell<LineLog>>,
}

impl<R> LineLogging<R> {
    /// Log `inner`'s newlines; the log answers for the bytes this reader passes on.
    pub fn new(inner: R) -> (Self, std::rc::Rc<std::cell::RefCell<LineLog>>) {
        let log = std::rc::Rc::new(std::cell::RefCell::new(LineLog::default()));
        (
            LineLogging {
                inner,
                offset: 0,
                prev_cr: false,
                at_line_start: true,
                closed: false,
                log: log.clone(),
            },
            log,
        )
    }
}

impl<R: Read> Read for LineLogging<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut log = self.log.borrow_mut();
        if n == 0 && !buf.is_empty() && !self.at_line_start && !self.closed {
            // The csv crate reads a `#` comment on a last line with no line end as a record
            // (a trace ending `# end` had a document of length ``): end that line here. After
            // every byte of the file, so no offset moves.
            self.closed = true;
            buf[0] = b'\n';
            log.pending.push_back(self.offset);
            self.offset += 1;
            return Ok(1);
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            if LineEnds::Csv.ends_at(b, self.prev_cr) {
                log.pending.push_back(self.offset + i as u64);
            }
            self.prev_cr = b == b'\r';
            self.at_line_start = LineEnds::Csv.is_end_byte(b);
        }
        for b in &mut buf[..n] {
            if *b == b'\r' {
                *b = b'\n';
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

/// The rows of a CSV table held in memory (`#` comments, fields trimmed), each with the line
/// it is on; or the first error, as `line N: what is wrong`. For the kernel and NCCL tables,
/// whose errors name the line to fix.
pub fn csv_rows<T: serde::de::DeserializeOwned>(text: &str) -> Result<Vec<(T, u64)>, String> {
    let (src, log) = LineLogging::new(text.as_bytes());
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(src);
    let line_read = |reader: &csv::Reader<_>| {
        log.borrow_mut()
            .line_of_record_ending(reader.position().byte())
    };
    let headers = match reader.headers() {
        Ok(h) => h.clone(),
        Err(e) => return Err(csv_message(&e, line_read(&reader))),
    };
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        let more = reader.read_record(&mut record);
        let line = line_read(&reader);
        match more {
            Ok(false) => return Ok(rows),
            Ok(true) => match record.deserialize(Some(&headers)) {
                Ok(row) => rows.push((row, line)),
                Err(e) => return Err(format!("line {line}: {}", csv_what(&e, Some(&headers)))),
            },
            Err(e) => return Err(csv_message(&e, line)),
        }
    }
}

/// `line N: what is wrong` for a csv error on line N.
fn csv_message(e: &csv::Error, line: u64) -> String {
    format!("line {line}: {}", csv_what(e, None))
}

/// Field `i` (csv counts from 0) as a reader counts it, from 1, with its column's name when
/// the `headers` give one. Bug hunt: `q_len` of `4096.0` was reported in "field 5", which a
/// reader counting from 1 takes for `len_kind`.
fn field_name(i: u64, headers: Option<&csv::StringRecord>) -> String {
    match headers.and_then(|h| h.get(i as usize)) {
        Some(name) => format!("column `{name}` (field {})", i + 1),
        None => format!("field {}", i + 1),
    }
}

/// What a csv error says is wrong, without csv's own position (wrong past blank lines and
/// `\r\n` endings: [`LineLogging`] gives the line); a field is named by its column when the
/// `headers` are known, and counted from 1.
pub fn csv_what(e: &csv::Error, headers: Option<&csv::StringRecord>) -> String {
    // csv words a short row as "found record with N fields, but the previous record has M
    // fields"; cutting its position off that left "fields, but the previous …".
    match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("expected {expected_len} fields, found {len}"),
        csv::ErrorKind::Utf8 { err, .. } => {
            format!(
                "invalid UTF-8 in {} (the file must be UTF-8 text)",
                field_name(err.field() as u64, headers)
            )
        }
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(i) => format!("{}: {}", field_name(i, headers), err.kind()),
            None => err.kind().to_string(),
        },
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_order_mark_is_skipped_in_every_file() {
        let bom = "\u{feff}{\"a\": 1}";
        assert_eq!(
            read_all(bom.as_bytes(), "a JSON file", false).unwrap(),
            "{\"a\": 1}"
        );
        // Only at the start.
        let inner = "x\u{feff}";
        assert_eq!(read_all(inner.as_bytes(), "a file", true).unwrap(), inner);
    }

    #[test]
    fn lines_are_counted_from_bytes_whatever_the_endings() {
        let text = "h\r\n\r\n# c\r\n1\r\n\n\nabc\n";
        let (mut r, log) = LineLogging::new(text.as_bytes());
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        let at = |needle: &str| text.find(needle).unwrap() as u64;
        assert_eq!(log.borrow_mut().line_at(0), 1);
        assert_eq!(log.borrow_mut().line_at(at("# c")), 3);
        assert_eq!(log.borrow_mut().line_at(at("1")), 4);
        assert_eq!(log.borrow_mut().line_at(at("abc")), 7);
    }

    /// Regression (bug hunt): a file with old-Mac `\r` endings named every error "line 1", and
    /// one past 64 MiB in all was refused as a single endless line, though the csv reader
    /// splits it at each `\r`.
    #[test]
    fn cr_only_line_endings_are_counted_as_csv_counts_them() {
        let text = "a\rb\r\nc\n\rd\r";
        // A `\r\n` split between two reads is still one line end.
        let (at_r, rest) = text.split_at(text.find("\r\n").unwrap() + 1);
        let (mut r, log) = LineLogging::new(at_r.as_bytes().chain(rest.as_bytes()));
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        let at = |needle: &str| text.find(needle).unwrap() as u64;
        assert_eq!(log.borrow_mut().line_at(at("b")), 2);
        assert_eq!(log.borrow_mut().line_at(at("c")), 3);
        assert_eq!(log.borrow_mut().line_at(at("d")), 5);

        let lines = "1\r".repeat(50);
        let read = |ends| {
            let src = TextOnly {
                ends,
                ..TextOnly::with_line_limit(lines.as_bytes(), "a CSV trace", 40)
            };
            read_to_string(src)
        };
        assert_eq!(read(LineEnds::Csv).unwrap(), lines);
        // TOML and JSONL readers wait for a `\n`: for them it is still one long line.
        let e = read(LineEnds::Lf).unwrap_err().to_string();
        assert!(e.contains("the line starting at byte 0 runs on"), "{e}");
        let long = format!("1\r\n{}", "7".repeat(60));
        let e = TextOnly {
            ends: LineEnds::Csv,
            ..TextOnly::with_line_limit(long.as_bytes(), "a CSV trace", 40)
        };
        let e = read_to_string(e).unwrap_err().to_string();
        assert!(e.contains("the line starting at byte 3 runs on"), "{e}");
    }

    #[test]
    fn an_endless_device_is_refused_at_its_first_bytes() {
        let e = read_text(Path::new("/dev/zero"), "a TOML file", true).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(
            e.to_string()
                .contains("byte 0 is NUL: this is a binary file, not a TOML file"),
            "{e}"
        );
        let gz = read_all(&[0x1f, 0x8b, 8, 0][..], "a plan", false).unwrap_err();
        assert!(
            gz.to_string().contains("gzip-compressed, not a plan"),
            "{gz}"
        );
    }

    #[test]
    fn json_documents_have_no_line_limit_and_text_reads_whole() {
        let long = "x".repeat(1000);
        let r = |limit| {
            let mut s = String::new();
            TextOnly::with_line_limit(long.as_bytes(), "a plan", limit)
                .read_to_string(&mut s)
                .map(|_| s)
        };
        assert!(r(100).is_err());
        assert_eq!(r(u64::MAX).unwrap(), long);
        assert_eq!(read_all(long.as_bytes(), "a plan", false).unwrap(), long);
    }
}
