"""Does a model tell a caption from NegCLIP's swap negative of it? The share of crowded ShapesWorld scenes where the
image prefers its caption over the caption's swap negative (the one NegCLIP trains on), per caption field, on training
and on test scenes — NegCLIP's own training signal, before and after fine-tuning.

    python -m components.study.negatives_probe --model base=models/base/export --model tuned=models/train/export \\
        [--scenes 512] [--fields long short]

A share near 0.5 on the training scenes' own negatives means the model cannot yet see what the loss asks of it; a share
that rises after NegCLIP on training scenes but not on test scenes is memorisation.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import sys
from pathlib import Path

import numpy as np
import torch


def crowded_scenes(pattern: str, count: int) -> list[tuple[bytes, dict]]:
    """(jpg, sample json) of the first ``count`` samples of the shards ``pattern`` that hold two or more objects."""
    import webdataset as wds

    found = []
    for shard in sorted(glob.glob(pattern)):
        for sample in wds.WebDataset(shard, shardshuffle=False):
            meta = json.loads(sample["json"])
            if len(meta.get("objects", [])) > 1:
                found.append((sample["jpg"], meta))
            if len(found) == count:
                return found
    return found


@torch.no_grad()
def prefers_caption(model, preprocess, tokenizer, scenes: list[tuple[bytes, dict]], field: str, seed: int = 0) -> tuple[float, int]:
    """(share of scenes whose image is nearer its ``field`` caption than that caption's swap negative, scenes with one)."""
    from PIL import Image

    from components.method.batches import caption_hard_examples
    from components.shared.devices import to_model
    from components.shared.params import HardExampleParams

    settings = HardExampleParams()
    rng = np.random.default_rng(seed)
    vocabulary = sorted({(o["color"], o["shape"]) for _, meta in scenes for o in meta["objects"]})
    images, captions, negatives = [], [], []
    for jpg, meta in scenes:
        caption = meta["captions"][field]
        swaps, _ = caption_hard_examples(caption, meta, rng, vocabulary, settings, False, None, "negclip")
        if swaps:
            images.append(preprocess(Image.open(io.BytesIO(jpg)).convert("RGB")))
            captions.append(caption)
            negatives.append(swaps[0])
    if not images:
        return float("nan"), 0
    image = model.encode_image(to_model(torch.stack(images), model), normalize=True).float()
    caption = model.encode_text(to_model(tokenizer(captions), model), normalize=True).float()
    negative = model.encode_text(to_model(tokenizer(negatives), model), normalize=True).float()
    return float(((image * caption).sum(-1) > (image * negative).sum(-1)).float().mean()), len(images)


def run(models: dict[str, str], scenes: int, fields: list[str], train: str, test: str, device: str = "auto") -> dict:
    from components.shared.params import EvalModelSpec
    from components.suite.model_loading import load_model, resolve_model

    splits = {"train": crowded_scenes(train, scenes), "test": crowded_scenes(test, scenes)}
    if not splits["train"] or not splits["test"]:
        raise ValueError(f"no crowded ShapesWorld scenes in {train if not splits['train'] else test} (run the captions stage first)")
    result = {"scenes": {k: len(v) for k, v in splits.items()}, "models": {}}
    for name, uri in models.items():
        spec = EvalModelSpec(name=name, uri=uri)
        model, preprocess, tokenizer = load_model(*resolve_model(spec, Path("data/evaluate_cache/downloads")), spec, device)
        row = {}
        for split, data in splits.items():
            for field in fields:
                share, n = prefers_caption(model, preprocess, tokenizer, data, field)
                row[f"{split}/{field}"] = round(share, 4)
                row[f"{split}/{field}/scenes"] = n
        result["models"][name] = row
        print(f"negatives probe: {name}: {row}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.study.negatives_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=EXPORT", help="an export folder (repeat for several)")
    parser.add_argument("--scenes", type=int, default=512, help="crowded scenes per split")
    parser.add_argument("--fields", nargs="+", default=["long", "short"], help="caption fields of ShapesWorld to probe")
    parser.add_argument("--train-shards", default="data/captions/train/*.tar")
    parser.add_argument("--test-shards", default="data/captions/test/*.tar")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--device", default="auto", help="where the models run: auto (a GPU when present), cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    from components.study.binding_probe import named_models

    models = named_models(parser, args.model)
    try:
        result = run(models, args.scenes, args.fields, args.train_shards, args.test_shards, args.device)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from components.study.probe_output import emit

    return emit(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
