"""Loading torch files without running code from them.

``torch.load(..., weights_only=False)`` unpickles arbitrary objects, so a crafted checkpoint (named in
params, or pulled from a shared DVC remote) runs code on load. Everything c2lip loads goes through
:func:`load_torch_file`: ``weights_only=True`` with only the few DeepSpeed data classes its optimiser
checkpoints hold allow-listed (plain classes and an enum restored from their fields; no callables).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch


class UnsafeCheckpointError(ValueError):
    """A torch file holds something other than tensors, plain containers and the allow-listed classes."""


def _deepspeed_classes() -> list[type]:
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:  # evaluate alone needs no DeepSpeed
        return []
    return [LossScaler, ZeroStageEnum, fragment_address]


def load_torch_file(path: Path | str, map_location: Any = "cpu") -> Any:
    """``torch.load`` restricted to tensors, plain containers and DeepSpeed's checkpoint classes; anything
    else (a pickled function call, an unknown class) is refused with :class:`UnsafeCheckpointError` naming
    the file, before any of it runs."""
    try:
        with torch.serialization.safe_globals(_deepspeed_classes()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:  # torch's weights-only unpickler refused something
        lines = [line.strip() for line in str(err).split("\n") if line.strip()]
        what = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), lines[-1] if lines else "")
        raise UnsafeCheckpointError(f"{path}: refused to load: it holds more than weights ({what[:200]}); "
                                    "c2lip never unpickles code from a checkpoint") from None
    except Exception as err:  # truncated, not a torch file at all
        raise UnsafeCheckpointError(f"{path}: not a readable torch file ({str(err).splitlines()[0][:200]})") from None


def guard_deepspeed_loads(engine) -> None:
    """Make DeepSpeed's checkpoint loading use :func:`load_torch_file` (its own engine calls
    ``torch.load(weights_only=False)`` on every model and optimiser state file)."""
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    if checkpoint_engine is None:
        raise RuntimeError("DeepSpeed engine has no checkpoint_engine: cannot guard its checkpoint loads")
    checkpoint_engine.load = lambda path, map_location=None: load_torch_file(path, map_location)


# --------------------------------------------------------------------------------------------------
# Hugging Face models: never their own Python code unless a param says so
# --------------------------------------------------------------------------------------------------

# The files in which a model folder or hub repository asks transformers to import its own modules ("auto_map").
_CODE_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
                 "image_processor_config.json", "feature_extractor_config.json")


class RemoteCodeRefused(ValueError):
    """A Hugging Face model asks to run its own code and no param allows it."""


def custom_code_request(name: str) -> str | None:
    """The first file of model ``name`` (a local folder, or a hub name read from the local cache) whose
    ``auto_map`` would make transformers import the model's own Python modules; None when there is none."""
    import json

    folder = Path(name)
    for file in _CODE_CONFIGS:
        if folder.is_dir():
            path = folder / file
        else:
            try:
                from huggingface_hub import try_to_load_from_cache

                cached = try_to_load_from_cache(name, file)
            except Exception:  # noqa: BLE001 - not a valid repo id: transformers names the problem when it loads
                cached = None
            path = Path(cached) if isinstance(cached, str) else None
        if path is None or not path.is_file():
            continue
        try:
            content = json.loads(path.read_text(errors="replace"))
        except ValueError:
            continue  # transformers reports an unreadable config itself
        if isinstance(content, dict) and content.get("auto_map"):
            return str(path)
    return None


def refuse_remote_code(name: str, setting: str, allowed: bool = False) -> bool:
    """Raise :class:`RemoteCodeRefused` when model ``name`` (named by ``setting``) carries its own code and
    ``allowed`` is false; returns the ``trust_remote_code`` value to pass to every ``from_pretrained``.

    transformers left to itself (``trust_remote_code=None``) asks on standard input, so ``yes | make run``
    or an operator answering a prompt in a flow log would run the model's code: we decide instead."""
    if not allowed:
        found = custom_code_request(name)
        if found:
            raise RemoteCodeRefused(f"{setting} {name!r}: {found} asks to run the model's own Python code (auto_map); "
                                    "refused. c2lip runs a model's code only where a trust_remote_code: true param says so")
    return bool(allowed)
