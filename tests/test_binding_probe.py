"""The binding probe: which scenes it asks about, that its probes read what features hold, and its report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from conftest import tiny_captions

from components.method.models import create_model
from components.shared import checkpoints
from components.study import binding_probe as bp


def world_file(tmp_path, test_images=400):
    params = tiny_captions(tmp_path, shapesworld={"test_images": test_images, "max_objects": 3}).model_dump(mode="json")
    path = tmp_path / "captions.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_scenes_hold_one_circle_beside_another_colour_and_the_label_is_its_colour(tmp_path):
    path = world_file(tmp_path)
    images, labels, present, colors = bp.probe_scenes(50, "circle", path)
    assert 0 < len(images) <= 50 and len(labels) == len(present) == len(images)
    assert (present.sum(axis=1) >= 2).all()  # at least two colours in every scene
    assert present[np.arange(len(labels)), labels].all()  # the circle's colour is present
    with pytest.raises(ValueError, match="not a shape of the world"):
        bp.probe_scenes(5, "hexagon", path)


def test_the_probe_reads_what_the_features_hold():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=400)
    train = rng.random(400) < 0.7
    informative = np.eye(4)[labels] + 0.1 * rng.standard_normal((400, 4))
    assert bp.fit_probe(informative, labels, train) > 0.95
    assert bp.fit_probe(rng.standard_normal((400, 16)), labels, train) < 0.45  # noise: about chance (0.25)


def test_run_writes_every_figure_for_every_model(tmp_path):
    torch.manual_seed(0)
    export = checkpoints.export_model(create_model("c2lip-tiny-rn", pretrained=None)[0], "c2lip-tiny-rn", tmp_path / "model")
    suite = tmp_path / "swap_att.json"
    suite.write_text(json.dumps([{"id": 0, "filename": "x.jpg", "caption": "a red circle left of a blue square",
                                  "caption2": "a blue square right of a red circle", "negative_caption": "a blue circle left of a red square"}]))
    result = bp.run({"random": str(export)}, tmp_path / "out", 60, "circle", 0, world_file(tmp_path), suite)
    figures = json.loads((tmp_path / "out" / "probe.json").read_text())["models"]["random"]
    assert set(figures) == {"which_colour_pooled", "which_colour_tokens", "colour_present_pooled", "cos_caption_swap",
                            "cos_caption_paraphrase", "text_only_tot", "items"}
    assert 0 < result["bag_of_colours_accuracy"] <= 0.5 and figures["items"] == 1
    assert "| random |" in (tmp_path / "out" / "probe.md").read_text()


def test_a_model_without_a_name_is_refused():
    with pytest.raises(SystemExit):
        bp.main(["--model", "just-a-path"])
