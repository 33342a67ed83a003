"""Noun-phrase quality on real captions: the concepts stage's rules against hand-labelled gold sets.

    python bench/concepts_gold.py [--params params/concepts.yaml] [--errors]

Reads tests/data/noun_phrases_gold.jsonl (224 SugarCrepe positive captions, the set the rules were written
against) and tests/data/noun_phrases_gold_heldout.jsonl (56 more, labelled after the rules were written and
never used to change them), with the phrases a person marked (conventions in tests/data/README.md). Runs
the stage's extraction (components.concepts.extract) with the params' rules and with the rules as they
were before the gold set (no of_heads, no list splitting, the old stop heads), and prints phrase precision
and recall (components.concepts.gold_quality) for each. ``--errors`` lists the extra and missed phrases
of the params' rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.concepts import extract, gold_quality, load_nlp, phrase_key  # noqa: E402
from components.shared.params import load_params  # noqa: E402

GOLD = {"written against": ROOT / "tests" / "data" / "noun_phrases_gold.jsonl",
        "held out": ROOT / "tests" / "data" / "noun_phrases_gold_heldout.jsonl"}
# the rules before the gold set: noun chunks, the stop-list and these stop heads, nothing else
BEFORE = {"of_heads": [], "split_merged_chunks": False, "stop_heads": [
    "image", "images", "picture", "pictures", "photo", "photos", "photograph", "background", "foreground", "left", "right",
    "top", "bottom", "side", "center", "centre", "middle", "shape", "shapes", "view", "scene", "frame"]}


def read_gold(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=str(ROOT / "params" / "concepts.yaml"))
    parser.add_argument("--errors", action="store_true", help="list each caption's extra and missed phrases")
    args = parser.parse_args()
    params = load_params("concepts", args.params)
    before = params.model_copy(update={"rules": params.rules.model_copy(update=BEFORE)})
    nlp = load_nlp(params)
    for label, path in GOLD.items():
        gold = read_gold(path)
        for name, p in (("before", before), ("now", params)):
            extracted = [r["phrases"] for r in extract(nlp, [g["caption"] for g in gold], p)]
            q = gold_quality(extracted, [g["phrases"] for g in gold])
            print(f"{label:>15} ({q['captions']} captions, {q['labelled']} labelled phrases), rules {name:>6}: "
                  f"{q['extracted']} extracted, precision {q['precision']:.3f}, recall {q['recall']:.3f}")
            if args.errors and name == "now":
                for g, phrases in zip(gold, extracted, strict=True):
                    got, want = {phrase_key(x) for x in phrases}, {phrase_key(x) for x in g["phrases"]}
                    if got != want:
                        print(f"    {g['id']}: {g['caption']}\n        extra: {sorted(got - want)}  missed: {sorted(want - got)}")
    print(f"spaCy {params.spacy_model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
