"""The comparison of methods: every arm (a method, or a control) fine-tuned from the same base model on the
same data with the same budget, once per seed, each judged by the same benchmark suite.

    python -m components.compare --params params/compare.yaml          (make compare)
    prefect deployment run c2lip/compare                                (the flow maps the runs as tasks)

Each run is the train stage as a subprocess with one torch thread (``parallel`` at a time; on a machine with GPUs
the runs are dealt over them, one GPU per run while ``parallel`` ≤ the GPU count: :class:`DeviceSlots`), in
``output_dir/<arm>/seed<k>/``, then its export evaluated in this process on the suite loaded once (one
thread per run); a finished run leaves ``done.json`` keyed by its params, the suite and the training and
evaluation code, so a killed comparison resumes where it stopped (a run killed mid-way
resumes from its own checkpoints). Outputs: ``report_dir/compare.md`` (method × benchmark group, mean ±
standard deviation over seeds, paired differences against the reference, held-out combinations
separately, every benchmark's headline), ``compare.png``, ``compare.json``, and one MLflow run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from components.data.shapesworld_grammar import parse_object_phrase
from components.shared.atomic import atomic_write_bytes, atomic_write_json, fingerprint
from components.shared.devices import DeviceSlots
from components.shared.owned_outputs import ForeignFilesError, one_writer
from components.shared.params import (
    ROOT,
    SHAPESWORLD_SUITE,
    CompareParams,
    EvaluateParams,
    ParamsError,
    TrainParams,
    deep_merge,
    load_params,
    read_yaml,
    validate_params,
)
from components.shared.processes import call_logged, mark_run, stage_process_setup
from components.shared.progress import TimedBar
from components.shared.stage_code import stage_code
from components.suite.applicable import applicable_suite
from components.suite.compare_report import TRAIN_COLUMNS, log_to_mlflow, report_outputs, write_report
from components.suite.formats import BenchmarkError
from components.suite.items import write_tables


@dataclass(frozen=True)
class Run:
    arm: str
    seed: int
    dir: Path
    train: TrainParams
    phrases_field: str | None = None  # the caption field whose phrases compare parses for this run (prepare_phrases)

    @property
    def label(self) -> str:
        return f"{self.arm}-s{self.seed}"


def params_with(overrides: dict | None, path: Path = Path("params/compare.yaml")) -> CompareParams:
    """``path``'s params with a partial mapping merged over them (the flow's overrides), validated whole."""
    return validate_params("compare", deep_merge(read_yaml(ROOT / path), overrides or {}), f"{path} + overrides")


# --------------------------------------------------------------------------------------------------
# the world: the pipeline's own data, or a variant generated here
# --------------------------------------------------------------------------------------------------


def world_dir(params: CompareParams) -> Path:
    payload = params.world.model_dump(mode="json") if params.world else {}
    return params.output_dir / ("world-" + fingerprint(payload, [])[:10])


def world_data(params: CompareParams) -> dict[str, Any]:
    """Train-param and evaluate-param changes that point every run at the comparison's world."""
    if params.world is None:
        return {"train": {}, "benchmarks_root": None, "manifest": Path(read_yaml(params.concepts_params).get("manifest", "data/captions/manifest.parquet"))}
    root = world_dir(params)
    train = {"data": {"shards": [str(root / "captions" / "train" / "*.tar")], "concepts_dir": str(root / "concepts" / "train"),
                      "recaptions_dir": str(root / "recaptions" / "train")},
             "test_shards": [str(root / "captions" / "test" / "*.tar")]}
    train["curves"] = {"captions_params": str(root / "captions.yaml")}  # the learning curves' suite comes from this world too
    if params.world.caption_field:
        train["data"]["caption_field"] = params.world.caption_field
    return {"train": train, "benchmarks_root": root / "benchmarks", "manifest": root / "captions" / "manifest.parquet"}


def world_concepts(params: CompareParams) -> dict[str, Any]:
    """The concepts params of the comparison's world: the pipeline's (params.concepts_params), or the variant's."""
    con = read_yaml(params.concepts_params)
    if params.world is None:
        return con
    root = world_dir(params)
    con = {**con, "manifest": str(root / "captions" / "manifest.parquet"), "output_dir": str(root / "concepts"),
           "stats_path": str(root / "concepts.json"), "splits": ["train"], "recaptions": str(root / "recaptions" / "manifest.parquet")}
    if params.world.caption_field:
        con["caption_field"] = params.world.caption_field
    return con


def phrases_of_field(params: CompareParams, field: str) -> dict[str, Any]:
    """The concepts params that parse the world's ``field`` captions, beside the world's own phrases:
    ``<concepts output_dir>-<field>`` (data/concepts-short for the pipeline's world)."""
    con = world_concepts(params)
    out = validate_params("concepts", con, params.concepts_params).output_dir
    out = out.with_name(f"{out.name}-{field}")
    return {**con, "caption_field": field, "output_dir": str(out), "stats_path": str(out / "stats.json"), "splits": ["train"]}


def prepare_phrases(params: CompareParams, runs: list[Run]) -> None:
    """The phrases of each caption field a run trains on that the world's phrases are not parsed from (C2LIP on the
    short captions learns the short caption's phrases, not the dense caption's), by the concepts stage's own code:
    it resumes, and skips a field whose phrases are all there."""
    from components import concepts

    for field in dict.fromkeys(r.phrases_field for r in runs if r.phrases_field):
        concepts.run(validate_params("concepts", phrases_of_field(params, field), params.concepts_params))


def prepare_world(params: CompareParams) -> None:
    """Generate the variant's captions, noun phrases and benchmark suite with the stages' own code (each
    resumes and writes atomically); nothing for the pipeline's own world."""
    if params.world is None:
        return
    from components import benchmarks, captions, concepts, recaption

    w, root = params.world, world_dir(params)
    cap = read_yaml(params.captions_params)
    world = dict(cap.get("shapesworld") or {})
    if w.colors:
        colors = dict(world.get("colors") or load_params("captions", params.captions_params).shapesworld.model_dump()["colors"])
        world["colors"] = dict(list(colors.items())[: w.colors])
    if w.shapes:
        shapes = list(world.get("shapes") or load_params("captions", params.captions_params).shapesworld.shapes)
        world["shapes"] = shapes[: w.shapes]
    for key in ("min_objects", "max_objects", "train_images", "test_images"):
        if getattr(w, key) is not None:
            world[key] = getattr(w, key)
    # the variant's stats stay in its folder: the pipeline's metrics/*.json are DVC outputs of the pipeline's own stages
    cap = {**cap, "shapesworld": world, "output_dir": str(root / "captions"), "source": "shapesworld", "stats_path": str(root / "captions.json")}
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(root / "captions.yaml", yaml.safe_dump(cap, sort_keys=False).encode())
    captions_params = validate_params("captions", cap, root / "captions.yaml")
    if not (root / "captions" / "manifest.parquet").is_file():
        captions.run(captions_params)
    if not (root / "recaptions" / "manifest.parquet").is_file():  # the world's oracle recaptions (the stage's defaults)
        recaption.run(validate_params("recaption", {"manifest": str(root / "captions" / "manifest.parquet"), "output_dir": str(root / "recaptions"),
                                                    "stats_path": str(root / "recaption.json"), "contact_sheet": None}))
    concepts_params = validate_params("concepts", world_concepts(params), params.concepts_params)
    if not any((root / "concepts" / "train").glob("*.parquet")):
        concepts.run(concepts_params)
    if not (root / "benchmarks" / "stats.json").is_file():
        benchmarks.run(validate_params("benchmarks", {"captions_params": str(root / "captions.yaml"), "output_dir": str(root / "benchmarks")}))


def world_figures(manifest: Path) -> dict[str, float]:
    """How far the world meets C2LIP's premise, from the training split's true object phrases: objects per
    image, vocabulary, and the share of captions a bag of words cannot bind (two objects that differ in both
    color and shape: swapping their colors keeps every word and changes the scene)."""
    if not Path(manifest).is_file():
        return {}
    table = pq.read_table(manifest, columns=["split", "object_phrases"]).to_pydict()
    phrases = [p for s, p in zip(table["split"], table["object_phrases"], strict=True) if s == "train" and p]
    if not phrases:
        return {}
    mentions = [[parse_object_phrase(x) for x in image] for image in phrases]
    objects = [[(m.color, m.shape) for m in image] for image in mentions]
    ambiguous = sum(any(a[0] != b[0] and a[1] != b[1] for i, a in enumerate(o) for b in o[i + 1:]) for o in objects)
    return {"train_images": len(objects), "objects_per_image": sum(map(len, objects)) / len(objects),
            "colors": len({c for o in objects for c, _ in o}), "shapes": len({s for o in objects for _, s in o}),
            "bag_of_words_ambiguous": ambiguous / len(objects)}


# --------------------------------------------------------------------------------------------------
# the runs
# --------------------------------------------------------------------------------------------------


def evaluate_params(params: CompareParams) -> EvaluateParams:
    """The suite every run is judged by: the evaluate params' benchmarks (the variant's files for a world
    variant), one torch thread (runs are evaluated side by side)."""
    evaluate = read_yaml(params.evaluate_params)
    evaluate.update(models=[{"name": "compare", "uri": "unused"}], torch_threads=1, workers=0)
    ev = validate_params("evaluate", evaluate, params.evaluate_params)
    root = world_data(params)["benchmarks_root"]
    if root is not None:  # the variant's suite: same benchmarks, the variant's files
        for name in type(ev.benchmarks).model_fields:
            source = getattr(ev.benchmarks, name)
            for key in ("data_root", "image_root"):
                path = getattr(source, key)
                if path is not None and Path(path).is_relative_to(SHAPESWORLD_SUITE):
                    setattr(source, key, Path(root) / Path(path).relative_to(SHAPESWORLD_SUITE))
    return ev


def plan(params: CompareParams) -> list[Run]:
    """Every (arm, seed) run with its validated train params; an invalid arm is named."""
    base = read_yaml(params.train_params)
    data = world_data(params)
    runs = []
    for arm in params.arms:
        for seed in params.seeds:
            out = params.output_dir / arm.name / f"seed{seed}"
            merged = deep_merge(deep_merge(deep_merge(base, data["train"]), params.common), arm.overrides)
            merged.update(seed=seed, output_dir=str(out / "train"), metrics_path=str(out / "train_metrics.json"),
                          plots_path=str(out / "train_loss.json"), mlflow_experiment=params.mlflow_experiment,
                          preset=f"compare-{arm.name}")
            train = validate_params("train", merged, f"{params.train_params} + arm {arm.name!r}")
            field = other_phrases_field(params, train)
            if field:  # the phrases of the caption this run trains on, not the world's
                merged["data"] = {**merged["data"], "concepts_dir": str(Path(phrases_of_field(params, field)["output_dir"]) / "train")}
                train = validate_params("train", merged, f"{params.train_params} + arm {arm.name!r}")
            runs.append(Run(arm.name, seed, out, train, field))
    return runs


def other_phrases_field(params: CompareParams, train: TrainParams) -> str | None:
    """The caption field a run trains on when it learns noun phrases from the world's phrases but those are parsed
    from another caption (``txt`` is the captions params' caption_field); None when they match, when the run learns
    no phrases or trains on several fields, or when its arm points at phrases of its own."""
    from components.train import needs_phrases

    field = train.data.caption_field
    if not needs_phrases(train) or not isinstance(field, str) or train.data.concepts_dir is None:
        return None
    con = validate_params("concepts", world_concepts(params), params.concepts_params)
    if Path(train.data.concepts_dir).resolve() != (con.output_dir / "train").resolve():
        return None
    chosen = load_params("captions", params.captions_params).caption_field  # what the captions stage wrote as txt
    same = {con.caption_field} | ({"txt", chosen} if con.caption_field in ("txt", chosen) else set())
    return None if field in same else field


@dataclass
class Suite:
    """The loaded benchmark suite, shared by every run's evaluation."""

    params: EvaluateParams
    tasks: list
    fingerprint: str
    not_applicable: list[str]

    @classmethod
    def load(cls, params: EvaluateParams, not_applicable: list[str] | None = None) -> Suite:
        from components import evaluate

        tasks = evaluate.load_suite(params)
        evaluate.check_images(tasks)
        return cls(params, tasks, evaluate.suite_fingerprint(params, tasks), not_applicable or [])


def run_fingerprint(run: Run, suite: Suite) -> str:
    from components.data.stream import expand_shards, inputs_identity

    code = sorted({*stage_code("components.train"), *stage_code("components.evaluate")})
    payload = {"train": run.train.model_dump(mode="json"), "suite": suite.fingerprint}
    # what the run is made from, by content (the paths above are only names): a base rebuilt or shipped under the same
    # path, shards rewritten, phrase files or recaptions regenerated make its runs train again
    try:
        shards = expand_shards(run.train.data.shards)
    except ParamsError:  # no data yet: the run's own train stage says so when it starts
        shards = list(run.train.data.shards)
    payload["made_from"] = inputs_identity(run.train, shards)
    return fingerprint(payload, code)


def finished(run: Run, suite: Suite) -> dict[str, float] | None:
    """The run's metrics when it finished with the same params, suite and code."""
    done = run.dir / "done.json"
    if done.is_file():
        record = json.loads(done.read_text())
        if record.get("fingerprint") == run_fingerprint(run, suite):
            return record["metrics"]
    return None


# What the report keeps of each run's train metrics (components.train's final figures): throughput and its columns
TRAIN_FIGURES = ("samples_per_s", "curves_share", *(key for key, _ in TRAIN_COLUMNS))


def train_and_evaluate(run: Run, suite: Suite, log=print, device: str | None = None) -> dict[str, float]:
    """Train one run in a subprocess with one torch thread (resuming its own checkpoints), then evaluate its
    export on the shared suite in this process; returns flat metrics (``<benchmark>/<metric>``,
    ``summary/<group>``, ``train/samples_per_s``). ``device``: the GPU the training sees (``CUDA_VISIBLE_DEVICES``;
    :class:`DeviceSlots`); None leaves the environment's."""
    from components import evaluate
    from components.shared.params import EvalModelSpec

    if (metrics := finished(run, suite)) is not None:
        log(f"{run.label}: finished earlier (done.json matches)")
        return metrics
    run.dir.mkdir(parents=True, exist_ok=True)
    path = run.dir / "train.yaml"
    atomic_write_bytes(path, yaml.safe_dump(run.train.model_dump(mode="json"), sort_keys=False).encode())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    started = time.time()
    with open(run.dir / "train.log", "ab") as out:  # appended: a resumed run's log keeps what the killed one said
        out.write(f"\n=== compare: training {run.label} ===\n".encode())
        out.flush()
        code = call_logged([sys.executable, "-m", "components.train", "--params", str(path), "--stage", f"compare-{run.arm}"],
                           out, cwd=ROOT, env=env)
    if code != 0:
        tail = (run.dir / "train.log").read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"{run.label}: training failed (exit {code}); see {run.dir / 'train.log'}:\n  " + "\n  ".join(tail))
    trained = time.time()
    spec = EvalModelSpec(name=run.arm, uri=str(run.train.output_dir / "export"))
    tables = evaluate.evaluate_model(spec, suite.tasks, suite.params, suite.fingerprint, quiet=True)
    write_tables(run.dir / "items", tables)  # the paired intervals and the galleries compare runs item by item
    flat = evaluate.flat_metrics(suite.tasks, {run.arm: evaluate.results_of(tables)})
    metrics = {k.split("/", 1)[1]: v for k, v in flat.items()}
    # the train stage's final figures: samples/s, logit scale and bias, and (zero_shot_eval) the held-out geometry
    trained_figures = json.loads(Path(run.train.metrics_path).read_text())
    metrics.update({f"train/{k}": v for k, v in trained_figures.items() if k in TRAIN_FIGURES})
    atomic_write_json(run.dir / "done.json", {"fingerprint": run_fingerprint(run, suite), "metrics": metrics})
    log(f"{run.label}: trained in {trained - started:.0f} s, evaluated in {time.time() - trained:.0f} s")
    return metrics


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


def prepare(params: CompareParams) -> tuple[list[Run], Suite]:
    """The world's data, every run's validated params, and the loaded suite, before any run starts."""
    from components.train import preflight as train_preflight

    owned, expected = report_outputs(params)
    owned.check(expected)  # before any training: a user's file in compare-gallery/ stops the run, untouched
    prepare_world(params)
    runs = plan(params)
    prepare_phrases(params, runs)
    for r in runs:
        train_preflight(r.train)
    ev = evaluate_params(params)
    for name in type(ev.benchmarks).model_fields:
        source = getattr(ev.benchmarks, name)
        if source.enabled and source.data_root is not None and not Path(source.data_root).exists():
            raise ParamsError(f"{params.evaluate_params}: benchmarks.{name}.data_root {source.data_root} does not exist "
                              "(run `dvc repro benchmarks` first)")
    # the tracking store and experiment exist before runs start side by side: two processes creating a
    # fresh SQLite schema (or the same experiment) at once collide
    from components.shared.tracking import use_experiment

    use_experiment(params.mlflow_experiment)
    return runs, Suite.load(ev, applicable_suite(ev) if params.world is not None else [])


def finish(params: CompareParams, runs: list[Run], suite: Suite, results: dict[str, dict[str, float]], log_mlflow: bool = True) -> dict[str, Any]:
    """The report of finished runs (and the MLflow run)."""
    headlines = {t.name: t.headline for t in suite.tasks}
    summary = write_report(params, runs, results, world_figures(world_data(params)["manifest"]), headlines, suite.not_applicable, suite)
    if log_mlflow:
        log_to_mlflow(params, summary)
    return summary


Execute = Callable[[list[Run], Suite, int], dict[str, dict[str, float]]]


def execute_in_threads(runs: list[Run], suite: Suite, parallel: int) -> dict[str, dict[str, float]]:
    """Every run's :func:`train_and_evaluate`, ``parallel`` at a time in a thread pool (each run is a
    one-thread training subprocess, then an evaluation in this process); run label -> metrics."""
    results: dict[str, dict[str, float]] = {}
    bar = TimedBar(total=len(runs), desc="compare", unit="run", dynamic_ncols=True)
    slots = DeviceSlots(parallel)

    def one(r: Run) -> None:
        with slots.take() as device:
            results[r.label] = train_and_evaluate(r, suite, log=bar.write, device=device)
        bar.update(1)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for future in [pool.submit(one, r) for r in runs]:
            future.result()
    bar.close()
    return results


def run(params: CompareParams, log_mlflow: bool = True, execute: Execute = execute_in_threads) -> dict[str, Any]:
    """The comparison: :func:`prepare`, ``execute`` every run (a thread pool here; the Prefect flow passes
    one that makes each run a task), :func:`finish`. Returns the summary."""
    import torch

    torch.set_num_threads(1)  # evaluations run side by side in threads, like the training subprocesses
    # one comparison per output folder at a time (the CLI and the flow alike): two would share run folders and logs
    with one_writer(params.output_dir, "compare"):
        runs, suite = prepare(params)
        # the code the runs' fingerprints hash, read here once: parsing sources in several threads at once trips
        # CPython 3.11's parser ("AST constructor recursion depth mismatch")
        stage_code("components.train"), stage_code("components.evaluate")
        results = execute(runs, suite, params.parallel)
        return finish(params, runs, suite, results, log_mlflow)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params/compare.yaml"), help="params YAML")
    parser.add_argument("--no-mlflow", action="store_true", help="do not log the comparison run to MLflow")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    mark_run()  # then its training subprocesses carry a run id: they die with this process however it ends (kill -9 too)
    try:
        params = load_params("compare", args.params)
        summary = run(params, log_mlflow=not args.no_mlflow)
    except (ParamsError, RuntimeError, BenchmarkError, ForeignFilesError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"compare: wrote {params.report_dir / 'compare.md'}, compare.png, compare.json ({len(summary['arms'])} arms × {len(summary['seeds'])} seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
