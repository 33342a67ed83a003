"""infra/gpu/check.sh, the GPU check: its dry run on the CPU runs every check the GPU run does, at toy sizes, and
passes; without a GPU and without DRY_RUN it says so and fails. It never needs a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import HANG_S, REPO

CHECKS = {"bench-8", "bench-16", "world", "train-bf16-curves", "evaluate-gpu", "evaluate-throughput", "compare"}


def _check(tmp_path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"),
                   "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
                   "C2LIP_MLFLOW_ARTIFACTS": str(tmp_path / "artifacts"), **env}
    return subprocess.run(["bash", str(REPO / "infra" / "gpu" / "check.sh")], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=HANG_S)


@pytest.mark.slow
def test_the_dry_run_passes_every_check_of_the_gpu_run_on_the_cpu(tmp_path):
    done = _check(tmp_path, DRY_RUN="1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    verdicts = {line.split()[1].rstrip(":"): line.split()[0] for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))}
    assert CHECKS | {"all"} <= set(verdicts) and set(verdicts.values()) == {"PASS"}, done.stdout
    summary = json.loads((tmp_path / "out" / "check.json").read_text())
    checks = summary["checks"]
    assert summary["dry_run"] is True and all(checks[name]["pass"] for name in CHECKS)
    # the evaluate stage ran with device auto and with device cpu, and every figure agreed
    assert checks["evaluate-gpu"]["figures"]["ran_on"].startswith("cpu") and checks["evaluate-gpu"]["figures"]["differing"] == {}
    assert checks["train-bf16-curves"]["figures"]["tracked_steps"] == [0, 1, 2]
    bench = checks["bench-16"]["figures"]
    assert bench["siglip"]["samples_per_s"] > 0 and bench["c2lip"]["tflops_per_step"] > bench["siglip"]["tflops_per_step"]
    assert (tmp_path / "out" / "compare" / "compare.md").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run for real")
def test_without_a_gpu_the_check_fails_and_says_why(tmp_path):
    done = _check(tmp_path, DRY_RUN="0")
    assert done.returncode == 1
    assert "FAIL gpu: torch sees no CUDA GPU (DRY_RUN=1 runs the check on the CPU)" in done.stdout
    assert json.loads((tmp_path / "out" / "check.json").read_text())["checks"]["gpu"]["pass"] is False
