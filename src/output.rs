//! Writing files so that a failure never leaves a half-written file behind.

use std::io::Write;
use std::path::Path;

/// Write `bytes` to `path` atomically: the data goes to a temporary file in the same directory,
/// which is renamed over `path` only once it is complete and flushed. A crash or an error midway
/// leaves any previous file at `path` untouched and no partial file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".fcp-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.flush()?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomic(&p, b"hello").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn missing_directory_is_an_error_not_a_panic() {
        let p = Path::new("/nonexistent-dir-fcp/x.json");
        assert!(write_atomic(p, b"x").is_err());
    }
}
