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
import sys
from pathlib import Path

import pyarrow as pa

from components.shared.atomic import CorruptFileError, atomic_write_json, checksum_problem, remove_inside, write_checksums
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


def read(cache_dir: Path, model: str, fingerprint: str, tasks: list) -> dict[str, pa.Table] | None:
    """The cached tables, or None (nothing cached; or an unusable entry, which is said and removed)."""
    folder = folder_of(cache_dir, model, fingerprint)
    if not folder.is_dir():
        return None
    why, tables = problem(folder, model, fingerprint, tasks)
    if why is None:
        print(f"evaluate: {model}: per-item results of the same weights and suite found in {folder}", file=sys.stderr)
        return tables
    print(f"evaluate: {model}: cached results unusable ({why}); evaluating again", file=sys.stderr)
    remove_inside(cache_dir, folder.name)
    return None


def write(cache_dir: Path, model: str, fingerprint: str, tables: dict[str, pa.Table]) -> None:
    """The tables, then ``complete.json``, then the checksums of both, last: a folder killed halfway is never trusted."""
    folder = folder_of(cache_dir, model, fingerprint)
    if folder.exists():  # an unfinished entry of a killed run
        remove_inside(cache_dir, folder.name)
    items.write_tables(folder, tables)
    atomic_write_json(folder / CACHE_COMPLETE, {"model": model, "fingerprint": fingerprint, "tasks": list(tables)})
    write_checksums(folder)
