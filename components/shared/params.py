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
import fcntl
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

# the schema, by stage, re-exported here: stages import every params name from this module
from components.shared.params_base import OVERRIDES_JOURNAL, PARAMS_DIR, ROOT, RUN_LOCK, SHAPESWORLD_SUITE, SHAPESWORLD_ZERO_SHOT_TEMPLATES, ParamsError, Strict  # noqa: F401
from components.shared.params_data import (  # noqa: F401
    CaptionsParams,
    ConceptsParams,
    DownloadParams,
    PhraseRules,
    ShapesWorldParams,
    TableSourceParams,
    WebDatasetSourceParams,
)
from components.shared.params_eval import (  # noqa: F401
    AroParams,
    BenchmarkSource,
    BenchmarksParams,
    CompareArm,
    CompareParams,
    EvalModelSpec,
    EvaluateParams,
    HardPositivesParams,
    LongCaptionsParams,
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
from components.shared.params_models import DEFAULT_EXTRACTION_PROMPT, HFGenerationParams, LlmExtractorParams, RecaptionParams, TransformersCaptionerParams  # noqa: F401
from components.shared.params_train import (  # noqa: F401
    CLICParams,
    HardExampleParams,
    HFTextTowerParams,
    MethodParams,
    ModelParams,
    OptimParams,
    SentenceSamplingParams,
    TrainDataParams,
    TrainParams,
)

STAGES: dict[str, type[Strict]] = {
    "captions": CaptionsParams, "recaption": RecaptionParams, "concepts": ConceptsParams, "train": TrainParams, "base": TrainParams,
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


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently). Merge
    keys (``<<: *defaults``) work as in YAML: a key written in the mapping overrides the one merged in."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<': merged by flatten_mapping, not a key of its own
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep)


# A params file may name the file it extends (a path relative to its own folder): the parent's mapping, with this
# file's mapping merged over it by deep_merge, is what the file says. Resolved before validation, so pydantic sees
# (and names errors in) the whole.
EXTENDS = "extends"


def _read_one(path: Path | str) -> Any:
    if not Path(path).is_file():
        raise ParamsError(f"{path}: params file not found")
    try:
        text = Path(path).read_text()
        data = yaml.load(text, Loader=_StrictLoader)
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        # the problem and where, never the file's text: a line of a file named by mistake may hold a secret
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ParamsError(f"{path}: not valid YAML: {getattr(err, 'problem', None) or type(err).__name__}{where}") from None
    if data is None:
        raise ParamsError(f"{path}: no params in the file (empty or only comments); write `{{}}` to run on every default")
    return data


def extends_chain(path: Path | str) -> list[Path]:
    """The files ``path``'s mapping is built from, itself first, then what it extends, and so on; a missing parent,
    a cycle or an ``extends`` that is not a file name is a ParamsError naming the file."""
    chain = [Path(path)]
    while True:
        data = _read_one(chain[-1])
        if not isinstance(data, dict) or EXTENDS not in data:
            return chain
        parent = data[EXTENDS]
        if not isinstance(parent, str) or not parent.strip():
            raise ParamsError(f"{chain[-1]}: {EXTENDS}: expected the path of the params file it extends, got {parent!r}")
        parent_path = chain[-1].parent / parent
        if any(parent_path.resolve() == seen.resolve() for seen in chain):
            cycle = " -> ".join(str(p) for p in (*chain, parent_path))
            raise ParamsError(f"{chain[-1]}: {EXTENDS}: {parent!r} closes a cycle ({cycle})")
        if not parent_path.is_file():
            raise ParamsError(f"{chain[-1]}: {EXTENDS}: {parent!r} not found ({parent_path}; the path is relative to the file's folder)")
        # a params file extends another params file, never /proc/self/environ or another file of the machine's
        if parent_path.resolve().suffix not in (".yaml", ".yml"):
            raise ParamsError(f"{chain[-1]}: {EXTENDS}: {parent!r} is not a params file (.yaml or .yml); nothing else is read")
        chain.append(parent_path)


def read_yaml(path: Path | str) -> Any:
    """A params YAML's data, with what it extends merged under it (:data:`EXTENDS`: mappings merged, lists and values
    replaced). A missing file, bad YAML, a key given twice, or a file with no document at all (empty or only
    comments: a truncated or wrong file, which would otherwise run on every default) is a ParamsError naming the
    file; ``{}`` states "all defaults" explicitly."""
    merged: Any = None
    for file in reversed(extends_chain(path)):
        data = _read_one(file)
        if merged is None:
            merged = data
            continue
        if not isinstance(data, dict) or not isinstance(merged, dict):
            raise ParamsError(f"{file}: {EXTENDS}: both files must hold a mapping of keys at the top level")
        merged = deep_merge(merged, data)
    if isinstance(merged, dict):
        merged.pop(EXTENDS, None)
    return merged


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


def load_params(stage: str, path: Path | str | None = None, overrides: list[str] | None = None) -> Strict:
    """Read and validate ``params/<stage>.yaml`` (or ``path``) before any work is done; ``overrides``: ``key.sub=value``
    strings (a command line's ``--set``), each value read as YAML, applied over the file's values."""
    path = Path(path) if path is not None else PARAMS_DIR / f"{stage}.yaml"
    _refuse_interrupted_overrides(path)
    data = read_yaml(path)
    for item in overrides or []:
        data = deep_merge(data if isinstance(data, dict) else {}, override_of(item))
    source = f"{path} (with --set {' --set '.join(overrides)})" if overrides else path
    return validate_params(stage, data, source)


def override_of(item: str) -> dict:
    """``"a.b=3"`` → ``{"a": {"b": 3}}`` (the value read as YAML: numbers, booleans, lists)."""
    key, sep, text = item.partition("=")
    if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
        raise ParamsError(f"--set {item!r}: expected KEY=VALUE with a dotted key of the params file (micro_batch=48, data.workers=4)")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ParamsError(f"--set {item!r}: the value is not a YAML value") from None
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _refuse_interrupted_overrides(path: Path) -> None:
    """A flow run journals the params files it overrides; when the journal is there but no run holds the
    workspace lock, the run was killed and ``params/`` still holds its overrides: refuse to use them."""
    journal = ROOT / OVERRIDES_JOURNAL
    if not journal.is_file() or Path(path).resolve().parent != PARAMS_DIR.resolve():
        return
    with open(ROOT / RUN_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live flow run applied them: this stage is part of it
        fcntl.flock(handle, fcntl.LOCK_UN)
    raise ParamsError(f"{path}: params/ still holds the overrides of an interrupted flow run (originals in {journal}); "
                      "`python -m flows.workspace --restore` puts them back (any flow run does it first)")


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


# --------------------------------------------------------------------------------------------------
# python -m components.shared.params show PRESET: a preset as the stage reads it
# --------------------------------------------------------------------------------------------------

_COMMAND = re.compile(r"#.*?(?:-m|--module) components\.(\w+)")
# a stage whose module has another name (components.register reads params/registry.yaml)
MODULE_STAGES = {"register": "registry"}


def stage_of_file(path: Path | str) -> str:
    """The stage a params file is for: ``params/<stage>.yaml``'s name, else the command its first line names
    (``# python -m components.<stage> --params ...``, the presets' rule), the nearest file of its chain first."""
    if Path(path).parent.resolve() == PARAMS_DIR.resolve() and Path(path).stem in STAGES:
        return Path(path).stem
    for file in extends_chain(path):
        lines = file.read_text().splitlines()
        if lines and (m := _COMMAND.match(lines[0])) and MODULE_STAGES.get(m[1], m[1]) in STAGES:
            return MODULE_STAGES.get(m[1], m[1])
    raise ParamsError(f"{path}: cannot tell which stage it is for: its first line does not name the command that uses it "
                      "(# python -m components.<stage> --params ...); pass --stage")


def show(path: Path | str, stage: str | None = None, every_value: bool = False) -> str:
    """The YAML of ``path`` with what it extends merged in and validated; with ``every_value`` the schema's defaults too."""
    stage = stage or stage_of_file(path)
    data = read_yaml(path)
    validated = validate_params(stage, data, path)
    body = validated.model_dump(mode="json") if every_value else data
    chain = " extends ".join(str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p) for p in extends_chain(path))
    header = f"# {chain}\n# stage: {stage}; {'every value, the defaults included' if every_value else 'what the files set'}; valid\n"
    return header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m components.shared.params",
                                     description="Print a params file or preset fully resolved (what it extends merged in) and validated.")
    sub = parser.add_subparsers(dest="command", required=True)
    show_parser = sub.add_parser("show", help="print a params file or preset resolved")
    show_parser.add_argument("preset", help="a params file (params/presets/calibration/base-calibrated.yaml) or a preset's "
                                            "name (base-calibrated), looked up under params/presets/")
    show_parser.add_argument("--stage", choices=sorted(STAGES), help="the stage it is for (default: from its first line)")
    show_parser.add_argument("--all", action="store_true", help="every value, the schema's defaults included")
    args = parser.parse_args(argv)
    try:
        print(show(find_preset(args.preset), args.stage, args.all), end="")
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def find_preset(name: str) -> Path:
    """A params file's path as given, or the preset of that name (``<name>.yaml`` anywhere under params/presets/)."""
    if Path(name).is_file():
        return Path(name)
    found = sorted((PARAMS_DIR / "presets").rglob(f"{Path(name).stem}.yaml"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ParamsError(f"{name}: no such file and no preset of that name under {PARAMS_DIR / 'presets'}")
    raise ParamsError(f"{name}: several presets have that name: {[str(p) for p in found]}; give the path")


if __name__ == "__main__":
    raise SystemExit(main())
