//! Bundled profiles, embedded at compile time so `fcp` works from any directory, and the rule
//! that tells a bundled name from a user's file path.

use std::path::{Path, PathBuf};

use super::HardwareError;
use crate::input::LineEnds;

/// Bundled hardware TOMLs (`configs/hardware/NAME.toml`).
pub const HARDWARE: &[(&str, &str)] = &[
    ("h100", include_str!("../../configs/hardware/h100.toml")),
    ("h200", include_str!("../../configs/hardware/h200.toml")),
    ("b200", include_str!("../../configs/hardware/b200.toml")),
];

/// Bundled model TOMLs (`configs/models/NAME.toml`).
pub const MODELS: &[(&str, &str)] = &[
    (
        "llama3-70b",
        include_str!("../../configs/models/llama3-70b.toml"),
    ),
    (
        "llama3-8b",
        include_str!("../../configs/models/llama3-8b.toml"),
    ),
    ("mha-16", include_str!("../../configs/models/mha-16.toml")),
    ("mha-32", include_str!("../../configs/models/mha-32.toml")),
];

/// Bundled kernel throughput tables (`kernels-profile/NAME.csv`).
pub const KERNEL_PROFILES: &[(&str, &str)] = &[
    (
        "h100-fa3",
        include_str!("../../kernels-profile/h100-fa3.csv"),
    ),
    (
        "h100-fa3-paper",
        include_str!("../../kernels-profile/h100-fa3-paper.csv"),
    ),
    (
        "b200-fa4",
        include_str!("../../kernels-profile/b200-fa4.csv"),
    ),
];

/// Bundled NCCL bus-bandwidth tables (`configs/nccl/NAME.csv`).
pub const NCCL_TABLES: &[(&str, &str)] = &[(
    "h200-8gpu",
    include_str!("../../configs/nccl/h200-8gpu.csv"),
)];

/// Names of a bundled set, in order.
pub fn names(set: &[(&'static str, &'static str)]) -> Vec<&'static str> {
    set.iter().map(|(n, _)| *n).collect()
}

/// Text of one profile and where it came from.
#[derive(Debug, Clone)]
pub struct Source {
    /// The profile's name: the bundled name, or the file stem of a user file.
    pub name: String,
    /// `bundled:NAME` or the path, for error messages.
    pub label: String,
    /// Directory of a user file (relative paths inside it resolve against this).
    pub dir: Option<PathBuf>,
    /// File contents.
    pub text: String,
}

/// Whether `s` names a user file rather than a bundled profile: anything with a path separator
/// or ending in `ext` (e.g. `.toml`).
pub fn is_path(s: &str, ext: &str) -> bool {
    // Any case of the extension (bug hunt: `--hardware MY.TOML` was looked up as a bundled
    // name).
    s.contains('/')
        || s.contains('\\')
        || s.len() >= ext.len()
            && s.is_char_boundary(s.len() - ext.len())
            && s[s.len() - ext.len()..].eq_ignore_ascii_case(ext)
}

/// What a file of `kind` should be, for the refusal of one that is not text, and what ends
/// its lines (a CSV table's reader takes a lone `\r` as a line end, TOML's does not).
fn what(kind: &str) -> (&'static str, LineEnds) {
    match kind {
        "kernel profile" => ("a CSV kernel profile", LineEnds::Csv),
        "NCCL table" => ("a CSV NCCL table", LineEnds::Csv),
        "model" => ("a TOML model file", LineEnds::Lf),
        _ => ("a TOML hardware file", LineEnds::Lf),
    }
}

/// Resolve `name_or_path` against a bundled set, or read it as a file.
pub fn resolve(
    name_or_path: &str,
    set: &[(&'static str, &'static str)],
    kind: &'static str,
    ext: &str,
) -> Result<Source, HardwareError> {
    if is_path(name_or_path, ext) {
        let path = Path::new(name_or_path);
        let (what, ends) = what(kind);
        let text = crate::input::read_lines_text(path, what, ends).map_err(|source| {
            HardwareError::Io {
                kind,
                path: path.to_path_buf(),
                source,
            }
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| name_or_path.to_string());
        return Ok(Source {
            name,
            label: path.display().to_string(),
            dir: path.parent().map(Path::to_path_buf),
            text,
        });
    }
    match set.iter().find(|(n, _)| *n == name_or_path) {
        Some((n, text)) => Ok(Source {
            name: n.to_string(),
            label: format!("bundled:{n}"),
            dir: None,
            text: text.to_string(),
        }),
        None => {
            let mut known = set.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
            if name_or_path.contains(':') {
                // `h100:nic_gbs` (no `=`) is read as a name; say how overrides are written.
                known += "; what-if overrides are written NAME:key=value,key=value";
            }
            Err(HardwareError::UnknownName {
                kind,
                name: name_or_path.to_string(),
                known,
            })
        }
    }
}

/// Turn a `toml` error into one line naming the key (missing/unknown keys are named by the
/// message itself; for a bad value the offending line is quoted, which names its key).
pub fn toml_error(label: &str, text: &str, e: &toml::de::Error) -> HardwareError {
    // A float quoted as parsed (`1000.0`) is quoted as written (`1e3`).
    let msg = crate::jsonpos::requote_float(e.message(), crate::jsonpos::toml_raw(text, e))
        .trim_end()
        .replace('\n', "; ");
    let whole_doc = |start: usize, end: usize| start == 0 && end >= text.trim_end().len();
    let message = match e.span() {
        Some(span) if !whole_doc(span.start, span.end) => {
            let start = span.start.min(text.len());
            let line_no = text[..start].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            if line.is_empty() {
                format!("line {line_no}: {msg}")
            } else {
                format!("line {line_no} (`{line}`): {msg}")
            }
        }
        _ => msg,
    };
    HardwareError::Parse {
        file: label.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rule() {
        assert!(!is_path("h100", ".toml"));
        assert!(is_path("./h100", ".toml"));
        assert!(is_path("my.toml", ".toml"));
        assert!(is_path("MY.TOML", ".toml") && is_path("k.Csv", ".csv"));
        assert!(!is_path("é", ".toml"));
        assert!(is_path("dir/x", ".csv"));
    }

    #[test]
    fn unknown_lists_known() {
        let e = resolve("nope", HARDWARE, "hardware", ".toml").unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("h100") && m.contains("b200") && m.contains("nope"),
            "{m}"
        );
    }
}
