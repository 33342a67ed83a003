"""Registration (tags, challenger alias, both loading forms) and promotion gates, on a real MLflow registry."""

import json

import pandas as pd
import pytest
from conftest import REPO

from components import register as reg
from components.shared.params import RegistryParams


def _params(tmp_path, summary: dict[str, float], **gates) -> RegistryParams:
    metrics = {f"finetuned/summary/{k}": v for k, v in summary.items()}
    metrics.update({f"base/summary/{k}": round(v - 0.05, 5) for k, v in summary.items()})  # the base, 0.05 under
    metrics["finetuned/zero_shot/top1"] = summary["zero_shot"]
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics))
    return RegistryParams(model_name="c2lip-test", export_dir=REPO / "models" / "base" / "export", metrics_path=path,
                          train_params=REPO / "params" / "train.yaml", gates=gates or {})


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("C2LIP_MLFLOW_ARTIFACTS", (tmp_path / "artifacts").as_uri())


def test_missing_metrics_or_model_say_what_to_run(tmp_path):
    params = RegistryParams(metrics_path=tmp_path / "none.json", export_dir=REPO / "models" / "base" / "export")
    with pytest.raises(reg.RegistryError, match="none.json: not found; run the evaluate stage"):
        reg.register(params)
    (tmp_path / "m.json").write_text(json.dumps({"base/summary/compositional": 0.5}))
    params = RegistryParams(metrics_path=tmp_path / "m.json", metrics_model="finetuned")
    with pytest.raises(reg.RegistryError, match="no .*finetuned/summary/compositional"):
        reg.benchmark_summary(params)


@pytest.mark.slow
def test_register_then_promote_through_the_gates(tmp_path, tracking):
    import mlflow

    first = reg.register(_params(tmp_path, {"compositional": 0.70, "zero_shot": 0.90, "retrieval": 0.50}))
    assert str(first.version) == "1" and "challenger" in first.aliases
    assert first.tags["method"] == "c2lip" and first.tags["summary.zero_shot"] == "0.90000"
    assert len(first.tags["git_commit"]) >= 40 and len(first.tags["dvc_lock_sha256"]) == 64
    assert json.loads(first.tags["benchmark_summary"])["compositional"] == 0.7
    # the MLflow UI's text: the version's card summary names the method and the base; the registered model says what it is
    assert "fine-tuned with `c2lip`" in first.description and "models/base/export" in first.description
    assert "| compositional" in first.description and "0.650 | 0.700 | +0.050 |" in first.description
    client = mlflow.MlflowClient()
    assert "C2LIP" in client.get_registered_model("c2lip-test").description
    card = mlflow.artifacts.load_text(f"runs:/{first.run_id}/model_card/README.md")
    assert card.startswith("---\nlibrary_name: open_clip") and "## How to load it" in card

    done = reg.promote(_params(tmp_path, {"compositional": 0.70, "zero_shot": 0.90, "retrieval": 0.50}), "challenger")
    assert done.promoted and "first champion" in done.message

    # better compositional, but zero-shot 0.04 under the champion's (tolerance 0.01): refused, and why
    worse = _params(tmp_path, {"compositional": 0.75, "zero_shot": 0.86, "retrieval": 0.50})
    second = reg.register(worse)
    assert str(second.version) == "2" and "challenger" in second.aliases
    with pytest.raises(reg.PromotionRefused) as refused:
        reg.promote(worse, "challenger")
    message = str(refused.value)
    assert "zero_shot: 0.8600 vs required 0.8900 — FAILS by 0.0300" in message
    assert "compositional" not in message and "retrieval" not in message
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("c2lip-test", "champion").version) == "1"

    # a margin on compositional: 0.705 is not 0.70 + 0.02
    small = _params(tmp_path, {"compositional": 0.705, "zero_shot": 0.90, "retrieval": 0.495}, compositional_margin=0.02)
    reg.register(small)
    with pytest.raises(reg.PromotionRefused, match=r"compositional: 0.7050 vs required 0.7200 — FAILS by 0.0150"):
        reg.promote(small, "3")

    better = _params(tmp_path, {"compositional": 0.72, "zero_shot": 0.895, "retrieval": 0.50})
    reg.register(better)
    done = reg.promote(better, "challenger")
    assert done.promoted and done.version == "4" and done.champion_before == "1"
    assert str(client.get_model_version_by_alias("c2lip-test", "champion").version) == "4"
    assert "| zero_shot | 0.8950 | 0.8900 | yes |" in done.markdown()

    # the champion loads as an MLflow pyfunc returning embeddings (and, via its artifacts, as open_clip:
    # tests/test_evaluate.py evaluates models:/…@champion)
    model = mlflow.pyfunc.load_model("models:/c2lip-test@champion")
    text = model.predict(pd.DataFrame({"text": ["A large red circle.", "A small blue square."]}))
    image = model.predict(pd.DataFrame({"image": [str(REPO / "docs" / "shapesworld_contact_sheet.png")]}))
    assert text.shape == (2, 128) and image.shape == (1, 128)
    assert abs(float((text ** 2).sum(axis=1)[0]) - 1) < 1e-4
