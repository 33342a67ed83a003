"""Write the params reference (docs/params.md) from the pydantic schema in components/shared/params*.py: every stage's
every field with its type, default, bounds and description. `make params-reference` runs it; a test fails when the
committed page differs from what this writes, so the page cannot fall behind the schema.

    python docs/tools/params_reference.py > docs/params.md
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from components.shared.params import STAGES  # noqa: E402

BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥", "max_length": "length ≤", "pattern": "matches"}
FILES = {"base": "params/base.yaml (the train stage's schema)"}


def type_name(annotation) -> str:
    """A short, readable name of a field's type (``int | None``, ``list[str]``, ``'a' | 'b'``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.__name__
    return getattr(annotation, "__name__", str(annotation))


def default_text(info) -> str:
    if info.is_required():
        return "*required*"
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined:
        return "*required*"
    if isinstance(value, BaseModel):
        return "(section below)"
    if isinstance(value, enum.Enum):
        value = value.value
    text = json.dumps(value, default=str, ensure_ascii=False)
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def bounds_text(info) -> str:
    parts = []
    for item in info.metadata:
        for key, sign in BOUNDS.items():
            value = getattr(item, key, None)
            if value is not None:
                parts.append(f"{sign} `{value}`")
    return ", ".join(parts)


def nested_model(annotation) -> type[BaseModel] | None:
    """The params model a field holds, directly or as ``Model | None``."""
    candidates = [annotation, *typing.get_args(annotation)]
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        description = " ".join((info.description or "").split()).replace("|", "\\|")
        out.append((path, type_name(info.annotation), default_text(info), bounds_text(info), description))
        inner = nested_model(info.annotation)
        if inner is not None:
            out.extend(rows(inner, path + "."))
    return out


def page() -> str:
    lines = [
        "# Params reference",
        "",
        "Every parameter of every stage, written from the pydantic models in `components/shared/params*.py` by",
        "`docs/tools/params_reference.py` (`make params-reference`); a test fails when this page and the schema disagree.",
        "`params/<stage>.yaml` states the defaults; a value of the wrong type or out of bounds stops the stage with the",
        "file, the key and the reason. Nested sections are listed with dotted names (`data.shards`).",
        "A file may start with `extends: <file>` (a path relative to its folder): that file's values with this one's merged",
        "over them, mappings key by key, lists and values replaced (the presets under `params/presets/<study>/` do this;",
        "`python -m components.shared.params show PRESET` prints one resolved).",
        "",
    ]
    total = 0
    for stage, model in STAGES.items():
        table = rows(model)
        total += len(table)
        lines += [f"## {stage}", "", f"`{FILES.get(stage, f'params/{stage}.yaml')}` — {' '.join((model.__doc__ or '').split())}", "",
                  "| param | type | default | bounds | what it does |", "|---|---|---|---|---|"]
        lines += [f"| `{p}` | {t} | {d} | {b} | {desc} |" for p, t, d, b, desc in table]
        lines.append("")
    lines.insert(6, f"{total} fields in {len(STAGES)} params files.")
    lines.insert(7, "")  # the count closes the first paragraph; the extends rule is the second
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(page())
