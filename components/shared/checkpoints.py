"""Checkpoints and exports of the train stage.

A checkpoint is DeepSpeed's (model, optimiser, scheduler) in ``checkpoints/step<N>/`` with each rank's
RNG state and rank 0's loss history beside it, written before DeepSpeed's ``latest`` pointer so that the
pointer never names an incomplete checkpoint. An export is ``open_clip_config.json`` +
``open_clip_model.safetensors`` in a folder, loadable with ``open_clip.create_model_and_transforms(
"local-dir:<folder>")``; the evaluate stage, the registry and the comparison read it by these names.
"""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch

from components.shared.atomic import CHECKSUMS_FILE, CorruptFileError, atomic_write_bytes, atomic_write_json, checksum_problem, remove_inside, write_checksums

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
            remove_inside(ckpt_dir, tag)


def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain values only, so that it loads with ``weights_only``
    (a pickled numpy array would need numpy's reconstructor, i.e. code, to load)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
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
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank's files are on disk before rank 0 sums them
    if main:
        write_checksums(ckpt_dir / tag)  # last: a checkpoint without them is never resumed from
        prune_checkpoints(ckpt_dir, keep)


def intact_checkpoint(ckpt_dir: Path) -> tuple[str | None, list[str]]:
    """The newest checkpoint whose files all match the checksums written with it, and what is wrong with
    each newer one (a kill between DeepSpeed's save and the checksums, a truncated or changed file): a
    resumed run falls back to the last intact checkpoint instead of failing on the latest."""
    problems = []
    for tag in sorted((p.name for p in Path(ckpt_dir).glob("step*") if p.is_dir()), reverse=True):
        problem = checksum_problem(Path(ckpt_dir) / tag)
        if problem is None:
            return tag, problems
        problems.append(problem)
    return None, problems


def only_unfinished(ckpt_dir: Path) -> bool:
    """Whether every checkpoint folder in ``ckpt_dir`` lacks its checksums: the run was killed while writing its
    first one, so nothing finished is there to lose (a finished checkpoint whose files changed is another matter)."""
    folders = [p for p in Path(ckpt_dir).glob("step*") if p.is_dir()]
    return bool(folders) and not any((p / CHECKSUMS_FILE).is_file() for p in folders)


def check_export(folder: Path) -> Path:
    """``folder`` if it is a finished, intact export; else :class:`CorruptFileError` naming the file. The
    checksums written with an export are verified when present (an export from elsewhere may lack them);
    the weights must open as safetensors either way (a truncated file does not)."""
    from safetensors import safe_open

    folder = Path(folder)
    for name in (EXPORT_CONFIG, EXPORT_WEIGHTS):
        if not (folder / name).is_file():
            raise CorruptFileError(f"{folder / name}: missing (not an open_clip export folder)")
    if (folder / CHECKSUMS_FILE).is_file():
        problem = checksum_problem(folder)
        if problem:
            raise CorruptFileError(problem)
    try:
        json.loads((folder / EXPORT_CONFIG).read_text())
        with safe_open(str(folder / EXPORT_WEIGHTS), framework="pt") as weights:
            weights.keys()
    except Exception as err:  # safetensors and json raise their own error types
        raise CorruptFileError(f"{folder}: unreadable export ({str(err).splitlines()[0][:200]})") from None
    return folder


def refuse_export_code(folder: Path, setting: str) -> None:
    """Raise RemoteCodeRefused when an export's config names a Hugging Face text tower (or tokenizer) that ships
    its own code, or the export folder's saved tokenizer does: open_clip builds the tower through transformers
    without ``trust_remote_code``, which would ask on stdin (:func:`~components.shared.safe_load.refuse_remote_code`)."""
    from components.shared.safe_load import refuse_remote_code

    folder = Path(folder)
    text_cfg = json.loads((folder / EXPORT_CONFIG).read_text()).get("model_cfg", {}).get("text_cfg", {})
    for key in ("hf_model_name", "hf_tokenizer_name"):
        if text_cfg.get(key):
            refuse_remote_code(str(text_cfg[key]), f"{setting}: {folder / EXPORT_CONFIG} {key}")
    refuse_remote_code(str(folder), f"{setting}: export")


def check_weights_file(path: Path) -> Path:
    """A checkpoint file named as an init: it must open (safetensors: its header; a torch file: loaded weights-only,
    so a crafted pickle is refused too). Raises CorruptFileError naming the file and what is wrong."""
    from components.shared.safe_load import UnsafeCheckpointError, load_torch_file

    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as weights:
                weights.keys()
        else:
            load_torch_file(path)
    except UnsafeCheckpointError as err:
        raise CorruptFileError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
        raise CorruptFileError(f"{path}: not a readable checkpoint ({str(err).splitlines()[0][:200]})") from None
    return path


def export_model(model: torch.nn.Module, name: str, out_dir: Path, dtype: str = "float32", model_cfg: dict | None = None,
                 tokenizer=None) -> Path:
    """open_clip_config.json (model + preprocess config) and open_clip_model.safetensors, written to a
    temporary directory and renamed into place. Loads with ``open_clip.create_model_and_transforms(
    "local-dir:<out_dir>")``, or ``(name, pretrained=<out_dir>/open_clip_model.safetensors)`` for a name
    open_clip knows. ``model_cfg``: the config the model was built from when it is not the named one (a Hugging
    Face text tower); ``tokenizer``: an open_clip HFTokenizer, saved into the folder, where ``local-dir:``
    loading looks for it."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    remove_inside(out_dir.parent, tmp.name)  # a killed export's leftovers
    tmp.mkdir(parents=True)
    model_cfg = dict(model_cfg or open_clip.get_model_config(name))
    if "hf_model_name" in model_cfg.get("text_cfg", {}):
        # the weights below hold the tower: a reload builds it from its config, never downloads weights
        model_cfg["text_cfg"] = {**model_cfg["text_cfg"], "hf_model_pretrained": False}
    if tokenizer is not None and hasattr(tokenizer, "tokenizer") and hasattr(tokenizer.tokenizer, "save_pretrained"):
        tokenizer.tokenizer.save_pretrained(str(tmp))
    # the 1-dim logit scale/bias are a DeepSpeed need; open_clip reshapes them into a default model
    model_cfg.pop("nonscalar_logit_scale", None)
    preprocess = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    atomic_write_json(tmp / EXPORT_CONFIG, {"model_cfg": model_cfg, "preprocess_cfg": preprocess, "architecture": name})
    cast = getattr(torch, dtype)
    state = {k: (v.to(cast) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / EXPORT_WEIGHTS), metadata={"architecture": name})
    write_checksums(tmp)  # last: an export without them was never finished
    remove_inside(out_dir.parent, out_dir.name)
    os.replace(tmp, out_dir)
    return out_dir
