"""Device discipline: every place a model runs moves its inputs to the model's device and dtype (one helper,
components/shared/devices.py). A model cast to bf16 on the CPU refuses float32 inputs with the same error a CUDA
model gives CPU inputs ("Input type ... and weight type ... should be the same"), so these tests catch on 2 CPU
cores what would crash on a GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, tiny_captions, tiny_training_data
from PIL import Image

from components.method.models import create_model
from components.shared import devices
from components.shared.params import ParamsError, validate_params

ARCH = "c2lip-tiny-rn"  # a conv stem: the first layer to refuse an input of the wrong dtype


@pytest.fixture(scope="module")
def bf16_model():
    torch.manual_seed(0)
    model, _, preprocess, tokenizer = create_model(ARCH, pretrained=None)
    return devices.place_model(model.eval(), "cpu", "bf16"), preprocess, tokenizer


def _pictures(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]


def test_a_bf16_model_refuses_float32_inputs_and_takes_them_through_the_helper(bf16_model):
    model, preprocess, tokenizer = bf16_model
    pixels = torch.stack([preprocess(p) for p in _pictures(2)])
    with pytest.raises(RuntimeError, match="should be the same|same dtype|BFloat16"):
        model.encode_image(pixels)  # what every caller did before: the error a CUDA model gives CPU inputs
    assert devices.placement(model) == (torch.device("cpu"), torch.bfloat16)
    assert devices.to_model(pixels, model).dtype == torch.bfloat16
    tokens = tokenizer(["a red circle"])
    assert devices.to_model(tokens, model).dtype == tokens.dtype  # ids keep their integer type
    assert model.encode_image(devices.to_model(pixels, model)).shape[0] == 2


def test_the_learning_curves_and_the_suite_score_a_bf16_model(tmp_path, bf16_model):
    from components.study.tracking import TrackingSuite

    model, preprocess, tokenizer = bf16_model
    world = tmp_path / "captions.yaml"
    world.write_text(yaml.safe_dump(tiny_captions(tmp_path, shapesworld={"test_images": 40}).model_dump(mode="json")))
    train = yaml.safe_load((REPO / "params" / "train.yaml").read_text())
    train.update(output_dir=str(tmp_path / "run"), curves={"enabled": True, "images": 40, "captions_params": str(world)})
    figures = TrackingSuite(validate_params("train", train, "test"), preprocess)(model, tokenizer)
    # the slice's every group, zero-shot through open_clip's classifier included, scored by the bf16 model
    assert {"track/binding", "track/zero_shot", "track/retrieval", "track/swap_att"} <= set(figures)
    assert all(0 <= v <= 1 for k, v in figures.items() if k != "track/retrieval")


def test_the_probes_and_the_neighbour_images_run_a_bf16_model(tmp_path, bf16_model):
    from components.data.neighbours import embed_images
    from components.study import negatives_probe
    from components.study.binding_probe import image_features
    from components.suite.zero_shot_probe import ShapesWorldZeroShot

    model, preprocess, tokenizer = bf16_model
    pictures = _pictures(3)
    pooled, tokens = image_features(model, preprocess, pictures)
    assert pooled.shape[0] == 3 and tokens.shape[0] == 3 and pooled.dtype == np.float32
    assert embed_images(model, preprocess, pictures).dtype == torch.float32
    root = tiny_training_data(tmp_path, test_images=20)
    scenes = negatives_probe.crowded_scenes(str(root / "captions" / "train" / "*.tar"), 8)
    share, n = negatives_probe.prefers_caption(model, preprocess, tokenizer, scenes, "short")
    assert n > 0 and 0 <= share <= 1
    probe = ShapesWorldZeroShot([str(p) for p in sorted((root / "captions" / "test").glob("*.tar"))], preprocess)
    assert probe  # the world's one-object test images
    assert 0 <= probe(model, tokenizer)["zero_shot_top1"] <= 1


def test_the_pyfunc_embeds_texts_and_images_with_a_bf16_model(tmp_path, bf16_model, monkeypatch):
    from components.shared.pyfunc_model import IMAGE_ROOT_ENV, OpenClipEmbedder

    monkeypatch.setenv(IMAGE_ROOT_ENV, str(tmp_path))  # the one folder it reads images from

    embedder = OpenClipEmbedder()
    embedder.model, embedder.preprocess, embedder.tokenizer = bf16_model
    path = tmp_path / "p.png"
    _pictures(1)[0].save(path)
    texts = embedder.predict(None, pd.DataFrame({"text": ["a red circle", "a blue square"]}))
    images = embedder.predict(None, pd.DataFrame({"image": [path.name]}))
    assert texts.shape[0] == 2 and images.shape[0] == 1 and texts.dtype == np.float32
    assert np.allclose(np.linalg.norm(images, axis=1), 1, rtol=2e-2)


def test_the_evaluate_stage_names_a_device_this_machine_lacks_and_a_malformed_one():
    with pytest.raises(ParamsError, match="device"):
        validate_params("evaluate", {"device": "gpu0"}, "test")
    assert devices.resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert devices.resolve_device("auto") == torch.device("cpu")
        with pytest.raises(devices.DeviceError, match=r"'cuda:3'.*0 CUDA GPU"):
            devices.resolve_device("cuda:3")
    with pytest.raises(devices.DeviceError, match="precision 'int8'"):
        devices.place_model(torch.nn.Linear(2, 2), "cpu", "int8")


def test_a_report_scored_in_bf16_says_so_and_an_fp32_one_does_not():
    from components.suite.report import markdown_report

    said = "Scored with the weights in bf16"
    assert said in markdown_report([], {"a": {}}, ["a"], {"a": "x"}, precision="bf16")
    assert said not in markdown_report([], {"a": {}}, ["a"], {"a": "x"})


def test_a_c2lip_training_step_takes_its_batch_through_the_helper_on_a_bf16_model(bf16_model):
    from components.method.batches import concept_batch
    from components.method.losses import C2LIPLoss
    from components.method.module import TrainingModule

    model, preprocess, tokenizer = bf16_model
    module = TrainingModule(model, C2LIPLoss(lambda_xac=0.01))
    batch = {"images": torch.stack([preprocess(p) for p in _pictures(2)]),
             "texts": tokenizer(["a red circle above a blue square", "a green triangle"]),
             **concept_batch([["a red circle", "a blue square"], ["a green triangle"]], tokenizer)}
    with pytest.raises(RuntimeError, match="should be the same|same dtype|BFloat16"):
        module(**batch)  # as the train loop sent it before: DeepSpeed's bf16 engine casts weights, not inputs
    terms = module(**devices.batch_to_model(batch, module))
    assert {"contrastive_loss", "npc_loss", "xac_loss"} == set(terms) and all(torch.isfinite(v) for v in terms.values())
