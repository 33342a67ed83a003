"""Scoring a model on a loaded suite: every distinct image (file + crop box) and text encoded once and shared by
every benchmark that uses it, open_clip's zero-shot classifiers, and each task's per-item table
(:mod:`components.suite.items`). Used by the evaluate stage and, on a small slice, by the learning curves
(components/study/tracking.py)."""

from __future__ import annotations

import os
import sys

import pyarrow as pa
import torch
from PIL import Image

from components.shared.devices import placement, to_model
from components.shared.params import EvaluateParams
from components.shared.progress import TimedBar
from components.suite import formats, items
from components.suite.loading import SuiteError


class _Images(torch.utils.data.Dataset):
    def __init__(self, refs: list[formats.ImageRef], preprocess):
        self.refs, self.preprocess = refs, preprocess

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, k: int) -> torch.Tensor:
        ref = self.refs[k]
        try:
            image = Image.open(ref.path).convert("RGB")
        except Exception as err:
            raise SuiteError(f"{ref.path}: cannot read the image ({err})") from None
        if ref.box is not None:
            x, y, w, h = ref.box
            image = image.crop((x, y, x + w, y + h))
        return self.preprocess(image)


GPU_LOADER_WORKERS = 8  # a ViT-B/16 on one GPU scores ~8 decoders' worth of 224 px JPEGs


def loader_workers(workers: int | None, on_gpu: bool) -> int:
    """The image loader's processes: ``workers`` when given; else none on the CPU (decoding would take the cores the
    model computes on) and up to 8 on a GPU (the CPU's only work is decoding), leaving one core to the main process."""
    if workers is not None:
        return workers
    return min(GPU_LOADER_WORKERS, max((os.cpu_count() or 1) - 1, 0)) if on_gpu else 0


@torch.no_grad()
def encode_images(model, preprocess, refs: list[formats.ImageRef], batch: int, workers: int | None, desc: str,
                  progress: bool = True) -> torch.Tensor:
    """L2-normalised embeddings [len(refs), D], float32 on the CPU, in order. The batches follow the model (its device
    and dtype); on a GPU they are decoded into pinned memory and copied without blocking, so decoding the next batch
    overlaps the model's work on this one."""
    on_gpu = placement(model)[0].type == "cuda"
    loader = torch.utils.data.DataLoader(_Images(refs, preprocess), batch_size=batch, num_workers=loader_workers(workers, on_gpu),
                                         pin_memory=on_gpu)
    # kept on the model's device until the end: one copy back, not one host synchronisation per batch
    out = [model.encode_image(to_model(x, model, non_blocking=True), normalize=True)
           for x in TimedBar(loader, desc=desc, unit="batch", file=sys.stderr, leave=False, disable=not progress)]
    return torch.cat(out).float().cpu()


@torch.no_grad()
def encode_texts(model, tokenizer, texts: list[str], batch: int, desc: str, progress: bool = True) -> torch.Tensor:
    """L2-normalised embeddings [len(texts), D], float32 on the CPU, in order."""
    out = [model.encode_text(to_model(tokenizer(texts[k:k + batch]), model), normalize=True)
           for k in TimedBar(range(0, len(texts), batch), desc=desc, unit="batch", file=sys.stderr, leave=False, disable=not progress)]
    return torch.cat(out).float().cpu()


def build_classifiers(model, tokenizer, tasks: list[formats.Task]) -> dict[str, torch.Tensor]:
    """This model's class embeddings [classes, D] per zero-shot task name (open_clip's classifier:
    templates averaged per class), float32 on the CPU. Returned, never stored on the shared tasks: see formats.Task."""
    import open_clip

    device = placement(model)[0]  # open_clip moves the tokens there; their dtype is the model's own (ids)
    return {
        task.name: open_clip.build_zero_shot_classifier(
            model, tokenizer, classnames=task.needs_classifier["classnames"], templates=task.needs_classifier["templates"],
            num_classes_per_batch=16, device=device,
        ).float().cpu().T
        for task in tasks if task.needs_classifier is not None
    }


def score_task(task: formats.Task, images: torch.Tensor, texts: torch.Tensor) -> pa.Table:
    """The task's per-item table for one model: every item's scores and outcomes (:mod:`components.suite.items`)."""
    return items.item_table(task.name, task.headline, task.layout, task.score_items(images, texts))


def results_of(tables: dict[str, pa.Table]) -> dict[str, dict[str, float]]:
    """Each task's figures, aggregated from its per-item table: all items, then the held-out and the seen apart."""
    return {name: items.results_of(table) for name, table in tables.items()}


def evaluate_shared(model, preprocess, tokenizer, tasks: list[formats.Task], params: EvaluateParams, label: str = "",
                    progress: bool = True) -> dict[str, pa.Table]:
    """Every task's per-item table, with each distinct image and text encoded once for all of them."""
    image_index: dict[formats.ImageRef, int] = {}
    text_index: dict[str, int] = {}
    for task in tasks:
        for ref in task.images:
            image_index.setdefault(ref, len(image_index))
        for text in task.texts:
            text_index.setdefault(text, len(text_index))
    images = encode_images(model, preprocess, list(image_index), params.image_batch, params.workers, f"{label} images", progress)
    texts = (encode_texts(model, tokenizer, list(text_index), params.text_batch, f"{label} texts", progress) if text_index
             else torch.zeros(0, images.shape[1]))
    classifiers = build_classifiers(model, tokenizer, tasks)
    results = {}
    for task in tasks:
        I = images[torch.tensor([image_index[r] for r in task.images], dtype=torch.long)]
        if task.needs_classifier is not None:
            T = classifiers[task.name]
        else:
            T = texts[torch.tensor([text_index[t] for t in task.texts], dtype=torch.long)] if task.texts else texts
        results[task.name] = score_task(task, I, T)
    return results
