"""Each fact the pages state comes from one source: the measured figures from bench/measured.json (the bench scripts
and bench/timings.py write it), the deployment commands and the pitch from docs/tools/facts.py, the ports from the
scripts that open them. docs/tools/findings.py --write renders them into README.md and the docs; these tests fail when a
page states such a figure outside its generated block, when two pages give one command differently, or when a page
names a port, a make target or a figure the source does not hold. (Stale blocks: tests/test_findings.py.)"""

import importlib.util
import json
import re
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "docs" / "tools"))
spec = importlib.util.spec_from_file_location("facts", REPO / "docs" / "tools" / "facts.py")
facts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(facts)

BLOCK = re.compile(r"<!-- findings[^>]*-->\n.*?<!-- /findings -->", re.S)
DURATION = r"(?:\d+ to )?\d+(?:\.\d+)?\s?(?:min|minutes|h|hours|s|seconds)\b"
# "`make run` ... takes about 7 minutes", "the first call spends 1 to 2 minutes installing", "`make compare` ... took 56 minutes"
SUBJECT = r"(?:make run|make test|make compare|install\w*|the suite)"
VERB = r"\b(?:takes?|took|spends?|spent|lasts?|ran)\s+(?:about\s+|around\s+)?"
TIME_CLAIM = re.compile(rf"{SUBJECT}[^.;\n]{{0,120}}?{VERB}{DURATION}|{VERB}{DURATION}\s+{SUBJECT}", re.I)
GPU_RATE = re.compile(r"(?<![≥≤<>\d,] )(?<![\d,])(\d[\d,]*)\s+samples/s")  # a target ("≥ 2,000 samples/s") is not a measurement


def pages() -> dict[str, str]:
    """README and every docs page as a reader sees them outside the generated blocks (the params reference is generated whole)."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return {str(p.relative_to(REPO)): BLOCK.sub("", p.read_text()) for p in paths if p.name != "params.md"}


def test_no_page_states_how_long_a_command_takes_outside_the_measured_block():
    claims = [(page, m.group(0)) for page, text in pages().items() for m in TIME_CLAIM.finditer(text.replace("\n", " "))]
    assert not claims, f"times typed by hand (bench/timings.py measures them; the timings block shows them): {claims}"


def test_the_time_rule_catches_the_claims_the_pages_used_to_make():
    earlier = ("The first call spends 1 to 2 minutes installing. "
               "`make compare` (7 arms × 3 seeds) took 56 minutes while a test suite shared the cores.")
    found = [m.group(0) for m in TIME_CLAIM.finditer(earlier)]
    assert len(found) == 2 and found[0].endswith("1 to 2 minutes installing") and found[1].endswith("took 56 minutes"), found
    assert not TIME_CLAIM.search("`make run WAIT=600` queues behind it for up to 600 s")  # a limit, not a duration


def test_a_gpu_speed_on_a_page_is_one_the_measurements_hold():
    measured = {r["samples_s"] for r in facts.measured()["gpu"]["rows"]}
    stray = []
    for page, text in pages().items():
        for sentence in re.split(r"(?<=[.;])\s", text.replace("\n", " ")):
            if "H200" in sentence or "H100" in sentence:
                stray += [(page, rate) for rate in GPU_RATE.findall(sentence) if int(rate.replace(",", "")) not in measured]
    assert not stray, f"GPU speeds bench/measured.json does not hold: {stray}"


def test_the_deployment_commands_are_given_one_way():
    source = {line.split()[3]: line for line in facts.DEPLOYMENTS.splitlines() if line.startswith(".venv/bin/prefect deployment run")}
    differ = []
    for page, text in pages().items():
        for line in re.findall(r"^\.venv/bin/prefect deployment run \S+.*$", text, re.M):
            name = line.split()[3]
            if name in ("c2lip/promote",) and line != source[name]:
                differ.append((page, line))
            if name == "c2lip/evaluate" and "champion" in line and line != source[name]:
                differ.append((page, line))
    assert not differ, f"a command given otherwise than docs/tools/facts.py's DEPLOYMENTS: {differ}"
    # the generated blocks hold the source's lines themselves
    for (path, name), block in facts.blocks().items():
        if name == "deployments":
            assert all(line in block for line in source.values()), path


def test_every_make_target_a_page_names_exists():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = {(page, t) for page, text in pages().items() for t in re.findall(r"`make ([a-z][\w-]*)", text)}
    named |= {(page, t) for page, text in pages().items() for t in re.findall(r"^make ([a-z][\w-]*)", text, re.M)}
    assert not {(p, t) for p, t in named if t not in targets}, sorted((p, t) for p, t in named if t not in targets)


def test_the_ports_the_pages_name_are_the_scripts_defaults():
    serve = (REPO / "infra" / "serve.sh").read_text()
    defaults = {int(p) for p in re.findall(r"\$\{(?:PREFECT_PORT|C2LIP_REPORTS_PORT|C2LIP_MLFLOW_PORT):-(\d+)\}", serve)}
    defaults |= {int(p) for p in re.findall(r"^DOCS_PORT \?= (\d+)", (REPO / "Makefile").read_text(), re.M)}
    assert defaults == {4200, 4201, 5000, 8000}, defaults
    named = {(page, int(p)) for page, text in pages().items() for p in re.findall(r"127\.0\.0\.1:(\d{4})", text)}
    assert not {(page, p) for page, p in named if p not in defaults}, named
    readme = (REPO / "README.md").read_text()
    for variable in ("PREFECT_PORT", "C2LIP_REPORTS_PORT", "C2LIP_MLFLOW_PORT", "DOCS_PORT"):
        assert variable in readme and variable in (REPO / "docs" / "getting-started.md").read_text() + readme


def test_the_measurements_render_every_block_they_feed():
    data = facts.measured()
    assert data["benches"] and all(set(row) >= {"measures", "figure", "hardware", "measured_on"} for row in data["benches"].values())
    timings = data["timings"]
    assert timings["make_run_s"] > 0 and timings["make_test_s"] > 0 and timings["stages_s"]
    for (path, name), block in facts.blocks().items():
        assert "{" not in block.replace("${PREFECT_PORT:-4200}", "").replace("'{", "").replace("{\"", ""), (path, name)
    text = facts.timings_text()
    assert facts.duration(timings["make_run_s"]) in text and str(timings["tests_passed"]) in text


@pytest.mark.parametrize("seconds, said", [(40, "40 s"), (530, "8 min 50 s"), (59.6, "1 min 00 s"), (3360, "56 min 00 s")])
def test_a_duration_reads_as_a_person_says_it(seconds, said):
    assert facts.duration(seconds) == said


def test_a_bench_row_is_the_file_s_row(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "measured.json").write_text(json.dumps({"benches": {"python bench/x.py": {
        "measures": "m", "figure": "**2.00×**", "hardware": "2 CPU cores (x86-64)", "measured_on": "2026-12-07"}}}))
    assert facts.bench_table("docs/", tmp_path).splitlines()[2] == "| `python bench/x.py` | m | **2.00×** | 2 CPU cores (x86-64) |"


def test_the_timing_script_reads_each_stage_s_time_from_the_flow_s_log():
    sys.path.insert(0, str(REPO / "bench"))
    from timings import stage_seconds

    log = "\n".join([
        "23:59:50.000 | INFO    | Task run 'dvc repro captions' - $ dvc repro captions",
        "23:59:51.500 | INFO    | Task run 'dvc repro captions' - Running stage 'captions':",
        "00:00:10.000 | INFO    | Task run 'dvc repro captions' - Finished in state Completed()",
        "00:00:11.000 | INFO    | Task run 'dvc repro base' - Finished in state Completed()",  # skipped: never ran
        "00:00:12.000 | INFO    | Task run 'dvc repro train' - Running stage 'train':",
        "00:04:12.000 | INFO    | Task run 'dvc repro train' - Finished in state Completed()",
    ])
    assert stage_seconds(log) == {"captions": 18.5, "train": 240.0}  # past midnight too
