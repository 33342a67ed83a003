"""The two README commands' machinery: the Makefile's install stamp, and `dvc repro` of dvc.yaml."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import REPO


def _make_dry_run(workdir: Path, *variables: str) -> str:
    env = {**os.environ, "UV": "/bin/true"}
    env.pop("REMOTES", None)
    out = subprocess.run(["make", "-n", "install", *variables], cwd=workdir, env=env, capture_output=True, text=True, check=True)
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


def test_other_dvc_remotes_install_on_request_and_later_installs_keep_them(tmp_path):
    for name in ("Makefile", "pyproject.toml", "uv.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    stamp = tmp_path / ".venv" / ".c2lip-installed"
    stamp.parent.mkdir()
    stamp.touch()
    assert "sync" not in _make_dry_run(tmp_path)
    asked = _make_dry_run(tmp_path, "REMOTES=gs azure")  # installed, but another set of remotes asked for
    assert "sync --frozen --python 3.11 --compile-bytecode --extra gs --extra azure" in asked
    (tmp_path / ".venv" / ".c2lip-remotes").write_text("gs azure\n")  # what that install records
    assert "sync" not in _make_dry_run(tmp_path) and "sync" not in _make_dry_run(tmp_path, "REMOTES=azure gs")
    later = time.time() + 5
    os.utime(tmp_path / "uv.lock", (later, later))
    assert "--extra gs --extra azure" in _make_dry_run(tmp_path)  # a changed lock reinstalls them too
    assert "--extra" not in _make_dry_run(tmp_path, "REMOTES=")  # and they can be dropped
    extras = {"gs", "azure"}
    import tomllib

    assert extras <= set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def test_ci_runs_the_readme_commands_in_the_readme_order():
    readme_head = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "make run" in readme_head and "make test" in readme_head
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip().startswith("make ")]
    assert commands == ["make lint", "make run", "make test"]  # what a newcomer does: run, then test


def _repo_with_outputs(tmp_path: Path) -> Path:
    """A git repo with what `make clean-data` and `make example-run` need, a committed example report (with its record)
    and a run's own outputs, recorded as the stages record them."""
    from components.shared.written import Ledger, files_under

    work = tmp_path / "repo"
    work.mkdir()
    for name in ("Makefile", ".gitignore", "dvc.yaml", "infra/clean_data.py", "infra/example_run.py", "components/__init__.py",
                 "components/shared/__init__.py", "components/shared/written.py"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, work / name)
    files = {"reports/example-run/benchmarks.md": "shipped", "reports/calibration.json": "{}", "metrics/base.json": "{}",
             "data/sources/README.md": "mine"}
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    example = work / "reports" / "example-run"
    Ledger(example, "example-run", workspace=work).record(files_under(example))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=work, check=True)
    for name in ("reports/benchmarks.md", "reports/metrics.json", "reports/gallery/index.html", "metrics/train.json",
                 "data/captions/manifest.parquet", "mlruns/0/meta.yaml"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("a run's output")
    Ledger(work / "reports", "evaluate", workspace=work).record(["benchmarks.md", "metrics.json", "gallery/index.html"])
    Ledger(work / "metrics", "train", workspace=work).record(["train.json"])
    Ledger(work / "data" / "captions", "captions", workspace=work).record(["manifest.parquet"])
    return work


def test_a_runs_reports_are_ignored_and_clean_data_keeps_the_committed_ones(tmp_path):
    work = _repo_with_outputs(tmp_path)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=work, capture_output=True, text=True, check=True)
    assert status.stdout == ""  # a run's outputs (and their records) never show as edits or new files
    done = subprocess.run(["make", "clean-data"], cwd=work, check=True, capture_output=True, text=True, env={**os.environ, "UV": "/bin/true"})
    for name in ("reports/example-run/benchmarks.md", "reports/calibration.json", "metrics/base.json", "data/sources/README.md"):
        assert (work / name).is_file(), f"clean-data removed the committed {name}"
    for name in ("reports/benchmarks.md", "reports/gallery", "metrics/train.json", "data/captions"):
        assert not (work / name).exists(), f"clean-data left {name}"
    # the MLflow store is no stage's output: kept, and said
    assert (work / "mlruns" / "0" / "meta.yaml").is_file() and "kept 1 file(s)" in done.stdout and "the MLflow store (mlruns/ 1 file(s)" in done.stdout


def test_clean_data_keeps_the_users_own_tables_shards_and_report_folders(tmp_path):
    from components.shared.written import Ledger

    work = _repo_with_outputs(tmp_path)
    mine = {"data/sources/my_table.csv": "url,caption", "data/sources/myshards/00000.tar": "tar",
            "data/my_notes/plan.txt": "mine", "reports/my-analysis/notes.md": "mine", "reports/gallery/my_page.html": "mine",
            "reports/my-compare/my_notes.md": "mine"}
    generated = {"reports/my-compare/compare.md": "a comparison", "reports/my-compare/compare-gallery/index.html": "page",
                 "data/evaluate_cache/model/items.parquet": "cache"}
    for name, text in {**mine, **generated}.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    Ledger(work / "reports" / "my-compare", "compare", workspace=work).record(["compare.md", "compare-gallery/index.html",
                                                                                "../../data/sources/my_table.csv"])
    Ledger(work / "data" / "evaluate_cache", "evaluate", workspace=work).record(["model/items.parquet"])
    done = subprocess.run(["make", "clean-data"], cwd=work, capture_output=True, text=True, env={**os.environ, "UV": "/bin/true"})
    assert done.returncode == 0, done.stderr
    for name, text in mine.items():
        assert (work / name).read_text() == text, f"clean-data removed the user's {name}"
    for name in (*generated, "reports/my-compare/.c2lip-compare-outputs.json", "reports/.c2lip-evaluate-outputs.json",
                 "reports/benchmarks.md", "reports/gallery/index.html", "data/captions"):
        assert not (work / name).exists(), f"clean-data left the generated {name}"
    assert "Removing data/sources" not in done.stdout and "Removing reports/my-analysis" not in done.stdout


def test_clean_data_knows_every_data_and_report_output_of_dvc_yaml():
    sys.path.insert(0, str(REPO / "infra"))
    try:
        import clean_data
    finally:
        sys.path.remove(str(REPO / "infra"))
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    outputs = [next(iter(o)) if isinstance(o, dict) else o
               for stage in stages.values() for kind in ("outs", "metrics") for o in stage.get(kind, [])]
    for out in outputs:
        if out.startswith("data/"):
            assert any(out == d or out.startswith(d + "/") for d in clean_data.PIPELINE_DATA), out
        if out.startswith("reports/"):
            assert out.startswith(clean_data.REPORTS + "/"), out


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
    assert not list((work / "reports").glob(".example-run*")) and not (work / "reports" / "example-run.tmp").exists()
    (work / "reports" / "example-run" / "mine.txt").write_text("mine")  # a file of yours there: refused, kept
    refused = subprocess.run(["make", "example-run"], cwd=work, capture_output=True, text=True)
    assert refused.returncode != 0 and "mine.txt" in refused.stderr
    assert (work / "reports" / "example-run" / "mine.txt").read_text() == "mine"
