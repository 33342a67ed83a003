"""Atomic output files: a path is either absent or complete, never half-written (a killed stage
leaves at most a ``*.tmp`` file behind, which the next run overwrites)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.shared.params_base import ENTRY_NAME_PATTERN
from components.shared.written import Ledger, named
from components.shared.written import replace_folder as replace_folder  # re-exported: the one way a folder is replaced
from components.shared.written import sha256_of as sha256_file  # one SHA256 helper, for every record

# errors that mean "this disk cannot take the file" (full, quota, read-only, not permitted), not a bug
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class OutputWriteError(OSError):
    """An output could not be written (disk full, read-only, no permission); the message names the file, the
    bytes it needed and the space free. What was there before is untouched."""


def storage_message(path: Path, err: OSError, needed: int | None = None) -> str:
    """One line: the file, why it could not be written, how much it needed and how much its disk has free."""
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = f"{shutil.disk_usage(folder).free:,} bytes free on its file system"
    except OSError:
        free = "free space unknown"
    need = f"{needed:,} bytes needed, " if needed is not None else ""
    return f"{path}: cannot be written ({err.strerror or err}); {need}{free}. Nothing already written was changed"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary sibling, flush it to disk, then rename it over ``path``. A full or read-only
    disk raises :class:`OutputWriteError` naming the file; the temporary file is removed, ``path`` keeps its
    old content."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.errno not in STORAGE_ERRNOS:
            raise
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise OutputWriteError(err.errno, storage_message(path, err, len(data))) from None


def atomic_write_json(path: Path, obj: Any, sort_keys: bool = True) -> None:
    """Indented JSON; ``sort_keys=False`` keeps the order of items where a file format has one."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table, row_group_size: int | None = None) -> None:
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, row_group_size=row_group_size)
    atomic_write_bytes(path, buf.getvalue().to_pybytes())


FINGERPRINT_FILE = "_fingerprint.json"


def fingerprint(payload: Any, sources: list[Path]) -> str:
    """Hash of what decides a stage's output: its shaping params and the code that writes it.

    The code is part of it because a resumed run must never mix shards written by two versions.
    """
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode())
    for path in sources:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


class CorruptFileError(ValueError):
    """A file is unreadable, truncated, or does not match the checksum written with it."""


ENTRY_NAME = re.compile(ENTRY_NAME_PATTERN)


def check_entry_name(name: str, what: str) -> str:
    """``name`` if it is a plain file or folder name (letters, digits, ``_.-``, not starting with a dot);
    else a ValueError naming ``what`` — names from params become paths, and ``../x`` or ``.`` must not."""
    if not isinstance(name, str) or not ENTRY_NAME.match(name) or name in (".", ".."):
        raise ValueError(f"{what}: {name!r} is not a plain name (letters, digits, '_', '-', '.'; no '/', not '.' or '..')")
    return name


def resume_or_restart(out_dir: Path, current: str, stage: str) -> bool:
    """Keep ``out_dir``'s finished work if it was made with the same fingerprint, else remove the files ``stage``'s
    record lists as its own, unchanged (only those: components.shared.written). Returns True when resuming."""
    out_dir = Path(out_dir)
    fp_path = out_dir / FINGERPRINT_FILE
    try:
        same = json.loads(fp_path.read_text()).get("fingerprint") == current
    except (OSError, ValueError, AttributeError):
        same = False
    if not same:
        removed, kept = Ledger(out_dir, stage).remove_files()
        if kept:
            print(f"{out_dir}: kept {len(kept)} file(s) changed since the {stage} stage wrote them: {named(kept, out_dir)}",
                  file=sys.stderr)
    atomic_write_json(fp_path, {"fingerprint": current})
    return same


# --------------------------------------------------------------------------------------------------
# checksums: written with each checkpoint and export, verified before either is loaded
# --------------------------------------------------------------------------------------------------

CHECKSUMS_FILE = "_checksums.json"


def write_checksums(folder: Path) -> None:
    """SHA256 of every file in ``folder`` (recursively) into ``folder/_checksums.json``, written last."""
    folder = Path(folder)
    sums = {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != CHECKSUMS_FILE and not p.name.endswith(".tmp")}
    atomic_write_json(folder / CHECKSUMS_FILE, sums)


def weights_identity(init: str) -> list:
    """What a run's start weights are, for its fingerprint: an export folder by its checksums file (every file's
    SHA256, written last; a changed file without new checksums fails the export check anyway), else by its files'
    SHA256; a weights file by its SHA256; an open_clip tag or ``scratch`` by its name (the params hold it)."""
    path = Path(init)
    if path.is_dir():
        listing = path / CHECKSUMS_FILE
        if listing.is_file():
            return [listing.read_text()]
        return [(p.relative_to(path).as_posix(), sha256_file(p)) for p in sorted(path.rglob("*")) if p.is_file()]
    if path.is_file():
        return [sha256_file(path)]
    return [init]


SAMPLED_BYTES = 1 << 16  # of a shard's start and of its end, hashed into its identity


def shards_identity(shards: list[str]) -> list:
    """What a run's shards are, for its fingerprint: each local file by name, size, modification time and a SHA256 of
    its first and last 64 KiB (a shard rewritten under the same name, even with its size and time put back, is another
    shard; hashing terabytes of shards at every start is not an option, and a tar's headers sit at its start), a URL
    by its name."""
    out = []
    for shard in shards:
        path = Path(shard)
        if not path.is_file():
            out.append((shard,))
            continue
        stat = path.stat()
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            digest.update(f.read(SAMPLED_BYTES))
            if stat.st_size > SAMPLED_BYTES:
                f.seek(max(SAMPLED_BYTES, stat.st_size - SAMPLED_BYTES))
                digest.update(f.read(SAMPLED_BYTES))
        out.append((shard, stat.st_size, stat.st_mtime_ns, digest.hexdigest()))
    return out


def checksum_problem(folder: Path) -> str | None:
    """None when every file ``folder/_checksums.json`` lists is there with its checksum; else what is wrong,
    naming the file (a missing checksums file means the folder was never finished)."""
    folder = Path(folder)
    listing = folder / CHECKSUMS_FILE
    if not listing.is_file():
        return f"{listing}: missing (the folder was not finished)"
    try:
        sums = json.loads(listing.read_text())
    except ValueError as err:
        return f"{listing}: unreadable ({err})"
    if not isinstance(sums, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items()):
        return f"{listing}: not a JSON object of file names and their SHA256 (got {type(sums).__name__})"
    if bad := next((k for k in sums if Path(k).is_absolute() or ".." in Path(k).parts), None):
        return f"{listing}: lists {bad!r}, a path outside its folder"
    for name, expected in sums.items():
        path = folder / name
        if not path.is_file():
            return f"{path}: missing"
        if sha256_file(path) != expected:
            return f"{path}: checksum mismatch (truncated or changed since it was written)"
    return None


def read_parquet(path: Path, **kwargs) -> pa.Table:
    """``pq.read_table`` with a :class:`CorruptFileError` naming the file when it is not Parquet."""
    try:
        return pq.read_table(path, **kwargs)
    except (pa.ArrowInvalid, OSError) as err:
        raise CorruptFileError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0][:200]})") from None
