"""The Prefect flow c2lip: overrides, the workspace lock, and the deployments on a real Prefect server."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conftest import HANG_S, REPO

import flows.c2lip as c2lip_flows
from components.shared.params import ParamsError
from flows import workspace
from flows.c2lip import RunOverrides, overrides_dict


def test_overrides_are_typed_by_the_params_models_and_validated_whole(tmp_path):
    assert overrides_dict({"train": {"steps": 5, "optim": {"lr": 0.001}}}) == {"train": {"steps": 5, "optim": {"lr": 0.001}}}
    with pytest.raises(ValueError, match="stepz"):
        RunOverrides.model_validate({"train": {"stepz": 5}})  # unknown key: refused by the schema itself
    with pytest.raises(ValueError, match="traine"):
        RunOverrides.model_validate({"traine": {}})
    with pytest.raises(ParamsError, match=r"params/train.yaml \+ overrides: 1 invalid value\(s\)\n  steps: Input should be greater"):
        workspace.resolve_overrides(REPO, {"train": {"steps": 0}})
    with pytest.raises(ParamsError, match="global_batch 100 is not divisible by micro_batch 128"):
        workspace.resolve_overrides(REPO, {"train": {"global_batch": 100}})  # checked against the merged file
    merged = workspace.resolve_overrides(REPO, {"train": {"optim": {"lr": 0.5}}})
    assert merged["train"]["optim"]["lr"] == 0.5 and merged["train"]["optim"]["warmup_steps"] == 20  # rest kept


def test_params_overrides_are_undone_byte_for_byte_even_on_failure(tmp_path):
    (tmp_path / "params").mkdir()
    original = b"# python -m components.train --params params/train.yaml\nsteps: 300  # a comment\n"
    (tmp_path / "params" / "train.yaml").write_bytes(original)
    with pytest.raises(RuntimeError):
        with workspace.params_overridden(tmp_path, {"train": {"steps": 7}}):
            text = (tmp_path / "params" / "train.yaml").read_text()
            assert text.startswith("# python -m components.train") and "steps: 7" in text
            raise RuntimeError("a stage failed")
    assert (tmp_path / "params" / "train.yaml").read_bytes() == original


def test_workspace_lock_refuses_a_second_run_naming_the_first_and_can_wait(tmp_path):
    # the holder keeps the lock until told to let go (no timing: a loaded machine changes nothing)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys; sys.path.insert(0, sys.argv[1]); from flows.workspace import workspace_lock\n"
                               "with workspace_lock(sys.argv[2], 'flow run first-run'):\n    print('held', flush=True); sys.stdin.readline()",
                               str(REPO), str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workspace.WorkspaceBusy, match="another c2lip run holds the workspace .*flow run first-run.*it was not changed"):
        with workspace.workspace_lock(tmp_path, "second"):
            pass
    released = threading.Event()

    def release():
        released.set()
        holder.stdin.write("go\n")
        holder.stdin.flush()

    threading.Timer(0.5, release).start()
    with workspace.workspace_lock(tmp_path, "third", wait_s=HANG_S, poll_s=0.1):  # queues behind the first
        assert released.is_set()  # it got the lock only after the first let go
    holder.wait()


def _dask_cluster(where, env):
    """A `dask scheduler` and two `dask worker` processes on 127.0.0.1, started in ``where`` (not the workspace), as
    docs/gpus.md starts them; returns (address, processes)."""
    import time

    from conftest import free_port

    dask = str(Path(sys.executable).parent / "dask")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], cwd=where, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = [subprocess.Popen([dask, "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                                 "--local-directory", str(where / f"w{i}")], cwd=where, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    from distributed import Client

    with Client(address, timeout=f"{HANG_S}s") as client:  # waits for the scheduler however slow the machine
        deadline = time.monotonic() + HANG_S
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    return address, [scheduler, *workers]


@pytest.mark.slow
def test_sharded_data_on_a_dask_scheduler_and_two_workers_matches_the_stages(tmp_path, monkeypatch):
    """Captions and concepts with every shard a Prefect task on a real Dask scheduler and two worker processes,
    started in another folder, write the same shards, manifest and phrases as the single-process stages; the
    params name relative paths, which the workers resolve against the workspace, not their own folder."""
    from conftest import tiny_captions

    from components import captions, concepts
    from components.shared.params import ConceptsParams
    from flows import sharded

    outputs = {}
    for path in ("stage", "dask"):
        workspace = tmp_path / path
        workspace.mkdir()
        monkeypatch.chdir(workspace)
        cap = tiny_captions(Path("."), contact_sheet=None)  # relative: captions/, metrics/
        con = ConceptsParams(manifest=cap.output_dir / "manifest.parquet", output_dir=Path("concepts"),
                             stats_path=Path("concepts.json"), n_process=1, quality_samples=0)
        (workspace / "captions.yaml").write_text(yaml.safe_dump(cap.model_dump(mode="json"), sort_keys=False))
        (workspace / "concepts.yaml").write_text(yaml.safe_dump(con.model_dump(mode="json"), sort_keys=False))
        if path == "stage":
            captions.run(cap)
            concepts.run(con)
        else:
            elsewhere = tmp_path / "workers"
            elsewhere.mkdir()
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            address, processes = _dask_cluster(elsewhere, env)
            try:
                monkeypatch.setenv("DASK_SCHEDULER", address)  # the deployment's way of naming the scheduler
                result = sharded.data_on_dask("captions.yaml", "concepts.yaml")
                assert result == {"samples_written": 80, "captions_with_phrases": 60}
                # workers that see another disk at the workspace's path stop the flow before any work: here a path that
                # names this process's open folder (/proc/self/fd/N), which in a worker process is nothing or another file
                private = tmp_path / "only-here"
                private.mkdir()
                (private / "yours.txt").write_text("a file of yours beside the check's")
                fd = os.open(private, os.O_RDONLY)
                try:
                    with pytest.raises(sharded.WorkersCannotSeeTheWorkspace, match="2 of 2 Dask worker.*same path"):
                        sharded.check_workers_see_workspace(address, Path(f"/proc/self/fd/{fd}"))
                finally:
                    os.close(fd)
                assert [p.name for p in private.iterdir()] == ["yours.txt"]  # the check's own file removed, nothing else
            finally:
                for process in processes:
                    process.terminate()
                for process in processes:
                    process.wait(timeout=HANG_S)
            assert not list(elsewhere.rglob("*.tar")) and not list(elsewhere.rglob("*.parquet"))  # nothing written there
        outputs[path] = workspace
    a, b = outputs["stage"], outputs["dask"]
    tars = sorted(p.relative_to(a) for p in (a / "captions").rglob("*.tar"))
    assert len(tars) == 4 and tars == sorted(p.relative_to(b) for p in (b / "captions").rglob("*.tar"))
    for rel in tars:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    assert (a / "captions" / "manifest.parquet").read_bytes() == (b / "captions" / "manifest.parquet").read_bytes()
    shards = sorted(p.relative_to(a) for p in (a / "concepts").rglob("*.parquet"))
    assert len(shards) == 3
    for rel in shards:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_gpu_work_pool_deployments_name_real_entrypoints_and_valid_parameters():
    import importlib

    spec = yaml.safe_load((REPO / "infra" / "prefect.yaml").read_text())
    assert spec["name"] == "c2lip"
    names = {d["name"] for d in spec["deployments"]}
    assert {"full-gpu", "evaluate-gpu", "promote", "data-sharded", "compare-gpu"} <= names
    for deployment in spec["deployments"]:
        file, func = deployment["entrypoint"].split(":")
        module = importlib.import_module(file.removesuffix(".py").replace("/", "."))
        flow_obj = getattr(module, func)
        flow_obj.validate_parameters(deployment.get("parameters", {}))  # what the server enforces
        assert (REPO / file).is_file() and deployment["work_pool"]["name"] == "gpu-pool"
    full = next(d for d in spec["deployments"] if d["name"] == "full-gpu")
    merged = workspace.resolve_overrides(REPO, full["parameters"]["overrides"])  # the GPU preset validates whole
    assert merged["train"]["processes"] == 8
    from components import compare
    from components.shared.params import deep_merge, validate_params

    gpu = next(d for d in spec["deployments"] if d["name"] == "compare-gpu")["parameters"]["overrides"]
    base = yaml.safe_load((REPO / "params" / "compare.yaml").read_text())
    runs = compare.plan(validate_params("compare", deep_merge(base, gpu)))  # every arm's train params validate
    arms = {"siglip_raw", "siglip", "c2lip", "c2lip_npc_only", "c2lip_xac_only", "siglip_phrases", "negclip"}
    assert {r.train.steps for r in runs} == {3000} and {r.arm for r in runs} >= arms
    with pytest.raises(Exception, match="seeds"):
        c2lip_flows.compare_methods.validate_parameters({"overrides": {"seeds": "three"}})


class _Lines:
    def __init__(self):
        self.lines = []

    def info(self, fmt, *args):
        self.lines.append(fmt % args)

    warning = info


def test_a_stages_bars_become_a_log_line_per_tenth_with_count_rate_and_eta():
    from flows.progress import ProgressLog

    log = _Lines()
    progress = ProgressLog(log)
    bar = "train c2lip: {pct:3d}%|##   | {n}/300 [{el}<{eta}, 1.50it/s, loss={loss}]"
    for n in range(0, 301):
        for loss in ("2.000", "1.900"):  # tqdm redraws a step when its postfix changes: the same tenth, not a new line
            assert progress.feed(bar.format(pct=n * 100 // 300, n=n, el=f"00:{n // 10:02d}", eta="03:20", loss=loss))
    assert progress.feed("train c2lip: 100%|#####| 300/300 [03:20<00:00, 1.50it/s, loss=1.500]")  # the end, redrawn
    assert not progress.feed("evaluate: wrote reports/benchmarks.md")
    assert len(log.lines) == 11, log.lines  # 0%, 10%, ..., 100%: once each
    assert log.lines[3] == "train c2lip: 90/300 (30%), elapsed 00:09, ETA 03:20, 1.50it/s, loss=2.000"
    assert log.lines[-1] == "train c2lip: 300/300 (100%), elapsed 00:30, 1.50it/s, loss=2.000"  # no ETA once done
    assert not progress.artifacts  # outside a flow run: no artifact, no error


def test_two_bars_are_followed_apart_and_a_bar_without_figures_is_still_a_bar():
    from flows.progress import ProgressLog

    log = _Lines()
    progress = ProgressLog(log, artifacts=False)
    assert progress.feed("captions (shapesworld):  50%|#####     | 11/22 [00:10<00:10,  1.10shard/s]")
    assert progress.feed("concepts:  50%|#####     | 10000/20000 [00:27<00:27, 367.67caption/s]")
    assert progress.feed("captions (shapesworld):  54%|#####     | 12/22 [00:11<00:09,  1.10shard/s]")
    assert log.lines == ["captions (shapesworld): 11/22 (50%), elapsed 00:10, ETA 00:10, 1.10shard/s",
                         "concepts: 10000/20000 (50%), elapsed 00:27, ETA 00:27, 367.67caption/s"]


def test_the_training_log_says_where_to_watch_its_mlflow_run():
    from components.shared.tracking import where_to_watch

    assert where_to_watch("http://mlflow.team:5000/", "3", "abc") == "MLflow run abc: http://mlflow.team:5000/#/experiments/3/runs/abc"
    local = where_to_watch("sqlite:////w/mlflow.db", "1", "abc")
    assert "mlflow ui --backend-store-uri sqlite:////w/mlflow.db" in local and local.endswith("http://127.0.0.1:5000/#/experiments/1/runs/abc")


def test_the_evaluate_deployment_builds_the_default_suite_a_fresh_clone_lacks(tmp_path, monkeypatch):
    import flows.c2lip as flow_module
    from components.benchmarks import SUITE_MARKER
    from components.shared.params import load_params

    monkeypatch.setattr(flow_module, "ROOT", tmp_path)  # a workspace without data/benchmarks
    built = []
    params = load_params("evaluate")
    assert flow_module.ensure_default_suite(params, built.append) and built == ["benchmarks"]
    (tmp_path / "data" / "benchmarks" / "shapesworld").mkdir(parents=True)
    (tmp_path / "data" / "benchmarks" / "shapesworld" / SUITE_MARKER).write_text("built")
    assert not flow_module.ensure_default_suite(params, built.append) and built == ["benchmarks"]  # built once
    own = params.model_copy(deep=True)  # a suite of the user's own files only: read, never built
    for name in type(own.benchmarks).model_fields:
        getattr(own.benchmarks, name).data_root = tmp_path / "mine"
    (tmp_path / "data" / "benchmarks" / "shapesworld" / SUITE_MARKER).unlink()
    assert not flow_module.ensure_default_suite(own, built.append) and built == ["benchmarks"]


def test_gallery_links_point_at_the_reports_server_when_make_serve_runs(tmp_path, monkeypatch):
    import flows.run_page as flow_module

    monkeypatch.setattr(flow_module, "ROOT", tmp_path)
    page = tmp_path / "reports" / "adhoc" / "m" / "gallery" / "index.html"
    monkeypatch.delenv("C2LIP_REPORTS_URL", raising=False)
    assert flow_module.page_link(page) == page.resolve().as_uri()
    monkeypatch.setenv("C2LIP_REPORTS_URL", "http://127.0.0.1:4201/")
    assert flow_module.page_link(page) == "http://127.0.0.1:4201/adhoc/m/gallery/index.html"
    outside = tmp_path / "elsewhere" / "index.html"
    assert flow_module.page_link(outside).startswith("file://")  # not under reports/: not served, so not pretended


def test_the_flow_log_drops_what_a_user_cannot_act_on_and_terminal_colours():
    from flows.progress import readable

    assert readable("To track the changes with git, run:") is None and readable("\tgit add dvc.lock") is None
    assert readable("Use `dvc push` to send your updates to remote storage.") is None
    assert readable("[2026-12-03 07:00:00,000] [INFO] [real_accelerator.py:254:get_accelerator] Setting ds_accelerator to cpu (auto detect)") is None
    assert readable("\x1b[33mUserWarning: add type hints\x1b[0m") == "UserWarning: add type hints"
    assert readable("Running stage 'train':") == "Running stage 'train':"


def test_a_full_runs_last_lines_give_each_groups_change_and_where_to_look(tmp_path, monkeypatch):
    import json

    import flows.run_page as flow_module

    monkeypatch.setattr(flow_module, "ROOT", tmp_path)
    monkeypatch.setenv("C2LIP_REPORTS_URL", "http://127.0.0.1:4201")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "intervals.json").write_text(json.dumps({"finetuned": {"groups": {
        "binding": {"delta": 0.0047, "low": -0.0122, "high": 0.0213}, "binding_held_out": {"delta": 0.1, "low": 0.0, "high": 0.2},
        "zero_shot": {"delta": 0.03, "low": 0.01, "high": 0.05}}}}))
    card = tmp_path / "README.md"
    card.write_text("card")
    lines = flow_module.final_summary(reports / "intervals.json", ["http://127.0.0.1:4201/gallery/index.html"], card)
    assert lines == ["finetuned against the base: binding +0.005 [-0.012, +0.021]; zero_shot +0.030 [+0.010, +0.050]",
                     "report: http://127.0.0.1:4201/benchmarks.md", "failure gallery: http://127.0.0.1:4201/gallery/index.html",
                     f"model card: {card}"]


def test_a_report_artifact_names_the_mlflow_run_that_logged_that_report(tmp_path, monkeypatch):
    import mlflow

    import flows.run_page as flow_module

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("reports-test", artifact_location=(tmp_path / "artifacts").as_uri())
    ids = {}
    for folder in ("a", "b"):
        with mlflow.start_run(experiment_id=experiment) as run:
            mlflow.set_tag("report_dir", str((tmp_path / folder).resolve()))
            ids[folder] = run.info.run_id
    line = flow_module.mlflow_line(tmp_path / "a", "reports-test")
    assert ids["a"] in "".join(line) and ids["b"] not in "".join(line) and "mlflow ui" in "".join(line)
    assert flow_module.mlflow_line(tmp_path / "c", "reports-test") == []  # no run logged that folder: no link
    assert flow_module.mlflow_line(tmp_path / "a", "no-such-experiment") == []
