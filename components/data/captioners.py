"""Captioners behind one interface, for the recaption stage: each turns a batch of samples into new captions.

- :class:`ShapesWorldCaptioner`: the scene's dense description, written from the sample's scene metadata in the
  world's grammar — what a perfect captioner would write (no image read, no model).
- :class:`TransformersCaptioner`: any image-to-text model of transformers' ``AutoModelForImageTextToText`` by hub
  name or local folder (BLIP-, Florence-, LLaVA-style), batched, bf16 on a GPU, greedy or beam decoding.

A captioner returns one item per input: the caption, or a :class:`Failure` naming why there is none (the stage
counts failures by reason and keeps the source caption for those samples).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from components.data import shapesworld_rules as rules


@dataclass
class CaptionInput:
    key: str
    source_caption: str  # the caption being replaced (the alt-text): {alt_text} in a prompt
    meta: dict[str, Any] = field(default_factory=dict)  # the sample's json entry (ShapesWorld: its scene)
    image: Any = None  # PIL image, decoded only for captioners that look at it


@dataclass(frozen=True)
class Failure:
    reason: str  # a short machine-readable reason (counted in the stats)
    detail: str = ""


def clean(text: str) -> str:
    """One line, single spaces: generated text often carries newlines and runs of spaces."""
    return re.sub(r"\s+", " ", text).strip()


def special_strings(tokenizer) -> list[str]:
    """The strings ``tokenizer`` turns into control tokens (its special and added special tokens), longest first:
    what :func:`plain_text` breaks. Computed once per model, not per caption."""
    specials = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            specials.add(str(token.content))
    return sorted((t for t in specials if len(t) > 1), key=len, reverse=True)


def plain_text(text: str, specials: list[str]) -> str:
    """``text`` (a caption or alt-text from the data) made safe to place inside a prompt: on one line, so it cannot
    open a turn of its own ("\\nassistant: ..."), and with every special token (``specials``: :func:`special_strings`)
    broken by a space after its first character ("</s>" -> "< /s>", "[SEP]" -> "[ SEP]"), so it is tokenised as the
    words it looks like, never as the control token. Tokenizers match added tokens by their exact string, so the
    broken form cannot match."""
    text = clean(text)
    for special in specials:
        text = text.replace(special, f"{special[0]} {special[1:]}")
    return text


class ShapesWorldCaptioner:
    """The dense description of a ShapesWorld scene: the count sentence, every object with its size, colour and
    shape, every pairwise relation — the world's long caption in one fixed wording (no template variety)."""

    needs_images = False

    def caption(self, batch: list[CaptionInput]) -> list[str | Failure]:
        return [self.describe(item) for item in batch]

    @staticmethod
    def describe(item: CaptionInput) -> str | Failure:
        meta = item.meta
        if not meta.get("objects") or "background" not in meta:
            return Failure("no_scene_metadata", f"{item.key}: the sample's json has no ShapesWorld scene (objects, background)")
        try:
            return rules.dense_description(meta)
        except (KeyError, IndexError, TypeError) as err:
            return Failure("bad_scene_metadata", f"{item.key}: {err!r}")


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: this machine has no CUDA GPU")
    return name


def resolve_dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def strip_prompt(output, prompt_ids):
    """Generated ids without the prompt they continue: decoder-only models (and BLIP) return prompt + answer,
    encoder-decoders only the answer. The prompt is cut only where every row starts with it."""
    import torch

    if prompt_ids is None:
        return output
    length = prompt_ids.shape[1]
    if output.shape[1] >= length and torch.equal(output[:, :length].cpu(), prompt_ids.cpu()):
        return output[:, length:]
    return output


class TransformersCaptioner:
    """A Hugging Face image-to-text model. With a joint processor (BLIP, Florence, LLaVA) the prompt goes through
    it (``chat: true``: as a user turn of the chat template, with one image); a vision-encoder-decoder saved with an
    image processor and a tokenizer takes a fixed prompt as the caption's first words."""

    needs_images = True

    def __init__(self, params):  # params: TransformersCaptionerParams
        import torch
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        from components.shared.safe_load import refuse_remote_code

        self.params = params
        self.device = resolve_device(params.device)
        self.dtype = resolve_dtype(params.dtype, self.device)
        trust = refuse_remote_code(params.model, "transformers.model", params.trust_remote_code)
        # the processor first: it is cheap, and a model without one (or without a chat template) is refused before
        # its weights load
        processor = AutoProcessor.from_pretrained(params.model, trust_remote_code=trust)
        if hasattr(processor, "image_processor") and hasattr(processor, "tokenizer"):
            self.processor, self.tokenizer, self.image_processor = processor, processor.tokenizer, None
            self.tokenizer.padding_side = "left"  # each row's answer starts right after its prompt
            if params.chat and not getattr(processor, "chat_template", None):
                raise ValueError(f"{params.model}: chat: true, but its processor has no chat template (set chat: false)")
        else:  # a vision-encoder-decoder: an image processor and a tokenizer saved side by side
            self.processor = None
            self.image_processor = AutoImageProcessor.from_pretrained(params.model, trust_remote_code=trust)
            self.tokenizer = AutoTokenizer.from_pretrained(params.model, trust_remote_code=trust)
            if params.chat or (params.prompt and "{alt_text}" in params.prompt):
                raise ValueError(f"{params.model}: a model without a joint processor takes only a fixed prompt (its caption's "
                                 "first words): no chat template, no {alt_text}")
        self.specials = special_strings(self.tokenizer)
        self.model = AutoModelForImageTextToText.from_pretrained(params.model, dtype=self.dtype, trust_remote_code=trust)
        self.model = self.model.to(self.device).eval()
        self._torch = torch

    def inputs(self, batch: list[CaptionInput]) -> tuple[dict, Any]:
        """The generate() inputs of a batch and the prompt ids the output will start with (or None)."""
        p = self.params
        images = [item.image for item in batch]
        prompts = [p.prompt.format(alt_text=plain_text(item.source_caption, self.specials)) for item in batch] if p.prompt else None
        if self.processor is None:
            inputs = {"pixel_values": self.image_processor(images, return_tensors="pt")["pixel_values"]}
            prompt_ids = None
            if prompts:
                start = self.model.generation_config.decoder_start_token_id
                ids = [start, *self.tokenizer(prompts[0], add_special_tokens=False)["input_ids"]]
                prompt_ids = self._torch.tensor([ids] * len(batch))
                inputs["decoder_input_ids"] = prompt_ids
        else:
            if prompts and p.chat:
                prompts = [self.processor.apply_chat_template(
                    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}], add_generation_prompt=True)
                    for t in prompts]
            inputs = dict(self.processor(images=images, text=prompts, return_tensors="pt", padding=True) if prompts
                          else self.processor(images=images, return_tensors="pt"))
            prompt_ids = inputs.get("input_ids")
        moved = {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device)) if hasattr(v, "is_floating_point") else v
                 for k, v in inputs.items()}
        return moved, prompt_ids

    def caption(self, batch: list[CaptionInput]) -> list[str | Failure]:
        p = self.params
        inputs, prompt_ids = self.inputs(batch)
        with self._torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=p.max_new_tokens, num_beams=p.num_beams, do_sample=False)
        texts = self.tokenizer.batch_decode(strip_prompt(output, prompt_ids), skip_special_tokens=True)
        return [clean(t) or Failure("empty_output", f"{item.key}: the model generated no words") for item, t in zip(batch, texts, strict=True)]


def make_captioner(params):  # params: RecaptionParams
    if params.captioner == "shapesworld":
        return ShapesWorldCaptioner()
    return TransformersCaptioner(params.transformers)
