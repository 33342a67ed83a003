"""`make clean-data`: remove what the pipeline generated in this checkout, and nothing of the user's.

The checkout is the one this script lies in, never the current directory's. A file goes only when a stage's record of
what it wrote (``.c2lip-<stage>-outputs.json`` beside it: its path and SHA256, ``components/shared/written.py``) lists
it with the same content, the record stands where it was written (a copied or renamed report folder carries a record
of another place: nothing in it goes), and git does not track it. Where it looks: the stages' data folders under
``data/`` (``PIPELINE_DATA``; never ``data/sources/``), ``metrics/``, the local MLflow artifacts and every folder
under ``reports/``. Anything else there — a user's plot, notes, a hand-made report, a file changed since the stage
wrote it — is kept and named in one line.

It holds the workspace's run lock while it works (a `make run` beside it is never cleaned under its feet), and needs
only the standard library: it runs before the project's environment exists (`make clean-data` on a fresh clone).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from components.shared.written import files_under, ledgers_in, lock_or_holder, named, remove_recorded  # noqa: E402

# the stages' working folders under data/ (the captions, recaption, concepts and benchmarks stages' outputs, the
# evaluate stage's cache); tests/test_pipeline.py checks this covers every dvc.yaml output under data/
PIPELINE_DATA = ("data/captions", "data/recaptions", "data/concepts", "data/benchmarks", "data/evaluate_cache")
STORES = ("metrics", "mlartifacts", "mlruns")
MLFLOW_STORE = ("mlartifacts", "mlruns")  # MLflow's own files (with mlflow.db): the user's runs and registered versions
REPORTS = "reports"
# records of outputs kept on purpose, never cleaned: the shipped example run (`make example-run`, committed)
KEPT_ON_PURPOSE = ("example-run",)
LOCK_FILE = re.compile(r"^\.c2lip-[A-Za-z0-9_.-]+\.lock$")
RUN_LOCK = ".c2lip-run.lock"  # components/shared/params_base.py RUN_LOCK (a test holds them equal)


class CleanError(RuntimeError):
    """clean-data cannot run here (another run holds the workspace, or this is not a c2lip checkout)."""


def tracked_files(root: Path) -> set[str]:
    """Files git tracks in ``root`` (relative paths); none where ``root`` is not a git checkout (an archive)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return set()
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return set()  # root lies inside another repository without being one itself: its files are not tracked here
    return {line for line in out.stdout.split("\0") if line}


def ledger_folders(root: Path) -> list[Path]:
    """Every folder under the cleaned areas holding a stage's record, deepest first (links never followed)."""
    found = []
    for area in (*PIPELINE_DATA, *STORES, REPORTS):
        top = root / area
        if top.is_symlink() or not top.is_dir():
            continue
        for dirpath, _, _ in os.walk(top, followlinks=False):
            if any(ledger.stage not in KEPT_ON_PURPOSE for ledger in ledgers_in(Path(dirpath), root)):
                found.append(Path(dirpath))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def clean(root: Path) -> tuple[list[str], list[str]]:
    """Remove the recorded outputs under ``root``; returns (removed, kept): workspace-relative paths, sorted. Kept: the
    files under the cleaned areas that git does not track and no record lists unchanged."""
    root = Path(root)
    tracked = tracked_files(root)
    removed = []
    for folder in ledger_folders(root):
        prefix = folder.relative_to(root).as_posix()
        mine = frozenset(t[len(prefix) + 1:] for t in tracked if t.startswith(prefix + "/"))
        gone = remove_recorded(folder, mine, root, skip=KEPT_ON_PURPOSE)
        removed += [f"{prefix}/{f}" for f in gone]
    kept = []
    for area in (*PIPELINE_DATA, *STORES, REPORTS):
        top = root / area
        if top.is_dir() and not top.is_symlink():
            # a writer's lock file (.c2lip-<what>.lock, empty or its holder's pid) is no output: kept, not named
            kept += [f"{area}/{f}" for f in files_under(top) if f"{area}/{f}" not in tracked and not LOCK_FILE.match(Path(f).name)]
        elif top.is_symlink():
            kept.append(area)
    return sorted(removed), sorted(kept)


def kept_line(kept: list[str]) -> str:
    """One line: the MLflow store as a count, then the other files kept, up to five by name."""
    store = [f for f in kept if f.split("/")[0] in MLFLOW_STORE]
    others = [f for f in kept if f not in store]
    parts = [named(others)] if others else []
    if store:
        parts.append(f"the MLflow store ({', '.join(sorted({f.split('/')[0] + '/' for f in store}))} {len(store)} file(s): your "
                     "runs and registered versions; remove it with mlflow.db to start afresh)")
    return f"clean-data: kept {len(kept)} file(s) it did not write (or that changed since): {'; '.join(parts)}"


def hold_workspace(root: Path):
    """The workspace's run lock (the one every run takes, flows/workspace.py), or CleanError naming its holder."""
    handle, holder = lock_or_holder(root / RUN_LOCK)
    if handle is None:
        raise CleanError(f"another c2lip run holds the workspace {root} ({holder}); nothing was removed. "
                         "Run clean-data when it has ended") from None
    return handle


def main() -> int:
    if not (ROOT / "components" / "shared" / "written.py").is_file() or not (ROOT / "dvc.yaml").is_file():
        print(f"clean-data: {ROOT} is not a c2lip checkout; nothing was removed", file=sys.stderr)
        return 2
    try:
        lock = hold_workspace(ROOT)
    except CleanError as err:
        print(f"clean-data: {err}", file=sys.stderr)
        return 2
    try:
        removed, kept = clean(ROOT)
    finally:
        lock.close()
    for name in removed:
        print(f"Removing {name}")
    print(f"clean-data: removed {len(removed)} file(s) the pipeline wrote in {ROOT}")
    if kept:
        print(kept_line(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
