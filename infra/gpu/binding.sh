#!/usr/bin/env bash
# The binding study on one GPU in about 10 minutes (docs/gpus.md "The binding study on one GPU"): the data stages
# regenerate ShapesWorld, then params/presets/binding/compare-binding-gpu.yaml runs (the methods from random weights and the
# positive control from the web-like base, 6 seeds, learning curves, samples to reach swap_att 0.6).
#
#   infra/gpu/binding.sh [WHEELS]   # on the GPU machine; WHEELS (a bare machine only): wheels for its Python of what it lacks
#   DRY_RUN=1 infra/gpu/binding.sh  # on CPU first: the same commands, 2 steps of 8 per run, one seed
#
# Environment: PYTHON (default .venv/bin/python, else python3), LIMIT_S (the comparison's time limit, default 480 s;
# a run cut off resumes from its checkpoints when the script is run again), OUT (a folder the report is copied to).
set -euo pipefail
cd "$(dirname "$0")/../.."

. infra/gpu/python.sh  # PY, and the carried wheels when a folder of them is given
started=$(date +%s)

# captions, recaption and concepts skip finished shards; benchmarks rebuilds its suite (~90 s on 2 cores)
# through DVC where it is installed (a workstation: the pipeline's outputs stay as dvc.lock records them), else the
# stage modules themselves (the bare GPU machine)
DVC=$(command -v dvc || true); [ -x .venv/bin/dvc ] && DVC=.venv/bin/dvc
if [ -n "$DVC" ]; then
  "$DVC" repro captions recaption concepts benchmarks
else
  for stage in captions recaption concepts benchmarks; do
    "$PY" -m "components.$stage" --params "params/$stage.yaml"
  done
fi
echo "binding.sh: data ready after $(( $(date +%s) - started )) s"

if [ "${STUDY:-binding}" = calibrated ]; then
  # GPU sizing: four runs at a time, three loader workers each (16 cores); the dry run: 2 steps of 8, one seed, its own folders
  tmp=$(mktemp -d)
  "$PY" - "$tmp" "${DRY_RUN:-0}" <<'PYEOF'
import sys

import yaml

tmp, dry = sys.argv[1], sys.argv[2] == "1"
base = yaml.safe_load(open("params/presets/calibration/base-calibrated.yaml"))
bases = yaml.safe_load(open("params/presets/calibration/evaluate-bases.yaml"))
paper = yaml.safe_load(open("params/presets/calibration/paper-calibrated.yaml"))
base["data"]["workers"] = 3
paper.update(parallel=4)
paper["common"]["data"]["workers"] = 3
if dry:
    base.update(steps=2, global_batch=8, micro_batch=8, checkpoint_every=1, zero_shot_every=1, output_dir="models/base-calibrated-dry-run",
                metrics_path=f"{tmp}/base.json", plots_path=f"{tmp}/base_loss.json")
    base["data"]["workers"] = 1
    bases["models"][1]["uri"] = "models/base-calibrated-dry-run/export"
    bases["output_dir"] = "reports/dry-run-bases"
    paper.update(seeds=[0], parallel=2, output_dir="models/calibrated-dry-run", report_dir="reports/dry-run-calibrated")
    paper["common"].update(steps=2, global_batch=8, micro_batch=8, checkpoint_every=1)
    paper["common"]["data"]["workers"] = 1
    paper["common"]["model"]["init"] = "models/base-calibrated-dry-run/export"
for name, cfg in (("base", base), ("bases", bases), ("paper", paper)):
    yaml.safe_dump(cfg, open(f"{tmp}/{name}.yaml", "w"), sort_keys=False)
with open(f"{tmp}/dirs", "w") as out:
    print(bases["output_dir"], paper["report_dir"], file=out)
PYEOF
  read -r bases_dir report < "$tmp/dirs"
  "$PY" -m components.train --params "$tmp/base.yaml" --stage base-calibrated
  echo "binding.sh: calibrated base after $(( $(date +%s) - started )) s"
  "$PY" -m components.evaluate --params "$tmp/bases.yaml"
  timeout "${LIMIT_S:-480}" "$PY" -m components.compare --params "$tmp/paper.yaml"
  "$PY" -m components.suite.calibration --base "$bases_dir/metrics.json" --base-arm base-calibrated --arms "$report/compare.json" \
    --out "$report/calibration.json"
  echo "binding.sh: done after $(( $(date +%s) - started )) s; report: $report/compare.md, table: $report/calibration.json"
  if [ -n "${OUT:-}" ]; then
    cp "$bases_dir"/benchmarks.md "$report"/compare.md "$report"/compare.json "$report"/curves.png "$report"/calibration.json "$OUT"/
  fi
  exit 0
fi

preset=params/presets/binding/compare-binding-gpu.yaml
report=reports/compare-binding-gpu
if [ "${DRY_RUN:-0}" = 1 ]; then
  report=reports/dry-run-binding
  preset=$(mktemp --suffix .yaml)
  "$PY" - "$preset" "$report" <<'EOF'
import sys

import yaml

out, report = sys.argv[1:]
cfg = yaml.safe_load(open("params/presets/binding/compare-binding-gpu.yaml"))
cfg.update(seeds=[0], parallel=2, output_dir="models/compare-binding-dry-run", report_dir=report)
cfg["common"].update(steps=2, global_batch=8, micro_batch=8, checkpoint_every=1)
cfg["common"]["data"]["workers"] = 1
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
EOF
fi
timeout "${LIMIT_S:-480}" "$PY" -m components.compare --params "$preset"
echo "binding.sh: done after $(( $(date +%s) - started )) s; report: $report/compare.md, curves: $report/curves.png"
if [ -n "${OUT:-}" ]; then
  cp "$report"/compare.md "$report"/compare.json "$report"/curves.png "$OUT"/
fi
