#!/usr/bin/env bash
# The GPU check in about five minutes on one GPU (docs/performance.md "The GPU check"): the training bench at batch 96
# and 256, a short bf16 train with learning curves, evaluate of its export on the GPU (and on the CPU: the same
# figures in fp32), a two-arm one-seed comparison. One PASS/FAIL line per check; the figures in $OUT/check.json.
#
#   DRY_RUN=1 infra/gpu/check.sh   # first, on the CPU: the same commands at toy sizes
#   infra/gpu/check.sh [WHEELS]    # on the GPU machine; WHEELS (a bare machine only): wheels for its Python of what it lacks
#
# Environment: PYTHON (default .venv/bin/python, else python3), WORK (data and runs, default models/gpu-check),
# OUT (reports and check.json, default reports/gpu-check), LEVERS=1 (also time each speed lever alone: a few
# minutes more). Exit status 1 when a check failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

. infra/gpu/python.sh  # PY, and the carried wheels when a folder of them is given
exec "$PY" infra/gpu/check.py
