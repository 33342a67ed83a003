"""docs/recipe.md's commands, run as the page writes them, in miniature: a URL table with its own column names served by a
loopback image server, a small pretrained-shaped model from a local checkpoint in place of ViT-B-16-SigLIP, 2 CPU
processes in place of 8 GPUs, SugarCrepe's real annotation files (the first items of each, from ../shared) with
stand-in images. The test appends only the miniature's sizes (--set) to each command; a command of the page that
stops working fails it."""

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path

import pytest
from conftest import HANG_S, REPO
from PIL import Image

from components.shared.params import load_params

PAGE = REPO / "docs" / "recipe.md"
MARK = "<!-- recipe: tests/test_recipe.py runs this block's commands in order -->"
SHARED_SUGARCREPE = REPO.parent / "shared" / "benchmarks" / "sugar_crepe"
ITEMS_PER_SUBSET = 6
COLORS = {"red": (220, 30, 30), "blue": (40, 70, 230), "green": (30, 170, 50), "yellow": (240, 210, 20)}
SHAPES = ("square", "circle")


def page_commands() -> list[str]:
    """The commands of the page's marked block, in order (comment lines left out)."""
    text = PAGE.read_text()
    block = re.search(re.escape(MARK) + r"\n```bash\n(.*?)```", text, re.S)
    assert block, f"{PAGE}: no ```bash block after {MARK!r}"
    return [line for line in block[1].splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _jpeg(color, size=32) -> bytes:
    buffer = BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="JPEG")
    return buffer.getvalue()


class _Images(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        name = self.path.strip("/").split(".")[0]
        body = _jpeg(COLORS.get(name.split("-")[0], (128, 128, 128)))
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _workspace(tmp_path: Path) -> Path:
    """What a clone holds for these commands (code, params, the DeepSpeed configs), with .venv beside it."""
    work = tmp_path / "c2lip"
    for name in ("components", "params", "infra"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    (work / ".venv").symlink_to(REPO / ".venv")
    return work


# what the miniature changes, per stage module: sizes, the loopback host, the tiny model (appended to the page's command)
def _miniature(checkpoint: str) -> dict[str, list[str]]:
    return {
        "captions": ["shard_size=8", "workers=1", "table.download.allow_hosts=[127.0.0.1]", "table.download.concurrency=4"],
        "concepts": ["n_process=1"],
        "train": ["processes=2", "model.name=c2lip-tiny-map", f"model.init={checkpoint}", "global_batch=8", "micro_batch=4", "steps=2",
                  "deepspeed_config=infra/deepspeed/zero1_fp32.json", "data.workers=0", "data.shuffle_buffer=8", "torch_threads=1",
                  "checkpoint_every=1", "log_every=1", "optim.warmup_steps=1"],
        "evaluate": [f"models=[{{name: base, arch: c2lip-tiny-map, uri: {checkpoint}}}, {{name: finetuned, uri: models/your-data/export}}]",
                     "precision=fp32", "device=cpu", "torch_threads=1", "workers=0", "bootstrap.resamples=100"],
        "register": [],
    }


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SUGARCREPE.is_dir(), reason="../shared/benchmarks/sugar_crepe is absent (a user's clone has no ../shared): "
                    "the recipe's evaluate step reads SugarCrepe's real files")
def test_the_recipe_page_runs_as_written_in_miniature(tmp_path):
    import torch

    from components.method.models import create_model

    commands = page_commands()
    modules = [re.search(r"-m components\.(\w+)", c)[1] for c in commands]
    assert modules == ["captions", "concepts", "train", "evaluate", "register"], modules
    work = _workspace(tmp_path)

    # your table: its own column names, image URLs on a loopback server
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    (work / "data" / "sources").mkdir(parents=True)
    rows = [(f"{base}/{color}-{shape}-{i}.jpg", f"{color} {shape}", f"A {color} {shape} on a gray background, picture {i}.")
            for i, (color, shape) in enumerate((c, s) for c in COLORS for s in SHAPES for _ in range(2))]
    with open(work / "data" / "sources" / "my-images.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["photo_url", "alt_text", "description"])
        writer.writerows(rows)

    # the real benchmark files (the first items of each subset) and stand-in images under their COCO names
    sugarcrepe, coco = work / "data" / "benchmarks" / "sugar_crepe", work / "data" / "benchmarks" / "coco" / "val2017"
    sugarcrepe.mkdir(parents=True)
    coco.mkdir(parents=True)
    subsets = load_params("evaluate", work / "params" / "presets" / "your-data" / "evaluate.yaml").benchmarks.sugarcrepe.subsets
    for subset in subsets:
        items = json.loads((SHARED_SUGARCREPE / f"{subset}.json").read_text())
        kept = {k: items[k] for k in list(items)[:ITEMS_PER_SUBSET]}
        (sugarcrepe / f"{subset}.json").write_text(json.dumps(kept))
        for item in kept.values():
            (coco / item["filename"]).write_bytes(_jpeg((90, 140, 200)))

    # a pretrained-shaped model: a tiny architecture's weights in a local checkpoint file
    torch.manual_seed(0)
    model = create_model("c2lip-tiny-map")[0]
    checkpoint = work / "data" / "sources" / "tiny-pretrained.pt"
    torch.save(model.state_dict(), checkpoint)

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "C2LIP_MLFLOW_ARTIFACTS": str(tmp_path / "artifacts"),
           "HF_HUB_OFFLINE": "1"}
    miniature = _miniature(str(checkpoint.relative_to(work)))
    try:
        for command, module in zip(commands, modules, strict=True):
            argv = shlex.split(command) + [arg for value in miniature[module] for arg in ("--set", value)]
            done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S * 2)
            assert done.returncode == 0, f"the recipe's `{command}` failed in miniature (exit {done.returncode}):\n{done.stderr[-4000:]}"
    finally:
        httpd.shutdown()

    captions = json.loads((work / "metrics" / "your-data" / "captions.json").read_text())
    assert captions["samples_written"] == len(rows) and not captions["skipped"]
    assert list((work / "data" / "your-data" / "concepts" / "train").glob("*.parquet"))
    export = work / "models" / "your-data" / "export"
    assert (export / "open_clip_config.json").is_file()
    metrics = json.loads((work / "reports" / "your-data" / "metrics.json").read_text())
    for model_name in ("base", "finetuned"):
        for subset in subsets:
            assert metrics[f"{model_name}/sugarcrepe/{subset}/items"] == ITEMS_PER_SUBSET
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    version = mlflow.MlflowClient().get_model_version_by_alias("c2lip-your-data", "challenger")
    assert str(version.version) == "1" and version.tags["summary.compositional"]


def test_the_recipe_s_comparison_trains_its_arms_on_the_recipe_s_data_and_model():
    """The comparison preset the page names resolves to the train preset's model, data and budget for each arm."""
    from components import compare

    text = PAGE.read_text()
    preset = re.search(r"-m components\.compare --params (\S+)", text)[1]
    runs = compare.plan(load_params("compare", REPO / preset))
    train = load_params("train", REPO / "params" / "presets" / "your-data" / "train.yaml")
    assert sorted({r.arm for r in runs}) == ["c2lip", "negclip", "siglip"] and len(runs) == 9
    for run in runs:
        assert run.train.model == train.model and run.train.data.shards == train.data.shards
        assert run.train.global_batch == train.global_batch and run.train.steps == train.steps
        assert run.train.method.name == run.arm


def test_the_lock_installs_torch_s_cuda_build_on_linux():
    """What the recipe's install says: on Linux the locked torch brings its CUDA libraries (NCCL among them)."""
    lock = (REPO / "uv.lock").read_text()
    torch_entry = lock[lock.index('\nname = "torch"\n'):]
    dependencies = torch_entry[torch_entry.index("dependencies = ["):torch_entry.index("]\n", torch_entry.index("dependencies = ["))]
    assert re.search(r'name = "nvidia-nccl-cu(\d+)", marker = "sys_platform == \'linux\'"', dependencies), dependencies
    cuda = re.search(r'name = "nvidia-nccl-cu(\d+)"', dependencies)[1]
    assert f"CUDA {cuda}.0 build" in PAGE.read_text(), "the recipe names another CUDA version than the lock's"
