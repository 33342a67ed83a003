"""The Prefect server `make serve` starts (infra/serve.sh): Prefect's own app and services, as `prefect server start`
runs them in the foreground, behind Starlette's TrustedHostMiddleware.

    python -m flows.prefect_server --port 4200

CORS keeps other sites' pages from calling the API, but a page whose DNS name is rebound to 127.0.0.1 calls it as
its own origin; its requests still carry its own name in ``Host``, which this server refuses (400). Only requests
addressed to 127.0.0.1 or localhost are served: the UI, the CLI and the workers on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys

LOOPBACK_NAMES = ["127.0.0.1", "localhost"]
CORS_SETTING = "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"


def own_origins(port: int) -> str:
    """The UI's own origins: the only pages that may call the API from a browser (Prefect's default is every origin)."""
    return ",".join(f"http://{name}:{port}" for name in LOOPBACK_NAMES)


def app():
    """Prefect's server app (API, UI and services) that answers only loopback names."""
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    served = create_app(final=True)
    served.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_NAMES)
    return served


def main(argv: list[str] | None = None) -> int:
    import uvicorn
    from prefect.settings import PREFECT_SERVER_LOGGING_LEVEL

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=4200)
    args = parser.parse_args(argv)
    # run alone (its documented use) as under `make serve`: the UI's own origins only, unless the environment names others
    os.environ.setdefault(CORS_SETTING, own_origins(args.port))
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level=PREFECT_SERVER_LOGGING_LEVEL.value().lower())
    return 0


if __name__ == "__main__":
    sys.exit(main())
