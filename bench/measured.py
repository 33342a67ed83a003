"""The one file of measured figures (bench/measured.json) that README.md and the docs show.

Every bench script ends by recording its row of the performance table here (``record``): the command that reproduces
it, what it measures, the figure it measured and the hardware it ran on. ``bench/timings.py`` records how long the
README's commands take on a fresh clone. ``python docs/tools/findings.py --write`` renders the file into README.md and
the docs, and tests/test_facts.py fails when a page states one of these figures otherwise. Nothing here is typed by
hand: a figure changes when its script runs again."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "measured.json"
sys.path.insert(0, str(ROOT))


def this_machine() -> str:
    """The hardware column: cores and architecture (and a GPU's name when one is visible)."""
    cores = os.cpu_count() or 1
    arch = platform.machine().replace("_", "-")
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}, {cores} CPU cores"
    except ImportError:
        pass
    return f"{cores} CPU cores ({arch})"


def load() -> dict[str, Any]:
    return json.loads(MEASURED.read_text()) if MEASURED.is_file() else {"benches": {}, "timings": {}}


def save(data: dict[str, Any]) -> None:
    from components.shared.atomic import atomic_write_bytes

    atomic_write_bytes(MEASURED, (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode())


def record(command: str, measures: str, figure: str, hardware: str | None = None, **figures: float) -> None:
    """This bench's row (keyed by ``command``), replacing the last one; ``figures`` keeps its raw numbers beside the text."""
    data = load()
    data["benches"][command] = {"measures": measures, "figure": figure, "hardware": hardware or this_machine(),
                                "measured_on": dt.date.today().isoformat(), **({"figures": figures} if figures else {})}
    save(data)
    print(f"recorded in {MEASURED.relative_to(ROOT)}: {command}")


def record_timings(**timings: Any) -> None:
    data = load()
    data["timings"] = {**timings, "measured_on": dt.date.today().isoformat()}
    save(data)
    print(f"recorded in {MEASURED.relative_to(ROOT)}: timings")


def record_compare(**figures: Any) -> None:
    """How long `make compare` took (bench/timings.py --compare)."""
    data = load()
    data["compare"] = {**figures, "measured_on": dt.date.today().isoformat()}
    save(data)
    print(f"recorded in {MEASURED.relative_to(ROOT)}: compare")
