"""The two README commands' machinery: the Makefile's install stamp, and `dvc repro` of dvc.yaml."""

import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import REPO


def _make_dry_run(workdir: Path) -> str:
    env = {**os.environ, "UV": "/bin/true"}
    out = subprocess.run(["make", "-n", "install"], cwd=workdir, env=env, capture_output=True, text=True, check=True)
    return out.stdout


def test_make_installs_only_when_the_lock_or_project_changed(tmp_path):
    for name in ("Makefile", "pyproject.toml", "uv.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    assert "sync --frozen" in _make_dry_run(tmp_path)  # no .venv yet: install
    stamp = tmp_path / ".venv" / ".c2lip-installed"
    stamp.parent.mkdir()
    stamp.touch()
    assert "sync" not in _make_dry_run(tmp_path)  # installed and nothing changed: skip
    later = time.time() + 5
    os.utime(tmp_path / "uv.lock", (later, later))
    assert "sync --frozen" in _make_dry_run(tmp_path)  # the lock changed: install again


def test_ci_runs_the_readme_test_command():
    readme_head = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "make run" in readme_head and "make test" in readme_head
    assert "make test" in (REPO / ".ci" / "run").read_text()
