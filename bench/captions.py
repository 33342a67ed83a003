"""Benchmark: ShapesWorld shard building, one worker against all cores, measured in one run.

    python bench/captions.py [--images 8000]

Prints samples/s for workers=1 and workers=<all cores> through the real stage (`components.captions.run`,
tars + manifest + stats), and their ratio. The machine is shared and noisy: compare the ratio, not the
absolute figures, across machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

from components.captions import run  # noqa: E402
from components.shared.params import CaptionsParams  # noqa: E402


def measure(images: int, workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        params = CaptionsParams(
            output_dir=Path(tmp) / "out", stats_path=Path(tmp) / "stats.json", contact_sheet=None,
            shard_size=500, workers=workers,
            shapesworld={"train_images": images, "test_images": 0},
        )
        start = time.perf_counter()
        run(params)
        return images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=8000)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    measure(500, 1)  # warm-up: first imports and caches must not count against workers=1
    one = measure(args.images, 1)
    many = measure(args.images, cores)
    print(f"ShapesWorld 64 px, {args.images} images, through the captions stage")
    print(f"  workers=1       {one:8.0f} samples/s")
    print(f"  workers={cores:<2d}      {many:8.0f} samples/s")
    print(f"  ratio all/one   {many / one:8.2f}x   (time for 40,000 images with {cores} workers: {40000 / many:.0f} s)")
    record("python bench/captions.py", "ShapesWorld shards through the stage, 1 worker vs all cores",
           f"{one:,.0f} vs {many:,.0f} samples/s: {many / one:.2f}× (40,000 images in ~{40000 / many:.0f} s)", one=one, many=many)


if __name__ == "__main__":
    main()
