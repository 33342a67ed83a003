"""Noun phrases as strings: the rules every extractor's candidates pass (spaCy's noun chunks and a language model's
answer lines alike), and how extracted phrases are compared — with ShapesWorld's true object phrases (the concepts
stage's quality figures) and with hand-labelled ones (tests/data/noun_phrases_gold.jsonl, bench/concepts_gold.py,
bench/concepts_llm.py). Pure functions of strings."""

from __future__ import annotations

import re
from collections.abc import Iterable

DETERMINERS = ("a ", "an ", "the ", "this ", "that ", "these ", "those ")


def normalise(text: str) -> str:
    """Lower-case, single spaces, no leading determiner: how phrases are compared."""
    text = " ".join(text.split()).lower()
    for det in DETERMINERS:
        if text.startswith(det):
            return text[len(det):]
    return text


def filter_phrases(candidates: Iterable[tuple[list[str], str]], rules) -> tuple[list[str], int]:
    """The phrase rules shared by every extractor (``rules``: PhraseRules), over candidates (words, head word) in
    order: stop phrases (compared without a leading determiner) and stop heads dropped, at most max_words words (the
    last ones, where the head is), duplicates dropped ("a dog" then "the dog": one concept), at most max_phrases.
    Returns the phrases and how many were cut to max_words."""
    stop_phrases = {normalise(p) for p in rules.stop_phrases}
    stop_heads = {h.lower() for h in rules.stop_heads}
    phrases, seen, cut = [], set(), 0
    for words, head in candidates:
        if normalise(" ".join(words)) in stop_phrases or head.lower() in stop_heads:
            continue
        if len(words) > rules.max_words:
            words, cut = words[-rules.max_words:], cut + 1
        phrase = " ".join(words)
        if normalise(phrase) in seen:
            continue
        seen.add(normalise(phrase))
        phrases.append(phrase)
        if len(phrases) == rules.max_phrases:
            break
    return phrases, cut


def fallback_phrases(caption: str, rules) -> list[str]:
    """The caption itself as its one phrase (C2LIP's fallback when no phrase was found), under the same rules as
    every other phrase: its last max_words words, and none when it is a stop phrase or ends in a stop head."""
    words = caption.split()
    return filter_phrases([(words, words[-1])], rules)[0] if words else []


def phrase_quality(extracted: list[list[str]], truth: list[list[str]]) -> dict[str, float]:
    """Recall: true object phrases found exactly (up to case and determiner). Precision: extracted
    phrases that name an object — the full phrase or a shorter reference ("the red circle" for
    "a large red circle")."""
    found = true_total = object_like = extracted_total = 0
    for phrases, objects in zip(extracted, truth, strict=True):
        norms = {normalise(p) for p in phrases}
        true_norms = [normalise(o) for o in objects]
        found += sum(t in norms for t in true_norms)
        true_total += len(true_norms)
        references = {" ".join(t.split()[i:]) for t in true_norms for i in range(len(t.split()))}
        object_like += sum(normalise(p) in references for p in phrases)
        extracted_total += len(phrases)
    return {
        "recall": round(found / true_total, 4) if true_total else None,
        "precision": round(object_like / extracted_total, 4) if extracted_total else None,
        "captions": len(truth),
    }


# Words a hand-labelled phrase may or may not start with and still name the same concept ("his laptop",
# "two zebras", "another cat"): stripped from the front before gold phrases and extracted ones are compared.
GOLD_LEADING_WORDS = frozenset(
    "a an the this that these those his her its their my your our it's some several many few one two three four "
    "five six seven eight nine ten another other each both all any".split()
)


NUMBER = re.compile(r"^\d[\d,.]*$")


def phrase_key(phrase: str) -> str:
    """How a phrase is compared with the gold set's: lower-case, single spaces, leading determiners,
    possessives and quantifiers dropped — numbers too, in words or digits ("two zebras", "6 plates")."""
    words = phrase.lower().split()
    while len(words) > 1 and (words[0] in GOLD_LEADING_WORDS or NUMBER.match(words[0])):
        words = words[1:]
    return " ".join(words)


def gold_quality(extracted: list[list[str]], gold: list[list[str]]) -> dict[str, float]:
    """Phrase precision and recall against hand-labelled phrases (tests/data/noun_phrases_gold.jsonl):
    per caption, the distinct keys (:func:`phrase_key`) extracted and labelled; precision = shared /
    extracted, recall = shared / labelled, both over all captions."""
    shared = n_extracted = n_gold = 0
    for phrases, labels in zip(extracted, gold, strict=True):
        got, want = {phrase_key(p) for p in phrases}, {phrase_key(p) for p in labels}
        shared += len(got & want)
        n_extracted += len(got)
        n_gold += len(want)
    return {"precision": shared / n_extracted if n_extracted else 0.0, "recall": shared / n_gold if n_gold else 0.0,
            "captions": len(gold), "extracted": n_extracted, "labelled": n_gold}
