"""Benchmark: training throughput of the train stage for `siglip` and `c2lip` at the default preset.

    python bench/train.py [--steps 30] [--repeats 2]

Runs the real stage (`python -m components.train`, DeepSpeed, the default model, data and batch) for
`--steps` steps per method, alternating the methods `--repeats` times so both see the same machine
load, and prints the samples/s the stage itself reports (first step left out) and the ratio
c2lip / siglip. Needs the default data (`dvc repro concepts`) and the base model (`models/base/export`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def run(method: str, steps: int, work: Path) -> float:
    cfg = yaml.safe_load((ROOT / "params" / "train.yaml").read_text())
    out = work / method
    cfg.update(steps=steps, output_dir=str(out), metrics_path=str(out / "metrics.json"),
               plots_path=str(out / "loss.json"), checkpoint_every=10**6, zero_shot_eval=False)
    cfg["method"]["name"] = method
    work.mkdir(parents=True, exist_ok=True)
    params = work / f"{method}.yaml"
    params.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
           "C2LIP_MLFLOW_ARTIFACTS": str(work / "artifacts")}
    done = subprocess.run([sys.executable, "-m", "components.train", "--params", str(params), "--stage", "bench"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{method} run failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())["samples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"siglip": [], "c2lip": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for method in results:
                results[method].append(run(method, args.steps, Path(tmp) / str(repeat)))
                print(f"  run {repeat + 1} {method:7s} {results[method][-1]:8.1f} samples/s", flush=True)
    siglip, c2lip = (statistics.median(results[m]) for m in ("siglip", "c2lip"))
    cfg = yaml.safe_load((ROOT / "params" / "train.yaml").read_text())
    print(f"default preset: {cfg['model']['name']}, global batch {cfg['global_batch']}, {args.steps} steps, "
          f"{os.cpu_count()} cores, DeepSpeed {Path(cfg['deepspeed_config']).name}")
    print(f"siglip {siglip:.1f} samples/s, c2lip {c2lip:.1f} samples/s, ratio c2lip/siglip {c2lip / siglip:.2f} "
          f"(C2LIP step costs {siglip / c2lip:.2f}x a SigLIP step)")


if __name__ == "__main__":
    main()
