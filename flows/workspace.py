"""One run at a time per workspace: an exclusive lock file, and temporary params overrides.

DVC has its own lock, but a `full` run is more than one DVC command (several `dvc repro`, `dvc exp save`,
`dvc push`, registration) and may rewrite params files in between; a second run interleaving with it
would mix two configurations. The lock is an OS-level ``flock``: released when the holder exits, even on
a kill, so a crashed run never blocks the next one.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from components.shared.atomic import atomic_write_bytes, atomic_write_json
from components.shared.params import deep_merge, read_yaml, validate_params
from components.shared.params_base import OVERRIDES_JOURNAL
from components.shared.params_base import RUN_LOCK as LOCK_NAME
from components.shared.processes import mark_run, reap
from components.shared.written import lock_or_holder


class WorkspaceBusy(RuntimeError):
    """Another run holds the workspace."""


@contextlib.contextmanager
def workspace_lock(root: Path, owner: str, wait_s: float = 0.0, poll_s: float = 1.0) -> Iterator[None]:
    """Hold the workspace's run lock; wait up to ``wait_s`` seconds for it, then raise :class:`WorkspaceBusy`
    naming the holder.

    Taking the lock also clears up after runs that were killed: their leftover processes (any process
    carrying the run id of a root process that is gone, :mod:`components.shared.processes`) are ended, and
    params files a killed run left overridden are put back."""
    path = Path(root) / LOCK_NAME
    deadline = time.monotonic() + wait_s
    while True:
        handle, holder = lock_or_holder(path)
        if handle is not None:
            break
        if time.monotonic() >= deadline:
            raise WorkspaceBusy(f"another c2lip run holds the workspace {root} ({holder}); it was not changed. "
                                "Wait for that run, or queue behind it: `make run WAIT=<seconds>` (`make compare "
                                "WAIT=…`), a deployment's wait_for_workspace_s.")
        time.sleep(poll_s)
    try:
        reap_killed_runs()  # their root process is gone, so no live run owns them (in any workspace)
        restored = restore_interrupted_overrides(root)  # the lock is ours: a journal left is a dead run's
        if restored:
            print(f"c2lip: put back {', '.join(restored)}, left overridden by an interrupted run", flush=True)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"owner": owner, "pid": os.getpid(), "run_id": mark_run(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        yield
    finally:
        handle.seek(0)
        handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def holder_if_busy(root: Path) -> str | None:
    """Who holds the workspace's run lock now (None: nobody), without taking it: a run checks it before any work (a
    Prefect server to start, a suite to build) and refuses in one line rather than after minutes."""
    path = Path(root) / LOCK_NAME
    if not path.exists():
        return None
    handle, holder = lock_or_holder(path)
    if handle is not None:
        handle.close()  # free: let go at once
    return holder


def resolve_overrides(root: Path, overrides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each stage's params file with its overrides merged in, validated by the stage's pydantic model
    before any work (raises ParamsError naming the file, key and reason). Returns stage → merged mapping."""
    merged = {}
    for stage, changes in overrides.items():
        if not changes:
            continue
        path = Path(root) / "params" / f"{stage}.yaml"
        base = read_yaml(path)
        data = deep_merge(base, changes)
        validate_params(stage, data, f"{path} + overrides")
        merged[stage] = data
    return merged


def reap_killed_runs() -> dict[str, list[int]]:
    """End the leftover processes of killed runs (any process whose run id names a root process that is
    gone: :func:`components.shared.processes.leftovers`); returns them by run id."""
    runs = reap()
    if runs:
        print(f"c2lip: ended {sum(map(len, runs.values()))} leftover process(es) of killed run(s) {sorted(runs)}: "
              f"{sorted(p for pids in runs.values() for p in pids)}", flush=True)
    return runs


def restore_interrupted_overrides(root: Path) -> list[str]:
    """Put back the params files a killed run left overridden (from the journal it wrote before changing
    them), byte for byte, and remove the journal. Returns the files restored. Call it holding the lock."""
    journal = Path(root) / OVERRIDES_JOURNAL
    if not journal.is_file():
        return []
    originals = json.loads(journal.read_text())
    for name, content in originals.items():
        atomic_write_bytes(Path(root) / name, base64.b64decode(content))
    journal.unlink()
    return sorted(originals)


@contextlib.contextmanager
def params_overridden(root: Path, merged: dict[str, dict[str, Any]]) -> Iterator[list[Path]]:
    """Write the merged params files for the duration of the block, then put the originals back byte for byte.

    The originals go to a journal (``.c2lip-params-journal.json``) before any file changes, so that a run
    killed mid-way (kill -9, power) cannot leave the overrides behind: the next run restores them when it
    takes the lock, and a stage started by hand meanwhile refuses to read them (params.load_params)."""
    root = Path(root)
    paths = {stage: root / "params" / f"{stage}.yaml" for stage in merged}
    originals = {path: path.read_bytes() for path in paths.values()}
    journal = root / OVERRIDES_JOURNAL
    if originals:
        atomic_write_json(journal, {str(p.relative_to(root)): base64.b64encode(c).decode() for p, c in originals.items()})
    try:
        for stage, data in merged.items():
            path = paths[stage]
            header = "".join(line + "\n" for line in originals[path].decode().splitlines() if line.startswith("#"))
            atomic_write_bytes(path, (header + "# (a c2lip flow run's overrides are applied below)\n"
                                      + yaml.safe_dump(data, sort_keys=False)).encode())
        yield list(originals)
    finally:
        for path, content in originals.items():
            atomic_write_bytes(path, content)
        journal.unlink(missing_ok=True)


@contextlib.contextmanager
def run_with_overrides(root: Path, overrides: dict[str, dict[str, Any]], owner: str, wait_s: float = 0.0,
                       poll_s: float = 1.0) -> Iterator[dict[str, dict[str, Any]]]:
    """Hold the workspace lock, then merge ``overrides`` into the params files and write them for the block;
    yields the merged params (stage -> mapping).

    The params files are read only while the lock is held: taking it may put back a killed run's originals,
    and a queued run waits while the run ahead of it has its own overrides on disk — a merge read before
    either would carry the other run's values into this one."""
    with workspace_lock(root, owner, wait_s, poll_s):
        merged = resolve_overrides(root, overrides)
        with params_overridden(root, merged):
            yield merged


# The escape hatch of the path rule, set where the worker runs (its environment), never in a run's parameters:
# folders outside the workspace that deployments may name, separated by ':' (e.g. C2LIP_OUTSIDE_ROOTS=/srv/reports).
OUTSIDE_ROOTS_ENV = "C2LIP_OUTSIDE_ROOTS"


def allowed_roots(root: Path) -> list[Path]:
    """The workspace and the folders the worker's environment admits (:data:`OUTSIDE_ROOTS_ENV`: absolute folders,
    never the file system's root; a relative entry would depend on the worker's working directory)."""
    from components.shared.params import ParamsError

    extra = []
    for entry in (p.strip() for p in os.environ.get(OUTSIDE_ROOTS_ENV, "").split(os.pathsep)):
        if not entry:
            continue
        path = Path(entry).expanduser()
        if not path.is_absolute():
            raise ParamsError(f"{OUTSIDE_ROOTS_ENV}: {entry!r} is relative; give absolute folders (a relative one would "
                              "depend on the worker's working directory)")
        if path.resolve() == Path(path.resolve().anchor):
            raise ParamsError(f"{OUTSIDE_ROOTS_ENV}: {entry!r} admits the whole file system ({path.resolve()}); give the "
                              "folders a run may use")
        extra.append(path.resolve())
    return [Path(root).resolve(), *extra]


def path_inside(root: Path, value: str | Path, what: str) -> Path:
    """``value`` (relative to the workspace ``root``) resolved, if it leads inside the workspace or a folder the worker
    admits; else a ParamsError naming ``what``. A deployment's parameters come from whoever can reach the Prefect
    server: an absolute or ``../`` path must not let them write, or read, anywhere the worker can."""
    from components.shared.params import ParamsError

    target = (Path(root).resolve() / value).resolve()
    if not any(target.is_relative_to(allowed) for allowed in allowed_roots(root)):
        raise ParamsError(f"{what}: {value} leads to {target}, outside the workspace {Path(root).resolve()}; use a path inside "
                          f"it (the worker's environment variable {OUTSIDE_ROOTS_ENV} admits other folders)")
    return target


def _models_in(annotation: Any) -> list[type]:
    """The params models an annotation holds (``Model``, ``Model | None``, ``list[Model]``, ``dict[str, Model]``)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_path(annotation: Any) -> bool:
    return annotation is Path or any(_is_path(arg) for arg in typing.get_args(annotation))


def _is_text(annotation: Any) -> bool:
    return annotation is str or any(_is_text(arg) for arg in typing.get_args(annotation))


PROSE_FIELDS = {"description", "name", "preset"}  # text fields that are never paths (a description may hold "w/o")


def looks_like_local_path(value: Any) -> bool:
    """A text field's value that names a local file or folder (shards, ``model.init``, a model's ``uri``, a benchmark
    file, a captioner's folder): it holds a "/" or starts with ".", and is no URI (``models:/…``, ``https://…``,
    ``hf-hub:…``); an open_clip tag or ``scratch`` is not one. (No stage expands "~": it is a folder name there.)"""
    import re

    return isinstance(value, str) and ("/" in value or value.startswith(".")) and not re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", value)


def confine_paths(root: Path, values: Any, model: type, where: str) -> None:
    """Every path field that ``values`` (a run's parameters, shaped as ``model``) sets, at any depth, leads inside the
    workspace (:func:`path_inside`); raises a ParamsError naming the first that does not."""
    if isinstance(values, list):
        for k, item in enumerate(values):
            confine_paths(root, item, model, f"{where}[{k}]")
        return
    if not isinstance(values, dict):
        return
    for key, value in values.items():
        field = model.model_fields.get(key) if hasattr(model, "model_fields") else None
        if field is None or value is None:
            continue
        annotation = field.annotation
        if _is_path(annotation) or (_is_text(annotation) and key not in PROSE_FIELDS):  # shards, model.init, uris: paths
            for one in value if isinstance(value, list) else value.values() if isinstance(value, dict) else [value]:
                if _is_path(annotation) or looks_like_local_path(one):
                    path_inside(root, one, f"{where}.{key}")
        for sub in _models_in(annotation):
            mapping = isinstance(value, dict) and _is_mapping_of_models(annotation)  # dict[str, Model]: its values
            confine_paths(root, list(value.values()) if mapping else value, sub, f"{where}.{key}")


def _is_mapping_of_models(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is dict:
        return bool(_models_in(typing.get_args(annotation)[1]))
    return any(_is_mapping_of_models(arg) for arg in typing.get_args(annotation))


def output_dir_inside(root: Path, output_dir: str | Path, name: str) -> Path:
    """``root/output_dir/name`` resolved, where a flow run writes a report: inside the workspace or a folder the
    worker's environment admits (:func:`path_inside`). ``name`` must be a plain name."""
    from components.shared.atomic import check_entry_name
    from components.shared.params import ParamsError

    try:
        check_entry_name(name, "model.name (the report's folder)")
    except ValueError as err:
        raise ParamsError(str(err)) from None
    target = path_inside(root, Path(output_dir) / name, "output_dir")
    if owner := pipeline_owner(root, target):
        raise ParamsError(f"output_dir/model.name: {target} is {owner}; an ad-hoc evaluation writes a folder of its own "
                          "(the default output_dir, reports/adhoc, keeps each model's report apart)")
    return target


def pipeline_owner(root: Path, target: Path) -> str | None:
    """What already owns ``target`` (an ad-hoc report folder), or None when it is free: the workspace itself, the
    evaluate stage's report folder (register reads its metrics for the promotion gates), a folder a DVC stage
    writes or one inside it, or a folder holding committed files (the shipped reports)."""
    import subprocess

    from components.shared.params import load_params

    root, target = Path(root).resolve(), Path(target).resolve()
    if target == root:
        return "the workspace itself"
    if target == (root / load_params("evaluate").output_dir).resolve():
        return "the evaluate stage's report folder (its metrics feed registration and promotion)"
    stages = (yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages", {}) if (root / "dvc.yaml").is_file() else {}
    for name, stage in stages.items():
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get(kind) or []:
                path = (root / (next(iter(out)) if isinstance(out, dict) else out)).resolve()
                if target == path or path in target.parents:
                    return f"the {name} stage's output {path.relative_to(root)} (dvc.yaml)"
    try:
        tracked = subprocess.run(["git", "ls-files", "--", str(target)], cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        tracked = ""  # not a git checkout: nothing is committed there
    return f"a folder of committed files ({tracked.splitlines()[0]}, ...)" if tracked.strip() else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    from components.shared.params import ROOT

    parser = argparse.ArgumentParser(description="The workspace of c2lip flow runs.")
    parser.add_argument("--restore", action="store_true", help="put back params files an interrupted run left overridden")
    args = parser.parse_args(argv)
    if not args.restore:
        parser.print_help()
        return 0
    try:
        with workspace_lock(ROOT, "python -m flows.workspace --restore"):
            pass  # taking the lock restores them
    except WorkspaceBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
