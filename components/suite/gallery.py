"""The failure gallery: a static page per compared model showing, for each compositional benchmark, items the model
fixed against the reference, items it broke, and items both get wrong — each with its image (the crop that was
scored), its captions, both models' scores and outcomes and the held-out mark — filterable by benchmark, outcome
and held-out. Everything is local: inline CSS and JS, thumbnails beside the page, no network."""

from __future__ import annotations

import hashlib
import html
import io
import json
import string
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


# the texts an item's rule wants the image to prefer; every other "s(image, <role>)" score is a competitor
POSITIVE_ROLES = frozenset({"caption", "caption2", "hard_positive", "true_caption"})


def margin(score_names: list[str], scores: list[float]) -> float | None:
    """How far an item is from flipping, from its scores: the smallest gap the benchmark's rule needs above zero — the
    worst positive's image score minus the best competitor's (SugarCrepe, SugarCrepe++ ITT, hard positives, ARO), or
    for Winoground the smallest of its four gaps (each image prefers its caption, each caption its image). Positive
    where the item is right (ties follow each benchmark's rule); None for a layout without competitors."""
    named = dict(zip(score_names, scores, strict=True))
    if "s(image_0, caption_0)" in named:
        s00, s01, s10, s11 = (named[f"s(image_{i}, caption_{j})"] for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
        return min(s00 - s01, s11 - s10, s00 - s10, s11 - s01)
    image = {name[len("s(image, "):-1]: value for name, value in named.items() if name.startswith("s(image, ")}
    positives = [v for role, v in image.items() if role in POSITIVE_ROLES]
    competitors = [v for role, v in image.items() if role not in POSITIVE_ROLES]
    return min(positives) - max(competitors) if positives and competitors else None


def _shown_path(image: str) -> str:
    """The image as the page names it: relative to the working folder (the page goes to MLflow and the docs site,
    where this machine's absolute paths say nothing and should not be published), else its file name."""
    path = Path(image)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


def _large(image: str, box: list[float] | None, thumbs: Path, px: int, large_px: int) -> str:
    """The enlarged picture's attribute: a copy at ``large_px`` only where the thumbnail lost detail (the crop is larger
    than ``px``); a small crop is shown large from its thumbnail, scaled up pixel by pixel by the page."""
    if large_px <= px:
        return ""
    if box is not None:
        width, height = box[2], box[3]
    else:
        with Image.open(image) as source:  # the header only
            width, height = source.size
    if max(width, height) <= px:
        return ""
    return f' data-large="thumbs/large/{thumbnail(image, box, thumbs / "large", large_px)}"'


def _card(task: str, row: dict, new_row: dict, kind: str, page: Page, thumbs: Path, px: int, large_px: int, order: int, rank: int) -> str:
    """One item's card; ``order``: its place in the page's seeded sample, ``rank``: its place among its benchmark's and
    outcome's cards (the first ``per_outcome`` are shown, "show more" reveals the rest)."""
    boxes = row["boxes"] or [None] * len(row["images"])
    pictures = "".join(
        f'<img src="thumbs/{thumbnail(image, box, thumbs, px)}" alt="{html.escape(Path(image).name)}" title="{html.escape(_shown_path(image))}"'
        + _large(image, box, thumbs, px, large_px) + ">" for image, box in zip(row["images"], boxes, strict=True))
    texts = "".join(f'<li><span class="role">{html.escape(role)}</span> {html.escape(text)}</li>'
                    for role, text in zip(row["roles"], row["texts"], strict=True))
    scores = "".join(f"<tr><td>{html.escape(name)}</td><td>{a:.3f}</td><td>{b:.3f}</td></tr>"
                     for name, a, b in zip(row["score_names"], row["scores"], new_row["scores"], strict=True))
    verdict = "".join(f'<td class="{"ok" if ok else "bad"}">{"right" if ok else "wrong"}</td>' for ok in (row["correct"], new_row["correct"]))
    held = "held-out" if row["held_out"] else "seen"
    badge = '<span class="badge">held-out pair</span>' if row["held_out"] else ""
    margins = [margin(r["score_names"], r["scores"]) for r in (row, new_row)]
    margin_row, margin_data = "", ""
    if None not in margins:
        margin_row = f'<tr class="margin"><td>margin</td><td>{margins[0]:+.3f}</td><td>{margins[1]:+.3f}</td></tr>'
        margin_data = f' data-margin-reference="{margins[0]:.6f}" data-margin-model="{margins[1]:.6f}"'
    return (f'<div class="card" data-benchmark="{html.escape(task)}" data-outcome="{kind}" data-held="{held}" '
            f'data-order="{order}" data-rank="{rank}"{margin_data}>'
            f'<div class="head"><b>{html.escape(task)}</b> item {html.escape(row["item"])} {badge}</div>'
            f'<div class="pics">{pictures}</div><ul class="texts">{texts}</ul>'
            f'<table class="scores"><tr><th>score</th><th>{html.escape(page.reference)}</th><th>{html.escape(page.model)}</th></tr>'
            f'{scores}{margin_row}<tr><td>outcome</td>{verdict}</tr></table></div>')


def render_page(page: Page, tasks: list, thumbs: Path, per_outcome: int, seed: int, px: int, others: list[tuple[str, str]],
                more: int = 1, large_px: int = 480) -> str:
    """One page's HTML; thumbnails are written into ``thumbs`` as cards need them. Per benchmark and outcome a seeded
    sample of ``per_outcome * (1 + more)`` items is kept, the first ``per_outcome`` shown, the rest behind "show more"."""
    shown = [t for t in tasks if t.group in GALLERY_GROUPS]
    cards, summary = [], []
    kept = per_outcome * (1 + more)
    for task in shown:
        ref, new = page.reference_tables[task.name], page.model_tables[task.name]
        kind = outcome_of(*_correct(ref, new))
        n_items = ref.num_rows
        cells = []
        for key, label, _ in OUTCOMES:
            where = np.flatnonzero(kind == key)
            rng = np.random.default_rng([seed, zlib.crc32(f"{task.name}|{key}".encode())])
            # the first per_outcome of the permutation are the items shown first (the same ones whatever ``more`` is)
            chosen = rng.permutation(where)[:kept] if len(where) else where
            first = min(per_outcome, len(chosen))
            name = html.escape(task.name)
            count = (f'<button class="count" type="button" data-benchmark="{name}" data-outcome="{key}" '
                     f'title="show the {label} items of {name}"{" disabled" if not len(where) else ""}>{len(where)}</button>')
            cells.append(f'<td data-benchmark="{name}" data-outcome="{key}" data-total="{len(where)}" '
                         f'data-shown="{first}" data-kept="{len(chosen)}">{count}<small> (shown {first}'
                         f'{f", {len(chosen) - first} more" if len(chosen) > first else ""})</small></td>')
            picked = pa.array(chosen, pa.int64())
            ref_rows, new_rows = ref.take(picked).to_pylist(), new.take(picked).to_pylist()
            cards += [_card(task.name, r, n, key, page, thumbs, px, large_px, len(cards) + rank, rank)
                      for rank, (r, n) in enumerate(zip(ref_rows, new_rows, strict=True))]
        summary.append(f"<tr><td>{html.escape(task.name)}</td><td>{n_items}</td>{''.join(cells)}</tr>")
    options = "".join(f'<option value="{html.escape(t.name)}">{html.escape(t.name)}</option>' for t in shown)
    outcome_options = "".join(f'<option value="{key}">{label}</option>' for key, label, _ in OUTCOMES)
    legend = "; ".join(f"<b>{label}</b>: {why}" for _, label, why in OUTCOMES)
    links = " · ".join(f'<a href="{html.escape(f)}">{html.escape(label)}</a>' for f, label in others)
    title = f"{page.model} against {page.reference}: what changed, item by item"
    more_note = f"up to {kept} behind <i>show more</i>" if more else "no more kept"
    return PAGE.substitute(title=html.escape(title), legend=legend, per_outcome=per_outcome, seed=seed, summary="".join(summary),
                           options=options, outcome_options=outcome_options, cards="\n".join(cards), links=links or "",
                           model=html.escape(page.model), more_note=more_note)


def write_gallery(folder: Path, pages: list[Page], tasks: list, per_outcome: int = 24, seed: int = 0, px: int = 160,
                  more: int = 1, large_px: int = 480) -> list[Path]:
    """Every page and its thumbnails into ``folder``, which must not exist yet: the callers build it inside a temporary
    folder of their own and swap it in whole (:mod:`components.shared.owned_outputs`), so a killed run leaves the old
    gallery and nothing beside it is touched."""
    if folder.exists():
        raise FileExistsError(f"{folder}: the gallery is written into a new folder (it exists)")
    (folder / "thumbs" / "large").mkdir(parents=True)
    others = [(p.file, f"{p.model} vs {p.reference}") for p in pages]
    for page in pages:
        text = render_page(page, tasks, folder / "thumbs", per_outcome, seed, px, others if len(pages) > 1 else [], more, large_px)
        atomic_write_bytes(folder / page.file, text.encode())
    return [folder / p.file for p in pages]


# the page's layout, styles and script (string.Template: $name placeholders)
PAGE = string.Template((Path(__file__).with_name("gallery_page.html")).read_text())
