"""The evaluate stage's cache of per-item results: one folder per model and suite under ``cache_dir``, named by a
fingerprint of the model's weights, the suite (its files, the images' contents, the code that scores them).

A folder is trusted only when whole and unchanged: ``complete.json`` (the model and the fingerprint it was written
for) and ``_checksums.json`` (every file's SHA256, written last) must match, and every table must be the suite's
task as it is read now (:func:`components.suite.items.table_problem`). Anything else — a truncated file, flipped
outcomes, another model's tables, a missing column — is named and costs a re-evaluation, never the run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from components.shared.atomic import CHECKSUMS_FILE, CorruptFileError, atomic_write_json, checksum_problem, sha256_file, write_checksums
from components.shared.written import Ledger
from components.suite import items

CACHE_COMPLETE = "complete.json"


def images_digest(tasks: list) -> str:
    """Every distinct image file of the suite by path, size, modification time and contents: images replaced under
    the same names make another fingerprint (the benchmark's files name them, not their pixels)."""
    digest = hashlib.sha256()
    for path in sorted({str(ref.path) for task in tasks for ref in task.images}):
        st = os.stat(path)
        digest.update(json.dumps([path, st.st_size, st.st_mtime_ns]).encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def folder_of(cache_dir: Path, model: str, fingerprint: str) -> Path:
    return Path(cache_dir) / f"{model}-{fingerprint}"


def problem(folder: Path, model: str, fingerprint: str, tasks: list) -> tuple[str | None, dict[str, pa.Table]]:
    """(None, the tables) when ``folder`` holds this model's whole results on this suite; else (what is wrong, {})."""
    if (bad := checksum_problem(folder)) is not None:
        return bad, {}
    try:
        done = json.loads((folder / CACHE_COMPLETE).read_text())
    except (OSError, ValueError) as err:
        return f"{folder / CACHE_COMPLETE}: unreadable ({err})", {}
    if not isinstance(done, dict) or done.get("model") != model or done.get("fingerprint") != fingerprint:
        return f"{folder / CACHE_COMPLETE}: written for another model or suite ({done!r:.120})", {}
    try:
        tables = items.read_tables(folder, [t.name for t in tasks])
    except CorruptFileError as err:
        return str(err), {}
    for task in tasks:
        if (why := items.table_problem(tables[task.name], task.name, task.headline, task.layout)) is not None:
            return f"{items.table_path(folder, task.name)}: {why}", {}
    return None, tables


@contextmanager
def taking_turns(cache_dir: Path) -> Iterator[None]:
    """An OS lock on the cache folder itself for the block (no lock file left behind), waiting for another holder;
    released on any exit, even a kill. Held only to look at, move in or set aside an entry and to update the record."""
    import fcntl

    fd = os.open(cache_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def set_aside(folder: Path, why: str) -> Path:
    """An unusable entry is renamed to a hidden unique name beside it, never deleted: what it holds may not all be the
    cache's (components.shared.written); the message names where it went."""
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.unusable-", dir=folder.parent))
    folder.rename(aside / folder.name)
    print(f"evaluate: {folder}: {why}; set aside as {aside / folder.name} (remove it once you have looked)", file=sys.stderr)
    return aside


def read(cache_dir: Path, model: str, fingerprint: str, tasks: list) -> dict[str, pa.Table] | None:
    """The cached tables, or None (nothing cached; or an unusable entry, which is said and set aside)."""
    folder = folder_of(cache_dir, model, fingerprint)
    if not folder.is_dir():
        return None
    with taking_turns(cache_dir):
        if not folder.is_dir():
            return None
        why, tables = problem(folder, model, fingerprint, tasks)
        if why is None:
            print(f"evaluate: {model}: per-item results of the same weights and suite found in {folder}", file=sys.stderr)
            return tables
        set_aside(folder, f"cached results unusable ({why}); evaluating again")
    return None


def write(cache_dir: Path, model: str, fingerprint: str, tables: dict[str, pa.Table], tasks: list | None = None) -> None:
    """The tables, then ``complete.json``, then the checksums of both, last, in a fresh folder of its own moved into place
    whole: a folder killed halfway is never trusted. Two evaluations of one model at once (into different reports)
    take turns on the cache folder (an OS lock on it) to move the entry in; the second keeps the first's entry when it is whole."""
    folder = folder_of(cache_dir, model, fingerprint)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{folder.name}.c2lip-build-", dir=cache_dir))
    try:
        items.write_tables(build, tables)
        atomic_write_json(build / CACHE_COMPLETE, {"model": model, "fingerprint": fingerprint, "tasks": list(tables)})
        write_checksums(build)
        with taking_turns(cache_dir):
            if folder.is_dir() and tasks is not None and problem(folder, model, fingerprint, tasks)[0] is None:
                return  # another evaluation wrote the same results first
            if folder.exists() or folder.is_symlink():
                set_aside(folder, "an unfinished or unusable entry")
            build.rename(folder)
            # the cache's record of what it wrote (clean-data reads it), in the same turn
            sums = json.loads((folder / CHECKSUMS_FILE).read_text())
            Ledger(cache_dir, "evaluate").add({f"{folder.name}/{k}": v for k, v in sums.items()} |
                                              {f"{folder.name}/{CHECKSUMS_FILE}": sha256_file(folder / CHECKSUMS_FILE)})
    finally:
        shutil.rmtree(build, ignore_errors=True)
