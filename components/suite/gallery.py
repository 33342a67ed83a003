"""The failure gallery: a static page per compared model showing, for each compositional benchmark, items the model
fixed against the reference, items it broke, and items both get wrong — each with its image (the crop that was
scored), its captions, both models' scores and outcomes and the held-out mark — filterable by benchmark, outcome
and held-out. Everything is local: inline CSS and JS, thumbnails beside the page, no network."""

from __future__ import annotations

import hashlib
import html
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from components.shared.atomic import atomic_write_bytes

OUTCOMES = (("fixed", "fixed", "the reference got it wrong, the model right"), ("broken", "broken", "the reference right, the model wrong"),
            ("both_wrong", "both wrong", "neither model gets it right"))
GALLERY_GROUPS = ("compositional",)  # binding's benchmarks are compositional ones (components.suite.report.BINDING_TASKS)


@dataclass
class Page:
    """One gallery page: ``model`` against ``reference``, their per-item tables (task name -> table)."""

    file: str
    reference: str
    model: str
    reference_tables: dict[str, pa.Table]
    model_tables: dict[str, pa.Table]


def outcome_of(ref_correct: np.ndarray, new_correct: np.ndarray) -> np.ndarray:
    """Per item: "fixed", "broken", "both_wrong" or "" (both right: not shown)."""
    out = np.full(len(ref_correct), "", dtype=object)
    out[~ref_correct & new_correct] = "fixed"
    out[ref_correct & ~new_correct] = "broken"
    out[~ref_correct & ~new_correct] = "both_wrong"
    return out


def _correct(ref: pa.Table, new: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The two models' headline outcome per item (the compositional benchmarks have one row per item)."""
    return ref.column("correct").to_numpy(zero_copy_only=False), new.column("correct").to_numpy(zero_copy_only=False)


def thumbnail(image: str, box: list[float] | None, folder: Path, px: int) -> str:
    """The scored image (cropped to its box) at most ``px`` on its longest side, once per image and box; its name."""
    name = hashlib.sha1(json.dumps([image, box]).encode()).hexdigest()[:16] + ".jpg"
    target = folder / name
    if not target.is_file():
        try:
            with Image.open(image) as source:
                picture = source.convert("RGB")
        except OSError as err:
            raise ValueError(f"{image}: cannot read the image for the gallery ({err})") from None
        if box is not None:
            x, y, w, h = box
            picture = picture.crop((x, y, x + w, y + h))
        picture.thumbnail((px, px))
        buf = io.BytesIO()
        picture.save(buf, format="JPEG", quality=88)
        atomic_write_bytes(target, buf.getvalue())
    return name


def _shown_path(image: str) -> str:
    """The image as the page names it: relative to the working folder (the page goes to MLflow and the docs site,
    where this machine's absolute paths say nothing and should not be published), else its file name."""
    path = Path(image)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


def _card(task: str, row: dict, new_row: dict, kind: str, page: Page, thumbs: Path, px: int) -> str:
    boxes = row["boxes"] or [None] * len(row["images"])
    pictures = "".join(
        f'<img src="thumbs/{thumbnail(image, box, thumbs, px)}" alt="{html.escape(Path(image).name)}" title="{html.escape(_shown_path(image))}">'
        for image, box in zip(row["images"], boxes, strict=True))
    texts = "".join(f'<li><span class="role">{html.escape(role)}</span> {html.escape(text)}</li>'
                    for role, text in zip(row["roles"], row["texts"], strict=True))
    scores = "".join(f"<tr><td>{html.escape(name)}</td><td>{a:.3f}</td><td>{b:.3f}</td></tr>"
                     for name, a, b in zip(row["score_names"], row["scores"], new_row["scores"], strict=True))
    verdict = "".join(f'<td class="{"ok" if ok else "bad"}">{"right" if ok else "wrong"}</td>' for ok in (row["correct"], new_row["correct"]))
    held = "held-out" if row["held_out"] else "seen"
    badge = '<span class="badge">held-out pair</span>' if row["held_out"] else ""
    return (f'<div class="card" data-benchmark="{html.escape(task)}" data-outcome="{kind}" data-held="{held}">'
            f'<div class="head"><b>{html.escape(task)}</b> item {html.escape(row["item"])} {badge}</div>'
            f'<div class="pics">{pictures}</div><ul class="texts">{texts}</ul>'
            f'<table class="scores"><tr><th>score</th><th>{html.escape(page.reference)}</th><th>{html.escape(page.model)}</th></tr>'
            f'{scores}<tr><td>outcome</td>{verdict}</tr></table></div>')


def render_page(page: Page, tasks: list, thumbs: Path, per_outcome: int, seed: int, px: int, others: list[tuple[str, str]]) -> str:
    """One page's HTML; thumbnails are written into ``thumbs`` as cards need them."""
    shown = [t for t in tasks if t.group in GALLERY_GROUPS]
    cards, summary = [], []
    for task in shown:
        ref, new = page.reference_tables[task.name], page.model_tables[task.name]
        kind = outcome_of(*_correct(ref, new))
        n_items = ref.num_rows
        cells = []
        for key, _, _ in OUTCOMES:
            where = np.flatnonzero(kind == key)
            rng = np.random.default_rng([seed, zlib.crc32(f"{task.name}|{key}".encode())])
            chosen = np.sort(rng.choice(where, size=min(per_outcome, len(where)), replace=False)) if len(where) else where
            cells.append(f'<td data-benchmark="{html.escape(task.name)}" data-outcome="{key}" data-total="{len(where)}" '
                         f'data-shown="{len(chosen)}">{len(where)}<small> (shown {len(chosen)})</small></td>')
            ref_rows, new_rows = ref.take(pa.array(chosen, pa.int64())).to_pylist(), new.take(pa.array(chosen, pa.int64())).to_pylist()
            cards += [_card(task.name, r, n, key, page, thumbs, px) for r, n in zip(ref_rows, new_rows, strict=True)]
        summary.append(f"<tr><td>{html.escape(task.name)}</td><td>{n_items}</td>{''.join(cells)}</tr>")
    options = "".join(f'<option value="{html.escape(t.name)}">{html.escape(t.name)}</option>' for t in shown)
    outcome_options = "".join(f'<option value="{key}">{label}</option>' for key, label, _ in OUTCOMES)
    legend = "; ".join(f"<b>{label}</b>: {why}" for _, label, why in OUTCOMES)
    links = " · ".join(f'<a href="{html.escape(f)}">{html.escape(label)}</a>' for f, label in others)
    title = f"{page.model} against {page.reference}: what changed, item by item"
    return PAGE.format(title=html.escape(title), legend=legend, per_outcome=per_outcome, seed=seed, summary="".join(summary),
                       options=options, outcome_options=outcome_options, cards="\n".join(cards), links=links or "")


def write_gallery(folder: Path, pages: list[Page], tasks: list, per_outcome: int = 24, seed: int = 0, px: int = 160) -> list[Path]:
    """Every page and its thumbnails into ``folder``, which must not exist yet: the callers build it inside a temporary
    folder of their own and swap it in whole (:mod:`components.shared.owned_outputs`), so a killed run leaves the old
    gallery and nothing beside it is touched."""
    if folder.exists():
        raise FileExistsError(f"{folder}: the gallery is written into a new folder (it exists)")
    (folder / "thumbs").mkdir(parents=True)
    others = [(p.file, f"{p.model} vs {p.reference}") for p in pages]
    for page in pages:
        text = render_page(page, tasks, folder / "thumbs", per_outcome, seed, px, others if len(pages) > 1 else [])
        atomic_write_bytes(folder / page.file, text.encode())
    return [folder / p.file for p in pages]


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.4em; }} .note {{ color: #555; max-width: 70em; }}
table.summary {{ border-collapse: collapse; margin: 1em 0; }} table.summary td, table.summary th {{ border: 1px solid #ccc; padding: 2px 8px; }}
.filters {{ position: sticky; top: 0; background: #fff; padding: .6em 0; border-bottom: 1px solid #ddd; z-index: 1; }}
.filters label {{ margin-right: 1.2em; }}
.cards {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 12px; margin-top: 1em; }}
.card {{ border: 1px solid #ccc; border-radius: 6px; padding: 8px; }} .card[hidden] {{ display: none; }}
.card[data-outcome=fixed] {{ border-left: 6px solid #2a9d4b; }} .card[data-outcome=broken] {{ border-left: 6px solid #c0392b; }}
.card[data-outcome=both_wrong] {{ border-left: 6px solid #888; }}
.pics img {{ max-height: 160px; margin-right: 4px; border: 1px solid #eee; }}
.texts {{ padding-left: 1em; margin: .4em 0; }} .role {{ font-size: 11px; color: #666; background: #f1f1f1; padding: 0 4px; border-radius: 3px; }}
.scores {{ font-size: 12px; border-collapse: collapse; }} .scores td, .scores th {{ padding: 1px 6px; text-align: right; }}
.scores td:first-child {{ text-align: left; color: #555; }} .ok {{ color: #2a9d4b; font-weight: bold; }} .bad {{ color: #c0392b; font-weight: bold; }}
.badge {{ font-size: 11px; background: #fde7b0; padding: 0 5px; border-radius: 3px; }}
</style></head><body>
<h1>{title}</h1>
<p class="note">{legend}. Per benchmark, a seeded sample (seed {seed}) of at most {per_outcome} items per outcome; the counts are
over every item. Scores are cosine similarities of the image (the crop that was scored) and each text. {links}</p>
<table class="summary"><tr><th>benchmark</th><th>items</th><th>fixed</th><th>broken</th><th>both wrong</th></tr>{summary}</table>
<div class="filters">
<label>benchmark <select id="benchmark"><option value="">all</option>{options}</select></label>
<label>outcome <select id="outcome"><option value="">all</option>{outcome_options}</select></label>
<label>items <select id="held"><option value="">all</option><option value="held-out">held-out pairs</option>
<option value="seen">seen pairs</option></select></label>
<span id="count"></span>
</div>
<div class="cards">
{cards}
</div>
<script>
const pick = id => document.getElementById(id);
function apply() {{
  const b = pick("benchmark").value, o = pick("outcome").value, h = pick("held").value;
  let shown = 0;
  for (const card of document.querySelectorAll(".card")) {{
    const keep = (!b || card.dataset.benchmark === b) && (!o || card.dataset.outcome === o) && (!h || card.dataset.held === h);
    card.hidden = !keep;
    shown += keep;
  }}
  pick("count").textContent = shown + " cards shown";
}}
for (const id of ["benchmark", "outcome", "held"]) pick(id).addEventListener("change", apply);
apply();
</script>
</body></html>
"""
