"""What NegCLIP's hard-negative images are in ShapesWorld: for each crowded training scene, how its k nearest training
images (components.data.neighbours, by a model's image embedding) relate to it in composition.

    python -m components.study.neighbour_probe --model models/base-calibrated/export [--k 3] \\
        [--neighbours models/<run>/neighbours.json] [--out reports/neighbours-probe.json]

Each (scene, neighbour) pair falls in the first of these that holds:

- ``same_objects``: the same coloured shapes (the same multiset of (colour, shape)), wherever they stand;
- ``rebound``: the same colours and the same shapes, bound the other way round (a swap negative's picture);
- ``shares_an_object``: at least one coloured shape in common;
- ``other``: nothing in common.

A high ``same_objects`` share means the neighbours are the look-alike scenes NegCLIP means them to be; ``rebound`` is
the share of partners whose caption is, in effect, the scene's swap negative. With ``--neighbours`` the table a run
computed (its own training transform) is read; otherwise the neighbours are computed here with the model's evaluation
preprocessing, so they can differ from a run's in a few ties.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from collections import Counter
from pathlib import Path

KINDS = ("same_objects", "rebound", "shares_an_object", "other")


def composition(scene: list[dict], neighbour: list[dict]) -> str:
    """Which of :data:`KINDS` relates two scenes' objects (dicts with ``color`` and ``shape``)."""
    pairs = lambda objects: Counter((o["color"], o["shape"]) for o in objects)  # noqa: E731
    mine, theirs = pairs(scene), pairs(neighbour)
    if mine == theirs:
        return "same_objects"
    if Counter(o["color"] for o in scene) == Counter(o["color"] for o in neighbour) and \
            Counter(o["shape"] for o in scene) == Counter(o["shape"] for o in neighbour):
        return "rebound"
    return "shares_an_object" if mine & theirs else "other"


def summarise(table: dict[str, list[str]], objects: dict[str, list[dict]]) -> dict:
    """Shares of :data:`KINDS` over every (crowded scene, neighbour) pair of ``table`` (key -> neighbour keys)."""
    counts: Counter = Counter()
    anchors = 0
    for key, near in table.items():
        if len(objects.get(key, ())) < 2:
            continue  # a one-object scene has no binding to get wrong
        anchors += 1
        for other in near:
            if other not in objects:
                raise KeyError(f"neighbour {other!r} of {key!r} is not in the shards (were they regenerated since?)")
            counts[composition(objects[key], objects[other])] += 1
    pairs = sum(counts.values())
    if not pairs:
        raise ValueError("no crowded scene with neighbours in the table")
    return {"crowded_scenes": anchors, "pairs": pairs, "shares": {kind: round(counts[kind] / pairs, 4) for kind in KINDS}}


def scene_objects(index) -> dict[str, list[dict]]:
    """Each sample's ShapesWorld objects, from its JSON member only (no image is read)."""
    out = {}
    for key, (shard, members) in index.members.items():
        if "json" not in members:
            continue
        offset, size = members["json"]
        with open(shard, "rb") as handle:
            handle.seek(offset)
            out[key] = json.loads(handle.read(size)).get("objects", [])
    return out


def compute_table(model_uri: str, index, k: int, device: str = "auto") -> dict[str, list[str]]:
    """Every training image's ``k`` nearest by the model's image embedding (evaluation preprocessing)."""
    import torch

    from components.data.neighbours import nearest_images
    from components.shared.devices import to_model
    from components.shared.params import EvalModelSpec
    from components.shared.progress import TimedBar
    from components.suite.model_loading import load_model, resolve_model

    spec = EvalModelSpec(name="probe", uri=model_uri)
    model, preprocess, _ = load_model(*resolve_model(spec, Path("data/evaluate_cache/downloads")), spec, device)
    embed = lambda images: model.encode_image(to_model(torch.stack([preprocess(image) for image in images]), model)).float()  # noqa: E731
    return nearest_images(index, embed, k, progress=lambda it: TimedBar(it, desc="neighbours", unit="batch", file=sys.stderr))


def run(shards: list[str], k: int, model: str | None, neighbours: Path | None, device: str = "auto") -> dict:
    from components.data.shard_index import KeyIndex

    if not shards:
        raise FileNotFoundError("no training shards (run the captions stage first: dvc repro captions)")
    index = KeyIndex(shards)
    if neighbours is not None:
        table = json.loads(neighbours.read_text())["neighbours"]
    elif model is not None:
        table = compute_table(model, index, k, device)
    else:
        raise ValueError("give --model (neighbours computed here) or --neighbours (a run's neighbours.json)")
    result = summarise(table, scene_objects(index))
    return {"source": str(neighbours) if neighbours is not None else model, "k": len(next(iter(table.values()))), **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.study.neighbour_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="export folder whose image embedding picks the neighbours")
    parser.add_argument("--neighbours", type=Path, default=None, help="a run's neighbours.json to read instead")
    parser.add_argument("--k", type=int, default=3, help="nearest images per image (method.hard_examples.neighbour_images)")
    parser.add_argument("--train-shards", default="data/captions/train/*.tar")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--device", default="auto", help="where the model runs: auto (a GPU when present), cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    try:
        result = run(sorted(glob.glob(args.train_shards)), args.k, args.model, args.neighbours, args.device)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from components.study.probe_output import emit

    return emit(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
