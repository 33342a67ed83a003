"""Shared test set-up: offline environment, the repository root, tiny params."""

import os
import sys
from pathlib import Path

# Never wait on the model hub or send telemetry from tests (anything that tries the hub hangs ~47 s).
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "DVC_NO_ANALYTICS": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}.items():
    os.environ.setdefault(_key, _value)

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from components.params import CaptionsParams  # noqa: E402


def tiny_captions(tmp_path: Path, **overrides) -> CaptionsParams:
    """A captions config small enough for a unit test, writing under ``tmp_path``."""
    world = {"train_images": 60, "test_images": 20, **overrides.pop("shapesworld", {})}
    data = {
        "output_dir": str(tmp_path / "captions"),
        "stats_path": str(tmp_path / "metrics" / "captions.json"),
        "contact_sheet": None,
        "shard_size": 25,
        "workers": 1,
        "shapesworld": world,
        **overrides,
    }
    return CaptionsParams.model_validate(data)


@pytest.fixture
def repo() -> Path:
    return REPO
