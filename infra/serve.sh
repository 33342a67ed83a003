#!/usr/bin/env bash
# A local Prefect server on 127.0.0.1 (port PREFECT_PORT, default 4200) and the c2lip deployments served
# to it from this workspace, the reports (C2LIP_REPORTS_PORT, default 4201) and the MLflow UI (C2LIP_MLFLOW_PORT,
# default 5000). Ctrl-C stops both. Run through `make serve` (which sets up .venv first).
# `infra/serve.sh --print-settings` prints the server settings it would use and exits (the tests read them).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PREFECT_PORT:-4200}"
export PREFECT_HOME="${PREFECT_HOME:-$PWD/.prefect}"
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
# Only the UI's own origin may call the API from a browser: Prefect's default ('*') lets any web page the user
# opens start runs on this machine. A team server adds basic authentication with PREFECT_SERVER_API_AUTH_STRING
# (server) and PREFECT_API_AUTH_STRING (clients and workers); see docs/reliability.md.
export PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS="${PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS:-http://127.0.0.1:${PORT},http://localhost:${PORT}}"
if [ "${1:-}" = "--print-settings" ]; then
  echo "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS=$PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"
  exit 0
fi
mkdir -p "$PREFECT_HOME"
# Prefect's server as `prefect server start` runs it, answering only requests addressed to 127.0.0.1/localhost (a page
# that rebinds its DNS name to this machine is refused: flows/prefect_server.py)
python -m flows.prefect_server --port "$PORT" > "$PREFECT_HOME/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
# wait for as long as the server is starting (a loaded machine may take minutes); a server that exits is an error
until python -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=5)" 2>/dev/null; do
  if ! kill -0 $SERVER 2>/dev/null; then echo "prefect server failed to start; see $PREFECT_HOME/server.log" >&2; exit 1; fi
  sleep 1
done
# the reports (benchmark report, failure galleries) over http on 127.0.0.1 only, read-only: the flow's link artifacts
# point here, since a browser refuses file:// links from the Prefect UI's page. No listings, no links followed, only
# requests addressed to 127.0.0.1/localhost (flows/reports_server.py)
REPORTS_PORT="${C2LIP_REPORTS_PORT:-4201}"
mkdir -p reports
python -m flows.reports_server --port "$REPORTS_PORT" --directory reports > "$PREFECT_HOME/reports-server.log" 2>&1 &
REPORTS=$!
# the MLflow UI on 127.0.0.1, so the "MLflow run" links of the flow's artifacts open (the local store; a team's
# MLFLOW_TRACKING_URI serves its own UI)
MLFLOW_PORT="${C2LIP_MLFLOW_PORT:-5000}"
MLFLOW_UI=""
if [ -z "${MLFLOW_TRACKING_URI:-}" ]; then
  mlflow ui --backend-store-uri "sqlite:///$PWD/mlflow.db" --host 127.0.0.1 --port "$MLFLOW_PORT" > "$PREFECT_HOME/mlflow-ui.log" 2>&1 &
  MLFLOW_UI=$!
fi
# Every process this started goes when it ends, however it ends (Ctrl-C, SIGTERM, an error): SIGTERM first, then, for
# one still running after 10 s (the deployments' process has ignored a first SIGTERM), SIGKILL
PIDS="$SERVER $REPORTS $MLFLOW_UI"
stop_all() {
  kill $PIDS 2>/dev/null || true
  for _ in $(seq 1 20); do
    alive=""
    for pid in $PIDS; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && return 0
    sleep 0.5
  done
  kill -9 $PIDS 2>/dev/null || true
}
trap stop_all EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
export C2LIP_REPORTS_URL="http://127.0.0.1:${REPORTS_PORT}"
echo "Prefect server: http://127.0.0.1:${PORT} (UI and API); log in $PREFECT_HOME/server.log"
echo "Reports: $C2LIP_REPORTS_URL/benchmarks.md, failure gallery $C2LIP_REPORTS_URL/gallery/index.html"
if [ -n "$MLFLOW_UI" ]; then
  echo "MLflow UI: http://127.0.0.1:${MLFLOW_PORT} (runs, metrics, the registry: it opens in its GenAI view; choose \"Model training\" at the top left to see them); log in $PREFECT_HOME/mlflow-ui.log"
fi
echo "Serving the deployments; the line to paste into another shell follows once they exist ..."
# in the background and waited for: bash runs its traps only between commands, so a foreground child would keep a
# SIGTERM to this script waiting until the child chose to exit
python -m flows.serve &
PIDS="$PIDS $!"
wait $!
