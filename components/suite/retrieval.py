"""Retrieval in the Karpathy-split format (COCO, Flickr30k; ShapesWorld's test split): one row per image query and
one per caption query, R@1/5/10 both ways and their mean R@1 (:mod:`components.suite.metrics` ranks ties
pessimistically)."""

from __future__ import annotations

from pathlib import Path

import torch

from components.suite import metrics
from components.suite.formats import ImageRef, Task, read_karpathy
from components.suite.items import ItemScores, Layout


def retrieval(path: Path, image_root: Path, name: str, split: str) -> Task:
    """Karpathy-format retrieval: R@1/5/10 image→text and text→image."""
    rows = read_karpathy(path, split)
    images, texts, text_image, held = [], [], [], []
    for n, (image, captions, flag) in enumerate(rows):
        images.append(ImageRef(image_root / image))
        held.append(flag)
        for c in captions:
            texts.append(c)
            text_image.append(n)
    # texts are kept per caption (not deduplicated): two images may share a caption, each its own copy
    score, layout = retrieval_scorer(images, texts, text_image, held)
    return Task(name, "retrieval", "mean_r1", images, texts, len(images), score, layout, str(path))


def retrieval_scorer(images: list[ImageRef], texts: list[str], text_image: list[int], held: list[bool]):
    """A retrieval task's rows and score_items: one row per image query (image→text: the rank of its best own caption
    among all texts) and one per caption query (text→image: the rank of its image among all images), R@1/5/10 as
    0/1 per row; a held-out image's captions are held-out queries too, ranked against every candidate."""
    owner = torch.tensor(text_image)
    own_texts: list[list[str]] = [[] for _ in images]
    for text, k in zip(texts, text_image, strict=True):
        own_texts[k].append(text)
    n, m = len(images), len(texts)
    layout = Layout([f"image {k}" for k in range(n)] + [f"text {k}" for k in range(m)],
                    [[ref] for ref in images] + [[images[k]] for k in text_image],
                    own_texts + [[t] for t in texts], [["caption"] * len(t) for t in own_texts] + [["caption"]] * m,
                    held + [held[k] for k in text_image], query=["image"] * n + ["text"] * m, unit=list(range(n)) + list(text_image),
                    aggregation="retrieval")
    nan_i, nan_t = torch.full((n,), float("nan"), dtype=torch.float64), torch.full((m,), float("nan"), dtype=torch.float64)

    def score(I, T):
        sim = I @ T.T
        rank_i2t, rank_t2i = metrics.retrieval_ranks(sim, owner)
        outcomes = {}
        for k in (1, 5, 10):
            outcomes[f"image_to_text_r{k}"] = torch.cat([(rank_i2t < k).double(), nan_t])
            outcomes[f"text_to_image_r{k}"] = torch.cat([nan_i, (rank_t2i < k).double()])
        own = owner[None, :] == torch.arange(n)[:, None]
        best_own = sim.masked_fill(~own, float("-inf")).max(dim=1).values
        best_other_text = sim.masked_fill(own, float("-inf")).max(dim=1).values
        own_image = sim.gather(0, owner[None, :]).squeeze(0)
        best_other_image = sim.scatter(0, owner[None, :], float("-inf")).max(dim=0).values
        scores = torch.stack([torch.cat([best_own, own_image]), torch.cat([best_other_text, best_other_image])], dim=1)
        predicted = [texts[k] for k in sim.argmax(dim=1).tolist()] + [str(images[k].path) for k in sim.argmax(dim=0).tolist()]
        return ItemScores(["s(query, own)", "s(query, best other)"], scores, outcomes,
                          torch.cat([rank_i2t < 1, rank_t2i < 1]), predicted)

    return score, layout
