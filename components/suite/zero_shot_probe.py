"""The ShapesWorld zero-shot check the train stage runs every few steps (the evaluate stage has the
full suite)."""

from __future__ import annotations

import io
import json

import open_clip
import torch
import webdataset as wds
from PIL import Image

from components.shared.devices import placement, to_model
from components.shared.params import SHAPESWORLD_ZERO_SHOT_TEMPLATES


class ShapesWorldZeroShot:
    """Top-1 over the single-object test images, classes = every (color, shape) of the world, built with
    open_clip's zero-shot classifier; also on the held-out (never trained) pairs alone. The images are
    decoded once, so the check can run every few steps during training."""

    def __init__(self, shards: list[str], transform):
        self.images, self.labels, self.held = [], [], []
        colors, shapes = [], []
        for sample in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
            meta = json.loads(sample["json"])
            if meta.get("source") != "shapesworld":
                break  # another source: no ground truth to classify against
            for obj in meta["objects"]:  # the world's vocabulary, in order of appearance
                if obj["color"] not in colors:
                    colors.append(obj["color"])
                if obj["shape"] not in shapes:
                    shapes.append(obj["shape"])
            if len(meta["objects"]) == 1:
                obj = meta["objects"][0]
                self.images.append(transform(Image.open(io.BytesIO(sample["jpg"])).convert("RGB")))
                self.labels.append((obj["color"], obj["shape"]))
                self.held.append(bool(meta.get("has_held_out_pair")))
        self.classes = [(c, s) for c in colors for s in shapes]

    def __bool__(self) -> bool:
        return bool(self.images)

    @torch.no_grad()
    def __call__(self, model, tokenizer) -> dict[str, float]:
        if not self:
            return {}
        was_training = model.training
        model.eval()
        device = placement(model)[0]
        classifier = open_clip.build_zero_shot_classifier(
            model, tokenizer, classnames=[f"{c} {s}" for c, s in self.classes], templates=SHAPESWORLD_ZERO_SHOT_TEMPLATES,
            num_classes_per_batch=16, device=device,
        ).float()  # float32 as the features: a bf16 model's (DeepSpeed's bf16 engine) embeddings are compared in float32
        features = torch.cat([model.encode_image(to_model(torch.stack(self.images[i:i + 256]), model), normalize=True).float()
                              for i in range(0, len(self.images), 256)])
        model.train(was_training)
        predicted = [self.classes[int(i)] for i in (features @ classifier).argmax(dim=1)]
        correct = torch.tensor([p == t for p, t in zip(predicted, self.labels, strict=True)], dtype=torch.float)
        held = torch.tensor(self.held)
        out = {
            "zero_shot_top1": correct.mean().item(),
            "zero_shot_color_acc": sum(p[0] == t[0] for p, t in zip(predicted, self.labels, strict=True)) / len(predicted),
            "zero_shot_shape_acc": sum(p[1] == t[1] for p, t in zip(predicted, self.labels, strict=True)) / len(predicted),
            "zero_shot_images": float(len(predicted)),
        }
        if held.any():
            out["zero_shot_top1_held_out_pairs"] = correct[held].mean().item()
            out["zero_shot_top1_seen_pairs"] = correct[~held].mean().item()
            out.update(self.held_out_geometry(classifier, predicted))
        return out

    def held_out_geometry(self, classifier: torch.Tensor, predicted: list[tuple[str, str]]) -> dict[str, float]:
        """Where held-out pairs go: the share of held-out images classified as a pair seen in training, and how
        close each held-out class's prompt embedding lies to the nearest seen class's (cosine; for contrast, the
        same for seen classes among themselves). A model that folds unseen pairs onto seen ones raises both."""
        held_pairs = {label for label, h in zip(self.labels, self.held, strict=True) if h}
        seen_pairs = set(self.classes) - held_pairs
        held_images = [p for p, h in zip(predicted, self.held, strict=True) if h]
        weights = classifier.T  # [classes, D], normalised class embeddings
        index = {c: i for i, c in enumerate(self.classes)}

        def nearest_seen(pair: tuple[str, str]) -> float:
            others = [index[c] for c in self.classes if c in seen_pairs and c != pair]
            return float((weights[others] @ weights[index[pair]]).max()) if others else float("nan")  # a 1-pair world

        return {
            "zero_shot_held_out_predicted_as_seen": sum(p in seen_pairs for p in held_images) / len(held_images),
            "held_out_prompt_nearest_seen_cos": sum(nearest_seen(c) for c in held_pairs) / len(held_pairs),
            "seen_prompt_nearest_seen_cos": sum(nearest_seen(c) for c in seen_pairs) / max(len(seen_pairs), 1),
        }
