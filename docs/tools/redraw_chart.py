"""A kept report's benchmark chart drawn again with the current layout, from the report's own figures.

    PYTHONPATH=. .venv/bin/python docs/tools/redraw_chart.py reports/example-run

Reads the folder's metrics.json (every model's figures) and intervals.json (the paired intervals), loads the suite
the evaluate stage's params name (for the chance levels and the benchmark order) and writes the folder's
benchmarks.png. No model is scored again: the picture shows the figures the report already holds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from components.shared.atomic import atomic_write_bytes
from components.shared.params import load_params
from components.suite import items
from components.suite.loading import load_suite
from components.suite.report import bar_chart


def figures_of(flat: dict[str, float], benchmarks: list[str]) -> tuple[list[str], dict[str, dict[str, dict[str, float]]]]:
    """metrics.json's ``model/benchmark/metric`` keys back into model -> benchmark -> metric, in the report's model order
    (a benchmark's name may hold a slash, so the longest known name the key starts with is the benchmark)."""
    names: list[str] = []
    per_model: dict[str, dict[str, dict[str, float]]] = {}
    longest_first = sorted(benchmarks, key=len, reverse=True)
    for key, value in flat.items():
        model, rest = key.split("/", 1)
        if model not in names:
            names.append(model)
        bench = next((b for b in longest_first if rest.startswith(b + "/")), None)
        if bench is not None:
            per_model.setdefault(model, {}).setdefault(bench, {})[rest[len(bench) + 1:]] = value
    return names, per_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    suite = load_suite(load_params("evaluate"))
    names, per_model = figures_of(json.loads((args.folder / "metrics.json").read_text()), [t.name for t in suite])
    kept = json.loads((args.folder / "intervals.json").read_text())
    intervals = {name: {"tasks": {t: {k: items.Interval(v["delta"], v["low"], v["high"], np.empty(0)) for k, v in keys.items()}
                                  for t, keys in v["tasks"].items()}} for name, v in kept.items()}
    tasks = [t for t in suite if t.name in per_model[names[0]]]
    atomic_write_bytes(args.folder / "benchmarks.png", bar_chart(tasks, per_model, names, intervals))
    print(f"redraw_chart: wrote {args.folder / 'benchmarks.png'} ({len(tasks)} benchmarks, models {', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
