"""Prefect flows of c2lip: the flow ``c2lip`` with its deployments full, evaluate, promote and compare
(:mod:`flows.c2lip`), the data stages sharded over Dask (:mod:`flows.sharded`), the workspace lock and the
run-scoped params overrides (:mod:`flows.workspace`).

Each flow task runs `dvc repro <stage>` so that DVC decides what is stale (docs/architecture.md, "Data flow").
"""
