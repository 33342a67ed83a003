"""Processes and DeepSpeed: the world size, the DeepSpeed config filled from our params, the environments of the
launchers a rank may be started by (torchrun, ``deepspeed``, SLURM's ``srun``), and the re-launch of a multi-process
run under torchrun.

Launchers, as a rank sees them:

- torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
- ``deepspeed`` sets the same but ``LOCAL_SIZE`` for ``LOCAL_WORLD_SIZE``, and appends ``--local_rank=N`` to the
  module's arguments (the train stage accepts and ignores it);
- ``srun`` sets only its own ``SLURM_*`` variables: :func:`adopt_launcher_environment` maps them to torch's.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from components.shared.params import ParamsError, TrainParams

if TYPE_CHECKING:
    import torch


def adopt_launcher_environment(environ: dict | None = None) -> str | None:
    """Fill torch's rendezvous variables from the launcher that started this process; returns the launcher's name
    (``torchrun``, ``deepspeed``, ``slurm``) or None when no launcher started it (the stage then launches itself).

    Under ``srun`` (a job step of several tasks, one per GPU) the rank is ``SLURM_PROCID`` of ``SLURM_STEP_NUM_TASKS``,
    the local rank ``SLURM_LOCALID``; the rendezvous host is ``MASTER_ADDR`` when the job script exports it (the first
    node of the allocation: ``MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)``), else the
    first host of ``SLURM_STEP_NODELIST`` when it is a plain list; the port, when not exported, is derived from the job id
    so that two jobs on one node do not meet."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env:
        if "LOCAL_WORLD_SIZE" not in env and "LOCAL_SIZE" in env:  # deepspeed's name for it
            env["LOCAL_WORLD_SIZE"] = env["LOCAL_SIZE"]
        return "deepspeed" if "LOCAL_SIZE" in env or "CROSS_RANK" in env else "torchrun"
    tasks = env.get("SLURM_STEP_NUM_TASKS")
    if tasks is None or "SLURM_PROCID" not in env or int(tasks) < 2:
        return None  # not a step of several tasks (a batch script itself, or one task): not launched by srun
    host = env.get("MASTER_ADDR") or _first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    if not host:
        raise ParamsError("srun: cannot tell the first node of the job step from SLURM_STEP_NODELIST "
                          f"{env.get('SLURM_STEP_NODELIST')!r}; export MASTER_ADDR=$(scontrol show hostnames "
                          '"$SLURM_JOB_NODELIST" | head -n1) in the job script')
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE") or tasks
    env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=tasks, LOCAL_RANK=env.get("SLURM_LOCALID", "0"),
               LOCAL_WORLD_SIZE=str(_tasks_on_this_node(per_node, int(env.get("SLURM_NODEID", "0")))),
               MASTER_ADDR=host, MASTER_PORT=env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    return "slurm"


def _first_host(nodelist: str) -> str | None:
    """The first host of a SLURM node list when it needs no expansion (``gpu01,gpu02``, ``gpu01``); None for the
    compressed form (``gpu[01-04]``), which only ``scontrol show hostnames`` expands reliably."""
    first = nodelist.split(",")[0].strip()
    return first if first and "[" not in first else None


def _tasks_on_this_node(per_node: str, node: int) -> int:
    """Tasks on node ``node`` from SLURM's ``2(x3),1`` notation (two tasks on each of three nodes, then one)."""
    counts: list[int] = []
    for part in per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts[min(node, len(counts) - 1)]


def local_world_size() -> int:
    """Processes on this machine (threads per rank are the machine's cores over these)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or os.environ.get("WORLD_SIZE", 1))


# what a rank on another node needs from this shell; DeepSpeed's multi-node runner exports the variables a
# .deepspeed_env file in the launch directory lists (pdsh starts the remote ranks with a bare environment)
FORWARDED_PREFIXES = ("C2LIP_", "MLFLOW_", "HF_", "PREFECT_API_")
FORWARDED_NAMES = ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "GLOO_SOCKET_IFNAME")
DEEPSPEED_ENV_FILE = ".deepspeed_env"


def write_deepspeed_env(folder, environ: dict | None = None) -> list[str]:
    """Write ``folder/.deepspeed_env`` with the variables of this shell the ranks on other nodes need (the tracking
    server, the hub, c2lip's own settings); readable by its owner only, as it may hold a tracking password.
    Returns the names written."""
    from pathlib import Path

    from components.shared.atomic import atomic_write_bytes

    env = os.environ if environ is None else environ
    names = sorted(n for n in env if n.startswith(FORWARDED_PREFIXES) or n in FORWARDED_NAMES)
    for name in names:
        if "\n" in env[name]:
            raise ParamsError(f"{name}: a value with a line break cannot be forwarded through {DEEPSPEED_ENV_FILE}")
    path = Path(folder) / DEEPSPEED_ENV_FILE
    atomic_write_bytes(path, "".join(f"{n}={env[n]}\n" for n in names).encode())
    path.chmod(0o600)
    return names


def world_size_for(params: TrainParams) -> int:
    """Processes this run will have: the launcher's WORLD_SIZE when under one, else ``processes``."""
    return int(os.environ.get("WORLD_SIZE", params.processes))


def deepspeed_config(params: TrainParams, world_size: int, cuda: bool) -> dict[str, Any]:
    """The DeepSpeed config file with our batch sizes and clipping filled in; rejects what cannot run."""
    path = params.deepspeed_config
    if not path.is_file():
        raise ParamsError(f"deepspeed_config: {path} does not exist (configs live in infra/deepspeed/)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ParamsError(f"deepspeed_config: {path} is not valid JSON: {err}") from None
    owned = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler", "gradient_clipping"}
    clash = sorted(owned & set(config))
    if clash:
        raise ParamsError(f"deepspeed_config: {path} sets {clash}; these come from params/*.yaml (global_batch, micro_batch, optim)")
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2):
        raise ParamsError(f"deepspeed_config: {path} asks ZeRO stage {stage}; the train stage supports 0, 1 and 2")
    for precision in ("bf16", "fp16"):
        if config.get(precision, {}).get("enabled") and not cuda:
            raise ParamsError(
                f"deepspeed_config: {path} enables {precision}, but this machine has no CUDA GPU; "
                f"use infra/deepspeed/zero{stage}_fp32.json on CPU"
            )
    per_step = world_size * params.micro_batch
    if params.global_batch % per_step:
        raise ParamsError(
            f"global_batch {params.global_batch} is not divisible by world size {world_size} × micro_batch "
            f"{params.micro_batch} = {per_step}"
        )
    config.update(
        train_batch_size=params.global_batch,
        train_micro_batch_size_per_gpu=params.micro_batch,
        gradient_accumulation_steps=params.global_batch // per_step,
        gradient_clipping=params.optim.grad_clip,
    )
    config.setdefault("zero_allow_untested_optimizer", True)  # our torch AdamW param groups (the paper's no-decay rule, docs/architecture.md)
    return config


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the rendezvous of a one-process run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_deepspeed_comm(world: int) -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op (``shm_comm``) in every process
    that initialises it: on a fresh machine four runs started side by side each waited minutes on that one
    compile. A one-process world reduces nothing, so it skips the op; a many-process launch builds it once
    here, in the launcher, before the ranks start (they then load the cached build)."""
    import torch

    if torch.cuda.is_available():
        return  # NCCL: no shm op
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm.torch, the attribute, is torch itself)

    if world == 1:
        ds_torch_comm.build_shm_op = lambda: None  # DeepSpeed's own code path for "op unavailable"
    else:
        ds_torch_comm.build_shm_op()


def launch(module: str, args: list[str], processes: int) -> int | None:
    """Not under a launcher: with ``processes > 1`` run ``python -m <module> <args>`` under torchrun and
    return its exit code; with one process set the environment of a one-rank world and return None
    (the caller goes on in this process)."""
    if "WORLD_SIZE" in os.environ:
        return None
    if processes > 1:
        from components.shared.processes import die_with_parent

        prepare_deepspeed_comm(processes)  # compiled once, before the ranks fan out
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   "-m", module, *args]
        # torchrun dies with this process (its ranks die with torchrun: components.train), however this one ends
        return subprocess.call(command, preexec_fn=die_with_parent)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return None


def synchronise_batch_norm(model: torch.nn.Module, world: int, cuda: bool, main: bool) -> torch.nn.Module:
    """BatchNorm normalises by its batch's statistics: on several GPUs they become the global batch's
    (SyncBatchNorm), so every rank computes what one process would. gloo (CPU) cannot synchronise them: then each
    rank normalises its own micro-batch, and the run says so once."""
    import logging

    import torch

    if world == 1 or not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    if cuda:
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if main:
        logging.getLogger("c2lip.train").warning("this model has BatchNorm layers and %d CPU processes cannot synchronise them (SyncBatchNorm needs GPUs): "
                    "each rank normalises by its own micro-batch, so the run differs from a one-process run (a model with "
                    "LayerNorm, such as the ViTs, does not)", world)
    return model


def bound_logit_scale(engine, max_log_scale: float) -> None:
    """The paper clamps the logit scale to [0, ln 100] after each step. Under ZeRO 1/2 or bf16 the optimiser steps an
    fp32 master copy of it and writes it back into the module at the next step: clamping the module's copy alone
    lets the master drift past the bound, so the master is clamped too (DeepSpeed's full-parameter accessors; a
    collective of one value, on every rank)."""
    import torch
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    scale = engine.module.model.logit_scale
    with torch.no_grad():
        scale.clamp_(0, max_log_scale)  # ZeRO 0 in fp32: the parameter the optimiser steps
        master = safe_get_full_fp32_param(scale)
        if master is not None and bool(((master < 0) | (master > max_log_scale)).any()):
            safe_set_full_fp32_param(scale, master.clamp(0, max_log_scale))


def main(argv: list[str] | None = None) -> int:
    """``python -m components.shared.distributed deepspeed-env``: write .deepspeed_env for a multi-node deepspeed launch."""
    import argparse

    parser = argparse.ArgumentParser(description="Helpers of a multi-node launch.")
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("deepspeed-env", help=f"write {DEEPSPEED_ENV_FILE} in --to (the folder deepspeed is started from): the "
                                               "variables of this shell the ranks on other nodes need")
    env.add_argument("--to", default=".", help="folder (default: the current one)")
    args = parser.parse_args(argv)
    names = write_deepspeed_env(args.to)
    print(f"{os.path.join(args.to, DEEPSPEED_ENV_FILE)}: {', '.join(names) or 'no variable to forward'} (readable by you only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
