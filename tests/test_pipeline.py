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


def _repo_with_outputs(tmp_path: Path) -> Path:
    """A git repo with the project's Makefile and .gitignore, a committed example report and a run's own outputs."""
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("Makefile", ".gitignore"):
        shutil.copy(REPO / name, work / name)
    files = {"reports/example-run/benchmarks.md": "shipped", "reports/calibration.json": "{}", "metrics/base.json": "{}",
             "data/sources/README.md": "mine"}
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=work, check=True)
    for name in ("reports/benchmarks.md", "reports/metrics.json", "reports/gallery/index.html", "metrics/train.json",
                 "data/captions/manifest.parquet", "mlruns/0/meta.yaml"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("a run's output")
    return work


def test_a_runs_reports_are_ignored_and_clean_data_keeps_the_committed_ones(tmp_path):
    work = _repo_with_outputs(tmp_path)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=work, capture_output=True, text=True, check=True)
    assert status.stdout == ""  # a run's outputs never show as edits or new files
    subprocess.run(["make", "clean-data"], cwd=work, check=True, capture_output=True, env={**os.environ, "UV": "/bin/true"})
    for name in ("reports/example-run/benchmarks.md", "reports/calibration.json", "metrics/base.json", "data/sources/README.md"):
        assert (work / name).is_file(), f"clean-data removed the committed {name}"
    for name in ("reports/benchmarks.md", "reports/gallery", "metrics/train.json", "data/captions", "mlruns"):
        assert not (work / name).exists(), f"clean-data left {name}"


def test_example_run_keeps_a_runs_report_as_the_shipped_one(tmp_path):
    work = _repo_with_outputs(tmp_path)
    refused = subprocess.run(["make", "example-run"], cwd=work, capture_output=True, text=True)
    assert refused.returncode != 0  # an incomplete run (no chart, no intervals): the shipped report stays as it was
    assert (work / "reports" / "example-run" / "benchmarks.md").read_text() == "shipped"
    for name in ("benchmarks.png", "intervals.json", "plots/finetuned.json"):
        (work / "reports" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "reports" / name).write_text("new")
    subprocess.run(["make", "example-run"], cwd=work, check=True, capture_output=True)
    assert (work / "reports" / "example-run" / "benchmarks.md").read_text() == "a run's output"
    assert (work / "reports" / "example-run" / "plots" / "finetuned.json").is_file()
    assert not (work / "reports" / "example-run.tmp").exists()
