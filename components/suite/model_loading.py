"""Loading a model to evaluate: an export folder (the train and base stages' ``export/``), a checkpoint file, an
MLflow registry or run URI (downloaded; it must hold an open_clip export) or an open_clip architecture + pretrained
tag; and the fingerprint of its weights that keys the results cache. The evaluate stage, the comparison and the study
tools (components/study/) load their models here."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from components.shared.atomic import CorruptFileError
from components.shared.checkpoints import EXPORT_CONFIG, check_export, refuse_export_code  # what our exports (and MLflow-registered models) hold
from components.shared.devices import place_model
from components.shared.params import EvalModelSpec
from components.shared.redact import one_line, redact
from components.shared.safe_load import RemoteCodeRefused, load_torch_file
from components.suite.loading import SuiteError


def _find_export(root: Path) -> Path | None:
    hits = sorted(root.rglob(EXPORT_CONFIG))
    return hits[0].parent if hits else None


NO_ALIAS_HINT = (": no such alias or model yet; a run registers its version as `challenger`, promote it first (the "
                 "c2lip/promote deployment, or `python -m components.register --promote challenger`)")


def model_found(spec: EvalModelSpec) -> None:
    """A cheap look before any work: a registered model's alias or version exists in the registry, a local folder or
    file exists (nothing is downloaded or loaded). Raises SuiteError naming the model and what is missing."""
    if spec.pretrained is not None or spec.uri.startswith("runs:/"):
        return  # an open_clip tag, a run's artifact: found when they are loaded
    if not spec.uri.startswith("models:/"):
        if not Path(spec.uri).exists():
            raise SuiteError(f"model {spec.name!r}: {spec.uri} is neither a folder, a file nor a models:/ URI (not found)")
        return
    from mlflow import MlflowClient

    from components.shared.tracking import default_tracking_uri

    ref = spec.uri[len("models:/"):]
    client = MlflowClient(tracking_uri=default_tracking_uri())
    try:
        if "@" in ref:
            client.get_model_version_by_alias(*ref.split("@", 1))
        elif "/" in ref and ref.split("/", 1)[1].isdigit():
            client.get_model_version(*ref.split("/", 1))
        else:
            return  # a stage name or "latest": MLflow resolves it on download
    except Exception as err:  # MLflow raises several types for an unknown name, alias or version
        hint = NO_ALIAS_HINT if "@" in ref else ": no such registered model or version"
        raise SuiteError(redact(f"model {spec.name!r}: {spec.uri}{hint} ({default_tracking_uri()}: {one_line(err)})")) from None


def resolve_model(spec: EvalModelSpec, download_dir: Path) -> tuple[str, Any]:
    """("export", folder) | ("checkpoint", file) | ("pretrained", (arch, tag)). An MLflow URI is downloaded
    and must contain an open_clip export (open_clip_config.json + weights)."""
    if spec.pretrained is not None:
        return "pretrained", (spec.arch, spec.pretrained)
    uri = spec.uri
    if uri.startswith("models:/") or uri.startswith("runs:/"):
        import mlflow

        from components.shared.tracking import default_tracking_uri

        mlflow.set_tracking_uri(default_tracking_uri())
        target = download_dir / spec.name
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(target)))
        except Exception as err:  # MLflow raises several types for an unknown name, alias or version
            hint = ""
            said = str(err)
            if "@" in uri and any(w in said for w in ("not found", "does not exist", "RESOURCE_DOES_NOT_EXIST")):  # champion, say
                hint = NO_ALIAS_HINT
            # the hint first: a one-line summary of this error (a failed flow run's state name) keeps its beginning
            raise SuiteError(redact(f"model {spec.name!r}: cannot download {uri}{hint} ({default_tracking_uri()}: {err})")) from None
        export = _find_export(local)
        if export is None:
            raise SuiteError(f"model {spec.name!r}: {uri} holds no {EXPORT_CONFIG} (not an open_clip export)")
        return "export", export
    path = Path(uri)
    if path.is_dir():
        if not (path / EXPORT_CONFIG).is_file():
            raise SuiteError(f"model {spec.name!r}: {path} has no {EXPORT_CONFIG}; an export folder is written by the train stage")
        return "export", path
    if path.is_file():
        if spec.arch is None:
            raise SuiteError(f"model {spec.name!r}: checkpoint file {path} needs 'arch' (its open_clip architecture)")
        return "checkpoint", path
    raise SuiteError(f"model {spec.name!r}: {uri} is neither a folder, a file nor a models:/ URI (not found)")


def model_fingerprint(kind: str, where: Any) -> str:
    digest = hashlib.sha256(kind.encode())
    if kind == "export":
        for file in sorted(Path(where).iterdir()):
            if file.is_file():
                digest.update(file.name.encode())
                digest.update(file.read_bytes())
    elif kind == "checkpoint":
        digest.update(Path(where).read_bytes())
    else:
        digest.update(json.dumps(where).encode())
    return digest.hexdigest()[:16]


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Weights of a checkpoint file: safetensors, a plain state dict, or one under 'state_dict' /
    'module' (DeepSpeed's mp_rank_00_model_states.pt) / 'model'; DDP's 'module.' prefix removed, and the train
    stage's 'model.' (its DeepSpeed module is the model with its loss)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        if not path.is_file():
            raise CorruptFileError(f"{path}: checkpoint file does not exist")
        try:
            state = load_file(str(path))
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types (truncated header, bad JSON, ...)
            raise CorruptFileError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:200]})") from None
    else:
        state = load_torch_file(path)  # weights only: a crafted checkpoint runs no code
        for key in ("state_dict", "module", "model"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not state:
        raise SuiteError(f"{path}: no state dict found in the checkpoint")
    prefix = "module."
    state = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
    # c2lip's own DeepSpeed checkpoints hold the TrainingModule (the model under "model.", the loss's buffers beside it)
    if any(k.startswith("model.") for k in state) and not any(k.startswith(("visual.", "text.", "transformer.")) for k in state):
        state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    return state


def load_model(kind: str, where: Any, spec: EvalModelSpec, device: torch.device | str = "cpu", precision: str = "fp32"):
    """(model in eval mode on ``device`` (a device, or a name such as ``auto``) with its weights in ``precision``,
    preprocess, tokenizer)."""
    import open_clip

    from components.method import models  # registers our tiny configs (and their timm towers)

    if kind == "export":
        check_export(Path(where))  # checksums and a readable safetensors file, else the file is named
        try:
            refuse_export_code(Path(where), f"model {spec.name!r}")
        except RemoteCodeRefused as err:
            raise SuiteError(str(err)) from None
        model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{where}")
        tokenizer = open_clip.get_tokenizer(f"local-dir:{where}")
    elif kind == "checkpoint":
        model, _, preprocess, tokenizer = models.create_model(spec.arch)
        state = load_state_dict(Path(where))
        for key in ("logit_scale", "logit_bias"):  # 0-dim in open_clip's own checkpoints, 1-dim in ours
            if key in state and hasattr(model, key):
                state[key] = state[key].reshape(getattr(model, key).shape)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing:
            raise SuiteError(f"model {spec.name!r}: {where} lacks {len(missing)} weights of {spec.arch} (first: {missing[:3]})")
        if unexpected:
            print(f"evaluate: {spec.name}: ignored {len(unexpected)} unexpected keys of {where} (first: {unexpected[:3]})", file=sys.stderr)
    else:
        arch, tag = where
        try:
            model, _, preprocess, tokenizer = models.create_model(arch, pretrained=tag)
        except Exception as err:  # the hub is unreachable offline; say so plainly
            raise SuiteError(f"model {spec.name!r}: open_clip cannot load {arch} / {tag}: {err}") from None
    return place_model(model.eval(), device, precision), preprocess, tokenizer
