"""MLflow set-up shared by the stages: where runs go, unless the environment says otherwise.

Default: a SQLite file and an artifact folder inside the project (both ignored by git), so a fresh
clone tracks locally with no server; ``MLFLOW_TRACKING_URI`` (and ``C2LIP_MLFLOW_ARTIFACTS`` for a new
experiment's artifact root) point everything at a team's server instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from components.shared.params import ROOT
from components.shared.redact import redact


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlflow.db'}"


def use_experiment(name: str):
    """Point MLflow at the tracking URI and experiment ``name`` (created with our artifact root); returns mlflow."""
    import mlflow

    # MLflow's own "View run … at: <tracking URI>" lines would print a server URI's password; where_to_watch says it
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    mlflow.set_tracking_uri(default_tracking_uri())
    if mlflow.get_experiment_by_name(name) is None:
        artifacts = os.environ.get("C2LIP_MLFLOW_ARTIFACTS") or (ROOT / "mlartifacts").as_uri()
        mlflow.create_experiment(name, artifact_location=artifacts)
    mlflow.set_experiment(name)
    return mlflow


def where_to_watch(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """One line saying where a run's live step charts are: its page on a tracking server, or for the local store the
    `mlflow ui` command that serves it (then the same page)."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}"
    uri = redact(tracking_uri)  # a server's URI may carry its user's password
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow run {run_id}: {uri.rstrip('/')}/{page}"
    return (f"MLflow run {run_id} (local store {uri}): `.venv/bin/mlflow ui --backend-store-uri {uri}` "
            f"serves it live at http://127.0.0.1:5000/{page}")


def report_run(experiment: str, report_dir) -> str | None:
    """Where the MLflow run that logged the report in ``report_dir`` is (:func:`where_to_watch`), found by the folder the
    evaluate stage tags its run with; None when no such run is tracked (logging off, another tracking store)."""
    import mlflow

    mlflow.set_tracking_uri(default_tracking_uri())
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        return None
    folder = str(Path(report_dir).resolve())
    if "'" in folder:  # not expressible in MLflow's filter syntax
        return None
    runs = mlflow.search_runs([found.experiment_id], filter_string=f"tags.report_dir = '{folder}'",
                              order_by=["attributes.start_time DESC"], max_results=1, output_format="list")
    return where_to_watch(mlflow.get_tracking_uri(), found.experiment_id, runs[0].info.run_id) if runs else None


def start_training_run(params, stage: str):
    """The MLflow run of a train-stage run (rank 0): its params flattened, its tags, where to watch it (one line on
    stderr); returns the mlflow module with the run active."""
    import sys

    from components.shared.params import flatten_params

    mlflow = use_experiment(params.mlflow_experiment)
    run = mlflow.start_run(run_name=f"{stage}-{params.preset}-{params.method.name}", log_system_metrics=True)
    mlflow.log_params(flatten_params(params))
    mlflow.set_tags({"stage": stage, "method": params.method.name, "preset": params.preset})
    print(f"{stage}: {where_to_watch(mlflow.get_tracking_uri(), run.info.experiment_id, run.info.run_id)}", file=sys.stderr, flush=True)
    return mlflow
