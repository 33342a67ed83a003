#!/usr/bin/env bash
# The GPU check in about five minutes on one GPU (docs/performance.md "The GPU check"): the training bench at batch 96
# and 256, a short bf16 train with learning curves, evaluate of its export on the GPU (and on the CPU: the same
# figures in fp32), a two-arm one-seed comparison. One PASS/FAIL line per check; the figures in $OUT/check.json.
#
#   DRY_RUN=1 infra/gpu/check.sh   # first, on the CPU: the same commands at toy sizes
#   infra/gpu/check.sh [WHEELS]    # on the GPU machine; WHEELS: a folder of cp312 wheels for what its Python lacks
#
# Environment: PYTHON (default .venv/bin/python, else python3), WORK (data and runs, default models/gpu-check),
# OUT (reports and check.json, default reports/gpu-check), LEVERS=1 (also time each speed lever alone: a few
# minutes more). Exit status 1 when a check failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ -n "${1:-}" ]; then
  ls "$1"/*.whl >/dev/null || { echo "check.sh: no wheels in $1" >&2; exit 2; }
  "$PY" -m pip install --quiet --no-index --no-deps --target .gpu-site "$1"/*.whl
  export PYTHONPATH="$PWD/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" infra/gpu/check.py
