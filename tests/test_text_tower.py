"""A Hugging Face language model as the text tower (model.text_tower): built from a tiny BERT the tests save,
its last k layers trainable, exported and reloaded by open_clip alone, trained end to end by the train stage."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_S
from pydantic import ValidationError
from test_train import mlflow_env, run_stage, tiny_data, tiny_train, write_params  # noqa: F401  (fixtures)
from tiny_hf import tiny_bert

from components.method import models, optim
from components.shared.checkpoints import export_model
from components.shared.params import HFTextTowerParams, ParamsError, TrainParams


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def tower(bert: Path, **overrides) -> HFTextTowerParams:
    return HFTextTowerParams.model_validate({"hf_model_name": str(bert), "context_length": 16, **overrides})


def test_the_tower_loads_the_saved_weights_only_when_pretrained(bert):
    from transformers import AutoModel

    saved = AutoModel.from_pretrained(str(bert)).embeddings.word_embeddings.weight
    loaded, *_ = models.create_model(models.TINY_RN, text_tower=tower(bert, pretrained=True))
    fresh, *_ = models.create_model(models.TINY_RN, text_tower=tower(bert, pretrained=False))
    assert torch.equal(loaded.text.transformer.embeddings.word_embeddings.weight, saved)
    assert not torch.equal(fresh.text.transformer.embeddings.word_embeddings.weight, saved)


@pytest.mark.parametrize("unlocked", [None, 0, 1, 2])
def test_only_the_last_k_layers_and_the_projection_train(bert, unlocked):
    model, _, _, tokenizer = models.create_model(models.TINY_RN, text_tower=tower(bert, unlocked_layers=unlocked))
    text = model.text
    layers = models.hf_layers(text.transformer)
    trainable = [all(p.requires_grad for p in layer.parameters()) for layer in layers]
    frozen = [not any(p.requires_grad for p in layer.parameters()) for layer in layers]
    k = len(layers) if unlocked is None else unlocked
    assert trainable == [i >= len(layers) - k for i in range(len(layers))]
    assert frozen == [i < len(layers) - k for i in range(len(layers))]
    assert text.transformer.embeddings.word_embeddings.weight.requires_grad == (unlocked is None)
    assert all(p.requires_grad for p in text.proj.parameters())
    # a gradient step reaches exactly the trainable parameters
    loss = model.encode_text(tokenizer(["a red circle", "a blue square left of a green cross"])).square().sum()
    loss.backward()
    for name, p in text.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name


def test_asking_for_more_unlocked_layers_than_the_tower_has_is_an_error(bert):
    with pytest.raises(ValueError, match="unlocked_layers=3: the text tower has only 2 layers"):
        models.create_model(models.TINY_RN, text_tower=tower(bert, unlocked_layers=3))


def test_text_tower_params_are_validated():
    with pytest.raises(ValidationError, match="unlocked_layers"):
        HFTextTowerParams(hf_model_name="bert-base-uncased", unlocked_layers=-1)
    with pytest.raises(ValidationError, match="pooler"):
        HFTextTowerParams(hf_model_name="bert-base-uncased", pooler="attention")
    with pytest.raises(ValidationError, match="hf_model_name"):
        HFTextTowerParams(hf_model_name="")
    assert HFTextTowerParams(hf_model_name="bert-base-uncased").tokenizer_name == "bert-base-uncased"


def test_the_export_holds_the_tower_and_its_tokenizer_and_reloads_without_our_code(bert, tmp_path):
    model, _, _, tokenizer = models.create_model(models.TINY_RN, text_tower=tower(bert, unlocked_layers=1))
    out = export_model(model, models.TINY_RN, tmp_path / "export", model_cfg=models.model_config(models.TINY_RN, tower(bert)),
                       tokenizer=tokenizer)
    config = json.loads((out / "open_clip_config.json").read_text())["model_cfg"]["text_cfg"]
    assert config["hf_model_name"] == str(bert) and config["hf_model_pretrained"] is False
    assert (out / "tokenizer.json").is_file()
    probe = tmp_path / "probe.pt"
    script = (
        "import sys, torch, open_clip\n"
        f"model, _, _ = open_clip.create_model_and_transforms('local-dir:{out}')\n"
        f"tok = open_clip.get_tokenizer('local-dir:{out}')\n"
        "model.eval()\n"
        f"torch.save(model.encode_text(tok(['a red circle', 'a blue cross'])).detach(), {str(probe)!r})\n"
        "assert 'components' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.load(probe), model.encode_text(tokenizer(["a red circle", "a blue cross"])), rtol=1e-5, atol=1e-5)


def test_a_base_exported_without_the_tower_cannot_start_a_run_with_it(bert, tiny_data, tmp_path):  # noqa: F811
    model, *_ = models.create_model(models.TINY_RN)
    export = export_model(model, models.TINY_RN, tmp_path / "export")
    params = TrainParams.model_validate(tiny_train(tiny_data, tmp_path / "out", model={"init": str(export),
                                                                                        "text_tower": {"hf_model_name": str(bert)}}))
    with pytest.raises(ParamsError, match="exported with text tower open_clip .* asks for .*tiny_bert"):
        optim.build_model(params)


@pytest.mark.slow
def test_the_train_stage_fine_tunes_with_the_tower_and_exports_it(bert, tiny_data, tmp_path, mlflow_env):  # noqa: F811
    out = tmp_path / "out"
    cfg = tiny_train(tiny_data, out, steps=2, checkpoint_every=2, zero_shot_eval=False,
                     model={"text_tower": {"hf_model_name": str(bert), "context_length": 32, "unlocked_layers": 1}})
    done = run_stage(write_params(tmp_path / "p.yaml", cfg), mlflow_env)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["final_npc_loss"] > 0
    reloaded, *_ = models.create_model(models.TINY_RN, pretrained=str(out / "export" / "open_clip_model.safetensors"),
                                       text_tower=tower(bert, context_length=32))
    initial, *_ = models.create_model(models.TINY_RN, text_tower=tower(bert, context_length=32))
    # the frozen first layer is the saved BERT's; the unlocked last layer moved
    first = "transformer.encoder.layer.0.attention.self.query.weight"
    last = "transformer.encoder.layer.1.attention.self.query.weight"
    got, start = dict(reloaded.text.named_parameters()), dict(initial.text.named_parameters())
    assert torch.equal(got[first], start[first])
    assert not torch.equal(got[last], start[last])
