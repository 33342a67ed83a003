"""The GPU check (infra/gpu/check.sh runs it): does the GPU path work, and how fast is it, in about five minutes.

Checks, each one PASS/FAIL line, the figures in one JSON (``$OUT/check.json``):

1. ``bench-96``, ``bench-256``: bench/train_gpu.py at the paper's batch per GPU and at 256 (ViT-B-16-SigLIP, 224 px,
   bf16, ZeRO 1, synthetic batches): samples/s, MFU and peak memory of SigLIP and C2LIP; then the speed targets
   (SigLIP ≥ 2,000 samples/s at 256; C2LIP ≥ 1,000 at 256 and ≥ 700 at 96) as ``target-*`` lines;
2. ``world``: a small ShapesWorld (the captions and benchmarks stages); its phrases are the world's own object
   phrases, so spaCy (absent on a bare GPU machine) is not needed;
3. ``train-bf16-curves``: the train stage, C2LIP on the tiny ViT with a MAP head, DeepSpeed's bf16 engine, learning
   curves at step 0 and every checkpoint;
4. ``evaluate-gpu``: the evaluate stage on its export with ``device: auto`` (the GPU), and again with
   ``device: cpu``: both fp32, every figure must agree; ``evaluate-throughput``: bench/evaluate.py's images/s and
   texts/s per device and precision (a ViT-B/16 with random weights on the GPU machine);
5. ``compare``: a two-arm (SigLIP, C2LIP), one-seed comparison in bf16 with curves;
6. with ``LEVERS=1`` (a few minutes more), ``levers``: each speed lever of bench/train_gpu.py alone against the default
   at batch 256, and each distinct phrase encoded once at the share of repeats real captions have.

``DRY_RUN=1``: the same commands on the CPU at toy sizes (fp32 engines, the tiny model in the bench), so the script
is checked before a GPU's minutes are spent; tests/test_gpu_check.py runs it. ``WORK`` (default models/gpu-check)
holds the data and runs, ``OUT`` (default reports/gpu-check) the reports and check.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DRY = os.environ.get("DRY_RUN", "0") == "1"
WORK = Path(os.environ.get("WORK", "models/gpu-check-dry-run" if DRY else "models/gpu-check")).resolve()
OUT = Path(os.environ.get("OUT", "reports/gpu-check-dry-run" if DRY else "reports/gpu-check")).resolve()
PY = sys.executable
# speed targets on one H200 (docs/performance.md): samples/s per (method, batch)
TARGETS = {("siglip", 256): 2000, ("c2lip", 256): 1000, ("c2lip", 96): 700}
# distinct phrases per phrase occurrence in a batch of 256 real (COCO) captions: bench/phrase_repeats.py
DISTINCT_SHARE = 0.762

# sizes: the GPU's, and the dry run's toys
SIZES = {
    "bench": ["--model", "c2lip-tiny-map", "--image-size", "64", "--steps", "2", "--warmup", "1", "--cpu", "--phrase-length", "0"]
    if DRY else ["--steps", "30", "--warmup", "5", "--phrase-length", "0"],
    "bench_batches": (8, 16) if DRY else (96, 256),
    "world": {"train_images": 64, "test_images": 40} if DRY else {"train_images": 4096, "test_images": 400},
    "train": {"steps": 2, "global_batch": 8, "micro_batch": 8, "checkpoint_every": 1, "log_every": 1, "zero_shot_every": 1}
    if DRY else {"steps": 40, "global_batch": 128, "micro_batch": 128, "checkpoint_every": 20, "log_every": 10, "zero_shot_every": 20},
    "curve_images": 40 if DRY else 200,
    "workers": 0 if DRY else 4,
}

results: dict[str, dict] = {}


def report(name: str, ok: bool, detail: str, figures: dict | None = None) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    results[name] = {**results.get(name, {}), "pass": ok, "detail": detail, **({"figures": figures} if figures else {})}
    return ok


def run(name: str, args: list[str], log: Path) -> bool:
    """A command of the check, its output in ``log``; a failure prints the log's tail."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    entry = results.setdefault(name, {})
    entry["seconds"] = round(entry.get("seconds", 0) + time.perf_counter() - started, 1)
    if done.returncode:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        print(f"--- {name}: exit {done.returncode}; the last lines of {log}:\n" + "\n".join(tail), flush=True)
    return done.returncode == 0


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def bench() -> None:
    batches = SIZES["bench_batches"]
    for batch in batches:  # a figures file left by an earlier check is not this one's
        (WORK / f"bench-{batch}.json").unlink(missing_ok=True)
    # both batches in one process: its start-up (imports, DeepSpeed's set-up) is paid once
    run("bench", [PY, "bench/train_gpu.py", "--batch", *map(str, batches), "--json", str(WORK / "bench-{batch}.json"), *SIZES["bench"]],
        WORK / "bench.log")
    for batch in batches:  # a batch whose figures were written passed, even when a later batch failed (out of memory)
        name, figures = f"bench-{batch}", WORK / f"bench-{batch}.json"
        if not figures.is_file():
            report(name, False, f"bench/train_gpu.py failed at batch {batch} (see {WORK / 'bench.log'})")
            continue
        rows = {r["method"]: r for r in json.loads(figures.read_text())["results"]}
        line = "; ".join(f"{m} {r['samples_per_s']:,.0f} samples/s, MFU {r['mfu']:.1%}"
                         + (f", {r['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in r else "") for m, r in rows.items())
        report(name, all(r["samples_per_s"] > 0 for r in rows.values()), line, rows)
        for method in ("siglip", "c2lip"):
            target = TARGETS.get((method, batch))
            if target and not DRY:
                got = rows[method]["samples_per_s"]
                report(f"target-{method}-{batch}", got >= target, f"{got:,.0f} samples/s against {target:,}")


def levers() -> None:
    """Each speed lever of bench/train_gpu.py alone against the default, at batch 256 (LEVERS=1; a few minutes more)."""
    batch = SIZES["bench_batches"][-1]
    figures = WORK / "levers.json"
    args = [PY, "bench/train_gpu.py", "--batch", str(batch), "--json", str(figures), *SIZES["bench"],
            "--levers", "sync-every-step", "compile", "autocast", "grad-checkpointing", "--distinct-share", str(DISTINCT_SHARE)]
    if not run("levers", args, WORK / "levers.log"):
        report("levers", False, "bench/train_gpu.py --levers failed")
        return
    ratios = json.loads(figures.read_text())["ratios"]
    report("levers", True, "; ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items()), ratios)


def world() -> tuple[Path, Path] | None:
    """The check's world: its captions params file and its phrases folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    captions = yaml.safe_load((ROOT / "params" / "captions.yaml").read_text())
    captions.update(output_dir=str(WORK / "captions"), stats_path=str(WORK / "captions.json"), contact_sheet=None,
                    shard_size=256 if not DRY else 32, workers=0)
    captions["shapesworld"].update(SIZES["world"])
    captions_file = write_yaml(WORK / "captions.yaml", captions)
    bench_params = write_yaml(WORK / "benchmarks.yaml", {"captions_params": str(captions_file), "images": 0, "seed": 0,
                                                          "output_dir": str(WORK / "benchmarks")})
    if not (run("world", [PY, "-m", "components.captions", "--params", str(captions_file)], WORK / "captions.log")
            and run("world", [PY, "-m", "components.benchmarks", "--params", str(bench_params)], WORK / "benchmarks.log")):
        report("world", False, "the captions or benchmarks stage failed")
        return None
    manifest = pq.read_table(WORK / "captions" / "manifest.parquet").to_pandas()
    train = manifest[manifest.split == "train"]
    phrases = WORK / "concepts"
    phrases.mkdir(exist_ok=True)
    pq.write_table(pa.table({"key": list(train.key), "phrases": [list(p) for p in train.object_phrases]}), phrases / "train.parquet")
    report("world", True, f"{len(train)} training images, {len(manifest) - len(train)} test images, the suite built")
    return captions_file, phrases


def train_params(captions_file: Path, phrases: Path) -> dict:
    train = yaml.safe_load((ROOT / "params" / "train.yaml").read_text())
    train["data"].update(shards=[str(WORK / "captions" / "train" / "*.tar")], concepts_dir=str(phrases), caption_field="long",
                         workers=SIZES["workers"], shuffle_buffer=256)
    train["model"].update(name="c2lip-tiny-map", init="scratch", calibrate_logits=0)
    train.update(SIZES["train"], deepspeed_config=f"infra/deepspeed/zero1_{'fp32' if DRY else 'bf16'}.json",
                 output_dir=str(WORK / "train"), metrics_path=str(WORK / "train-metrics.json"),
                 plots_path=str(WORK / "train-loss.json"), test_shards=[str(WORK / "captions" / "test" / "*.tar")],
                 mlflow_experiment="c2lip-gpu-check",
                 curves={"enabled": True, "images": SIZES["curve_images"], "captions_params": str(captions_file)})
    return train


def train(captions_file: Path, phrases: Path) -> Path | None:
    params = write_yaml(WORK / "train.yaml", train_params(captions_file, phrases))
    if not run("train-bf16-curves", [PY, "-m", "components.train", "--params", str(params)], WORK / "train.log"):
        report("train-bf16-curves", False, "the train stage failed")
        return None
    metrics = json.loads((WORK / "train-metrics.json").read_text())
    points = json.loads((WORK / "train-loss.json").read_text())["loss"]
    tracked = [p["step"] for p in points if "track/binding" in p]
    ok = bool(tracked) and tracked[0] == 0 and tracked[-1] == SIZES["train"]["steps"] and metrics["final_loss"] == metrics["final_loss"]
    report("train-bf16-curves", ok, f"{metrics['steps']:.0f} steps, final loss {metrics['final_loss']:.3f}, curves at steps {tracked}, "
           f"{metrics.get('samples_per_s', 0):,.0f} samples/s", {"metrics": metrics, "tracked_steps": tracked})
    return WORK / "train" / "export"


def evaluate_params(device: str, output: Path, models: list[dict]) -> dict:
    text = (ROOT / "params" / "evaluate.yaml").read_text().replace("data/benchmarks/shapesworld", str(WORK / "benchmarks"))
    params = yaml.safe_load(text)
    if importlib.util.find_spec("spacy") is None:
        params["benchmarks"]["aro"]["order_files"] = {}  # ARO's order shuffles need spaCy's tagger
    params.update(models=models, device=device, output_dir=str(output), cache_dir=str(WORK / f"evaluate-cache-{device}"),
                  mlflow_experiment="c2lip-gpu-check")
    params["gallery"] = {"enabled": False}
    return params


def evaluate(export: Path) -> None:
    figures = {}
    for device in ("auto", "cpu"):
        params = write_yaml(WORK / f"evaluate-{device}.yaml", evaluate_params(device, OUT / f"evaluate-{device}",
                                                                          [{"name": "checked", "uri": str(export)}]))
        if not run("evaluate-gpu", [PY, "-m", "components.evaluate", "--params", str(params)], WORK / f"evaluate-{device}.log"):
            report("evaluate-gpu", False, f"the evaluate stage failed with device {device}")
            return
        figures[device] = json.loads((OUT / f"evaluate-{device}" / "metrics.json").read_text())
        log = (WORK / f"evaluate-{device}.log").read_text()
        figures[f"{device}-ran-on"] = next((line.split("scoring on ")[1] for line in log.splitlines() if "scoring on " in line), "?")
    ran_on = figures["auto-ran-on"]
    differ = {k: (v, figures["cpu"].get(k)) for k, v in figures["auto"].items() if abs(v - figures["cpu"].get(k, float("nan"))) > 1e-6}
    on_gpu = ran_on.startswith("cuda") or DRY
    report("evaluate-gpu", on_gpu and not differ, f"device auto scored on {ran_on}; {len(figures['auto'])} figures, "
           f"{len(differ)} differ from the CPU's in fp32" + (f" (first: {next(iter(differ.items()))})" if differ else ""),
           {"ran_on": ran_on, "differing": {k: list(v) for k, v in differ.items()}})


def evaluate_throughput(export: Path) -> None:
    """bench/evaluate.py --throughput: the evaluate stage's encoders per device and precision (a ViT-B/16 on the GPU)."""
    model = ["--model", str(export)] if DRY else ["--arch", "ViT-B-16"]  # ViT-B-16: open_clip's own tokenizer, offline
    log = WORK / "evaluate-throughput.log"
    if not run("evaluate-throughput", [PY, "bench/evaluate.py", "--throughput", "--params", str(WORK / "evaluate-cpu.yaml"),
                                       "--limit", "1024", *model], log):
        report("evaluate-throughput", False, "bench/evaluate.py --throughput failed")
        return
    rows = [line for line in log.read_text().splitlines() if line.startswith("| ") and not line.startswith("| device")]
    report("evaluate-throughput", bool(rows), " ; ".join(row.strip("| ").replace(" | ", " ") for row in rows), {"rows": rows})


def compare(captions_file: Path, phrases: Path) -> None:
    train_file = write_yaml(WORK / "compare-train.yaml", train_params(captions_file, phrases))
    evaluate_file = write_yaml(WORK / "compare-evaluate.yaml", evaluate_params("auto", OUT / "unused", [{"name": "x", "uri": "unused"}]))
    params = write_yaml(WORK / "compare.yaml", {
        "train_params": str(train_file), "evaluate_params": str(evaluate_file), "captions_params": str(captions_file),
        "seeds": [0], "common": {}, "reference": "siglip", "parallel": 2, "output_dir": str(WORK / "compare"),
        "report_dir": str(OUT / "compare"), "mlflow_experiment": "c2lip-gpu-check",
        "arms": [{"name": "siglip", "overrides": {"method": {"name": "siglip"}}},
                 {"name": "c2lip", "overrides": {"method": {"name": "c2lip"}}}]})
    if not run("compare", [PY, "-m", "components.compare", "--params", str(params)], WORK / "compare.log"):
        report("compare", False, "the comparison failed")
        return
    arms = json.loads((OUT / "compare" / "compare.json").read_text())["arms"]
    report("compare", {"siglip", "c2lip"} <= set(arms), f"arms {arms} trained and evaluated; report {OUT / 'compare' / 'compare.md'}")


def main() -> int:
    import torch

    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{WORK / 'mlflow.db'}")
    os.environ.setdefault("C2LIP_MLFLOW_ARTIFACTS", str(WORK / "mlartifacts"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hardware = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"GPU check{' (dry run on the CPU)' if DRY else ''}: {hardware}, torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}; work in {WORK}", flush=True)
    if not DRY and not torch.cuda.is_available():
        report("gpu", False, "torch sees no CUDA GPU (DRY_RUN=1 runs the check on the CPU)")
    else:
        started = time.perf_counter()
        bench()
        if os.environ.get("LEVERS", "0") == "1":
            levers()
        made = world()
        if made:
            export = train(*made)
            if export:
                evaluate(export)
                evaluate_throughput(export)
            compare(*made)
        results["seconds"] = round(time.perf_counter() - started, 1)
    summary = {"hardware": hardware, "torch": torch.__version__, "dry_run": DRY, "date": time.strftime("%Y-%m-%d"),
               "checks": results}
    tmp = OUT / "check.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(OUT / "check.json")
    failed = [name for name, r in results.items() if isinstance(r, dict) and r.get("pass") is False]
    print(f"{'FAIL' if failed else 'PASS'} all: {len(failed)} failed {failed if failed else ''}; figures in {OUT / 'check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
