"""Ingestion of a URL table: the captions stage against a loopback image server, with 1, 2 and 4 processes.

    python bench/ingestion.py [--images 384] [--latency-ms 100] [--side 1600]

A separate process serves ``--images`` distinct JPEGs of ``--side`` x 3/4 ``--side`` pixels (a web image's size) on
127.0.0.1, each answer delayed by ``--latency-ms`` (a web server's round trip), to a URL table of that many rows.
The real stage (components.captions.run: rows split into a file per shard, shards built in ``workers``
processes with 8 download threads each, images resized to max_side 512 at ingestion, tars + manifest + stats)
runs with workers = 1, 2 and 4, and with max_side off at the widest setting. Prints samples/s from the stage's own
wall-time figure, the time spent waiting on the downloads (and the resizing, done in the download threads), the
bytes a sample takes in the shards, and what a training loader pays to decode an original against a resized image.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measured import record  # (bench/measured.py: the figures README shows)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER = r"""
import http.server, io, sys, time
import numpy as np
from PIL import Image
count, side, latency = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(0)
base = rng.integers(0, 255, (side * 3 // 4 // 8, side // 8, 3), dtype=np.uint8)
images = []
for i in range(count):  # smooth, distinct photos: a coarse random field upscaled, shifted per image
    buf = io.BytesIO()
    Image.fromarray(np.roll(base, i, axis=1)).resize((side, side * 3 // 4), Image.BILINEAR).save(buf, "JPEG", quality=90)
    images.append(buf.getvalue())
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(latency)
        body = images[int(self.path.strip("/").split(".")[0]) % count]
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], sum(map(len, images)) // count, flush=True)
server.serve_forever()
"""


def ingest(table: Path, root: Path, workers: int, max_side: int | None) -> dict:
    from components.captions import run
    from components.shared.params import CaptionsParams

    params = CaptionsParams.model_validate({
        "source": "table", "caption_field": "long", "shard_size": 32, "workers": workers, "contact_sheet": None,
        "output_dir": str(root / "out"), "stats_path": str(root / "stats.json"),
        "table": {"path": str(table), "image_column": "url", "caption_columns": {"long": "caption"}, "max_side": max_side,
                  "download": {"concurrency": 8, "timeout_s": 60, "retries": 0, "max_bytes": 20_000_000,
                               "allow_hosts": ["127.0.0.1"]}}})
    with contextlib.redirect_stderr(io.StringIO()):  # the stage's progress bar
        stats = run(params)
    jpegs = sum(p.stat().st_size for p in (root / "out").rglob("*.tar"))
    return {**stats, "tar_bytes": jpegs}


def decode_rates(side: int, max_side: int = 512) -> tuple[float, float]:
    """JPEG decodes per second on one core of a ``side``-wide photo-like image and of it resized to ``max_side``: what a
    training loader worker pays per sample for an original against an ingested image."""
    import numpy as np
    from PIL import Image

    from components.data.sources import to_jpeg

    field = np.random.default_rng(0).integers(0, 255, (side * 3 // 4 // 8, side // 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(field).resize((side, side * 3 // 4), Image.BILINEAR).save(buf, "JPEG", quality=90)
    rates = []
    for data in (buf.getvalue(), to_jpeg(buf.getvalue(), max_side=max_side)):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < 2:
            Image.open(io.BytesIO(data)).convert("RGB")
            count += 1
        rates.append(count / (time.perf_counter() - start))
    return rates[0], rates[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--latency-ms", type=float, default=100)
    parser.add_argument("--side", type=int, default=1600)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.images), str(args.side), str(args.latency_ms / 1000)],
                              stdout=subprocess.PIPE, text=True)
    try:
        port, mean_bytes = map(int, server.stdout.readline().split())
        print(f"{args.images} JPEGs of {args.side}x{args.side * 3 // 4} px ({mean_bytes / 1e3:.0f} kB each), {args.latency_ms:.0f} ms "
              f"per answer, on {os.cpu_count()} CPU core(s); 8 download threads per process, shards of 32")
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "urls.csv"
            with open(table, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["url", "caption"])
                writer.writerows([f"http://127.0.0.1:{port}/{i}.jpg", f"image {i}"] for i in range(args.images))
            rows = []
            for workers, max_side in ((1, 512), (2, 512), (4, 512), (4, None)):
                root = Path(tmp) / f"w{workers}-{max_side}"
                start = time.perf_counter()
                stats = ingest(table, root, workers, max_side)
                wall = time.perf_counter() - start
                rows.append((workers, max_side, stats, wall))
                print(f"  {workers} process(es), max_side {max_side}: {stats['run_samples_per_second']:6.1f} samples/s "
                      f"({stats['samples_written']} written in {stats['run_seconds']:.1f} s; downloads waited on "
                      f"{stats['source_seconds']:.1f} of {stats['build_seconds']:.1f} shard-seconds); "
                      f"{stats['tar_bytes'] / stats['samples_written'] / 1e3:.0f} kB a sample in the shards")
            one = rows[0][2]["run_samples_per_second"]
            print("  speed-up over 1 process: " + ", ".join(f"{w} -> {s['run_samples_per_second'] / one:.2f}x"
                                                           for w, m, s, _ in rows if m is not None))
            original, resized = decode_rates(args.side)
            print(f"  decoding for training, one core: the original {original:.0f} images/s, resized to 512 {resized:.0f} "
                  f"images/s ({resized / original:.1f}x)")
            print(json.dumps({"samples_per_second": {f"{w}{'' if m else '-originals'}": s["run_samples_per_second"]
                                                     for w, m, s, _ in rows}}))
            rate = {(w, m): s["run_samples_per_second"] for w, m, s, _ in rows}
            size = {m: s["tar_bytes"] / s["samples_written"] / 1e3 for w, m, s, _ in rows if w == 4}
            record("python bench/ingestion.py", f"a URL table of {args.images} rows through the captions stage against a loopback server "
                   f"({args.side}×{args.side * 3 // 4} JPEGs, {args.latency_ms:.0f} ms per answer), 1, 2 and 4 processes with 8 download "
                   "threads each, images resized to 512 at ingestion; then the decode speed a training worker sees",
                   f"{rate[1, 512]:.1f}, {rate[2, 512]:.1f}, {rate[4, 512]:.1f} samples/s (**{rate[2, 512] / one:.2f}×**, "
                   f"**{rate[4, 512] / one:.2f}×** over one process); originals kept at 4 processes {rate[4, None]:.1f}; decode per core: "
                   f"original {original:.0f} images/s, resized {resized:.0f} (**{resized / original:.1f}×**); a sample {size[512]:.0f} kB "
                   f"in the shards instead of {size[None]:.0f}")
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
