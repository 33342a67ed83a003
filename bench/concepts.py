"""Benchmark: noun-phrase extraction, the naive spaCy loop against the concepts stage's path.

    python bench/concepts.py [--captions 10000]

On DreamLIP-like captions of 40-60 words (generated here, seeded), prints captions/s for
  - naive:  [nlp(c) for c in captions] with the full pipeline, then doc.noun_chunks;
  - stage:  components.concepts.extract (nlp.pipe, unneeded components never loaded, batches, the
            phrase rules) with n_process=1 and with all cores;
and the ratios to the naive loop, all measured in one run (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

from components.concepts import extract, load_nlp  # noqa: E402
from components.shared.params import ConceptsParams  # noqa: E402

ADJ = ["red", "small", "wooden", "old", "bright", "large", "white", "rusty", "colorful", "quiet", "busy", "green"]
NOUN = ["dog", "table", "street", "window", "woman", "bicycle", "building", "tree", "cup", "car", "bench", "lamp"]
PLACE = ["in the park", "near the river", "on a sunny day", "inside a small kitchen", "next to the road", "under a blue sky"]
TEMPLATES = [
    "The image shows a {a} {n} standing {p}.",
    "In the background there is a {a} {n} and a {a2} {n2}.",
    "A {a} {n} is placed beside a {a2} {n2} {p}.",
    "On the left side of the picture, a {a} {n} leans against the {a2} {n2}.",
    "The scene is lit by soft light, and a {a} {n} can be seen {p}.",
    "Several people walk past the {a} {n} while a {a2} {n2} waits {p}.",
]


def dreamlip_like(n: int, seed: int = 0) -> list[str]:
    """Multi-sentence descriptive captions of 40-60 words, like DreamLIP's long captions."""
    rng = random.Random(seed)
    captions = []
    while len(captions) < n:
        sentences, words = [], 0
        while words < 40:
            s = rng.choice(TEMPLATES).format(
                a=rng.choice(ADJ), n=rng.choice(NOUN), a2=rng.choice(ADJ), n2=rng.choice(NOUN), p=rng.choice(PLACE)
            )
            sentences.append(s)
            words += len(s.split())
        if words <= 60:
            captions.append(" ".join(sentences))
    return captions


def rate(fn, captions: list[str]) -> float:
    start = time.perf_counter()
    fn(captions)
    return len(captions) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--captions", type=int, default=10000)
    args = parser.parse_args()
    captions = dreamlip_like(args.captions)
    params = ConceptsParams()
    cores = os.cpu_count() or 1

    import spacy

    full = spacy.load(params.spacy_model)  # every component, as a first attempt would load it
    fast = load_nlp(params)
    full("warm up"), fast("warm up")

    naive = rate(lambda cs: [[c.text for c in full(t).noun_chunks] for t in cs], captions)
    one = rate(lambda cs: list(extract(fast, cs, params, n_process=1)), captions)
    many = rate(lambda cs: list(extract(fast, cs, params, n_process=cores)), captions)
    words = sum(len(c.split()) for c in captions) / len(captions)
    print(f"{len(captions)} DreamLIP-like captions, {words:.1f} words on average, spaCy {params.spacy_model}")
    print(f"  naive [nlp(c) for c in captions]   {naive:8.1f} captions/s   1.00x")
    print(f"  stage path, n_process=1            {one:8.1f} captions/s   {one / naive:.2f}x")
    print(f"  stage path, n_process={cores:<2d}           {many:8.1f} captions/s   {many / naive:.2f}x")
    record("python bench/concepts.py", f"noun phrases of {len(captions):,} DreamLIP-like captions (40–60 words): naive `[nlp(c) for c in captions]` "
           "vs the stage's path (the phrase rules included)",
           f"naive {naive:.1f}, stage n_process=1 {one:.1f} ({one / naive:.2f}×), n_process={cores} {many:.1f} captions/s "
           f"(**{many / naive:.2f}×**; target ≥ 3×)", naive=naive, one=one, many=many)


if __name__ == "__main__":
    main()
