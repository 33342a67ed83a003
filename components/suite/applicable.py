"""Which benchmarks a suite has items for: a world variant (single objects, no relations, few test images) writes
some benchmark files empty, and an empty benchmark has no score — they are left out, by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _items(path: Path) -> int:
    if not path.is_file():
        return 0
    if path.suffix == ".jsonl":
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    return len(json.loads(path.read_text()))


def applicable_suite(ev: Any) -> list[str]:
    """Drop (in place) the benchmarks a world variant's suite has no items for — relations in a world of
    single objects, zero-shot classification in a world without them — and return their names."""
    b, dropped = ev.benchmarks, []
    for name in ("sugarcrepe", "sugarcrepe_pp"):
        source = getattr(b, name)
        if not source.enabled:
            continue
        keep = [s for s in source.subsets if _items(source.data_root / f"{s}.json")]
        dropped += [f"{name}/{s}" for s in source.subsets if s not in keep]
        source.subsets, source.enabled = (keep, True) if keep else (source.subsets, False)
    hp = b.hard_positives
    if hp.enabled:
        keep = {s: f for s, f in hp.files.items() if _items(hp.data_root / hp.original_dir / f)}
        dropped += [f"hard_positives/{s}" for s in hp.files if s not in keep]
        hp.files, hp.enabled = (keep, True) if keep else (hp.files, False)
    if b.aro.enabled:
        for key, label in (("relation_file", "aro/vg_relation"), ("attribution_file", "aro/vg_attribution")):
            if getattr(b.aro, key) and not _items(b.aro.data_root / getattr(b.aro, key)):
                setattr(b.aro, key, None)
                dropped.append(label)
    if b.winoground.enabled and not _items(b.winoground.data_root / b.winoground.file):
        b.winoground.enabled = False
        dropped.append("winoground")
    if b.zero_shot.enabled and not any(p.is_file() for p in Path(b.zero_shot.data_root).glob("*/*")):
        b.zero_shot.enabled = False
        dropped.append("zero_shot")
    return dropped
