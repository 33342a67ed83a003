# Sourced by the GPU scripts (check.sh, binding.sh) from the repository root: sets PY, the Python they run, and with
# a folder of wheels as their first argument installs those into .gpu-site/ (a bare GPU machine lacks our packages;
# spaCy is not among them) and puts it on PYTHONPATH.
#   PYTHON: the interpreter (default .venv/bin/python, else python3)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ -n "${1:-}" ]; then
  ls "$1"/*.whl >/dev/null || { echo "$(basename "$0"): no wheels in $1" >&2; exit 2; }
  "$PY" -m pip install --quiet --no-index --no-deps --target .gpu-site "$1"/*.whl
  export PYTHONPATH="$PWD/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
