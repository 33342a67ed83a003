"""The findings table: one row per study question, every figure read from the report JSON that holds it.

README.md, the docs' home page and each results page carry the rows between ``<!-- findings -->`` markers; this script
writes them (``python docs/tools/findings.py --write``) and tests/test_findings.py fails when a page and the reports
disagree. A row's answer is a paired difference: for a comparison (``reports/<study>/compare.json``) the mean of the
seeds' differences with its 95% interval over seeds (Student's t) and how many seeds were above 0; for a single run
(``intervals.json`` of the evaluate stage) the difference with its 95% paired bootstrap interval over the items.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # facts.py beside it

from components.suite.compare_report import over_seeds  # noqa: E402  (the interval the comparison reports print)

GROUP_NAMES = {"binding": "binding", "zero_shot": "zero-shot", "retrieval": "retrieval", "compositional": "compositional"}


@dataclass(frozen=True)
class Finding:
    setting: str
    question: str
    report: str            # a compare.json or an evaluate stage's intervals.json, relative to the repository
    arm: str               # the compared arm (compare.json) or the model (intervals.json headlines)
    groups: tuple[str, ...]
    page: str              # the docs page that holds the evidence, relative to docs/
    also: tuple[str, ...] = ()  # other results pages whose answer includes the row

    def answer(self, root: Path = ROOT) -> tuple[str, str]:
        """(the differences with their intervals, what the intervals are over)."""
        data = json.loads((root / self.report).read_text())
        parts = []
        if "paired" not in data:  # one run against its base (the evaluate stage's intervals.json): the interval over items
            for group in self.groups:
                g = data[self.arm]["groups"][group]
                parts.append(f"{GROUP_NAMES[group]} {g['delta']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]")
            return "; ".join(parts), "1 run vs its base; interval over items"
        for group in self.groups:
            values = data["paired"][self.arm][group]["values"]
            i = over_seeds(values)
            parts.append(f"{GROUP_NAMES[group]} {i['mean']:+.3f} [{i['low']:+.3f}, {i['high']:+.3f}]")
        above = sum(v > 0 for v in data["paired"][self.arm][self.groups[0]]["values"])
        return "; ".join(parts), f"{len(values)} seeds ({above} above 0) vs `{data['reference']}`, {data['budget']['samples']:,} samples; interval over seeds"


# The study's questions, in the order a reader meets them. Never more than ten rows in README.
FINDINGS = (
    Finding("default run: [web-like base]({g}#web-like-base) → C2LIP", "Does the fine-tune make the model bind?",
            "reports/example-run/intervals.json", "finetuned", ("binding",), "results/default-run.md", ("results/what-this-shows.md",)),
    Finding("default run", "Does it keep zero-shot and retrieval?",
            "reports/example-run/intervals.json", "finetuned", ("zero_shot", "retrieval"), "results/default-run.md"),
    Finding("[mirrored setting]({g}#mirrored-setting)", "Does C2LIP bind better than the SigLIP fine-tune?",
            "reports/compare.json", "c2lip", ("binding", "zero_shot"), "results/comparison.md", ("results/what-this-shows.md",)),
    Finding("mirrored setting", "Does the [positive control]({g}#positive-control), NegCLIP, bind better there?",
            "reports/compare.json", "negclip", ("binding",), "results/comparison.md"),
    Finding("[from random weights]({g}#from-random-weights)", "Does C2LIP make binding emerge sooner than the contrastive term alone?",
            "reports/compare-binding/compare.json", "c2lip", ("binding", "zero_shot"), "results/what-this-shows.md"),
    Finding("from random weights", "Does NegCLIP?",
            "reports/compare-binding/compare.json", "negclip", ("binding",), "results/what-this-shows.md"),
    Finding("[calibrated base]({g}#calibrated-base), `make run`'s setting", "Does the positive control move binding there?",
            "reports/control-calibrated-default/compare.json", "negclip", ("binding",), "results/calibration.md",
            ("results/what-this-shows.md",)),
    Finding("calibrated base, [short captions]({g}#short-captions), 4× budget", "Does the positive control move binding?",
            "reports/control-calibrated-short-480/compare.json", "negclip_short", ("binding", "retrieval"), "results/calibration.md"),
    Finding("calibrated base, `make run`'s setting", "Does C2LIP, what `make run` trains, move binding there?",
            "reports/control-calibrated-default/compare.json", "c2lip", ("binding", "zero_shot"), "results/calibration.md",
            ("results/what-this-shows.md",)),
    Finding("calibrated base, short captions, 4× budget", "Does C2LIP move binding where the control does?",
            "reports/paper-calibrated-short-480/compare.json", "c2lip_short", ("binding",), "results/calibration.md"),
)

def _delta(d: dict | None) -> str:
    return "" if d is None else f"{d['delta']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def _agrees(d: dict | None) -> str:
    """✓ where the change's sign agrees with the published one, ✗ where not, nothing where nothing was published."""
    return {True: " ✓", False: " ✗", None: ""}[None if d is None else d.get("sign_agrees")]


def calibration_table(report: str, arms: tuple[str, ...], root: Path = ROOT) -> str:
    """A calibration report (``python -m components.suite.calibration``) as a table: per family the base's figure, each
    arm's change against the base over seeds with its 95% interval and whether its sign agrees with the published
    one (✓ / ✗), then the published changes."""
    data = json.loads((root / report).read_text())
    published = data["published"]["arms"]
    head = "| family | base | " + " | ".join(f"{a} Δ" for a in arms) + " | published C2LIP Δ | published NegCLIP |"
    rows = [head, "|---|---:|" + "---:|" * len(arms) + "---:|---:|"]
    for family, base in data["base"].items():
        cells = [_delta(data["arms"][a].get(family)) + _agrees(data["arms"][a].get(family)) for a in arms]
        c2lip = published.get("c2lip", {}).get(family, {}).get("delta")
        negclip = published.get("negclip", {}).get(family, {})
        direction = "up" if negclip.get("sign", 0) > 0 else "down"
        neg = f"{negclip['delta']:+.2f}" if "delta" in negclip else f"{negclip['value']:.3f} ({direction})" if negclip else ""
        rows.append(f"| {family} | {base:.3f} | " + " | ".join(cells) + f" | {'' if c2lip is None else f'{c2lip:+.3f}'} | {neg} |")
    return "\n".join(rows)


# the calibration page's tables: (report, the arms shown), each in its own block
CALIBRATION_TABLES = {"long": ("reports/calibration.json", ("siglip", "negclip", "c2lip", "negclip_short")),
                      "short-480": ("reports/calibration-short-480.json", ("siglip_short", "negclip_short", "c2lip_short"))}

# The calibrated base's builds: (label, report, model or arm). An evaluate stage's metrics.json holds one build (its
# model's keys); the spread's compare.json holds one build per seed, with where on its curve swap_att left chance.
BUILDS = (("first build, seed 0", "reports/base-calibrated/metrics.json", "base-calibrated"),
          ("retrain, seed 0", "reports/base-calibrated-retrain/metrics.json", "base-calibrated"),
          ("spread, seed {seed}", "reports/calibrated-builds/compare.json", "calibrated"),
          ("share 0.75, 4,000 steps, seed {seed}", "reports/calibrated-builds-candidate/compare.json", "share0.75-4000"),
          ("share 0.6, 4,000 steps, seed {seed}", "reports/calibrated-builds-share0.6/compare.json", "share0.6-4000"),
          ("share 0.6, 6,000 steps, seed {seed}", "reports/calibrated-builds-share0.6-6000/compare.json", "share0.6-6000"),
          ("share 0.6, 6,000 steps, lr 1e-3, seed {seed}", "reports/calibrated-builds-share0.6-lr1e-3/compare.json", "share0.6-6000-lr1e-3"),
          ("shipped build, seed {seed}", "reports/calibrated-build-seed0/compare.json", "calibrated"))
BUILD_COLUMNS = {"swap_att": ("sugarcrepe/swap_att/acc",), "swap_obj": ("sugarcrepe/swap_obj/acc",),
                 "SC++ swap ITT att / obj": ("sugarcrepe_pp/swap_att/itt", "sugarcrepe_pp/swap_obj/itt"),
                 "binding": ("summary/binding",), "VG-Rel / VG-Attr": ("aro/vg_relation/macro_acc", "aro/vg_attribution/macro_acc"),
                 "zero-shot": ("zero_shot/top1",)}
CALIBRATED = {"swap_att": 0.6, "zero-shot": 0.9}  # a build that calibrates: SugarCrepe swap_att and zero-shot top-1 at least


def _builds(root: Path) -> list[tuple[str, dict[str, float], int | None, bool]]:
    """Every build: (label, its figures by key, samples at which its tracking swap_att stayed ≥ 0.6 (None: not, or no
    curve), whether it has a curve)."""
    out = []
    for label, report, name in BUILDS:
        path = root / report
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        if "metrics" not in data:  # an evaluate stage's flat metrics.json
            out.append((label, {k.removeprefix(f"{name}/"): v for k, v in data.items() if k.startswith(f"{name}/")}, None, False))
            continue
        reach = {r["run"]: r["samples"] for r in data.get("reach", {}).get(name, [])}
        metrics = data["metrics"][name]
        for k, seed in enumerate(data["seeds"]):
            figures = {key: m["values"][k] for key, m in metrics.items() if k < len(m["values"])}
            out.append((label.format(seed=seed), figures, reach.get(f"{name}-s{seed}"), f"{name}-s{seed}" in reach))
    return out


def _figure(value: float, bar: float | None = None) -> str:
    """Three decimals, or four where three would round a figure under its bar up to it (0.8997 is not 0.900)."""
    text = f"{value:.3f}"
    return f"{value:.4f}" if bar is not None and value < bar <= float(text) else text


def builds_table(root: Path = ROOT) -> str:
    """One row per build of the calibrated base's recipe: the binding families, zero-shot, where binding appeared on its
    learning curve, and whether it calibrates (swap_att ≥ 0.6 with zero-shot ≥ 0.9)."""
    head = "| build | " + " | ".join(BUILD_COLUMNS) + " | swap_att ≥ 0.6 from | calibrates |"
    rows = [head, "|---|" + "---:|" * len(BUILD_COLUMNS) + "---:|:---:|"]
    bars = {BUILD_COLUMNS[c][0]: at for c, at in CALIBRATED.items()}
    for label, figures, reached, has_curve in _builds(root):
        cells = [" / ".join(_figure(figures[k], bars.get(k)) if k in figures else "–" for k in keys) for keys in BUILD_COLUMNS.values()]
        where = "no curve" if not has_curve else "not reached" if reached is None else f"{reached:,} samples"
        ok = all(figures.get(BUILD_COLUMNS[c][0], 0) >= at for c, at in CALIBRATED.items())
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {where} | {'✓' if ok else '✗'} |")
    return "\n".join(rows)


START, END = "<!-- findings: generated by docs/tools/findings.py from the reports; do not edit by hand -->", "<!-- /findings -->"


def table(findings=FINDINGS, link_prefix: str = "docs/", with_page: bool = True, root: Path = ROOT) -> str:
    """The markdown table; ``link_prefix`` is where docs/ is from the page the table stands on (the results pages': "../")."""
    glossary = f"{link_prefix}glossary.md"
    head = "| setting | question | answer: Δ [95% interval] | measured on |" + (" page |" if with_page else "")
    rule = "|---|---|---|---|" + ("---|" if with_page else "")
    rows = []
    for f in findings:
        row = "| {} | {} | {} | {} |".format(f.setting.format(g=glossary), f.question.format(g=glossary), *f.answer(root))
        if with_page:
            title = Path(f.page).stem.replace("-", " ")
            row += f" [{title}]({link_prefix}{f.page}) |"
        rows.append(row)
    return "\n".join([head, rule, *rows])


# where each block stands: (file, findings shown, link prefix, page column)
def blocks(root: Path = ROOT) -> dict[Path, str]:
    out = {root / "README.md": table(link_prefix="docs/", root=root), root / "docs" / "index.md": table(link_prefix="", root=root)}
    for page in sorted({f.page for f in FINDINGS}):
        own = tuple(f for f in FINDINGS if page in (f.page, *f.also))
        out[root / "docs" / page] = table(own, link_prefix="../", with_page=False, root=root)
    return out


def named_blocks(root: Path = ROOT) -> dict[tuple[Path, str], str]:
    """Blocks with a name (``<!-- findings:NAME ... -->``): the calibration page's tables and its builds."""
    page = root / "docs" / "results" / "calibration-notebook.md"
    return {**{(page, name): calibration_table(report, arms, root) for name, (report, arms) in CALIBRATION_TABLES.items()},
            (page, "builds"): builds_table(root)}


def markers(name: str = "") -> tuple[str, str]:
    return (START.replace("findings:", f"findings{':' + name if name else ''}:"), END)


def rewritten(text: str, block: str, path: Path, name: str = "") -> str:
    start, end = markers(name)
    # the start marker, then whole lines up to the first end marker (never past it into the next block)
    pattern = re.compile(re.escape(start) + r"\n(?:(?!" + re.escape(end) + r").*\n)*" + re.escape(end))
    if not pattern.search(text):
        raise SystemExit(f"{path}: no findings block ({start} ... {end}) to fill")
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", text)


def every_block(root: Path = ROOT) -> dict[tuple[Path, str], str]:
    """The findings blocks and the facts' (docs/tools/facts.py: measured figures, commands, the pitch)."""
    import facts

    return {**{(path, ""): block for path, block in blocks(root).items()}, **named_blocks(root), **facts.blocks(root)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in README.md and the docs pages (default: print the table)")
    args = parser.parse_args(argv)
    if not args.write:
        print(table())
        return 0
    for (path, name), block in every_block().items():
        text = path.read_text()
        new = rewritten(text, block, path, name)
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
