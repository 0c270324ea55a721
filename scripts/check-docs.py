#!/usr/bin/env python3
"""Rerun the `fcp` commands the docs show with their outputs, and say which outputs changed.

The docs hold outputs of fcp commands: a ```sh block of `fcp ...` lines followed at once by a
plain ``` block with what they printed. A change to a planner or to the cost model can change
those figures without anything failing, so after such a change run

    python3 scripts/check-docs.py                 # every docs/**/*.md and README.md
    python3 scripts/check-docs.py docs/results/tp-cp.md --update

Each document's commands run in order (a later one may read a file an earlier one wrote) in a
scratch mirror of the repository (its files linked, its directories real), so nothing is
written into the checkout. Commands that cannot run as written (placeholders such as `T.csv`) are reported
and skipped. `--update` rewrites the changed output blocks in place (through a temporary file
and a rename). Exit status: 0 when every output matches (or was updated), 1 when one differs,
2 on bad usage. Slow: some blocks simulate hundreds of ranks; not part of the test suite.
"""

import argparse
import difflib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def pairs(text):
    """(command block, output block) match pairs: an `fcp` ```sh block and the plain block after it."""
    blocks = list(FENCE.finditer(text))
    for a, b in zip(blocks, blocks[1:]):
        lang, body = a.group(1), a.group(2)
        if lang not in ("sh", "bash", "console"):
            continue
        lines = [ln for ln in body.replace("\\\n", " ").splitlines() if ln.strip()]
        if not lines or not all(ln.lstrip().startswith("fcp ") for ln in lines):
            continue
        if b.group(1) != "" or text[a.end() : b.start()].strip():
            continue
        yield a, b, body


def scratch():
    """A mirror of the repository (not its build or output dirs): real directories, each file
    a symbolic link. A command writing `docs/x.png` or `out/...` writes into the mirror (fcp
    writes through a temporary file and a rename, which replaces the link, not its target)."""
    d = tempfile.mkdtemp(prefix="fcp-docs-")
    for root, dirs, files in os.walk(REPO):
        rel = os.path.relpath(root, REPO)
        if rel == ".":
            dirs[:] = [x for x in dirs if x not in (".git", "target", "out")]
        dirs[:] = [x for x in dirs if not x.startswith(".venv")]
        os.makedirs(os.path.join(d, rel), exist_ok=True)
        for f in files:
            os.symlink(os.path.join(root, f), os.path.join(d, rel, f))
    return d


def run(body, cwd, env, timeout):
    try:
        p = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", body],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if p.returncode != 0:
        first = (p.stderr.strip().splitlines() or ["(no message)"])[0]
        return None, f"exit {p.returncode}: {first}"
    return p, None


def shown(p, want):
    """What the block shows of a run: its standard output, or that and its standard error
    when the block showed both (a summary line such as `fcp plan`'s goes to stderr) — the
    closer of the two to what the block held — ending in a newline so the fence stays apart."""
    both = p.stdout + p.stderr
    if p.stderr and (
        both == want
        or difflib.SequenceMatcher(None, want, both).ratio()
        > difflib.SequenceMatcher(None, want, p.stdout).ratio()
    ):
        got = both
    else:
        got = p.stdout
    if got and not got.endswith("\n"):
        got += "\n"
    return got


def check(path, fcp, update, timeout):
    with open(path, encoding="utf-8", newline="") as f:
        raw = f.read()
    crlf = "\r\n" in raw
    text = raw.replace("\r\n", "\n")
    cwd = scratch()
    bindir = tempfile.mkdtemp(prefix="fcp-bin-")
    os.symlink(fcp, os.path.join(bindir, "fcp"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"])
    same = changed = skipped = 0
    edits = []
    try:
        for a, b, body in pairs(text):
            where = f"{os.path.relpath(path, REPO)}:{text.count(chr(10), 0, a.start()) + 1}"
            p, err = run(body, cwd, env, timeout)
            if err:
                skipped += 1
                print(f"skip    {where}: {err}")
                continue
            want = b.group(2)
            got = shown(p, want)
            if got == want:
                same += 1
                continue
            changed += 1
            print(f"changed {where}")
            for line in difflib.unified_diff(
                want.splitlines(), got.splitlines(), "doc", "now", lineterm="", n=0
            ):
                print("    " + line)
            edits.append((b.start(2), b.end(2), got))
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
        shutil.rmtree(bindir, ignore_errors=True)
    if update and edits:
        for start, end, got in reversed(edits):
            text = text[:start] + got + text[end:]
        if crlf:
            text = text.replace("\n", "\r\n")
        tmp = path + ".check-docs.tmp"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
        print(f"updated {os.path.relpath(path, REPO)}: {len(edits)} block(s)")
    return same, changed, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="markdown files (default: docs/**/*.md, README.md)")
    ap.add_argument("--update", action="store_true", help="rewrite changed output blocks")
    ap.add_argument("--fcp", help="fcp binary (default: build and use target/release/fcp)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per block (default 900)")
    args = ap.parse_args()
    files = args.files or sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)) + [
        os.path.join(REPO, "README.md")
    ]
    for f in files:
        if not os.path.isfile(f):
            print(f"check-docs: {f}: no such file", file=sys.stderr)
            return 2
    fcp = args.fcp
    if fcp is None:
        subprocess.run(["cargo", "build", "--release", "--locked", "--quiet"], cwd=REPO, check=True)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
        fcp = os.path.join(target, "release", "fcp")
    fcp = os.path.abspath(fcp)
    if not os.access(fcp, os.X_OK):
        print(f"check-docs: {fcp}: not an executable", file=sys.stderr)
        return 2
    totals = [0, 0, 0]
    for f in files:
        for i, n in enumerate(check(os.path.abspath(f), fcp, args.update, args.timeout)):
            totals[i] += n
    same, changed, skipped = totals
    verb = "updated" if args.update else "changed"
    print(f"check-docs: {same} same, {changed} {verb}, {skipped} skipped")
    return 1 if changed and not args.update else 0


if __name__ == "__main__":
    sys.exit(main())
