"""Serve the ``c2lip`` flow's deployments (full, evaluate, promote, compare) to the Prefect API in PREFECT_API_URL.

    python -m flows.serve          # `make serve` starts a local server first (infra/serve.sh)

The process runs each triggered flow run in this workspace; stop it with Ctrl-C. For a team's server and
GPU machines use a work pool instead (infra/prefect.yaml, docs/getting-started.md "Run it as a service").

The copy-paste line for another shell is printed once every deployment can be read back from the API: printed before,
a quick paste got "deployment not found".
"""

import os
import threading
import time

from prefect import serve

from flows.c2lip import compare_methods, evaluate, full, promote

NAMES = ("full", "evaluate", "promote", "compare")


def deployments():
    return [
        full.to_deployment("full", description=full.__doc__, tags=["c2lip"]),
        evaluate.to_deployment("evaluate", description=evaluate.__doc__, tags=["c2lip"]),
        promote.to_deployment("promote", description=promote.__doc__, tags=["c2lip"]),
        compare_methods.to_deployment("compare", description=compare_methods.__doc__, tags=["c2lip"]),
    ]


def all_served() -> bool:
    """True once the API returns every deployment of :data:`NAMES`."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            for name in NAMES:
                client.read_deployment_by_name(f"c2lip/{name}")
        except Exception:  # noqa: BLE001 - not registered yet (ObjectNotFound) or the API busy: ask again
            return False
    return True


def announce_when_served(poll_s: float = 1.0) -> None:
    """Print the line a user pastes into another shell, once :func:`all_served` (polled every ``poll_s``)."""
    while not all_served():
        time.sleep(poll_s)
    api = os.environ.get("PREFECT_API_URL", "")
    print(f"Deployments served: {', '.join(f'c2lip/{n}' for n in NAMES)}", flush=True)
    print(f"In another shell:  PREFECT_API_URL={api} .venv/bin/prefect deployment run c2lip/full --watch", flush=True)


if __name__ == "__main__":
    threading.Thread(target=announce_when_served, daemon=True, name="announce").start()
    serve(*deployments())
