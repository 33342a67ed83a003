"""Atomic output files: a path is either absent or complete, never half-written (a killed stage
leaves at most a ``*.tmp`` file behind, which the next run overwrites)."""

from __future__ import annotations

import json
import os
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


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue().to_pybytes())
