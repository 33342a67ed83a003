"""The two README commands' machinery: the Makefile's install stamp, and `dvc repro` of dvc.yaml."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import HANG_S, REPO, copy_clone


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


@pytest.mark.slow
@pytest.mark.xdist_group("reproduced_clone")  # one worker builds the shared clone once
def test_dvc_repro_runs_the_stages_and_then_is_up_to_date(reproduced_clone, tmp_path):
    first_stdout = (reproduced_clone[0].parent / "first_repro.log").read_text()  # the clone's first `dvc repro`
    work, env = copy_clone(reproduced_clone, tmp_path)
    params = yaml.safe_load((work / "params" / "captions.yaml").read_text())

    def dvc(*args):
        return subprocess.run(["dvc", *args], cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)

    metrics = yaml.safe_load((work / "metrics" / "captions.json").read_text())
    assert metrics["samples_by_split"] == {"train": 40, "test": 10}
    assert (work / "data" / "captions" / "manifest.parquet").is_file()
    assert (work / "docs" / "shapesworld_contact_sheet.png").is_file()
    concepts = yaml.safe_load((work / "metrics" / "concepts.json").read_text())
    assert concepts["captions"] == 40 and concepts["quality"]["long"]["recall"] >= 0.98
    assert len(list((work / "data" / "concepts" / "train").glob("shard-*.parquet"))) == 2
    # the frozen base stage is not re-run: train fine-tunes the committed base export
    assert "Running stage 'base'" not in first_stdout and "Running stage 'train'" in first_stdout
    trained = yaml.safe_load((work / "metrics" / "train.json").read_text())
    assert trained["steps"] == 2 and 0 <= trained["zero_shot_top1"] <= 1
    assert (work / "models" / "train" / "export" / "open_clip_model.safetensors").is_file()

    # the benchmarks stage wrote ShapesWorld's suite from the 10 test images; evaluate read it for both models
    suite = yaml.safe_load((work / "data" / "benchmarks" / "shapesworld" / "stats.json").read_text())
    assert suite["images"] == 10
    report = yaml.safe_load((work / "reports" / "metrics.json").read_text())
    assert report["base/zero_shot/items"] == report["finetuned/zero_shot/items"] == suite["zero_shot"]["images"]
    assert report["base/sugarcrepe/add_att/items"] == suite["sugar_crepe"]["add_att"]
    assert {"base/summary/compositional", "finetuned/summary/compositional"} <= set(report)
    assert "| base | finetuned | Δ finetuned − base |" in (work / "reports" / "benchmarks.md").read_text()
    assert (work / "reports" / "benchmarks.png").is_file() and (work / "reports" / "plots" / "finetuned.json").is_file()
    metrics_show = dvc("metrics", "show", "--json")
    assert "finetuned/summary/zero_shot" in metrics_show.stdout

    second = dvc("repro")
    assert second.returncode == 0
    assert "didn't change, skipping" in second.stdout

    # a train param changed: only train and evaluate re-run
    train = yaml.safe_load((work / "params" / "train.yaml").read_text())
    train["steps"] = 3
    (work / "params" / "train.yaml").write_text(yaml.safe_dump(train))
    third = dvc("repro")
    assert third.returncode == 0, third.stderr + third.stdout
    ran = [line.split("'")[1] for line in third.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["train", "evaluate"], third.stdout
    assert yaml.safe_load((work / "metrics" / "train.json").read_text())["steps"] == 3
    diff = dvc("metrics", "diff", "--json")  # against the clone's commit, which has no report yet
    assert "finetuned/summary/zero_shot" in diff.stdout and "reports/metrics.json" in diff.stdout, diff.stdout

    params["seed"] = 3
    (work / "params" / "captions.yaml").write_text(yaml.safe_dump(params))
    status = dvc("status")
    assert "params/captions.yaml" in status.stdout and "seed" in status.stdout
