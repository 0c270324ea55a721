//! Profile specs: a bundled name or a TOML path, and the what-if overrides after it
//! (`h100:nic_gbs=100`, `llama3-70b:kv_heads=16`) that ask "what if" without a file.

use std::path::Path;

use super::bundled;
use super::HardwareError;

/// A profile spec split into the profile it names and its what-if overrides:
/// `h100:nic_gbs=100,gpus_per_node=4` is `h100` with `nic_gbs=100,gpus_per_node=4`
/// ([`super::Hardware::load`], [`crate::model::Model::load`] check them). The overrides start at the first `:` (not the
/// spec's first character) with a `=` after it; a spec that is itself a path ([`bundled::is_path`])
/// naming an existing file has none. (A file in the working directory named like a bundled
/// spec, `h100:nic_gbs=100`, is no path and does not shadow it: bug hunt.)
pub fn split_overrides(spec: &str) -> (&str, Option<&str>) {
    if bundled::is_path(spec, ".toml") && Path::new(spec).is_file() {
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
            .parse::<f64>()
            // -0 is 0 (bug hunt: `launch_overhead_us=-0` printed `incl. -0 us launch`).
            .map(|v| v + 0.0)
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
    for (pair, kv) in pairs(overrides) {
        let Some((key, value)) = kv else {
            return Err(Override {
                key: pair.trim(),
                value: "",
                spec,
            }
            .error(format!(
                "`{pair}` is not key=value (overrides are `NAME:key=value,key=value`)"
            )));
        };
        let o = Override { key, value, spec };
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
    let mut canonical: Vec<(&str, String)> = pairs(overrides)
        .map(|(pair, kv)| {
            let (k, v) = kv.unwrap_or((pair.trim(), ""));
            // `+ 0.0` makes -0 read 0: both name one profile (bug hunt: a sweep ran `=0` and
            // `=-0` as two).
            let v = match v.parse::<f64>() {
                Ok(x) if x.is_finite() => format!("{}", x + 0.0),
                _ => v.to_string(),
            };
            (k, v)
        })
        .collect();
    canonical.sort();
    let canonical: Vec<String> = canonical
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    canonical.join(",")
}

/// Each `pair` of `key=value,...` as written, with its key and value trimmed (`None`: no
/// `=`): the one reading [`overrides`] and [`canonical_overrides`] share.
fn pairs(overrides: &str) -> impl Iterator<Item = (&str, Option<(&str, &str)>)> {
    overrides.split(',').map(|pair| {
        let kv = pair.split_once('=').map(|(k, v)| (k.trim(), v.trim()));
        (pair, kv)
    })
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
pub fn reads_file(spec: &str) -> bool {
    bundled::is_path(split_overrides(spec).0, ".toml")
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
        assert!(reads_file("lab.toml:nic_gbs=1"));
        assert!(!reads_file("h100:nic_gbs=1"));
        // Regression (bug hunt): overrides were split off every path, so a kernel table
        // named `k:v=2.csv` was looked up as a bundled table `k`.
        assert!(bundled::is_path("k:v=2.csv", ".csv"));
        // An override without its `=` is read as a name; the error says how to write one.
        let e = crate::hardware::Hardware::load("h100:nic_gbs")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("what-if overrides are written NAME:key=value"),
            "{e}"
        );
    }
}
