"""Where a model runs, and its inputs with it: the one place every caller (the suite's encoders and zero-shot
classifiers, the learning curves, the study probes, the neighbour images, the pyfunc) moves a batch to the model.

Also the GPUs of a machine dealt to runs side by side (:class:`DeviceSlots`: the comparison's runs).

A batch must follow the model's parameters in device *and* dtype: a model on a GPU, or cast to bf16 (DeepSpeed's bf16
engine casts it in place; ``precision: bf16`` in the evaluate stage), refuses float32 CPU inputs ("Input type
(torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same"). Integer inputs (token ids) follow
the device only.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re

import torch

from components.shared.params_base import DEVICE_PATTERN

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceError(ValueError):
    """A device that this machine does not have; says which, and what it has."""


def resolve_device(name: str = "auto") -> torch.device:
    """``auto``: the first GPU when torch sees one, else the CPU; ``cpu``; ``cuda`` / ``cuda:N`` (checked to exist)."""
    if not isinstance(name, str) or not re.fullmatch(DEVICE_PATTERN, name):  # fullmatch: "$" alone admits "cpu\n"
        raise DeviceError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise DeviceError(f"device {name!r}: this machine has {count} CUDA GPU(s) visible to torch"
                              + ("" if count else " (use device: auto or cpu)"))
    return device


def placement(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """(device, dtype) of the model's first floating-point parameter (its compute dtype); CPU float32 without one
    (a stand-in embedder in a test, a model with no weights)."""
    parameters = getattr(model, "parameters", None)
    for tensor in parameters() if callable(parameters) else ():
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.float32


def to_model(x: torch.Tensor, model: torch.nn.Module, non_blocking: bool = False) -> torch.Tensor:
    """``x`` on the model's device; floating-point inputs (pixels) in its dtype too, integer ones (tokens) as they are.
    ``non_blocking``: the copy overlaps compute when ``x`` sits in pinned memory (a DataLoader with ``pin_memory``)."""
    device, dtype = placement(model)
    if x.is_floating_point():
        return x.to(device=device, dtype=dtype, non_blocking=non_blocking)
    return x.to(device=device, non_blocking=non_blocking)


def batch_to_model(batch: dict[str, torch.Tensor], model: torch.nn.Module, non_blocking: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a batch (a training step's, a batch builder's keys) through :func:`to_model`."""
    return {key: to_model(value, model, non_blocking) for key, value in batch.items()}


def place_model(model: torch.nn.Module, device: torch.device | str = "cpu", precision: str = "fp32") -> torch.nn.Module:
    """The model moved to ``device`` (a torch device, or a name :func:`resolve_device` takes: ``auto``, ``cuda:1``) with
    its weights in ``precision`` (fp32, bf16, fp16), in place; returned."""
    if precision not in PRECISIONS:
        raise DeviceError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    device = resolve_device(device) if isinstance(device, str) else device
    if device.type == "cuda" and precision == "fp32":
        # fp32 means fp32: cuDNN's convolutions default to TF32 (10-bit mantissa) on Ampere and later, which moves
        # scores by ~1e-3 and flips near-tied benchmark items; scoring must give the CPU's (the official) figures
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return model.to(device=device, dtype=PRECISIONS[precision])


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs); [] without CUDA."""
    if not torch.cuda.is_available():
        return []
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named or [str(i) for i in range(torch.cuda.device_count())]


class DeviceSlots:
    """``parallel`` places for runs, dealt over the machine's GPUs in turn (8 GPUs, parallel 8: one run per GPU;
    parallel 16: two per GPU); on a machine without GPUs every place is the CPU (None). A run holds its place
    while it trains, so no two runs of one place overlap beyond ``parallel`` / GPUs per GPU."""

    def __init__(self, parallel: int, gpus: list[str] | None = None):
        gpus = visible_gpus() if gpus is None else gpus
        self._free: queue.Queue = queue.Queue()
        for k in range(parallel):
            self._free.put(gpus[k % len(gpus)] if gpus else None)

    @contextlib.contextmanager
    def take(self):
        device = self._free.get()
        try:
            yield device
        finally:
            self._free.put(device)
