"""Params of the model-backed steps: the recaption stage's captioners and the concepts stage's LLM
noun-phrase extractor. Both load Hugging Face models by hub name or local folder; nothing here imports them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from components.shared.params_base import CAPTION_FIELD_PATTERN, ENTRY_NAME_PATTERN, Strict


class HFGenerationParams(Strict):
    """Where a Hugging Face generative model runs and how it decodes (greedy unless num_beams > 1)."""

    model: str = Field(..., min_length=1, description="Hub name (read from the local cache when HF_HUB_OFFLINE=1) or a local folder.")
    device: str = Field("auto", description="'auto' (cuda if present, else cpu), 'cpu', 'cuda' or 'cuda:N'.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="'auto': bfloat16 on a GPU, float32 on the CPU.")
    batch_size: int = Field(64, ge=1, description="Inputs per generate() call.")
    max_new_tokens: int = Field(77, ge=1, le=4096, description="Most tokens generated per input.")
    num_beams: int = Field(1, ge=1, description="Beam search width (1: greedy).")
    trust_remote_code: bool = Field(False, description="Run the model's own Python code when its folder or hub repository "
                                    "ships some (auto_map). Off: such a model is refused. On RUNS THAT CODE: only for a model you trust.")


class TransformersCaptionerParams(HFGenerationParams):
    """Any image-to-text model of transformers' AutoModelForImageTextToText: BLIP-style (image in, caption out),
    Florence-style (a task prompt such as <MORE_DETAILED_CAPTION>), LLaVA-style chat models (``chat: true``)."""

    prompt: str | None = Field(
        None, description="Text given with the image; '{alt_text}' is replaced by the sample's source caption (grounding). "
        "A model without a joint processor (a vision-encoder-decoder) takes it as the caption's first words.")
    chat: bool = Field(False, description="Wrap the prompt in the processor's chat template with one image (LLaVA-style models).")

    @model_validator(mode="after")
    def _check(self) -> TransformersCaptionerParams:
        if self.chat and not self.prompt:
            raise ValueError("chat: true needs a prompt (the user turn's text)")
        if self.prompt is not None:
            try:
                self.prompt.format(alt_text="")
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(f"prompt: only the placeholder {{alt_text}} is known ({err!r}); write other braces as {{{{ }}}}") from None
        return self


class RecaptionParams(Strict):
    """The recaption stage: a new caption field per training sample, next to the captions stage's shards."""

    manifest: Path = Field(Path("data/captions/manifest.parquet"), description="The captions stage's manifest (its shards sit beside it).")
    splits: list[Annotated[str, Field(pattern=ENTRY_NAME_PATTERN)]] = Field(
        default_factory=lambda: ["train"], min_length=1, description="Manifest splits recaptioned (each a folder of output_dir).")
    source_field: str = Field("raw", pattern=CAPTION_FIELD_PATTERN, description="The caption the recaption replaces: shown "
                              "beside it in the contact sheet, offered to the prompt as {alt_text}, and kept where captioning fails.")
    field: str = Field("recaption", pattern=CAPTION_FIELD_PATTERN, description="Name of the new caption field (train's "
                       "data.caption_field and concepts' caption_field can name it).")
    captioner: Literal["shapesworld", "transformers"] = Field(
        "shapesworld", description="shapesworld: the scene's dense description (the oracle a perfect captioner would write; "
        "ShapesWorld shards only); transformers: a Hugging Face image-to-text model.")
    transformers: TransformersCaptionerParams | None = Field(None, description="The model, with captioner: transformers.")
    output_dir: Path = Field(Path("data/recaptions"), description="{split}/{shard}.parquet (key, field, status) and manifest.parquet.")
    stats_path: Path = Field(Path("metrics/recaption.json"), description="Stats JSON (DVC metrics).")
    contact_sheet: Path | None = Field(Path("docs/recaption_contact_sheet.png"), description="Images with their old and new captions (None: none).")
    contact_sheet_images: int = Field(12, ge=1, le=64, description="Images on the contact sheet.")
    max_failure_rate: float = Field(0.05, ge=0.0, le=1.0, description="Most fraction of a shard's samples that may keep "
                                    "their source caption because captioning failed; over it the stage stops with the first errors.")

    @model_validator(mode="after")
    def _check(self) -> RecaptionParams:
        if self.captioner == "transformers" and self.transformers is None:
            raise ValueError("captioner: transformers needs a transformers: section (at least model: <name or folder>)")
        if self.captioner != "transformers" and self.transformers is not None:
            raise ValueError(f"a transformers: section is set but captioner is {self.captioner!r}, which would ignore it; "
                             "set captioner: transformers or remove the section")
        if self.field == self.source_field:
            raise ValueError(f"field {self.field!r} must differ from source_field (the shards' captions are never rewritten)")
        return self


DEFAULT_EXTRACTION_PROMPT = (
    "Extract the noun phrases from the caption below: every object with its attributes, one phrase per line, "
    "nothing else.\nCaption: {caption}\nNoun phrases:"
)


class LlmExtractorParams(HFGenerationParams):
    """Noun phrases from a small instruction-tuned causal LM, prompted once per caption (C2LIP's released
    extraction): the answer's lines are the phrases; an empty answer gives the caption itself."""

    prompt: str = Field(DEFAULT_EXTRACTION_PROMPT, description="'{caption}' is replaced by the caption.")
    chat: bool = Field(True, description="Wrap the prompt as a user turn in the tokenizer's chat template (instruction models).")
    max_new_tokens: int = Field(64, ge=1, le=1024, description="Most tokens per answer.")
    batch_size: int = Field(32, ge=1, description="Captions per generate() call.")

    @model_validator(mode="after")
    def _check(self) -> LlmExtractorParams:
        if "{caption}" not in self.prompt:
            raise ValueError("prompt must contain {caption}")
        try:
            self.prompt.format(caption="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"prompt: only the placeholder {{caption}} is known ({err!r})") from None
        return self
