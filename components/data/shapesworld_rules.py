"""The exact caption rules of ShapesWorld: what a caption claims, whether a scene makes it true, and the
meaning-preserving paraphrases and meaning-changing negatives derived from it.

A :class:`Description` is a list of object mentions (shape, optionally color and size), at most one
spatial relation between the first two mentions, and optionally the background. Its truth in a scene is
decided by brute force: some assignment of distinct scene objects to the mentions satisfies every
attribute and the relation (scenes hold at most 9 objects, benchmark captions at most 3 mentions). Every
benchmark item the benchmarks stage writes — and every hard positive / negative a training method takes
from here — is checked with :func:`holds`, so a "negative" is never accidentally true and a
"paraphrase" never changes the meaning.

Pure Python on scene metadata (the dicts :func:`components.data.shapesworld.scene_metadata` writes), no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import permutations
from typing import Any

import numpy as np

from components.data import shapesworld_grammar as grammar
from components.data.shapesworld_grammar import INVERSE_RELATION, RELATION_SYNONYMS, RELATIONS, SIZE_SYNONYMS, Description, Mention  # noqa: F401

SIZE_TO_SYNONYM = {v: k for k, v in SIZE_SYNONYMS.items()}
RELATION_TO_SYNONYM = {v: k for k, v in RELATION_SYNONYMS.items()}


def relation_of(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Relation of object ``a`` to ``b`` from their grid cells (the rule of :func:`shapesworld.relation`)."""
    dcol, drow = a["col"] - b["col"], a["row"] - b["row"]
    if abs(dcol) > abs(drow):
        return "left of" if dcol < 0 else "right of"
    return "above" if drow < 0 else "below"


def holds(desc: Description, objects: list[dict[str, Any]], background: str | None = None) -> bool:
    """True iff some assignment of distinct ``objects`` to the mentions makes every claim true."""
    if desc.background is not None and desc.background != background:
        return False
    for chosen in permutations(range(len(objects)), len(desc.mentions)):
        if not all(m.matches(objects[i]) for m, i in zip(desc.mentions, chosen, strict=False)):
            continue
        if desc.relation is None or relation_of(objects[chosen[0]], objects[chosen[1]]) == RELATION_SYNONYMS.get(desc.relation, desc.relation):
            return True
    return False


def caption_holds(caption: grammar.ShapesCaption, meta: dict[str, Any]) -> bool:
    """Every claim of a parsed caption true of the scene (verbatim sentences are the original caption's, true by
    construction)."""
    return all(holds(c, meta["objects"], meta.get("background")) for c in caption.claims())


def full_mention(obj: dict[str, Any]) -> Mention:
    return Mention(shape=obj["shape"], color=obj["color"], size=obj["size"])


def describe_pair(objects: list[dict[str, Any]], i: int, j: int) -> Description:
    """Object ``i`` related to object ``j``, both with size and color: "A large red circle left of a small blue square."."""
    return Description((full_mention(objects[i]), full_mention(objects[j])), relation=relation_of(objects[i], objects[j]))


def describe_scene(meta: dict[str, Any], rng: np.random.Generator) -> Description:
    """A true description of a scene: a random ordered pair and its relation, or the single object on its background."""
    objects = meta["objects"]
    if len(objects) == 1:
        return Description((full_mention(objects[0]),), background=meta["background"])
    i, j = (int(k) for k in rng.choice(len(objects), size=2, replace=False))
    return describe_pair(objects, i, j)


ROWS, COLUMNS = ("top", "middle", "bottom"), ("left", "center", "right")


def place(obj: dict[str, Any]) -> str:
    """Where an object's grid cell is: "the top left", "the center", "the bottom middle"."""
    row, col = ROWS[obj["row"]], COLUMNS[obj["col"]]
    if row == "middle":
        return "the center" if col == "center" else f"the middle {col}"
    return f"the {row} {'middle' if col == 'center' else col}"


def dense_description(meta: dict[str, Any]) -> str:
    """The world's long caption in one fixed wording: the count sentence, every object (size, color, shape) and every
    pairwise relation — what a perfect captioner would write (the recaption stage's ShapesWorld oracle)."""
    objects = meta["objects"]
    relations = [(r["subject"], r["relation"], r["object"]) for r in meta.get("relations", [])]
    return grammar.long_caption(0, meta["background"], [full_mention(o) for o in objects],
                                [grammar.OBJECT_PREFIXES[0]] * len(objects), relations)


def long_description(meta: dict[str, Any]) -> str:
    """A DOCCI-style long description: the dense description followed by each object's place in the image — every
    fact of the scene, in several sentences."""
    places = " ".join(f"The {o['color']} {o['shape']} is in {place(o)} of the image." for o in meta["objects"])
    return f"{dense_description(meta)} {places}"


# --------------------------------------------------------------------------------------------------
# meaning-preserving: hard positives
# --------------------------------------------------------------------------------------------------


def paraphrase(desc: Description) -> Description:
    """The same claims in other words: "X left of Y" → "Y right of X" when there is a relation, else
    "X." ↔ "There is X." (only words the world's training captions use)."""
    if desc.relation is not None:
        m = list(desc.mentions)
        m[0], m[1] = m[1], m[0]
        return replace(desc, mentions=tuple(m), relation=INVERSE_RELATION[desc.relation])
    return replace(desc, form="plain" if desc.form == "there" else "there")


def synonym_paraphrase(desc: Description, part: str) -> Description | None:
    """The same claims with synonyms: every size word (``part="size"``: large → big) or the relation
    (``part="relation"``: left of → to the left of); None when the caption has no such word."""
    if part == "size":
        if not any(m.size in SIZE_TO_SYNONYM for m in desc.mentions):
            return None
        return replace(desc, mentions=tuple(replace(m, size=SIZE_TO_SYNONYM.get(m.size, m.size)) for m in desc.mentions))
    if part == "relation":
        return None if desc.relation not in RELATION_TO_SYNONYM else replace(desc, relation=RELATION_TO_SYNONYM[desc.relation])
    raise ValueError(f"unknown part {part!r}")


# --------------------------------------------------------------------------------------------------
# meaning-changing: hard negatives (SugarCrepe's kinds). Each returns None when the kind does not apply.
# --------------------------------------------------------------------------------------------------


def _first_false(candidates: list[Description], objects, background) -> Description | None:
    for cand in candidates:
        if not holds(cand, objects, background):
            return cand
    return None


def _with(desc: Description, k: int, **changes) -> Description:
    m = list(desc.mentions)
    m[k] = replace(m[k], **changes)
    return replace(desc, mentions=tuple(m))


def swap_attribute(desc, meta, rng, attribute: str = "color") -> Description | None:
    """Swap the colors (or shapes, ``attribute="shape"``) of the first two mentions."""
    if len(desc.mentions) < 2:
        return None
    a, b = desc.mentions[0], desc.mentions[1]
    va, vb = getattr(a, attribute), getattr(b, attribute)
    if va is None or vb is None or va == vb:
        return None
    swapped = _with(_with(desc, 0, **{attribute: vb}), 1, **{attribute: va})
    return _first_false([swapped], meta["objects"], meta["background"])


def replace_attribute(desc, meta, rng, vocabulary: list[str], attribute: str = "color") -> Description | None:
    """Replace one mention's color (or shape) by another of the world's that makes the caption false."""
    ks = [k for k, m in enumerate(desc.mentions) if getattr(m, attribute) is not None]
    if not ks:
        return None
    k = ks[int(rng.integers(len(ks)))]
    current = getattr(desc.mentions[k], attribute)
    options = [v for v in vocabulary if v != current]
    options = [options[i] for i in rng.permutation(len(options))]
    return _first_false([_with(desc, k, **{attribute: v}) for v in options], meta["objects"], meta["background"])


def replace_relation(desc, meta, rng) -> Description | None:
    if desc.relation is None:
        return None
    options = [r for r in RELATIONS if r != desc.relation]
    options = [options[i] for i in rng.permutation(len(options))]
    return _first_false([replace(desc, relation=r) for r in options], meta["objects"], meta["background"])


def drop_color(desc: Description, rng) -> tuple[Description, int] | None:
    """The caption with one mention's color left out (still true), and which mention: add_att's positive."""
    ks = [k for k, m in enumerate(desc.mentions) if m.color is not None]
    if not ks:
        return None
    k = ks[int(rng.integers(len(ks)))]
    return _with(desc, k, color=None), k


def add_attribute(desc, meta, rng, colors: list[str]) -> tuple[Description, Description] | None:
    """(positive, negative): a mention without a color, then the same with a wrong color added."""
    dropped = drop_color(desc, rng)
    if dropped is None:
        return None
    positive, k = dropped
    options = [colors[i] for i in rng.permutation(len(colors))]
    negative = _first_false([_with(positive, k, color=c) for c in options], meta["objects"], meta["background"])
    return None if negative is None else (positive, negative)


def add_object(desc, meta, rng, colors: list[str], shapes: list[str], sizes: list[str]) -> Description | None:
    """The caption plus a mention of an object the image does not hold."""
    present = {(o["color"], o["shape"]) for o in meta["objects"]}
    absent = [(c, s) for c in colors for s in shapes if (c, s) not in present]
    if not absent:
        return None
    color, shape = absent[int(rng.integers(len(absent)))]
    size = sizes[int(rng.integers(len(sizes)))]
    added = replace(desc, mentions=desc.mentions + (Mention(shape, color, size),))
    return _first_false([added], meta["objects"], meta["background"])


# --------------------------------------------------------------------------------------------------
# ARO-style: a relation and an attribute binding read both ways
# --------------------------------------------------------------------------------------------------


def definite(m: Mention) -> str:
    return f"the {m.words()}"


def aro_relation(objects: list[dict[str, Any]], i: int, j: int) -> tuple[str, str, str]:
    """(true, false, relation): "the red circle is left of the blue square" and the subject and object swapped."""
    a, b = Mention(objects[i]["shape"], objects[i]["color"]), Mention(objects[j]["shape"], objects[j]["color"])
    rel = relation_of(objects[i], objects[j])
    true = Description((a, b), relation=rel)
    false = Description((b, a), relation=rel)
    assert holds(true, objects) and not holds(false, objects), (objects, i, j)
    return f"{definite(a)} is {rel} {definite(b)}", f"{definite(b)} is {rel} {definite(a)}", rel


def aro_attribution(objects: list[dict[str, Any]], i: int, j: int) -> tuple[str, str, list[str]] | None:
    """(true, false, [color_i, color_j]): "the red circle and the blue square" and the colors swapped."""
    a, b = objects[i], objects[j]
    if a["color"] == b["color"] or a["shape"] == b["shape"]:
        return None
    true = Description((Mention(a["shape"], a["color"]), Mention(b["shape"], b["color"])))
    false = Description((Mention(a["shape"], b["color"]), Mention(b["shape"], a["color"])))
    if holds(false, objects):
        return None
    return (f"{definite(true.mentions[0])} and {definite(true.mentions[1])}",
            f"{definite(false.mentions[0])} and {definite(false.mentions[1])}", [a["color"], b["color"]])


NEGATIVE_KINDS = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")


def negative_for(kind: str, desc: Description, meta: dict[str, Any], rng: np.random.Generator, world) -> tuple[Description, Description] | None:
    """(positive, negative) of one SugarCrepe kind (``NEGATIVE_KINDS``, or ``swap`` = swap_att) for a true
    description of ``meta``'s scene in ``world`` (ShapesWorldParams); None where the kind does not apply."""
    colors, shapes, sizes = list(world.colors), list(world.shapes), list(world.sizes)
    if kind == "add_att":
        return add_attribute(desc, meta, rng, colors)
    if kind in ("swap_att", "swap"):
        neg = swap_attribute(desc, meta, rng, "color")
    elif kind == "swap_obj":
        neg = swap_attribute(desc, meta, rng, "shape")
    elif kind == "replace_att":
        neg = replace_attribute(desc, meta, rng, colors, "color")
    elif kind == "replace_obj":
        neg = replace_attribute(desc, meta, rng, shapes, "shape")
    elif kind == "replace_rel":
        neg = replace_relation(desc, meta, rng)
    elif kind == "add_obj":
        neg = add_object(desc, meta, rng, colors, shapes, sizes)
    else:
        raise ValueError(f"unknown negative kind {kind!r}")
    return None if neg is None else (desc, neg)
