"""Writing result files without half-written files and without destroying special files.

The text goes to a temporary file next to the file the path names, which is renamed over it
only once complete: an error midway leaves the old file. A path that exists and is not a
regular file (``/dev/null``, ``/dev/stdout``, a named pipe) is written to directly: renaming
over it would replace the device with a regular file. A symbolic link is followed, so the link
survives, and a replaced file keeps its mode. This is the rule ``src/output.rs`` follows for ``fcp`` itself.
"""

import os
import stat


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` as described in the module's docstring."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path} is a directory, not a file")
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "w") as f:
            f.write(text)
        return
    target = os.path.realpath(path)
    tmp = f"{target}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))  # a replaced file keeps its mode
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def cannot_write(path: str):
    """Why :func:`write_text` could not write ``path``, or None when it can: checked before
    long work, so that a bad path is refused up front rather than after it (bug hunt: a link
    into a missing folder, or a folder that takes no new file, failed with a traceback once
    the first calibration row had been measured). Files that are not regular files are
    written directly and not opened here: a named pipe would wait for a reader."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        return f"{path} is a directory"
    if mode is not None and not stat.S_ISREG(mode):
        return None
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    tmp = f"{target}.tmp"
    try:
        with open(tmp, "w"):
            pass
        os.remove(tmp)
    except OSError as e:
        return f"cannot write {tmp}: {e.strerror}"
    return None

