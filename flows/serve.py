"""Serve the ``c2lip`` flow's deployments (full, evaluate, promote, compare) to the Prefect API in PREFECT_API_URL.

    python -m flows.serve          # `make serve` starts a local server first (infra/serve.sh)

The process runs each triggered flow run in this workspace; stop it with Ctrl-C. For a team's server and
GPU machines use a work pool instead (infra/prefect.yaml, docs/getting-started.md "Run it as a service").
"""

from prefect import serve

from flows.c2lip import compare_methods, evaluate, full, promote


def deployments():
    return [
        full.to_deployment("full", description=full.__doc__, tags=["c2lip"]),
        evaluate.to_deployment("evaluate", description=evaluate.__doc__, tags=["c2lip"]),
        promote.to_deployment("promote", description=promote.__doc__, tags=["c2lip"]),
        compare_methods.to_deployment("compare", description=compare_methods.__doc__, tags=["c2lip"]),
    ]


if __name__ == "__main__":
    serve(*deployments())
