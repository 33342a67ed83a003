"""One figure, one value: the tables the README and the default-run page show are the shipped example run's
report (reports/example-run/benchmarks.md, which `make example-run` copies from a run), cell for cell."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "reports" / "example-run" / "benchmarks.md"


def cells(line: str) -> list[str]:
    """A markdown table row's cells, with the typographic minus read as '-' (prose uses −, reports write -)."""
    return [c.strip().replace("−", "-") for c in line.strip().strip("|").split("|")]


def report_rows() -> tuple[dict[str, list[str]], dict[tuple[str, str, str], list[str]]]:
    """The example report's summary rows (group -> [base, fine-tune, Δ]) and every-metric rows
    ((benchmark, metric, subset) -> [items, base, fine-tune, Δ]; subset '' for all items, 'held-out', 'seen'),
    with '*headline*' recorded as the metric of a benchmark's bold row."""
    summary, metrics = {}, {}
    section = None
    for line in EXAMPLE.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        if not line.startswith("| ") or line.startswith("| group") or line.startswith("| benchmark") or line.startswith("|---"):
            continue
        row = cells(line)
        if section and section.startswith("Summary"):
            summary[row[0]] = row[1:4]
        elif section == "Every metric":
            name, subset = (row[0].split(" *") + [""])[:2]
            metric = row[1].strip("*")
            metrics[(name, metric, subset.strip("*"))] = row[2:6]
            if row[1].startswith("**"):
                metrics[(name, "*headline*", "")] = [metric]
    return summary, metrics


def table_lines(path: Path, header: str) -> list[str]:
    """The data rows of the first markdown table in ``path`` whose header row starts with ``header``."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_example_run_report_is_shipped_and_parsed():
    summary, metrics = report_rows()
    assert {"binding", "compositional", "zero_shot", "zero_shot_held_out", "retrieval"} <= set(summary)
    assert metrics[("sugarcrepe/swap_att", "*headline*", "")] == ["acc"]
    assert re.fullmatch(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]†?", summary["binding"][2])


def test_readme_default_run_findings_are_the_example_run():
    """README's findings for the default run (generated from reports/example-run/intervals.json) say what the example
    run's report says, figure for figure."""
    summary, _ = report_rows()
    groups = {"binding": "binding", "zero-shot": "zero_shot", "retrieval": "retrieval"}
    rows = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| default run")]
    assert len(rows) == 2
    found = {}
    for line in rows:
        for name, delta in re.findall(r"(binding|zero-shot|retrieval) ([+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\])", cells(line)[2]):
            found[groups[name]] = delta
    assert set(found) == set(groups.values()), found
    for group, delta in found.items():
        assert summary[group][2].rstrip("†") == delta, f"README.md default run {group}: {delta} against {EXAMPLE.relative_to(REPO)}"


def test_default_run_page_table_is_the_example_run():
    summary, metrics = report_rows()
    rows = table_lines(REPO / "docs" / "results" / "default-run.md", "| benchmark | headline |")
    assert len(rows) >= 20
    seen = set()
    for line in rows:
        row = cells(line)
        held = row[6].split(" → ")
        summary_name = re.match(r"\*\*summary: (\w+)\*\*", row[0])
        if summary_name:
            group = summary_name.group(1)
            expected = summary[group] + [" → ".join(summary[f"{group}_held_out"][:2])]
            assert row[3:6] + [" → ".join(held)] == expected, f"default-run.md summary row {group!r}"
            continue
        name, metric = row[0], row[1]
        assert metrics[(name, "*headline*", "")] == [metric], f"default-run.md {name}: headline metric"
        items, base, tuned, delta = metrics[(name, metric, "")]
        assert row[2:6] == [items, base, tuned, delta], f"default-run.md row {name!r} differs from the example report"
        held_base, held_tuned = metrics[(name, metric, "held-out")][1:3]
        assert held == [held_base, held_tuned], f"default-run.md row {name!r}: held-out figures"
        seen.add(name)
    headlines = {key[0] for key in metrics if key[1] == "*headline*"}
    assert seen == headlines, f"benchmarks in the report but not on the page: {sorted(headlines - seen)}"


@pytest.mark.parametrize("page", ["README.md", "docs/results/default-run.md", "docs/results/what-this-shows.md"])
def test_pages_point_at_the_shipped_report_not_at_a_runs_output(page):
    """A user's run writes reports/benchmarks.md; the figures these pages quote are the example run's."""
    text = (REPO / page).read_text()
    assert "reports/example-run/" in text
    assert not re.search(r"default run[^.]*`reports/benchmarks\.md`", text, flags=re.IGNORECASE)
