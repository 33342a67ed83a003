"""The facts the pages state, each from one source: the figures of bench/measured.json (written by the bench scripts
and bench/timings.py), the commands a user pastes and the list of benchmarks.

docs/tools/findings.py writes these blocks into README.md and the docs with the findings tables
(``python docs/tools/findings.py --write``); tests/test_facts.py fails when a block is stale, when a page states one
of these figures outside its block, or when two pages give one command differently.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "bench" / "measured.json"
sys.path.insert(0, str(ROOT))

from components.shared.progress import duration  # noqa: E402  (the stages' own wording of a time)

# The benchmarks of the suite, as the pitch names them (README and the docs' home page share the sentence)
SUITE = "SugarCrepe, SugarCrepe++, hard positives, ARO, Winoground, zero-shot, retrieval and long-caption retrieval"

PITCH = f"""c2lip makes contrastive vision–language models (CLIP, SigLIP) understand composition — "a red couch" versus "a
couch beside something red" — without losing their zero-shot and retrieval skills. It implements C2LIP (noun-phrase
concept losses and a parameter-free cross-attention pooling, no hard negatives), its siblings (CLIC, NegCLIP, hard
positives and negatives, sentence sampling, recaptioning) and one benchmark suite
({SUITE})
scored as the official scripts score them, to judge them side by side. It is for ML engineers and researchers who
fine-tune these models on their captions and GPUs.

**What you can learn here, and what you cannot.** On the embedded testbed (ShapesWorld, tiny models, 2 CPU cores)
every method, benchmark and launch runs in minutes and answers *whether and when* a method makes a model bind
attributes to objects at small scale, with intervals; whether C2LIP improves a real CLIP or SigLIP checkpoint on real
captions takes real data at GPU scale, which the same pipeline runs from a preset ([your data on your
GPUs](docs/recipe.md))."""

# The commands of the Prefect deployments, as README, getting started and the docs' home page show them
DEPLOYMENTS = """# the port make serve uses (PREFECT_PORT, default 4200)
export PREFECT_API_URL=http://127.0.0.1:${PREFECT_PORT:-4200}/api
# every stage, with 600 training steps instead of the preset's
.venv/bin/prefect deployment run c2lip/full --watch --param overrides='{"train": {"steps": 600}}'
# a run registers `challenger`; this moves `champion` to it only when the gates hold
.venv/bin/prefect deployment run c2lip/promote --watch --param candidate=challenger
# the champion on every benchmark
.venv/bin/prefect deployment run c2lip/evaluate --watch --param model='{"name": "champion", "uri": "models:/c2lip@champion"}'
# every method over seeds, side by side
make compare"""

# where a bench row says more, relative to docs/
MORE = {"python bench/train.py --before ce5a4e3": "performance.md#training-on-cpu",
        "python bench/concept_scaling.py": "performance.md#scaling-to-many-gpus",
        "python bench/flops.py": "performance.md#training-at-gpu-speed",
        "python bench/loader.py": "performance.md#the-data-path-at-scale",
        "python bench/data_startup.py": "performance.md#the-data-path-at-scale",
        "python bench/train_gpu.py --cpu --model c2lip-tiny-map --image-size 64 --batch 32 --steps 20 --warmup 3 --phrase-length 0 "
        "--levers sync-every-step compile grad-checkpointing --distinct-share 0.762": "performance.md#gpu-figures"}


def measured(root: Path = ROOT) -> dict[str, Any]:
    return json.loads((root / "bench" / "measured.json").read_text())


def bench_table(link_prefix: str | None, root: Path = ROOT) -> str:
    """Every bench script's row: the command, what it measures, the figure, the hardware; a link where a page says more
    (``link_prefix``: where docs/ is from the page; None on the performance page itself, whose links are anchors)."""
    rows = ["| script | measures | figure | hardware |", "|---|---|---|---|"]
    for command, row in measured(root)["benches"].items():
        more = MORE.get(command)
        target = None if more is None else more[more.index("#"):] if link_prefix is None else f"{link_prefix}{more}"
        link = f" ([more]({target}))" if target else ""
        rows.append(f"| `{command}` | {row['measures']} | {row['figure']}{link} | {row['hardware']} |")
    return "\n".join(rows)


def gpu_table(root: Path = ROOT) -> str:
    gpu = measured(root)["gpu"]
    rows = [f"Measured {gpu['when']}, on {gpu['device']} ({gpu['software']}), with `bench/train_gpu.py`: {gpu['setting']}.", "",
            "| batch | method | samples/s | MFU (989 TFLOP/s) | peak GiB |", "|---|---|---|---|---|"]
    rows += [f"| {r['batch']} | {r['method']} | {r['samples_s']:,} | {r['mfu_pct']:.1f} % | {r['peak_gib']:.1f} |" for r in gpu["rows"]]
    return "\n".join(rows)


def gpu_rate(method: str, batch: int, root: Path = ROOT) -> int:
    return next(r["samples_s"] for r in measured(root)["gpu"]["rows"] if r["method"] == method and r["batch"] == batch)


def gpu_budget(root: Path = ROOT) -> str:
    """The paper's budget at the measured C2LIP speed: the time follows from the samples and the one measured rate."""
    gpu = measured(root)["gpu"]
    rate = gpu_rate("C2LIP", 256, root)
    samples = gpu["cc3m_samples"] * gpu["epochs"]
    return (f"The paper's budget ({gpu['epochs']} epochs of CC3M's {gpu['cc3m_samples']:,} samples) takes {samples / rate / 3600:.1f} h on {gpu['device']} at "
            f"C2LIP's {rate:,} samples/s (batch 256, measured {gpu['when']}).")


def timings_text(root: Path = ROOT) -> str:
    """How long the README's commands took on a fresh clone (bench/timings.py), in one paragraph."""
    t = measured(root)["timings"]
    c = measured(root)["compare"]
    return (f"Measured by `python bench/timings.py` on a fresh clone, {t['hardware']}, {t['load']}, {t['measured_on']}: "
            f"the install {duration(t['install_s'])} (uv's download cache {t['uv_cache']}), `make run` "
            f"{duration(t['make_run_s'])} after it, a second `make run` with nothing changed {duration(t['make_run_again_s'])}, "
            f"`make test` {duration(t['make_test_s'])} ({t['tests_passed']} passed, {t['tests_skipped']} skipped). "
            f"`make compare` ({c['arms']} arms × {c['seeds']} seeds) took {duration(c['make_compare_s'])} {c['note']}.")


def stage_times(root: Path = ROOT) -> str:
    """Each stage's time in the measured `make run` (bench/timings.py reads them from the flow's log)."""
    stages = measured(root)["timings"]["stages_s"]
    return ", ".join(f"{name} {duration(s)}" for name, s in stages.items())


def blocks(root: Path = ROOT) -> dict[tuple[Path, str], str]:
    """(page, block name) -> the block's text."""
    readme, docs = root / "README.md", root / "docs"
    deployments = f"```bash\n{DEPLOYMENTS}\n```"
    return {
        (readme, "pitch"): PITCH,
        (docs / "index.md", "pitch"): PITCH.replace("](docs/", "]("),
        (readme, "timings"): timings_text(root),
        (docs / "getting-started.md", "timings"): timings_text(root) + f" The stages of that `make run`: {stage_times(root)}.",
        (readme, "deployments"): deployments,
        (docs / "getting-started.md", "deployments"): deployments,
        (readme, "performance"): bench_table("docs/", root),
        (docs / "performance.md", "performance"): bench_table(None, root),
        (docs / "performance.md", "gpu"): gpu_table(root),
        (docs / "performance.md", "gpu-budget"): gpu_budget(root),
    }
