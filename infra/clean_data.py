"""`make clean-data`: remove what the pipeline generated, and nothing of the user's.

Only three kinds of entries go, and only when git neither tracks them nor would keep them (ignored, untracked):

- the stages' own data folders under ``data/`` (``PIPELINE_DATA``; a test checks it covers dvc.yaml's outputs there),
  never ``data/sources/`` (where users keep their tables and shards) or any other folder of the user's;
- ``metrics/`` files, the local MLflow store (``mlruns/``, ``mlartifacts/``);
- under ``reports/``: every file a stage's manifest (``.c2lip-<stage>-outputs.json``) lists as its own, with the
  manifest itself; the evaluate stage's report (``EVALUATE_REPORT``) whole only where it left no manifest. A folder a user made there
  (``reports/my-analysis/``) or a file of theirs beside a report stays.

Standard library only: it runs before the project's environment exists (`make clean-data` on a fresh clone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# the stages' working folders under data/ (the captions, recaption, concepts and benchmarks stages' outputs, the
# evaluate stage's cache); tests/test_pipeline.py checks this covers every dvc.yaml output under data/
PIPELINE_DATA = ("data/captions", "data/recaptions", "data/concepts", "data/benchmarks", "data/evaluate_cache")
# the evaluate stage's outputs in reports/ (dvc.yaml), also for a run that stopped before writing its manifest
EVALUATE_REPORT = ("reports/benchmarks.md", "reports/benchmarks.png", "reports/metrics.json", "reports/intervals.json",
                   "reports/items", "reports/plots", "reports/gallery")
# what registration writes beside it (components/register.py): the registered version's model card
REGISTER_REPORT = ("reports/model-card.md",)
STORES = ("metrics", "mlruns", "mlartifacts")
MANIFEST_GLOB = ".c2lip-*-outputs.json"
EVALUATE_MANIFEST = ".c2lip-evaluate-outputs.json"


def _git_lines(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.split("\0") if line]


def _ignored_untracked(root: Path, paths: list[str]) -> set[str]:
    """Files (and links) under ``paths`` that git ignores and does not track, relative to ``root``."""
    if not paths:
        return set()
    return set(_git_lines(root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--", *paths))


def _manifest_files(root: Path) -> list[str]:
    """Every file a stage's manifest under reports/ lists, and the manifests themselves."""
    listed: list[str] = []
    reports = root / "reports"
    if not reports.is_dir():
        return listed
    for manifest in sorted(reports.rglob(MANIFEST_GLOB)):
        if manifest.is_symlink():
            continue
        folder = manifest.parent.relative_to(root).as_posix()
        listed.append(f"{folder}/{manifest.name}")
        try:
            files = json.loads(manifest.read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            print(f"clean-data: {manifest.relative_to(root)} is unreadable: only the manifest goes, "
                  "the files it listed stay", file=sys.stderr)
            continue
        for name in files:
            # plain relative names only: a manifest can never point a removal outside its folder
            if isinstance(name, str) and name and not name.startswith("/") and ".." not in Path(name).parts:
                listed.append(f"{folder}/{name}")
    return listed


def _remove_empty_parents(path: Path, stop: Path) -> None:
    for parent in path.parents:
        if parent == stop or stop not in parent.parents:
            return
        try:
            parent.rmdir()  # only an empty folder goes
        except OSError:
            return


def clean(root: Path) -> list[str]:
    """Remove the pipeline's generated files under ``root``; returns what was removed (relative paths, sorted)."""
    # the evaluate stage's report goes whole only when no manifest says which of its files are the stage's
    report = () if (root / "reports" / EVALUATE_MANIFEST).is_file() else EVALUATE_REPORT
    existing = [p for p in (*PIPELINE_DATA, *STORES, *report, *REGISTER_REPORT) if (root / p).exists() or (root / p).is_symlink()]
    removable = _ignored_untracked(root, existing)
    manifest_files = [p for p in _manifest_files(root) if (root / p).is_file() or (root / p).is_symlink()]
    removable |= _ignored_untracked(root, manifest_files) & set(manifest_files)
    for name in sorted(removable):
        path = root / name
        print(f"Removing {name}")
        path.unlink()
        _remove_empty_parents(path, root)
    # a whole generated folder that held only what went above is gone with it; a user's file inside one keeps it
    for folder in (*PIPELINE_DATA, *STORES, *EVALUATE_REPORT):
        path = root / folder
        if path.is_dir() and not path.is_symlink():
            for dirpath, _, _ in sorted(os.walk(path), reverse=True):
                try:
                    Path(dirpath).rmdir()
                except OSError:
                    pass
    return sorted(removable)


def main() -> int:
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
    root = Path(top.stdout.strip())
    removed = clean(root)
    print(f"clean-data: removed {len(removed)} generated file(s); data/sources/ and your own files in reports/ stay")
    return 0


if __name__ == "__main__":
    sys.exit(main())
