"""Hard negatives and hard positives of a training caption, for the hard-negative methods (NegCLIP,
hard positives + negatives). Groundwork of the sibling-methods issue; the train stage does not use it yet.

- ShapesWorld: exact, from the sample's scene (:mod:`components.shapesworld_rules`): a true description
  of the scene, its meaning-changing negatives (each checked false) and its meaning-preserving
  paraphrases (each checked true).
- Real captions: spaCy rules on the parsed caption. Negatives swap the adjectives or the head nouns of two
  noun phrases, or replace a spatial word by its opposite; positives swap the two conjuncts of "X and Y"
  or replace a word by a synonym. Rules cannot check meaning on real text: they are written so that the
  change is a binding or relation change (negatives) or a reordering / synonym (positives), no more.

Pure functions of (caption or scene, rng); no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from components import shapesworld_rules as rules

# ----------------------------------------------------------------------------------------------------
# ShapesWorld: exact
# ----------------------------------------------------------------------------------------------------

SWAP_AND_REPLACE = ("swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel")


def shapesworld_negative_descriptions(meta: dict[str, Any], rng: np.random.Generator, world,
                                     kinds=SWAP_AND_REPLACE) -> tuple[rules.Description, list[rules.Description]]:
    """(a true description of the scene, its negatives: one per kind that applies, each false of the scene)."""
    desc = rules.describe_scene(meta, rng)
    negatives = []
    for kind in kinds:
        pair = rules.negative_for(kind, desc, meta, rng, world)
        if pair is not None:
            negatives.append(pair[1])
    return desc, negatives


def shapesworld_negatives(meta: dict[str, Any], rng: np.random.Generator, world, kinds=SWAP_AND_REPLACE) -> tuple[str, list[str]]:
    """The same as texts."""
    desc, negatives = shapesworld_negative_descriptions(meta, rng, world, kinds)
    return desc.text(), [n.text() for n in negatives]


def shapesworld_hard_positive(meta: dict[str, Any], rng: np.random.Generator) -> tuple[str, str]:
    """(a true caption of the scene, a paraphrase with the same truth in every scene)."""
    desc = rules.describe_scene(meta, rng)
    options = [p for p in (rules.paraphrase(desc), rules.synonym_paraphrase(desc, "size"), rules.synonym_paraphrase(desc, "relation")) if p]
    return desc.text(), options[int(rng.integers(len(options)))].text()


# ----------------------------------------------------------------------------------------------------
# real captions: spaCy rules
# ----------------------------------------------------------------------------------------------------

# spatial words and their opposites (a relation replaced by its opposite is false whenever the original is true)
OPPOSITE = {"on": "under", "under": "on", "above": "below", "below": "above", "left": "right", "right": "left",
            "behind": "in front of", "inside": "outside", "outside": "inside", "over": "under", "top": "bottom",
            "bottom": "top", "front": "back", "back": "front"}
SYNONYMS = {"large": "big", "big": "large", "small": "little", "little": "small", "picture": "photo", "photo": "picture",
            "man": "guy", "woman": "lady", "street": "road", "road": "street", "couch": "sofa", "sofa": "couch"}


def _rebuild(doc, replacements: dict[int, str]) -> str:
    """The caption with token i's text replaced by ``replacements[i]``, whitespace kept."""
    out = []
    for token in doc:
        text = replacements.get(token.i, token.text)
        if token.i in replacements and token.text[:1].isupper() and token.i == 0:
            text = text[:1].upper() + text[1:]
        out.append(text + token.whitespace_)
    return "".join(out)


def _chunks_with(doc, pos: str) -> list[tuple[Any, Any]]:
    """(noun chunk, its first token of part of speech ``pos``: ADJ for an adjective, the root for a noun)."""
    found = []
    for chunk in doc.noun_chunks:
        if pos == "NOUN" and chunk.root.pos_ == "NOUN":
            found.append((chunk, chunk.root))
        elif pos == "ADJ":
            adjectives = [t for t in chunk if t.pos_ == "ADJ" and t.dep_ in ("amod", "compound")]
            if adjectives:
                found.append((chunk, adjectives[0]))
    return found


def swap_between_phrases(doc, pos: str, rng: np.random.Generator) -> str | None:
    """Swap the adjectives (``pos="ADJ"``) or head nouns (``"NOUN"``) of two noun phrases whose words differ:
    "a red car next to a blue house" → "a blue car next to a red house"."""
    found = _chunks_with(doc, pos)
    # same tag only (NN with NN, NNS with NNS): "two white towels … a black sink" keeps its agreement
    pairs = [(a, b) for i, a in enumerate(found) for b in found[i + 1:] if a[1].lower_ != b[1].lower_ and a[1].tag_ == b[1].tag_]
    if not pairs:
        return None
    (_, x), (_, y) = pairs[int(rng.integers(len(pairs)))]
    return _rebuild(doc, {x.i: y.lower_, y.i: x.lower_})


def replace_relation(doc, rng: np.random.Generator) -> str | None:
    """A spatial word replaced by its opposite: "a cat on a mat" → "a cat under a mat"."""
    candidates = [t for t in doc if t.lower_ in OPPOSITE and t.pos_ in ("ADP", "ADV", "ADJ", "NOUN")]
    if not candidates:
        return None
    token = candidates[int(rng.integers(len(candidates)))]
    return _rebuild(doc, {token.i: OPPOSITE[token.lower_]})


def real_negatives(doc, rng: np.random.Generator) -> list[str]:
    """Every rule that applies, once: attribute swap, object swap, relation replacement."""
    made = [swap_between_phrases(doc, "ADJ", rng), swap_between_phrases(doc, "NOUN", rng), replace_relation(doc, rng)]
    return [m for m in made if m is not None and m != doc.text]


def swap_conjuncts(doc) -> str | None:
    """"a dog and a cat on a sofa" → "a cat and a dog on a sofa": two noun phrases joined by "and"."""
    chunks = list(doc.noun_chunks)
    for a, b in zip(chunks, chunks[1:]):
        if b.start == a.end + 1 and doc[a.end].lower_ == "and":
            first = a.text
            if a.start == 0 and a[0].pos_ != "PROPN":  # capitalised only because it opened the sentence
                first = first[:1].lower() + first[1:]
            text = doc[: a.start].text_with_ws + b.text + " and " + first + doc[b.end - 1].whitespace_ + doc[b.end:].text_with_ws
            return text[:1].upper() + text[1:] if a.start == 0 else text
    return None


def synonym_replace(doc, rng: np.random.Generator) -> str | None:
    candidates = [t for t in doc if t.lower_ in SYNONYMS]
    if not candidates:
        return None
    token = candidates[int(rng.integers(len(candidates)))]
    return _rebuild(doc, {token.i: SYNONYMS[token.lower_]})


def real_positive(doc, rng: np.random.Generator) -> str | None:
    """A reordering where the caption has one, else a synonym; None if neither applies."""
    return swap_conjuncts(doc) or synonym_replace(doc, rng)
