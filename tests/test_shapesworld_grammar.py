"""ShapesWorld's caption grammar both ways: every caption the world writes parses back into claims that
are true of its scene and render to the same text, so a wording change cannot silently turn off the
hard examples of negclip and hp_hn."""

import numpy as np
import pytest

from components.data import shapesworld as sw
from components.data import shapesworld_grammar as grammar
from components.data import shapesworld_rules as rules
from components.method import hard_examples as he
from components.shared.params import ShapesWorldParams


def _samples(world: ShapesWorldParams, n: int):
    held = sw.held_out_pairs(world, 0)
    for index in range(n):
        scene = sw.sample_scene(world, 0, "train", index, held)
        yield sw.scene_metadata(scene, held), sw.describe(scene)


@pytest.mark.parametrize("world", [ShapesWorldParams(), ShapesWorldParams(min_objects=3, max_objects=5)], ids=["default", "crowded"])
def test_every_long_and_short_caption_round_trips_into_true_claims(world):
    for meta, captions in _samples(world, 150):
        for field in ("long", "short"):
            parsed = grammar.parse_shapes_caption(captions[field])
            assert parsed is not None, (field, captions[field])
            assert parsed.text() == captions[field]
            assert rules.caption_holds(parsed, meta), captions[field]
        long = grammar.parse_shapes_caption(captions["long"])
        kinds = [s.kind for s in long.sentences]
        # the count sentence stays verbatim; every object and every relation is a structured claim
        assert kinds == ["text"] + ["object"] * len(meta["objects"]) + ["relation"] * len(meta["relations"])
        assert sorted(long.pairs()) == sorted((o["color"], o["shape"]) for o in meta["objects"])
        assert grammar.parse_description(captions["short"]) is not None
        # the true concepts (the manifest's object_phrases) read back into the scene's objects
        assert [grammar.parse_object_phrase(p) for p in meta["object_phrases"]] == [
            grammar.Mention(shape=o["shape"], color=o["color"], size=o["size"]) for o in meta["objects"]]


def test_raw_alt_text_has_no_claims_to_edit():
    raws = [captions["raw"] for _, captions in _samples(ShapesWorldParams(), 60)]
    assert len({r.split()[-1] for r in raws}) > 3  # the three raw styles all occur
    assert all(grammar.parse_shapes_caption(r) is None for r in raws)


def test_an_edited_claim_renders_in_the_same_grammar_and_is_checked_false():
    meta, captions = next((m, c) for m, c in _samples(ShapesWorldParams(), 50) if len(m["objects"]) >= 2)
    parsed = grammar.parse_shapes_caption(captions["long"])
    vocabulary = sorted({(o["color"], o["shape"]) for o in meta["objects"]})
    negatives = he.caption_negatives(parsed, meta, np.random.default_rng(0), vocabulary)
    assert negatives, captions["long"]
    for kind, negative in negatives.items():
        assert not rules.caption_holds(negative, meta), kind
        again = grammar.parse_shapes_caption(negative.text())  # the edit is still in the world's grammar
        assert again is not None and again.text() == negative.text()


def test_writer_and_reader_share_their_word_lists():
    red = grammar.Mention(shape="circle", color="red", size="large")
    blue = grammar.Mention(shape="square", color="blue", size="small")
    for prefix in grammar.OBJECT_PREFIXES:
        for relation in grammar.RELATIONS:
            text = grammar.long_caption(0, "white", [red, blue], [prefix, prefix], [(0, relation, 1)])
            _, first, second, related = grammar.parse_shapes_caption(text).sentences
            assert (first.kind, first.mentions, second.mentions) == ("object", (red,), (blue,))
            assert related.kind == "relation" and related.relation == relation
    for template in range(len(grammar.COUNT_SENTENCES)):
        text = grammar.count_sentence(template, 2, "white")
        assert grammar.parse_shapes_caption(text) is None  # a count sentence alone claims nothing to edit
