#!/usr/bin/env bash
# A local Prefect server on 127.0.0.1 (port PREFECT_PORT, default 4200) and the c2lip deployments served
# to it from this workspace. Ctrl-C stops both. Run through `make serve` (which sets up .venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PREFECT_PORT:-4200}"
export PREFECT_HOME="${PREFECT_HOME:-$PWD/.prefect}"
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
prefect server start --host 127.0.0.1 --port "$PORT" > "$PREFECT_HOME/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  if python -c "import urllib.request,sys; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=1)" 2>/dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then echo "prefect server failed to start; see $PREFECT_HOME/server.log" >&2; exit 1; fi
  sleep 1
done
echo "Prefect server: http://127.0.0.1:${PORT} (UI and API); log in $PREFECT_HOME/server.log"
echo "In another shell:  PREFECT_API_URL=$PREFECT_API_URL .venv/bin/prefect deployment run c2lip/full"
python -m flows.serve
