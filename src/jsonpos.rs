//! Where in a user's JSON text a value is, for error messages: serde_json reports a line and a
//! column but not the field (`invalid value: integer `-1`, expected u64`), and quotes numbers
//! as it parsed them (`1e3` becomes `1000.0`). These helpers walk the text itself, which the
//! caller has already found to be JSON, to name the field and quote the value as written.

/// One step of a path into a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seg<'a> {
    /// A key of an object (as written between the quotes).
    Key(&'a str),
    /// An index into an array.
    Index(usize),
}

/// A container being walked.
enum Frame<'a> {
    Object {
        /// The key whose value is being read (set from the key to the next comma).
        key: Option<&'a str>,
        /// Whether the next string is a key.
        expect_key: bool,
    },
    Array {
        index: usize,
        /// Whether element `index` has begun.
        started: bool,
    },
}

/// A token of JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    /// `{ } [ ] : ,`
    Punct(u8),
    /// A string: an object key or a value.
    Str,
    /// A number, `true`, `false` or `null`.
    Scalar,
}

/// Walk the tokens of `text`, calling `f(frames, start, end, token)` before each token changes
/// the walk's state; `f` returning true stops the walk. Text that is not JSON ends the walk
/// somewhere without harm.
fn walk<'a>(text: &'a str, mut f: impl FnMut(&[Frame<'a>], usize, usize, Tok) -> bool) {
    let b = text.as_bytes();
    let mut frames: Vec<Frame<'a>> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let (end, tok) = match c {
            b'{' | b'}' | b'[' | b']' | b':' | b',' => (i + 1, Tok::Punct(c)),
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                ((j + 1).min(b.len()), Tok::Str)
            }
            _ => {
                let mut j = i;
                while j < b.len() && !b" \t\r\n{}[]:,\"".contains(&b[j]) {
                    j += 1;
                }
                (j.max(i + 1), Tok::Scalar)
            }
        };
        if f(&frames, i, end, tok) {
            return;
        }
        let begin_value = |frames: &mut Vec<Frame<'a>>| {
            if let Some(Frame::Array { started, .. }) = frames.last_mut() {
                *started = true;
            }
        };
        match tok {
            Tok::Punct(b'{') => {
                begin_value(&mut frames);
                frames.push(Frame::Object {
                    key: None,
                    expect_key: true,
                });
            }
            Tok::Punct(b'[') => {
                begin_value(&mut frames);
                frames.push(Frame::Array {
                    index: 0,
                    started: false,
                });
            }
            Tok::Punct(b'}' | b']') => {
                frames.pop();
            }
            Tok::Punct(b',') => match frames.last_mut() {
                Some(Frame::Object { key, expect_key }) => {
                    *key = None;
                    *expect_key = true;
                }
                Some(Frame::Array { index, started }) => {
                    *index += 1;
                    *started = false;
                }
                None => {}
            },
            Tok::Str => match frames.last_mut() {
                Some(Frame::Object { key, expect_key }) if *expect_key => {
                    *key = Some(text.get(i + 1..end.saturating_sub(1)).unwrap_or(""));
                    *expect_key = false;
                }
                _ => begin_value(&mut frames),
            },
            Tok::Scalar => begin_value(&mut frames),
            Tok::Punct(_) => {}
        }
        i = end;
    }
}

/// Whether a token is a string that is an object's key.
fn is_key(frames: &[Frame<'_>], tok: Tok) -> bool {
    tok == Tok::Str
        && matches!(
            frames.last(),
            Some(Frame::Object {
                expect_key: true,
                ..
            })
        )
}

/// `ranks[0].pad_slots`: a path as a reader writes it.
fn render(segs: &[Seg<'_>]) -> String {
    let mut s = String::new();
    for seg in segs {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// What is at byte `offset` of `text`, where serde_json stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located<'a> {
    /// The path of the value being read there (`ranks[0].pad_slots`); empty at the top.
    pub path: String,
    /// The number or word just read there, as written (`1e3`), if one ends at `offset`.
    pub raw: Option<&'a str>,
}

/// Locate byte `offset` of `text`: the value serde_json was reading when it stopped there
/// (its errors point just past a bad scalar, at the start of a bad object or array, or just
/// past the end of an object missing a field).
pub(crate) fn locate(text: &str, offset: usize) -> Located<'_> {
    let mut found = Located {
        path: String::new(),
        raw: None,
    };
    let mut last_scalar: Option<(usize, usize)> = None;
    walk(text, |frames, start, end, tok| {
        if start < offset {
            last_scalar = (tok == Tok::Scalar).then_some((start, end));
            return false;
        }
        // A value begins here: the innermost array's index counts even before it starts.
        let begins_value = matches!(tok, Tok::Punct(b'{' | b'[') | Tok::Scalar)
            || (tok == Tok::Str && !is_key(frames, tok));
        let n = frames.len();
        let segs: Vec<Seg<'_>> = frames
            .iter()
            .enumerate()
            .filter_map(|(d, fr)| match fr {
                Frame::Object { key, .. } => key.map(Seg::Key),
                Frame::Array { index, started } => {
                    (*started || (begins_value && d + 1 == n)).then_some(Seg::Index(*index))
                }
            })
            .collect();
        found.path = render(&segs);
        true
    });
    found.raw = last_scalar
        .filter(|&(_, end)| end == offset)
        .and_then(|(s, e)| text.get(s..e));
    found
}

/// Where the value at `path` in `text` begins and, for a number or word, ends; and what its
/// first token is. `None` when the path leads nowhere.
fn value_at(text: &str, path: &[Seg<'_>]) -> Option<(usize, usize, Tok)> {
    let mut found = None;
    walk(text, |frames, start, end, tok| {
        let begins_value = matches!(tok, Tok::Punct(b'{' | b'[') | Tok::Scalar)
            || (tok == Tok::Str && !is_key(frames, tok));
        if !begins_value || frames.len() != path.len() {
            return false;
        }
        let here = frames.iter().zip(path).all(|(fr, seg)| match (fr, seg) {
            (Frame::Object { key: Some(k), .. }, Seg::Key(want)) => k == want,
            (Frame::Array { index, .. }, Seg::Index(want)) => index == want,
            _ => false,
        });
        if here {
            found = Some((start, end, tok));
        }
        here
    });
    found
}

/// The text of the number or word at `path` in `text`, as written; `None` when there is none
/// (the path leads nowhere, or to a string, object or array).
pub(crate) fn raw_at<'a>(text: &'a str, path: &[Seg<'_>]) -> Option<&'a str> {
    value_at(text, path)
        .filter(|&(_, _, tok)| tok == Tok::Scalar)
        .and_then(|(start, end, _)| text.get(start..end))
}

/// The 1-based line (counting `\n`, as serde_json's errors do) on which the value at `path`
/// in `text` begins; `None` when the path leads nowhere. serde_json names the line of a
/// syntax error but not of a value a caller then refuses, and a pretty-printed array has one
/// element a line.
pub(crate) fn line_at(text: &str, path: &[Seg<'_>]) -> Option<u64> {
    let (start, _, _) = value_at(text, path)?;
    let newlines = text.as_bytes()[..start].iter().filter(|&&b| b == b'\n');
    Some(newlines.count() as u64 + 1)
}

/// The value at `path` of the JSON `text` as the user wrote it (a number's own digits: `1e3`,
/// not serde_json's `1000.0`), else as `v` prints.
pub(crate) fn value_as_written(text: &str, path: &[Seg<'_>], v: &serde_json::Value) -> String {
    raw_at(text, path).map_or_else(|| v.to_string(), str::to_string)
}

/// `message` with the number serde quoted as it parsed it (`floating point `1000.0``) quoted
/// as the user wrote it (`floating point `1e3``).
pub(crate) fn requote_float(message: &str, raw: Option<&str>) -> String {
    const FLOAT: &str = "floating point `";
    let (Some(raw), Some(at)) = (raw, message.find(FLOAT)) else {
        return message.to_string();
    };
    let from = at + FLOAT.len();
    match message[from..].find('`') {
        Some(len) => format!("{}{raw}{}", &message[..from], &message[from + len..]),
        None => message.to_string(),
    }
}

/// A serde_json error in reading `text`, with the field it is about named in front
/// (`ranks[0].pad_slots: invalid value: ...`) and a number quoted as written.
pub(crate) fn json_error(text: &str, e: &serde_json::Error) -> String {
    let message = e.to_string();
    let Some(offset) = offset_of(text, e.line(), e.column()) else {
        return message;
    };
    let at = locate(text, offset);
    let message = requote_float(&message, at.raw);
    if at.path.is_empty() {
        message
    } else {
        format!("{}: {message}", at.path)
    }
}

/// Byte offset of serde_json's 1-based `line` and byte `column` in `text`.
fn offset_of(text: &str, line: usize, column: usize) -> Option<usize> {
    if line == 0 {
        return None;
    }
    let start = if line == 1 {
        0
    } else {
        text.match_indices('\n').nth(line - 2)?.0 + 1
    };
    Some((start + column).min(text.len()))
}

/// The scalar a TOML error's span points at, as written (`1e3`); `None` when the span holds
/// more than one value.
pub(crate) fn toml_raw<'a>(text: &'a str, e: &toml::de::Error) -> Option<&'a str> {
    e.span()
        .and_then(|s| text.get(s))
        .map(str::trim)
        .filter(|r| !r.is_empty() && !r.contains(['\n', '[', '{', '"', '`']))
}

/// A TOML error's message with a float it quotes as parsed (`1000.0`) quoted as the user wrote
/// it (`1e3`), which the error's span points at.
pub(crate) fn toml_message(text: &str, e: &toml::de::Error) -> String {
    requote_float(&e.to_string(), toml_raw(text, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct R {
        rank: u32,
        #[serde(default)]
        pad_slots: u64,
        owned: Vec<(u32, u64, u64)>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct P {
        version: u32,
        ranks: Vec<R>,
    }

    fn err(text: &str) -> String {
        json_error(text, &serde_json::from_str::<P>(text).unwrap_err())
    }

    /// The fields serde_json's errors are about, whatever the error points at.
    #[test]
    fn serde_errors_name_their_field() {
        let cases = [
            (
                r#"{"version":1,"ranks":[{"rank":0,"pad_slots":-1,"owned":[]}]}"#,
                "ranks[0].pad_slots: invalid value: integer `-1`",
            ),
            (
                r#"{"version":1,"ranks":[{"rank":0,"owned":[]},{"rank":1,"pad_slots":"x","owned":[]}]}"#,
                "ranks[1].pad_slots: invalid type: string \"x\"",
            ),
            (
                r#"{"version":1,"ranks":[{"rank":0,"pad_slots":{"a":[1]},"owned":[]}]}"#,
                "ranks[0].pad_slots: invalid type: map",
            ),
            (
                r#"{"version":1,"ranks":[{"rank":0,"pad_slots":1e3,"owned":[]}]}"#,
                "ranks[0].pad_slots: invalid type: floating point `1e3`, expected u64",
            ),
            (
                r#"{"version":1,"ranks":[{"rank":0,"owned":[[0,1,2],[0,1]]}]}"#,
                "ranks[0].owned[1]: invalid length 2",
            ),
            (
                r#"{"version":1,"ranks":[{"rank":0,"owned":[[0,1,2],[0, [1], 2]]}]}"#,
                "ranks[0].owned[1][1]: invalid type: sequence",
            ),
            (
                r#"{"version":1, "ranks" : [ {"owned":[]} ]}"#,
                "ranks[0]: missing field `rank`",
            ),
            (
                r#"{"version":1,"ranks":[{"rank":0,"rank":0,"owned":[]}]}"#,
                "ranks[0].rank: duplicate field `rank`",
            ),
            (
                "{\"version\":1,\n \"ranks\":[{\"rank\":0,\n \"owned\":[[0,1,true]]}]}",
                "ranks[0].owned[0][2]: invalid type: boolean `true`",
            ),
            (r#"{"version":1}"#, "missing field `ranks`"),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(got.starts_with(want), "{text}\n got {got}\nwant {want}");
        }
    }

    #[test]
    fn raw_values_are_found_by_path() {
        let t = r#"{"note": {"doc_lens": [7]}, "doc_lens": [1, 1e3 , -0.5], "x": "doc_lens"}"#;
        assert_eq!(
            raw_at(t, &[Seg::Key("doc_lens"), Seg::Index(1)]),
            Some("1e3")
        );
        assert_eq!(
            raw_at(t, &[Seg::Key("doc_lens"), Seg::Index(2)]),
            Some("-0.5")
        );
        assert_eq!(raw_at(t, &[Seg::Key("doc_lens"), Seg::Index(3)]), None);
        assert_eq!(raw_at("[4, 2E1]", &[Seg::Index(1)]), Some("2E1"));
        assert_eq!(raw_at(r#"["a\"]", 5]"#, &[Seg::Index(1)]), Some("5"));
        assert_eq!(raw_at(r#"[4, "5"]"#, &[Seg::Index(1)]), None);
    }

    #[test]
    fn values_are_found_on_their_line() {
        let t = "\n[\n  1,\n  \"x\", [2,\n 3], {\"a\":\n 4}\n]";
        let line = |i| line_at(t, &[Seg::Index(i)]);
        assert_eq!(
            (line(0), line(1), line(2), line(3)),
            (Some(3), Some(4), Some(4), Some(5))
        );
        assert_eq!(line_at(t, &[Seg::Index(2), Seg::Index(1)]), Some(5));
        assert_eq!(line_at(t, &[Seg::Index(3), Seg::Key("a")]), Some(6));
        assert_eq!(line(4), None);
    }

    #[test]
    fn only_a_quoted_float_is_replaced() {
        assert_eq!(
            requote_float(
                "invalid type: floating point `1000.0`, expected u32",
                Some("1e3")
            ),
            "invalid type: floating point `1e3`, expected u32"
        );
        assert_eq!(requote_float("integer `5`", Some("5")), "integer `5`");
        assert_eq!(
            requote_float("floating point `1.5`", None),
            "floating point `1.5`"
        );
    }
}
