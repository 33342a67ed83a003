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
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch

from components.shared.atomic import CHECKSUMS_FILE, CorruptFileError, atomic_write_bytes, atomic_write_json, checksum_problem, sha256_file, write_checksums
from components.shared.written import Ledger, check_replaceable, files_under, named, replace_folder

EXPORT_CONFIG = "open_clip_config.json"
EXPORT_WEIGHTS = "open_clip_model.safetensors"
RNG_FILE = "rng_rank{rank}.pt"
HISTORY_FILE = "loss_history.json"
LAUNCH_FILE = "launch.json"  # {"processes": W, "micro_batch": m}: the launch that wrote the checkpoint


def latest_tag(ckpt_dir: Path) -> str | None:
    latest = ckpt_dir / "latest"
    return latest.read_text().strip() if latest.is_file() else None


CHECKPOINTS_STAGE = "train"  # its record in the checkpoints folder: .c2lip-train-outputs.json


def checkpoints_record(ckpt_dir: Path) -> Ledger:
    """What the train stage wrote in ``ckpt_dir``: each finished checkpoint's files with their SHA256 (from its
    checksums), DeepSpeed's ``latest`` pointer, and the checkpoint folders it is still writing."""
    return Ledger(ckpt_dir, CHECKPOINTS_STAGE)


def record_checkpoint(ckpt_dir: Path, tag: str) -> None:
    """A finished checkpoint on the record: its files by the checksums just written (not hashed twice), DeepSpeed's
    ``latest`` pointer and conversion script beside it."""
    sums = json.loads((ckpt_dir / tag / CHECKSUMS_FILE).read_text())
    record = checkpoints_record(ckpt_dir)
    record.add({f"{tag}/{k}": v for k, v in sums.items()} | {f"{tag}/{CHECKSUMS_FILE}": sha256_file(ckpt_dir / tag / CHECKSUMS_FILE)},
               done=tag)
    record.record(n for n in ("latest", "zero_to_fp32.py") if (ckpt_dir / n).is_file())


def prune_checkpoints(ckpt_dir: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` step directories (never the one ``latest`` names): only the files the
    record lists unchanged; anything else in a pruned folder is kept and named."""
    current = latest_tag(ckpt_dir)
    tags = sorted(p.name for p in ckpt_dir.glob("step*") if p.is_dir())
    record = checkpoints_record(ckpt_dir)
    for tag in tags[:-keep]:
        if tag != current:
            _, kept = record.remove_files(under=tag)
            if kept or (ckpt_dir / tag).exists():
                left = kept or [f"{tag}/{f}" for f in files_under(ckpt_dir / tag)]
                print(f"{ckpt_dir}: kept {len(left)} file(s) of pruned {tag} the train stage has no record of writing "
                      f"unchanged: {named(left)}", file=sys.stderr)


def remove_checkpoints(ckpt_dir: Path) -> None:
    """A run that starts afresh: every checkpoint file the record lists unchanged, and the folders a killed save
    left unfinished; anything else stays and is named."""
    if not ckpt_dir.is_dir():
        return
    _, kept = checkpoints_record(ckpt_dir).remove_files()
    left = sorted(set(kept) | {f for f in files_under(ckpt_dir) if not f.startswith(".c2lip-")})
    if left:
        print(f"{ckpt_dir}: kept {len(left)} file(s) the train stage has no record of writing unchanged: {named(left)}",
              file=sys.stderr)


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
                    figures: dict | None = None, history: list[dict] | None = None, launch: dict | None = None) -> None:
    """DeepSpeed's checkpoint of step ``step``; each rank's RNG state (and rank 0's loss history and the launch's
    shape, :data:`LAUNCH_FILE`) is written first, so the ``latest`` pointer DeepSpeed writes last never names an
    incomplete checkpoint."""
    tag = f"step{step:08d}"
    if main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        checkpoints_record(ckpt_dir).begin_folder(tag)  # an unfinished save is the stage's to remove
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    (ckpt_dir / tag).mkdir(parents=True, exist_ok=True)
    if main and history is not None:
        atomic_write_json(ckpt_dir / tag / HISTORY_FILE, history)
    if main and launch is not None:
        atomic_write_json(ckpt_dir / tag / LAUNCH_FILE, launch)
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    atomic_write_bytes(ckpt_dir / tag / RNG_FILE.format(rank=rank), buf.getvalue())
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step, "figures": figures or {}})
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank's files are on disk before rank 0 sums them
    if main:
        write_checksums(ckpt_dir / tag)  # last: a checkpoint without them is never resumed from
        record_checkpoint(ckpt_dir, tag)
        prune_checkpoints(ckpt_dir, keep)


def launch_of(checkpoint: Path) -> dict:
    """The processes and micro-batch a checkpoint was written by ({} for one written before they were recorded)."""
    path = Path(checkpoint) / LAUNCH_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


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
        listed = json.loads((folder / CHECKSUMS_FILE).read_text())
        if unlisted := [name for name in (EXPORT_CONFIG, EXPORT_WEIGHTS) if name not in listed]:  # `{}` checks nothing
            raise CorruptFileError(f"{folder / CHECKSUMS_FILE}: does not list {', '.join(unlisted)}; the export's files "
                                   "cannot be checked (export it again)")
    else:
        print(f"{folder}: no {CHECKSUMS_FILE} (an export made elsewhere): its files cannot be checked against what "
              "was written", file=sys.stderr)
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
    out_dir = Path(out_dir)
    check_replaceable(out_dir, "export")  # before any work: only an export of ours (its checksums) is replaced
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.c2lip-build-", dir=out_dir.parent))
    try:
        _write_export(model, name, tmp, dtype, model_cfg, tokenizer)
        replace_folder(tmp, out_dir, "export")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write_export(model: torch.nn.Module, name: str, tmp: Path, dtype: str, model_cfg: dict | None, tokenizer) -> None:
    from safetensors.torch import save_file

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


# --------------------------------------------------------------------------------------------------
# where a run starts: every rank reads the same checkpoints, and a relaunch on another process count
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartState:
    """What a rank reads from the output folder to decide where the run starts; every rank must read the same."""

    same_run: bool  # the fingerprint file matches these params
    resume_tag: str | None  # the newest intact checkpoint (when same_run)
    damaged: tuple[str, ...]
    unfinished: bool  # only checkpoints whose save never finished (a kill during the first one)


def start_state(output_dir: Path, current: str) -> StartState:
    """What this rank reads in ``output_dir``: whether the fingerprint file matches ``current`` and the checkpoint to resume."""
    ckpt_dir, fp_file = output_dir / "checkpoints", output_dir / "_fingerprint.json"
    same_run = fp_file.is_file() and json.loads(fp_file.read_text()).get("fingerprint") == current
    resume_tag, damaged = intact_checkpoint(ckpt_dir) if same_run else (None, [])
    unfinished = same_run and resume_tag is None and only_unfinished(ckpt_dir)
    return StartState(same_run and not unfinished, resume_tag, tuple(damaged), unfinished)


def agree_on_start(state: StartState, output_dir: Path) -> None:
    """Every rank decides from the same files, or none trains: a node that sees other checkpoints (no shared
    filesystem) would start afresh while the others resume, and the collectives would wait forever. Then, on every
    rank alike: a run of these params whose every checkpoint is damaged stops (damage to look at, not a kill)."""
    world = torch.distributed.get_world_size()
    if world > 1:
        views: list = [None] * world
        torch.distributed.all_gather_object(views, (os.uname().nodename, state))
        if any(view[1] != views[0][1] for view in views):
            seen = "; ".join(f"rank {r} on {host}: " + (f"resume {s.resume_tag}" if s.resume_tag else "no checkpoint to resume")
                             for r, (host, s) in enumerate(views))
            raise CheckpointsDisagree(f"the ranks see different checkpoints in {output_dir} ({seen}). Every node must see the same "
                                      "output_dir: put it on a filesystem the nodes share (NFS, Lustre, a mounted bucket); "
                                      "nothing was changed")
    ckpt_dir = output_dir / "checkpoints"
    if state.damaged and torch.distributed.get_rank() == 0:
        print(f"warning: skipped damaged checkpoint(s): {'; '.join(state.damaged)}", file=sys.stderr, flush=True)
    if state.same_run and state.damaged and state.resume_tag is None:
        raise CorruptFileError(f"no intact checkpoint to resume from in {ckpt_dir}: {'; '.join(state.damaged)}. "
                               f"Remove {ckpt_dir} to start this run afresh.")


class CheckpointsDisagree(RuntimeError):
    pass


def check_resumable_launch(checkpoint: Path, world: int) -> None:
    """A checkpoint written by another number of processes resumes where its optimiser state is whole: ZeRO 0 in fp32
    keeps one copy. ZeRO 1 and 2, and DeepSpeed's bf16 optimiser at any stage, keep a shard per process
    (``*zero_pp_rank_<r>_*optim_states.pt``); DeepSpeed's re-splitting of them (its elastic layout) did not give back
    the optimiser's exact state here (docs/gpus.md), so that relaunch refuses, keeping everything."""
    shards = len(list(checkpoint.glob("*zero_pp_rank_*_optim_states.pt")))
    if not shards or shards == world:
        return
    raise CorruptFileError(f"{checkpoint} holds an optimiser state split {shards} ways (ZeRO 1/2 or bf16, one shard per process); "
                           f"this run has {world} processes. Relaunch on {shards} processes (--set processes={shards} or the "
                           "launcher's count) to resume it; a run on ZeRO 0 in fp32 resumes on any number (nothing was changed)")


def resume_or_start(engine, output_dir: Path, state: StartState, current: str, micro_batch: int) -> tuple[int, dict]:
    """Load ``state``'s checkpoint into ``engine`` (weights, optimiser, schedule, this rank's RNG state) and return its
    step and recorded figures; without one, rank 0 removes what the stage wrote for other params and records the
    fingerprint ``current``. Says in one line when the checkpoint was written by another launch shape."""
    import logging

    from components.shared.safe_load import load_torch_file

    log = logging.getLogger("c2lip.train")
    ckpt_dir, rank = output_dir / "checkpoints", torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    if state.resume_tag is not None:
        _, client = engine.load_checkpoint(str(ckpt_dir), tag=state.resume_tag)
        start_step = int(client["step"])
        rng_file = ckpt_dir / state.resume_tag / RNG_FILE.format(rank=rank)
        if rng_file.is_file():
            set_rng_state(load_torch_file(rng_file))
        if rank == 0:
            log.info("resumed from %s at step %d", ckpt_dir / state.resume_tag, start_step)
            was = launch_of(ckpt_dir / state.resume_tag)
            if was and (was["processes"], was["micro_batch"]) != (world, micro_batch):
                log.info("the checkpoint was written by %d process(es) × micro-batch %d, this run has %d × %d: it goes on from "
                         "step %d with the data order of a %d-process run (the loss sees %d samples per micro-step, was %d)",
                         was["processes"], was["micro_batch"], world, micro_batch, start_step, world,
                         world * micro_batch, was["processes"] * was["micro_batch"])
        return start_step, client.get("figures", {})
    if rank == 0:
        if ckpt_dir.exists():
            log.info("no checkpoint in %s was finished before the run stopped: starting afresh" if state.unfinished else
                     "checkpoints in %s belong to other params: starting afresh", ckpt_dir)
            remove_checkpoints(ckpt_dir)
        atomic_write_json(output_dir / "_fingerprint.json", {"fingerprint": current})
    return 0, {}
