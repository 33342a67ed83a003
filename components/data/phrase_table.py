"""The concepts stage's noun phrases as a read-only mapping that every rank and loader worker shares.

A Python dict of a million captions' phrases costs each process hundreds of megabytes and tens of seconds to
build, and a forked worker's copy grows as reference counts touch its pages. Instead the Parquet files are
converted once into a memory-mapped pair: the keys sorted as fixed-width bytes (``keys.npy``, found by binary
search) and the phrases in the same order (``phrases.arrow``, an uncompressed Arrow IPC file read without a
copy). The operating system keeps one copy of the pages for all processes on a machine; a lookup reads a few.

The pair is cached under the shards' index cache (:func:`components.data.shard_index.cache_dir`), keyed by the
Parquet files' paths, sizes and modification times: a rerun of the concepts stage makes a new one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from components.data.shard_index import cache_dir
from components.shared.atomic import read_parquet


def _parquet_files(concepts_dir: Path) -> list[Path]:
    return sorted(Path(concepts_dir).glob("*.parquet"))


def _folder(files: list[Path]) -> Path:
    identity = "\0".join(f"{os.path.realpath(f)}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    return cache_dir() / f"phrases-{hashlib.blake2b(identity.encode(), digest_size=16).hexdigest()}"


def _build(files: list[Path], folder: Path) -> None:
    """Write the sorted keys and their phrases into ``folder`` (whole or not at all: built beside it, then renamed)."""
    keys: list[str] = []
    columns = []
    for path in files:
        table = read_parquet(path, columns=["key", "phrases"])
        keys.extend(table.column("key").to_pylist())
        columns.append(table.column("phrases").combine_chunks().cast(pa.list_(pa.string())))
    encoded = np.array([k.encode() for k in keys], dtype=bytes) if keys else np.zeros(0, dtype="S1")
    order = np.argsort(encoded, kind="stable")
    ordered = encoded[order]
    # a key in several files: the last file's phrases, as a dict filled file by file would keep
    last = np.ones(len(ordered), dtype=bool)
    last[:-1] = ordered[:-1] != ordered[1:]
    phrases = pa.concat_arrays(columns).take(pa.array(order[last])) if columns else pa.array([], pa.list_(pa.string()))
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        np.save(building / "keys.npy", ordered[last])
        with pa.OSFile(str(building / "phrases.arrow"), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("phrases", phrases.type)])) as writer:
            writer.write_table(pa.table({"phrases": phrases}))
        try:
            os.rename(building, folder)
        except OSError:  # another rank renamed its identical copy first
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)  # what this call built and did not move into place, only


class PhraseTable(Mapping):
    """key -> noun phrases (a list of str), read from the memory-mapped pair in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._open()

    def _open(self) -> None:
        self.sorted_keys = np.load(self.folder / "keys.npy", mmap_mode="r")
        with pa.memory_map(str(self.folder / "phrases.arrow")) as source:
            self.phrases = pa.ipc.open_file(source).read_all().column("phrases")

    def __getstate__(self) -> dict:  # a spawned loader worker maps the files itself
        return {"folder": self.folder}

    def __setstate__(self, state: dict) -> None:
        self.folder = state["folder"]
        self._open()

    def _row(self, key: str) -> int | None:
        wanted = key.encode()
        row = int(np.searchsorted(self.sorted_keys, wanted))
        return row if row < len(self.sorted_keys) and self.sorted_keys[row] == wanted else None

    def __getitem__(self, key: str) -> list[str]:
        row = self._row(key) if isinstance(key, str) else None
        if row is None:
            raise KeyError(key)
        return self.phrases[row].as_py() or []

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._row(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (k.decode() for k in self.sorted_keys)

    def __len__(self) -> int:
        return len(self.sorted_keys)


def load_phrases(concepts_dir: Path) -> PhraseTable:
    """key -> noun phrases from the concepts stage's Parquet files in ``concepts_dir`` (converted on first use). Where
    the cache cannot be written (a read-only home), the table is built in the system's temporary folder instead."""
    files = _parquet_files(concepts_dir)
    folder = _folder(files)
    if not (folder / "phrases.arrow").is_file():
        try:
            _build(files, folder)
        except OSError:
            folder = Path(tempfile.gettempdir()) / "c2lip-phrases" / folder.name
            if not (folder / "phrases.arrow").is_file():
                _build(files, folder)
    return PhraseTable(folder)
