"""The training data path: one worker's throughput, the samples read per sample trained, a resume's first batch.

    python bench/loader.py [--images 1024] [--batch 64]

Writes ShapesWorld shards with 256-pixel JPEGs (the captions stage, in a temporary folder) and each image's
noun phrases, then times the train stage's own batch path in one process with one torch thread — what one
DataLoader worker does: components.data.stream.TrainBatches reading the tars, decoding the JPEGs, open_clip's
training transform at 224 px (random resized crop, normalisation), the caption tokens and C2LIP's concept
batch (distinct phrases tokenized, padded or trimmed). Prints samples/s per worker (= per CPU core: the
target is >= 100, so 16 cores feed a GPU at 1,600/s), at 224 px and at the default world's 64 px.

Then, on synthetic shards of small members (reading, not decoding, is what is counted):
- raw samples read per sample trained at 2 ranks x 4 loader workers, for the global order
  (components.data.sample_order: each worker reads its own micro-batches) and for the earlier per-rank stream,
  re-created here as it was (every worker read its rank's whole stream and kept every 4th micro-batch). Each worker
  runs in this process through the same method a DataLoader worker runs (TrainBatches.batches). Target <= 1.05.
- the time to the first micro-batch of a resume at epoch 4.9 of 200 shards (the tables cached, as after the first
  launch), against the time to read one whole shard (the target: under one shard's read), and the earlier
  stream's replay of the 4.9 epochs before it.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tarfile
import tempfile
import time
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import open_clip  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
import webdataset as wds  # noqa: E402
from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

from components import captions as captions_stage  # noqa: E402
from components.data.shard_index import sample_counts  # noqa: E402
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


def synthetic_shards(root: Path, shards: int, per_shard: int, payload: int) -> list[str]:
    """Tar shards of ``per_shard`` samples, each a ``payload``-byte .bin member and a .txt member."""
    root.mkdir(parents=True, exist_ok=True)
    blob, paths = bytes(payload), []
    for s in range(shards):
        path = root / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                for ext, data in (("bin", blob), ("txt", f"{s}/{i}".encode())):
                    info = tarfile.TarInfo(f"s{s:04d}-{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def _data_params(shards: list[str], micro_batch: int, world: int):
    return validate_params("train", {"data": {"shards": shards, "shuffle_buffer": 256, "workers": 0}, "method": {"name": "siglip"},
                                     "global_batch": micro_batch * world, "micro_batch": micro_batch, "processes": world,
                                     "output_dir": "unused"})


def earlier_stream(shards: list[str], seed: int, rank: int, world: int, buffer: int):
    """The per-rank stream the loader used before the global order, as it was: each epoch dealt the permuted shards
    round-robin to the ranks and shuffled each rank's samples in a buffer; every worker read all of it."""
    for epoch in range(sys.maxsize):
        order = np.random.default_rng([seed, epoch]).permutation(len(shards))
        samples = wds.tariterators.tarfile_samples({"url": shards[i]} for i in order[rank::world])
        yield from wds.filters.shuffle(bufsize=buffer, initial=buffer, rng=random.Random(f"{seed}:{epoch}:{rank}"))(samples)


def earlier_reads(shards: list[str], rank: int, world: int, workers: int, worker: int, micro_batch: int, batches: int, start: int = 0) -> int:
    """Samples the earlier stream read for one worker to yield ``batches`` micro-batches from ``start`` on."""
    read = 0
    stream = earlier_stream(shards, 0, rank, world, 256)
    for _ in islice(stream, start * micro_batch):  # a resume replayed every sample before its position
        read += 1
    index, kept = start, 0
    while kept < batches:
        chunk = list(islice(stream, micro_batch))
        read += len(chunk)
        kept += (index - start) % workers == worker
        index += 1
    return read


def reads_per_trained(root: Path, world: int = 2, workers: int = 4, micro_batch: int = 8) -> tuple[float, float]:
    shards = synthetic_shards(root, 16, 100, 256)
    params = _data_params(shards, micro_batch, world)
    batches = 200 // workers  # per worker: 200 micro-batches per rank, 1,600 samples per rank (a whole epoch)
    now = earlier = trained = 0
    for rank in range(world):
        for worker in range(workers):
            dataset = TrainBatches(params, shards, rank, world, 0, None, None, None, None)
            dataset.make_batch = lambda samples, index: len(samples)  # read, not decoded
            trained += sum(islice(dataset.batches(worker, workers), batches))
            now += dataset.reader.samples_read
            earlier += earlier_reads(shards, rank, world, workers, worker, micro_batch, batches)
    print(f"samples read per sample trained, {world} ranks x {workers} workers, {trained} trained: global order "
          f"{now / trained:.3f} (target <= 1.05); the earlier per-rank stream {earlier / trained:.3f}")
    return now / trained, earlier / trained


def resume_first_batch(root: Path, micro_batch: int = 8) -> tuple[float, float, int, float]:
    shards = synthetic_shards(root, 200, 500, 1024)
    params = _data_params(shards, micro_batch, 1)
    sample_counts(shards)  # the first launch's preflight: every shard's table cached
    epoch_length = 200 * 500 // micro_batch * micro_batch
    index = int(4.9 * epoch_length) // micro_batch
    start = time.perf_counter()
    dataset = TrainBatches(params, shards, 0, 1, index, None, None, None, None)
    dataset.samples(index)
    first = time.perf_counter() - start
    start = time.perf_counter()
    one_shard = sum(1 for _ in wds.tariterators.tarfile_samples([{"url": shards[7]}]))
    shard_read = time.perf_counter() - start
    start = time.perf_counter()
    replayed = earlier_reads(shards, 0, 1, 1, 0, micro_batch, 1, start=index)
    replay = time.perf_counter() - start
    print(f"resume at epoch 4.9 of 200 shards x 500 samples (1 KB each): first micro-batch in {first * 1000:.1f} ms "
          f"({dataset.reader.samples_read} samples read); one whole shard ({one_shard} samples) read in {shard_read * 1000:.1f} ms "
          f"(ratio {first / shard_read:.2f}, target < 1); the earlier stream replayed {replayed:,} samples in {replay:.2f} s")
    return first, first / shard_read, replayed, replay


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one DataLoader worker
    batches = args.images // args.batch - 2
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["C2LIP_SHARD_INDEX_CACHE"] = str(Path(tmp) / "shard-index")  # the shards' tables: gone with them
        print(f"one worker (1 torch thread), batches of {args.batch}, {batches} batches timed after one warm-up")
        rates = {}
        for size, resolution in ((256, 224), (64, 64)):
            shards, phrases = write_shards(Path(tmp) / str(size), args.images, size)
            for trim in (False, True):
                rate = rates[resolution, trim] = samples_per_s(shards, phrases, resolution, args.batch, batches, trim)
                print(f"  {size}-px JPEGs -> {resolution}-px crops, phrases {'trimmed' if trim else 'padded to 77'}: "
                      f"{rate:7.1f} samples/s per worker (target >= 100 at 224 px)")
        now, earlier = reads_per_trained(Path(tmp) / "reads")
        first, ratio, replayed, replay = resume_first_batch(Path(tmp) / "resume")
    record("python bench/loader.py", "one DataLoader worker (1 thread): shard read by offset + JPEG decode + open_clip's train transform + caption "
           "tokens + C2LIP's concept batch; then samples read per sample trained at 2 ranks × 4 workers, and a resume's first micro-batch "
           "at epoch 4.9 of 200 shards",
           f"{rates[224, False]:.1f} samples/s at 224 px (phrases padded), {rates[224, True]:.1f} (trimmed) — **≥ 100 per core**; "
           f"{rates[64, False]:,.0f} / {rates[64, True]:,.0f} at the default 64 px; reads per sample trained **{now:.3f}** (target ≤ 1.05; "
           f"the earlier per-rank stream {earlier:.2f}); resume: first batch {first * 1000:.1f} ms, **{ratio:.2f}×** one shard's read "
           f"(target < 1; the earlier stream replayed {replayed:,} samples in {replay:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
