"""The documentation: the site builds in strict mode (a broken link, a missing page or an unlisted page fails), the
params reference is what the schema says today, README stays a front door, and no user-facing text cites an internal
issue number."""

import os
import re
import subprocess
import sys

import pytest
from conftest import HANG_S, REPO


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev group: `make test` installs it")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    assert result.returncode == 0, result.stderr[-3000:]
    site = tmp_path / "site"
    for page in ("index.html", "params/index.html", "stages/concepts/index.html", "results/reports/benchmarks/index.html"):
        assert (site / page).is_file(), page
    report = (site / "results" / "reports" / "benchmarks" / "index.html").read_text()
    assert "Benchmark report" in report and "benchmarks.png" in report  # a run's own report, else the shipped example's
    card = (site / "results" / "model-card" / "index.html").read_text()
    assert "Not made yet" not in card
    import json

    # the page follows the clone's state: the shipped example's card on a fresh clone, a run's evaluated card after it
    run_metrics = REPO / "reports" / "metrics.json"
    if (REPO / "models" / "train" / "export" / "README.md").is_file():
        assert "The model card of your run" in card or not run_metrics.is_file(), \
            "after a run, the page shows the run's card with its benchmark figures"
    else:
        run_metrics = REPO / "reports" / "example-run" / "metrics.json"
        assert "shipped example run" in card, "the page shows the example run's figures"
    figures = json.loads(run_metrics.read_text()) if run_metrics.is_file() else {}
    if {"base/summary/binding", "finetuned/summary/binding"} <= set(figures):
        binding = f"binding {figures['base/summary/binding']:.3f} → {figures['finetuned/summary/binding']:.3f}"
        assert "Benchmarks against the base" in card and binding in card


def test_the_params_reference_is_what_the_schema_says():
    result = subprocess.run([sys.executable, "docs/tools/params_reference.py"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    committed = (REPO / "docs" / "params.md").read_text()
    assert result.stdout == committed, "docs/params.md is stale: run `make params-reference`"
    fields = int(re.search(r"(\d+) fields in", committed)[1])
    assert fields == committed.count("\n| `") and fields > 300  # every field of every stage has its row


def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    head = text.splitlines()[:6]
    assert head[0] == "# c2lip" and any(line.startswith("make run") for line in head) and any(line.startswith("make test") for line in head)
    for link in re.findall(r"\]\((docs/[^)#]+)\)", text):  # every page it links exists
        assert (REPO / link).is_file(), link


def test_no_user_facing_text_cites_an_internal_issue_number():
    user_facing = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "params").rglob("*.yaml"), *(REPO / "reports").glob("*.md")]
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in user_facing for n, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"\bissues? \d+\b|\bissue \d+'s\b", line, re.IGNORECASE)]
    assert not offenders, offenders


def test_every_comparison_presets_report_would_be_committed():
    """A preset's report is what its docs page shows (docs/tools/gen_pages.py): one that git ignores is lost with the
    machine that ran it, and the page with it. Galleries are outputs and stay out."""
    reports = sorted({m.group(1) for preset in (REPO / "params" / "presets").rglob("*.yaml")
                      for m in [re.search(r"^report_dir:\s*(reports/[\w.-]+)\s*$", preset.read_text(), flags=re.MULTILINE)] if m})
    assert "reports/calibrate-base" in reports, reports
    paths = [f"{folder}/{name}" for folder in reports for name in ("compare.md", "compare.json", "compare.png")]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert ignored.returncode in (0, 1), ignored.stderr
    assert ignored.stdout.split() == [], f"git ignores these reports: {ignored.stdout.split()}"
    gallery = subprocess.run(["git", "check-ignore", "--no-index", f"{reports[0]}/compare-gallery/index.html"], cwd=REPO, capture_output=True, text=True)
    assert gallery.returncode == 0, "a comparison's gallery should stay out of git"
