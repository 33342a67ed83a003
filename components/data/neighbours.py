"""NegCLIP's hard-negative images: every training image's nearest training images, and the samples they come from.

NegCLIP's official code adds to each sample one of its k nearest images (by the image embedding of the CLIP it
fine-tunes), with that image's caption and the caption's hard negative, so every batch holds pairs of look-alike
scenes: the in-batch negatives a bag of words cannot tell apart. A partner's sample is read by its key through the
shards' tables (:mod:`components.data.shard_index`); the neighbours are computed once per run from the model the
fine-tune starts from and kept beside its checkpoints.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from components.data.shard_index import KeyIndex
from components.shared.atomic import atomic_write_json, fingerprint, shards_identity, weights_identity
from components.shared.devices import to_model


@torch.no_grad()
def nearest_images(index: KeyIndex, embed: Callable[[list[Image.Image]], torch.Tensor], k: int, batch: int = 256,
                   progress: Callable[[Iterator], Iterator] = iter, rank: int = 0, world: int = 1) -> dict[str, list[str]]:
    """Each image's ``k`` nearest other images by cosine of ``embed``'s features (a batch of PIL images -> [n, D]).
    With ``world`` > 1 (a process group) each rank embeds its contiguous share of the images and every rank gets
    the whole table: the ranks share the work instead of waiting for one."""
    keys = [key for key in index.keys() if "jpg" in index.members[key][1]]
    if len(keys) <= k:
        raise ValueError(f"{len(keys)} training images: too few for {k} nearest neighbours each (method.hard_examples.neighbour_images)")
    share = -(-len(keys) // world)  # images per rank (the last rank's share may be shorter, or empty)
    mine = keys[rank * share:(rank + 1) * share]
    features = []
    for start in progress(range(0, len(mine), batch)):
        images = [Image.open(io.BytesIO(index.sample(key)["jpg"])).convert("RGB") for key in mine[start:start + batch]]
        features.append(torch.nn.functional.normalize(embed(images).float(), dim=-1))
    everything = torch.cat(features) if features else None
    if world > 1:
        everything = _gather_shares(everything, share, len(keys), rank, world)
    neighbours: dict[str, list[str]] = {}
    for start in range(0, len(keys), 1024):  # a block of rows at a time: N x N similarities never sit in memory at once
        sims = everything[start:start + 1024] @ everything.T
        rows = torch.arange(sims.shape[0])
        sims[rows, rows + start] = -float("inf")  # an image is not its own neighbour
        top = sims.topk(k, dim=1).indices.tolist()
        neighbours.update({keys[start + r]: [keys[j] for j in row] for r, row in enumerate(top)})
    return neighbours


def _gather_shares(features: torch.Tensor | None, share: int, total: int, rank: int, world: int) -> torch.Tensor:
    """Every rank's feature rows in rank order (each padded to ``share`` rows for the collective)."""
    import torch.distributed as dist

    width = torch.tensor([features.shape[1] if features is not None else 0])
    dist.all_reduce(width, op=dist.ReduceOp.MAX)  # a rank with no images still learns the width
    device = features.device if features is not None else torch.device("cpu")
    padded = torch.zeros(share, int(width), device=device)
    if features is not None:
        padded[:features.shape[0]] = features
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)[:total].cpu()


class Neighbours:
    """The partners a batch adds: for each sample one of its k nearest images, drawn with the batch's generator."""

    def __init__(self, index: KeyIndex, table: dict[str, list[str]]):
        self.index, self.table = index, table

    def partners(self, samples: list[dict], rng: np.random.Generator) -> list[dict]:
        out = []
        for sample in samples:
            near = self.table.get(sample["__key__"])
            if not near:
                raise KeyError(f"{sample.get('__url__', '?')}: sample {sample['__key__']!r} has no nearest images "
                               "(the shards changed since they were computed? remove neighbours.json beside the checkpoints)")
            out.append(self.index.sample(near[int(rng.integers(len(near)))]))
        return out


def too_few_images(shards: list[str], k: int) -> str | None:
    """Why ``shards`` cannot give each image ``k`` nearest others (None when they can): read from the tar headers only."""
    images = sum("jpg" in members for _, members in KeyIndex(shards).members.values())
    return None if images > k else f"{k} nearest images each, but data.shards hold {images} training image(s); it must be below that number"


def load_or_compute(path: Path, shards: list[str], k: int, embed: Callable, identity: dict, progress=iter) -> Neighbours:
    """The run's neighbours from ``path`` when it was computed for the same shards, k and start model (``identity``),
    else computed (``embed``) and written there atomically."""
    index = KeyIndex(shards)
    key = table_key(shards, k, identity)
    if path.is_file():
        stored = stored_table(path)
        if stored is not None and stored.get("fingerprint") == key:
            return Neighbours(index, stored["neighbours"])
    table = nearest_images(index, embed, k, progress=progress)
    atomic_write_json(path, {"fingerprint": key, "k": k, "neighbours": table})
    return Neighbours(index, table)


def table_key(shards: list[str], k: int, identity: dict) -> str:
    """What a stored table must have been computed for: the shards' content, k and the start model."""
    return fingerprint({"shards": shards_identity(shards), "k": k, **identity}, [])


def stored_table(path: Path) -> dict | None:
    """The table ``path`` holds, or None when it is damaged (truncated, not the object this module writes): the
    caller computes it again, as the evaluate stage does with a damaged cache entry."""
    import sys

    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        print(f"neighbours: {path} is unreadable ({err}); computing the table again", file=sys.stderr)
        return None
    table = stored.get("neighbours") if isinstance(stored, dict) else None
    if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
        print(f"neighbours: {path} holds no table of neighbours; computing it again", file=sys.stderr)
        return None
    return stored


def read_neighbours(path: Path, shards: list[str]) -> Neighbours:
    """What :func:`load_or_compute` wrote (the other ranks read the file rank 0 wrote)."""
    return Neighbours(KeyIndex(shards), json.loads(path.read_text())["neighbours"])


NEIGHBOURS_FILE = "neighbours.json"


@torch.no_grad()
def embed_images(model, transform, images: list[Image.Image]) -> torch.Tensor:
    """The model's image embeddings [len(images), D] (float32, on its device), in eval mode, its mode restored after."""
    training = model.training
    model.eval()
    try:
        return model.encode_image(to_model(torch.stack([transform(image) for image in images]), model)).float()
    finally:
        model.train(training)


def for_run(params, model, transform, shards: list[str], rank: int, world: int, device: torch.device | None = None) -> Neighbours:
    """A training run's neighbours, by the image tower it starts from (before any step, before a resumed checkpoint
    loads: every resume of a run draws from the same partners). Rank 0 decides whether ``neighbours.json`` in the
    run's output folder is the table for this run; if not, every rank embeds its share of the images
    (:func:`nearest_images`) and rank 0 writes the table; then every rank reads it."""
    import sys

    import torch.distributed as dist

    from components.shared.progress import TimedBar

    path = params.output_dir / NEIGHBOURS_FILE
    init = Path(params.model.init)
    # the start weights by their content: a new base of the same size under the same path is another table
    identity = {"model": params.model.name, "init": params.model.init, "seed": None if init.exists() else params.seed,
                "weights": weights_identity(params.model.init)}
    k = params.method.hard_examples.neighbour_images
    key = table_key(shards, k, identity)
    reuse = [rank == 0 and path.is_file() and (stored := stored_table(path)) is not None and stored.get("fingerprint") == key]
    if world > 1:
        dist.broadcast_object_list(reuse, src=0)
    if not reuse[0]:
        model.to(device or "cpu")  # on a GPU the embedding runs there (DeepSpeed would move the model next anyway)
        progress = (lambda it: TimedBar(it, desc="neighbours", unit="batch", file=sys.stderr)) if rank == 0 else iter
        table = nearest_images(KeyIndex(shards), functools.partial(embed_images, model, transform), k, progress=progress,
                               rank=rank, world=world)
        if rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {"fingerprint": key, "k": k, "neighbours": table})
    if world > 1:
        dist.barrier()
    return read_neighbours(path, shards)
