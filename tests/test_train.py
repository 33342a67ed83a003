"""The train stage: checks before launch, the resumable data stream, optimiser groups, 1- and 2-process
DeepSpeed runs, resume after kill -9, export that open_clip alone loads, MLflow tracking."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import HANG_S, REPO, tiny_captions, tiny_training_data
from pydantic import ValidationError

from components import train as train_stage
from components.data import stream
from components.data.phrase_table import load_phrases
from components.method import optim
from components.method.methods import method_for
from components.method.models import TINY_RN, TINY_SIGLIP, create_model
from components.shared import checkpoints
from components.shared.params import ParamsError, TrainParams, deep_merge, load_params


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """Tiny ShapesWorld shards (3 train, 1 test) and a concepts folder with each image's true phrases."""
    return tiny_training_data(tmp_path_factory.mktemp("train_data"), test_images=24)


@pytest.fixture(scope="module")
def mlflow_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "C2LIP_MLFLOW_ARTIFACTS": str(root / "artifacts")}


def tiny_train(root: Path, out: Path, **overrides) -> dict:
    """Train params for a few steps on the tiny data, writing under ``out``."""
    cfg = {
        "data": {"shards": [str(root / "captions" / "train" / "*.tar")], "concepts_dir": str(root / "concepts"),
                 "shuffle_buffer": 16, "workers": 0},
        "model": {"name": TINY_RN, "init": "scratch"},
        "method": {"name": "c2lip"},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
        "steps": 3, "global_batch": 8, "micro_batch": 8, "processes": 1, "torch_threads": 1,
        "deepspeed_config": str(REPO / "infra" / "deepspeed" / "zero1_fp32.json"),
        "output_dir": str(out), "metrics_path": str(out / "metrics.json"), "plots_path": str(out / "loss.json"),
        "checkpoint_every": 2, "log_every": 1,
        "test_shards": [str(root / "captions" / "test" / "*.tar")],
    }
    return deep_merge(cfg, overrides)


def write_params(path: Path, cfg: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_stage(params_file: Path, env: dict, timeout: int = HANG_S) -> subprocess.CompletedProcess:
    env = {**os.environ, **env}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "components.train", "--params", str(params_file)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------------------------------
# before launch
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    ({"processes": 2, "global_batch": 24, "micro_batch": 8}, "not divisible by world size 2 × micro_batch 8 = 16"),
    ({"global_batch": 12, "micro_batch": 8}, "global_batch 12 is not divisible by micro_batch 8"),
    ({"deepspeed_config": "infra/deepspeed/zero1_bf16.json"}, "enables bf16, but this machine has no CUDA GPU"),
    ({"deepspeed_config": "infra/deepspeed/nope.json"}, "nope.json does not exist"),
    ({"data": {"shards": ["/nonexistent/*.tar"]}}, "'/nonexistent/*.tar' matches no file"),
    ({"data": {"concepts_dir": "/nonexistent"}}, "data.concepts_dir: no Parquet files in /nonexistent"),
    ({"model": {"init": "/nonexistent/model.safetensors"}}, "model.init: /nonexistent/model.safetensors does not exist"),
    ({"method": {"name": "c2lip", "lambda_npc": 0, "lambda_xac": 0}}, "method.lambda_npc > 0 or lambda_xac > 0"),
])
def test_inconsistent_settings_are_rejected_before_launch(tiny_data, tmp_path, capsys, overrides, message):
    if torch.cuda.is_available() and "bf16" in message:
        pytest.skip("this machine has a GPU, so bf16 is allowed")
    params_file = write_params(tmp_path / "p.yaml", tiny_train(tiny_data, tmp_path / "out", **overrides))
    assert train_stage.main(["--params", str(params_file)]) == 2
    err = capsys.readouterr().err
    assert message.replace("method.", "") in err
    assert not (tmp_path / "out").exists()  # nothing started


def test_a_deepspeed_config_may_not_set_what_our_params_own(tiny_data, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 64, "zero_optimization": {"stage": 1}}))
    params = TrainParams.model_validate(tiny_train(tiny_data, tmp_path / "out", deepspeed_config=str(ds)))
    with pytest.raises(ParamsError, match=r"sets \['train_batch_size'\]; these come from params"):
        train_stage.preflight(params)


def test_the_presets_load_and_validate():
    default = load_params("train", REPO / "params" / "train.yaml")
    base = load_params("train", REPO / "params" / "base.yaml")
    paper = load_params("train", REPO / "params" / "presets" / "recipe" / "paper.yaml")
    assert default.model.init == "models/base/export" and base.model.init == "scratch"
    assert base.method.name == "siglip" and default.method.name == "c2lip"
    assert (paper.model.name, paper.model.init, paper.global_batch, paper.micro_batch) == ("ViT-B-16-SigLIP", "webli", 768, 96)
    assert paper.optim.lr == 1e-5 and paper.data.caption_field == "short"
    # the paper's DeepSpeed config is bf16, which preflight accepts on GPUs only
    config = json.loads((REPO / paper.deepspeed_config).read_text())
    assert config["bf16"]["enabled"] and config["zero_optimization"]["stage"] == 1
    for path in (REPO / "infra" / "deepspeed").glob("*.json"):
        json.loads(path.read_text())


# --------------------------------------------------------------------------------------------------
# data stream, optimiser
# --------------------------------------------------------------------------------------------------


def _batches(data: Path, out: Path, start: int, count: int, workers: int, rank: int = 0, world: int = 1, **data_options):
    params = TrainParams.model_validate(tiny_train(data, out, data={"workers": workers, **data_options}))
    _, transform, _, tokenizer = create_model(TINY_SIGLIP)
    shards = stream.expand_shards(params.data.shards)
    phrases = load_phrases(params.data.concepts_dir)
    dataset = stream.TrainBatches(params, shards, rank, world, start, transform, tokenizer, phrases, method_for(params.method.name).make_batch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    it = iter(loader)
    return [next(it) for _ in range(count)]


def test_the_data_stream_resumes_at_the_same_batch_with_the_same_crops_for_any_worker_count(tiny_data, tmp_path):
    full = _batches(tiny_data, tmp_path, start=0, count=12, workers=0)  # 12 × 8 > 64: crosses an epoch
    resumed = _batches(tiny_data, tmp_path, start=9, count=3, workers=0)
    two_workers = _batches(tiny_data, tmp_path, start=0, count=5, workers=2)
    for a, b in zip(full[9:], resumed, strict=False):
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["texts"], b["texts"])
        assert torch.equal(a["phrase_tokens"], b["phrase_tokens"]) and torch.equal(a["phrase_image_index"], b["phrase_image_index"])
    for a, b in zip(full, two_workers, strict=False):
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["texts"], b["texts"])
    # epochs differ in order, and phrase owners index into the batch
    assert not torch.equal(full[0]["texts"], full[8]["texts"])
    assert int(full[0]["phrase_image_index"].max()) < 8


def test_sentence_sampling_keeps_an_ordered_subset_of_the_sentences():
    text = "One. Two two. Three three three! Four? Five."
    sentences = stream.split_sentences(text)
    assert sentences == ["One.", "Two two.", "Three three three!", "Four?", "Five."]
    seen_counts = set()
    for seed in range(40):
        picked = stream.sample_sentences(text, 2, 4, torch.Generator().manual_seed(seed))
        parts = stream.split_sentences(picked)
        assert 2 <= len(parts) <= 4 and parts == [s for s in sentences if s in parts]  # a subset, in order
        assert picked == stream.sample_sentences(text, 2, 4, torch.Generator().manual_seed(seed))  # seeded
        seen_counts.add(len(parts))
    assert seen_counts == {2, 3, 4}
    assert stream.sample_sentences("Just one sentence.", 1, None) == "Just one sentence."
    assert stream.sample_sentences(text, 5, None, torch.Generator().manual_seed(0)) == text  # min = all
    with pytest.raises(ValueError, match=r"max_sentences \(1\) is smaller than min_sentences \(2\)"):
        TrainParams.model_validate({"data": {"sentence_sampling": {"min_sentences": 2, "max_sentences": 1}}})


def test_sentence_sampling_shortens_the_training_captions(tiny_data, tmp_path):
    full = _batches(tiny_data, tmp_path, start=0, count=2, workers=0)
    sampled = _batches(tiny_data, tmp_path, start=0, count=2, workers=0, sentence_sampling={"min_sentences": 1, "max_sentences": 2})
    again = _batches(tiny_data, tmp_path, start=0, count=2, workers=0, sentence_sampling={"min_sentences": 1, "max_sentences": 2})
    for a, b, c in zip(full, sampled, again, strict=False):
        lengths_full, lengths_sampled = (a["texts"] != 0).sum(1), (b["texts"] != 0).sum(1)
        assert (lengths_sampled <= lengths_full).all() and (lengths_sampled < lengths_full).any()
        assert torch.equal(b["texts"], c["texts"])  # the same batches for the same seed
        assert torch.equal(a["phrase_tokens"], b["phrase_tokens"])  # concepts stay the image's


def test_single_object_samples_train_on_their_own_caption_field(tiny_data, tmp_path):
    params = TrainParams.model_validate(tiny_train(tiny_data, tmp_path, data={"workers": 0, "caption_field": "raw",
                                                                              "single_object_caption_field": "short"}))
    shards = stream.expand_shards(params.data.shards)
    dataset = stream.TrainBatches(params, shards, 0, 1, 0, None, None, None, None)
    samples = [s for i in range(40) for s in dataset.samples(i)][:40]
    counts = {1: 0, 2: 0}
    for _, meta, caption, _ in dataset.decode(samples):
        single = len(meta["objects"]) == 1
        assert caption == meta["captions"]["short" if single else "raw"]
        counts[1 if single else 2] += 1
    assert counts[1] and counts[2]  # both kinds were in the sample
    with pytest.raises(ValidationError, match="not a valid field name"):
        TrainParams.model_validate({"data": {"single_object_caption_field": "../x"}})


def test_param_groups_and_schedule():
    model, _, _, _ = create_model(TINY_SIGLIP)
    params = TrainParams.model_validate({"optim": {"lr": 1e-3, "logit_lr_multiplier": 10, "weight_decay": 0.1}})
    decay, no_decay, logit = optim.param_groups(model, params.optim)
    assert {id(p) for p in logit["params"]} == {id(model.logit_scale), id(model.logit_bias)}
    assert logit["lr"] == pytest.approx(1e-2) and logit["weight_decay"] == no_decay["weight_decay"] == 0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert sum(len(g["params"]) for g in (decay, no_decay, logit)) == len(list(model.parameters()))
    f = [optim.lr_factor(s, 100, 10, 0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0) and f[10] == pytest.approx(1.0)
    assert f[99] == pytest.approx(0.1, abs=1e-3) and all(a >= b for a, b in zip(f[10:], f[11:], strict=False))


def test_a_checkpoint_with_a_0dim_logit_scale_loads_into_the_1dim_model(tmp_path):
    from safetensors.torch import save_file

    model, _, _, _ = create_model(TINY_SIGLIP)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["logit_scale"] = torch.tensor(2.5)  # as in pretrained open_clip checkpoints
    state["logit_bias"] = torch.tensor(-7.0)
    save_file(state, str(tmp_path / "w.safetensors"))
    loaded, _, _, _ = create_model(TINY_SIGLIP, pretrained=str(tmp_path / "w.safetensors"))
    assert loaded.logit_scale.shape == (1,) and loaded.logit_scale.item() == pytest.approx(2.5)
    assert loaded.logit_bias.item() == pytest.approx(-7.0)


# --------------------------------------------------------------------------------------------------
# real DeepSpeed runs (subprocesses)
# --------------------------------------------------------------------------------------------------


def _weights_of_latest_checkpoint(out: Path) -> dict[str, torch.Tensor]:
    ckpt = out / "checkpoints"
    tag = (ckpt / "latest").read_text().strip()
    state = torch.load(ckpt / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


@pytest.mark.slow
def test_one_process_run_tracks_and_exports_a_model_open_clip_alone_loads(tiny_data, tmp_path, mlflow_env):
    out = tmp_path / "out"
    world = tiny_captions(tmp_path, shapesworld={"test_images": 40}).model_dump(mode="json")
    curves = {"enabled": True, "images": 40, "captions_params": str(write_params(tmp_path / "captions.yaml", world))}
    params_file = write_params(tmp_path / "p.yaml", tiny_train(tiny_data, out, zero_shot_every=2, curves=curves))
    done = run_stage(params_file, mlflow_env)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and np.isfinite(metrics["final_loss"]) and metrics["final_npc_loss"] > 0
    assert 0 <= metrics["zero_shot_top1"] <= 1 and metrics["zero_shot_images"] > 0
    points = json.loads((out / "loss.json").read_text())["loss"]
    # learning curves: the tracking suite at step 0 and at every checkpoint (2, and the last step)
    tracked = [p["step"] for p in points if "track/binding" in p]
    assert tracked == [0, 2, 3] and all(0 <= p["track/zero_shot"] <= 1 and "track/retrieval" in p and 0 <= p["track/swap_att"] <= 1
                                        for p in points if "track/binding" in p)
    assert 0 < metrics["curves_share"] < 1 and metrics["curves_seconds"] > 0
    curve = [p for p in points if p["step"] > 0]
    assert [p["step"] for p in curve] == [1, 2, 3] and {"contrastive_loss", "npc_loss", "xac_loss"} <= set(curve[0])
    # the zero-shot check ran during training (step 2) and at the end, and is on the curve
    assert "zero_shot_top1" not in curve[0] and 0 <= curve[1]["zero_shot_top1"] <= 1
    assert curve[2]["zero_shot_top1"] == pytest.approx(metrics["zero_shot_top1"], abs=1e-4)
    assert (out / "loss.png").stat().st_size > 1000

    # MLflow: params flattened from the pydantic model, per-term losses, the run finished
    import mlflow

    mlflow.set_tracking_uri(mlflow_env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["c2lip"], output_format="list")
    run = max(runs, key=lambda r: r.info.start_time)
    assert run.info.status == "FINISHED"
    assert run.data.params["method.name"] == "c2lip" and run.data.params["optim.lr"] == "0.001"
    for key in ("contrastive_loss", "npc_loss", "xac_loss", "lr", "samples_per_s", "zero_shot_top1"):
        assert key in run.data.metrics, key
    client = mlflow.tracking.MlflowClient()
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3]
    assert 2 in [m.step for m in client.get_metric_history(run.info.run_id, "zero_shot_top1")]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "track/binding")] == [0, 2, 3]  # drawn by the MLflow UI

    # the export loads with open_clip alone (a fresh interpreter that never imports our code) and
    # gives the trained model's embeddings
    probe = tmp_path / "probe.pt"
    script = (
        "import sys, torch, open_clip\n"
        f"model, _, preprocess = open_clip.create_model_and_transforms('local-dir:{out / 'export'}')\n"
        f"tok = open_clip.get_tokenizer('local-dir:{out / 'export'}')\n"
        "torch.manual_seed(0); images = torch.randn(3, 3, 64, 64)\n"
        "model.eval()\n"
        "with torch.no_grad():\n"
        "    out = {'image': model.encode_image(images), 'text': model.encode_text(tok(['a red circle', 'a blue cross']))}\n"
        f"torch.save(out, {str(probe)!r})\n"
        "assert 'components' not in sys.modules\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    reference, _, _, tok = create_model(TINY_RN)
    reference.load_state_dict(_weights_of_latest_checkpoint(out))
    reference.eval()
    # the evaluate stage reads the same checkpoint file as a model (its `checkpoint` kind), the loss's entries left out
    from components.evaluate import load_state_dict

    tag = (out / "checkpoints" / "latest").read_text().strip()
    as_evaluated = load_state_dict(out / "checkpoints" / tag / "mp_rank_00_model_states.pt")
    assert set(as_evaluated) == set(reference.state_dict())
    torch.manual_seed(0)
    images = torch.randn(3, 3, 64, 64)
    got = torch.load(probe)
    with torch.no_grad():
        torch.testing.assert_close(got["image"], reference.encode_image(images), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["text"], reference.encode_text(tok(["a red circle", "a blue cross"])), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_killed_run_resumes_past_a_damaged_checkpoint_and_a_run_killed_in_its_first_checkpoint_starts_afresh(tiny_data, tmp_path, mlflow_env):
    steps = dict(steps=6, checkpoint_every=2, zero_shot_eval=False, data={"workers": 1})
    straight = tmp_path / "straight"
    done = run_stage(write_params(tmp_path / "straight.yaml", tiny_train(tiny_data, straight, **steps)), mlflow_env)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "killed"
    params_file = write_params(tmp_path / "killed.yaml", tiny_train(tiny_data, out, **steps))
    env = {**os.environ, **mlflow_env}
    proc = subprocess.Popen([sys.executable, "-m", "components.train", "--params", str(params_file)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + HANG_S
    while time.time() < deadline and proc.poll() is None and not (latest.is_file() and latest.read_text().strip() == "step00000004"):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest.read_text().strip() == "step00000004", "the run was not killed between its checkpoints"
    assert not (out / "export").exists()

    # the fault: the latest checkpoint is damaged (a truncated file); the run falls back to step 2, through
    # DeepSpeed's loads guarded to weights only, and still ends where the uninterrupted run ends
    damaged = out / "checkpoints" / "step00000004" / "mp_rank_00_model_states.pt"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    (out / "loss.json").unlink()  # DVC removes a stage's non-persistent outputs before re-running it
    resumed = run_stage(params_file, mlflow_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipped damaged checkpoint" in resumed.stderr and "step00000004" in resumed.stderr
    assert "resumed from" in resumed.stderr and "at step 2" in resumed.stderr
    a, b = _weights_of_latest_checkpoint(straight), _weights_of_latest_checkpoint(out)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5, msg=str(key))
    curve = json.loads((out / "loss.json").read_text())["loss"]
    assert [p["step"] for p in curve] == [1, 2, 3, 4, 5, 6]

    # a re-run of the finished stage (DVC deleted its outputs) trains nothing and writes them all again
    for name in ("loss.json", "loss.png", "metrics.json"):
        (out / name).unlink()
    again = run_stage(params_file, mlflow_env)
    assert again.returncode == 0 and "at step 6" in again.stderr, again.stderr[-3000:]
    assert [p["step"] for p in json.loads((out / "loss.json").read_text())["loss"]] == [1, 2, 3, 4, 5, 6]
    assert (out / "loss.png").is_file() and json.loads((out / "metrics.json").read_text())["steps"] == 6

    # changed params start afresh instead of resuming the other params' checkpoints
    changed = run_stage(write_params(tmp_path / "changed.yaml", tiny_train(tiny_data, out, **{**steps, "steps": 2}, optim={"lr": 5e-4})), mlflow_env)
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "belong to other params: starting afresh" in changed.stderr and "resumed from" not in changed.stderr

    # the changed run's only checkpoint (its first) without its checksums is what a kill between DeepSpeed's save and
    # the checksums leaves: the run starts afresh
    changed_file = tmp_path / "changed.yaml"
    checkpoint = out / "checkpoints" / "step00000002"
    (checkpoint / "_checksums.json").unlink()
    again = run_stage(changed_file, mlflow_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "was finished before the run stopped: starting afresh" in again.stderr and "resumed from" not in again.stderr
    assert (checkpoint / "_checksums.json").is_file() and json.loads((out / "metrics.json").read_text())["steps"] == 2
    # a finished checkpoint whose file changed afterwards is damage to look at, not a kill: the run stops and says so
    weights = checkpoint / "mp_rank_00_model_states.pt"
    weights.write_bytes(weights.read_bytes()[:1000])
    stopped = run_stage(changed_file, mlflow_env)
    assert stopped.returncode != 0 and "no intact checkpoint to resume from" in stopped.stderr


def test_logit_calibration_fits_scale_and_bias_to_the_sigmoid_loss():
    """Frozen embeddings whose matching pairs have cosine 0.6 and others 0.1: the fitted bias must put
    the decision boundary between them, and the sigmoid loss must fall from the uncalibrated start."""

    class Frozen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.logit_scale = torch.nn.Parameter(torch.tensor([np.log(10.0)], dtype=torch.float32))
            self.logit_bias = torch.nn.Parameter(torch.tensor([-10.0]))

        def encode_image(self, x, normalize=True):
            return x

        def encode_text(self, t, normalize=True):
            return t

    n, d = 16, 64
    g = torch.Generator().manual_seed(0)
    base = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=-1)
    # text_i = a·image_i + b·shared: cos(i, i) ≈ 0.6, cos(i, j) ≈ 0.1 for random high-dim images
    shared = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    texts = torch.nn.functional.normalize(0.6 * base + 0.3 * shared, dim=-1)
    batches = [{"images": base, "texts": texts}]
    model = Frozen()

    def loss(log_s, b):
        sim = base @ texts.T
        labels = 2 * torch.eye(n) - 1
        return -torch.nn.functional.logsigmoid(labels * (np.exp(log_s) * sim + b)).sum().item() / n

    before = loss(np.log(10.0), -10.0)
    log_s, b = optim.calibrate_logits(model, batches, np.log(100.0))
    sim = base @ texts.T
    positives, negatives = sim.diag(), sim[~torch.eye(n, dtype=torch.bool)]
    s = np.exp(log_s)
    assert s * negatives.max() + b < 0 < s * positives.min() + b  # separates the pairs it was fitted on
    assert loss(log_s, b) < before / 5
    assert log_s <= np.log(100.0) + 1e-6


def test_a_float16_export_halves_the_file_and_loads_into_a_float32_model(tmp_path):
    import open_clip
    from safetensors import safe_open

    model, _, _, tokenizer = create_model(TINY_RN)
    model.eval()
    full = checkpoints.export_model(model, TINY_RN, tmp_path / "fp32")
    half = checkpoints.export_model(model, TINY_RN, tmp_path / "fp16", "float16")
    def size(folder):
        return (folder / checkpoints.EXPORT_WEIGHTS).stat().st_size

    assert size(half) < 0.55 * size(full)
    with safe_open(str(half / checkpoints.EXPORT_WEIGHTS), "pt") as f:
        assert f.get_tensor("logit_scale").dtype == torch.float16
        assert f.get_tensor("visual.bn1.num_batches_tracked").dtype == torch.int64  # integers stay integers
    loaded, _, _ = open_clip.create_model_and_transforms(f"local-dir:{half}")
    loaded.eval()
    assert loaded.logit_scale.dtype == torch.float32
    texts = tokenizer(["a red circle", "a small blue cross on a white background"])
    with torch.no_grad():
        a, b = model.encode_text(texts, normalize=True), loaded.encode_text(texts, normalize=True)
    assert torch.allclose(a, b, atol=1e-2) and not torch.equal(a, b)


def test_pruning_keeps_the_newest_checkpoints_and_never_the_one_latest_names(tmp_path):
    from components.shared.atomic import write_checksums

    for step in (1, 2, 3, 4):  # as save_checkpoint leaves them: on the record, by their checksums
        tag = f"step{step:08d}"
        checkpoints.checkpoints_record(tmp_path).begin_folder(tag)
        (tmp_path / tag / "model.pt").write_bytes(bytes([step]))
        write_checksums(tmp_path / tag)
        checkpoints.record_checkpoint(tmp_path, tag)
    (tmp_path / "latest").write_text("step00000001")  # e.g. a save that has not finished its pointer
    checkpoints.prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step*")) == ["step00000001", "step00000003", "step00000004"]


def test_the_memo_tokenizer_gives_the_tokenizers_rows_and_starts_over_at_its_limit():
    import pickle

    import open_clip

    from components.data.stream import MemoTokenizer

    tokenizer = open_clip.get_tokenizer("c2lip-tiny-rn")
    memo = MemoTokenizer(tokenizer, limit=3)
    texts = ["a red circle", "a blue square", "a red circle", "two shapes"]
    assert torch.equal(memo(texts), tokenizer(texts)) and len(memo.rows) == 3
    assert torch.equal(memo(["a green cross", "a red circle"]), tokenizer(["a green cross", "a red circle"]))
    assert len(memo.rows) == 2  # over the limit: started over with this call's texts
    assert memo.context_length == tokenizer.context_length and memo([]).shape == tokenizer([]).shape
    assert torch.equal(pickle.loads(pickle.dumps(memo))(["a red circle"]), tokenizer(["a red circle"]))


def test_a_share_of_crowded_scenes_trains_on_a_binding_alt_text(tiny_data, tmp_path):
    params = TrainParams.model_validate(tiny_train(tiny_data, tmp_path, data={
        "workers": 0, "caption_field": "raw", "single_object_caption_field": "short", "binding_alt_text_share": 0.5}))
    shards = stream.expand_shards(params.data.shards)
    dataset = stream.TrainBatches(params, shards, 0, 1, 0, None, None, None, None)
    samples = [s for i in range(80) for s in dataset.samples(i)][:80]
    binding = plain = 0
    for (key, meta, caption, _), sample in zip(dataset.decode(samples), samples, strict=True):
        assert key == sample["__key__"]
        if len(meta["objects"]) == 1:
            assert caption == meta["captions"]["short"]
            continue
        picked = stream.binds_in_alt_text(key, 0.5)
        assert caption == meta["captions"]["short" if picked else "raw"]
        binding, plain = binding + picked, plain + (not picked)
    assert binding and plain  # both kinds of crowded scene were in the sample
    # which scenes bind is a property of the image: the same keys for any seed, nested as the share grows
    keys = [f"train-{i:06d}" for i in range(4000)]
    tenth = {k for k in keys if stream.binds_in_alt_text(k, 0.1)}
    half = {k for k in keys if stream.binds_in_alt_text(k, 0.5)}
    assert tenth < half and 0.08 < len(tenth) / len(keys) < 0.12 and 0.47 < len(half) / len(keys) < 0.53
    assert not any(stream.binds_in_alt_text(k, 0.0) for k in keys)
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        TrainParams.model_validate({"data": {"binding_alt_text_share": 1.5}})
