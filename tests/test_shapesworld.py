"""ShapesWorld: deterministic, held-out pairs respected, captions and metadata true to the image."""

import io
import re

import numpy as np
import pytest
from PIL import Image

from components.data import shapesworld as sw
from components.shared.params import ShapesWorldParams

WORLD = ShapesWorldParams()
HELD = sw.held_out_pairs(WORLD, 0)


def test_same_seed_same_bytes_other_seed_other_images():
    a = sw.make_sample(WORLD, 0, "train", 17, HELD)
    b = sw.make_sample(WORLD, 0, "train", 17, HELD)
    c = sw.make_sample(WORLD, 1, "train", 17, HELD)
    assert a == b
    assert a[0] != c[0]


def test_held_out_pairs_share_no_color_or_shape_and_follow_the_fraction():
    assert len(HELD) == 2  # 0.125 of 4 colors x 4 shapes
    assert len({c for c, _ in HELD}) == len(HELD) and len({s for _, s in HELD}) == len(HELD)
    assert sw.held_out_pairs(WORLD.model_copy(update={"held_out_fraction": 0.0}), 0) == []
    assert sw.held_out_pairs(WORLD, 0) == HELD
    assert any(sw.held_out_pairs(WORLD, s) != HELD for s in range(1, 6))


def test_training_split_never_shows_a_held_out_pair_but_test_does():
    train_pairs, test_flags = set(), []
    for i in range(400):
        _, _, meta = sw.make_sample(WORLD, 0, "train", i, HELD)
        train_pairs |= {(o["color"], o["shape"]) for o in meta["objects"]}
        assert not meta["has_held_out_pair"]
    for i in range(400):
        _, _, meta = sw.make_sample(WORLD, 0, "test", i, HELD)
        test_flags.append(meta["has_held_out_pair"])
    assert not train_pairs & set(HELD)
    # every color and every shape is still seen in training: only the combination is new
    assert {c for c, _ in train_pairs} == set(WORLD.colors)
    assert {s for _, s in train_pairs} == set(WORLD.shapes)
    assert 0.05 < np.mean(test_flags) < 0.6


def test_object_counts_and_distinct_pairs():
    counts = set()
    for i in range(200):
        _, _, meta = sw.make_sample(WORLD, 0, "train", i, HELD)
        pairs = [(o["color"], o["shape"]) for o in meta["objects"]]
        assert len(pairs) == len(set(pairs))
        assert len({(o["row"], o["col"]) for o in meta["objects"]}) == len(pairs)
        counts.add(len(pairs))
    assert counts == {1, 2, 3}


def _center(obj):
    x, y, w, h = obj["bbox"]
    return x + w / 2, y + h / 2


def test_relations_match_the_geometry():
    checked = 0
    for i in range(200):
        _, _, meta = sw.make_sample(WORLD, 0, "train", i, HELD)
        objs = meta["objects"]
        for rel in meta["relations"]:
            (ax, ay), (bx, by) = _center(objs[rel["subject"]]), _center(objs[rel["object"]])
            r = rel["relation"]
            assert {"left of": ax < bx, "right of": ax > bx, "above": ay < by, "below": ay > by}[r], (i, rel)
            checked += 1
    assert checked > 100


def test_pixels_at_object_centres_have_the_object_colour():
    for i in range(60):
        jpg, _, meta = sw.make_sample(WORLD, 0, "train", i, HELD)
        img = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB")).astype(int)
        assert img.shape == (64, 64, 3)
        for obj in meta["objects"]:
            cx, cy = _center(obj)
            pixel = img[int(cy), int(cx)]
            assert np.abs(pixel - np.array(WORLD.colors[obj["color"]])).max() < 60, (i, obj, pixel)


def test_captions_describe_every_object_relation_and_the_background():
    for i in range(100):
        _, caps, meta = sw.make_sample(WORLD, 0, "train", i, HELD)
        objs = meta["objects"]
        for phrase in meta["object_phrases"]:
            assert phrase in caps["long"]
        for rel in meta["relations"]:
            a, b = objs[rel["subject"]], objs[rel["object"]]
            sentence = f"the {a['color']} {a['shape']} is {rel['relation']} the {b['color']} {b['shape']}."
            assert sentence in caps["long"].lower()
        assert meta["background"] in caps["long"]
        assert len(re.findall(r"\.", caps["long"])) == 1 + len(objs) + len(meta["relations"])
        # short: exactly one sentence mentioning every object
        assert caps["short"].endswith(".") and caps["short"].count(".") == 1
        for phrase in meta["object_phrases"]:
            assert phrase.removeprefix("a ") in caps["short"].lower()
        assert caps["raw"]


def test_other_vocabularies_render():
    world = ShapesWorldParams(
        shapes=["star", "hexagon", "diamond"], colors={"red": (255, 0, 0), "blue": (0, 0, 255)},
        image_size=96, max_objects=4,
    )
    jpg, caps, meta = sw.make_sample(world, 3, "test", 0, [])
    assert Image.open(io.BytesIO(jpg)).size == (96, 96)
    assert all(o["shape"] in {"star", "hexagon", "diamond"} for o in meta["objects"])


def test_world_that_cannot_hold_distinct_objects_is_rejected():
    with pytest.raises(ValueError, match="fewer \\(color, shape\\) pairs"):
        ShapesWorldParams(colors={"red": (255, 0, 0), "blue": (0, 0, 255)}, shapes=["circle", "square"], max_objects=5)
