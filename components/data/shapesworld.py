"""ShapesWorld: the embedded synthetic world in which compositionality can be measured.

An image holds 1–N objects, each a (color, shape, size) in its own cell of a 3x3 grid, on a plain
background. Every image is a pure function of (seed, split, index), so any shard can be rebuilt alone
and a resumed run writes the same bytes as an uninterrupted one. The scene is kept as metadata (objects,
bounding boxes, relations, the true object phrases), from which the captions here and, later, the
benchmarks and the concept-quality figures are derived.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from components.data import shapesworld_grammar as grammar
from components.data.shapesworld_grammar import INVERSE_RELATION, NUMBER_WORDS  # noqa: F401  (the world's words)
from components.shared.params import ShapesWorldParams

SPLITS = {"train": 0, "test": 1}
GRID = 3  # objects sit in distinct cells of a GRID x GRID layout, so relations are never ambiguous
SUPERSAMPLE = 4  # draw large and downsample: anti-aliased edges make shapes legible at 64 px
# Relation of a subject to an object, and the inverse used when the pair is read the other way round.


@dataclass(frozen=True)
class SceneObject:
    color: str
    shape: str
    size: str
    row: int
    col: int
    cx: float  # center, pixels
    cy: float
    radius: float  # pixels

    @property
    def phrase(self) -> str:
        """The object's noun phrase, e.g. ``a large red circle`` (the true concept of the object)."""
        return grammar.object_phrase(grammar.Mention(shape=self.shape, color=self.color, size=self.size))

    @property
    def name(self) -> str:
        """Definite reference, unique within an image because (color, shape) pairs never repeat."""
        return f"the {self.color} {self.shape}"


def held_out_pairs(world: ShapesWorldParams, seed: int) -> list[tuple[str, str]]:
    """(color, shape) pairs kept out of the training split, chosen by ``seed``.

    No two held-out pairs share a color or a shape, so every color and every shape is still seen in
    training — only the combination is new.
    """
    colors, shapes = list(world.colors), list(world.shapes)
    wanted = round(world.held_out_fraction * len(colors) * len(shapes))
    wanted = min(wanted, len(colors) - 1, len(shapes) - 1)
    rng = np.random.default_rng([seed, 7919])
    color_order = [colors[i] for i in rng.permutation(len(colors))]
    shape_order = [shapes[i] for i in rng.permutation(len(shapes))]
    return sorted(zip(color_order[:wanted], shape_order[:wanted], strict=False))


def relation(a: SceneObject, b: SceneObject) -> str:
    """Spatial relation of ``a`` to ``b`` from their grid cells (dominant axis wins; ties go vertical)."""
    dcol, drow = a.col - b.col, a.row - b.row
    if abs(dcol) > abs(drow):
        return "left of" if dcol < 0 else "right of"
    return "above" if drow < 0 else "below"


def sample_scene(world: ShapesWorldParams, seed: int, split: str, index: int, held_out: list[tuple[str, str]]) -> dict[str, Any]:
    """The scene of image ``index`` of ``split``: background, objects and pairwise relations."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    size_px = world.image_size
    cell = size_px / GRID
    pairs = [(c, s) for c in world.colors for s in world.shapes]
    if split == "train":
        pairs = [p for p in pairs if p not in set(held_out)]
    n = int(rng.integers(world.min_objects, world.max_objects + 1))
    chosen_pairs = [pairs[i] for i in rng.choice(len(pairs), size=n, replace=False)]
    cells = rng.choice(GRID * GRID, size=n, replace=False)
    size_names = list(world.sizes)
    objects = []
    for (color, shape), cell_id in zip(chosen_pairs, cells, strict=False):
        size = size_names[int(rng.integers(len(size_names)))]
        radius = world.sizes[size] * cell / 2
        row, col = divmod(int(cell_id), GRID)
        slack = max(cell / 2 - radius, 0.0)  # jitter that keeps the object inside its cell
        cx = (col + 0.5) * cell + rng.uniform(-slack, slack)
        cy = (row + 0.5) * cell + rng.uniform(-slack, slack)
        objects.append(SceneObject(color, shape, size, row, col, float(cx), float(cy), float(radius)))
    backgrounds = list(world.backgrounds)
    background = backgrounds[int(rng.integers(len(backgrounds)))]
    relations = [
        {"subject": i, "relation": relation(objects[i], objects[j]), "object": j}
        for i in range(n)
        for j in range(i + 1, n)
    ]
    return {"background": background, "objects": objects, "relations": relations, "rng": rng}


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    def ring(k: int, radius: float, phase: float) -> list[tuple[float, float]]:
        return [(cx + radius * math.cos(phase + 2 * math.pi * i / k), cy + radius * math.sin(phase + 2 * math.pi * i / k)) for i in range(k)]

    if shape == "square":
        h = r * 0.85  # similar area to the circle, so size does not leak the shape
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape == "triangle":
        return ring(3, r, -math.pi / 2)
    if shape == "diamond":
        return ring(4, r, -math.pi / 2)
    if shape == "hexagon":
        return ring(6, r, 0.0)
    if shape == "star":
        outer, inner = ring(5, r, -math.pi / 2), ring(5, r * 0.45, -math.pi / 2 + math.pi / 5)
        return [p for pair in zip(outer, inner, strict=False) for p in pair]
    if shape == "cross":
        t = r * 0.36  # half the arm thickness
        return [
            (cx - t, cy - r), (cx + t, cy - r), (cx + t, cy - t), (cx + r, cy - t), (cx + r, cy + t), (cx + t, cy + t),
            (cx + t, cy + r), (cx - t, cy + r), (cx - t, cy + t), (cx - r, cy + t), (cx - r, cy - t), (cx - t, cy - t),
        ]
    raise ValueError(f"unknown shape {shape!r}")


def render(world: ShapesWorldParams, scene: dict[str, Any]) -> Image.Image:
    """Draw the scene as an RGB image of ``world.image_size`` pixels."""
    big = world.image_size * SUPERSAMPLE
    img = Image.new("RGB", (big, big), tuple(world.backgrounds[scene["background"]]))
    draw = ImageDraw.Draw(img)
    for obj in scene["objects"]:
        fill = tuple(world.colors[obj.color])
        cx, cy, r = obj.cx * SUPERSAMPLE, obj.cy * SUPERSAMPLE, obj.radius * SUPERSAMPLE
        if obj.shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        else:
            draw.polygon(_polygon(obj.shape, cx, cy, r), fill=fill)
    return img.resize((world.image_size, world.image_size), Image.Resampling.LANCZOS)


def _pick(rng: np.random.Generator, options) -> str:
    return options[int(rng.integers(len(options)))]


def describe(scene: dict[str, Any]) -> dict[str, str]:
    """DreamLIP-style caption fields: ``long`` (every object, relation and the background), ``short``
    (one sentence) and ``raw`` (noisy alt-text), in the world's grammar (:mod:`shapesworld_grammar`)."""
    rng: np.random.Generator = scene["rng"]
    objects: list[SceneObject] = scene["objects"]
    background = scene["background"]
    mentions = [grammar.Mention(shape=o.shape, color=o.color, size=o.size) for o in objects]
    count_template = int(rng.integers(len(grammar.COUNT_SENTENCES)))
    prefixes = [_pick(rng, grammar.OBJECT_PREFIXES) for _ in objects]
    relations = [(r["subject"], r["relation"], r["object"]) for r in scene["relations"]]
    long = grammar.long_caption(count_template, background, mentions, prefixes, relations)
    short = grammar.short_caption(mentions, background, relation(objects[0], objects[1]) if len(objects) > 1 else None)
    style = int(rng.integers(3))
    if style == 0:  # shuffled bag of words, as scraped alt-text often is
        raw = grammar.raw_caption(0, mentions, order=list(rng.permutation(2 * len(objects))))
    elif style == 1:
        raw = grammar.raw_caption(1, mentions, suffix=_pick(rng, grammar.RAW_SUFFIXES))
    else:
        raw = grammar.raw_caption(2, mentions, number=int(rng.integers(10000)))
    return {"long": long, "short": short, "raw": raw}


def scene_metadata(scene: dict[str, Any], held_out: list[tuple[str, str]]) -> dict[str, Any]:
    """JSON-able scene: objects with pixel bounding boxes, relations, true phrases, held-out flag."""
    held = set(held_out)
    objects = []
    for o in scene["objects"]:
        objects.append({
            "color": o.color, "shape": o.shape, "size": o.size, "row": o.row, "col": o.col,
            "bbox": [round(o.cx - o.radius, 2), round(o.cy - o.radius, 2), round(2 * o.radius, 2), round(2 * o.radius, 2)],
        })
    return {
        "background": scene["background"],
        "objects": objects,
        "relations": scene["relations"],
        "object_phrases": [o.phrase for o in scene["objects"]],
        "has_held_out_pair": any((o.color, o.shape) in held for o in scene["objects"]),
    }


def make_sample(world: ShapesWorldParams, seed: int, split: str, index: int, held_out: list[tuple[str, str]]) -> tuple[bytes, dict[str, str], dict[str, Any]]:
    """One sample: (JPEG bytes, caption fields, scene metadata). Pure function of its arguments."""
    scene = sample_scene(world, seed, split, index, held_out)
    buf = io.BytesIO()
    render(world, scene).save(buf, format="JPEG", quality=world.jpeg_quality)
    captions = describe(scene)
    return buf.getvalue(), captions, scene_metadata(scene, held_out)
