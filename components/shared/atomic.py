"""Atomic output files: a path is either absent or complete, never half-written (a killed stage
leaves at most a ``*.tmp`` file behind, which the next run overwrites)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary sibling, flush it to disk, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any, sort_keys: bool = True) -> None:
    """Indented JSON; ``sort_keys=False`` keeps the order of items where a file format has one."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
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


def resume_or_restart(out_dir: Path, current: str, owned: list[str]) -> bool:
    """Keep ``out_dir``'s finished work if it was made with the same fingerprint, else remove the
    ``owned`` entries (only those: a user's directory may hold other things). Returns True when resuming."""
    out_dir = Path(out_dir)
    fp_path = out_dir / FINGERPRINT_FILE
    same = fp_path.is_file() and json.loads(fp_path.read_text()).get("fingerprint") == current
    if not same:
        for name in owned:
            target = out_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
    atomic_write_json(fp_path, {"fingerprint": current})
    return same
