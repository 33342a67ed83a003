"""The base of the params schema: the repository root, the error type and the strict model every params
model derives from, and the constants more than one stage reads."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

# the repository: params/, data/, models/ and the workspace files are relative to it
ROOT = Path(__file__).resolve().parents[2]
PARAMS_DIR = ROOT / "params"
# one flow run per workspace holds this file's flock (flows/workspace.py); while it runs, the params files
# it overrides are journalled here, so a killed run's overrides are found and put back
RUN_LOCK = ".c2lip-run.lock"
OVERRIDES_JOURNAL = ".c2lip-params-journal.json"
# ShapesWorld's zero-shot prompts: the evaluate stage's default and the train stage's probe
SHAPESWORLD_ZERO_SHOT_TEMPLATES = ("a {}.", "There is a small {}.", "There is a large {}.", "A picture of one shape: a {}.")


class ParamsError(ValueError):
    """A params file that cannot be used: names the file, the key path and the reason."""


class Strict(BaseModel):
    """Base for every params model: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# where the benchmarks stage writes ShapesWorld's suite (the evaluate defaults read it; compare rebases it)
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"  # where a model runs (components/shared/devices.py resolves it)
SHAPESWORLD_SUITE = Path("data/benchmarks/shapesworld")

# a caption field name becomes a Parquet column and a JSON key
CAPTION_FIELD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# a name that becomes one path component of an output (a split): never "", ".", ".." or "a/b"
ENTRY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def repeated(names: list[str]) -> list[str]:
    """The names that occur more than once, sorted (lists whose names must be unique name them)."""
    return sorted({n for n in names if names.count(n) > 1})
