"""What the negatives and neighbour probes end with: the result as JSON on stdout and, with --out, in a file."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, out: Path | None) -> int:
    """A probe's result as indented JSON on stdout and, when ``out`` is given, written there atomically; exit code 0."""
    from components.shared.atomic import atomic_write_bytes

    text = json.dumps(result, indent=2)
    if out is not None:
        atomic_write_bytes(out, text.encode())
    print(text)
    return 0
