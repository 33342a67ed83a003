"""ShapesWorld's benchmark suite in the official file formats, built from the held-out test split of a world
(the layout is in components/benchmarks.py, the stage that writes it to data/benchmarks/shapesworld). The learning
curves build a small slice of the same suite with it (components/study/tracking.py), so both see one set of rules.
Every caption is checked with the world's exact rules (:mod:`components.data.shapesworld_rules`): positives hold,
negatives do not."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from components.data import shapesworld
from components.data import shapesworld_rules as rules
from components.shared.atomic import atomic_write_bytes, atomic_write_json
from components.shared.params import BenchmarksParams, CaptionsParams, ParamsError
from components.shared.params_eval import HARD_POSITIVE_FILES
from components.shared.progress import TimedBar

SUGARCREPE_SUBSETS = ["add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"]
SUGARCREPE_PP_SUBSETS = ["replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"]
HARD_POSITIVE_SUBSETS = list(HARD_POSITIVE_FILES)
ARO_MARGIN = 2.0  # pixels around the union box, as VG boxes include a little context


def image_name(index: int) -> str:
    return f"test_{index:06d}.jpg"


def _held(held: set, *descs: rules.Description) -> bool:
    return any(p in held for d in descs for p in d.pairs())


def _check(meta: dict, positive: rules.Description, negative: rules.Description | None = None) -> None:
    # a broken rule must stop the stage, never write a wrong label
    if not rules.holds(positive, meta["objects"], meta["background"]):
        raise AssertionError(f"positive caption does not hold: {positive.text()!r} in {meta}")
    if negative is not None and rules.holds(negative, meta["objects"], meta["background"]):
        raise AssertionError(f"negative caption holds: {negative.text()!r} in {meta}")


def build_suite(params: BenchmarksParams, captions: CaptionsParams, out: Path) -> dict[str, Any]:
    """Write the whole suite under ``out`` (an empty folder). Returns the item counts."""
    world, seed = captions.shapesworld, captions.seed
    held_list = shapesworld.held_out_pairs(world, seed)
    held = set(held_list)
    count = min(params.images or world.test_images, world.test_images)
    if count == 0:
        raise ParamsError(f"{params.captions_params}: shapesworld.test_images is 0; the benchmarks need test images")
    for sub in ["images", "sugar_crepe", "sugar_crepe_pp", "hard_positives", "aro", "winoground", "zero_shot", "retrieval", "long_captions"]:
        (out / sub).mkdir(parents=True)
    sc = {k: {} for k in SUGARCREPE_SUBSETS}
    scpp = {k: [] for k in SUGARCREPE_PP_SUBSETS}
    hp = {k: ([], []) for k in HARD_POSITIVE_SUBSETS}
    aro_rel, aro_att, wino, karpathy, docci = [], [], [], [], []
    zero_shot_counts: dict[str, int] = {}

    for index in TimedBar(range(count), desc="benchmarks (shapesworld)", unit="image", file=sys.stderr):
        scene = shapesworld.sample_scene(world, seed, "test", index, held_list)
        image = shapesworld.render(world, scene)
        fields = shapesworld.describe(scene)  # the captions stage's own captions of this image
        meta = shapesworld.scene_metadata(scene, held_list)
        name = image_name(index)
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=world.jpeg_quality)
        (out / "images" / name).write_bytes(buf.getvalue())
        objects = meta["objects"]
        shows_held = meta["has_held_out_pair"]

        def rng_for(tag: int, index: int = index) -> np.random.Generator:  # bound now: called within this image's turn
            return np.random.default_rng([params.seed, tag, index])

        base = rules.describe_scene(meta, rng_for(0))
        _check(meta, base)

        for t, kind in enumerate(SUGARCREPE_SUBSETS):
            pair = rules.negative_for(kind, base, meta, rng_for(10 + t), world)
            if pair is None:
                continue
            pos, neg = pair
            _check(meta, pos, neg)
            sc[kind][str(len(sc[kind]))] = {"filename": name, "caption": pos.text(), "negative_caption": neg.text(),
                                           "held_out": _held(held, base, neg)}
        for t, kind in enumerate(SUGARCREPE_PP_SUBSETS):
            pair = rules.negative_for(kind, base, meta, rng_for(30 + t), world)
            if pair is None:
                continue
            pos, neg = pair
            pos2 = rules.paraphrase(pos)
            _check(meta, pos2, neg)
            scpp[kind].append({"id": len(scpp[kind]), "filename": name, "caption": pos.text(), "caption2": pos2.text(),
                               "negative_caption": neg.text(), "held_out": _held(held, base, neg)})
        for t, kind in enumerate(HARD_POSITIVE_SUBSETS):
            pair = rules.negative_for(kind, base, meta, rng_for(50 + t), world)
            if pair is None:
                continue
            pos, neg = pair
            # REPLACE: a synonym of the replaced kind of word; SWAP: the same claims in another order
            if kind == "replace_att":
                hard_pos = rules.synonym_paraphrase(pos, "size")
            elif kind == "replace_rel":
                hard_pos = rules.synonym_paraphrase(pos, "relation")
            else:
                hard_pos = rules.paraphrase(pos)
            if hard_pos is None:
                continue
            _check(meta, hard_pos, neg)
            flag = _held(held, base, neg)
            original, swapped = hp[kind]
            original.append({"image_id": index, "true_caption": pos.text(), "false_caption": neg.text(), "image_path": name, "held_out": flag})
            swapped.append({"image_id": index, "true_caption": hard_pos.text(), "false_caption": neg.text(), "image_path": name, "held_out": flag})

        if len(objects) >= 2:
            i, j = (int(k) for k in rng_for(70).choice(len(objects), size=2, replace=False))
            x0 = min(objects[i]["bbox"][0], objects[j]["bbox"][0]) - ARO_MARGIN
            y0 = min(objects[i]["bbox"][1], objects[j]["bbox"][1]) - ARO_MARGIN
            x1 = max(objects[k]["bbox"][0] + objects[k]["bbox"][2] for k in (i, j)) + ARO_MARGIN
            y1 = max(objects[k]["bbox"][1] + objects[k]["bbox"][3] for k in (i, j)) + ARO_MARGIN
            x0, y0, x1, y1 = max(x0, 0.0), max(y0, 0.0), min(x1, world.image_size), min(y1, world.image_size)
            box = {"bbox_x": round(x0, 2), "bbox_y": round(y0, 2), "bbox_w": round(x1 - x0, 2), "bbox_h": round(y1 - y0, 2)}
            pair_held = any((objects[k]["color"], objects[k]["shape"]) in held for k in (i, j))
            true, false, rel = rules.aro_relation(objects, i, j)
            aro_rel.append({"image_id": index, "relation_name": rel, **box, "true_caption": true, "false_caption": false,
                            "image_path": name, "held_out": pair_held})
            attribution = rules.aro_attribution(objects, i, j)
            if attribution is not None:
                true, false, attributes = attribution
                aro_att.append({"image_id": index, "attributes": attributes, **box, "true_caption": true,
                                "false_caption": false, "image_path": name, "held_out": pair_held})
            wino.extend(winoground_pairs(world, scene, meta, index, i, j, out, held))

        if len(objects) == 1:
            folder = f"{objects[0]['color']}_{objects[0]['shape']}"
            (out / "zero_shot" / folder).mkdir(exist_ok=True)
            (out / "zero_shot" / folder / name).write_bytes(buf.getvalue())
            zero_shot_counts[folder] = zero_shot_counts.get(folder, 0) + 1

        sentences = [fields["short"], fields["long"], rules.describe_scene(meta, rng_for(90)).text()]
        karpathy.append({"filename": name, "filepath": "", "split": "test", "imgid": index,
                         "sentences": [{"raw": s, "sentid": 3 * index + k} for k, s in enumerate(sentences)],
                         "held_out": shows_held})
        docci.append({"example_id": f"test_{index:05d}", "split": "test", "image_file": name,
                      "description": rules.long_description(meta), "held_out": shows_held})

    for kind, items in sc.items():
        atomic_write_json(out / "sugar_crepe" / f"{kind}.json", items, sort_keys=False)  # "0", "1", … in order
    for kind, items in scpp.items():
        atomic_write_json(out / "sugar_crepe_pp" / f"{kind}.json", items)
    for kind, (original, swapped) in hp.items():
        atomic_write_json(out / "hard_positives" / "data" / HARD_POSITIVE_FILES[kind], original)
        atomic_write_json(out / "hard_positives" / "swapped_data" / HARD_POSITIVE_FILES[kind], swapped)
    atomic_write_json(out / "aro" / "visual_genome_relation.json", aro_rel)
    atomic_write_json(out / "aro" / "visual_genome_attribution.json", aro_att)
    (out / "winoground" / "examples.jsonl").write_text("".join(json.dumps(w) + "\n" for w in wino))
    classes = [f"{c}_{s}" for c in world.colors for s in world.shapes]
    (out / "zero_shot" / "classnames.txt").write_text("".join(c + "\n" for c in classes))
    (out / "zero_shot" / "held_out_classes.txt").write_text("".join(f"{c}_{s}\n" for c, s in held_list))
    atomic_write_json(out / "retrieval" / "karpathy_test.json", {"dataset": "shapesworld", "images": karpathy})
    atomic_write_bytes(out / "long_captions" / "docci_descriptions.jsonlines", "".join(json.dumps(d) + "\n" for d in docci).encode())

    def held_count(items) -> int:
        return sum(bool(it["held_out"]) for it in items)

    stats = {
        "images": count,
        "held_out_pairs": [list(p) for p in held_list],
        "sugar_crepe": {k: len(v) for k, v in sc.items()},
        "sugar_crepe_held_out": {k: held_count(v.values()) for k, v in sc.items()},
        "sugar_crepe_pp": {k: len(v) for k, v in scpp.items()},
        "hard_positives": {k: len(v[0]) for k, v in hp.items()},
        "aro": {"vg_relation": len(aro_rel), "vg_attribution": len(aro_att)},
        "winoground": len(wino),
        "winoground_held_out": held_count(wino),
        "zero_shot": {"classes": len(classes), "images": sum(zero_shot_counts.values())},
        "retrieval": {"images": len(karpathy), "captions": 3 * len(karpathy)},
        "long_captions": {"images": len(docci), "words_per_description": round(sum(len(d["description"].split()) for d in docci) / max(len(docci), 1), 1)},
    }
    atomic_write_json(out / "stats.json", stats)
    return stats


def winoground_pairs(world, scene: dict, meta: dict, index: int, i: int, j: int, out: Path, held: set) -> list[dict]:
    """Winoground-style pairs for objects i and j: the colors swapped (attribute binding) and the
    positions swapped (relation), each a second image rendered from the edited scene with the two captions
    checked both ways (each true of its own image, false of the other)."""
    objs = scene["objects"]
    a, b = objs[i], objs[j]
    edits = {}
    if a.color != b.color and a.shape != b.shape:
        edits["color"] = {i: replace(a, color=b.color), j: replace(b, color=a.color)}
    edits["position"] = {i: replace(a, row=b.row, col=b.col, cx=b.cx, cy=b.cy),
                         j: replace(b, row=a.row, col=a.col, cx=a.cx, cy=a.cy)}
    pairs = []
    for tag, changed in edits.items():
        edited = dict(scene, objects=[changed.get(k, o) for k, o in enumerate(objs)])
        meta1 = shapesworld.scene_metadata(edited, sorted(held))
        cap0 = rules.describe_pair(meta["objects"], i, j)
        cap1 = rules.describe_pair(meta1["objects"], i, j) if tag == "color" else rules.describe_pair(meta1["objects"], j, i)
        truth = [[rules.holds(c, m["objects"]) for c in (cap0, cap1)] for m in (meta, meta1)]
        if truth != [[True, False], [False, True]]:
            continue  # e.g. a third object makes the other caption true as well: not a clean pair
        name1 = f"wino_{index:06d}_{tag}.jpg"
        buf = io.BytesIO()
        shapesworld.render(world, edited).save(buf, format="JPEG", quality=world.jpeg_quality)
        (out / "images" / name1).write_bytes(buf.getvalue())
        pairs.append({"id": f"{index}_{tag}", "caption_0": cap0.text(), "caption_1": cap1.text(),
                      "image_0": image_name(index), "image_1": name1, "tag": tag,
                      "held_out": _held(held, cap0, cap1)})
    return pairs
