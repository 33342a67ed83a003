"""Noun phrases by a language model (concepts.extractor: llm): the answer parser and the phrase rules, a tiny causal
LM the tests build run end to end by the concepts stage, the empty-answer fallback to the caption, the params."""

import json

import pyarrow.parquet as pq
import pytest
from conftest import tiny_training_data
from pydantic import ValidationError
from tiny_hf import tiny_causal_lm

from components import concepts
from components.data.llm_phrases import LlmPhraseExtractor, phrases_from_answer
from components.shared.params import ConceptsParams, LlmExtractorParams, PhraseRules


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_training_data(tmp_path_factory.mktemp("llm_data"), test_images=10)


def test_an_answer_becomes_phrases_under_the_same_rules_as_spacys():
    rules = PhraseRules(max_phrases=4, max_words=3)
    answer = "1. a red couch\n2) The red couch\n- it\n* a very big old wooden table, a lamp; \"the picture\"\n\na blue vase\na chair\n"
    phrases, cut = phrases_from_answer(answer, rules)
    # numbering, bullets and quotes go; "The red couch" repeats "a red couch"; "it" is a pronoun; the long phrase keeps
    # its last 3 words (as spaCy's path does); "picture" is a default stop head; max_phrases caps the list
    assert phrases == ["a red couch", "old wooden table", "a lamp", "a blue vase"]
    assert cut == 1
    assert phrases_from_answer("", rules) == ([], 0)
    assert phrases_from_answer("  \n - \n: : :\n42", rules) == ([], 0)


def test_degenerate_answers_are_no_phrases_and_fall_back_to_the_caption(lm, monkeypatch):
    rules = PhraseRules()
    for answer in ("and and and and", "the of and\nto the", "red ball red ball red ball red ball", "a a", "..., ;;"):
        assert phrases_from_answer(answer, rules) == ([], 0), answer
    assert phrases_from_answer("a red ball\nand and and and\na blue box", rules)[0] == ["a red ball", "a blue box"]
    assert phrases_from_answer("a big big dog", rules)[0] == ["a big big dog"]  # a repeat inside a phrase is not a loop
    extractor = LlmPhraseExtractor(LlmExtractorParams(model=str(lm)))
    monkeypatch.setattr(extractor, "answers", lambda texts: ["and and and and" for _ in texts])  # a broken model
    params = ConceptsParams(extractor="llm", llm=LlmExtractorParams(model=str(lm)))
    result = next(extractor.extract(["a red circle above a blue square"], params, concepts.prepare_caption))
    assert result["phrases"] == ["a red circle above a blue square"] and result["fallback"]


def test_the_tiny_lm_is_the_same_model_on_every_run(tmp_path):
    captions = ["a red circle above a blue square", "two small green triangles"]
    first = LlmPhraseExtractor(LlmExtractorParams(model=str(tiny_causal_lm(tmp_path / "a")), max_new_tokens=6))
    second = LlmPhraseExtractor(LlmExtractorParams(model=str(tiny_causal_lm(tmp_path / "b")), max_new_tokens=6))
    assert first.answers(captions) == second.answers(captions)


def test_the_tiny_lm_answers_in_batches_and_an_empty_answer_falls_back_to_the_caption(lm, monkeypatch):
    extractor = LlmPhraseExtractor(LlmExtractorParams(model=str(lm), max_new_tokens=5, batch_size=2))
    captions = ["a red circle above a blue square", "two small green triangles", "a yellow cross", ""]
    one_by_one = [extractor.answers([c])[0] for c in captions[:3]]
    assert extractor.answers(captions[:3]) == one_by_one  # left padding: batching changes nothing
    params = ConceptsParams(extractor="llm", llm=LlmExtractorParams(model=str(lm), batch_size=2))
    results = list(extractor.extract(captions, params, concepts.prepare_caption))
    assert len(results) == 4 and results[3] == {"phrases": [], "empty": True, "truncated": False, "cut": 0, "fallback": False}
    for result in results[:3]:
        assert isinstance(result["phrases"], list) and len(result["phrases"]) <= params.rules.max_phrases
    monkeypatch.setattr(extractor, "answers", lambda texts: ["" for _ in texts])  # a model that says nothing
    silent = list(extractor.extract(captions[:2], params, concepts.prepare_caption))
    assert [r["phrases"] for r in silent] == [[captions[0]], [captions[1]]] and all(r["fallback"] for r in silent)


def test_the_prompt_is_a_chat_turn_with_the_caption_in_it(lm):
    extractor = LlmPhraseExtractor(LlmExtractorParams(model=str(lm)))
    prompt = extractor.prompt("a red circle")
    assert prompt.startswith("user: Extract the noun phrases") and "Caption: a red circle" in prompt and prompt.endswith("assistant:")
    plain = LlmPhraseExtractor(LlmExtractorParams(model=str(lm), chat=False, prompt="Phrases of: {caption} ->"))
    assert plain.prompt("a red circle") == "Phrases of: a red circle ->"


def test_the_stage_writes_the_spacy_format_with_the_llm(data, lm, tmp_path):
    params = ConceptsParams.model_validate({
        "manifest": str(data / "captions" / "manifest.parquet"), "output_dir": str(tmp_path / "concepts"),
        "stats_path": str(tmp_path / "stats.json"), "recaptions": None, "extractor": "llm",
        "llm": {"model": str(lm), "max_new_tokens": 8, "batch_size": 16}, "quality_samples": 8, "quality_fields": ["long"]})
    stats = concepts.run(params)
    spacy_params = params.model_copy(update={"extractor": "spacy", "llm": None, "output_dir": tmp_path / "spacy",
                                             "stats_path": tmp_path / "spacy.json", "n_process": 1})
    concepts.run(spacy_params)
    for name in ("shard-000000.parquet", "shard-000001.parquet", "shard-000002.parquet"):
        llm, spacy = pq.read_table(tmp_path / "concepts" / "train" / name), pq.read_table(tmp_path / "spacy" / "train" / name)
        assert llm.schema.equals(spacy.schema, check_metadata=False) and llm["key"].equals(spacy["key"])
        assert all(len(p) >= 1 for p in llm["phrases"].to_pylist())  # a phrase, or the caption itself
    assert stats["extractor"] == "llm" and stats["llm_model"] == str(lm) and stats["captions"] == 64
    assert 0 <= stats["quality"]["long"]["captions"] == 8
    assert json.loads((tmp_path / "stats.json").read_text())["extractor"] == "llm"


def test_llm_params_are_validated(tmp_path):
    with pytest.raises(ValidationError, match="extractor: llm needs an llm: section"):
        ConceptsParams(extractor="llm")
    with pytest.raises(ValidationError, match="must contain \\{caption\\}"):
        LlmExtractorParams(model="m", prompt="Noun phrases:")
    with pytest.raises(ValidationError, match="extractor"):
        ConceptsParams(extractor="gpt")
    with pytest.raises(concepts.ConceptsError, match="llm.model .*nowhere.* cannot be loaded"):
        concepts.load_nlp(ConceptsParams(extractor="llm", llm=LlmExtractorParams(model=str(tmp_path / "nowhere"))))
