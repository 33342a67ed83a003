"""The findings a reader meets first — README's table, the docs' home page, each results page's answer and the
calibration tables — are generated from the report JSON that holds each figure, and stay so."""

import importlib.util
import json
import re
import statistics
import subprocess
import sys

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("findings", REPO / "docs" / "tools" / "findings.py")
findings = importlib.util.module_from_spec(spec)
sys.modules["findings"] = findings  # dataclasses look their module up by name
spec.loader.exec_module(findings)

REPORTS = sorted({f.report for f in findings.FINDINGS} | {report for report, _ in findings.CALIBRATION_TABLES.values()}
                 | {report for _, report, _ in findings.BUILDS})


def _locally_rerun() -> list[str]:
    """Report files that differ from the committed ones (a study re-run here, not yet written into the pages)."""
    done = subprocess.run(["git", "status", "--porcelain", "--", *REPORTS], cwd=REPO, capture_output=True, text=True)
    return [line[3:] for line in done.stdout.splitlines()] if done.returncode == 0 else []


def test_every_findings_block_is_what_the_reports_say():
    if rerun := _locally_rerun():
        pytest.skip(f"{rerun} differ from the committed reports (a local re-run): `python docs/tools/findings.py --write` "
                    "brings the pages to them")
    stale = []
    for (path, name), block in findings.every_block().items():
        text = path.read_text()
        start, end = findings.markers(name)
        assert start in text and end in text, f"{path.relative_to(REPO)}: no findings block {start!r}"
        if findings.rewritten(text, block, path, name) != text:
            stale.append(f"{path.relative_to(REPO)} ({name or 'findings'})")
    assert not stale, f"stale findings: {stale}; `python docs/tools/findings.py --write` regenerates them from the reports"


def test_readme_has_at_most_ten_findings_each_linking_its_page():
    text = (REPO / "README.md").read_text()
    start, end = findings.markers()
    block = text[text.index(start):text.index(end, text.index(start))]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| setting")]
    assert 1 <= len(rows) <= 10, len(rows)
    for row in rows:
        link = re.search(r"\]\((docs/[^)]+)\) \|$", row)
        assert link and (REPO / link[1]).is_file(), row
        assert re.search(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", row), row  # a difference with its interval
    # the prose beside the table carries no figure of its own: every number a reader sees there comes from a report
    section = text[text.index("## Results"):text.index("## Performance")]
    prose = section.replace(block, "")
    assert not re.search(r"[+−-]?0\.\d{2,}", prose), "a figure typed by hand in README's results"


def test_an_answer_is_the_mean_of_the_seeds_differences_with_its_interval(tmp_path):
    """The figures are the report's own: the mean of the per-seed paired differences, a t interval over seeds."""
    report = tmp_path / "reports" / "x" / "compare.json"
    report.parent.mkdir(parents=True)
    values = [0.10, 0.20, -0.05, 0.15]
    report.write_text(json.dumps({"reference": "siglip", "budget": {"samples": 7680},
                                  "paired": {"c2lip": {"binding": {"values": values}}}}))
    finding = findings.Finding("s", "q?", "reports/x/compare.json", "c2lip", ("binding",), "results/calibration.md")
    answer, basis = finding.answer(tmp_path)
    mean = statistics.mean(values)
    half = 3.182446 * statistics.stdev(values) / len(values) ** 0.5  # t(0.975, 3)
    assert answer == f"binding {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"
    assert basis == "4 seeds (3 above 0) vs `siglip`, 7,680 samples; interval over seeds"


def test_the_builds_table_gives_each_seed_of_a_spread_its_row_and_says_which_builds_calibrate(tmp_path):
    """A spread's compare.json (one arm over seeds): a row per seed with its own figures, where its tracking swap_att
    reached 0.6 (or not), and ✓ only where swap_att ≥ 0.6 and zero-shot ≥ 0.9 both hold."""
    report = tmp_path / "reports" / "calibrated-builds" / "compare.json"
    report.parent.mkdir(parents=True)
    metrics = {"sugarcrepe/swap_att/acc": [0.70, 0.55, 0.65], "zero_shot/top1": [0.95, 0.97, 0.8997], "summary/binding": [0.5, 0.3, 0.4]}
    report.write_text(json.dumps({
        "seeds": [1, 2, 3], "metrics": {"calibrated": {k: {"values": v} for k, v in metrics.items()}},
        "reach": {"calibrated": [{"run": "calibrated-s1", "samples": 128000}, {"run": "calibrated-s2", "samples": None},
                                 {"run": "calibrated-s3", "samples": 256000}]}}))
    rows = findings.builds_table(tmp_path).splitlines()[2:]  # the earlier builds' reports are not under tmp_path
    assert [r.split(" | ")[0] for r in rows] == ["| spread, seed 1", "| spread, seed 2", "| spread, seed 3"]
    assert rows[0].endswith("| 0.700 | – | – / – | 0.500 | – / – | 0.950 | 128,000 samples | ✓ |"), rows[0]
    assert rows[1].endswith("| not reached | ✗ |") and "| 0.550 |" in rows[1]
    assert rows[2].endswith("| 0.8997 | 256,000 samples | ✗ |"), rows[2]  # binds, but zero-shot under 0.9: not shown as 0.900


def test_each_results_page_opens_with_its_answer_and_a_picture():
    gen_pages = (REPO / "docs" / "tools" / "gen_pages.py").read_text()
    for page in sorted({f.page for f in findings.FINDINGS}):
        text = (REPO / "docs" / page).read_text()
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        assert headings[0] == "## The answer", (page, headings[:2])
        answer = text[text.index("## The answer"):text.index("## The evidence")]
        assert findings.markers()[0] in answer, page
        picture = re.search(r"!\[[^\]]+\]\(\.\./assets/([\w.-]+\.png)\)", answer)
        assert picture and f'"{picture[1]}"' in gen_pages, f"{page}: no picture the site build copies"
        rows = [line for line in answer.splitlines() if line.startswith("| ")]
        assert all(line.count("|") <= 6 for line in rows), f"{page}: the answer's table is wider than four columns"
