"""The model card: Hugging Face front matter that parses and holds the figures given, a body that says what the model
is, how it was trained and how to load it, and the figures read back from the card."""

import pytest
import yaml
from conftest import REPO

from components.shared.model_card import card_facts, card_figures, model_card, read_front_matter
from components.shared.params import load_params


def test_the_card_front_matter_parses_and_holds_the_models_figures(tmp_path):
    params = load_params("train")
    figures = {"zero_shot_top1": 0.98952, "zero_shot_top1_held_out_pairs": 0.89855, "final_loss": 6.4, "samples_per_s": 197.2}
    summary = {"binding": (0.261, 0.265), "compositional": (0.480, 0.516), "not_a_group": (0.0, 1.0)}
    text = model_card(card_facts(params), figures, summary, name="c2lip-test")
    path = tmp_path / "README.md"
    path.write_text(text)
    front = read_front_matter(path)
    # a local start is no Hub id: the Hub's base_model field is left out (the body names the start); "other" has its name and link
    assert front["library_name"] == "open_clip" and "base_model" not in front and str(params.model.init) in text
    assert front["license"] == "other" and front["license_name"] == "unspecified" and front["license_link"] == "README.md"
    assert {"c2lip", "zero-shot-image-classification"} <= set(front["tags"]) and len(set(front["tags"])) == len(front["tags"])
    assert card_figures(front) == {"zero_shot_top1": 0.98952, "zero_shot_top1_held_out_pairs": 0.89855}  # no timings, no losses
    names = [m["name"] for r in front["model-index"][0]["results"] for m in r["metrics"]]
    assert any(n.startswith("binding") for n in names) and not any("not_a_group" in n for n in names)
    body = text.split("\n---\n", 1)[1]
    assert "λ_npc = 1.0, λ_xac = 0.01" in body and "| samples seen | 38,400 |" in body
    assert "| binding (SugarCrepe swap_att, SugarCrepe++ swap_att, Winoground group) | 0.261 | 0.265 | +0.004 |" in body
    assert 'create_model_and_transforms("local-dir:<this folder>")' in body and "## Uses" in body and "## Citation" in body
    assert "Plain open_clip loads it" in body and "imported first" not in body  # no claim that our code is needed
    assert "samples/s" not in text and "197" not in text  # a rebuilt export's card is identical: no timings


def test_a_card_without_benchmarks_or_a_siglip_run_says_only_what_it_knows():
    params = load_params("train").model_copy(deep=True)
    params.method.name = "siglip"
    text = model_card(card_facts(params))
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["model-index"][0]["results"] == [] and "λ_npc" not in text and "## Benchmarks" not in text
    assert "fine-tuned with `siglip`" in text


@pytest.mark.parametrize("content", ["no front matter here", ""])
def test_a_file_without_front_matter_reads_as_empty(tmp_path, content):
    path = tmp_path / "README.md"
    path.write_text(content)
    assert read_front_matter(path) == {} and card_figures({}) == {}


def test_a_card_for_the_hub_names_its_repository_its_licence_and_a_hub_start():
    params = load_params("train").model_copy(deep=True)
    facts = {**card_facts(params), "init": "hf-hub:timm/ViT-B-16-SigLIP"}
    text = model_card(facts, None, {"binding": (0.6, 0.7)}, name="c2lip-b16", repo_id="someone/c2lip-b16", license="apache-2.0")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["base_model"] == "timm/ViT-B-16-SigLIP" and front["license"] == "apache-2.0" and "license_name" not in front
    assert 'create_model_and_transforms("hf-hub:someone/c2lip-b16")' in text and "| binding" in text and "+0.100" in text
    for local in ("models/base/export", "scratch", "../x/y", "hf-hub:not a/repo"):
        assert "base_model" not in yaml.safe_load(model_card({**facts, "init": local}).split("---\n")[1]), local


def test_a_figure_prints_the_same_in_the_report_the_metrics_file_and_the_card():
    """The card and MLflow read reports/metrics.json; the report formats the raw value. A value at a rounding edge
    (0.1205004: 0.121 at three decimals, but 0.120 once rounded to five first) must print 0.121 everywhere."""
    from components.suite import report

    raw = {"base": {"retrieval": {"mean_r1": 0.0437}}, "finetuned": {"retrieval": {"mean_r1": 0.1205004}}}
    flat = report.flat_metrics([], raw)
    assert report._fmt(raw["finetuned"]["retrieval"]["mean_r1"]) == "0.121" == f"{flat['finetuned/retrieval/mean_r1']:.3f}"
    card = model_card(card_facts(load_params("train")),
                      summary={"retrieval": (flat["base/retrieval/mean_r1"], flat["finetuned/retrieval/mean_r1"])})
    row = next(line for line in card.splitlines() if line.startswith("| retrieval"))
    assert "| 0.044 | 0.121 | +0.077 |" in row, row


def test_shipping_a_build_copies_its_export_with_a_card_of_its_seed_and_suite_figures_and_refuses_an_unfinished_one(tmp_path):
    """components.study.ship_base: a comparison run's export becomes the committed base, whole (checksums that cover
    the card), its card naming the build's seed and its own figures on the suite; a run that has not finished is
    refused by name and the export already there is left as it was."""
    import json

    import open_clip
    import torch

    from components.method.models import create_model
    from components.shared.atomic import checksum_problem
    from components.shared.checkpoints import export_model
    from components.study import ship_base

    build = tmp_path / "models" / "builds" / "arm" / "seed3"
    train = load_params("train", REPO / "params" / "presets" / "calibration" / "base-calibrated.yaml").model_dump(mode="json")
    train.update(seed=3, output_dir=str(build / "train"))
    build.mkdir(parents=True)
    (build / "train.yaml").write_text(yaml.safe_dump(train))
    torch.manual_seed(0)
    export_model(create_model("c2lip-tiny-rn", pretrained=None)[0], "c2lip-tiny-rn", build / "train" / "export", dtype="float16")
    (build / "train_metrics.json").write_text(json.dumps({"zero_shot_top1": 0.931, "samples_per_s": 100.0}))
    to = tmp_path / "models" / "base-calibrated" / "export"

    with pytest.raises(FileNotFoundError, match="done.json: missing"):  # the suite has not scored it yet
        ship_base.ship(build, to)
    assert not to.parent.exists() or not any(to.parent.iterdir())

    (build / "done.json").write_text(json.dumps({"fingerprint": "x", "metrics": {
        "sugarcrepe/swap_att/acc": 0.7123, "zero_shot/top1": 0.9351, "summary/binding": 0.51, "not/a/figure": 1.0}}))
    assert ship_base.main(["--build", str(build), "--to", str(to)]) == 0
    assert checksum_problem(to) is None and sorted(p.name for p in to.parent.iterdir()) == ["export"]  # no staging left
    card = (to / "README.md").read_text()
    assert "3000 steps of 128, seed 3 |" in card and "| SugarCrepe swap_att | 0.712 |" in card and "| zero-shot top-1 | 0.935 |" in card
    assert "not/a/figure" not in card and "| zero-shot top-1 (ShapesWorld single-object test images) | 0.931 |" in card
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{to}")  # plain open_clip loads what was shipped
    shipped = dict(model.state_dict())
    torch.manual_seed(0)
    original = create_model("c2lip-tiny-rn", pretrained=None)[0]
    key = next(k for k, v in shipped.items() if v.is_floating_point() and v.numel() > 100)
    assert torch.allclose(shipped[key].float(), original.state_dict()[key].half().float())

    (build / "done.json").write_text("{not json")
    assert ship_base.main(["--build", str(build), "--to", str(to)]) == 1  # named on stderr; the shipped export stands
    assert checksum_problem(to) is None and "| SugarCrepe swap_att | 0.712 |" in (to / "README.md").read_text()


def test_the_shipped_calibrated_base_is_intact_and_its_card_gives_the_build_it_came_from():
    """models/base-calibrated/export, which the calibration presets start from: its checksums hold, open_clip loads
    it, and its card names seed 0 and the figures its build's report recorded (a re-shipped export without its report
    or card fails here)."""
    import json

    import open_clip

    from components import compare
    from components.shared.checkpoints import check_export

    export = REPO / "models" / "base-calibrated" / "export"
    check_export(export)
    open_clip.create_model_and_transforms(f"local-dir:{export}")
    card = (export / "README.md").read_text()
    report = json.loads((REPO / "reports" / "calibrated-build-seed0" / "compare.json").read_text())
    assert report["seeds"] == [0] and "3000 steps of 128, seed 0 |" in card
    figures = report["metrics"]["calibrated"]
    for key, label in (("sugarcrepe/swap_att/acc", "SugarCrepe swap_att"), ("zero_shot/top1", "zero-shot top-1")):
        assert f"| {label} | {figures[key]['values'][0]:.3f} |" in card, label
    control = load_params("compare", REPO / "params" / "presets" / "calibration" / "control-calibrated.yaml")
    assert {run.train.model.init for run in compare.plan(control)} == {"models/base-calibrated/export"}  # they start from it
