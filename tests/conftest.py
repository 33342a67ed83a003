"""Shared test set-up: offline environment, the repository root, tiny params."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Never wait on the model hub or send telemetry from tests (anything that tries the hub hangs ~47 s).
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "DVC_NO_ANALYTICS": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Prefect's 20 s for its ephemeral server to start is exceeded on a loaded 2-core machine (Makefile)
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
    "DO_NOT_TRACK": "1",
}.items():
    os.environ.setdefault(_key, _value)

# The shards' tables (components/data/shard_index.py) are cached by path, size and time: the tests' shards live in
# temporary folders, so their tables go to one of this process's own, removed at exit (the stages it starts inherit it).
if "C2LIP_SHARD_INDEX_CACHE" not in os.environ:
    os.environ["C2LIP_SHARD_INDEX_CACHE"] = tempfile.mkdtemp(prefix="c2lip-shard-index-")
    atexit.register(shutil.rmtree, os.environ["C2LIP_SHARD_INDEX_CACHE"], ignore_errors=True)

# Under pytest-xdist (make test runs 2+ workers) each worker gets its own Prefect home: the ephemeral API
# server of the in-process flow tests keeps a SQLite database there, which two workers must not share.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _prefect_home = Path(__file__).resolve().parent.parent / ".prefect" / f"test-{os.environ['PYTEST_XDIST_WORKER']}"
    _prefect_home.mkdir(parents=True, exist_ok=True)  # Prefect does not create it (a fresh clone has no .prefect/)
    os.environ["PREFECT_HOME"] = str(_prefect_home)
    # The cores shared among the workers: torch's default (a thread per core) in every worker and in every stage a test
    # starts oversubscribes the machine: the slow files ran a tenth to a fifth slower on 2 cores. The stages inherit it.
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# The only time limit a test sets: a guard against a hang. A slow or loaded machine must never reach it, so
# a test fails because something hangs, never because the machine is slow.
HANG_S = 3600
SHARED = REPO.parent / "shared"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from components.shared.params import CaptionsParams  # noqa: E402

# The longest files (measured with --durations on 2 cores), started first. pytest-xdist hands out whole files in
# collection order (--dist loadfile --no-loadscope-reorder, as make test runs it); by default it starts the files
# with the most tests first, and these hold few: one of them ran alone at the end while the other worker sat idle.
LONGEST_FIRST = ("test_end_to_end.py", "test_gpu_check.py", "test_scale_out.py", "test_train.py", "test_make_serve.py", "test_methods.py",
                 "test_flows.py")


def pytest_collection_modifyitems(config, items):
    """The longest files first, the rest in their usual order; each file's tests keep their order."""
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable


def tiny_captions(tmp_path: Path, **overrides) -> CaptionsParams:
    """A captions config small enough for a unit test, writing under ``tmp_path``."""
    world = {"train_images": 60, "test_images": 20, **overrides.pop("shapesworld", {})}
    data = {
        "output_dir": str(tmp_path / "captions"),
        "stats_path": str(tmp_path / "metrics" / "captions.json"),
        "contact_sheet": None,
        "shard_size": 25,
        "workers": 1,
        "shapesworld": world,
        **overrides,
    }
    return CaptionsParams.model_validate(data)


def tiny_training_data(root: Path, test_images: int) -> Path:
    """Tiny ShapesWorld shards (64 training images in shards of 25) under ``root/captions`` and a concepts
    folder with each training image's true phrases, as the train stage reads them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components import captions as captions_stage

    captions_stage.run(tiny_captions(root, shard_size=25, shapesworld={"train_images": 64, "test_images": test_images}))
    manifest = pq.read_table(root / "captions" / "manifest.parquet").to_pandas()
    train = manifest[manifest.split == "train"]
    (root / "concepts").mkdir()
    pq.write_table(pa.table({"key": list(train.key), "phrases": [list(p) for p in train.object_phrases]}), root / "concepts" / "all.parquet")
    return root


@pytest.fixture
def repo() -> Path:
    return REPO


def kill_stage_midway(stage: str, cfg: dict, tmp_path: Path, finished_glob: str, at_least: int) -> tuple[int, list[str]]:
    """Run ``python -m components.<stage>`` on ``cfg``, SIGKILL it once ``at_least`` files match
    ``finished_glob`` (relative to ``tmp_path``), and return (files finished, the command to re-run)."""
    import signal
    import subprocess
    import time

    import yaml

    params_file = tmp_path / f"{stage}.yaml"
    params_file.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", f"components.{stage}", "--params", str(params_file)]
    log = tmp_path / f"{stage}.stderr"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.time() + HANG_S
        while time.time() < deadline and len(list(tmp_path.glob(finished_glob))) < at_least and proc.poll() is None:
            time.sleep(0.02)
        if proc.poll() is not None and proc.returncode != 0:  # it failed before the kill: say why, not "no such process"
            pytest.fail(f"{stage} failed before it could be killed (exit {proc.returncode}):\n{log.read_text()[-2000:]}")
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return len(list(tmp_path.glob(finished_glob))), cmd


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server a test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_served(api: str, deployment: str) -> bool:
    """Whether the Prefect server at ``api`` knows the deployment ("flow/name"); False while it is not up yet. One HTTP
    request, where `prefect deployment ls` costs seconds of CPU per call that the served flows' start-up needs."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api}/deployments/name/{deployment}", timeout=30) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):  # 404: not registered yet; refused: the server is still starting
        return False


def make_clone(tmp_path: Path, train_steps: int = 2) -> tuple[Path, dict]:
    """What a fresh clone has (committed files only), with tiny params, as a git repo; returns (clone, env)
    with MLflow pointed into ``tmp_path``."""
    import shutil
    import subprocess

    import yaml

    work = tmp_path / "repo"
    work.mkdir()
    for name in ("components", "flows", "params", "infra", ".dvc", "dvc.yaml", "dvc.lock", ".dvcignore", ".gitignore",
                 "models/base", "metrics/base.json", "metrics/base_loss.json", "data/sources"):
        src = REPO / name
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("checkpoints", "__pycache__"))
        else:
            shutil.copy(src, work / name)
    for leftover in ("tmp", "cache"):
        shutil.rmtree(work / ".dvc" / leftover, ignore_errors=True)
    (work / ".venv").symlink_to(REPO / ".venv")  # dvc.yaml runs .venv/bin/python, as in a checkout `make` set up
    params = yaml.safe_load((work / "params" / "captions.yaml").read_text())
    params["shapesworld"].update(train_images=40, test_images=10)
    params["shard_size"] = 20
    (work / "params" / "captions.yaml").write_text(yaml.safe_dump(params))
    train = yaml.safe_load((work / "params" / "train.yaml").read_text())
    train.update(steps=train_steps, global_batch=8, micro_batch=8, checkpoint_every=1, log_every=1, torch_threads=1)
    train["data"].update(shuffle_buffer=8, workers=0)
    (work / "params" / "train.yaml").write_text(yaml.safe_dump(train))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "C2LIP_MLFLOW_ARTIFACTS": str(tmp_path / "artifacts")}
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=work, check=True)
    return work, env


def concepts_manifest(tmp_path, captions, shard_size=4, object_phrases=None, caption_type=None):
    """A captions manifest of ``captions`` (split train, ``shard_size`` rows per shard) as the concepts stage reads it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(captions)
    table = pa.table({
        "key": [f"k{i:04d}" for i in range(n)],
        "split": ["train"] * n,
        "shard": [f"train/shard-{i // shard_size:06d}.tar" for i in range(n)],
        "long": pa.array(captions, caption_type or pa.string()),
        "txt": pa.array(captions, caption_type or pa.string()),  # the training caption, as the captions stage writes it
        "object_phrases": pa.array(object_phrases or [None] * n, pa.list_(pa.string())),
    })
    path = tmp_path / "manifest.parquet"
    pq.write_table(table, path)
    return path


def sentences(n: int) -> list[str]:
    """``n`` varied two-object sentences for the concepts stage."""
    words = ["red", "blue", "green", "small", "large", "wooden", "old", "shiny"]
    nouns = ["ball", "table", "dog", "cat", "house", "car", "tree", "lamp", "book", "cup"]
    return [
        f"A {words[i % 8]} {nouns[i % 10]} stands near the {words[(i * 3) % 8]} {nouns[(i * 7) % 10]}, "
        f"and a {words[(i * 5) % 8]} {nouns[(i + 3) % 10]} lies behind it."
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def reproduced_clone(tmp_path_factory) -> tuple[Path, dict]:
    """One fresh clone (tiny params) after a first `dvc repro` of every stage, made once per session: the
    end-to-end tests start from copies of it (:func:`copy_clone`) instead of each reproducing the pipeline."""
    import subprocess

    root = tmp_path_factory.mktemp("reproduced")
    work, env = make_clone(root)
    first = subprocess.run(["dvc", "repro"], cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert first.returncode == 0, first.stderr + first.stdout
    (root / "first_repro.log").write_text(first.stdout)
    return work, env


def copy_clone(clone: tuple[Path, dict], tmp_path: Path) -> tuple[Path, dict]:
    """A copy of a clone (its git history, DVC cache and outputs) under ``tmp_path``, with its own MLflow store."""
    import shutil

    source, env = clone
    work = tmp_path / "repo"
    shutil.copytree(source, work, symlinks=True)
    shutil.rmtree(work / ".dvc" / "tmp", ignore_errors=True)  # DVC's locks and state db belong to the original
    env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "C2LIP_MLFLOW_ARTIFACTS": str(tmp_path / "artifacts")}
    return work, env


# the heavy imports of a spawned rank, loaded once per test worker by multiprocessing's fork server: each rank is then
# forked from it in milliseconds instead of importing torch and open_clip anew (seconds per rank on 2 cores)
RANK_PRELOAD = ["torch", "torch.distributed", "open_clip", "components.method.losses", "components.method.models"]


def spawn_ranks(fn, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn`` of ``fn(rank, *args)`` on ``nprocs`` processes, forked from a fork server that
    has the heavy modules imported (a fresh process: no threads of this one are forked)."""
    import multiprocessing

    import torch.multiprocessing as tmp

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(RANK_PRELOAD)
    tmp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
