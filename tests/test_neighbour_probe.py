"""The neighbour probe: how it names a neighbour's composition, and that it counts a run's table over crowded scenes."""

import json

import pytest
from conftest import tiny_training_data

from components.data.shard_index import KeyIndex
from components.study import neighbour_probe as probe

RED_CIRCLE, BLUE_SQUARE = {"color": "red", "shape": "circle"}, {"color": "blue", "shape": "square"}
RED_SQUARE, BLUE_CIRCLE = {"color": "red", "shape": "square"}, {"color": "blue", "shape": "circle"}
GREEN_CROSS = {"color": "green", "shape": "cross"}


@pytest.mark.parametrize(("neighbour", "kind"), [
    ([BLUE_SQUARE, RED_CIRCLE], "same_objects"),       # order and place do not matter
    ([RED_SQUARE, BLUE_CIRCLE], "rebound"),            # same colours, same shapes, bound the other way
    ([RED_CIRCLE, GREEN_CROSS], "shares_an_object"),
    ([GREEN_CROSS, RED_SQUARE], "other"),              # a shared colour alone is not a shared object
    ([RED_CIRCLE, BLUE_SQUARE, GREEN_CROSS], "shares_an_object"),  # one more object is not the same scene
])
def test_a_neighbour_is_named_by_the_objects_it_shares(neighbour, kind):
    assert probe.composition([RED_CIRCLE, BLUE_SQUARE], neighbour) == kind


def test_the_shares_count_every_neighbour_of_every_crowded_scene_and_only_those(tmp_path):
    root = tiny_training_data(tmp_path, test_images=8)
    shards = sorted(str(p) for p in (root / "captions" / "train").glob("*.tar"))
    objects = probe.scene_objects(KeyIndex(shards))
    crowded = [key for key, objs in objects.items() if len(objs) > 1]
    single = [key for key, objs in objects.items() if len(objs) == 1]
    assert len(crowded) >= 2 and single
    # each crowded scene's neighbours: itself (same objects) and a one-object scene; a one-object anchor is left out
    table = {key: [key, single[0]] for key in crowded} | {single[0]: [crowded[0]]}
    path = tmp_path / "neighbours.json"
    path.write_text(json.dumps({"neighbours": table}))
    result = probe.run(shards, 2, None, path)
    assert result["crowded_scenes"] == len(crowded) and result["pairs"] == 2 * len(crowded) and result["k"] == 2
    assert result["shares"]["same_objects"] == 0.5
    assert result["shares"]["shares_an_object"] + result["shares"]["other"] == 0.5

    path.write_text(json.dumps({"neighbours": {crowded[0]: ["no-such-key"]}}))
    assert probe.main(["--neighbours", str(path), "--train-shards", str(root / "captions" / "train" / "*.tar")]) == 2
    assert probe.main(["--train-shards", str(tmp_path / "none" / "*.tar")]) == 2
