"""Benchmark: the evaluate stage's shared encoding against encoding per benchmark, and what the per-item tables cost.

    python bench/evaluate.py [--model models/base/export] [--second-model models/train/export] [--repeats 1]
    python bench/evaluate.py --throughput [--arch ViT-B-16] [--devices cpu cuda] [--precisions fp32 bf16]

On the default ShapesWorld suite (params/evaluate.yaml; build it with `dvc repro benchmarks`), for one
model, times (a) the stage's path — every distinct image (file + crop) and text encoded once and shared
by all benchmarks — and (b) each benchmark encoding its own images and texts, alternating the two so
both see the same machine load. Prints the encodings each path does, both times, and the ratio b / a
(target ≥ 3x), and checks that both paths give the same metrics.

Then, for two models as the stage runs them: the time to encode and score every item (what any evaluation needs),
the time to build the per-item tables and aggregate the figures from them, to write them as Parquet, and — once for
the pair — the paired bootstrap intervals and the failure gallery; it prints each as a share of the first
(target: tables + Parquet ≤ 15%).

``--throughput``: images/s and texts/s of the stage's encoders (the image loader as the stage runs it: workers,
pinned memory and non-blocking copies on a GPU) per device and precision, on the suite's distinct images and texts
(``--limit`` of each), for the export or, with ``--arch``, an open_clip architecture with random weights (no
download: a ViT-B/16 at 224 px is what a GPU's speed means; ViT-B-16 rather than its SigLIP form, whose tokenizer
needs the hub). It also checks that every device gives the CPU's figures in fp32 (the official scripts' precision)
and prints how far bf16 moves them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

from components import evaluate as ev  # noqa: E402
from components.shared.params import EvalModelSpec, load_params  # noqa: E402
from components.suite import gallery, items, report, scoring  # noqa: E402


def evaluate_per_benchmark(model, preprocess, tokenizer, tasks, params) -> dict[str, dict[str, float]]:
    """The baseline: every benchmark encodes its own images and texts (the stage shares them)."""
    classifiers = scoring.build_classifiers(model, tokenizer, tasks)
    results = {}
    for task in tasks:
        images = scoring.encode_images(model, preprocess, task.images, params.image_batch, params.workers, task.name)
        if task.needs_classifier is not None:
            texts = classifiers[task.name]
        else:
            texts = ev.encode_texts(model, tokenizer, task.texts, params.text_batch, task.name) if task.texts else torch.zeros(0, images.shape[1])
        results[task.name] = scoring.score_task(task, images, texts)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "base" / "export"), help="export folder")
    parser.add_argument("--second-model", default=str(ROOT / "models" / "train" / "export"), help="the export compared with --model")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--params", type=Path, default=ROOT / "params" / "evaluate.yaml", help="the evaluate params (the suite)")
    parser.add_argument("--throughput", action="store_true", help="images/s and texts/s per device and precision instead")
    parser.add_argument("--arch", default=None, help="with --throughput: an open_clip architecture, random weights")
    parser.add_argument("--devices", nargs="+", default=None, help="with --throughput: default cpu, and cuda when present")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--limit", type=int, default=2048, help="with --throughput: at most this many images and texts")
    args = parser.parse_args()
    params = load_params("evaluate", args.params)
    tasks = ev.load_suite(params)
    ev.check_images(tasks)
    if args.throughput:
        return throughput(args, params, tasks)
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
    assert ev.results_of(results["shared"]) == ev.results_of(results["per_benchmark"]), "the two paths disagree"
    shared, per = min(times["shared"]), min(times["per_benchmark"])
    print(f"shared encoding: {shared:.1f} s; per-benchmark encoding: {per:.1f} s; ratio {per / shared:.2f}x "
          f"(best of {args.repeats}; same metrics from both)")
    costs = per_item_costs(params, tasks, {"first": args.model, "second": args.second_model})
    images, texts = sum(len(t.images) for t in tasks), sum(len(t.texts) for t in tasks)
    record("python bench/evaluate.py", f"the evaluate stage on ShapesWorld's suite ({len(tasks)} benchmarks, base model): every distinct image "
           f"and text encoded once and shared ({unique_images:,} images, {unique_texts:,} texts) vs each benchmark encoding its own "
           f"({images:,} images, {texts:,} texts), both scoring every item; both give the same metrics. Then two models as the stage runs "
           "them: per-item tables + the figures from them, and Parquet, against encoding + scoring",
           f"{shared:.1f} s vs {per:.1f} s: **{per / shared:.2f}×** (target ≥ 3×, best of {args.repeats}); per-item tables + Parquet "
           f"**{costs['per_item']:.1%}** of encode + score (target ≤ 15%); paired bootstrap {costs['bootstrap']:.1%}, gallery {costs['gallery']:.1%}")
    return 0


def throughput(args, params, tasks) -> int:
    """Images/s and texts/s per device and precision; fp32 on every device must give the CPU's figures."""
    from components.method.models import create_model
    from components.shared.devices import place_model

    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    refs = list(dict.fromkeys(r for t in tasks for r in t.images))[:args.limit]
    texts = list(dict.fromkeys(x for t in tasks for x in t.texts))[:args.limit]
    if args.arch:
        torch.manual_seed(0)
        model, _, preprocess, tokenizer = create_model(args.arch, pretrained=None)
        label = f"{args.arch} (random weights)"
    else:
        spec = EvalModelSpec(name="bench", uri=args.model)
        model, preprocess, tokenizer = ev.load_model(*ev.resolve_model(spec, params.cache_dir), spec)
        label = args.model
    model.eval()
    hardware = torch.cuda.get_device_name() if torch.cuda.is_available() else f"{torch.get_num_threads()} CPU threads"
    print(f"{label}: {len(refs)} images, {len(texts)} texts, image batch {params.image_batch}, text batch {params.text_batch}; "
          f"{hardware}")
    reference, rows = None, []
    for device in devices:
        for precision in args.precisions:
            if device == "cpu" and precision != "fp32":
                continue  # bf16/fp16 on a CPU is emulated: slower, and no user would score in it
            place_model(model, device, precision)
            scoring.encode_images(model, preprocess, refs[:params.image_batch], params.image_batch, params.workers, "warm-up", False)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            image_emb = scoring.encode_images(model, preprocess, refs, params.image_batch, params.workers, "images", False)
            image_s = time.perf_counter() - start
            start = time.perf_counter()
            text_emb = scoring.encode_texts(model, tokenizer, texts, params.text_batch, "texts", False)
            text_s = time.perf_counter() - start
            if reference is None:
                reference = (image_emb, text_emb)
            drift = max((image_emb - reference[0]).abs().max().item(), (text_emb - reference[1]).abs().max().item())
            rows.append((device, precision, len(refs) / image_s, len(texts) / text_s, drift))
            if precision == "fp32" and drift > 1e-3:
                print(f"FAIL: {device} fp32 embeddings differ from {devices[0]} fp32 by {drift:.2e} (cosine units)")
                return 1
    print("| device | precision | images/s | texts/s | max embedding difference from the first row |")
    print("|---|---|---|---|---|")
    for device, precision, ips, tps, drift in rows:
        print(f"| {device} | {precision} | {ips:,.0f} | {tps:,.0f} | {drift:.1e} |")
    first = rows[0]
    for device, precision, ips, tps, _ in rows[1:]:
        print(f"{device} {precision} against {first[0]} {first[1]}: images {ips / first[2]:.1f}x, texts {tps / first[3]:.1f}x")
    return 0


def encode_and_score(model, preprocess, tokenizer, tasks, params):
    """What every evaluation needs: the shared encodings and each item's scores and outcomes (no table)."""
    image_index, text_index = {}, {}
    for task in tasks:
        for ref in task.images:
            image_index.setdefault(ref, len(image_index))
        for text in task.texts:
            text_index.setdefault(text, len(text_index))
    images = scoring.encode_images(model, preprocess, list(image_index), params.image_batch, params.workers, "images", False)
    texts = ev.encode_texts(model, tokenizer, list(text_index), params.text_batch, "texts", False)
    classifiers = scoring.build_classifiers(model, tokenizer, tasks)
    scored = {}
    for task in tasks:
        image_emb = images[torch.tensor([image_index[r] for r in task.images], dtype=torch.long)]
        text_emb = classifiers[task.name] if task.needs_classifier is not None else (
            texts[torch.tensor([text_index[t] for t in task.texts], dtype=torch.long)] if task.texts else texts)
        scored[task.name] = task.score_items(image_emb, text_emb)
    return scored


def per_item_costs(params, tasks, exports: dict[str, str]) -> dict[str, float]:
    base = {"score": 0.0, "tables": 0.0, "parquet": 0.0}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, uri in exports.items():
            spec = EvalModelSpec(name=name, uri=uri)
            model, preprocess, tokenizer = ev.load_model(*ev.resolve_model(spec, params.cache_dir), spec)
            start = time.perf_counter()
            with torch.no_grad():
                scored = encode_and_score(model, preprocess, tokenizer, tasks, params)
            base["score"] += time.perf_counter() - start
            for task in tasks:  # each model pays for its tables whole (the stage builds a task's fixed columns once per run)
                task.layout._static = None
            start = time.perf_counter()
            tables[name] = {t.name: items.item_table(t.name, t.headline, t.layout, scored[t.name]) for t in tasks}
            ev.results_of(tables[name])
            base["tables"] += time.perf_counter() - start
            start = time.perf_counter()
            items.write_tables(Path(tmp) / name, tables[name])
            base["parquet"] += time.perf_counter() - start
        names = list(exports)
        start = time.perf_counter()
        report.paired_intervals(tasks, tables, names, params.bootstrap.resamples, params.bootstrap.seed)
        bootstrap = time.perf_counter() - start
        start = time.perf_counter()
        gallery.write_gallery(Path(tmp) / "gallery", [gallery.Page("index.html", names[0], names[1], tables[names[0]], tables[names[1]])],
                              tasks, params.gallery.per_outcome, params.gallery.seed, params.gallery.thumbnail_px)
        drawn = time.perf_counter() - start
    s = base["score"]
    print(f"two models: encode + score every item {s:.1f} s; per-item tables + figures from them {base['tables']:.2f} s "
          f"({base['tables'] / s:.1%}); Parquet {base['parquet']:.2f} s ({base['parquet'] / s:.1%}); "
          f"tables + Parquet {(base['tables'] + base['parquet']) / s:.1%} of encode + score (target ≤ 15%)")
    print(f"once per pair: paired bootstrap ({params.bootstrap.resamples} resamples, every figure) {bootstrap:.2f} s ({bootstrap / s:.1%}); "
          f"failure gallery {drawn:.2f} s ({drawn / s:.1%})")
    return {"per_item": (base["tables"] + base["parquet"]) / s, "bootstrap": bootstrap / s, "gallery": drawn / s}


if __name__ == "__main__":
    sys.exit(main())
