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

/// A hardware spec split into the profile it names and its what-if overrides:
/// `h100:nic_gbs=100,gpus_per_node=4` is `h100` with `nic_gbs=100,gpus_per_node=4`
/// ([`super::Hardware::load`] checks them). The overrides start at the first `:` (not the
/// spec's first character) with a `=` after it; a spec that is itself a path ([`is_path`])
/// naming an existing file has none. (A file in the working directory named like a bundled
/// spec, `h100:nic_gbs=100`, is no path and does not shadow it: bug hunt.)
pub fn split_overrides(spec: &str) -> (&str, Option<&str>) {
    if is_path(spec, ".toml") && Path::new(spec).is_file() {
        return (spec, None);
    }
    spec.match_indices(':')
        .map(|(i, _)| i)
        .find(|&i| i > 0 && spec[i + 1..].contains('='))
        .map_or((spec, None), |i| (&spec[..i], Some(&spec[i + 1..])))
}

/// One what-if override (`key=value`) of a profile spec, checked as far as the profile's
/// type does not matter: `key` one of the fields an override may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override<'a> {
    /// The field.
    pub key: &'a str,
    /// Its new value, as written.
    pub value: &'a str,
    /// The whole spec, for errors.
    pub spec: &'a str,
}

impl Override<'_> {
    /// An error about this override.
    pub fn error(&self, message: String) -> HardwareError {
        HardwareError::Invalid {
            file: self.spec.to_string(),
            field: self.key.to_string(),
            message,
        }
    }

    /// The value as a count.
    pub fn count(&self) -> Result<u32, HardwareError> {
        self.value.parse().map_err(|_| {
            self.error(format!(
                "`{}` is not a whole number from 0 to {}",
                self.value,
                u32::MAX
            ))
        })
    }

    /// The value as a number (range checks are the profile's own).
    pub fn real(&self) -> Result<f64, HardwareError> {
        self.value
            .parse()
            .map_err(|_| self.error(format!("`{}` is not a number", self.value)))
    }
}

/// The `key=value,...` overrides of `spec` ([`split_overrides`]), each key one of `allowed`
/// and given once.
pub fn overrides<'a>(
    overrides: &'a str,
    spec: &'a str,
    allowed: &[&str],
) -> Result<Vec<Override<'a>>, HardwareError> {
    let mut out: Vec<Override<'a>> = Vec::new();
    for pair in overrides.split(',') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(Override {
                key: pair.trim(),
                value: "",
                spec,
            }
            .error(format!(
                "`{pair}` is not key=value (overrides are `NAME:key=value,key=value`)"
            )));
        };
        let o = Override {
            key: key.trim(),
            value: value.trim(),
            spec,
        };
        if !allowed.contains(&o.key) {
            return Err(o.error(format!(
                "is not a field an override may set (one of: {})",
                allowed.join(", ")
            )));
        }
        if out.iter().any(|p| p.key == o.key) {
            return Err(o.error("is set twice".to_string()));
        }
        out.push(o);
    }
    Ok(out)
}

/// `overrides` (`key=value,...`) written one way for every way of writing the same: keys
/// trimmed and in order, numbers as Rust prints them (`10.0`, `1e1` and `+10` are `10`). A
/// profile is named by it, so one spec written two ways is one profile (bug hunt: a sweep
/// ran `kv_heads=16,layers=16` and `layers=16,kv_heads=16` as two models).
pub fn canonical_overrides(overrides: &str) -> String {
    let mut pairs: Vec<(String, String)> = overrides
        .split(',')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = v.trim();
            let v = match v.parse::<f64>() {
                Ok(x) if x.is_finite() => format!("{x}"),
                _ => v.to_string(),
            };
            (k.trim().to_string(), v)
        })
        .collect();
    pairs.sort();
    let pairs: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// A profile `spec` written one way for every way of writing the same overrides
/// ([`canonical_overrides`]); a spec without overrides as given.
pub fn canonical_spec(spec: &str) -> String {
    match split_overrides(spec) {
        (base, Some(o)) => format!("{base}:{}", canonical_overrides(o)),
        (base, None) => base.to_string(),
    }
}

/// Whether a profile `spec` reads a user file, what-if overrides aside ([`split_overrides`]).
pub fn spec_is_path(spec: &str) -> bool {
    is_path(split_overrides(spec).0, ".toml")
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
        None => Err(HardwareError::UnknownName {
            kind,
            name: name_or_path.to_string(),
            known: set.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
        }),
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
    fn a_spec_splits_into_its_profile_and_overrides() {
        assert_eq!(split_overrides("h100"), ("h100", None));
        assert_eq!(
            split_overrides("h100:nic_gbs=100,gpus_per_node=4"),
            ("h100", Some("nic_gbs=100,gpus_per_node=4"))
        );
        assert_eq!(
            split_overrides("lab/my.toml:nic_gbs=1"),
            ("lab/my.toml", Some("nic_gbs=1"))
        );
        assert_eq!(
            canonical_spec("h100: nic_gbs =1e1,gpus_per_node=+4"),
            "h100:gpus_per_node=4,nic_gbs=10"
        );
        assert_eq!(canonical_spec("h100:nic_gbs=10.0"), "h100:nic_gbs=10");
        assert_eq!(canonical_spec("lab/x.toml"), "lab/x.toml");
        // Keys are checked where they are set, so a bad first key is named as one.
        assert_eq!(
            split_overrides("h100:NIC_GBS=1"),
            ("h100", Some("NIC_GBS=1"))
        );
        assert_eq!(
            split_overrides("h100::nic_gbs=1"),
            ("h100", Some(":nic_gbs=1"))
        );
        // A `:` with no `=` after it belongs to the name; so does a whole spec that is a path
        // to an existing file.
        assert_eq!(split_overrides("a:b/c.toml"), ("a:b/c.toml", None));
        assert_eq!(split_overrides(":nic_gbs=1"), (":nic_gbs=1", None));
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("x:nic_gbs=1.toml");
        std::fs::write(&odd, "").unwrap();
        let odd = odd.display().to_string();
        assert_eq!(split_overrides(&odd), (odd.as_str(), None));
        assert!(spec_is_path("lab.toml:nic_gbs=1"));
        assert!(!spec_is_path("h100:nic_gbs=1"));
        // Regression (bug hunt): overrides were split off every path, so a kernel table
        // named `k:v=2.csv` was looked up as a bundled table `k`.
        assert!(is_path("k:v=2.csv", ".csv"));
    }

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
