"""One run at a time per workspace: an exclusive lock file, and temporary params overrides.

DVC has its own lock, but a `full` run is more than one DVC command (several `dvc repro`, `dvc exp save`,
`dvc push`, registration) and may rewrite params files in between; a second run interleaving with it
would mix two configurations. The lock is an OS-level ``flock``: released when the holder exits, even on
a kill, so a crashed run never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from components.shared.atomic import atomic_write_bytes
from components.shared.params import deep_merge, validate_params

LOCK_NAME = ".c2lip-run.lock"


class WorkspaceBusy(RuntimeError):
    """Another run holds the workspace."""


@contextlib.contextmanager
def workspace_lock(root: Path, owner: str, wait_s: float = 0.0, poll_s: float = 1.0) -> Iterator[None]:
    """Hold the workspace's run lock; wait up to ``wait_s`` seconds for it, then raise :class:`WorkspaceBusy`
    naming the holder."""
    path = Path(root) / LOCK_NAME
    handle = open(path, "a+")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise WorkspaceBusy(f"another c2lip run holds the workspace {root} ({holder}); it was not changed. "
                                    f"Wait for that run, or pass wait_for_workspace_s to queue behind it.") from None
            time.sleep(poll_s)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"owner": owner, "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        yield
    finally:
        handle.seek(0)
        handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def resolve_overrides(root: Path, overrides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each stage's params file with its overrides merged in, validated by the stage's pydantic model
    before any work (raises ParamsError naming the file, key and reason). Returns stage → merged mapping."""
    merged = {}
    for stage, changes in overrides.items():
        if not changes:
            continue
        path = Path(root) / "params" / f"{stage}.yaml"
        base = yaml.safe_load(path.read_text()) or {}
        data = deep_merge(base, changes)
        validate_params(stage, data, f"{path} + overrides")
        merged[stage] = data
    return merged


@contextlib.contextmanager
def params_overridden(root: Path, merged: dict[str, dict[str, Any]]) -> Iterator[list[Path]]:
    """Write the merged params files for the duration of the block, then put the originals back byte for byte."""
    originals: dict[Path, bytes] = {}
    try:
        for stage, data in merged.items():
            path = Path(root) / "params" / f"{stage}.yaml"
            originals[path] = path.read_bytes()
            header = "".join(line + "\n" for line in originals[path].decode().splitlines() if line.startswith("#"))
            atomic_write_bytes(path, (header + "# (a c2lip flow run's overrides are applied below)\n"
                                      + yaml.safe_dump(data, sort_keys=False)).encode())
        yield list(originals)
    finally:
        for path, content in originals.items():
            atomic_write_bytes(path, content)

