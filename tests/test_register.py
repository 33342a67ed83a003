"""Registration (tags, challenger alias, both loading forms) and promotion gates, on a real MLflow registry."""

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from components import register as reg
from components.shared.params import RegistryParams


def _params(tmp_path, summary: dict[str, float], **gates) -> RegistryParams:
    metrics = {f"finetuned/summary/{k}": v for k, v in summary.items()}
    metrics.update({f"base/summary/{k}": round(v - 0.05, 5) for k, v in summary.items()})  # the base, 0.05 under
    if "zero_shot" in summary:
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
    with pytest.raises(reg.RegistryError, match="none of .*finetuned/summary/compositional"):
        reg.benchmark_summary(params)


@pytest.mark.slow
def test_a_suite_without_zero_shot_or_retrieval_registers_and_is_gated_on_what_both_versions_have(tmp_path, tracking):
    """Your data with SugarCrepe only: the version registers with the groups it has; a gate compares what both versions
    were measured on, and a candidate without a group the champion has is not shown to keep it."""
    first = reg.register(_params(tmp_path, {"compositional": 0.70}))
    assert "summary.zero_shot" not in first.tags and first.tags["summary.compositional"] == "0.70000"
    assert reg.promote(_params(tmp_path, {"compositional": 0.70}), "challenger").promoted  # the first champion
    measured = _params(tmp_path, {"compositional": 0.72, "zero_shot": 0.90, "retrieval": 0.50})
    reg.register(measured)
    done = reg.promote(measured, "challenger")
    assert done.promoted and [g.name for g in done.gates] == ["compositional"]  # the champion had only that
    partial = _params(tmp_path, {"compositional": 0.80})
    reg.register(partial)
    with pytest.raises(reg.PromotionRefused) as refused:
        reg.promote(partial, "challenger")
    assert "zero_shot: not measured on this version" in str(refused.value) and "compositional" not in str(refused.value)


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
    # the same card beside the run's report, where a user looks after `make run`
    assert (tmp_path / "model-card.md").read_text() == card and "### Benchmarks against the base" in card

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
    import os
    import warnings

    os.environ["C2LIP_IMAGE_ROOT"] = str(REPO / "docs")  # the folder a served model may read images from
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # MLflow warns when a model loads by unpickling: this one does not
        model = mlflow.pyfunc.load_model("models:/c2lip-test@champion")
    local = mlflow.artifacts.download_artifacts("models:/c2lip-test@champion")
    assert not list(Path(local).rglob("*.pkl")), "a registered version holds no pickle"
    text = model.predict(pd.DataFrame({"text": ["A large red circle.", "A small blue square."]}))
    image = model.predict(pd.DataFrame({"image": ["shapesworld_contact_sheet.png"]}))
    assert text.shape == (2, 128) and image.shape == (1, 128)
    assert abs(float((text ** 2).sum(axis=1)[0]) - 1) < 1e-4
    # its signature says what it takes and gives; a frame with both columns is refused, not silently embedded as text
    schema = model.metadata.get_input_schema()
    assert schema.input_names() == ["text", "image"] and not any(c.required for c in schema.inputs)
    assert model.metadata.get_output_schema().inputs[0].shape == (-1, 128)
    with pytest.raises(Exception, match="both a 'text' and an 'image' column"):
        model.predict(pd.DataFrame({"text": ["a red circle"], "image": ["shapesworld_contact_sheet.png"]}))
    # the host's other files are not the caller's to read or to probe
    for outside in (str(REPO / "README.md"), "../README.md", "/etc/passwd", "/no/such/file.png"):
        with pytest.raises(Exception, match="outside the image folder"):
            model.predict(pd.DataFrame({"image": [outside]}))
    with pytest.raises(Exception, match="URLs are not supported"):
        model.predict(pd.DataFrame({"image": ["http://example.org/a.png"]}))
    with pytest.raises(Exception, match="text row 1: .*, not a string"):
        model.predict(pd.DataFrame({"text": ["a red circle", None]}))
    del os.environ["C2LIP_IMAGE_ROOT"]


class _FakeHub:
    """huggingface_hub's HfApi as the upload uses it, recording what it was asked (the Hub is unreachable here)."""

    def __init__(self, fail: str | None = None):
        self.calls, self.fail = [], fail

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw["private"]))

    def upload_folder(self, folder_path, repo_id, **kw):
        from pathlib import Path

        if self.fail:
            raise OSError(self.fail)
        from fnmatch import fnmatch

        kept = [p.name for p in Path(folder_path).iterdir() if not any(fnmatch(p.name, pattern) for pattern in kw["ignore_patterns"])]
        self.calls.append(("upload_folder", repo_id, sorted(kept)))
        return type("Commit", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/abc"})()


def test_publish_writes_the_folder_open_clip_loads_from_the_hub_with_the_evaluated_card(tmp_path):
    import open_clip
    import yaml

    params = _params(tmp_path, {"compositional": 0.70, "zero_shot": 0.90, "retrieval": 0.50, "binding": 0.6})
    hub = _FakeHub()
    where = reg.publish(params, tmp_path / "hub" / "c2lip-base", repo_id="someone/c2lip-base", license="apache-2.0", api=hub)
    folder = tmp_path / "hub" / "c2lip-base"
    assert where == "https://huggingface.co/someone/c2lip-base/commit/abc"
    files = ["README.md", "open_clip_config.json", "open_clip_model.safetensors"]
    assert hub.calls == [("create_repo", "someone/c2lip-base", True), ("upload_folder", "someone/c2lip-base", files)]
    card = (folder / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "apache-2.0" and front["library_name"] == "open_clip" and "base_model" not in front
    assert "| binding" in card and "0.550 | 0.600 | +0.050 |" in card
    assert 'open_clip.create_model_and_transforms("hf-hub:someone/c2lip-base")' in card
    # what open_clip reads from a Hub repository, read from the folder: the model loads and embeds
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    assert model.encode_text(open_clip.get_tokenizer(f"local-dir:{folder}")(["a red circle"])).shape[0] == 1

    # a second publish replaces its own folder; a user's folder is refused untouched; a failed upload is one line
    reg.publish(params, folder)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(reg.PublishError, match=r"mine holds 1 file\(s\) c2lip did not write there.*notes.txt"):
        reg.publish(params, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    with pytest.raises(reg.PublishError, match="someone/x: the upload failed: no token"):
        reg.publish(params, folder, repo_id="someone/x", api=_FakeHub(fail="no token"))
    with pytest.raises(reg.RegistryError, match="not a Hub repository id"):
        reg.publish(params, folder, repo_id="not an id")
