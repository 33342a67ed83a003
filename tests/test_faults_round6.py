"""Reliability, round six: one rule for deleting and replacing. The project removes or replaces only files it wrote,
known by its record of them (path and SHA256, components/shared/written.py), never by a folder's name, its place or
the current directory. The walk below seeds a workspace with a user's files in every documented folder and in every
folder a stage writes, before and after a run, in copied, renamed and linked folders, runs every command that deletes
or replaces, and checks every byte of the user's is still there; the tests after it are the faults of this round, each
made first."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from components.shared import written
from components.shared.atomic import write_checksums
from components.shared.owned_outputs import OwnedOutputs
from components.shared.written import ForeignFilesError, Ledger, recording_outputs

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
# what a checkout needs for clean-data and example-run, which run before the environment exists
CHECKOUT_FILES = ("Makefile", ".gitignore", "dvc.yaml", "infra/clean_data.py", "infra/example_run.py",
                  "components/__init__.py", "components/shared/__init__.py", "components/shared/written.py")
EVALUATE_FOLDERS, EVALUATE_FILES = ("items", "plots", "gallery"), ("benchmarks.md", "benchmarks.png", "metrics.json", "intervals.json")
# a user's files in every documented folder and in every folder a stage writes
USER_FILES = {
    "data/sources/my_table.csv": "url,caption\n",
    "data/my_project/plan.txt": "mine",
    "reports/my-analysis/notes.md": "mine",
    "reports/plots/my-plot.png": "my plot",
    "reports/items/mine/notes.txt": "mine",
    "reports/gallery/mine.html": "<p>mine</p>",
    "reports/benchmarks-mine.md": "my own report",
    "metrics/my-figures.json": "{}",
    "mlruns/0/meta.yaml": "mine",
    "models/my-model/weights.bin": "mine",
    "notes/thesis/ch1.tex": "\\chapter{}",
}
# a run's own outputs, by stage folder
RUN_FILES = {
    "data/captions": {"train/000000.tar": "tar", "manifest.parquet": "pq", "_fingerprint.json": "{}"},
    "data/recaptions": {"train/000000.parquet": "pq"},
    "data/concepts": {"train/000000.parquet": "pq"},
    "data/benchmarks/shapesworld": {"sugarcrepe/swap_att.json": "{}"},
    "data/evaluate_cache": {"model-abc/complete.json": "{}"},
}


def checkout(tmp_path: Path) -> Path:
    """A git checkout with the files the deleting commands need and the committed example report (with its record)."""
    work = tmp_path / "work"
    for name in CHECKOUT_FILES:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, work / name)
    shutil.copytree(REPO / "reports" / "example-run", work / "reports" / "example-run")
    (work / "metrics").mkdir()
    (work / "metrics" / "base.json").write_text("{}")
    subprocess.run([*GIT, "init", "-q"], cwd=work, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=work, check=True)
    subprocess.run([*GIT, "commit", "-qm", "init"], cwd=work, check=True)
    return work


def seed(work: Path, files: dict[str, str], prefix: str = "") -> dict[str, bytes]:
    out = {}
    for name, text in files.items():
        path = work / prefix / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        out[f"{prefix}{name}"] = path.read_bytes()
    return out


def a_run(work: Path) -> None:
    """What `make run` leaves, written through the same records the stages keep (their recording, the evaluate
    stage's owned outputs, registration's card, the cache's entries)."""
    for folder, files in RUN_FILES.items():
        stage = folder.split("/")[1]
        with recording_outputs(stage, folders=[work / "metrics"], own=[work / folder]):
            seed(work, files, folder + "/")
            (work / "metrics" / f"{stage}.json").write_text(json.dumps({"stage": stage}))
    owned = OwnedOutputs(work / "reports", "evaluate", folders=EVALUATE_FOLDERS, files=EVALUATE_FILES)
    with owned.build() as build:
        seed(build, {"benchmarks.md": "report", "benchmarks.png": "png", "metrics.json": "{}", "intervals.json": "{}",
                     "items/finetuned/swap_att.parquet": "pq", "plots/finetuned.json": "{}", "gallery/index.html": "page"})
        owned.swap_in(build)
    (work / "reports" / "model-card.md").write_text("card")
    Ledger(work / "reports", "register").record(["model-card.md"])


def user_bytes_survive(work: Path, mine: dict[str, bytes]) -> None:
    for name, data in mine.items():
        assert (work / name).is_file(), f"{name}: the user's file is gone"
        assert (work / name).read_bytes() == data, f"{name}: the user's file changed"


def infra_module(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "infra" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def work(tmp_path, monkeypatch):
    work = checkout(tmp_path)
    monkeypatch.setattr(written, "WORKSPACE", work)  # records name their folders relative to this checkout
    return work


def test_every_deleting_command_keeps_every_byte_of_the_users(work, tmp_path):
    """The walk: before the first run, after it, and in copied, renamed and linked folders."""
    clean_data, example_run = infra_module("clean_data"), infra_module("example_run")
    mine = seed(work, USER_FILES)
    outside = tmp_path / "elsewhere"
    mine_outside = {str(outside / "keep.txt"): b"outside"}
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"outside")

    # before the first run (no record anywhere yet): clean-data removes nothing of the user's
    removed, kept = clean_data.clean(work)
    assert removed == [] and "reports/plots/my-plot.png" in kept
    user_bytes_survive(work, mine)

    # a stage whose own folder holds a file of the user's stops before any work, naming it
    seed(work, {"data/captions/my-notes.txt": "mine"})
    mine["data/captions/my-notes.txt"] = b"mine"
    with pytest.raises(ForeignFilesError, match="my-notes.txt"):
        with recording_outputs("captions", folders=[], own=[work / "data" / "captions"]):
            raise AssertionError("the stage ran")
    os.rename(work / "data/captions/my-notes.txt", work / "data/my_project/from-captions.txt")
    mine["data/my_project/from-captions.txt"] = mine.pop("data/captions/my-notes.txt")
    # the evaluate stage's own folders hold the user's files: refused, nothing changed
    owned = OwnedOutputs(work / "reports", "evaluate", folders=EVALUATE_FOLDERS, files=EVALUATE_FILES)
    with pytest.raises(ForeignFilesError, match="my-plot.png"):
        owned.check()
    for name in ("reports/plots/my-plot.png", "reports/items/mine/notes.txt", "reports/gallery/mine.html"):
        target = work / "reports" / "mine-moved" / Path(name).name
        target.parent.mkdir(exist_ok=True)
        os.rename(work / name, target)
        mine[str(target.relative_to(work))] = mine.pop(name)

    a_run(work)
    assert (work / "reports" / "benchmarks.md").read_text() == "report"
    # after the run, the user adds files beside and inside the outputs, copies, renames and links report folders
    mine |= seed(work, {"data/captions/train/mine.txt": "mine", "reports/gallery/after.html": "mine",
                        "data/evaluate_cache/model-abc/notes.txt": "mine"})
    (work / "reports" / "metrics.json").write_text('{"edited": "by the user"}')  # a recorded file changed since
    mine["reports/metrics.json"] = (work / "reports" / "metrics.json").read_bytes()
    shutil.copytree(work / "reports", work / "reports-keep-v1", symlinks=True)
    shutil.copytree(work / "reports" / "gallery", work / "reports" / "keep-v1", symlinks=True)
    shutil.copy(work / "reports" / ".c2lip-evaluate-outputs.json", work / "reports" / "keep-v1")
    shutil.copytree(work / "data" / "concepts", work / "data" / "concepts-renamed")
    os.rename(work / "data" / "recaptions", work / "reports" / "recaptions-renamed")
    (work / "reports" / "link-out").symlink_to(outside, target_is_directory=True)
    (work / "data" / "benchmarks" / "linked").symlink_to(outside, target_is_directory=True)
    for copy in ("reports-keep-v1", "reports/keep-v1", "data/concepts-renamed", "reports/recaptions-renamed"):
        for path in (work / copy).rglob("*"):
            if path.is_file() and not path.is_symlink():
                mine[str(path.relative_to(work))] = path.read_bytes()

    # every command that replaces refuses a folder with the user's files, before any work
    with pytest.raises(ForeignFilesError, match="notes.md"):
        written.replace_folder(tmp_path / "nothing", work / "reports" / "my-analysis", "ship_base --to")
    (work / "reports" / "example-run" / "mine.txt").write_text("mine")
    mine["reports/example-run/mine.txt"] = b"mine"
    with pytest.raises(ForeignFilesError, match="mine.txt"):
        example_run.keep_example_run(work)
    assert not list((work / "reports").glob(".example-run.c2lip-build-*"))  # its build folder is gone too

    # the train stage's pruning and fresh start, a data stage starting afresh, publish and ship_base, over the same files
    from components.shared.atomic import resume_or_restart
    from components.shared.checkpoints import checkpoints_record, prune_checkpoints, record_checkpoint, remove_checkpoints
    from components.shared.hub import PublishError, hub_folder
    from components.study import ship_base

    ckpt = work / "models" / "train" / "checkpoints"
    for step in (1, 2):
        tag = f"step{step:08d}"
        ckpt.mkdir(parents=True, exist_ok=True)
        checkpoints_record(ckpt).begin_folder(tag)
        seed(ckpt, {"model.pt": str(step)}, tag + "/")
        write_checksums(ckpt / tag)
        record_checkpoint(ckpt, tag)
    mine |= seed(work, {"models/train/checkpoints/step00000001/my-notes.txt": "mine", "models/train/checkpoints/mine.txt": "mine"})
    prune_checkpoints(ckpt, keep=1)
    remove_checkpoints(ckpt)
    assert not (ckpt / "step00000002").exists()
    resume_or_restart(work / "data" / "captions", "another fingerprint", "captions")
    assert not (work / "data" / "captions" / "train" / "000000.tar").exists()
    with pytest.raises(PublishError, match="weights.bin"):
        hub_folder(REPO / "models" / "base" / "export", "# card\n", work / "models" / "my-model")
    for to in (work / "notes", work / "models" / "my-model", work / "reports"):
        with pytest.raises(ForeignFilesError, match="ship_base --to"):
            ship_base.ship(tmp_path / "no-build", to)
    owned = OwnedOutputs(work / "reports", "evaluate", folders=EVALUATE_FOLDERS, files=EVALUATE_FILES)
    with pytest.raises(ForeignFilesError, match="after.html"):  # a second evaluation: the user's gallery page stops it
        owned.check()
    user_bytes_survive(work, mine)

    # clean-data after the run: only what the records list, unchanged
    removed, kept = clean_data.clean(work)
    assert "data/concepts/train/000000.parquet" in removed and "reports/gallery/index.html" in removed
    assert "reports/model-card.md" in removed and "metrics/captions.json" in removed
    assert not (work / "reports" / "benchmarks.md").exists() and not (work / "data" / "concepts" / "train").exists()
    assert "reports/metrics.json" in kept and "data/captions/train/mine.txt" in kept
    user_bytes_survive(work, mine)
    for name, data in mine_outside.items():
        assert Path(name).read_bytes() == data
    assert (work / "reports" / "example-run" / "benchmarks.md").is_file()  # committed: never removed
    assert (work / "metrics" / "base.json").is_file()


def test_clean_data_cleans_its_own_checkout_never_the_current_directorys(work, tmp_path):
    """HIGH: run from another project (another git repository with ignored data/captions, metrics/, mlruns/,
    reports/), it cleans the checkout it lies in and leaves that project's files as they were."""
    other = tmp_path / "other-project"
    theirs = seed(other, {".gitignore": "data/\nmetrics/\nmlruns/\nreports/\n", "data/captions/x.tar": "theirs",
                          "metrics/train.json": "theirs", "mlruns/0/meta.yaml": "theirs", "reports/benchmarks.md": "theirs"})
    subprocess.run([*GIT, "init", "-q"], cwd=other, check=True)
    a_run(work)
    done = subprocess.run([sys.executable, str(work / "infra" / "clean_data.py")], cwd=other, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    user_bytes_survive(other, theirs)
    assert not (work / "reports" / "benchmarks.md").exists() and str(work) in done.stdout


def test_clean_data_outside_a_git_checkout_and_beside_a_running_run(work):
    """MED: in a downloaded archive (no git) it works without a traceback; while a run holds the workspace it refuses
    in one line and removes nothing."""
    a_run(work)
    shutil.rmtree(work / ".git")
    with open(work / ".c2lip-run.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write('{"owner": "make run", "pid": 1}')
        lock.flush()
        busy = subprocess.run([sys.executable, str(work / "infra" / "clean_data.py")], capture_output=True, text=True)
    assert busy.returncode == 2 and "Traceback" not in busy.stderr and len(busy.stderr.strip().splitlines()) == 1
    assert "make run" in busy.stderr and (work / "reports" / "benchmarks.md").is_file()
    done = subprocess.run([sys.executable, str(work / "infra" / "clean_data.py")], capture_output=True, text=True)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert not (work / "reports" / "benchmarks.md").exists()
    assert (work / "reports" / "example-run" / "benchmarks.md").is_file()  # the shipped example: kept on purpose


def test_the_run_lock_name_is_the_workspaces():
    from components.shared.params_base import RUN_LOCK

    assert infra_module("clean_data").RUN_LOCK == RUN_LOCK


def test_ship_base_replaces_only_an_export_of_its_own(work, tmp_path):
    """HIGH: `--to` a user's folder, the export's parent (a one-word slip) or a link: refused before any work, one
    line, nothing changed and nothing left behind; an export of ours (its checksums) is replaced."""
    from components.study import ship_base

    users = seed(work, {"mine/data.csv": "a,b", "mine/thesis/ch1.tex": "ch1"})
    export = work / "models" / "base-calibrated" / "export"
    shutil.copytree(REPO / "models" / "base-calibrated" / "export", export)
    users |= seed(work, {"models/base-calibrated/notes/mine.txt": "mine"})
    (tmp_path / "link").symlink_to(work / "mine", target_is_directory=True)
    build = tmp_path / "no-build"
    for to in (work / "mine", export.parent, tmp_path / "link"):
        before = sorted(p.name for p in to.parent.iterdir())
        with pytest.raises(ForeignFilesError, match="ship_base --to"):
            ship_base.ship(build, to)
        assert sorted(p.name for p in to.parent.iterdir()) == before  # no staging folder left
        assert ship_base.main(["--build", str(build), "--to", str(to)]) == 1
    user_bytes_survive(work, users)
    with pytest.raises(FileNotFoundError, match="train.yaml: missing"):  # an export of ours passes the check
        ship_base.ship(build, export)
    (export / "notes.txt").write_text("mine")
    with pytest.raises(ForeignFilesError, match="notes.txt"):
        ship_base.ship(build, export)


def test_an_export_replaces_a_folder_of_its_own_only(tmp_path):
    """The train stage's export and a publish: a previous export (its checksums) is replaced; a folder with a file
    of the user's, or a file changed since, is refused before any work."""
    from components.method.models import create_model
    from components.shared.checkpoints import export_model
    from components.shared.hub import PublishError, hub_folder

    model = create_model("c2lip-tiny-rn", pretrained=None)[0]
    out = tmp_path / "export"
    export_model(model, "c2lip-tiny-rn", out)
    export_model(model, "c2lip-tiny-rn", out)  # its own: replaced
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ForeignFilesError, match="notes.txt"):
        export_model(model, "c2lip-tiny-rn", out)
    assert (out / "notes.txt").read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["export"]

    shutil.copytree(REPO / "models" / "base" / "export", tmp_path / "base")
    hub = hub_folder(tmp_path / "base", "# card\n", tmp_path / "hub")
    hub_folder(tmp_path / "base", "# card 2\n", hub)  # its own: replaced
    assert (hub / "README.md").read_text() == "# card 2\n"
    (hub / "README.md").write_text("# edited by hand")
    with pytest.raises(PublishError, match="README.md"):
        hub_folder(tmp_path / "base", "# card 3\n", hub)
    assert (hub / "README.md").read_text() == "# edited by hand"


def test_checkpoints_pruned_or_started_afresh_keep_a_users_file(tmp_path, capsys):
    from components.shared.checkpoints import checkpoints_record, prune_checkpoints, record_checkpoint, remove_checkpoints

    ckpt = tmp_path / "checkpoints"
    record = checkpoints_record(ckpt)
    for step in (1, 2, 3):
        tag = f"step{step:08d}"
        ckpt.mkdir(exist_ok=True)
        assert record.begin_folder(tag)
        (ckpt / tag / "model.pt").write_bytes(bytes([step]) * 10)
        (ckpt / "latest").write_text(tag)
        write_checksums(ckpt / tag)
        record_checkpoint(ckpt, tag)
    (ckpt / "step00000001" / "my-analysis.txt").write_text("mine")
    prune_checkpoints(ckpt, keep=1)
    assert (ckpt / "step00000001" / "my-analysis.txt").read_text() == "mine"
    assert not (ckpt / "step00000001" / "model.pt").exists() and not (ckpt / "step00000002").exists()
    assert "my-analysis.txt" in capsys.readouterr().err
    assert record.begin_folder("step00000004")  # a save killed halfway: its folder is the stage's
    (ckpt / "step00000004" / "partial.pt").write_bytes(b"x")
    remove_checkpoints(ckpt)
    assert not (ckpt / "step00000003").exists() and not (ckpt / "step00000004").exists()
    assert (ckpt / "step00000001" / "my-analysis.txt").read_text() == "mine"


def test_a_data_stage_starting_afresh_removes_only_what_it_recorded(tmp_path):
    from components.shared.atomic import resume_or_restart

    out = tmp_path / "captions"
    with recording_outputs("captions", folders=[], own=[out]):
        resume_or_restart(out, "first", "captions")
        seed(out, {"train/000000.tar": "tar", "manifest.parquet": "pq"})
    (out / "manifest.parquet").write_text("edited")  # changed since: not the stage's to remove
    with recording_outputs("captions", folders=[], own=[out]):
        assert resume_or_restart(out, "second", "captions") is False
        assert not (out / "train").exists() and (out / "manifest.parquet").read_text() == "edited"


def test_a_killed_stage_leaves_its_files_on_record_for_the_next_run(tmp_path):
    """A run killed mid-way (its record still says what was there before it): the next run records the killed
    run's files as the stage's, and never a file that was there before the killed run started."""
    out = tmp_path / "concepts"
    out.mkdir()
    (out / "theirs.txt").write_text("mine")
    ledger = Ledger(out, "concepts")
    ledger.write({}, started_with={"theirs.txt": [4, (out / "theirs.txt").stat().st_mtime_ns]})  # as a killed run leaves it
    seed(out, {"train/000000.parquet": "pq"})  # the killed run's shard
    with ledger.recording():
        pass
    assert set(ledger.files()) == {"train/000000.parquet"}


def test_copied_and_renamed_report_folders_are_not_the_stages(work):
    """MED: `cp -r` carries a stage's record, but written for another place: nothing in the copy is the stage's."""
    a_run(work)
    shutil.copytree(work / "reports", work / "keep", symlinks=True)
    shutil.move(str(work / "keep"), str(work / "reports" / "keep-v1"))
    copy = Ledger(work / "reports" / "keep-v1", "evaluate")
    assert copy.files() == {} and "not this folder" in copy.problem()
    owned = OwnedOutputs(work / "reports" / "keep-v1", "evaluate", folders=EVALUATE_FOLDERS, files=EVALUATE_FILES)
    with pytest.raises(ForeignFilesError, match="copy or a renamed folder"):
        owned.check()


def test_an_evaluation_into_a_users_folder_keeps_their_report_files(tmp_path):
    """MED: an output folder the guard admits, holding the user's own metrics.json and benchmarks.md: refused,
    naming them, before any work; a rerun replaces only what the stage recorded unchanged."""
    folder = tmp_path / "my-analysis"
    mine = seed(folder, {"metrics.json": '{"mine": 1}', "benchmarks.md": "my notes"})
    owned = OwnedOutputs(folder, "evaluate", folders=EVALUATE_FOLDERS, files=EVALUATE_FILES)
    with pytest.raises(ForeignFilesError, match="benchmarks.md.*metrics.json"):
        owned.check()
    user_bytes_survive(folder, mine)
    other = tmp_path / "fresh"
    owned = OwnedOutputs(other, "evaluate", folders=EVALUATE_FOLDERS, files=EVALUATE_FILES)
    for text in ("first", "second"):
        with owned.build() as build:
            seed(build, {"benchmarks.md": text, "gallery/index.html": text})
            owned.swap_in(build)
    assert (other / "benchmarks.md").read_text() == "second"


def test_a_comparison_trains_again_when_its_phrases_or_shards_change(tmp_path):
    """MED: a finished run's done.json was reused after every phrase file and shard changed (its fingerprint held the
    shard glob and the phrases folder as strings): the figures reported were the old data's."""
    import time

    import yaml

    from components.compare import Run, Suite, finished
    from components.shared.params import validate_params

    data = yaml.safe_load((REPO / "params" / "train.yaml").read_text())
    shards, concepts = tmp_path / "shards", tmp_path / "concepts"
    seed(tmp_path, {"shards/train-000000.tar": "shard", "concepts/train-000000.parquet": "phrases"})
    data["data"].update(shards=[str(shards / "*.tar")], concepts_dir=str(concepts))
    data["model"]["init"] = "scratch"
    run = Run("c2lip", 0, tmp_path / "run", validate_params("train", data, "test"))
    suite = Suite(params=None, tasks=[], fingerprint="suite", not_applicable=[])
    from components.compare import run_fingerprint

    run.dir.mkdir()
    (run.dir / "done.json").write_text(json.dumps({"fingerprint": run_fingerprint(run, suite), "metrics": {"x": 1.0}}))
    assert finished(run, suite) == {"x": 1.0}
    (concepts / "train-000000.parquet").write_text("other phrases")
    assert finished(run, suite) is None
    (concepts / "train-000000.parquet").write_text("phrases")
    assert finished(run, suite) == {"x": 1.0}
    time.sleep(0.01)
    (shards / "train-000000.tar").write_text("other")
    assert finished(run, suite) is None


# --------------------------------------------------------------------------------------------------
# fail before work, in one line
# --------------------------------------------------------------------------------------------------


def test_make_run_beside_a_running_run_is_refused_at_once_in_one_line(tmp_path, monkeypatch, capsys):
    """MED: a second `make run` (or `make compare`) was refused after ~90 s with a 55–62-line traceback: now before
    Prefect's server starts, in one line naming the holder and `WAIT=`."""
    import flows.c2lip as flow_module

    monkeypatch.setattr(flow_module, "ROOT", tmp_path)
    started = []
    monkeypatch.setattr(flow_module, "full", lambda **kw: started.append(kw))  # never reached
    with open(tmp_path / ".c2lip-run.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write('{"owner": "flow run first-run"}')
        lock.flush()
        for what in ("full", "compare"):
            assert flow_module.main([what]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "first-run" in err
            assert f"make {'run' if what == 'full' else 'compare'} WAIT=" in err
    assert started == []


def test_the_evaluate_deployment_checks_the_alias_and_takes_the_workspace_before_any_work(tmp_path, monkeypatch):
    """MED: c2lip/evaluate ran `dvc repro benchmarks` in a workspace `make run` held, and with no `champion` alias built
    the suite and evaluated for minutes before failing. Now: the alias first (one line), then the workspace lock."""
    import flows.c2lip as flow_module
    from components.shared.params import EvalModelSpec
    from components.suite.loading import SuiteError
    from flows.workspace import WorkspaceBusy

    monkeypatch.setattr(flow_module, "ROOT", tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    work = []
    monkeypatch.setattr(flow_module, "ensure_default_suite", lambda *a: work.append("suite"))
    monkeypatch.setattr(flow_module, "evaluate_stage", lambda *a: work.append("evaluate"))
    with pytest.raises(SuiteError, match="no such alias or model yet.*promote it first"):
        flow_module.evaluate.fn(model=EvalModelSpec(name="champion", uri="models:/c2lip@champion"))
    shutil.copytree(REPO / "models" / "base" / "export", tmp_path / "models" / "mine")
    with open(tmp_path / ".c2lip-run.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(WorkspaceBusy, match="another c2lip run holds the workspace"):
            flow_module.evaluate.fn(model=EvalModelSpec(name="mine", uri=str(tmp_path / "models" / "mine")))
    assert work == []


# --------------------------------------------------------------------------------------------------
# messages, not tracebacks; what a served model may be asked
# --------------------------------------------------------------------------------------------------


def test_the_run_page_never_prints_the_tracking_password(monkeypatch, capsys, tmp_path):
    """MED: when the tracking server cannot be read, the flow's log (log_prints) got the URI with its password."""
    import components.shared.tracking as tracking
    import flows.run_page as run_page

    def unreadable(*args, **kwargs):
        raise ConnectionError("cannot reach http://alice:S3cr3t@mlflow.example:5000/api (MLFLOW_TRACKING_PASSWORD=S3cr3t)\nmore")

    monkeypatch.setattr(tracking, "report_run", unreadable)
    assert run_page.mlflow_line(tmp_path, "c2lip") == []
    said = capsys.readouterr().out
    assert "S3cr3t" not in said and "could not be looked up" in said and len(said.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["MLFLOW_TRACKING_PASSWORD=s3cr3t", "PREFECT_API_AUTH_STRING=alice:s3cr3t",
                                  '{"password": "s3cr3t value"}', "{'token': 's3cr3t'}", 'password = "s3cr3t x"',
                                  "password=s3cr3t;b", "hf_s3cr3tAAAAAAAAAAAAAAAAAAAAAA"])
def test_redaction_covers_json_pairs_variables_quoted_values_and_hub_tokens(text):
    """LOW: the forms redact() missed."""
    from components.shared.redact import redact

    assert "s3cr3t" not in redact(f"error: {text} at line 3")


@pytest.mark.parametrize("fields", [b"{not json", b'"txt"', b"[1, 2]", b"[]"])
def test_damaged_caption_fields_metadata_in_a_phrase_file_is_named(tmp_path, fields):
    """MED: the train preflight raised JSONDecodeError / TypeError without naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.data.stream import phrases_parsed_from
    from components.shared.atomic import CorruptFileError

    table = pa.table({"key": ["a"]}).replace_schema_metadata({b"c2lip_caption_fields": fields})
    pq.write_table(table, tmp_path / "train-000000.parquet")
    with pytest.raises(CorruptFileError, match=r"train-000000.parquet: its c2lip_caption_fields metadata"):
        phrases_parsed_from(tmp_path)


@pytest.fixture(scope="module")
def embedder():
    import torch

    from components.method.models import create_model
    from components.shared.pyfunc_model import OpenClipEmbedder

    torch.manual_seed(0)
    model, _, preprocess, tokenizer = create_model("c2lip-tiny-rn", pretrained=None)
    served = OpenClipEmbedder()
    served.model, served.preprocess, served.tokenizer = model.eval(), preprocess, tokenizer
    return served


@pytest.mark.parametrize("row0", [None, float("nan")])
def test_a_served_model_names_a_missing_text_in_row_0(embedder, row0):
    """MED: `if bad := next(...)` was false for index 0: None or NaN in the first row reached the tokenizer."""
    import pandas as pd

    with pytest.raises(ValueError, match="text row 0"):
        embedder.predict(None, pd.DataFrame({"text": [row0, "a red circle"]}))


def test_a_served_model_bounds_rows_per_call_and_pixels_per_image(embedder, tmp_path, monkeypatch):
    """MED: 100,000 texts passed 8 GB; a small PNG decoding to 81 M pixels took 98 s of CPU."""
    import io

    import pandas as pd
    from PIL import Image

    from components.shared.pyfunc_model import IMAGE_ROOT_ENV, MAX_PIXELS_ENV, MAX_ROWS_ENV

    monkeypatch.setenv(MAX_ROWS_ENV, "3")
    with pytest.raises(ValueError, match="4 rows in one call; a call embeds at most 3"):
        embedder.predict(None, pd.DataFrame({"text": ["a"] * 4}))
    assert embedder.predict(None, pd.DataFrame({"text": ["a red circle"] * 3})).shape[0] == 3
    monkeypatch.setenv(IMAGE_ROOT_ENV, str(tmp_path))
    monkeypatch.setenv(MAX_PIXELS_ENV, "10000")
    big = io.BytesIO()
    Image.new("RGB", (200, 100)).save(big, format="PNG")
    Image.new("RGB", (64, 64), "red").save(tmp_path / "small.png")
    with pytest.raises(ValueError, match="image row 1: 200×100 pixels; an image may have at most 10,000"):
        embedder.predict(None, pd.DataFrame({"image": ["small.png", big.getvalue()]}))
    assert embedder.predict(None, pd.DataFrame({"image": ["small.png"]})).shape[0] == 1
    monkeypatch.setenv(MAX_ROWS_ENV, "lots")
    with pytest.raises(ValueError, match="C2LIP_PYFUNC_MAX_ROWS='lots'"):
        embedder.predict(None, pd.DataFrame({"text": ["a"]}))


def test_a_registration_killed_before_its_tags_leaves_a_version_marked_unfinished_and_never_promoted(tmp_path, monkeypatch):
    """LOW: kill -9 during register left a READY version without tags or description that the rerun never cleaned up."""
    import mlflow

    from components.register import UNFINISHED_TAG, RegistryError, mark_unfinished, promote
    from components.shared.params import load_params

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    client.create_registered_model("c2lip")
    # its own experiment: an experiment another test made active in this process is not in this store
    experiment = client.create_experiment("registrations", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(run_name="register-c2lip", experiment_id=experiment) as run:
        mlflow.set_tag("stage", "register")
    stopped = client.create_model_version("c2lip", source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    with mlflow.start_run(run_name="someone-else", experiment_id=experiment) as other:
        pass
    theirs = client.create_model_version("c2lip", source=f"{other.info.artifact_uri}/model", run_id=other.info.run_id)
    assert mark_unfinished(client, "c2lip") == [str(stopped.version)]
    assert UNFINISHED_TAG in client.get_model_version("c2lip", stopped.version).tags
    assert UNFINISHED_TAG not in client.get_model_version("c2lip", theirs.version).tags
    assert mark_unfinished(client, "c2lip") == []  # once
    with pytest.raises(RegistryError, match="never finished by a registration"):
        promote(load_params("registry"), str(stopped.version))


def test_a_device_name_with_a_trailing_newline_is_a_message():
    """LOW: resolve_device("cpu\\n") passed the pattern and failed inside torch with a RuntimeError."""
    from components.shared.devices import DeviceError, resolve_device

    with pytest.raises(DeviceError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("cpu\n")


def test_extends_reads_only_params_files_and_a_yaml_error_never_echoes_the_file(tmp_path):
    """LOW: `extends:` read any path (/proc/self/environ) and a YAML error printed a line of that file."""
    from components.shared.params import ParamsError, read_yaml

    (tmp_path / "p.yaml").write_text("extends: /proc/self/environ\n")
    with pytest.raises(ParamsError, match="not a params file"):
        read_yaml(tmp_path / "p.yaml")
    (tmp_path / "secret.txt").write_text("steps: 1\n")
    (tmp_path / "q.yaml").write_text("extends: secret.txt\n")
    with pytest.raises(ParamsError, match="not a params file"):
        read_yaml(tmp_path / "q.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2\npassword: hunter2-SECRET\n")
    with pytest.raises(ParamsError) as err:
        read_yaml(tmp_path / "bad.yaml")
    assert "hunter2" not in str(err.value) and "line" in str(err.value)


def test_a_shard_rewritten_with_its_size_and_time_put_back_is_another_shard(tmp_path):
    """LOW: a shard's identity was its size and modification time; a rewrite that restored both resumed the old run."""
    from components.shared.atomic import shards_identity

    shard = tmp_path / "train-000000.tar"
    shard.write_bytes(b"a" * 100_000)
    before = shards_identity([str(shard)])
    st = shard.stat()
    shard.write_bytes(b"b" * 100_000)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_mtime_ns == st.st_mtime_ns and shards_identity([str(shard)]) != before


@pytest.mark.parametrize("listing", ["{}", None])
def test_changed_weights_are_named_when_the_checksums_list_nothing_or_are_missing(tmp_path, listing, capsys):
    """LOW: tampered weights passed check_export when _checksums.json was {} (now an error) or missing (now said)."""
    from components.shared.atomic import CorruptFileError
    from components.shared.checkpoints import check_export

    export = tmp_path / "export"
    shutil.copytree(REPO / "models" / "base" / "export", export)
    if listing is None:
        (export / "_checksums.json").unlink()
        check_export(export)
        assert "no _checksums.json" in capsys.readouterr().err
    else:
        (export / "_checksums.json").write_text(listing)
        with pytest.raises(CorruptFileError, match="does not list"):
            check_export(export)


def test_the_prefect_server_run_alone_allows_only_its_own_origins(monkeypatch):
    """LOW: `python -m flows.prefect_server` (its documented use) kept Prefect's default CORS: every origin."""
    import flows.prefect_server as server

    monkeypatch.delenv(server.CORS_SETTING, raising=False)
    seen = {}
    import uvicorn

    monkeypatch.setattr(server, "app", lambda: "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(os.environ))
    assert server.main(["--port", "4299"]) == 0
    assert seen[server.CORS_SETTING] == "http://127.0.0.1:4299,http://localhost:4299"
    os.environ.pop(server.CORS_SETTING, None)


def test_the_reports_server_with_a_relative_folder_follows_no_link_and_survives_a_nul(tmp_path, monkeypatch):
    """LOW: with serve.sh's relative --directory the link check compared nothing (a link inside reports/ was served),
    and `%00` dropped the connection with a traceback."""
    import functools
    import http.client
    import http.server
    import threading

    from conftest import HANG_S

    from flows.reports_server import ReportsHandler

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "benchmarks.md").write_text("# report")
    (tmp_path / "reports" / "alias.md").symlink_to(tmp_path / "reports" / "benchmarks.md")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(ReportsHandler, directory="reports"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def status(path):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_S)
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        return conn.getresponse().status

    try:
        assert status("/benchmarks.md") == 200
        assert status("/alias.md") == 404
        assert status("/bench%00marks.md") == 404 and status("/benchmarks.md") == 200
    finally:
        server.shutdown()


def test_two_evaluations_of_one_model_share_its_cache_entry_without_a_crash(tmp_path, monkeypatch):
    """MED: two evaluations of one model into different folders wrote the same results-cache entry at once; one
    crashed (`OSError: Directory not empty`). Now each builds its own folder and they take turns moving it in; an
    unusable entry is set aside under a hidden name, never deleted."""
    import threading

    import pyarrow as pa

    from components.suite import results_cache

    tables = {"winoground": pa.table({"item": [0, 1], "correct": [True, False]})}
    go = threading.Barrier(2)
    errors = []

    def evaluation():
        try:
            go.wait()
            results_cache.write(tmp_path, "m", "fp", tables)
        except Exception as err:  # noqa: BLE001 - the test names any
            errors.append(err)

    threads = [threading.Thread(target=evaluation) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    entry = results_cache.folder_of(tmp_path, "m", "fp")
    assert (entry / "complete.json").is_file() and not list(tmp_path.glob(".m-fp.c2lip-build-*"))
    assert f"m-fp/{'complete.json'}" in Ledger(tmp_path, "evaluate").files()  # on the cache's record (clean-data)
    monkeypatch.setattr(results_cache, "problem", lambda *a: (None, {}))  # a whole entry: the later writer keeps it
    before = (entry / "_checksums.json").read_bytes()
    results_cache.write(tmp_path, "m", "fp", tables, tasks=[])
    assert (entry / "_checksums.json").read_bytes() == before
    monkeypatch.setattr(results_cache, "problem", lambda *a: ("complete.json: changed", {}))
    (entry / "notes.txt").write_text("mine")
    assert results_cache.read(tmp_path, "m", "fp", []) is None
    aside = list(tmp_path.glob(".m-fp.unusable-*/m-fp/notes.txt"))
    assert len(aside) == 1 and aside[0].read_text() == "mine" and not entry.exists()


def test_the_shipped_comparison_report_is_on_its_record_so_make_compare_may_replace_it():
    """`make compare` writes reports/compare.md and its charts over the committed ones: the committed files carry the
    comparison's record (a fresh clone's `make compare` was refused, naming them)."""
    from components.shared.written import sha256_of
    from components.suite.compare_report import REPORT_FILES

    listed = Ledger(REPO / "reports", "compare").files()
    shipped = [f for f in REPORT_FILES if (REPO / "reports" / f).is_file()]
    assert shipped and all(listed.get(f) == sha256_of(REPO / "reports" / f) for f in shipped)
    owned = OwnedOutputs(REPO / "reports", "compare", folders=("compare-gallery",), files=REPORT_FILES)
    assert [f for f in owned.foreign_files() if f in shipped] == []


def test_dvc_never_deletes_an_output_a_user_can_reach_before_its_stage_runs():
    """`dvc repro` removes a stage's outputs before running it unless they persist: reports/gallery went whole, a page
    of the user's in it included, before the evaluate stage could refuse. Every output of the stages that replace by
    their records persists (tests/test_end_to_end.py runs it: the page stays and the stage names it)."""
    import yaml

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in ("captions", "recaption", "concepts", "benchmarks", "evaluate", "train"):
        for kind in ("outs", "metrics", "plots"):
            for out in stages[name].get(kind, []):
                path, options = (next(iter(out.items())) if isinstance(out, dict) else (out, {}))
                if path.startswith(("data/", "reports/", "models/")):
                    assert (options or {}).get("persist") is True, f"dvc.yaml stage {name}: {path} does not persist"


def test_make_compare_with_a_file_of_yours_among_its_outputs_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """The comparison's report files are checked before the data stages run, and `make compare` prints the refusal in
    one line (it found a changed report only after minutes of data stages, with a traceback)."""
    import flows.c2lip as flow_module

    monkeypatch.setattr(flow_module, "ROOT", tmp_path)
    reports = tmp_path / "reports"
    seed(reports, {"compare.md": "my own comparison"})
    staged = []
    monkeypatch.setattr(flow_module, "dvc_repro", lambda *a: staged.append(a))
    from components import compare

    real = compare.params_with
    monkeypatch.setattr(compare, "params_with", lambda changes: real(changes).model_copy(update={"report_dir": reports}))
    assert flow_module.main(["compare"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compare.md" in err and staged == []  # before Prefect's server, in one line
    assert (reports / "compare.md").read_text() == "my own comparison"
