"""Data-loader throughput of one worker: WebDataset decode + augmentation + tokenization of captions and phrases.

    python bench/loader.py [--images 1024] [--batch 64]

Writes ShapesWorld shards with 256-pixel JPEGs (the captions stage, in a temporary folder) and each image's
noun phrases, then times the train stage's own batch path in one process with one torch thread — what one
DataLoader worker does: components.data.stream.TrainBatches reading the tars, decoding the JPEGs, open_clip's
training transform at 224 px (random resized crop, normalisation), the caption tokens and C2LIP's concept
batch (distinct phrases tokenized, padded or trimmed). Prints samples/s per worker (= per CPU core: the
target is >= 100, so 16 cores feed a GPU at 1,600/s), at 224 px and at the default world's 64 px.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import open_clip  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from components import captions as captions_stage  # noqa: E402
from components.data.stream import TrainBatches  # noqa: E402
from components.method import batches as builders  # noqa: E402
from components.shared.params import CaptionsParams, validate_params  # noqa: E402


def write_shards(root: Path, images: int, size: int) -> tuple[list[str], dict[str, list[str]]]:
    params = CaptionsParams.model_validate({
        "output_dir": str(root / "captions"), "stats_path": str(root / "captions.json"), "contact_sheet": None,
        "shard_size": 256, "workers": 1, "shapesworld": {"train_images": images, "test_images": 0, "image_size": size}})
    captions_stage.run(params)
    manifest = pq.read_table(root / "captions" / "manifest.parquet").to_pandas()
    phrases = {k: list(p) for k, p in zip(manifest.key, manifest.object_phrases, strict=True)}
    return sorted(str(p) for p in (root / "captions" / "train").glob("*.tar")), phrases


def samples_per_s(shards: list[str], phrases: dict[str, list[str]], resolution: int, batch: int, batches: int, trim: bool) -> float:
    params = validate_params("train", {
        "data": {"shards": shards, "concepts_dir": "unused", "shuffle_buffer": 256, "workers": 0, "caption_field": "long"},
        "model": {"name": "ViT-B-16", "init": "scratch"}, "method": {"name": "c2lip"},
        "global_batch": batch, "micro_batch": batch, "steps": batches, "output_dir": "unused"})
    transform = open_clip.image_transform(resolution, is_train=True)
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    stream = TrainBatches(params, shards, 0, 1, 0, transform, tokenizer, phrases, builders.concepts_batch, trim_phrases=trim)
    it = iter(stream)
    next(it)  # warm-up: the first tar opened, the first JPEG decoded
    start = time.perf_counter()
    for _ in islice(it, batches):
        pass
    return batch * batches / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one DataLoader worker
    batches = args.images // args.batch - 2
    with tempfile.TemporaryDirectory() as tmp:
        print(f"one worker (1 torch thread), batches of {args.batch}, {batches} batches timed after one warm-up")
        for size, resolution in ((256, 224), (64, 64)):
            shards, phrases = write_shards(Path(tmp) / str(size), args.images, size)
            for trim in (False, True):
                rate = samples_per_s(shards, phrases, resolution, args.batch, batches, trim)
                print(f"  {size}-px JPEGs -> {resolution}-px crops, phrases {'trimmed' if trim else 'padded to 77'}: "
                      f"{rate:7.1f} samples/s per worker (target >= 100 at 224 px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
