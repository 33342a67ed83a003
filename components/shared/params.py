"""The one parameter schema of c2lip: loading and validation (the models live in params_data.py,
params_train.py and params_eval.py, by stage, and are re-exported here).

Every stage reads ``params/<stage>.yaml`` through :func:`load_params`, which validates it against the
pydantic models below before any work starts. The same models feed three consumers (docs/architecture.md):
DVC tracks the YAML keys (tests check that every key in dvc.yaml exists here), Prefect flow parameters are
typed with them, and :func:`flatten_params` turns them into MLflow params.

The defaults live here and only here: a stage's shipped YAML states them again for the reader, and a test
checks that it never disagrees with them (base.yaml and the presets are variants: they say what differs).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

# the schema, by stage, re-exported here: stages import every params name from this module
from components.shared.params_base import PARAMS_DIR, ROOT, SHAPESWORLD_SUITE, SHAPESWORLD_ZERO_SHOT_TEMPLATES, ParamsError, Strict  # noqa: F401
from components.shared.params_data import CaptionsParams, ConceptsParams, DownloadParams, PhraseRules, ShapesWorldParams, TableSourceParams, WebDatasetSourceParams  # noqa: F401
from components.shared.params_eval import (  # noqa: F401
    AroParams,
    BenchmarkSource,
    BenchmarksParams,
    CompareArm,
    CompareParams,
    EvalModelSpec,
    EvaluateParams,
    HardPositivesParams,
    PromotionGates,
    RegistryParams,
    RetrievalParams,
    SugarCrepeParams,
    SugarCrepePPParams,
    SuiteParams,
    WinogroundParams,
    WorldDifficulty,
    ZeroShotParams,
)
from components.shared.params_train import CLICParams, HardExampleParams, MethodParams, ModelParams, OptimParams, SentenceSamplingParams, TrainDataParams, TrainParams  # noqa: F401

STAGES: dict[str, type[Strict]] = {
    "captions": CaptionsParams, "concepts": ConceptsParams, "train": TrainParams, "base": TrainParams,
    "benchmarks": BenchmarksParams, "evaluate": EvaluateParams, "registry": RegistryParams, "compare": CompareParams,
}


# --------------------------------------------------------------------------------------------------
# loading, errors, flattening
# --------------------------------------------------------------------------------------------------


def _format_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: {err.error_count()} invalid value(s)"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = "" if e["type"] == "missing" else f" (got {e['input']!r})"
        if len(got) > 120:
            got = got[:117] + "...)"
        lines.append(f"  {loc}: {msg}{got}")
    return "\n".join(lines)


def read_yaml(path: Path | str) -> Any:
    """A params YAML's data (an empty file is an empty mapping); a missing file or bad YAML is a ParamsError."""
    if not Path(path).is_file():
        raise ParamsError(f"{path}: params file not found")
    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None


def deep_merge(base: dict, change: dict) -> dict:
    """``base`` with ``change`` merged in, mappings recursively (a list or value replaces); neither is modified."""
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else copy.deepcopy(value)
    return out


def validate_params(stage: str, data: Any, source: Path | str = "<params>") -> Strict:
    """Validate a params mapping for ``stage``; raises :class:`ParamsError` naming file, key path, reason."""
    if stage not in STAGES:
        raise ParamsError(f"{source}: unknown stage {stage!r}; known stages: {sorted(STAGES)}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: expected a mapping of keys at the top level, got {type(data).__name__}")
    try:
        return STAGES[stage].model_validate(data)
    except ValidationError as err:
        raise ParamsError(_format_error(Path(source), err)) from None


def load_params(stage: str, path: Path | str | None = None) -> Strict:
    """Read and validate ``params/<stage>.yaml`` (or ``path``) before any work is done."""
    path = Path(path) if path is not None else PARAMS_DIR / f"{stage}.yaml"
    return validate_params(stage, read_yaml(path), path)


def flatten_params(model: BaseModel, prefix: str = "") -> dict[str, str]:
    """Dotted-key strings of every value (MLflow params): ``{"shapesworld.image_size": "64", ...}``."""
    flat: dict[str, str] = {}
    for name, value in model:
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            flat.update(flatten_params(value, key + "."))
        elif isinstance(value, dict):
            for k, v in value.items():
                flat[f"{key}.{k}"] = str(list(v) if isinstance(v, tuple) else v)
        else:
            flat[key] = str(list(value) if isinstance(value, tuple) else value)
    return flat
