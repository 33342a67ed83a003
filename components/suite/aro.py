"""ARO's benchmarks (Yuksekgonul et al., ICLR 2023) in their official file formats, scored by the
official rules (docs/architecture.md "Tie rules"): VG-Relation and VG-Attribution (each image cropped to
its box; macro accuracy without the symmetric relations and the attribute pairs under 25 items) and the
COCO/Flickr order benchmarks (each caption against ARO's four shuffles of it, every option cleaned as
ARO cleans it). Readers return :class:`components.suite.formats.Task` like the others.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from components.suite import metrics
from components.suite.formats import (
    BenchmarkError,
    ImageRef,
    Task,
    _add_row,
    _box,
    _field,
    _held,
    _Index,
    _nonempty,
    _outcomes,
    _pair_scores,
    _read_json,
    read_karpathy,
)
from components.suite.items import Layout

# ARO's official VG figures (the authors' notebook "Replicate ARO! VG-Relation, VG-Attribution", in
# mertyg/vision-language-models-are-bows) leave out these relations of VG-Relation, whose two objects can be
# swapped without making the caption false, and VG-Attribution's attribute pairs with fewer than 25 items.
ARO_SYMMETRIC_RELATIONS = frozenset({
    "adjusting", "attached to", "between", "bigger than", "biting", "boarding", "brushing", "chewing", "cleaning",
    "climbing", "close to", "coming from", "coming out of", "contain", "crossing", "dragging", "draped over",
    "drinking", "drinking from", "driving", "driving down", "driving on", "eating from", "eating in", "enclosing",
    "exiting", "facing", "filled with", "floating in", "floating on", "flying", "flying above", "flying in",
    "flying over", "flying through", "full of", "going down", "going into", "going through", "grazing in",
    "growing in", "growing on", "guiding", "hanging from", "hanging in", "hanging off", "hanging over",
    "higher than", "holding onto", "hugging", "in between", "jumping off", "jumping on", "jumping over", "kept in",
    "larger than", "leading", "leaning over", "leaving", "licking", "longer than", "looking in", "looking into",
    "looking out", "looking over", "looking through", "lying next to", "lying on top of", "making", "mixed with",
    "mounted on", "moving", "on the back of", "on the edge of", "on the front of", "on the other side of",
    "opening", "painted on", "parked at", "parked beside", "parked by", "parked in", "parked in front of",
    "parked near", "parked next to", "perched on", "petting", "piled on", "playing", "playing in", "playing on",
    "playing with", "pouring", "reaching for", "reading", "reflected on", "riding on", "running in", "running on",
    "running through", "seen through", "sitting behind", "sitting beside", "sitting by", "sitting in front of",
    "sitting near", "sitting next to", "sitting under", "skiing down", "skiing on", "sleeping in", "sleeping on",
    "smiling at", "sniffing", "splashing", "sprinkled on", "stacked on", "standing against", "standing around",
    "standing behind", "standing beside", "standing in front of", "standing near", "standing next to", "staring at",
    "stuck in", "surrounding", "swimming in", "swinging", "talking to", "topped with", "touching", "traveling down",
    "traveling on", "tying", "typing on", "underneath", "wading in", "waiting for", "walking across", "walking by",
    "walking down", "walking next to", "walking through", "working in", "working on", "worn on", "wrapped around",
    "wrapped in", "by", "of", "near", "next to", "with", "beside", "on the side of", "around",
})
ARO_MIN_ATTRIBUTE_ITEMS = 25


def aro_vg(path: Path, image_root: Path, name: str, kind: str) -> Task:
    """ARO VG-Relation (``kind="relation"``, grouped by relation_name) or VG-Attribution (grouped by the
    attribute pair): each image cropped to its bbox; ``macro_acc`` is ARO's official figure (symmetric
    relations, and attribute pairs with fewer than 25 items, left out), ``macro_acc_all_groups`` every group.
    A tie counts as wrong (ARO's argmax has the false caption first)."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise BenchmarkError(f"{path}: expected a JSON list of items, got {type(data).__name__}")
    idx, img, pos, neg, groups = _Index(), [], [], [], []
    layout = Layout([], [], [], [], [], group=groups, aggregation="macro")
    for n, item in enumerate(data):
        where = str(n)
        box = _box(path, where, item, required=True)
        ref = ImageRef(image_root / _field(path, where, item, "image_path"), box)
        texts = [_field(path, where, item, "true_caption"), _field(path, where, item, "false_caption")]
        img.append(idx.image(ref))
        pos.append(idx.text(texts[0]))
        neg.append(idx.text(texts[1]))
        if kind == "relation":
            groups.append(_field(path, where, item, "relation_name"))
        else:
            groups.append("_".join(str(a) for a in _field(path, where, item, "attributes", list)))
        _add_row(layout, where, [ref], texts, ("true_caption", "false_caption"), _held(item))
    _nonempty(path, len(img))
    sizes = Counter(groups)
    if kind == "relation":
        counted = {g for g in sizes if g not in ARO_SYMMETRIC_RELATIONS}
        why = "every relation is one ARO leaves out as symmetric"
    else:
        counted = {g for g, k in sizes.items() if k >= ARO_MIN_ATTRIBUTE_ITEMS}
        why = f"no attribute pair has {ARO_MIN_ATTRIBUTE_ITEMS} items, the fewest ARO's figure counts"
    headline = "macro_acc"
    if not counted:  # a small file (ShapesWorld's suite of a few images): say so, and headline every group's mean
        headline = "macro_acc_all_groups"
        print(f"evaluate: {path}: {why}; its headline is macro_acc_all_groups, not ARO's official figure", file=sys.stderr)
    layout.counted = frozenset(counted)
    i, p, q = torch.tensor(img), torch.tensor(pos), torch.tensor(neg)

    def score(I, T):
        true, false = _pair_scores(I, T, i, p), _pair_scores(I, T, i, q)
        # per item, right or wrong; the macro figures are aggregated over groups from these rows (items.aggregate)
        return _outcomes(["s(image, true_caption)", "s(image, false_caption)"], [true, false],
                         {"micro_acc": metrics.pairwise_items(true, false)}, "micro_acc")

    return Task(name, "compositional", headline, list(idx.images), list(idx.texts), len(img), score, layout, str(path))


NOUN_TAGS = {"NN", "NNS", "NNP", "NNPS"}
ADJ_TAGS = {"JJ", "JJR", "JJS"}
ARO_ORDER_MAX_WORDS = 30  # ARO's order datasets cut every option to 30 words


def aro_pre_caption(text: str, max_words: int = ARO_ORDER_MAX_WORDS) -> str:
    """ARO's text clean-up of every order option, the true caption included: lower case, the characters
    . ! " ( ) * # : ; ~ turned into spaces, runs of spaces made one, cut to ``max_words`` words."""
    text = " ".join(text.lower().translate(str.maketrans({c: " " for c in '.!"()*#:;~'})).split())
    return " ".join(text.split(" ")[:max_words])


def trigrams(tokens: list[str]) -> list[list[str]]:
    """Consecutive groups of three tokens (the last may be shorter), as ARO groups them."""
    return [tokens[k:k + 3] for k in range(0, len(tokens), 3)]


def order_perturbations(caption: str, doc, np_rng: np.random.RandomState, py_rng: random.Random) -> list[str]:
    """ARO's four perturbations of a caption, drawn as ARO's TextShuffler draws them (dataset_zoo/perturbations.py):

    1. nouns shuffled among the noun slots, then adjectives among the adjective slots (spaCy tokens and Penn tags,
       ``doc``; NumPy's generator, one ``permutation`` each);
    2. every token that is neither shuffled among the rest (NumPy's generator);
    3. the words shuffled within each trigram (NLTK's ``word_tokenize``; Python's generator, one ``shuffle`` per
       trigram);
    4. the trigrams shuffled (NLTK's tokens; Python's generator).

    With ``np_rng`` and ``py_rng`` seeded as ARO seeds NumPy's and Python's global generators, and the captions taken
    in ARO's order, the draws are ARO's. NLTK splits with ``preserve_line=True`` (no sentence split first, which
    would need NLTK's downloaded punkt model): the same tokens for a caption of one sentence. A draw may leave the
    caption unchanged (a short caption): ARO keeps it, and the tie rule decides."""
    from nltk.tokenize import word_tokenize

    tokens = np.array([t.text for t in doc])
    tags = [t.tag_ for t in doc]
    nouns = [k for k, tag in enumerate(tags) if tag in NOUN_TAGS]
    adjectives = [k for k, tag in enumerate(tags) if tag in ADJ_TAGS]
    first = tokens.copy()
    first[nouns] = np_rng.permutation(first[nouns])
    first[adjectives] = np_rng.permutation(first[adjectives])
    second = tokens.copy()
    rest = np.ones(len(tokens), dtype=bool)
    rest[nouns + adjectives] = False
    second[rest] = np_rng.permutation(second[rest])
    words = word_tokenize(caption, preserve_line=True)
    within = trigrams(words)
    for trigram in within:
        py_rng.shuffle(trigram)
    across = trigrams(words)
    py_rng.shuffle(across)
    return [" ".join(first), " ".join(second), " ".join(" ".join(t) for t in within), " ".join(" ".join(t) for t in across)]


def aro_order(path: Path, image_root: Path, name: str, split: str, per_image: int | None, nlp, seed: int) -> Task:
    """ARO COCO/Flickr order: each caption against its four shuffles (:func:`order_perturbations`, with generators
    seeded by ``seed`` for this file), every option cleaned as ARO cleans it (:func:`aro_pre_caption`); ``per_image``
    captions of each image (0 or None: every caption, as ARO). ``p_at_1`` the official precision@1 (a tie with a
    shuffle counts as right: ARO's argmax has the true caption first), ``p_at_1_ties_wrong`` the strict count."""
    rows = read_karpathy(path, split, strip=False)  # ARO shuffles the caption as written: spaces are tokens too
    idx, img, true, shuffled = _Index(), [], [], []
    layout = Layout([], [], [], [], [])
    chosen = [(p, c, h) for p, caps, h in rows for c in (caps[:per_image] if per_image else caps)]
    np_rng, py_rng = np.random.RandomState(seed), random.Random(seed)
    for n, ((image, caption, flag), doc) in enumerate(zip(chosen, nlp.pipe([c for _, c, _ in chosen], batch_size=256), strict=True)):
        ref = ImageRef(image_root / image)
        options = [aro_pre_caption(caption)] + [aro_pre_caption(s) for s in order_perturbations(caption, doc, np_rng, py_rng)]
        img.append(idx.image(ref))
        true.append(idx.text(options[0]))
        shuffled.append([idx.text(s) for s in options[1:]])
        _add_row(layout, str(n), [ref], options, ORDER_ROLES, flag)
    _nonempty(path, len(img))
    i, t, s = torch.tensor(img), torch.tensor(true), torch.tensor(shuffled)

    def score(I, T):
        true_scores, shuffled_scores = _pair_scores(I, T, i, t), (I[i][:, None, :] * T[s]).sum(-1)
        outcomes = {"p_at_1": metrics.order_items(true_scores, shuffled_scores),
                    "p_at_1_ties_wrong": metrics.order_items(true_scores, shuffled_scores, ties_count_right=False)}
        return _outcomes([f"s(image, {role})" for role in ORDER_ROLES], [true_scores, *shuffled_scores.T], outcomes, "p_at_1")

    return Task(name, "compositional", "p_at_1", list(idx.images), list(idx.texts), len(img), score, layout, str(path))


ORDER_ROLES = ("caption", "nouns_and_adjectives_shuffled", "all_but_nouns_and_adjectives_shuffled", "within_trigrams_shuffled",
               "trigrams_shuffled")
