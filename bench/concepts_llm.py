"""spaCy's noun phrases against a language model's, on real COCO captions (SugarCrepe's positive captions).

    python bench/concepts_llm.py --model Qwen/Qwen2.5-1.5B-Instruct [--captions 500] [--params params/concepts.yaml]

Both extractors run through the concepts stage's own code (components.concepts.extract: the same rules and the
same output) on the first ``--captions`` distinct positive captions of the SugarCrepe files in
../shared/benchmarks/sugar_crepe, then on the hand-labelled gold sets (tests/data/noun_phrases_gold*.jsonl).
Prints, per extractor: phrases per caption, captions that fell back to the caption itself, captions/s; between
them: mean Jaccard overlap of each caption's phrase sets (compared as components.data.phrase_quality.phrase_key
does) and the share of captions with identical sets; and each one's precision/recall on the gold sets.
``--model`` is a hub name (cached: HF_HUB_OFFLINE=1) or a local folder; ``--device``/``--dtype`` as in params.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.concepts import extract, gold_quality, load_nlp, phrase_key  # noqa: E402
from components.shared.params import LlmExtractorParams, load_params  # noqa: E402

SUGARCREPE = ROOT.parent / "shared" / "benchmarks" / "sugar_crepe"
GOLD = [ROOT / "tests" / "data" / "noun_phrases_gold.jsonl", ROOT / "tests" / "data" / "noun_phrases_gold_heldout.jsonl"]


def sugarcrepe_captions(folder: Path, count: int) -> list[str]:
    """The first ``count`` distinct positive captions over SugarCrepe's files, in file-name then item order."""
    seen: dict[str, None] = {}
    for path in sorted(folder.glob("*.json")):
        for item in json.loads(path.read_text()).values():
            seen.setdefault(" ".join(item["caption"].split()), None)
    return list(seen)[:count]


def run(nlp, captions: list[str], params) -> tuple[list[list[str]], int, float]:
    started = time.perf_counter()
    results = list(extract(nlp, captions, params))
    return [r["phrases"] for r in results], sum(r["fallback"] for r in results), time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the language model: hub name or local folder")
    parser.add_argument("--captions", type=int, default=500)
    parser.add_argument("--params", default=str(ROOT / "params" / "concepts.yaml"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sugarcrepe", default=str(SUGARCREPE))
    args = parser.parse_args()
    if not Path(args.sugarcrepe).is_dir():
        print(f"error: {args.sugarcrepe} does not exist (the SugarCrepe files of ../shared/benchmarks)", file=sys.stderr)
        return 2
    spacy_params = load_params("concepts", args.params).model_copy(update={"n_process": 1})
    llm = LlmExtractorParams(model=args.model, device=args.device, dtype=args.dtype, batch_size=args.batch_size)
    llm_params = spacy_params.model_copy(update={"extractor": "llm", "llm": llm})
    extractors = {"spacy": (load_nlp(spacy_params), spacy_params), "llm": (load_nlp(llm_params), llm_params)}
    captions = sugarcrepe_captions(Path(args.sugarcrepe), args.captions)
    phrases = {}
    print(f"{len(captions)} SugarCrepe positive captions; spaCy {spacy_params.spacy_model}; LLM {args.model}")
    for name, (nlp, params) in extractors.items():
        phrases[name], fallback, seconds = run(nlp, captions, params)
        per = sum(map(len, phrases[name])) / len(captions)
        print(f"  {name:>5}: {per:.2f} phrases/caption, {fallback} fell back to the caption, {len(captions) / seconds:.1f} captions/s")
    sets = [({phrase_key(p) for p in a}, {phrase_key(p) for p in b}) for a, b in zip(phrases["spacy"], phrases["llm"], strict=True)]
    jaccard = sum(len(a & b) / len(a | b) if a | b else 1.0 for a, b in sets) / len(sets)
    print(f"  agreement: mean Jaccard {jaccard:.3f}, identical sets {sum(a == b for a, b in sets) / len(sets):.3f}")
    for path in GOLD:
        gold = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for name, (nlp, params) in extractors.items():
            extracted, _, _ = run(nlp, [g["caption"] for g in gold], params)
            q = gold_quality(extracted, [g["phrases"] for g in gold])
            print(f"  {path.name} ({q['captions']} captions) {name:>5}: precision {q['precision']:.3f}, recall {q['recall']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
