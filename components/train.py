"""The base and train stages: DeepSpeed training of an open_clip model with ``siglip`` or ``c2lip``.

    python -m components.train --params params/train.yaml            # the train stage (dvc repro train)
    python -m components.train --params params/base.yaml             # the base stage (from scratch)
    torchrun --nproc_per_node 8 -m components.train --params ...     # or: deepspeed --num_gpus 8 --module ...

The same code runs on CPU (gloo) and GPU (NCCL), in one process or many. Started with plain ``python``
and ``processes: N > 1`` it re-launches itself under torchrun; under a launcher it is one rank.
Everything that can be checked is checked before any process starts (:func:`preflight`).

Resume: DeepSpeed checkpoints (model, optimiser, scheduler) every ``checkpoint_every`` steps, with the
step and each rank's RNG state beside them; the data order is a pure function of (seed, epoch, rank) and
each batch's augmentation of (seed, batch index), so a killed run resumes at the same sample with the
same crops and ends with the weights an uninterrupted run would have.

Outputs (``output_dir``): ``checkpoints/``, ``export/`` (open_clip_config.json + open_clip_model.safetensors,
loadable with ``open_clip.create_model_and_transforms("local-dir:<export>")``), ``loss.png``; plus a
metrics JSON and a loss-curve plots JSON for DVC, and an MLflow run (rank 0 only).
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import logging
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import open_clip
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from tqdm import tqdm

from components.shared.atomic import atomic_write_bytes, atomic_write_json, fingerprint
from components.method.hard_examples import (caption_negatives, caption_positives, clic_negative, clic_positives,
                                      parse_shapes_caption, real_negatives, real_positive, shapesworld_pair_negative_is_false,
                                      shapesworld_tokens, spacy_tokens)
from components.method.losses import C2LIPLoss, C2LIPModule, CLICLoss, concept_batch
from components.method.models import create_model
from components.shared.params import ParamsError, TrainParams, flatten_params, load_params
from components.shared.tracking import use_experiment
from components.shared.params import ROOT

log = logging.getLogger("c2lip.train")
EXPORT_CONFIG = "open_clip_config.json"
EXPORT_WEIGHTS = "open_clip_model.safetensors"
RNG_FILE = "rng_rank{rank}.pt"
HISTORY_FILE = "loss_history.json"


# --------------------------------------------------------------------------------------------------
# checks before launch
# --------------------------------------------------------------------------------------------------


def expand_shards(patterns: list[str]) -> list[str]:
    """Sorted shard paths of every pattern (a path or a glob); a pattern that matches nothing is an error."""
    shards: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else ([pattern] if Path(pattern).is_file() else [])
        if not matches:
            raise ParamsError(f"data.shards: {pattern!r} matches no file (run the captions stage first?)")
        shards.extend(matches)
    return shards


def world_size_for(params: TrainParams) -> int:
    """Processes this run will have: the launcher's WORLD_SIZE when under one, else ``processes``."""
    return int(os.environ.get("WORLD_SIZE", params.processes))


def deepspeed_config(params: TrainParams, world_size: int, cuda: bool) -> dict[str, Any]:
    """The DeepSpeed config file with our batch sizes and clipping filled in; rejects what cannot run."""
    path = params.deepspeed_config
    if not path.is_file():
        raise ParamsError(f"deepspeed_config: {path} does not exist (configs live in infra/deepspeed/)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ParamsError(f"deepspeed_config: {path} is not valid JSON: {err}") from None
    owned = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler", "gradient_clipping"}
    clash = sorted(owned & set(config))
    if clash:
        raise ParamsError(f"deepspeed_config: {path} sets {clash}; these come from params/*.yaml (global_batch, micro_batch, optim)")
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2):
        raise ParamsError(f"deepspeed_config: {path} asks ZeRO stage {stage}; the train stage supports 0, 1 and 2")
    for precision in ("bf16", "fp16"):
        if config.get(precision, {}).get("enabled") and not cuda:
            raise ParamsError(
                f"deepspeed_config: {path} enables {precision}, but this machine has no CUDA GPU; "
                f"use infra/deepspeed/zero{stage}_fp32.json on CPU"
            )
    per_step = world_size * params.micro_batch
    if params.global_batch % per_step:
        raise ParamsError(
            f"global_batch {params.global_batch} is not divisible by world size {world_size} × micro_batch "
            f"{params.micro_batch} = {per_step}"
        )
    config.update(
        train_batch_size=params.global_batch,
        train_micro_batch_size_per_gpu=params.micro_batch,
        gradient_accumulation_steps=params.global_batch // per_step,
        gradient_clipping=params.optim.grad_clip,
    )
    config.setdefault("zero_allow_untested_optimizer", True)  # our torch AdamW param groups (DESIGN.md's no-decay rule)
    return config


def preflight(params: TrainParams) -> dict[str, Any]:
    """Every check that needs no model: config, batch arithmetic, data, concepts, init path."""
    world = world_size_for(params)
    config = deepspeed_config(params, world, torch.cuda.is_available())
    shards = expand_shards(params.data.shards)
    if len(shards) < world:
        raise ParamsError(f"data.shards: {len(shards)} shard(s) for {world} processes; every rank needs at least one shard")
    if params.method.uses_concepts or params.data.phrases_as_captions > 0:
        if params.data.concepts_dir is None or not any(Path(params.data.concepts_dir).glob("*.parquet")):
            raise ParamsError(f"data.concepts_dir: no Parquet files in {params.data.concepts_dir} (run the concepts stage first)")
    init = params.model.init
    if init != "scratch" and _looks_like_path(init) and not Path(init).exists():
        raise ParamsError(f"model.init: {init} does not exist (a checkpoint path, an open_clip tag, or 'scratch')")
    return config


def _looks_like_path(init: str) -> bool:
    return "/" in init or init.endswith((".safetensors", ".pt", ".pth", ".bin"))


# --------------------------------------------------------------------------------------------------
# data: a deterministic, resumable stream of WebDataset samples
# --------------------------------------------------------------------------------------------------


def load_phrases(concepts_dir: Path) -> dict[str, list[str]]:
    """key -> noun phrases, from the concepts stage's Parquet files."""
    phrases: dict[str, list[str]] = {}
    for path in sorted(Path(concepts_dir).glob("*.parquet")):
        table = pq.read_table(path, columns=["key", "phrases"])
        for key, items in zip(table.column("key").to_pylist(), table.column("phrases").to_pylist()):
            phrases[key] = list(items)
    return phrases


def sample_stream(shards: list[str], seed: int, rank: int, world: int, shuffle_buffer: int) -> Iterator[dict]:
    """Endless raw samples for one rank: each epoch permutes the shards with (seed, epoch), deals them out
    round-robin to the ranks, and shuffles samples in a buffer seeded by (seed, epoch, rank)."""
    for epoch in range(sys.maxsize):
        order = np.random.default_rng([seed, epoch]).permutation(len(shards))
        mine = [shards[i] for i in order[rank::world]]
        samples = wds.tariterators.tarfile_samples({"url": url} for url in mine)
        rng = random.Random(f"{seed}:{epoch}:{rank}")
        yield from wds.filters.shuffle(bufsize=shuffle_buffer, initial=shuffle_buffer, rng=rng)(samples)


def split_sentences(text: str) -> list[str]:
    """Sentences of a caption: split after '.', '!' or '?' followed by white space."""
    return [t for t in re.split(r"(?<=[.!?])\s+", text.strip()) if t]


def sample_sentences(text: str, min_sentences: int, max_sentences: int | None, generator: torch.Generator | None = None) -> str:
    """A random subset of ``text``'s sentences, in their order: k uniform in [min, max] (clipped to the
    caption's count), then k distinct sentences. Uses torch's RNG, seeded per batch by the caller."""
    sentences = split_sentences(text)
    n = len(sentences)
    if n <= 1:
        return text
    high = min(n, max_sentences or n)
    low = min(min_sentences, high)
    k = int(torch.randint(low, high + 1, (1,), generator=generator))
    keep = sorted(torch.randperm(n, generator=generator)[:k].tolist())
    return " ".join(sentences[i] for i in keep)


class TrainBatches(IterableDataset):
    """Micro-batches for one rank, from batch ``start`` on. With DataLoader workers, worker w decodes the
    batches b ≡ w (mod workers): DataLoader takes batches from its workers in that same round-robin
    order, so the sequence is identical for any number of workers.

    What a batch holds depends on the method (:meth:`make_batch`); every random choice in it is a function
    of (seed, rank, batch index), so a resumed run sees the same batches."""

    def __init__(self, params: TrainParams, shards: list[str], rank: int, world: int, start: int, transform, tokenizer, phrases,
                 accumulation: int = 1, plain: bool = False):
        self.params, self.shards, self.rank, self.world, self.start = params, shards, rank, world, start
        self.transform, self.tokenizer, self.phrases = transform, tokenizer, phrases
        self.accumulation, self.plain = accumulation, plain  # plain: images and captions only (calibration)
        self._nlp = None

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        p = self.params
        size = p.micro_batch
        stream = sample_stream(self.shards, p.seed, self.rank, self.world, p.data.shuffle_buffer)
        stream = islice(stream, self.start * size, None)  # skipped samples are read, never decoded
        index = self.start
        while True:
            chunk = list(islice(stream, size))
            if (index - self.start) % workers == worker:
                yield self.make_batch(chunk, index)
            index += 1

    def nlp(self, name: str):
        """spaCy, loaded on first use in this worker (only real, non-ShapesWorld captions need it)."""
        if self._nlp is None:
            import spacy

            self._nlp = spacy.load(name, exclude=["ner", "lemmatizer"])
        return self._nlp

    def decode(self, samples: list[dict]) -> list[tuple[str, dict, str, Image.Image]]:
        """(key, scene metadata, caption of the picked field, image) per sample; a broken sample is named."""
        p = self.params
        fields = p.data.caption_fields
        picks = torch.randint(len(fields), (len(samples),)).tolist()
        out = []
        for sample, pick in zip(samples, picks):
            key = sample["__key__"]
            field = fields[pick]
            try:
                meta = json.loads(sample["json"]) if "json" in sample else {}
                caption = meta.get("captions", {}).get(field)
                if caption is None and field == "txt" and "txt" in sample:
                    caption = sample["txt"].decode()
                if caption is None:
                    raise KeyError(f"caption field {field!r} missing")
                image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
            except Exception as err:  # noqa: BLE001 - any broken sample: name it and stop
                raise ValueError(f"{sample.get('__url__', '?')}: sample {key!r}: {err}") from err
            if self.phrases is not None and key not in self.phrases:
                raise KeyError(f"{sample.get('__url__', '?')}: sample {key!r} has no phrases in {p.data.concepts_dir}")
            out.append((key, meta, caption, image))
        return out

    def make_batch(self, samples: list[dict], index: int) -> dict[str, torch.Tensor]:
        p = self.params
        # crops depend on (seed, rank, batch index) only, not on which worker or how many came before
        torch.manual_seed(hash((p.seed, self.rank, index)) % (2**63))
        rng = np.random.default_rng([p.seed, self.rank, index])  # hard examples, CLIC's pairing
        decoded = self.decode(samples)
        if self.plain:
            return {"images": torch.stack([self.transform(image) for *_, image in decoded]),
                    "texts": self.tokenizer([caption for _, _, caption, _ in decoded])}
        if p.method.name == "clic" and (index // self.accumulation) % 2 == 0:  # every other optimiser step
            return self.clic_batch(decoded, rng)
        images, captions = [], []
        for key, _, caption, image in decoded:
            images.append(self.transform(image))
            if p.data.sentence_sampling is not None:
                caption = sample_sentences(caption, p.data.sentence_sampling.min_sentences, p.data.sentence_sampling.max_sentences)
            if p.data.phrases_as_captions > 0 and float(torch.rand(())) < p.data.phrases_as_captions and self.phrases[key]:
                caption = self.phrases[key][int(torch.randint(len(self.phrases[key]), ()))]
            captions.append(caption)
        batch = {"images": torch.stack(images), "texts": self.tokenizer(captions)}
        if p.method.uses_concepts:
            batch.update(concept_batch([self.phrases[key] for key, *_ in decoded], self.tokenizer))
        if p.method.uses_hard_examples:
            batch.update(self.hard_examples(decoded, captions, rng))
        return batch

    def hard_examples(self, decoded, captions: list[str], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """Extra text rows: each caption's hard negatives (negclip, hp_hn) and one hard positive (hp_hn),
        with the image each belongs to. A caption where no rule applies adds none."""
        h = self.params.method.hard_examples
        want_positive = self.params.method.name == "hp_hn"
        vocabulary = sorted({(o["color"], o["shape"]) for _, meta, *_ in decoded for o in meta.get("objects", [])})
        texts, owners, positive = [], [], []
        for i, ((_, meta, _, _), caption) in enumerate(zip(decoded, captions)):
            negatives, positives = caption_hard_examples(caption, meta, rng, vocabulary, h, want_positive, self.nlp)
            for text in negatives[:h.negatives_per_caption]:
                texts.append(text), owners.append(i), positive.append(False)
            if positives:
                texts.append(positives[0]), owners.append(i), positive.append(True)
        if not texts:  # keeps every batch's keys the same (ranks gather them together)
            return {"extra_texts": self.tokenizer([""])[:0], "extra_owner": torch.zeros(0, dtype=torch.long),
                    "extra_positive": torch.zeros(0, dtype=torch.bool)}
        return {"extra_texts": self.tokenizer(texts), "extra_owner": torch.tensor(owners), "extra_positive": torch.tensor(positive)}

    def clic_batch(self, decoded, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """CLIC's pair step: every image concatenated with a partner of the same orientation (side by side
        when tall or square, stacked when wide; which comes first at random), resized back to the image's
        size; the four positives and the word-swap negative of each pair."""
        c = self.params.method.clic
        images, positives, negatives, has_negative = [], [[], [], [], []], [], []
        for i, j in pair_indices([img.size for *_, img in decoded], rng):
            if rng.random() < 0.5:
                i, j = j, i
            (_, meta_a, cap_a, img_a), (_, meta_b, cap_b, img_b) = decoded[i], decoded[j]
            images.append(self.transform(concatenate_pair(img_a, img_b)))
            first, second = split_sentences(cap_a), split_sentences(cap_b)
            for k, text in enumerate(clic_positives(first, second, rng)):
                positives[k].append(text)
            if meta_a.get("source") == "shapesworld" and meta_b.get("source") == "shapesworld":  # exact: word classes and truth
                tokens_a, tokens_b = shapesworld_tokens(first[0], meta_a), shapesworld_tokens(second[0], meta_b)
                negative = clic_negative(first[0], second[0], tokens_a, tokens_b, rng,
                                         is_false=lambda x, y, a=meta_a, b=meta_b: shapesworld_pair_negative_is_false(x, y, a, b))
            else:
                nlp = self.nlp(c.spacy_model)
                negative = clic_negative(first[0], second[0], spacy_tokens(nlp(first[0])), spacy_tokens(nlp(second[0])), rng)
            negatives.append(negative or "")
            has_negative.append(negative is not None)
        return {"images": torch.stack(images), "texts": self.tokenizer([t for block in positives for t in block]),
                "clic_negative_texts": self.tokenizer(negatives), "clic_has_negative": torch.tensor(has_negative)}


def caption_hard_examples(caption: str, meta: dict, rng: np.random.Generator, vocabulary, h, want_positive: bool, nlp) -> tuple[list[str], list[str]]:
    """(hard negatives, hard positives) of one caption, each list in random order: exact edits for a
    ShapesWorld caption, spaCy rules otherwise."""
    if meta.get("source") == "shapesworld" and (parsed := parse_shapes_caption(caption)) is not None:
        negatives = [c.text() for c in caption_negatives(parsed, meta, rng, vocabulary, h.negative_kinds).values()]
        positives = [c.text() for k, c in caption_positives(parsed).items() if k in h.positive_kinds] if want_positive else []
    elif meta.get("source") == "shapesworld":
        return [], []  # a phrase or the raw alt-text: no claims to edit
    else:
        doc = nlp(h.spacy_model)(caption)
        negatives = real_negatives(doc, rng)
        positive = real_positive(doc, rng) if want_positive else None
        positives = [positive] if positive else []
    order = rng.permutation(len(negatives))
    return [negatives[k] for k in order], [positives[k] for k in rng.permutation(len(positives))]


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


# --------------------------------------------------------------------------------------------------
# model, optimiser, schedule
# --------------------------------------------------------------------------------------------------


def build_model(params: TrainParams):
    """(model, train transform, eval transform, tokenizer) from ``model.name`` and ``model.init``."""
    init = params.model.init
    if init == "scratch":
        pretrained = None
    elif Path(init).is_dir():
        pretrained = str(Path(init) / EXPORT_WEIGHTS)
    else:
        pretrained = init
    return create_model(params.model.name, pretrained=pretrained, aug_cfg={"scale": tuple(params.data.crop_scale)})


def param_groups(module: torch.nn.Module, optim) -> list[dict]:
    """AdamW groups: decay on matrices; none on gains, biases and the logit scale/bias (DESIGN.md), which
    also get ``logit_lr_multiplier`` (a model trained from scratch needs them to move ~10× faster)."""
    decay, no_decay, logit = [], [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if "logit_scale" in name or "logit_bias" in name:
            logit.append(p)
        elif p.ndim < 2 or "bias" in name or "norm" in name or "ln_" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": optim.weight_decay, "lr": optim.lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": optim.lr},
        {"params": logit, "weight_decay": 0.0, "lr": optim.lr * optim.logit_lr_multiplier},
    ]


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def _similarities(model, batches) -> list[torch.Tensor]:
    sims = []
    for batch in batches:
        images = model.encode_image(batch["images"], normalize=True)
        texts = model.encode_text(batch["texts"], normalize=True)
        sims.append(images @ texts.T)
    return sims


def calibrate_logits(model, batches, max_log_scale: float) -> tuple[float, float]:
    """Fit (log s, b) of the sigmoid loss on frozen embeddings of ``batches``: L-BFGS on two numbers.

    A base trained with the softmax loss never needed a bias (it cancels in a softmax), so fine-tuning it
    with the sigmoid loss would otherwise spend its first hundreds of steps moving s and b."""
    was_training = model.training
    model.eval()
    sims = _similarities(model, batches)
    model.train(was_training)
    log_scale = model.logit_scale.detach().reshape(-1)[:1].clone().requires_grad_()
    bias = (model.logit_bias.detach().reshape(-1)[:1].clone() if getattr(model, "logit_bias", None) is not None
            else torch.zeros(1)).requires_grad_()
    opt = torch.optim.LBFGS([log_scale, bias], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        total = 0.0
        for sim in sims:
            labels = 2 * torch.eye(sim.shape[0]) - 1
            logits = log_scale.clamp(0, max_log_scale).exp() * sim + bias
            total = total - torch.nn.functional.logsigmoid(labels * logits).sum() / sim.shape[0]
        total = total / len(sims)
        total.backward()
        return total

    opt.step(closure)
    return float(log_scale.detach().clamp(0, max_log_scale)), float(bias.detach())


# --------------------------------------------------------------------------------------------------
# checkpoints and export
# --------------------------------------------------------------------------------------------------


# the code that decides what a step computes: a checkpoint made by other code is not resumed
TRAINING_CODE = [Path(__file__), *(Path(__file__).with_name(n) for n in ("method.py", "models.py", "hard_examples.py", "shapesworld_rules.py")),
                 *sorted(Path(__file__).with_name("model_configs").glob("*.json"))]


def run_fingerprint(params: TrainParams, shards: list[str]) -> str:
    """What a checkpoint must match to be resumed: the params but the bookkeeping keys, the shards, the
    world size and the training code (as the captions stage does: a resumed run never mixes two versions)."""
    payload = params.model_dump(mode="json", exclude={"output_dir", "checkpoint_every", "keep_checkpoints", "log_every", "zero_shot_eval", "zero_shot_every", "torch_threads", "metrics_path", "plots_path", "export_dtype", "test_shards", "mlflow_experiment"})
    payload["data"].pop("workers")
    return fingerprint({"params": payload, "shards": shards, "world": world_size_for(params)}, TRAINING_CODE)


def checkpoint_dir(params: TrainParams) -> Path:
    return params.output_dir / "checkpoints"


def latest_tag(ckpt_dir: Path) -> str | None:
    latest = ckpt_dir / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def prune_checkpoints(ckpt_dir: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` step directories (never the one ``latest`` names)."""
    current = latest_tag(ckpt_dir)
    tags = sorted(p.name for p in ckpt_dir.glob("step*") if p.is_dir())
    for tag in tags[:-keep]:
        if tag != current:
            shutil.rmtree(ckpt_dir / tag, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def export_model(model: torch.nn.Module, name: str, out_dir: Path, dtype: str = "float32") -> Path:
    """open_clip_config.json (model + preprocess config) and open_clip_model.safetensors, written to a
    temporary directory and renamed into place. Loads with ``open_clip.create_model_and_transforms(
    "local-dir:<out_dir>")``, or ``(name, pretrained=<out_dir>/open_clip_model.safetensors)`` for a name
    open_clip knows."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model_cfg = open_clip.get_model_config(name)
    # the 1-dim logit scale/bias are a DeepSpeed need; open_clip reshapes them into a default model
    model_cfg.pop("nonscalar_logit_scale", None)
    preprocess = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    atomic_write_json(tmp / EXPORT_CONFIG, {"model_cfg": model_cfg, "preprocess_cfg": preprocess, "architecture": name})
    cast = getattr(torch, dtype)
    state = {k: (v.to(cast) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / EXPORT_WEIGHTS), metadata={"architecture": name})
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


# --------------------------------------------------------------------------------------------------
# the ShapesWorld zero-shot check (the evaluate stage has the full suite)
# --------------------------------------------------------------------------------------------------

ZERO_SHOT_TEMPLATES = ["a {}.", "There is a small {}.", "There is a large {}.", "A picture of one shape: a {}."]


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
        device = next(model.parameters()).device
        classifier = open_clip.build_zero_shot_classifier(
            model, tokenizer, classnames=[f"{c} {s}" for c, s in self.classes], templates=ZERO_SHOT_TEMPLATES,
            num_classes_per_batch=16, device=device,
        )
        features = torch.cat([model.encode_image(torch.stack(self.images[i:i + 256]).to(device), normalize=True)
                              for i in range(0, len(self.images), 256)])
        model.train(was_training)
        predicted = [self.classes[int(i)] for i in (features @ classifier).argmax(dim=1)]
        correct = torch.tensor([p == t for p, t in zip(predicted, self.labels)], dtype=torch.float)
        held = torch.tensor(self.held)
        out = {
            "zero_shot_top1": correct.mean().item(),
            "zero_shot_color_acc": sum(p[0] == t[0] for p, t in zip(predicted, self.labels)) / len(predicted),
            "zero_shot_shape_acc": sum(p[1] == t[1] for p, t in zip(predicted, self.labels)) / len(predicted),
            "zero_shot_images": float(len(predicted)),
        }
        if held.any():
            out["zero_shot_top1_held_out_pairs"] = correct[held].mean().item()
            out["zero_shot_top1_seen_pairs"] = correct[~held].mean().item()
        return out


# --------------------------------------------------------------------------------------------------
# tracking
# --------------------------------------------------------------------------------------------------


def start_mlflow(params: TrainParams, stage: str):
    mlflow = use_experiment(params.mlflow_experiment)
    run = mlflow.start_run(run_name=f"{stage}-{params.preset}-{params.method.name}", log_system_metrics=True)
    mlflow.log_params(flatten_params(params))
    mlflow.set_tags({"stage": stage, "method": params.method.name, "preset": params.preset})
    return mlflow, run


def plot_losses(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    terms = sorted({k for p in points for k in p if k.endswith("_loss")})  # CLIC's terms alternate by step
    for term in ["loss", *terms]:
        have = [p for p in points if term in p]
        ax.plot([p["step"] for p in have], [p[term] for p in have], label=term, lw=2 if term == "loss" else 1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    checks = [p for p in points if "zero_shot_top1" in p]
    if checks:
        right = ax.twinx()
        right.plot([p["step"] for p in checks], [p["zero_shot_top1"] for p in checks], "o-", color="black", label="zero-shot top-1")
        right.set_ylim(0, 1)
        right.set_ylabel("zero-shot top-1 (single objects)")
        right.legend(loc="center right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# --------------------------------------------------------------------------------------------------
# one rank's training
# --------------------------------------------------------------------------------------------------


def train(params: TrainParams, stage: str) -> dict[str, float]:
    """Train on this rank (the launcher started the others); rank 0 writes every output."""
    import deepspeed

    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(params.torch_threads or max(1, (os.cpu_count() or 1) // local_world))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    main = rank == 0
    ds_config = deepspeed_config(params, world, cuda)
    shards = expand_shards(params.data.shards)

    random.seed(params.seed)
    np.random.seed(params.seed)
    torch.manual_seed(params.seed)  # identical initial weights on every rank
    model, transform_train, transform_eval, tokenizer = build_model(params)
    m = params.method
    ckpt_dir = checkpoint_dir(params)
    current = run_fingerprint(params, shards)
    fp_file = params.output_dir / "_fingerprint.json"
    resuming = bool(latest_tag(ckpt_dir)) and fp_file.is_file() and json.loads(fp_file.read_text()).get("fingerprint") == current
    if params.model.calibrate_logits and not resuming:  # a resumed run has its s and b in the checkpoint
        calibration = TrainBatches(params, shards, rank, world, 0, transform_train, tokenizer, None, plain=True)
        batches = list(islice(iter(calibration), params.model.calibrate_logits))
        log_scale, bias = calibrate_logits(model, batches, math.log(params.optim.max_logit_scale))
        # every rank starts from rank 0's fit, so the replicas stay identical
        fitted = torch.tensor([log_scale, bias])
        if dist.get_world_size() > 1:
            dist.broadcast(fitted, src=0)
        with torch.no_grad():
            model.logit_scale.fill_(float(fitted[0]))
            if getattr(model, "logit_bias", None) is not None:
                model.logit_bias.fill_(float(fitted[1]))
        if main:
            log.info("calibrated on %d batches: logit scale %.2f, bias %.2f", len(batches), math.exp(fitted[0]), fitted[1])
    loss = C2LIPLoss(
        contrastive=m.contrastive,
        lambda_npc=m.lambda_npc if m.uses_concepts else 0.0,
        lambda_xac=m.lambda_xac if m.uses_concepts else 0.0,
        xac_temperature=m.xac_temperature,
        xac_chunk=m.xac_chunk,
        concept_logit=m.concept_logit,
        init_logit_scale=float(model.logit_scale.detach().reshape(-1)[0]),
        init_logit_bias=float(model.logit_bias.detach().reshape(-1)[0]) if getattr(model, "logit_bias", None) is not None else 0.0,
    )
    clic = CLICLoss(m.contrastive, m.clic.weight_cont, m.clic.weight_sneg, m.clic.weight_uni) if m.name == "clic" else None
    # CLIC fine-tunes the text tower only
    module = C2LIPModule(model, loss, clic, freeze_image_tower=m.name == "clic" and not m.clic.train_image_tower)
    optimizer = torch.optim.AdamW(param_groups(module, params.optim), betas=params.optim.betas, eps=params.optim.eps)
    o = params.optim
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, params.steps, o.warmup_steps, o.min_lr_ratio)
    )
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)

    # resume, or start afresh when the checkpoints belong to other params
    start_step, resumed_figures = 0, {}
    if resuming:
        _, client = engine.load_checkpoint(str(ckpt_dir))
        start_step = int(client["step"])
        resumed_figures = client.get("figures", {})
        rng_file = ckpt_dir / latest_tag(ckpt_dir) / RNG_FILE.format(rank=rank)
        if rng_file.is_file():
            set_rng_state(torch.load(rng_file, weights_only=False))
        if main:
            log.info("resumed from %s at step %d", ckpt_dir / latest_tag(ckpt_dir), start_step)
    elif main:
        if ckpt_dir.exists():
            log.info("checkpoints in %s belong to other params: starting afresh", ckpt_dir)
            shutil.rmtree(ckpt_dir)
        atomic_write_json(fp_file, {"fingerprint": current})
    dist.barrier()

    phrases = load_phrases(params.data.concepts_dir) if m.uses_concepts or params.data.phrases_as_captions > 0 else None
    accumulation = ds_config["gradient_accumulation_steps"]
    batches = TrainBatches(params, shards, rank, world, start_step * accumulation, transform_train, tokenizer, phrases, accumulation)
    loader = DataLoader(batches, batch_size=None, num_workers=params.data.workers, persistent_workers=False)
    loader_iter = iter(loader)

    zero_shot = None
    if main and params.zero_shot_eval:
        test_shards = [s for pattern in params.test_shards for s in sorted(glob.glob(pattern))]
        zero_shot = ShapesWorldZeroShot(test_shards, transform_eval) if test_shards else None
    tracker = start_mlflow(params, stage)[0] if main else None
    if main and start_step:
        tracker.set_tag("resumed_from_step", start_step)
    plot_points: list[dict] = []
    plots_path = params.plots_path
    history = ckpt_dir / str(latest_tag(ckpt_dir)) / HISTORY_FILE
    if start_step and history.is_file():  # the curve of the steps before the kill (DVC removed the plots file)
        plot_points = [p for p in json.loads(history.read_text()) if p["step"] <= start_step]
    max_scale = math.log(params.optim.max_logit_scale)
    bar = tqdm(total=params.steps, initial=start_step, desc=f"{stage} {m.name}", disable=not main, dynamic_ncols=True)
    t0, samples_done, step = time.time(), 0, start_step
    # a run resumed at its last step reports the figures its checkpoint recorded
    throughput, sums = resumed_figures.get("samples_per_s", 0.0), dict(resumed_figures.get("losses", {}))
    while step < params.steps:
        sums: dict[str, float] = {}
        for _ in range(accumulation):
            batch = {k: v.to(device, non_blocking=True) for k, v in next(loader_iter).items()}
            terms = engine(**batch)
            total = sum(terms.values())
            engine.backward(total)
            engine.step()
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + v.item() / accumulation
            sums["loss"] = sums.get("loss", 0.0) + total.item() / accumulation
        step += 1
        with torch.no_grad():  # the paper clamps the logit scale to [0, ln 100]
            engine.module.model.logit_scale.clamp_(0, max_scale)
        if step == start_step + 1:  # throughput leaves out the first step (warm-up, first data reads)
            t0, samples_done = time.time(), 0
        else:
            samples_done += params.global_batch
            throughput = samples_done / (time.time() - t0)
        if main:
            bar.update(1)
            bar.set_postfix(loss=f"{sums['loss']:.3f}", samples_s=f"{throughput:.0f}")
            check = bool(zero_shot) and params.zero_shot_every and step % params.zero_shot_every == 0 and step < params.steps
            if check or step % params.log_every == 0 or step == params.steps:
                point = {"step": step, **{k: round(v, 5) for k, v in sums.items()}}
                metrics = {**sums, "lr": scheduler.get_last_lr()[0], "samples_per_s": throughput,
                           "logit_scale": engine.module.model.logit_scale.exp().item()}
                if check:  # rank 0 evaluates; the others wait at the next collective
                    started = time.time()
                    figures = zero_shot(engine.module.model, tokenizer)
                    t0 += time.time() - started  # not training time
                    metrics.update(figures)
                    point["zero_shot_top1"] = round(figures["zero_shot_top1"], 4)
                plot_points.append(point)
                tracker.log_metrics(metrics, step=step)
        if step % params.checkpoint_every == 0 or step == params.steps:
            save_checkpoint(engine, ckpt_dir, step, rank, params.keep_checkpoints, main,
                            figures={"losses": sums, "samples_per_s": throughput}, history=plot_points)
            if main:
                atomic_write_json(plots_path, {"loss": plot_points})
    bar.close()

    result: dict[str, float] = {}
    if main:
        model = engine.module.model
        export_dir = export_model(model, params.model.name, params.output_dir / "export", params.export_dtype)
        if params.export_dtype != "float32":  # the figures below describe the exported (rounded) weights
            with torch.no_grad():
                for tensor in [*model.parameters(), *model.buffers()]:
                    if tensor.is_floating_point():
                        tensor.copy_(tensor.to(getattr(torch, params.export_dtype)))
        result = {"steps": float(params.steps), "samples_per_s": throughput,
                  **{f"final_{k}": v for k, v in sums.items()},
                  "logit_scale": model.logit_scale.exp().item()}
        if getattr(model, "logit_bias", None) is not None:
            result["logit_bias"] = model.logit_bias.item()
        if zero_shot:
            result.update(zero_shot(model, tokenizer))
        if "zero_shot_top1" in result and plot_points and plot_points[-1]["step"] == params.steps:
            plot_points[-1]["zero_shot_top1"] = round(result["zero_shot_top1"], 4)
        atomic_write_json(plots_path, {"loss": plot_points})
        if plot_points:
            plot_losses(plot_points, params.output_dir / "loss.png")
        atomic_write_json(params.metrics_path, {k: round(v, 5) for k, v in result.items()})
        tracker.log_metrics({k: v for k, v in result.items() if k.startswith("zero_shot")})
        tracker.log_artifact(str(export_dir / EXPORT_CONFIG), "export")
        if (params.output_dir / "loss.png").is_file():
            tracker.log_artifact(str(params.output_dir / "loss.png"))
        tracker.end_run()
        log.info("exported %s; %s", export_dir, {k: round(v, 4) for k, v in result.items()})
    dist.barrier()
    return result


def save_checkpoint(engine, ckpt_dir: Path, step: int, rank: int, keep: int, main: bool,
                    figures: dict | None = None, history: list[dict] | None = None) -> None:
    """DeepSpeed's checkpoint of step ``step``; each rank's RNG state (and rank 0's loss history) is
    written first, so the ``latest`` pointer DeepSpeed writes last never names an incomplete checkpoint."""
    tag = f"step{step:08d}"
    (ckpt_dir / tag).mkdir(parents=True, exist_ok=True)
    if main and history is not None:
        atomic_write_json(ckpt_dir / tag / HISTORY_FILE, history)
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    atomic_write_bytes(ckpt_dir / tag / RNG_FILE.format(rank=rank), buf.getvalue())
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step, "figures": figures or {}})
    if main:
        prune_checkpoints(ckpt_dir, keep)


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params/train.yaml"), help="params YAML (train.yaml, base.yaml, or a preset)")
    parser.add_argument("--stage", default=None, help="name recorded in MLflow (default: the params file's stem)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stage = args.stage or args.params.stem
    try:
        params = load_params("train", args.params)
        preflight(params)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if "WORLD_SIZE" not in os.environ:
        if params.processes > 1:  # not under a launcher: become one
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={params.processes}",
                       "-m", "components.train", "--params", str(args.params), "--stage", stage]
            return subprocess.call(command)
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    train(params, stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
