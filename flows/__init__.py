"""Prefect flows of c2lip (flow name "c2lip"; deployments full, evaluate, promote, ...).

Each flow task runs `dvc repro <stage>` so that DVC decides what is stale (DESIGN.md, "Data flow").
The flows arrive with the orchestration issue; until then `make run` (= `dvc repro`) runs the stages.
"""
