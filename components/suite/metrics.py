"""The benchmark suite's metrics (docs/architecture.md "Benchmark formats"), as pure functions of similarity scores.

The evaluate stage encodes images and texts and hands these functions cosine similarities; nothing
here reads files or models, so every metric is tested exactly on hand-made scores.

Ties follow each benchmark's official script (docs/architecture.md "Tie rules"): a tie counts as wrong
(`>` not `>=`) in SugarCrepe, SugarCrepe++, the hard positives, ARO VG-Relation/VG-Attribution (the
false caption comes first in ARO's argmax) and Winoground; in ARO's order benchmarks the true caption
comes first in the argmax, so a tie counts as right there (the ties-wrong figure is kept as a labelled
extra). Zero-shot and retrieval rank ties pessimistically (the official scripts use torch.topk, whose
order among equal scores is unspecified; with real embeddings ties do not occur).
"""

from __future__ import annotations

import torch


def _check_same_shape(**tensors: torch.Tensor) -> int:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"scores must have one shape, got {shapes}")
    n = next(iter(tensors.values())).shape[0]
    if n == 0:
        raise ValueError("no items: an empty benchmark has no score")
    return n


# Each benchmark's rule comes twice: per item (``*_items``: one outcome per item, what the per-item tables hold and
# the report aggregates) and as the mean the official scripts print (tested equal on hand-made scores).


def pairwise_items(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """SugarCrepe, ARO relation/attribution items: s(image, caption) > s(image, negative), per item."""
    _check_same_shape(positive=positive, negative=negative)
    return positive > negative


def pairwise_accuracy(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """SugarCrepe, ARO relation/attribution items: mean[s(image, caption) > s(image, negative)]."""
    return pairwise_items(positive, negative).float().mean().item()


def sugarcrepe_pp(image_p1: torch.Tensor, image_p2: torch.Tensor, image_n: torch.Tensor,
                  p1_p2: torch.Tensor, p1_n: torch.Tensor, p2_n: torch.Tensor) -> dict[str, float]:
    """SugarCrepe++: ITT = both positive captions beat the negative for the image; TOT = the two
    positives are closer to each other than either is to the negative (text only)."""
    items = sugarcrepe_pp_items(image_p1, image_p2, image_n, p1_p2, p1_n, p2_n)
    return {k: v.float().mean().item() for k, v in items.items()}


def sugarcrepe_pp_items(image_p1: torch.Tensor, image_p2: torch.Tensor, image_n: torch.Tensor,
                        p1_p2: torch.Tensor, p1_n: torch.Tensor, p2_n: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`sugarcrepe_pp` per item."""
    _check_same_shape(image_p1=image_p1, image_p2=image_p2, image_n=image_n, p1_p2=p1_p2, p1_n=p1_n, p2_n=p2_n)
    return {"itt": (image_p1 > image_n) & (image_p2 > image_n), "tot": (p1_p2 > p1_n) & (p1_p2 > p2_n)}


def hard_positives(caption: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> dict[str, float]:
    """Hard positives (arXiv 2409.17958), scores of the image with c, c_p and c_n: original accuracy
    mean[s(c) > s(c_n)], augmented accuracy mean[s(c) > s(c_n) and s(c_p) > s(c_n)], brittleness
    mean[c_n ranked strictly between c and c_p]."""
    return {k: v.float().mean().item() for k, v in hard_positive_items(caption, positive, negative).items()}


def hard_positive_items(caption: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`hard_positives` per item."""
    _check_same_shape(caption=caption, positive=positive, negative=negative)
    low, high = torch.minimum(caption, positive), torch.maximum(caption, positive)
    return {"original_acc": caption > negative, "augmented_acc": (caption > negative) & (positive > negative),
            "brittleness": (low < negative) & (negative < high)}


def macro_accuracy(correct: torch.Tensor, groups: list[str], counted: set[str] | None = None) -> dict[str, float]:
    """ARO VG-Relation / VG-Attribution: the mean over groups (relations, attribute pairs) of each group's
    accuracy, so frequent relations do not dominate. ``macro_acc`` averages the ``counted`` groups only
    (ARO's official figure leaves some out; None: all), ``macro_acc_all_groups`` every group present,
    ``micro_acc`` the items; ``groups`` is the number of groups in ``macro_acc``. With no counted group
    present (a subset of items), ``macro_acc`` is left out."""
    if len(groups) != correct.shape[0]:
        raise ValueError(f"{correct.shape[0]} results but {len(groups)} group labels")
    if not groups:
        raise ValueError("no items: an empty benchmark has no score")
    per_group: dict[str, list[float]] = {}
    for ok, group in zip(correct.float().tolist(), groups, strict=True):
        per_group.setdefault(group, []).append(ok)
    means = {g: sum(v) / len(v) for g, v in per_group.items()}
    chosen = [m for g, m in means.items() if counted is None or g in counted]
    out = {"macro_acc_all_groups": sum(means.values()) / len(means), "micro_acc": correct.float().mean().item(),
           "groups": float(len(chosen))}
    if chosen:
        out["macro_acc"] = sum(chosen) / len(chosen)
    return out


def order_precision_at_1(true_caption: torch.Tensor, shuffled: torch.Tensor, ties_count_right: bool = True) -> float:
    """ARO COCO/Flickr order ([N] and [N, k] scores): the true caption is the model's pick among itself and
    its shuffles. ARO's script takes the argmax with the true caption first, so a shuffle scoring the same
    (an unchanged or identical shuffle) leaves the pick right; ``ties_count_right=False`` counts it wrong."""
    return order_items(true_caption, shuffled, ties_count_right).float().mean().item()


def order_items(true_caption: torch.Tensor, shuffled: torch.Tensor, ties_count_right: bool = True) -> torch.Tensor:
    """:func:`order_precision_at_1` per item."""
    if shuffled.ndim != 2 or shuffled.shape[0] != true_caption.shape[0]:
        raise ValueError(f"shuffled scores must be [N, k] with N = {true_caption.shape[0]}, got {tuple(shuffled.shape)}")
    if true_caption.shape[0] == 0:
        raise ValueError("no items: an empty benchmark has no score")
    best_shuffle = shuffled.max(dim=1).values
    return true_caption >= best_shuffle if ties_count_right else true_caption > best_shuffle


def winoground(scores: torch.Tensor) -> dict[str, float]:
    """Winoground-style pairs, ``scores[n, i, c]`` = s(image_i, caption_c) of pair n: text score (each
    image prefers its own caption), image score (each caption prefers its own image), group (both)."""
    return {k: v.float().mean().item() for k, v in winoground_items(scores).items()}


def winoground_items(scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`winoground` per pair."""
    if scores.ndim != 3 or scores.shape[1:] != (2, 2):
        raise ValueError(f"scores must be [N, 2, 2] (pair, image, caption), got {tuple(scores.shape)}")
    if scores.shape[0] == 0:
        raise ValueError("no items: an empty benchmark has no score")
    s = scores
    text = (s[:, 0, 0] > s[:, 0, 1]) & (s[:, 1, 1] > s[:, 1, 0])
    image = (s[:, 0, 0] > s[:, 1, 0]) & (s[:, 1, 1] > s[:, 0, 1])
    return {"text": text, "image": image, "group": text & image}


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Zero-shot classification: the true class counts as within the top k only when fewer than k classes
    score at least as high as it (a tie with a wrong class is a miss)."""
    rank = class_rank(logits, labels)
    return {f"top{k}": (rank < k).float().mean().item() for k in ks}


def class_rank(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per image, how many other classes score at least as high as the true one (0: top-1; ties pessimistic)."""
    if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits must be [N, classes] with N = {labels.shape[0]}, got {tuple(logits.shape)}")
    if labels.shape[0] == 0:
        raise ValueError("no items: an empty benchmark has no score")
    target = logits.gather(1, labels[:, None])
    return (logits >= target).sum(dim=1) - 1


def retrieval_recall(similarity: torch.Tensor, text_image: torch.Tensor, ks: tuple[int, ...] = (1, 5, 10),
                     queries: torch.Tensor | None = None) -> dict[str, float]:
    """Retrieval (Karpathy splits): ``similarity`` [images, texts], ``text_image`` [texts] the image of
    each caption. image→text R@k: one of the image's captions is among its k best texts; text→image
    R@k: the caption's image is among its k best images. Ties rank pessimistically. ``queries`` (bool
    [images]) averages over those images and their captions only, still ranked against every candidate."""
    n_images = similarity.shape[0]
    rank_i2t, rank_t2i = retrieval_ranks(similarity, text_image)
    image_queries = torch.ones(n_images, dtype=torch.bool) if queries is None else queries
    text_queries = image_queries[text_image]
    if not image_queries.any():
        raise ValueError("no query images: an empty benchmark has no score")
    out = {}
    for k in ks:
        out[f"image_to_text_r{k}"] = (rank_i2t[image_queries] < k).float().mean().item()
        out[f"text_to_image_r{k}"] = (rank_t2i[text_queries] < k).float().mean().item()
    return out


def retrieval_ranks(similarity: torch.Tensor, text_image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`retrieval_recall` per query: (per image, the rank of its best own caption among all texts; per text,
    the rank of its image among all images), 0 = first, ties pessimistic."""
    n_images, n_texts = similarity.shape
    if text_image.shape != (n_texts,):
        raise ValueError(f"text_image must hold one image index per text ({n_texts}), got {tuple(text_image.shape)}")
    if n_images == 0 or n_texts == 0:
        raise ValueError("no items: an empty benchmark has no score")
    own = text_image[None, :] == torch.arange(n_images)[:, None]  # [images, texts]
    if not own.any(dim=1).all():
        raise ValueError("every image needs at least one caption")
    # text→image: rank of the caption's own image among all images
    true_t2i = similarity.gather(0, text_image[None, :]).squeeze(0)  # [texts]
    rank_t2i = (similarity >= true_t2i[None, :]).sum(dim=0) - 1
    # image→text: rank of the image's best-scoring own caption among all texts
    best_own = similarity.masked_fill(~own, float("-inf")).max(dim=1).values  # [images]
    rank_i2t = (similarity.masked_fill(own, float("-inf")) >= best_own[:, None]).sum(dim=1)
    return rank_i2t, rank_t2i
