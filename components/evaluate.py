"""The evaluate stage: the whole benchmark suite for every listed model, one report.

    python -m components.evaluate [--params params/evaluate.yaml]

Models: an export folder (the train and base stages' ``export/``), a checkpoint file, an MLflow registry
URI (``models:/c2lip@champion``) or an open_clip architecture + pretrained tag. Benchmarks: SugarCrepe,
SugarCrepe++, hard positives, ARO, Winoground-style pairs, zero-shot classification and retrieval, read
from their official file formats (:mod:`components.suite.formats`); by default ShapesWorld's, written by
the benchmarks stage.

Each distinct image (file + crop box) is encoded once per model and shared by every benchmark that uses
it; each distinct text likewise. Every figure is aggregated from per-item tables (:mod:`components.suite.items`).
Outputs under ``output_dir``: ``items/<model>/<benchmark>.parquet``,
``metrics.json`` (flat keys ``<model>/<benchmark>/<metric>``, DVC metrics), ``plots/<model>.json`` (DVC plots),
``benchmarks.md`` (benchmark × metric, the models side by side, differences against the first with paired bootstrap
intervals over items), ``intervals.json``, ``benchmarks.png`` and the failure gallery ``gallery/``; the same numbers
and files go to one MLflow run. A model's per-item tables are cached under ``cache_dir`` by a fingerprint of its
weights, the suite's files and this code, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from components.shared.atomic import CorruptFileError, atomic_write_bytes, atomic_write_json
from components.shared.devices import DeviceError, resolve_device
from components.shared.owned_outputs import FolderBusy, ForeignFilesError, OwnedOutputs, one_writer
from components.shared.params import EvalModelSpec, EvaluateParams, ParamsError, flatten_params, load_params
from components.shared.processes import stage_process_setup
from components.shared.redact import redact
from components.shared.safe_load import UnsafeCheckpointError
from components.shared.stage_code import stage_code
from components.suite import formats, gallery, items, results_cache
from components.suite.loading import SuiteError, check_images, load_suite, load_tagger  # noqa: F401 - the stage's API
from components.suite.model_loading import load_model, load_state_dict, model_fingerprint, resolve_model  # noqa: F401 - the stage's API
from components.suite.report import bar_chart, flat_metrics, interval_json, markdown_report, paired_intervals
from components.suite.scoring import encode_images, encode_texts, evaluate_shared, results_of  # noqa: F401 - the stage's API

EvaluateError = SuiteError  # a model or benchmark that cannot be evaluated: says which, and why


# --------------------------------------------------------------------------------------------------
# the suite
# --------------------------------------------------------------------------------------------------


def suite_fingerprint(params: EvaluateParams, tasks: list[formats.Task]) -> str:
    digest = hashlib.sha256(params.benchmarks.model_dump_json().encode())
    digest.update(json.dumps([params.order_seed, params.spacy_model]).encode())
    for task in tasks:
        digest.update(task.name.encode())
        digest.update(json.dumps(task.texts).encode())
        digest.update(json.dumps([(str(r.path), r.box) for r in task.images]).encode())
    digest.update(results_cache.images_digest(tasks).encode())  # the pixels, not only the names
    for path in stage_code("components.evaluate"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# the stage
# --------------------------------------------------------------------------------------------------


def evaluate_model(spec: EvalModelSpec, tasks: list[formats.Task], params: EvaluateParams, suite_fp: str, quiet: bool = False,
                   resolved: tuple[str, Any] | None = None) -> dict[str, pa.Table]:
    """One model's per-item tables on the loaded suite (task name -> table), from the cache when the same weights met
    the same suite (``resolved``: :func:`resolve_model`'s answer when the caller has it)."""
    kind, where = resolved or resolve_model(spec, params.cache_dir / "downloads")
    # the precision changes the figures (in their last digits), the device does not: a CPU run's cache serves a GPU run
    key = f"{model_fingerprint(kind, where)}:{suite_fp}" + ("" if params.precision == "fp32" else f":{params.precision}")
    fp = hashlib.sha256(key.encode()).hexdigest()[:16]
    if (tables := results_cache.read(params.cache_dir, spec.name, fp, tasks)) is not None:  # a damaged entry is re-evaluated
        return tables
    model, preprocess, tokenizer = load_model(kind, where, spec, params.device, params.precision)
    t0 = time.perf_counter()
    # quiet: a caller evaluating several models at once keeps one progress bar of its own
    tables = evaluate_shared(model, preprocess, tokenizer, tasks, params, label=spec.name, progress=not quiet)
    print(f"evaluate: {spec.name}: {len(tasks)} benchmarks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    results_cache.write(params.cache_dir, spec.name, fp, tables, tasks)
    return tables


def run(params: EvaluateParams, log_mlflow: bool = True) -> dict[str, float]:
    started = time.perf_counter()
    device = resolve_device(params.device)  # before any work: a GPU this machine lacks is named at once
    print(f"evaluate: scoring on {device} in {params.precision}", file=sys.stderr)
    if params.torch_threads:
        torch.set_num_threads(params.torch_threads)
    tasks = load_suite(params)
    check_images(tasks)
    names = [m.name for m in params.models]
    owned, expected = owned_outputs(params.output_dir, names, tasks)
    owned.check(expected)  # before any work: a file of the user's in items/, gallery/ or plots/ stops the run, untouched
    suite_fp = suite_fingerprint(params, tasks)
    # every model is found before any is evaluated: a misspelt second model costs no time and touches nothing
    resolved = {spec.name: resolve_model(spec, params.cache_dir / "downloads") for spec in params.models}
    # checked, now the work, under output_dir's writer lock: a second evaluation of the same folder stops at once,
    # naming the first, instead of removing the first one's build folder midway (bad input never gets here)
    with one_writer(params.output_dir, "evaluate"):
        flat, galleries = _evaluate_and_write(params, tasks, names, owned, expected, suite_fp, resolved, log_mlflow)
    print(f"evaluate: wrote {params.output_dir}/benchmarks.md, benchmarks.png, metrics.json, intervals.json, items/"
          + (", gallery/index.html" if galleries else "") + f" in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return flat


def _evaluate_and_write(params, tasks, names, owned, expected, suite_fp, resolved, log_mlflow) -> tuple[dict[str, float], list]:
    tables: dict[str, dict[str, pa.Table]] = {}
    meta: dict[str, str] = {}
    for spec in params.models:
        meta[spec.name] = spec.uri or f"{spec.arch} / {spec.pretrained}"
        tables[spec.name] = evaluate_model(spec, tasks, params, suite_fp, resolved=resolved[spec.name])
    per_model = {name: results_of(tables[name]) for name in names}  # the figures, aggregated from the per-item tables
    flat = flat_metrics(tasks, per_model)
    intervals = paired_intervals(tasks, tables, names, params.bootstrap.resamples, params.bootstrap.seed)
    out = params.output_dir
    with owned.build() as build:  # the whole output set, then swapped in at once: a failure leaves the old one
        galleries = write_outputs(build, params, tasks, names, tables, per_model, flat, intervals, meta)
        owned.swap_in(build, expected)
    if log_mlflow:
        log_to_mlflow(params, flat, out, names, suite_fp)
    return flat, galleries


REPORT_FILES = ("benchmarks.md", "benchmarks.png", "metrics.json", "intervals.json")


def owned_outputs(out: Path, names: list[str], tasks: list[formats.Task]) -> tuple[OwnedOutputs, set[str]]:
    """What this stage owns in ``out`` (a folder it may share: reports/ holds the comparisons' reports too) and the
    files this run writes under fixed names (the committed example report, an older version's outputs)."""
    expected = {f"plots/{n}.json" for n in names} | {f"items/{n}/{t.name}.parquet" for n in names for t in tasks}
    expected |= {"gallery/index.html"} | {f"gallery/{n}.html" for n in names[2:]}
    return OwnedOutputs(out, "evaluate", folders=("items", "plots", "gallery"), files=REPORT_FILES), expected


def write_outputs(build: Path, params: EvaluateParams, tasks, names, tables, per_model, flat, intervals, meta) -> list[Path]:
    """Every output into the new folder ``build``; returns the gallery's pages."""
    for name in names:
        items.write_tables(build / "items" / name, tables[name])
    atomic_write_json(build / "metrics.json", flat)
    for name in names:
        rows = [{"benchmark": t.name, "metric": t.headline, "value": round(per_model[name][t.name][t.headline], 5)} for t in tasks]
        atomic_write_json(build / "plots" / f"{name}.json", {"benchmarks": rows})
    atomic_write_json(build / "intervals.json", interval_json(intervals))
    galleries = []
    if params.gallery.enabled and len(names) > 1:
        g = params.gallery
        pages = [gallery.Page("index.html" if k == 1 else f"{name}.html", names[0], name, tables[names[0]], tables[name])
                 for k, name in enumerate(names) if k > 0]
        galleries = gallery.write_gallery(build / "gallery", pages, tasks, g.per_outcome, g.seed, g.thumbnail_px, g.more, g.enlarge_px)
    report = markdown_report(tasks, per_model, names, meta, intervals, params.bootstrap.resamples,
                             "gallery/index.html" if galleries else None, params.precision)
    atomic_write_bytes(build / "benchmarks.md", report.encode())
    atomic_write_bytes(build / "benchmarks.png", bar_chart(tasks, per_model, names, intervals))
    return galleries


def log_to_mlflow(params: EvaluateParams, flat: dict[str, float], out: Path, names: list[str], suite_fp: str) -> None:
    from components.shared.tracking import use_experiment

    mlflow = use_experiment(params.mlflow_experiment)
    with mlflow.start_run(run_name=f"evaluate-{'-vs-'.join(names)}"):
        # report_dir: how the flow links the report it publishes to this run (components.shared.tracking.report_run)
        mlflow.set_tags({"stage": "evaluate", "models": ",".join(names), "suite_fingerprint": suite_fp, "report_dir": str(out.resolve())})
        mlflow.log_params({k: v[:500] for k, v in flatten_params(params).items()})
        mlflow.log_metrics(flat)
        for file in REPORT_FILES:
            mlflow.log_artifact(str(out / file))
        if (out / "gallery").is_dir():
            mlflow.log_artifacts(str(out / "gallery"), artifact_path="gallery")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/evaluate.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (table.path=data/sources/x.csv); repeatable")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    try:
        params = load_params("evaluate", args.params, args.overrides)
        flat = run(params)
    except (ParamsError, EvaluateError, formats.BenchmarkError, CorruptFileError, UnsafeCheckpointError, ForeignFilesError,
            DeviceError, FolderBusy) as err:
        print(f"error: {redact(str(err))}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in flat.items() if "/summary/" in k}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
