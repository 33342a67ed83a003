"""Benchmark: how many of a batch's noun phrases are distinct on real captions, i.e. what C2LIP saves by encoding each
distinct phrase once per batch (components/method/batches.concept_batch) instead of every occurrence.

    python bench/phrase_repeats.py [--captions FILE] [--batches 96 256 768] [--json OUT]

Captions: ``--captions`` (a text file, one caption per line), else the human-written COCO captions of SugarCrepe's
positives in ../shared/benchmarks/sugar_crepe/ (real web-like captions; the benchmark files are not part of a
user's clone, and the script says so). Phrases come from the concepts stage's own extractor (spaCy noun chunks and
the phrase rules of params/concepts.yaml). For each batch size, the captions are shuffled (seeded) into batches and
each batch counts its phrase occurrences K and its distinct phrases U; it prints the mean U / K (the share of text
tower passes left) and K / U (the phrase encodings' speed-up). bench/train_gpu.py --distinct-share takes the figure
to time whole training steps with the same share of repeats.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

from components.concepts import extract, load_nlp  # noqa: E402
from components.shared.params import load_params  # noqa: E402

SUGARCREPE = ROOT.parent / "shared" / "benchmarks" / "sugar_crepe"


def real_captions(path: Path | None) -> tuple[list[str], str]:
    if path is not None:
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        return list(dict.fromkeys(lines)), str(path)
    if not SUGARCREPE.is_dir():
        sys.exit(f"phrase_repeats: no --captions file and no {SUGARCREPE} (the shared benchmark files sit beside the "
                 "project in CI; give a file of captions, one per line)")
    captions = [item["caption"] for f in sorted(SUGARCREPE.glob("*.json")) for item in json.loads(f.read_text()).values()]
    return list(dict.fromkeys(captions)), "SugarCrepe's COCO captions"


def distinct_shares(phrases: list[list[str]], batch: int, seed: int) -> tuple[float, float, float]:
    """(mean U/K over full batches, mean K per batch, mean U per batch)."""
    order = list(range(len(phrases)))
    random.Random(seed).shuffle(order)
    shares, ks, us = [], [], []
    for start in range(0, len(order) - batch + 1, batch):
        occurrences = [p for i in order[start:start + batch] for p in phrases[i]]
        if occurrences:
            shares.append(len(set(occurrences)) / len(occurrences))
            ks.append(len(occurrences))
            us.append(len(set(occurrences)))
    return statistics.mean(shares), statistics.mean(ks), statistics.mean(us)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--captions", type=Path, default=None, help="a text file of captions, one per line")
    parser.add_argument("--batches", type=int, nargs="+", default=[96, 256, 768], help="batch sizes (images per batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    captions, source = real_captions(args.captions)
    params = load_params("concepts", ROOT / "params" / "concepts.yaml")
    phrases = [r["phrases"] for r in extract(load_nlp(params), captions, params)]
    per_caption = statistics.mean(len(p) for p in phrases)
    print(f"{source}: {len(captions):,} distinct captions, {per_caption:.2f} phrases per caption ({params.spacy_model})")
    rows = []
    print("| images per batch | phrases (K) | distinct (U) | U / K | encodings saved | phrase-encoding speed-up K / U |")
    print("|---|---|---|---|---|---|")
    for batch in args.batches:
        if batch > len(captions):
            continue
        share, k, u = distinct_shares(phrases, batch, args.seed)
        rows.append({"batch": batch, "phrases": k, "distinct": u, "distinct_share": share})
        print(f"| {batch} | {k:.0f} | {u:.0f} | {share:.3f} | {1 - share:.1%} | {k / u:.2f}x |")
    if rows:
        record("python bench/phrase_repeats.py", f"distinct noun phrases per phrase occurrence in a batch of real captions ({len(captions):,} of "
               f"{source}, the concepts stage's extractor)",
               "U/K " + ", ".join(f"{r['distinct_share']:.3f} at {r['batch']}" for r in rows) + ": C2LIP's phrase encodings "
               + ", ".join(f"{1 / r['distinct_share']:.2f}×" for r in rows) + " fewer", hardware="none (a count)")
    if args.json:
        args.json.write_text(json.dumps({"source": source, "captions": len(captions), "phrases_per_caption": per_caption,
                                         "batches": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
