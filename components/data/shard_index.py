"""Random access to WebDataset tar shards: where each sample's members lie, read once per shard content.

A shard's tar headers are read once (every member's name, byte offset and size; no image is decoded), checked (a
cut-off or non-tar shard is named), and kept as a small table in a cache keyed by the shard's real path, size and
modification time. A relaunch, every rank and every loader worker then read a few kilobytes per shard instead of
the headers of all its samples; a rewritten shard has another size or time and is read again. With the table a
sample is read by offset: a loader worker reads the samples it trains and nothing else.

The cache lives outside the dataset (the shards may be read-only, and DVC tracks the captions folder):
``$C2LIP_SHARD_INDEX_CACHE``, else ``~/.cache/c2lip/shard-index``. An entry is written atomically, so ranks that
index the same new shard at once write the same bytes and never read half a table.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from components.shared.atomic import CorruptFileError, atomic_write_bytes

# webdataset's rule for a member name: the key is the path up to the first dot of the file name, the rest its extension
MEMBER = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
FORMAT = 1  # bumped when the table's layout changes: older entries are then read again from the shard


def cache_dir() -> Path:
    return Path(os.environ.get("C2LIP_SHARD_INDEX_CACHE") or Path.home() / ".cache" / "c2lip" / "shard-index")


def _entry(path: str) -> Path:
    """The cache file of ``path`` as it is now (real path, size, modification time)."""
    if "://" in path or path.startswith("pipe:"):
        raise CorruptFileError(f"{path}: training reads samples by offset, which needs shards on a local or mounted "
                               "filesystem; copy them to disk first")
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
    except OSError as err:
        raise CorruptFileError(f"{path}: cannot read the shard ({err.strerror or err})") from None
    name = hashlib.blake2b(f"{FORMAT}\0{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode(), digest_size=16).hexdigest()
    return cache_dir() / f"{name}.npz"


class ShardTable:
    """One shard's samples in tar order: ``keys[i]`` and, per extension, each sample's (offset, size) (-1: absent)."""

    def __init__(self, path: str, keys: np.ndarray, exts: list[str], offsets: np.ndarray, sizes: np.ndarray):
        self.path, self.keys, self.exts, self.offsets, self.sizes = path, keys, exts, offsets, sizes

    def __len__(self) -> int:
        return len(self.keys)

    def read(self, i: int, handle) -> dict:
        """Sample ``i`` as webdataset yields it: raw bytes per extension, ``__key__`` and ``__url__``."""
        sample: dict = {"__key__": str(self.keys[i]), "__url__": self.path}
        for column, ext in enumerate(self.exts):
            offset, size = int(self.offsets[i, column]), int(self.sizes[i, column])
            if offset >= 0:
                # pread: no shared file position, so loader workers forked with this file open never interleave seeks
                data = os.pread(handle.fileno(), size, offset)
                if len(data) != size:
                    raise CorruptFileError(f"{self.path}: sample {sample['__key__']!r} is cut off (the shard changed "
                                           "while training? it is indexed by size and time)")
                sample[ext] = data
        return sample


def read_headers(path: str) -> ShardTable:
    """The table of ``path`` from its tar headers; a truncated or non-tar shard is a CorruptFileError naming it."""
    samples: dict[str, dict[str, tuple[int, int]]] = {}
    try:
        with tarfile.open(path) as tar:
            end = 0
            for member in tar:
                end = max(end, member.offset_data + member.size)
                match = MEMBER.match(member.name)
                if member.isfile() and match:
                    key, ext = match.groups()
                    samples.setdefault(key, {})[ext] = (member.offset_data, member.size)
        with open(path, "rb") as f:  # tarfile reads a cut-off archive as a shorter one: its end marker says
            f.seek(-(-end // 512) * 512)
            if f.read(1024) != bytes(1024):
                raise tarfile.ReadError("cut off: no end-of-archive marker after the last member")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise CorruptFileError(f"{path}: not a readable tar shard ({err})") from None
    exts = sorted({ext for members in samples.values() for ext in members})
    offsets = np.full((len(samples), len(exts)), -1, dtype=np.int64)
    sizes = np.zeros((len(samples), len(exts)), dtype=np.int64)
    column = {ext: c for c, ext in enumerate(exts)}
    for row, members in enumerate(samples.values()):
        for ext, (offset, size) in members.items():
            offsets[row, column[ext]], sizes[row, column[ext]] = offset, size
    return ShardTable(path, np.array(list(samples), dtype=str), exts, offsets, sizes)


def load_table(path: str) -> ShardTable:
    """The shard's table from the cache, or read from its headers and cached."""
    entry = _entry(path)
    if entry.is_file():
        try:
            with np.load(entry, allow_pickle=False) as stored:
                return ShardTable(path, stored["keys"], stored["exts"].tolist(), stored["offsets"], stored["sizes"])
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry: read the shard again and replace it
    table = read_headers(path)
    buffer = io.BytesIO()
    np.savez(buffer, keys=table.keys, exts=np.array(table.exts, dtype=str), offsets=table.offsets, sizes=table.sizes)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(entry, buffer.getvalue())
    except OSError:
        pass  # a read-only home: the table still serves this process, the next one reads the headers again
    return table


def uncached(shards: Iterable[str]) -> int:
    """How many of ``shards`` have no cached table (each is read from its headers on first use)."""
    return sum(not _entry(shard).is_file() for shard in shards)


def indexing_progress(shards: list[str]) -> Callable[[Iterable], Iterable]:
    """A progress bar over the shards when several have no table yet (the first launch on a dataset), else none."""
    if uncached(shards) < 2:
        return iter
    import sys

    from components.shared.progress import TimedBar

    return lambda items: TimedBar(items, desc="indexing shards", unit="shard", file=sys.stderr, mininterval=5)


def sample_counts(shards: Iterable[str], progress: Callable[[Iterable], Iterable] = iter) -> list[int]:
    """Each shard's number of samples, indexing the shards not cached yet (the train stage's preflight: a damaged
    shard is named before any model loads). The counts of a whole shard list are kept in one small file too: a
    launch over hundreds of shards reads one file, not one table per shard."""
    shards = list(shards)
    entries = [_entry(shard) for shard in shards]
    together = cache_dir() / f"counts-{hashlib.blake2b(''.join(e.name for e in entries).encode(), digest_size=16).hexdigest()}.json"
    try:
        counts = json.loads(together.read_text())
        if isinstance(counts, list) and len(counts) == len(shards) and all(isinstance(c, int) for c in counts):
            return counts
    except (OSError, ValueError):
        pass  # not cached yet (or damaged): from the tables
    counts = [len(load_table(shard)) for shard in progress(shards)]
    try:
        atomic_write_bytes(together, json.dumps(counts).encode())
    except OSError:
        pass  # a read-only home: the next launch counts from the tables again
    return counts


class ShardReader:
    """Samples by (shard number, sample number) for one process, keeping the tables and open files of the last
    ``keep`` shards it read from. ``samples_read`` counts every sample read (the loader bench's numerator)."""

    def __init__(self, shards: list[str], keep: int = 16):
        self.shards, self.keep = shards, keep
        self.open: OrderedDict[int, tuple[ShardTable, io.BufferedReader]] = OrderedDict()
        self.samples_read = 0

    def __getstate__(self) -> dict:  # a spawned loader worker opens its own files (a forked one reads the inherited
        # ones with pread, which moves no shared file position)
        return {"shards": self.shards, "keep": self.keep, "open": OrderedDict(), "samples_read": 0}

    def table(self, shard: int) -> tuple[ShardTable, io.BufferedReader]:
        if shard in self.open:
            self.open.move_to_end(shard)
        else:
            path = self.shards[shard]
            try:
                handle = open(path, "rb")
            except OSError as err:
                raise CorruptFileError(f"{path}: cannot read the shard ({err.strerror or err})") from None
            self.open[shard] = (load_table(path), handle)
            while len(self.open) > self.keep:
                self.open.popitem(last=False)[1][1].close()
        return self.open[shard]

    def read(self, shard: int, i: int) -> dict:
        table, handle = self.table(shard)
        self.samples_read += 1
        return table.read(i, handle)

    def close(self) -> None:
        while self.open:
            self.open.popitem()[1][1].close()


class KeyIndex:
    """Every sample of ``shards`` by its key (NegCLIP's partners are named by key): ``members[key]`` is the sample's
    (shard, {extension: (offset, size)})."""

    def __init__(self, shards: list[str]):
        self.members: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {}
        for shard in shards:
            table = load_table(shard)
            for i, key in enumerate(table.keys.tolist()):
                self.members[key] = (shard, {ext: (int(table.offsets[i, c]), int(table.sizes[i, c]))
                                             for c, ext in enumerate(table.exts) if table.offsets[i, c] >= 0})

    def keys(self) -> list[str]:
        return list(self.members)

    def sample(self, key: str) -> dict:
        """The sample ``key`` as webdataset yields it (raw bytes per extension, ``__key__``, ``__url__``)."""
        shard, members = self.members[key]
        out: dict = {"__key__": key, "__url__": shard}
        with open(shard, "rb") as handle:
            for ext, (offset, size) in members.items():
                out[ext] = os.pread(handle.fileno(), size, offset)
        return out
