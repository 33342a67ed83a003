"""The calibration table: families read from comparison reports, changes against the base with intervals over seeds."""

from __future__ import annotations

import json

import pytest

from components.suite import calibration as cal


def _report(arms: dict[str, dict[str, list[float]]]) -> dict:
    metrics = {arm: {key: {"values": values} for key, values in figures.items()} for arm, figures in arms.items()}
    return {"arms": list(arms), "metrics": metrics}


def _figures(swap: list[float], pp_att: list[float], pp_obj: list[float], zero_shot: list[float]) -> dict[str, list[float]]:
    return {"sugarcrepe/swap_att/acc": swap, "sugarcrepe_pp/swap_att/itt": pp_att, "sugarcrepe_pp/swap_obj/itt": pp_obj,
            "zero_shot/top1": zero_shot}


def test_the_table_sets_each_arms_change_against_the_base_beside_the_published_sign(tmp_path):
    sweep = _report({"share0": _figures([0.5], [0.2], [0.3], [0.9]), "share0.5": _figures([0.6], [0.4], [0.5], [0.8])})
    arms = _report({"negclip": _figures([0.7, 0.72, 0.68], [0.5, 0.5, 0.5], [0.6, 0.6, 0.6], [0.79, 0.81, 0.80]),
                    "siglip": _figures([0.58, 0.6, 0.62], [0.45, 0.45, 0.45], [0.5, 0.5, 0.5], [0.7, 0.71, 0.69])})
    table = cal.calibration(sweep, "share0.5", [arms], tmp_path / "compare.json")
    assert table["base"] == {"swap_att": 0.6, "sc_pp_swap": 0.45, "zero_shot": 0.8}  # ARO and retrieval absent: left out
    negclip = table["arms"]["negclip"]
    assert negclip["swap_att"]["delta"] == pytest.approx(0.1) and negclip["swap_att"]["low"] > 0 and negclip["swap_att"]["sign_agrees"]
    assert negclip["sc_pp_swap"]["delta"] == pytest.approx(0.1) and negclip["sc_pp_swap"]["sign_agrees"]
    # zero-shot: the published NegCLIP loses it; ours holds it (interval around 0): the sign does not agree
    assert negclip["zero_shot"]["low"] < 0 < negclip["zero_shot"]["high"] and negclip["zero_shot"]["sign_agrees"] is False
    assert table["arms"]["siglip"]["swap_att"]["sign_agrees"] is None  # no published row for the plain fine-tune
    assert table["arms"]["siglip"]["swap_att"]["low"] < 0 < table["arms"]["siglip"]["swap_att"]["high"]
    assert set(table["published"]["base"]) == set(cal.FAMILIES)


def test_a_missing_arm_is_named_and_the_cli_writes_nothing(tmp_path, capsys):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(_report({"share0": _figures([0.5], [0.2], [0.3], [0.9])})))
    out = tmp_path / "calibration.json"
    assert cal.main(["--base", str(sweep), "--base-arm", "share0.25", "--arms", str(sweep), "--out", str(out)]) == 2
    assert "no arm 'share0.25' (arms: share0)" in capsys.readouterr().err and not out.exists()
    assert cal.main(["--base", str(sweep), "--base-arm", "share0", "--arms", str(sweep), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["arms"]["share0"]["swap_att"]["delta"] == 0.0


def test_the_base_may_be_the_evaluate_stages_flat_metrics_of_the_base_itself(tmp_path):
    flat = {"base-calibrated/sugarcrepe/swap_att/acc": 0.6, "base-calibrated/sugarcrepe_pp/swap_att/itt": 0.4,
            "base-calibrated/sugarcrepe_pp/swap_obj/itt": 0.5, "base-calibrated/zero_shot/top1": 0.9,
            "base-calibrated/summary/binding": 0.55, "other/zero_shot/top1": 0.1}
    (tmp_path / "metrics.json").write_text(json.dumps(flat))
    (tmp_path / "compare.json").write_text(json.dumps(_report({"negclip": _figures([0.7, 0.7], [0.5, 0.5], [0.6, 0.6], [0.8, 0.8])})))
    out = tmp_path / "calibration.json"
    assert cal.main(["--base", str(tmp_path / "metrics.json"), "--base-arm", "base-calibrated", "--arms", str(tmp_path / "compare.json"),
                     "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["base"] == {"swap_att": 0.6, "sc_pp_swap": 0.45, "zero_shot": 0.9}
    assert table["arms"]["negclip"]["zero_shot"]["delta"] == pytest.approx(-0.1)
    assert cal.main(["--base", str(tmp_path / "metrics.json"), "--base-arm", "base", "--arms", str(tmp_path / "compare.json"),
                     "--out", str(out)]) == 2  # a model the metrics do not hold is named, as a missing arm is


def test_two_settings_that_name_their_arms_alike_both_stay_and_an_arm_can_stand_for_a_published_method(tmp_path, capsys):
    sweep = _report({"base": _figures([0.6], [0.4], [0.5], [0.9])})
    short = _report({"negclip_short": _figures([0.62, 0.63, 0.64], [0.4, 0.4, 0.4], [0.5, 0.5, 0.5], [0.9, 0.9, 0.9])})
    longer = _report({"negclip_short": _figures([0.58, 0.59, 0.57], [0.4, 0.4, 0.4], [0.5, 0.5, 0.5], [0.9, 0.9, 0.9])})
    with pytest.raises(cal.CalibrationError, match="'negclip_short' is in two reports"):
        cal.calibration(sweep, "base", [short, longer], tmp_path)
    table = cal.calibration(sweep, "base", [short, longer], tmp_path, labels=[None, "4x"],
                            published_as={"negclip_short": "negclip"})
    assert table["arms"]["negclip_short"]["swap_att"]["delta"] == pytest.approx(0.03)
    assert table["arms"]["negclip_short"]["swap_att"]["sign_agrees"] is True  # checked against NegCLIP's rise
    assert table["arms"]["negclip_short@4x"]["swap_att"]["sign_agrees"] is False  # a fall disagrees with it
    for name, report in (("sweep", sweep), ("short", short)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    out = tmp_path / "calibration.json"
    assert cal.main(["--base", str(tmp_path / "sweep.json"), "--base-arm", "base", "--arms", f"x={tmp_path / 'short.json'}",
                     "--published-as", "negclip_short=negclip", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["arms"]["negclip_short@x"]["swap_att"]["sign_agrees"] is True
    with pytest.raises(SystemExit):
        cal.main(["--base", str(tmp_path / "sweep.json"), "--base-arm", "base", "--arms", str(tmp_path / "short.json"),
                  "--published-as", "negclip_short=clip"])
    assert "METHOD one of c2lip, negclip" in capsys.readouterr().err
