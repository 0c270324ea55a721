//! The files this process has read its inputs from, which no output it writes may replace.
//!
//! A command that reads a file and writes another must never write over the one it read: a
//! user's profile, trace or config would be gone, replaced by a plan or a table. The explicit
//! checks each command made covered the inputs someone thought of (the trace, the plan) and
//! missed others: `fcp plan --hardware my.toml -o my.toml` replaced the hardware profile, and
//! `fcp sweep -o DIR` a trace the config kept in `DIR` (bug hunt). So every input is noted
//! here as it is opened ([`open`]), and [`crate::output::AtomicFile::create`], which every
//! output goes through, refuses a destination that is one of them.
//!
//! The guard is the `fcp` command's policy, turned on by [`guard_outputs`] when it starts: a
//! library user who loads a plan, edits it and saves it back to the same path is not stopped.
//!
//! A file is known by its device and inode, its length and its modification time as read:
//! the path may differ (a hard link, a symbolic link, `./x` and `x`), and a file created later
//! at a reused inode is not taken for the input. Files a command exists to update (a regress
//! baseline under `--update`) are read without being noted.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What identifies a file read, with the path it was read by (for the refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    id: FileId,
    path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileId {
    #[cfg(unix)]
    dev: u64,
    #[cfg(unix)]
    ino: u64,
    #[cfg(not(unix))]
    canonical: PathBuf,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileId {
    /// The identity of a regular file; `None` for anything else (a pipe, a device), which
    /// reads differently each time and which outputs are written into, not renamed over.
    #[allow(unused_variables)]
    fn of(path: &Path, meta: &std::fs::Metadata) -> Option<FileId> {
        if !meta.is_file() {
            return None;
        }
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        Some(FileId {
            #[cfg(unix)]
            dev: meta.dev(),
            #[cfg(unix)]
            ino: meta.ino(),
            #[cfg(not(unix))]
            canonical: std::fs::canonicalize(path).ok()?,
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());
static ON: AtomicBool = AtomicBool::new(false);

/// From now on, note every input read and refuse any output over one (the `fcp` binary does
/// this first thing).
pub fn guard_outputs() {
    ON.store(true, Ordering::SeqCst);
}

fn seen() -> std::sync::MutexGuard<'static, Vec<Seen>> {
    // A panic elsewhere while holding the lock leaves the list as good as it was.
    SEEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open `path` to read an input, and note it as one.
pub fn open(path: &Path) -> std::io::Result<File> {
    let f = File::open(path)?;
    if ON.load(Ordering::SeqCst) {
        note(&mut seen(), path, &f);
    }
    Ok(f)
}

/// The path an input was read by, when `path` names a file this process read an input from
/// (and it has not changed since): a file no output may replace.
pub fn input_at(path: &Path) -> Option<PathBuf> {
    if !ON.load(Ordering::SeqCst) {
        return None;
    }
    find(&seen(), path)
}

/// Refuse to write `path` (whose file, links followed, is `target`) when it is an input:
/// what every output checks before it is written, and a command can check up front before
/// the work whose result would go there.
pub fn refuse_over_input(path: &Path, target: &Path) -> std::io::Result<()> {
    match input_at(target) {
        Some(input) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the output {} is the input {}: writing it would destroy the input; choose another output",
                path.display(),
                input.display()
            ),
        )),
        None => Ok(()),
    }
}

fn note(seen: &mut Vec<Seen>, path: &Path, f: &File) {
    if let Some(id) = f.metadata().ok().and_then(|m| FileId::of(path, &m)) {
        if !seen.iter().any(|s| s.id == id) {
            seen.push(Seen {
                id,
                path: path.to_path_buf(),
            });
        }
    }
}

fn find(seen: &[Seen], path: &Path) -> Option<PathBuf> {
    let meta = std::fs::metadata(path).ok()?;
    let id = FileId::of(path, &meta)?;
    seen.iter().find(|s| s.id == id).map(|s| s.path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_is_known_by_any_path_to_it_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let read = dir.path().join("read.toml");
        let other = dir.path().join("other.toml");
        std::fs::write(&read, "x = 1\n").unwrap();
        std::fs::write(&other, "x = 1\n").unwrap();
        // A list of its own: turning the process's guard on here would stop other tests
        // that save over a file they loaded, as a library user may.
        let mut seen = Vec::new();
        assert_eq!(find(&seen, &read), None);
        note(&mut seen, &read, &File::open(&read).unwrap());
        assert_eq!(find(&seen, &read), Some(read.clone()));
        // Another path to the same file is the same file.
        let linked = dir.path().join("linked.toml");
        std::fs::hard_link(&read, &linked).unwrap();
        assert_eq!(find(&seen, &linked), Some(read.clone()));
        assert_eq!(find(&seen, &other), None);
        assert_eq!(find(&seen, &dir.path().join("absent")), None);
        assert_eq!(find(&seen, dir.path()), None);
        // Changed since it was read, it is another file's contents.
        std::fs::write(&read, "x = 22\n").unwrap();
        assert_eq!(find(&seen, &read), None);
        // Off (a library user's default), nothing is noted or refused.
        assert_eq!(input_at(&other), None);
    }
}
