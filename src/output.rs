//! Writing files so that a failure never leaves a half-written file behind.
//!
//! Every file `fcp` writes goes through [`AtomicFile`] (or [`write_atomic`], its one-shot form):
//! the bytes go to a hidden temporary file (`.fcp-*.tmp`) in the destination's directory, which
//! is renamed over the destination only once complete and synced. An error, a panic or a
//! signal midway leaves the previous file (or none) at the path, never a truncated one. On
//! SIGINT, SIGTERM or SIGHUP the temporary files being written are removed before the process
//! dies of the signal ([`interrupt`]); only an uncatchable kill (SIGKILL, a power cut) can leave
//! one behind, and never at the final path.
//!
//! Two kinds of destination are not renamed over, because the rename would destroy something
//! the user set up rather than protect a file:
//! - **A path that is not a regular file** (`/dev/null`, a named pipe): the bytes are written
//!   straight to it. **A path that names a descriptor** (`/dev/stdout`, `/dev/fd/3`) is
//!   appended to, whatever the shell opened there, so `-o /dev/stdout >> log` adds to the log. Renaming over `-o /dev/null` once replaced the machine's
//!   null device with a regular file, and every later program reading `/dev/null` (cargo's
//!   `rustc -` probe among them) read what had been thrown away.
//! - **A symbolic link**: the link is followed and the file it names is replaced atomically,
//!   so the link survives.
//!
//! The file written has the permissions a plain `create` would give it (0666 less the umask),
//! or, when it replaces one, the old file's.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// A file being written; it appears at its path only on [`AtomicFile::commit`]. Dropped
/// without a commit (an error path), the temporary file is removed and the path untouched.
/// Writes are buffered, so streaming many small writes (a 10M-line trace) is cheap.
pub struct AtomicFile {
    sink: Sink,
}

/// Where the bytes go: a temporary file renamed on commit, or a special file written directly.
enum Sink {
    Renamed {
        tmp: BufWriter<NamedTempFile>,
        path: PathBuf,
        /// Dropped after `tmp` (fields drop in order), once the file is renamed or removed.
        _pending: interrupt::Pending,
    },
    Direct(BufWriter<File>),
}

impl AtomicFile {
    /// Start writing `path`: creates the temporary file next to the file the path names (so
    /// the final rename stays on one file system and is atomic). A path that exists and is not
    /// a regular file or a directory (a device, a pipe) is opened for writing instead.
    pub fn create(path: &Path) -> std::io::Result<AtomicFile> {
        if names_a_descriptor(path) {
            // Appended to, never replaced: `-o /dev/stdout >> log` once replaced the log
            // (the link led to the log file, and the rename went over it).
            let file = std::fs::OpenOptions::new().append(true).open(path)?;
            return Ok(AtomicFile {
                sink: Sink::Direct(BufWriter::with_capacity(1 << 16, file)),
            });
        }
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} is a directory, not a file", path.display()),
                ))
            }
            Ok(meta) if !meta.is_file() => {
                let file = std::fs::OpenOptions::new().write(true).open(path)?;
                return Ok(AtomicFile {
                    sink: Sink::Direct(BufWriter::with_capacity(1 << 16, file)),
                });
            }
            _ => {}
        }
        // Bug hunt: `-o missing/` failed at the rename with "Not a directory".
        if path
            .as_os_str()
            .to_string_lossy()
            .ends_with(std::path::MAIN_SEPARATOR)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} ends in `{}`: that names a folder, not a file; give a file name",
                    path.display(),
                    std::path::MAIN_SEPARATOR
                ),
            ));
        }
        let target = resolve_link(path);
        // Bug hunt: `fcp plan --hardware my.toml -o my.toml` replaced the profile it read.
        crate::read_guard::refuse_over_input(path, &target)?;
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix(".fcp-").suffix(".tmp");
        // A temporary file is private (0600); the file it becomes is not. A new file gets the
        // mode any program's would (0666 less the umask), a replaced one keeps its own mode, so
        // a plan written on a shared node stays readable by the executor's other users.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        // tempfile's error ends with the random temporary path (`… at path "dir/.fcp-…tmp"`);
        // say which folder failed instead.
        let tmp = builder.tempfile_in(dir).map_err(|e| {
            let text = e.to_string();
            let cause = text.split(" at path ").next().unwrap_or(&text);
            std::io::Error::new(
                e.kind(),
                format!("cannot create a file in {}: {cause}", dir.display()),
            )
        })?;
        if let Ok(meta) = std::fs::metadata(&target) {
            tmp.as_file().set_permissions(meta.permissions())?;
        }
        let pending = interrupt::Pending::new(tmp.path());
        Ok(AtomicFile {
            sink: Sink::Renamed {
                tmp: BufWriter::with_capacity(1 << 16, tmp),
                path: target,
                _pending: pending,
            },
        })
    }

    /// Flush, sync and rename over the destination (a special file is only flushed).
    pub fn commit(self) -> std::io::Result<()> {
        match self.sink {
            Sink::Renamed { tmp, path, .. } => {
                let tmp = tmp.into_inner().map_err(|e| e.into_error())?;
                tmp.as_file().sync_all()?;
                tmp.persist(&path).map_err(|e| e.error)?;
            }
            Sink::Direct(mut file) => file.flush()?,
        }
        Ok(())
    }

    fn writer(&mut self) -> &mut dyn Write {
        match &mut self.sink {
            Sink::Renamed { tmp, .. } => tmp,
            Sink::Direct(file) => file,
        }
    }
}

/// Whether `path` names one of the process's open descriptors (`/dev/stdout`, `/dev/stderr`,
/// `/dev/fd/N`, `/proc/self/fd/N`) rather than a file: what it leads to is whatever the shell
/// opened there (a terminal, a pipe, or a file opened with `>` or `>>`), which is the caller's
/// to keep; its bytes are appended, as a program writing to that descriptor would.
fn names_a_descriptor(path: &Path) -> bool {
    let Some(text) = path.to_str() else {
        return false;
    };
    let numbered = |prefix: &str| {
        text.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(text, "/dev/stdout" | "/dev/stderr")
        || numbered("/dev/fd/")
        || numbered("/proc/self/fd/")
}

/// Removing the temporary files being written when the process is interrupted. Ctrl-C during
/// `fcp trace gen -o big.csv` left a 35 MB hidden `.fcp-*.tmp` behind.
///
/// Each temporary file's path is kept in one of a fixed set of slots that a signal handler
/// reads: the handler only loads pointers and calls `unlink` (both async-signal-safe), then
/// restores the default action and raises the signal again, so the process still dies of it
/// (exit status 130 for Ctrl-C). A path's string is never freed once registered — a handler
/// running on another thread could be reading it — which costs its few bytes per file written.
/// A signal the process was started ignoring (`nohup`) stays ignored.
pub mod interrupt {
    use std::path::Path;

    /// A temporary file's registration: removed from the slots when dropped.
    pub struct Pending {
        #[cfg(unix)]
        slot: Option<usize>,
    }

    #[cfg(unix)]
    mod slots {
        use std::sync::atomic::{AtomicPtr, Ordering};

        /// More files than this written at once (parallel sweeps write a few) go unregistered.
        pub const SLOTS: usize = 256;

        pub static PATHS: [AtomicPtr<libc::c_char>; SLOTS] =
            [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];

        pub static INSTALL: std::sync::Once = std::sync::Once::new();

        extern "C" fn on_signal(sig: libc::c_int) {
            for slot in &PATHS {
                let p = slot.load(Ordering::Acquire);
                if !p.is_null() {
                    // SAFETY: `p` is a NUL-terminated string that is never freed.
                    unsafe { libc::unlink(p) };
                }
            }
            // SAFETY: async-signal-safe calls with valid arguments.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }

        pub fn install() {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                // SAFETY: installing a handler that only makes async-signal-safe calls.
                let old = unsafe { libc::signal(sig, handler) };
                if old == libc::SIG_IGN {
                    // SAFETY: restoring the disposition the process was started with.
                    unsafe { libc::signal(sig, libc::SIG_IGN) };
                }
            }
        }
    }

    impl Pending {
        /// Register `path` to be removed if the process is interrupted.
        pub fn new(path: &Path) -> Pending {
            #[cfg(unix)]
            {
                use std::os::unix::ffi::OsStrExt;
                use std::sync::atomic::Ordering;
                slots::INSTALL.call_once(slots::install);
                let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
                    return Pending { slot: None };
                };
                let ptr = c.into_raw();
                for (i, slot) in slots::PATHS.iter().enumerate() {
                    let free = std::ptr::null_mut();
                    if slot
                        .compare_exchange(free, ptr, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Pending { slot: Some(i) };
                    }
                }
                // SAFETY: `ptr` came from `into_raw` above and was never shared.
                drop(unsafe { std::ffi::CString::from_raw(ptr) });
                Pending { slot: None }
            }
            #[cfg(not(unix))]
            {
                let _ = path;
                Pending {}
            }
        }
    }

    impl Drop for Pending {
        fn drop(&mut self) {
            #[cfg(unix)]
            if let Some(i) = self.slot {
                // Left allocated on purpose (see the module's comment).
                slots::PATHS[i].store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release);
            }
        }
    }
}

/// The file a symbolic link at `path` names, following chains of links; `path` itself when it
/// is not a link. A dangling link resolves to its target's path, so the file is created there.
fn resolve_link(path: &Path) -> PathBuf {
    let mut current = path.to_path_buf();
    // A bound on the chain, as the kernel has (ELOOP): a cycle falls back to the path given.
    for _ in 0..40 {
        match std::fs::read_link(&current) {
            Ok(target) => {
                current = match current.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                }
            }
            Err(_) => return current,
        }
    }
    path.to_path_buf()
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.writer().write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer().flush()
    }
}

/// Write `bytes` to `path` atomically (see [`AtomicFile`]): a crash or an error midway leaves
/// any previous file at `path` untouched and no partial file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
}

/// Write several files into `dir` all or nothing: each is written to its temporary file
/// first, and only once every one is complete are they renamed into place. A failure midway
/// (a name taken by a directory, a full disk) leaves none of them behind, nor `dir` itself
/// when this call created it. Regression: `fcp plan --all-batches` wrote `batch-00000.json`,
/// then failed on the next and left the first (and the new directory) behind.
pub fn write_all_atomic(
    dir: &Path,
    files: impl IntoIterator<Item = (PathBuf, Vec<u8>)>,
) -> std::io::Result<()> {
    // The folders this call creates, outermost first, to remove again on failure.
    let mut created: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .map(Path::to_path_buf)
        .collect();
    created.reverse();
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        let mut pending = Vec::new();
        for (path, bytes) in files {
            let mut f = AtomicFile::create(&path)?;
            f.write_all(&bytes)?;
            pending.push(f);
        }
        pending.into_iter().try_for_each(AtomicFile::commit)
    });
    if written.is_err() {
        // Only empty folders go (remove_dir refuses others), innermost first.
        for d in created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_of_files_is_written_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new").join("plans");
        // The second name is taken by a directory: nothing is written, the new folders go.
        std::fs::create_dir_all(dir.path().join("taken")).unwrap();
        let files = |d: &Path| {
            vec![
                (d.join("a.json"), b"a".to_vec()),
                (d.join("b.json"), b"b".to_vec()),
            ]
        };
        std::fs::create_dir_all(out.join("b.json")).unwrap();
        assert!(write_all_atomic(&out, files(&out)).is_err());
        assert!(!out.join("a.json").exists());
        std::fs::remove_dir(out.join("b.json")).unwrap();
        let fresh = dir.path().join("fresh").join("plans");
        let mut bad = files(&fresh);
        bad.push((fresh.join("sub").join("c.json"), b"c".to_vec()));
        assert!(write_all_atomic(&fresh, bad).is_err());
        assert!(
            !dir.path().join("fresh").exists(),
            "the folders it made are gone"
        );
        write_all_atomic(&out, files(&out)).unwrap();
        assert_eq!(std::fs::read(out.join("b.json")).unwrap(), b"b");
        let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary file left");
    }

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
        let e = write_atomic(p, b"x").unwrap_err();
        // The folder is named, not the random temporary file (`.fcp-XXXX.tmp`).
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let msg = e.to_string();
        assert!(
            msg.contains("cannot create a file in /nonexistent-dir-fcp"),
            "{msg}"
        );
        assert!(!msg.contains(".fcp-"), "{msg}");
    }

    /// Regression (bug hunt): `-o missing/` created a temporary file, then failed its rename
    /// with "Not a directory".
    #[test]
    fn regression_a_path_ending_in_a_slash_said_not_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing/");
        assert!(p.to_string_lossy().ends_with('/'));
        let e = write_atomic(&p, b"x").unwrap_err().to_string();
        assert!(e.contains("names a folder, not a file"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
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

    /// The bug: `-o /dev/null` renamed a regular file over the null device.
    #[cfg(unix)]
    #[test]
    fn writing_to_a_named_pipe_keeps_the_pipe() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.map(|s| s.success()).unwrap_or(false), "mkfifo failed");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_atomic(&fifo, b"through the pipe").unwrap();
        // Checked before joining: a replaced pipe would leave the reader blocked forever.
        let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "the pipe was replaced by {kind:?}");
        assert_eq!(reader.join().unwrap(), b"through the pipe");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn writing_through_a_symlink_replaces_the_target_and_keeps_the_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        let target = dir.path().join("real/plan.json");
        std::fs::write(&target, "old").unwrap();
        let link = dir.path().join("plan.json");
        std::os::unix::fs::symlink("real/plan.json", &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert_eq!(
            std::fs::read_dir(dir.path().join("real")).unwrap().count(),
            1
        );
    }

    /// The bug: plan files came out 0600 (the temporary file's mode), unreadable by the other
    /// users of a shared node.
    #[cfg(unix)]
    #[test]
    fn a_new_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let usual = dir.path().join("usual");
        std::fs::write(&usual, "x").unwrap();
        let new = dir.path().join("new.json");
        write_atomic(&new, b"x").unwrap();
        assert_eq!(mode(&new), mode(&usual));
        let old = dir.path().join("old.json");
        std::fs::write(&old, "old").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&old, b"new").unwrap();
        assert_eq!(mode(&old), 0o640);
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "new");
    }

    #[test]
    fn a_directory_as_destination_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_atomic(dir.path(), b"x").unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }
}
