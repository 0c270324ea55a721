//! Writing files so that a failure never leaves a half-written file behind.
//!
//! Every file `fcp` writes goes through [`AtomicFile`] (or [`write_atomic`], its one-shot form):
//! the bytes go to a hidden temporary file (`.fcp-*.tmp`) in the destination's directory, which
//! is renamed over the destination only once complete and synced. An error, a panic or a
//! signal midway leaves the previous file (or none) at the path, never a truncated one. A kill
//! (SIGINT, SIGKILL) can leave the hidden temporary file behind, never at the final path.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// A file being written; it appears at its path only on [`AtomicFile::commit`]. Dropped
/// without a commit (an error path), the temporary file is removed and the path untouched.
/// Writes are buffered, so streaming many small writes (a 10M-line trace) is cheap.
pub struct AtomicFile {
    tmp: BufWriter<NamedTempFile>,
    path: PathBuf,
}

impl AtomicFile {
    /// Start writing `path`: creates the temporary file next to it (so the final rename stays
    /// on one file system and is atomic).
    pub fn create(path: &Path) -> std::io::Result<AtomicFile> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".fcp-")
            .suffix(".tmp")
            .tempfile_in(dir)?;
        Ok(AtomicFile {
            tmp: BufWriter::with_capacity(1 << 16, tmp),
            path: path.to_path_buf(),
        })
    }

    /// Flush, sync and rename over the destination.
    pub fn commit(self) -> std::io::Result<()> {
        let tmp = self.tmp.into_inner().map_err(|e| e.into_error())?;
        tmp.as_file().sync_all()?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tmp.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.tmp.write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tmp.flush()
    }
}

/// Write `bytes` to `path` atomically (see [`AtomicFile`]): a crash or an error midway leaves
/// any previous file at `path` untouched and no partial file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
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

    #[test]
    fn an_uncommitted_file_leaves_the_old_one_and_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.csv");
        std::fs::write(&p, "old").unwrap();
        {
            let mut f = AtomicFile::create(&p).unwrap();
            f.write_all(&vec![b'x'; 1 << 20]).unwrap();
            // Dropped here, as on an error path.
        }
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
