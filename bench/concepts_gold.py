"""Noun-phrase quality on real captions: the concepts stage's rules against the hand-labelled gold set.

    python bench/concepts_gold.py [--params params/concepts.yaml] [--errors]

Reads tests/data/noun_phrases_gold.jsonl (224 SugarCrepe positive captions, COCO-derived, each with the
object phrases a person marked; labelling conventions in tests/data/README.md), runs the stage's
extraction (components.concepts.extract, the rules of the given params) over them and prints phrase
precision and recall (components.concepts.gold_quality). ``--errors`` lists each caption's extra and
missed phrases.
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

GOLD = ROOT / "tests" / "data" / "noun_phrases_gold.jsonl"


def read_gold(path: Path = GOLD) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=str(ROOT / "params" / "concepts.yaml"))
    parser.add_argument("--errors", action="store_true", help="list each caption's extra and missed phrases")
    args = parser.parse_args()
    params = load_params("concepts", args.params)
    gold = read_gold()
    extracted = [r["phrases"] for r in extract(load_nlp(params), [g["caption"] for g in gold], params)]
    quality = gold_quality(extracted, [g["phrases"] for g in gold])
    if args.errors:
        for g, phrases in zip(gold, extracted):
            got, want = {phrase_key(p) for p in phrases}, {phrase_key(p) for p in g["phrases"]}
            if got != want:
                print(f"{g['id']}: {g['caption']}\n    extra: {sorted(got - want)}  missed: {sorted(want - got)}")
    print(f"{quality['captions']} captions, {quality['labelled']} labelled phrases, {quality['extracted']} extracted: "
          f"precision {quality['precision']:.3f}, recall {quality['recall']:.3f} ({params.spacy_model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
