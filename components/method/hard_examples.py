"""Hard negatives and hard positives of a training caption, for the hard-negative methods (NegCLIP,
hard positives + negatives) and CLIC's pair negatives; the batch builders (:mod:`components.method.batches`)
call them.

- ShapesWorld: exact, from the sample's scene (:mod:`components.data.shapesworld_rules`): a true description
  of the scene, its meaning-changing negatives (each checked false) and its meaning-preserving
  paraphrases (each checked true).
- Real captions: spaCy rules on the parsed caption. Negatives swap the adjectives or the head nouns of two
  noun phrases, or replace a spatial word by its opposite; positives swap the two conjuncts of "X and Y"
  or replace a word by a synonym. Rules cannot check meaning on real text: they are written so that the
  change is a binding or relation change (negatives) or a reordering / synonym (positives), no more.

Pure functions of (caption or scene, rng); no I/O.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from components.data import shapesworld_rules as rules
from components.data.shapesworld_grammar import NUMBER_WORDS, ShapesCaption, parse_shapes_caption  # noqa: F401

# ----------------------------------------------------------------------------------------------------
# ShapesWorld: exact
# ----------------------------------------------------------------------------------------------------

SWAP_AND_REPLACE = ("swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel")


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
    for a, b in zip(chunks, chunks[1:], strict=False):
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


# ----------------------------------------------------------------------------------------------------
# ShapesWorld training captions: exact edits of the caption itself (NegCLIP, hard positives + negatives)
# ----------------------------------------------------------------------------------------------------
# A hard negative must differ from the caption it is paired with by a small edit (a bag-of-words model
# cannot tell them apart); a fresh description would be an easy negative. So the sample's own long or short
# caption is read into its claims, one claim edited, and the result checked against the scene.

def caption_negatives(caption: ShapesCaption, meta: dict[str, Any], rng: np.random.Generator,
                      vocabulary: list[tuple[str, str]], kinds=SWAP_AND_REPLACE) -> dict[str, ShapesCaption]:
    """Per kind that applies, one edit of the caption that is false of the scene (tried in random order):
    swap_att / swap_obj swap the colors / shapes of two named objects everywhere they are named,
    replace_att / replace_obj give one named object another color / shape, replace_rel inverts a relation.
    A new (color, shape) an edit names must be in ``vocabulary``: the train stage passes the pairs its batch
    shows, so a negative never names a held-out pair (a swap could otherwise make one)."""
    out = {}
    pairs = caption.pairs()
    allowed = set(vocabulary)
    for kind in kinds:
        candidates: list[ShapesCaption] = []
        if kind in ("swap_att", "swap_obj"):
            for i, (ca, sa) in enumerate(pairs):
                for cb, sb in pairs[i + 1:]:
                    if kind == "swap_att" and ca != cb:
                        candidates.append(caption.recolor({(ca, sa): (cb, sa), (cb, sb): (ca, sb)}))
                    if kind == "swap_obj" and sa != sb:
                        candidates.append(caption.recolor({(ca, sa): (ca, sb), (cb, sb): (cb, sa)}))
        elif kind in ("replace_att", "replace_obj"):
            for c, s in pairs:
                options = sorted(p for p in allowed if (p[1] == s) != (p[0] == c) and (p[1] == s) == (kind == "replace_att"))
                candidates += [caption.recolor({(c, s): new}) for new in options if new not in pairs]
        elif kind == "replace_rel":
            for k, s in enumerate(caption.sentences):
                if s.kind == "relation":
                    inverse = rules.INVERSE_RELATION[rules.RELATION_SYNONYMS.get(s.relation, s.relation)]
                    edited = list(caption.sentences)
                    edited[k] = replace(s, relation=inverse)
                    candidates.append(ShapesCaption(tuple(edited)))
                elif s.kind == "description" and s.description.relation is not None:
                    d = s.description
                    inverse = rules.INVERSE_RELATION[rules.RELATION_SYNONYMS.get(d.relation, d.relation)]
                    candidates.append(ShapesCaption((replace(s, description=replace(d, relation=inverse)),)))
        else:
            raise ValueError(f"unknown negative kind {kind!r} (one of {', '.join(SWAP_AND_REPLACE)})")
        for k in rng.permutation(len(candidates)):
            if set(candidates[k].pairs()) <= allowed | set(pairs) and not rules.caption_holds(candidates[k], meta):
                out[kind] = candidates[k]
                break
    return out


def caption_positives(caption: ShapesCaption) -> dict[str, ShapesCaption]:
    """Meaning-preserving rewrites that apply: ``reorder`` (the object sentences in reverse order),
    ``invert`` ("the A is left of the B" → "the B is right of the A", every relation), ``synonym`` (every
    size and relation word replaced by the world's synonym: large → big, above → over)."""
    out = {}
    sentences = list(caption.sentences)
    objects = [k for k, s in enumerate(sentences) if s.kind == "object"]
    if len(objects) > 1:
        reordered = list(sentences)
        for k, j in zip(objects, reversed(objects), strict=False):
            reordered[k] = sentences[j]
        out["reorder"] = ShapesCaption(tuple(reordered))
    inverted, synonyms, changed_inv, changed_syn = [], [], False, False
    for s in sentences:
        if s.kind == "relation":
            a, b = s.mentions
            inverted.append(replace(s, mentions=(b, a), relation=rules.INVERSE_RELATION[rules.RELATION_SYNONYMS.get(s.relation, s.relation)]))
            changed_inv = True
        elif s.kind == "description" and s.description.relation is not None:
            inverted.append(replace(s, description=rules.paraphrase(s.description)))
            changed_inv = True
        else:
            inverted.append(s)
        if s.kind == "object" and s.mentions[0].size in rules.SIZE_TO_SYNONYM:
            m = s.mentions[0]
            synonyms.append(replace(s, mentions=(replace(m, size=rules.SIZE_TO_SYNONYM[m.size]),)))
            changed_syn = True
        elif s.kind == "relation" and s.relation in rules.RELATION_TO_SYNONYM:
            synonyms.append(replace(s, relation=rules.RELATION_TO_SYNONYM[s.relation]))
            changed_syn = True
        elif s.kind == "description":
            d = rules.synonym_paraphrase(s.description, "size") or s.description
            d = rules.synonym_paraphrase(d, "relation") or d
            changed_syn |= d != s.description
            synonyms.append(replace(s, description=d))
        else:
            synonyms.append(s)
    if changed_inv:
        out["invert"] = ShapesCaption(tuple(inverted))
    if changed_syn:
        out["synonym"] = ShapesCaption(tuple(synonyms))
    return out


# ----------------------------------------------------------------------------------------------------
# CLIC (arXiv 2505.24424): texts of a concatenated image pair
# ----------------------------------------------------------------------------------------------------

# parts of speech CLIC never swaps
CLIC_EXCLUDED_POS = {"AUX", "DET", "INTJ", "PART", "PUNCT", "SYM", "X", "SCONJ", "CCONJ"}
Token = tuple[int, int, str, str]  # (start, end, text, part of speech) within the sentence


def shapesworld_tokens(sentence: str, meta: dict[str, Any]) -> list[Token]:
    """Words of a ShapesWorld sentence tagged by the world's own word classes (exact, no parser): the object
    count (NUM), the background (BACKGROUND), object colors (COLOR), sizes (SIZE) and shapes (SHAPE) of the
    scene. Words of no class ("picture", "plain") are left out: a swap of them need not change the meaning."""
    classes = {NUMBER_WORDS[len(meta["objects"])]: "NUM", meta.get("background"): "BACKGROUND"}
    for obj in meta["objects"]:
        classes.update({obj["color"]: "COLOR", obj["size"]: "SIZE", obj["shape"]: "SHAPE"})
    return [(m.start(), m.end(), m[0], classes[m[0].lower()]) for m in re.finditer(r"[A-Za-z]+", sentence) if m[0].lower() in classes]


def spacy_tokens(doc) -> list[Token]:
    """A parsed sentence's tokens with spaCy's coarse part of speech."""
    return [(t.idx - doc[0].idx, t.idx - doc[0].idx + len(t.text), t.text, t.pos_) for t in doc]


def clic_negative(first: str, second: str, first_tokens: list[Token], second_tokens: list[Token],
                  rng: np.random.Generator, is_false=None) -> str | None:
    """CLIC's negative of "first second": one word of a part of speech both sentences have (not AUX, DET,
    INTJ, PART, PUNCT, SYM, X, SCONJ, CCONJ) swapped between them; a word that occurs in both sentences is
    never swapped. ``is_false(new_first, new_second)``, where given, keeps only swaps it accepts (ShapesWorld:
    the swapped pair must be false of the composite image). None when no swap qualifies."""
    words_first = {t[2].lower() for t in first_tokens}
    words_second = {t[2].lower() for t in second_tokens}
    options = [(a, b) for a in first_tokens for b in second_tokens
               if a[3] == b[3] and a[3] not in CLIC_EXCLUDED_POS
               and a[2].lower() not in words_second and b[2].lower() not in words_first]
    for k in rng.permutation(len(options)):
        a, b = options[k]
        new_first, new_second = f"{first[:a[0]]}{b[2].lower()}{first[a[1]:]}", f"{second[:b[0]]}{a[2].lower()}{second[b[1]:]}"
        if is_false is None or is_false(new_first, new_second):
            return f"{new_first} {new_second}"
    return None


def shapesworld_sentence_true(sentence: str, meta: dict[str, Any], backgrounds: set[str]) -> bool:
    """Whether one ShapesWorld caption sentence is true of a scene: its object / relation claims (exact), and
    the object count and background it names (``backgrounds``: the background words to recognise)."""
    parsed = parse_shapes_caption(sentence)
    if parsed is not None and not rules.caption_holds(parsed, meta):
        return False
    words = set(re.findall(r"[a-z]+", sentence.lower()))
    counts, named = words & set(NUMBER_WORDS), words & backgrounds
    return counts <= {NUMBER_WORDS[len(meta["objects"])]} and named <= {meta.get("background")}


def shapesworld_pair_negative_is_false(new_first: str, new_second: str, meta_a: dict[str, Any], meta_b: dict[str, Any]) -> bool:
    """A swapped pair caption is false of the composite of scenes a and b iff one of its sentences is true of
    neither half (a count swap between two images on the same background only exchanges two true claims)."""
    backgrounds = {meta_a.get("background"), meta_b.get("background")} - {None}
    return any(not shapesworld_sentence_true(s, meta_a, backgrounds) and not shapesworld_sentence_true(s, meta_b, backgrounds)
               for s in (new_first, new_second))


def clic_positives(first: list[str], second: list[str], rng: np.random.Generator) -> list[str]:
    """The four positives of a pair whose captions have sentences ``first`` and ``second`` (image order):
    p1 = the first sentences in image order, p2 = the same in swapped order, p3 and p4 = one other
    sentence of each (the first when there is no other), in random order."""
    def other(sentences: list[str]) -> str:
        return sentences[1 + int(rng.integers(len(sentences) - 1))] if len(sentences) > 1 else sentences[0]

    p1, p2 = f"{first[0]} {second[0]}", f"{second[0]} {first[0]}"
    extra = []
    for _ in range(2):
        a, b = other(first), other(second)
        extra.append(f"{a} {b}" if rng.random() < 0.5 else f"{b} {a}")
    return [p1, p2, *extra]
