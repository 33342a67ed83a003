"""ShapesWorld's exact caption rules and the benchmarks stage that writes the suite from them."""

import json
import re

import numpy as np
import pytest
import yaml
from conftest import tiny_captions

from components import benchmarks as stage
from components.data import shapesworld as sw
from components.data import shapesworld_rules as rules
from components.shared.params import BenchmarksParams, ShapesWorldParams
from components.suite import aro, long_captions
from components.suite import formats as bd
from components.suite import retrieval as retrieval_reader
from components.suite import shapesworld_suite as builder


def obj(color, shape, size, row, col):
    return {"color": color, "shape": shape, "size": size, "row": row, "col": col}


# a large red circle in the top-left cell, a small blue square top-right, a small green cross bottom-left
SCENE = [obj("red", "circle", "large", 0, 0), obj("blue", "square", "small", 0, 2), obj("green", "cross", "small", 2, 0)]
M = rules.Mention


def test_holds_checks_attributes_relations_and_distinct_objects():
    red, blue = M("circle", "red", "large"), M("square", "blue", "small")
    assert rules.holds(rules.Description((red, blue), "left of"), SCENE)
    assert not rules.holds(rules.Description((red, blue), "right of"), SCENE)
    assert not rules.holds(rules.Description((blue, red), "left of"), SCENE)
    assert rules.holds(rules.Description((M("cross", "green"), red), "below"), SCENE)
    assert not rules.holds(rules.Description((M("circle", "blue"),)), SCENE)  # colors bind to their object
    assert not rules.holds(rules.Description((M("circle", "red", "small"),)), SCENE)
    assert rules.holds(rules.Description((M("circle"), M("square"))), SCENE)
    assert not rules.holds(rules.Description((M("circle"), M("circle"))), SCENE)  # two mentions, two objects
    assert rules.holds(rules.Description((red,), background="white"), SCENE, "white")
    assert not rules.holds(rules.Description((red,), background="black"), SCENE, "white")


def test_caption_text_and_paraphrases():
    red, blue = M("circle", "red", "large"), M("square", "blue", "small")
    desc = rules.Description((red, blue), "left of")
    assert desc.text() == "A large red circle left of a small blue square."
    assert rules.paraphrase(desc).text() == "A small blue square right of a large red circle."
    single = rules.Description((red,), background="white")
    assert rules.paraphrase(single).text() == "There is a large red circle on a white background."
    assert rules.synonym_paraphrase(desc, "size").text() == "A big red circle left of a little blue square."
    assert rules.synonym_paraphrase(desc, "relation").text() == "A large red circle to the left of a small blue square."
    assert rules.holds(rules.synonym_paraphrase(desc, "relation"), SCENE) and rules.holds(rules.synonym_paraphrase(desc, "size"), SCENE)
    assert rules.synonym_paraphrase(rules.Description((M("circle", "red"),)), "size") is None  # no size word to replace
    added = rules.Description((red, blue, M("cross", "green", "small")), "left of")
    assert added.text() == "A large red circle left of a small blue square, and a small green cross."


@pytest.mark.parametrize("seed", range(3))
def test_on_random_scenes_paraphrases_keep_and_negatives_change_the_meaning(seed):
    """Over many scenes of a richer world: a hard positive is true exactly when its caption is (in the
    scene and in every other scene), and every negative kind is false where its caption is true."""
    world = ShapesWorldParams(colors={"red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "yellow": (1, 1, 0), "white": (9, 9, 9)},
                              shapes=["circle", "square", "triangle", "cross", "star"], min_objects=1, max_objects=4)
    held = sw.held_out_pairs(world, seed)
    metas = [sw.scene_metadata(sw.sample_scene(world, seed, "test", i, held), held) for i in range(150)]
    rng = np.random.default_rng(seed)
    kinds = builder.SUGARCREPE_SUBSETS
    made = dict.fromkeys(kinds, 0)
    for meta in metas:
        desc = rules.describe_scene(meta, rng)
        assert rules.holds(desc, meta["objects"], meta["background"])
        paraphrases = [rules.paraphrase(desc), rules.synonym_paraphrase(desc, "size"), rules.synonym_paraphrase(desc, "relation")]
        for para in (p for p in paraphrases if p is not None):
            assert para.text() != desc.text()
            for other in metas[:40]:  # same truth value in every scene: the meaning did not change
                assert rules.holds(para, other["objects"], other["background"]) == rules.holds(desc, other["objects"], other["background"])
        for kind in kinds:
            pair = rules.negative_for(kind, desc, meta, rng, world)
            if pair is None:
                continue
            pos, neg = pair
            made[kind] += 1
            assert rules.holds(pos, meta["objects"], meta["background"])
            assert not rules.holds(neg, meta["objects"], meta["background"]), (kind, neg.text(), meta)
            assert pos.text() != neg.text()
    assert all(n > 20 for n in made.values()), made


def _write_suite(tmp_path, test_images=40):
    captions = tiny_captions(tmp_path, shapesworld={"test_images": test_images})
    cap_file = tmp_path / "captions.yaml"
    cap_file.write_text(yaml.safe_dump(captions.model_dump(mode="json"), sort_keys=False))  # dict order is part of the world
    params = BenchmarksParams(captions_params=cap_file, output_dir=tmp_path / "suite")
    return params, stage.run(params), captions


def test_benchmarks_stage_writes_every_benchmark_readable_by_the_evaluate_readers(tmp_path):
    params, stats, captions = _write_suite(tmp_path)
    out = params.output_dir
    assert stats["images"] == 40 and not (tmp_path / "suite.tmp").exists()
    images = out / "images"
    tasks = [bd.sugarcrepe(out / "sugar_crepe" / f"{k}.json", images, k) for k in builder.SUGARCREPE_SUBSETS]
    tasks += [bd.sugarcrepe_pp(out / "sugar_crepe_pp" / f"{k}.json", images, k) for k in builder.SUGARCREPE_PP_SUBSETS]
    tasks += [bd.hard_positives(out / "hard_positives" / "data" / f, out / "hard_positives" / "swapped_data" / f, images, k)
              for k, f in builder.HARD_POSITIVE_FILES.items()]
    tasks += [aro.aro_vg(out / "aro" / "visual_genome_relation.json", images, "rel", "relation"),
              aro.aro_vg(out / "aro" / "visual_genome_attribution.json", images, "att", "attribution"),
              bd.winoground(out / "winoground" / "examples.jsonl", images, "wino"),
              bd.zero_shot(out / "zero_shot", "zs", ["a {}."], "classnames.txt", "held_out_classes.txt"),
              retrieval_reader.retrieval(out / "retrieval" / "karpathy_test.json", images, "ret", "test"),
              long_captions.long_caption_retrieval(out / "long_captions" / "docci_descriptions.jsonlines", images, "long", "test")]
    for task in tasks:
        assert task.items > 0, task.name
        assert all(ref.path.is_file() for ref in task.images), task.name
    # the counts in stats.json are the files' item counts
    sc = {t.name: t.items for t in tasks[:7]}
    assert sc == stats["sugar_crepe"]
    assert stats["sugar_crepe"]["add_att"] == 40  # every image has a colored object to drop and re-add wrongly
    # SugarCrepe's format exactly: keys "0".."n-1" → {filename, caption, negative_caption} (+ our held_out)
    swap = json.loads((out / "sugar_crepe" / "swap_att.json").read_text())
    assert list(swap) == [str(k) for k in range(len(swap))]
    assert set(swap["0"]) == {"filename", "caption", "negative_caption", "held_out"}
    # zero-shot: every (color, shape) class listed, held-out classes are the world's held-out pairs
    classes = (out / "zero_shot" / "classnames.txt").read_text().split()
    assert len(classes) == len(captions.shapesworld.colors) * len(captions.shapesworld.shapes)
    held = {f"{c}_{s}" for c, s in sw.held_out_pairs(captions.shapesworld, captions.seed)}
    assert set((out / "zero_shot" / "held_out_classes.txt").read_text().split()) == held
    # long captions: DOCCI's fields, one description per test image naming every object, relation and place
    docci = [json.loads(line) for line in (out / "long_captions" / "docci_descriptions.jsonlines").read_text().splitlines()]
    assert len(docci) == 40 == stats["long_captions"]["images"] and set(docci[0]) == {"example_id", "split", "image_file", "description", "held_out"}
    for item in docci:
        index = int(item["image_file"][len("test_"):-len(".jpg")])
        _, _, meta = sw.make_sample(captions.shapesworld, captions.seed, "test", index, sw.held_out_pairs(captions.shapesworld, captions.seed))
        parsed = rules.grammar.parse_shapes_caption(rules.dense_description(meta))
        assert item["description"].startswith(rules.dense_description(meta)) and rules.caption_holds(parsed, meta)
        for o in meta["objects"]:
            assert f"The {o['color']} {o['shape']} is in {rules.place(o)} of the image." in item["description"]
    # the test images are the captions stage's test images, byte for byte
    jpg, _, _ = sw.make_sample(captions.shapesworld, captions.seed, "test", 7, sw.held_out_pairs(captions.shapesworld, captions.seed))
    assert (images / "test_000007.jpg").read_bytes() == jpg


def parse_pair(caption: str) -> rules.Description:
    """The benchmark's "A <size> <color> <shape> <relation> a <size> <color> <shape>." read back."""
    m = re.fullmatch(r"A (\w+) (\w+) (\w+) (left of|right of|above|below) a (\w+) (\w+) (\w+)\.", caption)
    assert m, caption
    a, b = M(m[3], m[2], m[1]), M(m[7], m[6], m[5])
    return rules.Description((a, b), m[4])


def test_winoground_pairs_are_true_of_their_own_image_only(tmp_path):
    params, stats, captions = _write_suite(tmp_path)
    held = sw.held_out_pairs(captions.shapesworld, captions.seed)
    pairs = [json.loads(line) for line in (params.output_dir / "winoground" / "examples.jsonl").read_text().splitlines()]
    assert {p["tag"] for p in pairs} == {"color", "position"} and len(pairs) == stats["winoground"]
    for p in pairs:
        index = int(p["id"].split("_")[0])
        meta0 = sw.scene_metadata(sw.sample_scene(captions.shapesworld, captions.seed, "test", index, held), held)
        assert p["image_0"] == builder.image_name(index)
        image_0, image_1 = (params.output_dir / "images" / p["image_0"]).read_bytes(), (params.output_dir / "images" / p["image_1"]).read_bytes()
        assert image_0 != image_1
        # caption 0 describes image 0, caption 1 does not; both use the same words in another order
        assert rules.holds(parse_pair(p["caption_0"]), meta0["objects"])
        assert not rules.holds(parse_pair(p["caption_1"]), meta0["objects"])
        assert sorted(p["caption_0"].lower().rstrip(".").split()) == sorted(p["caption_1"].lower().rstrip(".").split())


def test_places_name_the_grid_cell():
    assert [rules.place(o) for o in SCENE] == ["the top left", "the top right", "the bottom left"]
    assert rules.place(obj("red", "circle", "large", 1, 1)) == "the center"
    assert rules.place(obj("red", "circle", "large", 1, 0)) == "the middle left"
    assert rules.place(obj("red", "circle", "large", 0, 1)) == "the top middle"
