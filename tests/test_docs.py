"""The documentation: the site builds in strict mode (a broken link, a missing page or an unlisted page fails), the
params reference is what the schema says today, README stays a front door, and no user-facing text cites an internal
issue number."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import HANG_S, REPO


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site as `make docs` builds it (strict: a broken link or an unlisted page fails), built once for the module."""
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev group: `make test` installs it")
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    assert result.returncode == 0, result.stderr[-3000:]
    return site


def test_the_site_builds_strictly(built_site):
    site = built_site
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
    head = text.splitlines()[:8]  # the title and the two commands, each under its comment
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
    # your-data/ is the recipe for a user's own data: its reports are the user's, not shipped studies
    reports = sorted({m.group(1) for preset in (REPO / "params" / "presets").rglob("*.yaml") if preset.parent.name != "your-data"
                      for m in [re.search(r"^report_dir:\s*(reports/[\w.-]+)\s*$", preset.read_text(), flags=re.MULTILINE)] if m})
    assert "reports/calibrate-base" in reports, reports
    paths = [f"{folder}/{name}" for folder in reports for name in ("compare.md", "compare.json", "compare.png")]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert ignored.returncode in (0, 1), ignored.stderr
    assert ignored.stdout.split() == [], f"git ignores these reports: {ignored.stdout.split()}"
    gallery = subprocess.run(["git", "check-ignore", "--no-index", f"{reports[0]}/compare-gallery/index.html"], cwd=REPO, capture_output=True, text=True)
    assert gallery.returncode == 0, "a comparison's gallery should stay out of git"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium); the results "
                    "pages' browser check needs it")
@pytest.mark.parametrize("width", [1280, 820])
def test_the_home_and_results_pages_open_with_an_answer_that_fits_and_a_picture_that_loads(built_site, width):
    """As a reader sees them in a browser: the home page shows the findings table; each results page opens with its
    answer table, which fits the page without scrolling sideways, and its curves (a picture that loads); on a laptop's
    screen no table of a results page scrolls sideways."""
    from playwright.sync_api import sync_playwright

    pages = ["index.html", *(f"results/{name}/index.html" for name in ("default-run", "comparison", "what-this-shows", "calibration"))]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], timeout=HANG_S * 1000)
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.set_default_timeout(HANG_S * 1000)
        page.set_default_navigation_timeout(HANG_S * 1000)
        for name in pages:
            page.goto((built_site / name).as_uri())
            page.wait_for_load_state("load")
            first = page.evaluate("""() => {
                const tables = [...document.querySelectorAll('article table')];
                const table = tables.find(t => t.querySelector('th')?.textContent.trim() === 'setting');
                if (!table) return {header: tables.length ? [...tables[0].querySelectorAll('th')].map(th => th.textContent.trim()) : []};
                const wrap = table.closest('.md-typeset__scrollwrap') || table.parentElement;
                const header = [...table.querySelectorAll('th')].map(th => th.textContent.trim());
                return {header, first: tables.indexOf(table), tableWidth: table.scrollWidth, room: wrap.clientWidth,
                        rows: table.querySelectorAll('tbody tr').length};
            }""")
            assert first["header"][:3] == ["setting", "question", "answer: Δ [95% interval]"], (name, first["header"])
            assert first["rows"] >= 1 and first["tableWidth"] <= first["room"] + 1, (name, width, first)
            assert name == "index.html" or first["first"] == 0, f"{name}: the answer is not the page's first table"
            if name == "index.html":  # the home page's findings start on the first screen, under the pitch and the verdict
                top = page.evaluate("""() => [...document.querySelectorAll('article table')]
                    .find(t => t.querySelector('th')?.textContent.trim() === 'setting').getBoundingClientRect().top""")
                assert top < 900, f"the findings start {top:.0f} px down the home page at {width} px, below the first screen"
            if width >= 1280:  # on a laptop's screen every table of the page fits, the evidence's too
                wide = page.evaluate("""() => [...document.querySelectorAll('article table')]
                    .filter(t => t.scrollWidth > (t.closest('.md-typeset__scrollwrap') || t.parentElement).clientWidth + 1)
                    .map(t => t.querySelector('th')?.textContent.trim())""")
                assert not wide, f"{name}: tables that scroll sideways at {width} px, headed {wide}"
            if name != "index.html":
                picture = page.evaluate("""() => { const img = document.querySelector('article img');
                    return img ? {src: img.getAttribute('src'), width: img.naturalWidth,
                                  shown: img.getBoundingClientRect().width} : null; }""")
                assert picture and picture["width"] > 0, (name, picture)
                if width >= 1280 and "curves" in picture["src"]:  # read as drawn, without clicking: near its own size
                    assert picture["shown"] >= 0.85 * picture["width"], (name, picture)
        browser.close()


BLOCK = re.compile(r"<!-- findings[^>]*-->\n.*?<!-- /findings -->", re.S)
CODE_WITH_TRAILING_COMMENT = re.compile(r"^\s*[^#\s].*?\S\s+#\s")


def test_each_results_page_fits_in_1500_words_with_its_notebook_apart():
    """A results page is its answer and evidence (the generated tables aside); the runs behind it are an appendix page."""
    results = REPO / "docs" / "results"
    for page in sorted(results.glob("*.md")):
        if page.stem.endswith("-notebook"):
            assert (results / f"{page.stem.removesuffix('-notebook')}.md").is_file(), page
            continue
        words = len(BLOCK.sub("", page.read_text()).split())
        assert words <= 1500, f"{page.relative_to(REPO)}: {words} words outside its generated tables"


def test_reliability_is_in_sections():
    text = (REPO / "docs" / "reliability.md").read_text()
    sections = [line for line in text.splitlines() if line.startswith("### ")]
    assert len(sections) >= 5, sections
    for part in text.split("\n### ")[1:]:  # no section is a wall: each table under a screenful of rows... of 30
        assert sum(line.startswith("| ") for line in part.splitlines()) <= 30, part.splitlines()[0]


def test_code_comments_stand_on_their_own_lines():
    """A comment after a command in a code block runs off the right edge of the page; each stands on its own line."""
    trailing = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        inside = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                inside = not inside
            elif inside and CODE_WITH_TRAILING_COMMENT.match(line) and line.count("'") % 2 == 0 and line.count('"') % 2 == 0:
                trailing.append(f"{page.relative_to(REPO)}:{number}")
    assert not trailing, trailing


def test_the_pitch_says_what_the_testbed_answers_and_what_it_cannot():
    for page in (REPO / "README.md", REPO / "docs" / "index.md"):
        head = page.read_text()[:3500]
        assert "What you can learn here, and what you cannot." in head and "real data at GPU scale" in head, page
    home = (REPO / "docs" / "index.md").read_text()
    assert home.index("**The verdict so far:**") < home.index("| setting | question |") < home.index("## ")
