"""Training on many processes: every method's loss at 1, 2 and 4 ranks (the same global batch) gives the same terms
and gradients; the launchers' environments; the logit-scale bound; BatchNorm across ranks."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from conftest import HANG_S, REPO, free_port, spawn_ranks, tiny_training_data
from test_train import tiny_train, write_params

from components.method.losses import C2LIPLoss, CLICLoss, ContrastiveLoss, HardExampleLoss
from components.shared import checkpoints
from components.shared.params import ParamsError

# --------------------------------------------------------------------------------------------------
# every method's loss: 1 vs 2 vs 4 ranks on one global batch
# --------------------------------------------------------------------------------------------------

IMAGES, DIM, TOKENS = 8, 6, 5
# phrases per image, uneven so that the ranks hold different numbers of them (rank 1 of 4 has none)
PHRASES_PER_IMAGE = [3, 1, 0, 0, 2, 1, 4, 2]


def _methods() -> dict[str, torch.nn.Module]:
    return {
        "siglip": ContrastiveLoss("sigmoid"),
        "clip": ContrastiveLoss("softmax"),
        "c2lip": C2LIPLoss(lambda_xac=0.5, xac_chunk=3),
        "c2lip-text-labels-own-logit": C2LIPLoss(contrastive="softmax", lambda_xac=0.5, concept_logit="own", init_logit_scale=2.0,
                                                 init_logit_bias=-5.0, concept_labels="text"),
        "negclip": HardExampleLoss("sigmoid"),
        "hp_hn-softmax": HardExampleLoss("softmax"),
        "clic": CLICLoss("sigmoid"),
    }


class Towers(torch.nn.Module):
    """Linear image and text towers with a logit scale and bias: every loss's inputs depend on parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.image = torch.nn.Linear(DIM, DIM)
        self.text = torch.nn.Linear(DIM, DIM)
        self.logit_scale = torch.nn.Parameter(torch.tensor([2.0]))
        self.logit_bias = torch.nn.Parameter(torch.tensor([-3.0]))

    def img(self, x):
        return torch.nn.functional.normalize(self.image(x), dim=-1)

    def txt(self, x):
        return torch.nn.functional.normalize(self.text(x), dim=-1)


def _global_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    owner = torch.tensor([i for i, n in enumerate(PHRASES_PER_IMAGE) for _ in range(n)])
    # phrase texts: ids that repeat across images (the text labels must agree across ranks)
    keys = torch.tensor([[(i * 7 + j) % 5] for i, n in enumerate(PHRASES_PER_IMAGE) for j in range(n)])
    return {"images": torch.randn(IMAGES, DIM, generator=g), "texts": torch.randn(IMAGES, DIM, generator=g),
            "tokens": torch.randn(IMAGES, TOKENS, DIM, generator=g), "phrases": torch.randn(len(owner), DIM, generator=g),
            "owner": owner, "keys": keys, "extras": torch.randn(IMAGES * 2, DIM, generator=g),
            "positives": torch.randn(4, IMAGES, DIM, generator=g), "negatives": torch.randn(IMAGES, DIM, generator=g)}


def _terms(name: str, loss, towers: Towers, batch, images: slice) -> dict[str, torch.Tensor]:
    """The method's terms on the images ``images`` of the global batch (a rank's share)."""
    x, t = towers.img(batch["images"][images]), towers.txt(batch["texts"][images])
    scale, bias = towers.logit_scale.exp(), towers.logit_bias
    if isinstance(loss, C2LIPLoss):
        mine = (batch["owner"] >= images.start) & (batch["owner"] < images.stop)
        tokens = towers.img(batch["tokens"][images])
        return loss(x, t, scale, bias, phrase_features=towers.txt(batch["phrases"][mine]), phrase_image_index=batch["owner"][mine] - images.start,
                    image_tokens=tokens, phrase_keys=batch["keys"][mine])
    if isinstance(loss, HardExampleLoss):  # two extra rows per image: a hard negative and (odd images) a hard positive
        local = torch.arange(images.stop - images.start)
        rows = batch["extras"][images.start * 2:images.stop * 2]
        owner = local.repeat_interleave(2)
        positive = torch.tensor([j == 1 and (images.start + i) % 2 == 1 for i in local.tolist() for j in range(2)])
        return loss(x, t, scale, bias, towers.txt(rows), owner, positive)
    if isinstance(loss, CLICLoss):
        has_negative = torch.arange(images.start, images.stop) % 3 != 0
        return loss(x, towers.txt(batch["positives"][:, images]), towers.txt(batch["negatives"][images]), has_negative, scale, bias)
    return loss(x, t, scale, bias)


def _loss_and_grads(name: str, images: slice, world: int):
    loss = _methods()[name]
    towers = Towers()
    terms = _terms(name, loss, towers, _global_batch(), images)
    sum(terms.values()).backward()
    grads = {n: p.grad.clone() for n, p in [*towers.named_parameters(), *loss.named_parameters()] if p.grad is not None}
    if world > 1:  # the data-parallel mean, as DDP and DeepSpeed take it
        for g in grads.values():
            torch.distributed.all_reduce(g)
            g /= world
    return {k: v.detach() for k, v in terms.items()}, grads


def _rank(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = IMAGES // world
    results = {name: _loss_and_grads(name, slice(rank * share, (rank + 1) * share), world) for name in _methods()}
    torch.save(results, os.path.join(out_dir, f"world{world}-rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def test_every_method_gives_the_same_terms_and_gradients_on_1_2_and_4_ranks(tmp_path):
    one = {name: _loss_and_grads(name, slice(0, IMAGES), 1) for name in _methods()}
    for world in (2, 4):
        spawn_ranks(_rank, (world, free_port(), str(tmp_path)), world)
        for rank in range(world):
            got = torch.load(tmp_path / f"world{world}-rank{rank}.pt")
            for name, (terms, grads) in one.items():
                got_terms, got_grads = got[name]
                assert got_terms.keys() == terms.keys(), name
                for k in terms:  # every rank logs the global batch's value
                    torch.testing.assert_close(got_terms[k], terms[k], rtol=1e-5, atol=1e-6, msg=f"{name} {k} world {world} rank {rank}")
                assert got_grads.keys() == grads.keys() and grads, name
                for k in grads:
                    torch.testing.assert_close(got_grads[k], grads[k], rtol=1e-4, atol=1e-6, msg=f"{name} {k} world {world} rank {rank}")
    # the concept terms are there and not zero (the comparison above covers them)
    assert one["c2lip"][0]["xac_loss"] > 0 and one["c2lip-text-labels-own-logit"][0]["npc_loss"] > 0


# --------------------------------------------------------------------------------------------------
# the logit-scale bound holds in the optimiser's master copy (ZeRO 1 on 2 ranks)
# --------------------------------------------------------------------------------------------------


class _ScaleModel(torch.nn.Module):
    """A loss that pushes the logit scale up every step (−logit_scale), beside an ordinary weight."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Module()
        self.model.logit_scale = torch.nn.Parameter(torch.tensor([2.0]))
        self.weight = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.weight(x).pow(2).mean() - self.model.logit_scale.sum()


def _bound_rank(rank, world, port, out_dir):
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    from components.shared.distributed import prepare_deepspeed_comm
    from components.train import bound_logit_scale

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    prepare_deepspeed_comm(1)  # torch's all-reduce instead of compiling DeepSpeed's shared-memory op
    deepspeed.init_distributed("gloo")
    torch.set_num_threads(1)
    bound = 0.7  # ln 2: the scale starts at 2.0 (ln 7.4) and the loss pushes it up
    for bounded in (False, True):
        module = _ScaleModel()
        optimizer = torch.optim.AdamW(module.parameters(), lr=0.5)
        config = {"train_batch_size": 2 * world, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
                  "zero_allow_untested_optimizer": True}
        engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
        for _ in range(3):
            engine.backward(engine(torch.randn(2, 4)))
            engine.step()
            if bounded:
                bound_logit_scale(engine, bound)
            else:  # the module's copy alone, as the loop did before
                with torch.no_grad():
                    engine.module.model.logit_scale.clamp_(0, bound)
        master = safe_get_full_fp32_param(engine.module.model.logit_scale)
        torch.save({"master": master, "module": engine.module.model.logit_scale.detach().clone()},
                   os.path.join(out_dir, f"{'bounded' if bounded else 'module-only'}-{rank}.pt"))


def test_the_logit_scale_bound_holds_in_the_optimizer_master_under_zero1(tmp_path):
    spawn_ranks(_bound_rank, (2, free_port(), str(tmp_path)), 2)
    for rank in (0, 1):
        before = torch.load(tmp_path / f"module-only-{rank}.pt")
        assert float(before["master"]) > 0.7 + 0.5, "the master did not drift past the bound: the test no longer shows the fault"
        after = torch.load(tmp_path / f"bounded-{rank}.pt")
        assert float(after["master"]) <= 0.7 + 1e-6 and float(after["module"]) <= 0.7 + 1e-6


# --------------------------------------------------------------------------------------------------
# the launchers a user would use (real runs of the train stage, 2 ranks on 127.0.0.1)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    return tiny_training_data(tmp_path_factory.mktemp("scale_data"), test_images=8)


@pytest.fixture
def launch_env(tmp_path) -> dict:
    """The environment of a shell that starts a launcher: no rank variables of this process, a run marker that every
    process it starts inherits (to find the ranks), MLflow in the test's folder."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES and not k.startswith("SLURM_")}
    return {**env, "HF_HUB_OFFLINE": "1", MARK: uuid.uuid4().hex, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "C2LIP_MLFLOW_ARTIFACTS": str(tmp_path / "artifacts")}


RANK_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK"}
MARK = "C2LIP_TEST_LAUNCH_MARK"


def _params(tmp_path: Path, data: Path, out: Path, **overrides) -> Path:
    cfg = tiny_train(data, out, **{"processes": 2, "global_batch": 8, "micro_batch": 4, "steps": 2, "checkpoint_every": 2,
                                   "zero_shot_eval": False, "deepspeed_config": str(REPO / "infra" / "deepspeed" / "zero0_fp32.json"),
                                   **overrides})
    return write_params(tmp_path / f"{out.name}.yaml", cfg)


def _train_module(params: Path) -> list[str]:
    return ["-m", "components.train", "--params", str(params)]


def _finished(out: Path, steps: int = 2, processes: int = 2) -> None:
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == steps and metrics["final_loss"] > 0
    assert (out / "export" / "open_clip_model.safetensors").is_file()
    tag = (out / "checkpoints" / "latest").read_text().strip()
    assert checkpoints.launch_of(out / "checkpoints" / tag) == {"processes": processes, "micro_batch": 4}


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (a launcher's ranks and workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"{MARK}={mark}".encode() in f.read().split(b"\0"):
                        with open(f"/proc/{entry}/stat") as stat:
                            if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                                found.append(int(entry))
            except OSError:
                continue
    return found


def _both(commands: list[tuple[list[str], dict]], cwd=REPO) -> list[subprocess.CompletedProcess]:
    """Run the commands side by side (the nodes of one run) and wait for all."""
    procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for cmd, env in commands]
    outputs = [p.communicate(timeout=HANG_S)[0] for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, "") for p, out in zip(procs, outputs, strict=True)]


@pytest.mark.slow
def test_the_deepspeed_launcher_on_one_node_and_on_two_nodes_without_ssh(tiny_data, tmp_path, launch_env):
    deepspeed = str(Path(sys.executable).parent / "deepspeed")
    one = tmp_path / "one-node"
    done = subprocess.run([deepspeed, "--num_gpus", "2", "--module", *_train_module(_params(tmp_path, tiny_data, one))[1:]],
                          cwd=REPO, env=launch_env, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    _finished(one)
    # the default ResNet has BatchNorm: the run says once that CPU processes normalise per rank
    assert (done.stdout + done.stderr).count("cannot synchronise them") == 1

    # two "nodes" of one process each, started on each node with --no_ssh and its --node_rank (docs/gpus.md)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    two, port = tmp_path / "two-nodes", free_port()
    params = _params(tmp_path, tiny_data, two)
    runs = _both([([deepspeed, "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                    "--master_port", str(port), "--module", *_train_module(params)[1:]], launch_env) for node in (0, 1)])
    assert all(r.returncode == 0 for r in runs), "\n".join(r.stdout[-2000:] for r in runs)
    _finished(two)


@pytest.mark.slow
def test_torchrun_across_two_nodes_then_srun_tasks_that_see_other_checkpoints_stop_at_once(tiny_data, tmp_path, launch_env):
    """Two torchrun agents (two "nodes", c10d rendezvous) train with ZeRO 2, each rank writing its optimiser shard.
    Then the relaunches that must not train, as two tasks of an srun job step (only the variables SLURM sets, no
    MASTER_ADDR exported: the first host of the step's node list) and as one process."""
    out, port = tmp_path / "two-nodes", free_port()
    params = _params(tmp_path, tiny_data, out, deepspeed_config=str(REPO / "infra" / "deepspeed" / "zero2_fp32.json"))
    runs = _both([([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                    "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "c2lip-test", *_train_module(params)], launch_env)
                  for _ in (0, 1)])
    assert all(r.returncode == 0 for r in runs), "\n".join(r.stdout[-2000:] for r in runs)
    _finished(out)
    checkpoint = out / "checkpoints" / "step00000002"
    # ZeRO 2: each rank holds its own optimiser shard, and its own RNG state
    assert {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
            "rng_rank0.pt", "rng_rank1.pt"} <= {p.name for p in checkpoint.iterdir()}
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir()}

    # srun tasks whose second node sees another output folder (no shared filesystem): the two ranks meet through the
    # variables SLURM sets, compare what they see, and both stop before training, naming it
    port = free_port()

    def task(rank: int, extra: list[str] = ()) -> tuple[list[str], dict]:
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": str(rank),
                 "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank), "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                 "SLURM_STEP_NODELIST": "127.0.0.1,localhost", "MASTER_PORT": str(port)}
        return [sys.executable, *_train_module(params), *extra], {**launch_env, **slurm}

    runs = _both([task(0), task(1, ["--set", f"output_dir={tmp_path / 'elsewhere'}"])])
    assert all(r.returncode == 2 for r in runs) and all("Every node must see the same output_dir" in r.stdout for r in runs), \
        "\n".join(r.stdout[-2000:] for r in runs)
    assert "rank 0 on" in runs[0].stdout and "resume step00000002" in runs[0].stdout

    # one process on a checkpoint whose optimiser is split two ways (ZeRO 2): refused, every file kept
    alone = subprocess.run([sys.executable, *_train_module(params), "--set", "processes=1"], cwd=REPO, env=launch_env,
                           capture_output=True, text=True, timeout=HANG_S)
    assert alone.returncode == 2 and "Relaunch on 2 processes" in alone.stderr, alone.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in checkpoint.iterdir()} == before


@pytest.mark.slow
def test_a_killed_launcher_leaves_no_rank_and_a_relaunch_on_one_process_resumes_its_step(tiny_data, tmp_path, launch_env):
    """The stage re-launches itself under torchrun (processes: 2, ZeRO 0); kill -9 of its process group (torchrun's
    ranks run in sessions of their own) must take the ranks down; a relaunch on one process (a lost node) goes on
    from the last checkpoint, deleting nothing."""
    out = tmp_path / "killed"
    params = _params(tmp_path, tiny_data, out, steps=6)
    stage = subprocess.Popen([sys.executable, *_train_module(params)], cwd=REPO, env=launch_env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = out / "checkpoints" / "step00000002" / "_checksums.json"
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and stage.poll() is None and not first.is_file():
        time.sleep(0.05)
    ranks = _marked(launch_env[MARK])
    os.killpg(stage.pid, signal.SIGKILL)
    stage.wait()
    assert first.is_file() and not (out / "export").exists(), "the run was not killed between its first checkpoint and its end"
    assert len(ranks) >= 3  # the stage, torchrun and its two ranks (and loader workers)
    deadline = time.monotonic() + HANG_S  # a slow machine takes longer to reap them; only a rank that lives on fails
    while time.monotonic() < deadline and _marked(launch_env[MARK]):
        time.sleep(0.2)
    assert not _marked(launch_env[MARK]), "processes of the killed run are still alive"
    # a rank that had outlived the kill would have trained on to the end and exported
    assert not (out / "export").exists(), "a rank of the killed run went on training"

    resumed = subprocess.run([sys.executable, *_train_module(params), "--set", "processes=1"], cwd=REPO, env=launch_env,
                             capture_output=True, text=True, timeout=HANG_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "written by 2 process(es)" in resumed.stderr
    resumed_at = int(resumed.stderr.split("resumed from", 1)[1].split("at step", 1)[1].split()[0])
    assert resumed_at >= 2 and "starting afresh" not in resumed.stderr
    _finished(out, steps=6, processes=1)
    curve = json.loads((out / "loss.json").read_text())["loss"]
    assert [p["step"] for p in curve] == [1, 2, 3, 4, 5, 6]


# --------------------------------------------------------------------------------------------------
# compare on a machine with several GPUs: a device per run
# --------------------------------------------------------------------------------------------------


def test_compare_deals_its_runs_over_the_gpus_and_each_training_sees_only_its_own(monkeypatch, tmp_path):
    import threading

    from components import compare
    from components.shared import devices

    seen, lock, running, most = [], threading.Lock(), {}, {}

    def fake_call(args, log, cwd=None, env=None):  # the training subprocess: record the device it would see
        with lock:
            device = env.get("CUDA_VISIBLE_DEVICES")
            seen.append(device)
            running[device] = running.get(device, 0) + 1
            most[device] = max(most.get(device, 0), running[device])
        time.sleep(0.05)
        with lock:
            running[device] -= 1
        return 1  # stops train_and_evaluate there: only the environment is under test

    monkeypatch.setattr(compare, "call_logged", fake_call)
    monkeypatch.setattr(compare, "finished", lambda run, suite: None)
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0", "1", "2"])

    class FakeRun:
        def __init__(self, k):
            self.label, self.arm, self.dir = f"arm/seed{k}", "arm", tmp_path / f"run{k}"
            self.train = type("T", (), {"model_dump": lambda self, mode: {}})()

    with pytest.raises(RuntimeError, match="training failed"):
        compare.execute_in_threads([FakeRun(k) for k in range(6)], None, parallel=3)
    # parallel 3 on 3 GPUs: every run on one GPU, never two on one GPU at once
    assert set(seen) <= {"0", "1", "2"} and len(seen) >= 1 and all(n == 1 for n in most.values())
    # more places than GPUs: dealt in turn; no GPUs: the environment is left alone
    slots = devices.DeviceSlots(5, ["a", "b"])
    assert sorted(slots._free.get() for _ in range(5)) == ["a", "a", "a", "b", "b"]
    assert devices.DeviceSlots(2, [])._free.get() is None


# --------------------------------------------------------------------------------------------------
# launcher environments, overrides, the variables other nodes need (no processes)
# --------------------------------------------------------------------------------------------------


def test_launcher_environments_map_to_torchs_rendezvous():
    from components.shared.distributed import adopt_launcher_environment

    deepspeed = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "CROSS_RANK": "1"}
    assert adopt_launcher_environment(deepspeed) == "deepspeed" and deepspeed["LOCAL_WORLD_SIZE"] == "2"
    assert adopt_launcher_environment({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}) == "torchrun"
    # srun: 3 tasks, 2 on the first node and 1 on the second; this is the third
    srun = {"SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_ID": "123",
            "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NODELIST": "gpu07,gpu08"}
    assert adopt_launcher_environment(srun) == "slurm"
    assert {k: srun[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == \
        {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "gpu07"}
    assert srun["MASTER_PORT"] == str(20000 + 123)
    packed = {"SLURM_STEP_NUM_TASKS": "16", "SLURM_PROCID": "9", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
              "SLURM_STEP_NODELIST": "gpu[01-02]", "MASTER_ADDR": "gpu01"}
    assert adopt_launcher_environment(packed) == "slurm" and packed["LOCAL_WORLD_SIZE"] == "8" and packed["MASTER_ADDR"] == "gpu01"
    with pytest.raises(ParamsError, match="export MASTER_ADDR"):  # a compressed node list needs scontrol: say how
        adopt_launcher_environment({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "gpu[01-02]"})
    # a batch script (no step of several tasks) is not a launcher: the stage launches itself
    assert adopt_launcher_environment({"SLURM_PROCID": "0", "SLURM_JOB_ID": "5"}) is None


def test_set_overrides_a_value_for_one_launch_and_names_a_bad_one(tmp_path):
    from components.shared.params import load_params

    path = write_params(tmp_path / "p.yaml", tiny_train(tmp_path, tmp_path / "out", global_batch=16, micro_batch=8))
    params = load_params("train", path, ["micro_batch=4", "processes=4", "data.workers=3"])
    assert (params.micro_batch, params.processes, params.data.workers) == (4, 4, 3)
    with pytest.raises(ParamsError, match="expected KEY=VALUE"):
        load_params("train", path, ["micro_batch"])
    with pytest.raises(ParamsError, match=r"(?s)with --set micro_batch=-1.*micro_batch: Input should be greater"):
        load_params("train", path, ["micro_batch=-1"])


def test_deepspeed_env_forwards_what_other_nodes_need_to_its_owner_only(tmp_path):
    from components.shared.distributed import DEEPSPEED_ENV_FILE, write_deepspeed_env

    names = write_deepspeed_env(tmp_path, {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "HF_HUB_OFFLINE": "1", "C2LIP_PYFUNC_MAX_ROWS": "64",
                                           "HOME": "/root", "PATH": "/bin"})
    assert names == ["C2LIP_PYFUNC_MAX_ROWS", "HF_HUB_OFFLINE", "MLFLOW_TRACKING_URI"]
    path = tmp_path / DEEPSPEED_ENV_FILE
    assert path.read_text().splitlines() == ["C2LIP_PYFUNC_MAX_ROWS=64", "HF_HUB_OFFLINE=1", "MLFLOW_TRACKING_URI=http://mlflow:5000"]
    assert path.stat().st_mode & 0o077 == 0


def test_the_train_stage_accepts_the_deepspeed_launchers_local_rank_argument(tmp_path, monkeypatch):
    from components import train

    monkeypatch.setattr(train, "adopt_launcher_environment", lambda: None)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    # a params file that fails validation: the parser got past --local_rank and the stage stopped at the params
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: -1\n")
    assert train.main(["--local_rank=1", "--params", str(bad)]) == 2
    assert os.environ["LOCAL_RANK"] == "1"
