"""Benchmark: the evaluate stage's shared encoding against encoding per benchmark.

    python bench/evaluate.py [--model models/base/export] [--repeats 1]

On the default ShapesWorld suite (params/evaluate.yaml; build it with `dvc repro benchmarks`), for one
model, times (a) the stage's path — every distinct image (file + crop) and text encoded once and shared
by all benchmarks — and (b) each benchmark encoding its own images and texts, alternating the two so
both see the same machine load. Prints the encodings each path does, both times, and the ratio b / a
(target ≥ 3x), and checks that both paths give the same metrics.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from components import evaluate as ev  # noqa: E402
from components.shared.params import EvalModelSpec, load_params  # noqa: E402


def evaluate_per_benchmark(model, preprocess, tokenizer, tasks, params) -> dict[str, dict[str, float]]:
    """The baseline: every benchmark encodes its own images and texts (the stage shares them)."""
    classifiers = ev.build_classifiers(model, tokenizer, tasks)
    results = {}
    for task in tasks:
        images = ev.encode_images(model, preprocess, task.images, params.image_batch, params.workers, task.name)
        if task.needs_classifier is not None:
            texts = classifiers[task.name]
        else:
            texts = ev.encode_texts(model, tokenizer, task.texts, params.text_batch, task.name) if task.texts else torch.zeros(0, images.shape[1])
        results[task.name] = ev.score_task(task, images, texts)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "base" / "export"), help="export folder")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    params = load_params("evaluate", ROOT / "params" / "evaluate.yaml")
    tasks = ev.load_suite(params)
    ev.check_images(tasks)
    spec = EvalModelSpec(name="bench", uri=args.model)
    model, preprocess, tokenizer = ev.load_model(*ev.resolve_model(spec, params.cache_dir), spec)
    unique_images = len({r for t in tasks for r in t.images})
    unique_texts = len({x for t in tasks for x in t.texts})
    print(f"{len(tasks)} benchmarks; images encoded: shared {unique_images}, per benchmark {sum(len(t.images) for t in tasks)}; "
          f"texts encoded: shared {unique_texts}, per benchmark {sum(len(t.texts) for t in tasks)}")
    times = {"shared": [], "per_benchmark": []}
    results = {}
    for _ in range(args.repeats):
        for name, fn in (("shared", ev.evaluate_shared), ("per_benchmark", evaluate_per_benchmark)):
            start = time.perf_counter()
            results[name] = fn(model, preprocess, tokenizer, tasks, params)
            times[name].append(time.perf_counter() - start)
    assert results["shared"] == results["per_benchmark"], "the two paths disagree"
    shared, per = min(times["shared"]), min(times["per_benchmark"])
    print(f"shared encoding: {shared:.1f} s; per-benchmark encoding: {per:.1f} s; ratio {per / shared:.2f}x "
          f"(best of {args.repeats}; same metrics from both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
