"""Pages generated at build time by mkdocs-gen-files (mkdocs.yml): the reports the stages wrote — the benchmark report
and every comparison under reports/ — and their charts, so a re-run of the pipeline updates the site without a hand
copy. Pages of reports that do not exist yet (a fresh clone before `make run`) say how to make them."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
# the shipped example run (`make example-run` keeps a run's report there): what the hand-written pages describe
EXAMPLE = REPORTS / "example-run"
# charts the hand-written pages show, under the site's assets/
ASSETS = {"benchmarks.png": EXAMPLE / "benchmarks.png", "compare.png": REPORTS / "compare.png",
          "compare-logits.png": REPORTS / "compare-logits.png", "base_loss.png": ROOT / "models" / "base" / "loss.png",
          # the learning curves the results pages open with
          "curves-compare-binding.png": REPORTS / "compare-binding" / "curves.png",
          "curves-paper-calibrated-short-480.png": REPORTS / "paper-calibrated-short-480" / "curves.png",
          "curves-calibrated-builds.png": REPORTS / "calibrated-builds" / "curves.png",
          "curves-calibrated-builds-candidate.png": REPORTS / "calibrated-builds-candidate" / "curves.png",
          "curves-calibrated-builds-share0.6.png": REPORTS / "calibrated-builds-share0.6" / "curves.png",
          "curves-calibrated-builds-share0.6-6000.png": REPORTS / "calibrated-builds-share0.6-6000" / "curves.png",
          "curves-calibrated-builds-share0.6-lr1e-3.png": REPORTS / "calibrated-builds-share0.6-lr1e-3" / "curves.png"}


def copy(source: Path, target: str) -> bool:
    if not source.is_file():
        return False
    with mkdocs_gen_files.open(target, "wb") as out:
        out.write(source.read_bytes())
    return True


def report_page(target: str, report: Path, chart: Path | None, title: str, how: str, note: str = "") -> None:
    """``report`` (markdown a stage wrote) as a page, its chart beside it; or a note saying how to make it."""
    with mkdocs_gen_files.open(target, "w") as page:
        if not report.is_file():
            page.write(f"# {title}\n\nNot made yet: {how}.\n")
            return
        text = report.read_text()
        source = report.relative_to(ROOT)
        lines = text.split("\n")
        page.write(lines[0] + "\n\n" + f"*Written by the pipeline: `{source}`.{note}*\n\n")
        if chart is not None and copy(chart, str(Path(target).parent / f"{Path(target).stem}.png")):
            page.write(f"![{title}]({quote(Path(target).stem)}.png)\n\n")  # a folder named "a#1" is a link, not an anchor
        page.write("\n".join(lines[1:]))


for name, path in ASSETS.items():
    copy(path, f"assets/{name}")

def gallery_for(page_path: str, source: Path, prefix: str, target: str) -> None:
    """The failure gallery a report links (``prefix``/…) copied into the site under ``target`` (beside the page) and the
    links pointed there; without one (a fresh clone before `make run`) the links become text saying how to make it."""
    pages = sorted(source.glob("*.html")) if source.is_dir() else []
    for file in sorted(p for p in source.rglob("*") if p.is_file()) if pages else []:
        copy(file, f"{Path(page_path).parent.as_posix()}/{target}/{file.relative_to(source).as_posix()}")
    with mkdocs_gen_files.open(page_path, "r") as page:
        text = page.read()
    if pages:
        text = text.replace(f"]({prefix}/", f"]({quote(target)}/")
    else:
        text = re.sub(rf"\[([^\]]+)\]\({re.escape(prefix)}/[^)]+\)", r"\1 (not made yet: `make run` writes it)", text)
    with mkdocs_gen_files.open(page_path, "w") as page:
        page.write(text)


# a run's own report where this checkout has one, else the shipped example run's
OWN_RUN = (REPORTS / "benchmarks.md").is_file()
RUN = REPORTS if OWN_RUN else EXAMPLE
report_page("results/reports/benchmarks.md", RUN / "benchmarks.md", RUN / "benchmarks.png",
            "Benchmark report", "`make run` writes it (reports/benchmarks.md)",
            "" if OWN_RUN else " The shipped example run; `make run` writes your own into reports/benchmarks.md.")
gallery_for("results/reports/benchmarks.md", RUN / "gallery", "gallery", "gallery")
report_page("results/reports/bases.md", REPORTS / "base-calibrated" / "benchmarks.md", REPORTS / "base-calibrated" / "benchmarks.png",
            "The two bases", "`python -m components.evaluate --params params/presets/calibration/evaluate-bases.yaml` writes it (reports/base-calibrated/)")
gallery_for("results/reports/bases.md", REPORTS / "base-calibrated" / "gallery", "gallery", "bases-gallery")
report_page("results/reports/compare.md", REPORTS / "compare.md", REPORTS / "compare.png",
            "Comparison of methods", "`make compare` writes it (reports/compare.md)")
gallery_for("results/reports/compare.md", REPORTS / "compare-gallery", "compare-gallery", "compare-gallery")


def preset_reports() -> dict[str, Path]:
    """Report folder name -> the preset that writes it, for every comparison preset under params/presets/: each gets a
    page whether or not it has been run here, so the site's navigation never points at a page a fresh clone lacks."""
    found = {}
    for preset in sorted((ROOT / "params" / "presets").rglob("*.yaml")):
        match = re.search(r"^report_dir:\s*reports/([\w.-]+)\s*$", preset.read_text(), flags=re.MULTILINE)
        if match:
            found[match.group(1)] = preset.relative_to(ROOT)
    return found


PRESETS = preset_reports()
RUN_FOLDERS = {p.name for p in REPORTS.glob("*/") if (p / "compare.md").is_file()}
for name in sorted(RUN_FOLDERS | set(PRESETS)):
    folder = REPORTS / name
    how = (f"`python -m components.compare --params {PRESETS[name]}` writes it (reports/{name}/)" if name in PRESETS
           else f"`python -m components.compare` with its params writes it (reports/{name}/)")
    report_page(f"results/reports/{name}.md", folder / "compare.md", folder / "compare.png", f"Comparison: {name}", how)
    gallery_for(f"results/reports/{name}.md", folder / "compare-gallery", "compare-gallery", f"{name}-gallery")


def evaluated_card(metrics: Path) -> str | None:
    """The card the register step writes (components.register.registry_card, the same code): the train stage's card
    completed with the benchmark summary against the base from ``metrics`` (a run's, or the shipped example run's);
    None when it cannot be rendered here (the page then says why)."""
    import sys

    sys.path.insert(0, str(ROOT))
    try:
        from components.register import registry_card
        from components.shared.params import load_params

        params = load_params("registry").model_copy(update={"metrics_path": metrics,
                                                            "train_params": ROOT / "params" / "train.yaml",
                                                            "export_dir": ROOT / "models" / "train" / "export"})
        return registry_card(params)
    except Exception as err:  # noqa: BLE001 - the site still builds; the page says how to make the card
        print(f"gen_pages: the model card with {metrics} could not be rendered ({err})")
        return None


def card_page(target: str, card: Path, run_metrics: Path) -> None:
    """The fine-tune's model card as a page, with the benchmark summary against the base as registration completes it:
    after a run, the run's export card and its own figures; before, the card of the default params with the shipped
    example run's figures. Its front matter is shown as YAML, then its body."""
    with mkdocs_gen_files.open(target, "w") as page:
        text = evaluated_card(run_metrics) if card.is_file() and run_metrics.is_file() else None
        note = ("*The model card of your run: the train stage's card (`models/train/export/README.md`) completed with the "
                "evaluate stage's figures (`reports/metrics.json`), as registration writes it (`reports/model-card.md`, "
                "the registered version's `model_card/README.md`).*")
        if text is None and card.is_file():
            text = card.read_text()
            note = ("*The export's model card, as the train stage wrote it: `models/train/export/README.md`; its benchmark "
                    "summary comes with the evaluate stage's report (`dvc repro evaluate`).*")
        if text is None:
            text = evaluated_card(EXAMPLE / "metrics.json")
            note = ("*The card `make run` registers for the default params, shown with the shipped example run's benchmark "
                    "summary (`reports/example-run/`); your run writes its own (`reports/model-card.md`).*")
            if text is None:
                page.write("# Model card\n\nNot made yet: the train stage writes it into `models/train/export/README.md` (`make run`).\n")
                return
        front, body = ("", text)
        if text.startswith("---\n"):
            end = text.index("\n---", 4)
            front, body = text[4:end], text[end + 4:]
        lines = body.strip().split("\n")
        page.write(lines[0] + "\n\n" + note + "\n\n")
        page.write("\n".join(lines[1:]) + "\n\n## Front matter (Hugging Face model-card metadata)\n\n```yaml\n" + front.strip() + "\n```\n")


card_page("results/model-card.md", ROOT / "models" / "train" / "export" / "README.md", REPORTS / "metrics.json")
