"""Checkpoints and exports of the train stage.

A checkpoint is DeepSpeed's (model, optimiser, scheduler) in ``checkpoints/step<N>/`` with each rank's
RNG state and rank 0's loss history beside it, written before DeepSpeed's ``latest`` pointer so that the
pointer never names an incomplete checkpoint. An export is ``open_clip_config.json`` +
``open_clip_model.safetensors`` in a folder, loadable with ``open_clip.create_model_and_transforms(
"local-dir:<folder>")``; the evaluate stage, the registry and the comparison read it by these names.
"""

from __future__ import annotations

import io
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch

from components.shared.atomic import atomic_write_bytes, atomic_write_json

EXPORT_CONFIG = "open_clip_config.json"
EXPORT_WEIGHTS = "open_clip_model.safetensors"
RNG_FILE = "rng_rank{rank}.pt"
HISTORY_FILE = "loss_history.json"


def latest_tag(ckpt_dir: Path) -> str | None:
    latest = ckpt_dir / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def prune_checkpoints(ckpt_dir: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` step directories (never the one ``latest`` names)."""
    current = latest_tag(ckpt_dir)
    tags = sorted(p.name for p in ckpt_dir.glob("step*") if p.is_dir())
    for tag in tags[:-keep]:
        if tag != current:
            shutil.rmtree(ckpt_dir / tag, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(engine, ckpt_dir: Path, step: int, rank: int, keep: int, main: bool,
                    figures: dict | None = None, history: list[dict] | None = None) -> None:
    """DeepSpeed's checkpoint of step ``step``; each rank's RNG state (and rank 0's loss history) is
    written first, so the ``latest`` pointer DeepSpeed writes last never names an incomplete checkpoint."""
    tag = f"step{step:08d}"
    (ckpt_dir / tag).mkdir(parents=True, exist_ok=True)
    if main and history is not None:
        atomic_write_json(ckpt_dir / tag / HISTORY_FILE, history)
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    atomic_write_bytes(ckpt_dir / tag / RNG_FILE.format(rank=rank), buf.getvalue())
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step, "figures": figures or {}})
    if main:
        prune_checkpoints(ckpt_dir, keep)


def export_model(model: torch.nn.Module, name: str, out_dir: Path, dtype: str = "float32") -> Path:
    """open_clip_config.json (model + preprocess config) and open_clip_model.safetensors, written to a
    temporary directory and renamed into place. Loads with ``open_clip.create_model_and_transforms(
    "local-dir:<out_dir>")``, or ``(name, pretrained=<out_dir>/open_clip_model.safetensors)`` for a name
    open_clip knows."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model_cfg = open_clip.get_model_config(name)
    # the 1-dim logit scale/bias are a DeepSpeed need; open_clip reshapes them into a default model
    model_cfg.pop("nonscalar_logit_scale", None)
    preprocess = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    atomic_write_json(tmp / EXPORT_CONFIG, {"model_cfg": model_cfg, "preprocess_cfg": preprocess, "architecture": name})
    cast = getattr(torch, dtype)
    state = {k: (v.to(cast) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / EXPORT_WEIGHTS), metadata={"architecture": name})
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir
