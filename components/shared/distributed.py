"""Processes and DeepSpeed: the world size, the DeepSpeed config filled from our params, and the
launcher that re-starts a multi-process run under torchrun."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

from components.shared.params import ParamsError, TrainParams


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
        prepare_deepspeed_comm(processes)  # compiled once, before the ranks fan out
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   "-m", module, *args]
        return subprocess.call(command)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return None
