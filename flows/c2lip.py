"""The Prefect flow ``c2lip``: its deployments ``full``, ``evaluate``, ``promote`` and ``compare``.

    python -m flows.c2lip            # the full flow once, locally, no server (what `make run` does)
    python -m flows.c2lip compare    # the comparison of methods once, locally (`make compare`)
    python -m flows.serve            # serve the four deployments to a Prefect server (`make serve`)
    prefect deployment run c2lip/full --param overrides='{"train": {"steps": 600}}'

``full`` runs every DVC stage as ``dvc repro <stage>`` in a subprocess (DVC decides what is stale; no
Prefect result caching), pushes DVC's outputs to the default remote, and registers the trained export in
the MLflow registry with the ``challenger`` alias. Overrides are partial params — typed by the stages'
pydantic models, merged over ``params/<stage>.yaml`` and validated before any work — written to the
params files only for the run (the originals are put back, byte for byte) and recorded as a DVC
experiment (``dvc exp show``) and in MLflow (the stages log their params; the version is tagged).
One run per workspace at a time (:mod:`flows.workspace`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field, create_model

from components.shared.markdown_text import md_literal
from components.shared.params import ROOT, EvalModelSpec, ParamsError, SuiteParams, load_params
from components.shared.params import STAGES as PARAM_MODELS
from components.shared.processes import die_with_parent, mark_run
from components.shared.redact import redact
from components.shared.written import ForeignFilesError
from components.suite.compare_report import report_outputs
from components.suite.model_loading import model_found
from flows.progress import ProgressLog, follow
from flows.run_page import (
    absolute_links,
    artifact_key,
    create_markdown_artifact,
    final_summary,
    mlflow_line,
    publish_galleries,
    reason_in_state,
    report_summary,
)
from flows.workspace import (
    WorkspaceBusy,
    confine_paths,
    holder_if_busy,
    output_dir_inside,
    resolve_overrides,
    run_with_overrides,
    workspace_lock,
)

PROGRESS = re.compile(r"\d+%\|")
PIPELINE = ["captions", "recaption", "concepts", "base", "train", "benchmarks", "evaluate"]
# Every stage resumes (finished shards, checkpoints, cached model results), so a retry repeats no
# finished work; base is frozen (a retry is a no-op) and train's retry resumes from its last checkpoint.
RETRIES = {"captions": 2, "recaption": 1, "concepts": 1, "base": 0, "train": 1, "benchmarks": 1, "evaluate": 1}


# --------------------------------------------------------------------------------------------------
# typed overrides: every stage's params model with every field optional
# --------------------------------------------------------------------------------------------------


def partial_model(cls: type[BaseModel]) -> type[BaseModel]:
    """``cls`` with every field optional (nested params models likewise): what a run may override."""
    fields: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = partial_model(annotation)
        fields[name] = (annotation | None, Field(None, description=info.description))
    return create_model(f"{cls.__name__}Override", __config__=ConfigDict(extra="forbid"), __doc__=cls.__doc__, **fields)


_OVERRIDABLE = ["captions", "recaption", "concepts", "train", "benchmarks", "evaluate", "registry"]
RunOverrides = create_model(
    "RunOverrides",
    __config__=ConfigDict(extra="forbid"),
    __doc__="Params to change for one run, per stage (unset: the workspace's params/{stage}.yaml).",
    **{stage: (partial_model(PARAM_MODELS[stage]) | None, Field(None, description=f"Overrides of params/{stage}.yaml."))
       for stage in _OVERRIDABLE},
)


def overrides_dict(overrides: BaseModel | dict | None) -> dict[str, dict[str, Any]]:
    """Only what the caller set, as plain JSON values."""
    if overrides is None:
        return {}
    if isinstance(overrides, dict):
        overrides = RunOverrides.model_validate(overrides)
    return overrides.model_dump(mode="json", exclude_unset=True)


# --------------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    # the venv's dvc and python first, whatever PATH the worker was started with
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # `dvc exp save` commits: on a machine without a git identity (a fresh worker) it would fail
    identity = subprocess.run(["git", "config", "user.email"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if not identity and "GIT_AUTHOR_EMAIL" not in env:
        env.update(GIT_AUTHOR_NAME="c2lip flow", GIT_AUTHOR_EMAIL="c2lip-flow@localhost",
                   GIT_COMMITTER_NAME="c2lip flow", GIT_COMMITTER_EMAIL="c2lip-flow@localhost")
    return env


def _dvc_dies_with_the_flow() -> None:
    die_with_parent(signal.SIGTERM)


def run_command(args: list[str], cwd: Path = ROOT) -> str:
    """Run a command, streaming its output into the flow's log; raise with its tail when it fails."""
    logger = get_run_logger()
    logger.info("$ %s", " ".join(args))
    # dvc dies with the flow (and the stage under it with dvc, components.shared.processes), however the flow ends
    proc = subprocess.Popen(args, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            preexec_fn=_dvc_dies_with_the_flow)
    progress = ProgressLog(logger)  # a bar: a line per tenth or per C2LIP_PROGRESS_EVERY_S, and a progress artifact
    # a bar of another format: its end only
    lines = follow(proc.stdout, logger, " ".join(args), progress, other=lambda line: not PROGRESS.search(line) or "100%|" in line)
    if proc.wait():
        tail = redact("\n".join(lines[-30:]))
        raise RuntimeError(f"`{' '.join(args)}` failed with exit code {proc.returncode}:\n{tail}")
    return "\n".join(lines)


@task(cache_policy=NO_CACHE, task_run_name="dvc repro {stage}")
def dvc_repro(stage: str) -> None:
    run_command(["dvc", "repro", stage])


@task(cache_policy=NO_CACHE, task_run_name="dvc exp save {name}")
def dvc_exp_save(name: str) -> None:
    run_command(["dvc", "exp", "save", "--force", "--name", name])


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def dvc_push() -> None:
    run_command(["dvc", "push"])


@task(cache_policy=NO_CACHE)
def register_task(tags: dict[str, str]) -> dict[str, Any]:
    from components import register

    version = register.register(load_params("registry"), extra_tags=tags)
    return {"name": version.name, "version": str(version.version), "aliases": list(version.aliases)}


# --------------------------------------------------------------------------------------------------
# flows (one flow name, four deployments)
# --------------------------------------------------------------------------------------------------


@flow(name="c2lip", log_prints=True)
@reason_in_state
def full(overrides: RunOverrides | None = None, register_version: bool = True, push: bool = True,
         wait_for_workspace_s: float = 0.0) -> dict[str, Any]:
    """Every stage (dvc repro), DVC push, then registration of the trained model as the challenger."""
    changes = overrides_dict(overrides)
    for stage, values in changes.items():  # every path a caller sets stays inside the workspace
        confine_paths(ROOT, values, PARAM_MODELS[stage], stage)
    resolve_overrides(ROOT, changes)  # a bad override fails here, before waiting for the workspace or any work
    name = str(flow_run.get_name() or f"local-{int(time.time())}")
    started = time.perf_counter()
    result: dict[str, Any] = {"flow_run": name, "overrides": changes}
    # the params files are read and merged only once the lock is held (run_with_overrides): a killed run's
    # originals are back by then, and a run queued behind another never sees that run's overrides
    with run_with_overrides(ROOT, changes, f"flow run {name}", wait_for_workspace_s) as merged:
        for stage in PIPELINE:
            dvc_repro.with_options(retries=RETRIES[stage])(stage)
        if merged:
            experiment = f"{artifact_key(name)}-{int(time.time())}"
            dvc_exp_save(experiment)
            result["dvc_experiment"] = experiment
        if register_version:
            tags = {"flow_run": name, "overrides": json.dumps(changes, sort_keys=True)}
            result["registered"] = register_task(tags)
        if push:  # DVC pushes outputs, which the params files do not change
            dvc_push()
    result["seconds"] = round(time.perf_counter() - started, 1)
    registered = result.get("registered")
    lines = [f"# c2lip full run `{name}`", "",
             f"Overrides: {md_literal(json.dumps(changes))}" if changes else "Overrides: none (the workspace's params).",
             f"Registered: `{registered['name']}` version {registered['version']} (aliases {registered['aliases']})" if registered else "Not registered.",
             "", report_summary(), "", f"Full report: `{ROOT / 'reports' / 'benchmarks.md'}`", *mlflow_line(ROOT / "reports")]
    create_markdown_artifact(markdown="\n".join(lines), key="c2lip-full", description="Benchmark summary of the run")
    galleries = publish_galleries(ROOT / "reports" / "gallery", "c2lip-full-gallery")
    for line in final_summary(ROOT / "reports" / "intervals.json", galleries, ROOT / "models" / "train" / "export" / "README.md"):
        get_run_logger().info(line)
    return result


def ensure_default_suite(params, build) -> bool:
    """Build ShapesWorld's suite (``build("benchmarks")``: `dvc repro benchmarks`) when the evaluate params read it and it
    is not there; True when it was built. A suite of the user's own files is never built, only read."""
    from components.benchmarks import SUITE_MARKER

    default = ROOT / "data" / "benchmarks" / "shapesworld"
    roots = {Path(getattr(params.benchmarks, name).data_root) for name in type(params.benchmarks).model_fields
             if getattr(getattr(params.benchmarks, name), "enabled", True)}
    reads_default = any((root if root.is_absolute() else ROOT / root).resolve().is_relative_to(default.resolve()) for root in roots)
    if not reads_default or (default / SUITE_MARKER).is_file():
        return False
    print("evaluate: ShapesWorld's benchmark suite is not built in this workspace yet; building it (dvc repro benchmarks)")
    build("benchmarks")
    return True


@task(cache_policy=NO_CACHE, task_run_name="evaluate {label}")
def evaluate_stage(params, label: str) -> dict[str, float]:
    """The evaluate stage in its own process, as `dvc repro evaluate` runs it, so its bars reach the flow's log (a line
    per tenth) and the run's page (a progress artifact per bar) instead of the worker's stderr; its flat metrics."""
    with tempfile.TemporaryDirectory(prefix="c2lip-evaluate-") as tmp:
        path = Path(tmp) / "evaluate.yaml"
        path.write_text(yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
        run_command([sys.executable, "-m", "components.evaluate", "--params", str(path)])
    return json.loads((params.output_dir / "metrics.json").read_text())


@flow(name="c2lip", log_prints=True)
@reason_in_state
def evaluate(model: EvalModelSpec, reference: EvalModelSpec | None = None, benchmarks: SuiteParams | None = None,
             output_dir: str = "reports/adhoc", wait_for_workspace_s: float = 0.0) -> dict[str, float]:
    """The benchmark suite for one model (a registered version or alias, a checkpoint, an export folder
    or an open_clip name + tag), beside an optional reference; outside DVC, under ``output_dir`` (inside the
    workspace, or a folder the worker's C2LIP_OUTSIDE_ROOTS admits)."""
    report_dir = output_dir_inside(ROOT, output_dir, model.name)  # before any work
    for where, spec in (("model", model), ("reference", reference)):  # a model's uri may be a local path: confined too
        if spec is not None:
            confine_paths(ROOT, spec.model_dump(mode="json", exclude_unset=True), EvalModelSpec, where)
    if benchmarks is not None:  # the suite's files are read from the workspace too
        confine_paths(ROOT, benchmarks.model_dump(mode="json", exclude_unset=True), SuiteParams, "benchmarks")
    params = load_params("evaluate")
    params.models = [m for m in (reference, model) if m is not None]
    if benchmarks is not None:
        params.benchmarks = benchmarks
    params.output_dir = report_dir
    for spec in params.models:  # a missing alias (no champion yet) or path, before a suite is built or a model scored
        model_found(spec)
    # two runs never share a workspace: this one builds the suite with DVC and writes the evaluate cache
    with workspace_lock(ROOT, f"flow run {flow_run.get_name() or 'local'} (evaluate {model.name})", wait_for_workspace_s):
        ensure_default_suite(params, dvc_repro)  # a fresh clone has no ShapesWorld suite yet: build it, do not fail on it
        flat = evaluate_stage(params, model.name)
    report = absolute_links((params.output_dir / "benchmarks.md").read_text(), params.output_dir)
    text = "\n".join([report, *mlflow_line(params.output_dir, params.mlflow_experiment)])
    create_markdown_artifact(markdown=text, key=artifact_key(f"c2lip-evaluate-{model.name}"), description=f"Benchmarks of {model.name}")
    publish_galleries(params.output_dir / "gallery", f"c2lip-evaluate-{model.name}-gallery")
    return {k: v for k, v in flat.items() if "/summary/" in k}


@flow(name="c2lip", log_prints=True)
@reason_in_state
def promote(candidate: str = "challenger") -> dict[str, Any]:
    """Move the champion alias to ``candidate`` (alias or version) when params/registry.yaml's gates hold."""
    from components import register as reg

    params = load_params("registry")
    try:
        result = reg.promote(params, candidate)
    except reg.PromotionRefused as refused:
        create_markdown_artifact(markdown=refused.promotion.markdown(), key="c2lip-promotion", description="Promotion refused")
        raise
    create_markdown_artifact(markdown=result.markdown(), key="c2lip-promotion", description="Promotion")
    print(result.message)
    return {"promoted": result.promoted, "version": result.version, "champion_before": result.champion_before, "message": result.message}


CompareOverrides = partial_model(PARAM_MODELS["compare"])


@task(cache_policy=NO_CACHE, retries=1, task_run_name="{run.arm} seed {run.seed}")
def compare_run(run, suite, gate) -> dict[str, float]:
    """Train one arm for one seed (subprocess, one thread) and evaluate it; a retry resumes its checkpoints.
    ``gate`` (compare.DeviceSlots) holds back all but ``parallel`` runs (every task is submitted at once) and gives each
    a GPU of the machine when it has some."""
    from components import compare

    with gate.take() as device:
        return compare.train_and_evaluate(run, suite, log=get_run_logger().info, device=device)


def execute_as_tasks(runs, suite, parallel: int) -> dict[str, dict[str, float]]:
    """compare.run's executor inside the flow: each run a Prefect task, ``parallel`` running at once."""
    from components import compare

    gate = compare.DeviceSlots(parallel)
    futures = {run.label: compare_run.submit(run, suite, gate) for run in runs}
    return {label: future.result() for label, future in futures.items()}


@flow(name="c2lip", log_prints=True)
@reason_in_state
def compare_methods(overrides: CompareOverrides | None = None, wait_for_workspace_s: float = 0.0) -> dict[str, Any]:
    """Every method of params/compare.yaml (siglip, c2lip, clic, negclip, hp_hn and the controls) fine-tuned
    from the same base with the same budget over several seeds, `parallel` runs at a time, each judged by the
    benchmark suite; report in reports/compare.md / compare.png, one MLflow run, a markdown artifact."""
    from components import compare

    changes = overrides.model_dump(mode="json", exclude_unset=True) if isinstance(overrides, BaseModel) else dict(overrides or {})
    confine_paths(ROOT, changes, PARAM_MODELS["compare"], "compare")  # every path a caller sets stays inside the workspace
    # the train-param mappings (common, each arm's overrides) are free dicts to the compare schema: checked as train params
    confine_paths(ROOT, changes.get("common") or {}, PARAM_MODELS["train"], "compare.common")
    for k, arm in enumerate(changes.get("arms") or []):
        confine_paths(ROOT, (arm or {}).get("overrides") or {}, PARAM_MODELS["train"], f"compare.arms[{k}].overrides")
    params = compare_preflight(changes)  # a bad override or a file of yours among the outputs: here, before any work
    name = str(flow_run.get_name() or f"local-{int(time.time())}")
    started = time.perf_counter()
    with workspace_lock(ROOT, f"flow run {name} (compare)", wait_for_workspace_s):
        if params.world is None:  # the pipeline's own data and suite (a variant is generated by compare)
            for stage in ("captions", "recaption", "concepts", "benchmarks"):
                dvc_repro.with_options(retries=RETRIES[stage])(stage)
        summary = compare.run(params, execute=execute_as_tasks)
    text = absolute_links((params.report_dir / "compare.md").read_text(), params.report_dir)
    create_markdown_artifact(markdown=text, key="c2lip-compare", description="Comparison of methods")
    publish_galleries(params.report_dir / "compare-gallery", "c2lip-compare-gallery")
    return {"arms": summary["arms"], "seeds": summary["seeds"], "paired": {a: {g: round(v["mean"], 4) for g, v in groups.items()}
            for a, groups in summary["paired"].items()}, "seconds": round(time.perf_counter() - started, 1)}


def compare_preflight(changes: dict[str, Any]):
    """The comparison's params, validated, and its report outputs checked (a file of yours among them stops it, named)
    before any data stage runs; `make compare` calls it before Prefect's server starts too."""
    from components import compare

    params = compare.params_with(changes)
    owned, expected = report_outputs(params)
    owned.check(expected)
    return params


def where_results_are(result: dict[str, Any]) -> str:
    from components.shared.tracking import default_tracking_uri

    registered = result.get("registered")
    db = redact(default_tracking_uri())
    return "\n".join([
        f"benchmark report:   {ROOT / 'reports' / 'benchmarks.md'} (chart: reports/benchmarks.png)",
        f"metrics:            {ROOT / 'reports' / 'metrics.json'} (dvc metrics show)",
        f"MLflow:             {db}  →  mlflow ui --backend-store-uri {db} --host 127.0.0.1",
        (f"registered model:   models:/{registered['name']}/{registered['version']} (alias {', '.join(registered['aliases'])})"
         if registered else "registered model:   (not registered)"),
        f"took:               {result['seconds']} s",
    ])


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds the flow: params put back, lock released, Prefect's server stopped


def main(argv: list[str] | None = None) -> int:
    """`make run` (the full flow) and `make compare`, once, locally. A workspace another run holds is refused at once in
    one line (before Prefect's server starts), unless ``--wait`` queues behind it."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flows.c2lip", description="The c2lip flow once, locally.")
    parser.add_argument("what", nargs="?", choices=["full", "compare"], default="full", help="full (make run) or compare (make compare)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long for another run to release the workspace (make run WAIT=SECONDS)")
    args = parser.parse_args(argv)
    holder = holder_if_busy(ROOT)
    if holder is not None and args.wait <= 0:
        print(f"c2lip: another c2lip run holds the workspace {ROOT} ({holder}); nothing was changed. Wait for it, or queue "
              f"behind it: make {'compare' if args.what == 'compare' else 'run'} WAIT=<seconds>", file=sys.stderr)
        return 2
    try:
        if args.what == "compare":
            compare_preflight({})
    except (ForeignFilesError, ParamsError) as err:
        print(f"c2lip: {err}", file=sys.stderr)
        return 2
    mark_run()  # before Prefect starts its server: every process of this run carries the id
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if args.what == "compare":
            outcome = compare_methods(wait_for_workspace_s=args.wait)
            print(f"\ncomparison report: {ROOT / 'reports' / 'compare.md'} (chart: reports/compare.png); took {outcome['seconds']} s")
        else:
            outcome = full(wait_for_workspace_s=args.wait)
            print("\n" + where_results_are(outcome))
    # refusals before any work, one line each: another run took the workspace between the check and the flow, a file of
    # yours among the comparison's outputs, a params file that does not validate
    except (WorkspaceBusy, ForeignFilesError, ParamsError) as err:
        print(f"c2lip: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
