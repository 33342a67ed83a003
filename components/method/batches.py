"""Batch builders, one per method: what a training batch holds beyond images and captions (C2LIP's
concept batch, the hard-example rows of NegCLIP and hard positives + negatives, CLIC's pair batches).

A builder is ``build(decoded, context) -> dict[str, Tensor]``: ``decoded`` is the micro-batch's samples as
(key, scene metadata, caption, PIL image), ``context`` (:class:`BatchContext`) the transform, tokenizer,
phrases and the batch's seeded random generator. The keys a builder writes are the arguments of its
loss module's ``step`` (:mod:`components.method.losses`). Every random choice comes from the context's
generator or torch's RNG, both seeded per batch by the caller, so a resumed run sees the same batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from components.data.stream import BatchContext, sample_sentences, split_sentences
from components.method.hard_examples import (
    caption_negatives,
    caption_positives,
    clic_negative,
    clic_positives,
    parse_shapes_caption,
    real_negatives,
    real_positive,
    shapesworld_pair_negative_is_false,
    shapesworld_tokens,
    spacy_tokens,
)
from components.method.models import trim_padding

Decoded = tuple[str, dict, str, Image.Image]  # key, scene metadata, caption, image


def concept_batch(phrases_per_image: list[list[str]], tokenizer, trim: bool = False) -> dict[str, torch.Tensor]:
    """Tokens of a batch's distinct phrases and, for every phrase occurrence, its row and its image.

    Returns ``phrase_tokens`` [U, L] (U distinct phrases, in order of first occurrence, tokenized like
    captions; with ``trim`` cut to the longest phrase, :func:`~components.method.models.trim_padding`),
    ``phrase_inverse`` [K] (row of each occurrence) and ``phrase_image_index`` [K] (the local index of the
    image each occurrence belongs to).
    """
    rows: dict[str, int] = {}
    inverse, owner = [], []
    for image, phrases in enumerate(phrases_per_image):
        for phrase in phrases:
            inverse.append(rows.setdefault(phrase, len(rows)))
            owner.append(image)
    distinct = list(rows)
    tokens = tokenizer(distinct) if distinct else torch.zeros(0, getattr(tokenizer, "context_length", 77), dtype=torch.long)
    if trim:
        tokens = trim_padding(tokens)
    return {
        "phrase_tokens": tokens,
        "phrase_inverse": torch.tensor(inverse, dtype=torch.long),
        "phrase_image_index": torch.tensor(owner, dtype=torch.long),
    }


def _images_and_captions(decoded: list[Decoded], ctx: BatchContext) -> tuple[torch.Tensor, list[str]]:
    """Transformed images and the captions the batch trains on (sentence sampling and phrases-as-captions
    applied, per sample, in sample order)."""
    data = ctx.params.data
    images, captions = [], []
    for key, _, caption, image in decoded:
        images.append(ctx.transform(image))
        if data.sentence_sampling is not None:
            caption = sample_sentences(caption, data.sentence_sampling.min_sentences, data.sentence_sampling.max_sentences)
        if data.phrases_as_captions > 0 and float(torch.rand(())) < data.phrases_as_captions and ctx.phrases[key]:
            caption = ctx.phrases[key][int(torch.randint(len(ctx.phrases[key]), ()))]
        captions.append(caption)
    return torch.stack(images), captions


def captions_batch(decoded: list[Decoded], ctx: BatchContext) -> dict[str, torch.Tensor]:
    """``siglip``: images [B, 3, H, W] and caption tokens [B, L]."""
    images, captions = _images_and_captions(decoded, ctx)
    return {"images": images, "texts": ctx.tokenizer(captions)}


def concepts_batch(decoded: list[Decoded], ctx: BatchContext) -> dict[str, torch.Tensor]:
    """``c2lip``: the captions batch plus every image's noun phrases (:func:`concept_batch`)."""
    batch = captions_batch(decoded, ctx)
    batch.update(concept_batch([ctx.phrases[key] for key, *_ in decoded], ctx.tokenizer, ctx.trim_phrases))
    return batch


def hard_negatives_batch(decoded: list[Decoded], ctx: BatchContext) -> dict[str, torch.Tensor]:
    """``negclip``: the captions batch plus each caption's hard negatives as extra text rows."""
    return _with_hard_examples(decoded, ctx, want_positive=False)


def hard_positives_negatives_batch(decoded: list[Decoded], ctx: BatchContext) -> dict[str, torch.Tensor]:
    """``hp_hn``: the captions batch plus each caption's hard negatives and one hard positive."""
    return _with_hard_examples(decoded, ctx, want_positive=True)


def _with_hard_examples(decoded: list[Decoded], ctx: BatchContext, want_positive: bool) -> dict[str, torch.Tensor]:
    """Extra text rows with the image each belongs to (``extra_texts``, ``extra_owner``, ``extra_positive``).
    A caption where no rule applies adds none."""
    images, captions = _images_and_captions(decoded, ctx)
    batch = {"images": images, "texts": ctx.tokenizer(captions)}
    settings = ctx.params.method.hard_examples
    vocabulary = sorted({(o["color"], o["shape"]) for _, meta, *_ in decoded for o in meta.get("objects", [])})
    texts, owners, positive = [], [], []
    for i, ((_, meta, _, _), caption) in enumerate(zip(decoded, captions, strict=False)):
        negatives, positives = caption_hard_examples(caption, meta, ctx.rng, vocabulary, settings, want_positive, ctx.nlp,
                                                     ctx.params.method.name)
        for text in negatives[:settings.negatives_per_caption]:
            texts.append(text), owners.append(i), positive.append(False)
        if positives:
            texts.append(positives[0]), owners.append(i), positive.append(True)
    if not texts:  # keeps every batch's keys the same (ranks gather them together)
        batch.update(extra_texts=ctx.tokenizer([""])[:0], extra_owner=torch.zeros(0, dtype=torch.long),
                     extra_positive=torch.zeros(0, dtype=torch.bool))
    else:
        batch.update(extra_texts=ctx.tokenizer(texts), extra_owner=torch.tensor(owners), extra_positive=torch.tensor(positive))
    return batch


def caption_hard_examples(caption: str, meta: dict, rng: np.random.Generator, vocabulary, settings, want_positive: bool,
                          nlp: Callable[[str], Any], method: str = "negclip") -> tuple[list[str], list[str]]:
    """(hard negatives, hard positives) of one caption, each list in random order: exact edits for a
    ShapesWorld caption, spaCy rules otherwise."""
    if meta.get("source") == "shapesworld" and (parsed := parse_shapes_caption(caption)) is not None:
        negatives = [c.text() for c in caption_negatives(parsed, meta, rng, vocabulary, settings.kinds_for(method)).values()]
        positives = [c.text() for k, c in caption_positives(parsed).items() if k in settings.positive_kinds] if want_positive else []
    elif meta.get("source") == "shapesworld":
        return [], []  # a phrase or the raw alt-text: no claims to edit
    else:
        doc = nlp(settings.spacy_model)(caption)
        negatives = real_negatives(doc, rng)
        positive = real_positive(doc, rng) if want_positive else None
        positives = [positive] if positive else []
    order = rng.permutation(len(negatives))
    return [negatives[k] for k in order], [positives[k] for k in rng.permutation(len(positives))]


def clic_batch(decoded: list[Decoded], ctx: BatchContext) -> dict[str, torch.Tensor]:
    """``clic``: a pair batch on every other optimiser step (by step, so every rank agrees), the captions
    batch on the others."""
    if (ctx.index // ctx.accumulation) % 2:
        return captions_batch(decoded, ctx)
    return clic_pair_batch(decoded, ctx)


def clic_pair_batch(decoded: list[Decoded], ctx: BatchContext) -> dict[str, torch.Tensor]:
    """CLIC's pair step: every image concatenated with a partner of the same orientation (side by side
    when tall or square, stacked when wide; which comes first at random), resized back to the image's
    size; the four positives and the word-swap negative of each pair."""
    rng = ctx.rng
    images, positives, negatives, has_negative = [], [[], [], [], []], [], []
    for i, j in pair_indices([img.size for *_, img in decoded], rng):
        if rng.random() < 0.5:
            i, j = j, i
        (_, meta_a, cap_a, img_a), (_, meta_b, cap_b, img_b) = decoded[i], decoded[j]
        images.append(ctx.transform(concatenate_pair(img_a, img_b)))
        first, second = split_sentences(cap_a), split_sentences(cap_b)
        for k, text in enumerate(clic_positives(first, second, rng)):
            positives[k].append(text)
        if meta_a.get("source") == "shapesworld" and meta_b.get("source") == "shapesworld":  # exact: word classes and truth
            tokens_a, tokens_b = shapesworld_tokens(first[0], meta_a), shapesworld_tokens(second[0], meta_b)
            negative = clic_negative(first[0], second[0], tokens_a, tokens_b, rng,
                                     is_false=lambda x, y, a=meta_a, b=meta_b: shapesworld_pair_negative_is_false(x, y, a, b))
        else:
            nlp = ctx.nlp(ctx.params.method.clic.spacy_model)
            negative = clic_negative(first[0], second[0], spacy_tokens(nlp(first[0])), spacy_tokens(nlp(second[0])), rng)
        negatives.append(negative or "")
        has_negative.append(negative is not None)
    return {"images": torch.stack(images), "texts": ctx.tokenizer([t for block in positives for t in block]),
            "clic_negative_texts": ctx.tokenizer(negatives), "clic_has_negative": torch.tensor(has_negative)}


def pair_indices(sizes: list[tuple[int, int]], rng: np.random.Generator) -> list[tuple[int, int]]:
    """For every image i a partner j != i of the same orientation (tall, wide, square) where the batch has
    one (any other image otherwise): each orientation group in random order, paired with its successor."""
    groups: dict[int, list[int]] = {}
    for i, (w, h) in enumerate(sizes):
        groups.setdefault((w > h) - (w < h), []).append(i)
    partner = {}
    for members in groups.values():
        order = [members[k] for k in rng.permutation(len(members))]
        for k, i in enumerate(order):
            partner[i] = order[(k + 1) % len(order)]
    for i in partner:
        if partner[i] == i and len(sizes) > 1:  # alone in its orientation
            partner[i] = int(rng.choice([j for j in range(len(sizes)) if j != i]))
    return [(i, partner[i]) for i in range(len(sizes))]


def concatenate_pair(first: Image.Image, second: Image.Image) -> Image.Image:
    """Side by side for tall or square images, stacked for wide ones, then resized to the first's size
    (the model sees both at its usual resolution; CLIC resizes the composite likewise)."""
    w, h = first.size
    if w > h:
        out = Image.new("RGB", (w, 2 * h))
        out.paste(first, (0, 0)), out.paste(second.resize((w, h)), (0, h))
    else:
        out = Image.new("RGB", (2 * w, h))
        out.paste(first, (0, 0)), out.paste(second.resize((w, h)), (w, 0))
    return out.resize((w, h), Image.Resampling.BILINEAR)
