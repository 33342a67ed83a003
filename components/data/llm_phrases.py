"""Noun phrases from a small instruction-tuned language model, the way C2LIP's released code extracts them: the
model is prompted once per caption, its answer's lines are the phrases, and an empty answer gives the caption
itself. The concepts stage uses it with ``extractor: llm`` in place of spaCy, and applies the same phrase rules
after it (stop phrases and heads, pronouns, max_words, max_phrases, de-duplication), so both extractors write
the same format. The model loads by hub name or local folder (``HF_HUB_OFFLINE=1``: the cache only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from components.data.captioners import plain_text, resolve_device, resolve_dtype, special_strings
from components.data.phrase_quality import fallback_phrases, filter_phrases

# what an answer's line may start with besides the phrase: bullets and numbering ("- ", "2. ", "3) ")
_LIST_MARK = re.compile(r"^\s*(?:[-*•·]+|\d+[.)]|\(\d+\))\s*")
PRONOUNS = frozenset("i me you he him she her it we us they them this that these those something someone it's".split())


def degenerate(words: list[str]) -> bool:
    """What a broken or looping model writes instead of a phrase: only stop words ("and the of"), one word
    repeated ("and and and and"), or a tail that loops (four or more words, at most half of them distinct:
    "red ball red ball red ball")."""
    from spacy.lang.en.stop_words import STOP_WORDS

    lowered = [w.lower().strip("\"'`.:!?()") for w in words]
    if all(w in STOP_WORDS or not any(c.isalpha() for c in w) for w in lowered):
        return True
    distinct = len(set(lowered))
    return (len(lowered) > 1 and distinct == 1) or (len(lowered) >= 4 and distinct <= len(lowered) // 2)


def phrases_from_answer(answer: str, rules) -> tuple[list[str], int]:
    """The phrases of one answer (a line, comma or semicolon each), list marks and quotes removed, pronouns,
    letterless and degenerate pieces (:func:`degenerate`) dropped, then the rules spaCy's phrases pass too
    (``rules``: PhraseRules, :func:`~components.data.phrase_quality.filter_phrases`); also how many were cut to
    max_words. An answer with nothing left falls back to the caption (the extractor's fallback)."""

    def candidates():
        for piece in re.split(r"[\n;,]", answer):
            words = _LIST_MARK.sub("", piece).strip().strip("\"'`.:").split()
            if not words or not any(c.isalpha() for c in "".join(words)):  # a phrase names something: it has a letter
                continue
            if rules.drop_pronouns and all(w.lower() in PRONOUNS for w in words):
                continue
            if degenerate(words):
                continue
            yield words, words[-1]

    return filter_phrases(candidates(), rules)


class LlmPhraseExtractor:
    """A causal LM and its tokenizer (``params``: LlmExtractorParams), batched, greedy unless num_beams > 1."""

    def __init__(self, params):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from components.shared.safe_load import refuse_remote_code

        self.params = params
        self.device = resolve_device(params.device)
        trust = refuse_remote_code(params.model, "llm.model", params.trust_remote_code)
        self.tokenizer = AutoTokenizer.from_pretrained(params.model, trust_remote_code=trust)
        self.tokenizer.padding_side = "left"  # every row's answer starts at the same column
        self.specials = special_strings(self.tokenizer)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if params.chat and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{params.model}: chat: true, but its tokenizer has no chat template (set llm.chat: false)")
        self.model = AutoModelForCausalLM.from_pretrained(params.model, dtype=resolve_dtype(params.dtype, self.device),
                                                          trust_remote_code=trust).to(self.device).eval()
        self._torch = torch

    def prompt(self, caption: str) -> str:
        # the caption is data: on one line, its special-token look-alikes broken (captioners.plain_text)
        text = self.params.prompt.format(caption=plain_text(caption, self.specials))
        if not self.params.chat:
            return text
        return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)

    def answers(self, captions: list[str]) -> list[str]:
        """The model's answer to the prompt of each caption (generated text only, special tokens removed)."""
        p = self.params
        inputs = self.tokenizer([self.prompt(c) for c in captions], return_tensors="pt", padding=True,
                                add_special_tokens=not p.chat).to(self.device)
        with self._torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=p.max_new_tokens, num_beams=p.num_beams, do_sample=False,
                                         pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    def extract(self, captions: Iterable[str | None], params, prepare) -> Iterator[dict[str, Any]]:
        """Phrases of each caption, in order, as the spaCy extractor yields them (``params``: ConceptsParams;
        ``prepare``: the stage's caption cut to max_chars): ``{"phrases", "empty", "truncated", "cut", "fallback"}``."""
        batch: list[tuple[str, bool]] = []
        for caption in captions:
            batch.append(prepare(caption, params.max_chars))
            if len(batch) == self.params.batch_size:
                yield from self._batch(batch, params.rules)
                batch = []
        if batch:
            yield from self._batch(batch, params.rules)

    def _batch(self, batch: list[tuple[str, bool]], rules) -> Iterator[dict[str, Any]]:
        texts = [text for text, _ in batch if text.strip()]
        answers = iter(self.answers(texts)) if texts else iter(())
        for text, truncated in batch:
            empty = not text.strip()
            phrases, cut = ([], 0) if empty else phrases_from_answer(next(answers), rules)
            fallback = not phrases and not empty and rules.fallback_to_caption  # C2LIP: no answer -> the caption itself
            if fallback:
                phrases = fallback_phrases(text, rules)
                fallback = bool(phrases)  # a caption that is itself a stop phrase gives none
            yield {"phrases": phrases, "empty": empty, "truncated": truncated, "cut": cut, "fallback": fallback}
