"""The benchmark suite as the evaluate stage's params describe it: every enabled benchmark read from its official
files into tasks (:mod:`components.suite.formats`, :mod:`~components.suite.aro`, ...), each confined to its image root,
and the check that every image is there before any model is loaded."""

from __future__ import annotations

from pathlib import Path

from components.shared.atomic import ENTRY_NAME
from components.shared.params import EvaluateParams
from components.suite import aro as aro_formats
from components.suite import formats, long_captions, retrieval

MISSING_SHOWN = 5
OUTSIDE_SHOWN = 3


def confine_images(task: formats.Task, image_root: Path, file: Path) -> formats.Task:
    """``task`` if every image it reads lies inside ``image_root``; else a BenchmarkError naming the file, how many
    images lead outside (an absolute name, ``../``, a link out: reason ``outside_image_root``, as the captions stage
    counts them) and the first few. A benchmark file must not make the stage read, and copy into the gallery,
    MLflow and the docs site, other files of the machine."""
    root = Path(image_root).resolve()
    outside = sorted({str(ref.path) for ref in task.images if not Path(ref.path).resolve().is_relative_to(root)})
    if outside:
        shown = ", ".join(repr(p) for p in outside[:OUTSIDE_SHOWN])
        raise formats.BenchmarkError(f"{file}: {len(outside)} image(s) outside the image root {image_root} (outside_image_root): "
                                     f"{shown}; name images relative to the image root")
    return task


class SuiteError(ValueError):
    """A model or benchmark that cannot be evaluated: says which, and why."""


def load_suite(params: EvaluateParams, nlp_loader=None) -> list[formats.Task]:
    """Every enabled benchmark of ``params.benchmarks`` as tasks, in report order."""
    b = params.benchmarks
    tasks: list[formats.Task] = []

    def add(task: formats.Task, image_root: Path, file: Path) -> None:  # no item may name an image outside its root
        tasks.append(confine_images(task, image_root, file))

    if b.sugarcrepe.enabled:
        for subset in b.sugarcrepe.subsets:
            file = b.sugarcrepe.data_root / f"{subset}.json"
            add(formats.sugarcrepe(file, b.sugarcrepe.images, f"sugarcrepe/{subset}"), b.sugarcrepe.images, file)
    if b.sugarcrepe_pp.enabled:
        for subset in b.sugarcrepe_pp.subsets:
            file = b.sugarcrepe_pp.data_root / f"{subset}.json"
            add(formats.sugarcrepe_pp(file, b.sugarcrepe_pp.images, f"sugarcrepe_pp/{subset}"), b.sugarcrepe_pp.images, file)
    hp = b.hard_positives
    if hp.enabled:
        for subset, file in hp.files.items():
            add(formats.hard_positives(hp.data_root / hp.original_dir / file, hp.data_root / hp.swapped_dir / file,
                                       hp.images_of(subset), f"hard_positives/{subset}"), hp.images_of(subset), hp.data_root / hp.original_dir / file)
    aro = b.aro
    if aro.enabled:
        if aro.relation_file:
            add(aro_formats.aro_vg(aro.data_root / aro.relation_file, aro.images, "aro/vg_relation", "relation"), aro.images, aro.data_root / aro.relation_file)
        if aro.attribution_file:
            add(aro_formats.aro_vg(aro.data_root / aro.attribution_file, aro.images, "aro/vg_attribution", "attribution"), aro.images,
                aro.data_root / aro.attribution_file)
        if aro.order_files:
            nlp = (nlp_loader or load_tagger)(params.spacy_model)
            for name, file in aro.order_files.items():
                add(aro_formats.aro_order(aro.data_root / file, aro.order_images_of(name), f"aro/{name}", aro.order_split,
                                          aro.order_captions_per_image, nlp, params.order_seed), aro.order_images_of(name), aro.data_root / file)
    if b.winoground.enabled:
        file = b.winoground.data_root / b.winoground.file
        add(formats.winoground(file, b.winoground.images, "winoground"), b.winoground.images, file)
    zs = b.zero_shot
    if zs.enabled:
        add(formats.zero_shot(zs.data_root, "zero_shot", zs.templates, zs.classnames_file, zs.held_out_file, zs.readable_names), zs.data_root, zs.data_root)
    if b.retrieval.enabled:
        for name, file in b.retrieval.files.items():
            add(retrieval.retrieval(b.retrieval.data_root / file, b.retrieval.images_of(name), f"retrieval/{name}", b.retrieval.split),
                b.retrieval.images_of(name), b.retrieval.data_root / file)
    lc = b.long_captions
    if lc.enabled:
        add(long_captions.long_caption_retrieval(lc.data_root / lc.file, lc.images, "long_captions", lc.split), lc.images, lc.data_root / lc.file)
    for task in tasks:  # its name becomes the path of its per-item table: "retrieval/../x" must not
        if any(part in (".", "..") or not ENTRY_NAME.match(part) for part in task.name.split("/")):
            raise SuiteError(f"benchmark {task.name!r}: not a plain name (letters, digits, '_.-' between '/'); rename its params key")
    return tasks


def load_tagger(name: str):
    """spaCy with only what part-of-speech tags need (ARO's order shuffles)."""
    import spacy

    try:
        return spacy.load(name, exclude=["parser", "ner", "lemmatizer", "textcat", "senter"])
    except OSError as err:
        raise SuiteError(f"spacy_model {name!r} cannot be loaded ({err}); ARO's order benchmarks need a tagger") from None


def check_images(tasks: list[formats.Task]) -> None:
    """Stop before any encoding when image files are missing: how many, and the first few."""
    missing = sorted({str(ref.path) for t in tasks for ref in t.images if not ref.path.is_file()})
    if missing:
        users = sorted({t.name for t in tasks if any(not ref.path.is_file() for ref in t.images)})
        shown = "\n  ".join(missing[:MISSING_SHOWN])
        raise SuiteError(f"{len(missing)} image file(s) missing (used by {', '.join(users)}); first:\n  {shown}")
