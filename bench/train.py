"""Benchmark: training throughput of the train stage for `siglip` and `c2lip` at the default preset.

    python bench/train.py [--steps 30] [--repeats 2] [--threads 0] [--before REV]

Runs the real stage (`python -m components.train`, DeepSpeed, the default model, data and batch) for
`--steps` steps per method, alternating the methods `--repeats` times so both see the same machine
load, and prints the samples/s the stage itself reports (first step left out) and the ratio
c2lip / siglip. `--before REV` also runs the stage's code as it was at git revision REV (exported with
`git archive` into a temporary folder, same data, params, Python environment and thread count),
alternating old and new code within each repeat, and prints after/before per method: a speed-up measured
in one run on one machine load. `--threads N` sets torch threads per run (0: the params' own setting,
which is all cores). Needs the default data (`dvc repro concepts`) and the base model (`models/base/export`).
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
from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("siglip", "c2lip")


def stage_params(method: str, steps: int, threads: int, out: Path) -> dict:
    """params/train.yaml for a short timed run; data and base model by absolute path, so a copy of older
    code elsewhere trains on exactly the same files."""
    cfg = yaml.safe_load((ROOT / "params" / "train.yaml").read_text())
    cfg.update(steps=steps, output_dir=str(out), metrics_path=str(out / "metrics.json"),
               plots_path=str(out / "loss.json"), checkpoint_every=10**6, zero_shot_eval=False)
    if threads:
        cfg["torch_threads"] = threads
    cfg["method"]["name"] = method
    data = cfg["data"]
    data["shards"] = [str(ROOT / s) for s in data["shards"]]
    for key in ("concepts_dir", "recaptions_dir"):
        data[key] = str(ROOT / data[key])
    cfg["model"]["init"] = str(ROOT / cfg["model"]["init"])
    cfg["test_shards"] = [str(ROOT / s) for s in cfg["test_shards"]]
    cfg["deepspeed_config"] = str(ROOT / cfg["deepspeed_config"])
    return cfg


def run(code: Path, method: str, steps: int, threads: int, work: Path) -> float:
    """samples/s of one run of the stage from the code in ``code``."""
    out = work / method
    work.mkdir(parents=True, exist_ok=True)
    params = work / f"{method}.yaml"
    params.write_text(yaml.safe_dump(stage_params(method, steps, threads, out)))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
           "C2LIP_MLFLOW_ARTIFACTS": str(work / "artifacts"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "components.train", "--params", str(params), "--stage", "bench"],
                          cwd=code, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{method} run ({code}) failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())["samples_per_s"]


def export_revision(rev: str, into: Path) -> Path:
    """The tracked files of git revision ``rev`` in ``into`` (no checkout of this working tree changes)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, capture_output=True)
    if archive.returncode:
        sys.exit(f"--before {rev}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: the params' setting)")
    parser.add_argument("--before", help="a git revision whose code is timed beside this working tree's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        codes = {"after": ROOT}
        if args.before:
            codes = {"before": export_revision(args.before, Path(tmp) / "before"), "after": ROOT}
        results = {(which, m): [] for which in codes for m in METHODS}
        for repeat in range(args.repeats):
            for method in METHODS:
                for which, code in codes.items():
                    speed = run(code, method, args.steps, args.threads, Path(tmp) / f"{which}-{repeat}")
                    results[which, method].append(speed)
                    print(f"  run {repeat + 1} {method:7s} {which:6s} {speed:8.1f} samples/s", flush=True)
    median = {key: statistics.median(values) for key, values in results.items()}
    cfg = yaml.safe_load((ROOT / "params" / "train.yaml").read_text())
    threads = args.threads or cfg["torch_threads"] or os.cpu_count()
    print(f"default preset: {cfg['model']['name']}, global batch {cfg['global_batch']}, {args.steps} steps, "
          f"{os.cpu_count()} cores, {threads} torch thread(s), DeepSpeed {Path(cfg['deepspeed_config']).name}")
    siglip, c2lip = median["after", "siglip"], median["after", "c2lip"]
    print(f"siglip {siglip:.1f} samples/s, c2lip {c2lip:.1f} samples/s, ratio c2lip/siglip {c2lip / siglip:.2f} "
          f"(C2LIP step costs {siglip / c2lip:.2f}x a SigLIP step)")
    if args.before:
        for method in METHODS:
            before, after = median["before", method], median["after", method]
            print(f"{method}: before ({args.before}) {before:.1f}, after {after:.1f} samples/s: {after / before:.2f}x")
        b = {m: median["before", m] for m in METHODS}
        record(f"python bench/train.py --before {args.before}", f"the train stage itself (DeepSpeed ZeRO 1, fp32, default preset: "
               f"`{cfg['model']['name']}`, batch {cfg['global_batch']}, {threads} torch threads), {args.steps} steps per method, alternated "
               "twice, first step left out; `--before REV` runs the stage's code at REV beside the working tree's in the same run",
               f"siglip {b['siglip']:.1f} → {siglip:.1f}, c2lip {b['c2lip']:.1f} → {c2lip:.1f} samples/s: **{siglip / b['siglip']:.2f}×** and "
               f"**{c2lip / b['c2lip']:.2f}×** (target ≥ 1.5×); c2lip/siglip {c2lip / siglip:.2f}")


if __name__ == "__main__":
    main()
