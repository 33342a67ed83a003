"""What a training launch costs before its first step, as the dataset grows: the shards' preflight and the phrases.

    python bench/data_startup.py [--shards 280] [--samples-per-shard 1000] [--captions 1000000]

1. Preflight over ``--shards`` synthetic tar shards (a 512-byte image stand-in and a caption per sample): the first
   launch reads every shard's tar headers into its cached table (components.data.shard_index); every later launch,
   on every rank, reads the cached counts. The earlier preflight read every shard's headers at every launch on every
   rank, which is the first launch's figure. Target: a launch over 280 shards <= 30 s. The per-shard figure at
   10,000 samples (CC3M's shards) is extrapolated from the measured one, linear in the members, and labelled so.
2. The phrase table of ``--captions`` captions (5 phrases each, from a vocabulary of 20,000): the earlier dict
   (every process built its own) against the memory-mapped table (converted once, then mapped by every process):
   seconds to load and the process's resident memory after 10,000 lookups, each measured in a fresh subprocess.
   Target: <= 100 MB resident per process and loaded in <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from measured import record  # (bench/measured.py: the figures README shows)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def preflight(root: Path, shards: int, per_shard: int) -> tuple[float, float, float]:
    from loader import synthetic_shards  # bench/loader.py's writer: a 512-byte stand-in image and a caption per sample

    from components.data.shard_index import sample_counts

    paths = synthetic_shards(root / "shards", shards, per_shard, 512)
    start = time.perf_counter()
    for path in paths:  # the earlier preflight: every member header of every shard, at every launch on every rank
        with tarfile.open(path) as tar:
            for _ in tar:
                pass
    earlier = time.perf_counter() - start
    start = time.perf_counter()
    counts = sample_counts(paths)
    first = time.perf_counter() - start
    start = time.perf_counter()
    assert sample_counts(paths) == counts
    later = time.perf_counter() - start
    per_shard_s = first / shards
    print(f"preflight over {shards} shards x {per_shard} samples: the earlier header check {earlier:.2f} s at every launch on every "
          f"rank; now the first launch {first:.2f} s ({per_shard_s * 1000:.1f} ms a shard), every later launch {later * 1000:.1f} ms "
          "(target <= 30 s)")
    print(f"  extrapolated, not measured: 280 shards of 10,000 samples: first launch {per_shard_s * 10_000 / per_shard * 280:.0f} s "
          f"(once per dataset and machine), later launches about {later / shards * 280 * 1000:.0f} ms")
    return earlier, first, later


def write_phrases(concepts: Path, captions: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    concepts.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    vocabulary = np.array([f"a {c} {s} number {i}" for i, (c, s) in enumerate(zip(rng.integers(0, 99, 20_000), rng.integers(0, 99, 20_000),
                                                                                       strict=True))])
    per_file = 250_000
    for start in range(0, captions, per_file):
        n = min(per_file, captions - start)
        picks = vocabulary[rng.integers(0, len(vocabulary), (n, 5))]
        pq.write_table(pa.table({"key": [f"train-{start + i:08d}" for i in range(n)], "phrases": picks.tolist()}),
                       concepts / f"part-{start // per_file:03d}.parquet")


PROBE = r"""
import json, random, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path

def memory():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    rollup = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line and not line.startswith("5"))
    return {**{k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}, "Pss": int(rollup["Pss"].split()[0]) / 1024}

import pyarrow.parquet as pq, numpy  # the libraries both ways need, before the baseline
before = memory()
start = time.perf_counter()
if sys.argv[3] == "dict":
    phrases = {}
    for path in sorted(Path(sys.argv[2]).glob("*.parquet")):
        table = pq.read_table(path, columns=["key", "phrases"])
        for key, items in zip(table.column("key").to_pylist(), table.column("phrases").to_pylist(), strict=True):
            phrases[key] = list(items)
else:
    from components.data.phrase_table import load_phrases
    phrases = load_phrases(Path(sys.argv[2]))
loaded = time.perf_counter() - start
keys = [f"train-{random.randrange(int(sys.argv[4])):08d}" for _ in range(10_000)]
start = time.perf_counter()
found = sum(len(phrases[k]) for k in keys)
lookups = time.perf_counter() - start
print("ready", flush=True)
sys.stdin.readline()  # every process of the group has done its lookups: shared pages are shared now
after = memory()
print(json.dumps({"load_s": loaded, "lookup_us": lookups / len(keys) * 1e6, "found": found,
                  **{k: after[k] - before[k] for k in after}}))
"""


def probe(concepts: Path, way: str, captions: int, processes: int = 1) -> dict:
    """``processes`` fresh processes load the phrases and look up 10,000 keys each, then measure together (PSS divides
    the pages they share); the mean of their figures."""
    group = [subprocess.Popen([sys.executable, "-c", PROBE, str(ROOT), str(concepts), way, str(captions)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=os.environ) for _ in range(processes)]
    for process in group:
        assert process.stdout.readline().strip() == "ready"
    rows = []
    for process in group:
        out, _ = process.communicate("go\n")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def phrases(root: Path, captions: int) -> tuple[dict, dict, dict]:
    concepts = root / "concepts"
    write_phrases(concepts, captions)
    earlier = probe(concepts, "dict", captions)
    first = probe(concepts, "table", captions)  # converts the Parquet files, then maps them
    later = probe(concepts, "table", captions)  # what every process does once the table exists
    four = probe(concepts, "table", captions, processes=4)  # four ranks or workers of one machine at once
    print(f"phrases of {captions:,} captions, 10,000 lookups each (MB added to the process: resident, of which private / "
          "file-backed, and PSS: shared pages divided among the processes that map them):")
    for name, row in (("earlier dict, every process", earlier), ("mapped table, first process (converts)", first),
                      ("mapped table, a later process", later), ("mapped table, each of 4 at once", four)):
        print(f"  {name:40s} load {row['load_s']:6.2f} s  resident +{row['VmRSS']:7.1f} (private +{row['RssAnon']:.1f}, "
              f"file +{row['RssFile']:.1f})  PSS +{row['Pss']:.1f}  lookup {row['lookup_us']:.1f} us")
    print("  targets: <= 100 MB resident per process, loaded in <= 5 s (the file-backed pages are the page cache's, one "
          "copy per machine)")
    return earlier, later, four


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=280)
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--captions", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["C2LIP_SHARD_INDEX_CACHE"] = str(Path(tmp) / "cache")  # the tables and phrase table: gone with the data
        earlier, first, later = preflight(Path(tmp), args.shards, args.samples_per_shard)
        before, table, four = phrases(Path(tmp), args.captions)
    record("python bench/data_startup.py", f"a launch's preflight over {args.shards} shards × {args.samples_per_shard:,} samples (first launch: every "
           "shard's tar headers indexed and cached; later: the cached counts), and the phrases of "
           f"{args.captions:,} captions: the earlier per-process dict against the memory-mapped table, each in fresh processes after "
           "10,000 lookups",
           f"preflight: earlier {earlier:.1f} s at every launch on every rank; now {first:.1f} s once, then **{later * 1000:.1f} ms** (target "
           f"≤ 30 s); phrases: earlier {before['load_s']:.2f} s and +{before['RssAnon']:,.0f} MB private per process; now "
           f"**{table['load_s']:.2f} s** and **+{table['RssAnon']:,.0f} MB** private per process plus {table['RssFile']:,.0f} MB of file pages "
           f"shared by every process of the machine (PSS {four['Pss']:,.0f} MB each with 4 processes; target ≤ 100 MB, ≤ 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
