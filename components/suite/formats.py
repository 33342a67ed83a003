"""Readers of the benchmark suite's official file formats (docs/architecture.md "Benchmark formats").

Each reader turns one benchmark's files into a :class:`Task`: the images it needs (a file, optionally a
box to crop), the texts it needs, the per-item indices into both, and how to score the items from the
image and text embeddings (the metrics of :mod:`components.suite.metrics`). Tasks never encode
anything themselves, so the evaluate stage can encode each image file once for all of them.

Bad input raises :class:`BenchmarkError` naming the file and the item (index or key) and the reason;
an empty benchmark is an error, never a score.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.suite import metrics
from components.suite.items import ItemScores, Layout

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used: names the file, the item and the reason."""


@dataclass(frozen=True)
class ImageRef:
    """An image file, optionally cropped to ``box`` = (x, y, w, h) in pixels (ARO's VG boxes)."""

    path: Path
    box: tuple[float, float, float, float] | None = None


@dataclass
class Task:
    """One benchmark, ready to score. ``score_items(images, texts)`` gets this task's image embeddings
    [len(images), D] and text embeddings [len(texts), D] (L2-normalised) and returns every item's scores and
    outcomes (:class:`~components.suite.items.ItemScores`), rows as ``layout`` describes them (the items' ids,
    images, texts and held-out flags: items about unseen combinations); the figures are aggregated from those rows.

    A task holds nothing about a model: the comparison scores several models on one suite at once, in
    threads. A zero-shot task (``needs_classifier``) is scored with the model's class embeddings
    [classes, D] in place of ``texts``, which the evaluator builds per model and passes in."""

    name: str  # e.g. "sugarcrepe/swap_att"
    group: str  # compositional | zero_shot | retrieval: the report's summary groups
    headline: str  # the metric charted and averaged into the summary
    images: list[ImageRef]
    texts: list[str]
    items: int
    score_items: Callable[[torch.Tensor, torch.Tensor], ItemScores]
    layout: Layout
    source: str = ""  # the file(s) read, for messages and the report
    needs_classifier: dict[str, Any] | None = None  # zero-shot: classnames + templates


class _Index:
    """Builds a task's image and text lists, giving each distinct entry one index."""

    def __init__(self) -> None:
        self.images: dict[ImageRef, int] = {}
        self.texts: dict[str, int] = {}

    def image(self, ref: ImageRef) -> int:
        return self.images.setdefault(ref, len(self.images))

    def text(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts))


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise BenchmarkError(f"{path}: file not found")
    try:
        if path.suffix == ".jsonl":
            rows = []
            for n, line in enumerate(path.read_text().splitlines()):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise BenchmarkError(f"{path}: line {n + 1} is not valid JSON ({err.msg})") from None
            return rows
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BenchmarkError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError as err:
        raise BenchmarkError(f"{path}: not UTF-8 text ({err.reason})") from None


def _field(path: Path, where: str, item: Any, key: str, kind: type | tuple[type, ...] = str) -> Any:
    if not isinstance(item, dict):
        raise BenchmarkError(f"{path}: item {where} is a {type(item).__name__}, expected an object")
    if key not in item:
        raise BenchmarkError(f"{path}: item {where} has no {key!r} (keys: {sorted(item)})")
    value = item[key]
    if not isinstance(value, kind) or (isinstance(value, str) and not value.strip()):
        raise BenchmarkError(f"{path}: item {where}: {key!r} must be a non-empty {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _nonempty(path: Path, n: int) -> None:
    if n == 0:
        raise BenchmarkError(f"{path}: no items (an empty benchmark has no score)")


def _held(item: dict) -> bool:
    return bool(item.get("held_out", False))


def _outcomes(score_names: list[str], scores: list[torch.Tensor], outcomes: dict[str, torch.Tensor], headline: str) -> ItemScores:
    """ItemScores of per-item score columns and boolean outcomes (the headline's is each row's ``correct``)."""
    return ItemScores(score_names, torch.stack(scores, dim=1), {k: v.double() for k, v in outcomes.items()}, outcomes[headline])


def _box(path: Path, where: str, item: dict, required: bool) -> tuple[float, float, float, float] | None:
    """An item's (bbox_x, bbox_y, bbox_w, bbox_h) in pixels; None when optional and absent."""
    keys = ("bbox_x", "bbox_y", "bbox_w", "bbox_h")
    if not required and not any(k in item for k in keys):
        return None
    box = tuple(float(_field(path, where, item, k, (int, float))) for k in keys)
    if box[2] <= 0 or box[3] <= 0:
        raise BenchmarkError(f"{path}: item {where}: bbox width and height must be positive, got {box}")
    return box


def _pair_scores(img: torch.Tensor, txt: torch.Tensor, i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (img[i] * txt[t]).sum(-1)


# --------------------------------------------------------------------------------------------------
# SugarCrepe, SugarCrepe++, hard positives
# --------------------------------------------------------------------------------------------------


def _items_of(path: Path, data: Any) -> list[tuple[str, Any]]:
    """(label, item) pairs of a dict "0","1",… (SugarCrepe) or of a list (the others)."""
    if isinstance(data, dict):
        return [(f"{k!r}", v) for k, v in data.items()]
    if isinstance(data, list):
        return [(str(n), v) for n, v in enumerate(data)]
    raise BenchmarkError(f"{path}: expected a JSON object or list of items, got {type(data).__name__}")


def sugarcrepe(path: Path, image_root: Path, name: str) -> Task:
    """SugarCrepe subset: dict "0".. → {filename, caption, negative_caption}; acc = mean[s(I,P) > s(I,N)]."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise BenchmarkError(f"{path}: SugarCrepe files are a JSON object of items keyed \"0\", \"1\", …; got {type(data).__name__}")
    idx, img, pos, neg = _Index(), [], [], []
    layout = Layout([], [], [], [], [])
    for where, item in _items_of(path, data):
        ref, texts = ImageRef(image_root / _field(path, where, item, "filename")), [_field(path, where, item, k) for k in SC_ROLES]
        img.append(idx.image(ref))
        pos.append(idx.text(texts[0]))
        neg.append(idx.text(texts[1]))
        _add_row(layout, where, [ref], texts, SC_ROLES, _held(item))
    _nonempty(path, len(img))
    i, p, n = torch.tensor(img), torch.tensor(pos), torch.tensor(neg)

    def score(I, T):
        sp, sn = _pair_scores(I, T, i, p), _pair_scores(I, T, i, n)
        return _outcomes(["s(image, caption)", "s(image, negative_caption)"], [sp, sn], {"acc": metrics.pairwise_items(sp, sn)}, "acc")

    return Task(name, "compositional", "acc", list(idx.images), list(idx.texts), len(img), score, layout, str(path))


SC_ROLES = ("caption", "negative_caption")
SCPP_ROLES = ("caption", "caption2", "negative_caption")


def _add_row(layout: Layout, item: str, images: list[ImageRef], texts: list[str], roles: tuple[str, ...], held: bool) -> None:
    layout.item.append(item.strip("'"))
    layout.images.append(images)
    layout.texts.append(texts)
    layout.roles.append(list(roles))
    layout.held_out.append(held)


def sugarcrepe_pp(path: Path, image_root: Path, name: str) -> Task:
    """SugarCrepe++ subset: list of {id, filename, caption, caption2, negative_caption}; ITT and TOT."""
    data = _read_json(path)
    idx, img, p1, p2, neg = _Index(), [], [], [], []
    layout = Layout([], [], [], [], [])
    for where, item in _items_of(path, data):
        ref, texts = ImageRef(image_root / _field(path, where, item, "filename")), [_field(path, where, item, k) for k in SCPP_ROLES]
        img.append(idx.image(ref))
        for column, text in zip((p1, p2, neg), texts, strict=True):
            column.append(idx.text(text))
        _add_row(layout, str(item.get("id", where)), [ref], texts, SCPP_ROLES, _held(item))
    _nonempty(path, len(img))
    i, a, b, n = (torch.tensor(x) for x in (img, p1, p2, neg))

    def score(I, T):
        columns = [_pair_scores(I, T, i, a), _pair_scores(I, T, i, b), _pair_scores(I, T, i, n),
                   (T[a] * T[b]).sum(-1), (T[a] * T[n]).sum(-1), (T[b] * T[n]).sum(-1)]
        names = ["s(image, caption)", "s(image, caption2)", "s(image, negative_caption)", "s(caption, caption2)",
                 "s(caption, negative_caption)", "s(caption2, negative_caption)"]
        return _outcomes(names, columns, metrics.sugarcrepe_pp_items(*columns), "itt")

    return Task(name, "compositional", "itt", list(idx.images), list(idx.texts), len(img), score, layout, str(path))


def hard_positives(original_path: Path, swapped_path: Path, image_root: Path, name: str) -> Task:
    """Hard positives: originals (c, c_n) and the aligned swapped file (c_p, c_n), lists of
    {image_id, true_caption, false_caption, image_path} — items with ARO's bbox_x/y/w/h (the SWAP
    subset, VG-Attribution's items) are cropped to their box, as the official evaluation does;
    original/augmented accuracy, brittleness."""
    original, swapped = _read_json(original_path), _read_json(swapped_path)
    for path, data in ((original_path, original), (swapped_path, swapped)):
        if not isinstance(data, list):
            raise BenchmarkError(f"{path}: expected a JSON list of items, got {type(data).__name__}")
    if len(original) != len(swapped):
        raise BenchmarkError(f"{swapped_path}: {len(swapped)} items, but {original_path} has {len(original)}; the two files must be aligned")
    idx, img, cap, hpos, neg = _Index(), [], [], [], []
    layout = Layout([], [], [], [], [])
    for n, (a, b) in enumerate(zip(original, swapped, strict=True)):
        image = _field(original_path, str(n), a, "image_path")
        if _field(swapped_path, str(n), b, "image_path") != image:
            raise BenchmarkError(f"{swapped_path}: item {n} is for image {b['image_path']!r} but {original_path} item {n} for {image!r}; "
                                 "the files are not aligned")
        if _field(swapped_path, str(n), b, "false_caption") != _field(original_path, str(n), a, "false_caption"):
            raise BenchmarkError(f"{swapped_path}: item {n} has another false_caption than {original_path} item {n}; the files are not aligned")
        box, swapped_box = _box(original_path, str(n), a, required=False), _box(swapped_path, str(n), b, required=False)
        # the crop scored is data/'s: a swapped file that names a box must name the same one (one without boxes
        # claims no other region)
        if swapped_box is not None and box != swapped_box:
            raise BenchmarkError(f"{swapped_path}: item {n} has box {swapped_box} but {original_path} item {n} has {box}; "
                                 "the files are not aligned")
        ref = ImageRef(image_root / image, box)
        texts = [_field(original_path, str(n), a, "true_caption"), _field(swapped_path, str(n), b, "true_caption"), a["false_caption"]]
        img.append(idx.image(ref))
        for column, text in zip((cap, hpos, neg), texts, strict=True):
            column.append(idx.text(text))
        _add_row(layout, str(n), [ref], texts,
                 ("caption", "hard_positive", "negative_caption"), _held(a))
    _nonempty(original_path, len(img))
    i, c, cp, cn = (torch.tensor(x) for x in (img, cap, hpos, neg))

    def score(I, T):
        columns = [_pair_scores(I, T, i, c), _pair_scores(I, T, i, cp), _pair_scores(I, T, i, cn)]
        names = ["s(image, caption)", "s(image, hard_positive)", "s(image, negative_caption)"]
        return _outcomes(names, columns, metrics.hard_positive_items(*columns), "augmented_acc")

    return Task(name, "compositional", "augmented_acc", list(idx.images), list(idx.texts), len(img), score, layout,
                f"{original_path} + {swapped_path}")


def read_karpathy(path: Path, split: str, strip: bool = True) -> list[tuple[str, list[str], bool]]:
    """(image path relative to the image root, captions, held_out) of one split of a Karpathy JSON
    ({"images": [{filepath?, filename, split, sentences: [{raw}]}]}) or of BLIP's list form
    ([{image, caption: [..]}], as ARO's coco_karpathy_test.json). ``strip=False`` keeps each caption as written."""
    data = _read_json(path)
    rows = []
    if isinstance(data, dict) and "images" in data:
        for n, item in enumerate(data["images"]):
            where = str(n)
            if item.get("split", split) != split:
                continue
            filename = _field(path, where, item, "filename")
            sentences = _field(path, where, item, "sentences", list)
            texts = []
            for k, s in enumerate(sentences):
                if isinstance(s, dict) and isinstance(s.get("raw"), str) and s["raw"].strip():
                    texts.append(s["raw"].strip() if strip else s["raw"])
                else:
                    raise BenchmarkError(f"{path}: item {n}: sentence {k} has no non-empty 'raw' text")
            if not texts:
                raise BenchmarkError(f"{path}: item {n} ({filename}) has no sentences")
            rows.append((str(Path(item.get("filepath") or "") / filename), texts, _held(item)))
    elif isinstance(data, list):
        for n, item in enumerate(data):
            captions = _field(path, str(n), item, "caption", (list, str))
            captions = [captions] if isinstance(captions, str) else captions
            rows.append((_field(path, str(n), item, "image"), [str(c).strip() if strip else str(c) for c in captions], _held(item)))
    else:
        raise BenchmarkError(f"{path}: not a Karpathy JSON ({{'images': [...]}}) nor a list of {{image, caption}}")
    if not rows:
        raise BenchmarkError(f"{path}: no images in split {split!r} (an empty benchmark has no score)")
    return rows


# --------------------------------------------------------------------------------------------------
# Winoground, zero-shot classification, retrieval
# --------------------------------------------------------------------------------------------------


def _resolve_image(root: Path, name: str) -> Path:
    """Winoground names images without an extension (ex_0_img_0 → images/ex_0_img_0.png)."""
    path = root / name
    if path.suffix.lower() in IMAGE_SUFFIXES or path.exists():
        return path
    for suffix in IMAGE_SUFFIXES:
        if path.with_name(path.name + suffix).exists():
            return path.with_name(path.name + suffix)
    return path.with_name(path.name + ".png")


def winoground(path: Path, image_root: Path, name: str) -> Task:
    """Winoground-style pairs {id, caption_0, caption_1, image_0, image_1}: text, image and group scores."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise BenchmarkError(f"{path}: expected JSON lines or a JSON list of pairs, got {type(data).__name__}")
    idx, imgs, caps = _Index(), [], []
    layout = Layout([], [], [], [], [])
    for n, item in enumerate(data):
        where = f"{n} (id {item.get('id')!r})" if isinstance(item, dict) else str(n)
        refs = [ImageRef(_resolve_image(image_root, _field(path, where, item, f"image_{k}"))) for k in (0, 1)]
        texts = [_field(path, where, item, f"caption_{k}") for k in (0, 1)]
        imgs.append([idx.image(ref) for ref in refs])
        caps.append([idx.text(text) for text in texts])
        _add_row(layout, str(item.get("id", n)), refs, texts, ("caption_0", "caption_1"), _held(item))
    _nonempty(path, len(imgs))
    i, c = torch.tensor(imgs), torch.tensor(caps)

    def score(I, T):
        s = (I[i][:, :, None, :] * T[c][:, None, :, :]).sum(-1)  # [pairs, image, caption]
        names = ["s(image_0, caption_0)", "s(image_0, caption_1)", "s(image_1, caption_0)", "s(image_1, caption_1)"]
        return _outcomes(names, list(s.reshape(-1, 4).T), metrics.winoground_items(s), "group")

    return Task(name, "compositional", "group", list(idx.images), list(idx.texts), len(imgs), score, layout, str(path))


WORDNET_ID = re.compile(r"^n\d{8}$")


def imagenet_templates(kind: str) -> list:
    """open_clip's ImageNet prompt templates ("openai_imagenet": CLIP's 80, "simple_imagenet": 7), callables
    of the class name, as open_clip's zero-shot classifier takes them."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

    return list({"openai_imagenet": OPENAI_IMAGENET_TEMPLATES, "simple_imagenet": SIMPLE_IMAGENET_TEMPLATES}[kind])


def looks_like_imagenet(folders: list[str]) -> bool:
    """1,000 class folders, every one named like a WordNet id (n01440764): ImageNet's layout."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    return len(folders) == len(IMAGENET_CLASSNAMES) and all(WORDNET_ID.match(f) for f in folders)


def readable_class_names(root: Path, folders: list[str], readable_names: str) -> list[str]:
    """The names the prompts say, one per class folder: "auto" is "imagenet" for ImageNet's 1,000 WordNet-id
    folders (:func:`looks_like_imagenet`; prompts never say "n01440764") and "folders" otherwise, saying which on
    stderr; "folders" reads the folder name ('_' as a space); "imagenet" gives open_clip's ImageNet class names
    (open_clip.zero_shot_metadata) to the 1000 WordNet-id folders in sorted order (ImageNet's label order);
    anything else is a file under ``root`` of lines ``<folder> <name>`` (ImageNet's LOC_synset_mapping.txt form:
    the name is the text up to its first comma)."""
    if readable_names == "auto":
        readable_names = "imagenet" if looks_like_imagenet(folders) else "folders"
        print(f"evaluate: {root}: class names from "
              + ("open_clip's ImageNet names (1,000 WordNet-id folders)" if readable_names == "imagenet" else "the folder names"),
              file=sys.stderr)
    if readable_names == "folders":
        return [f.replace("_", " ") for f in folders]
    if readable_names == "imagenet":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        odd = [f for f in folders if not WORDNET_ID.match(f)]
        if len(folders) != len(IMAGENET_CLASSNAMES) or odd or folders != sorted(folders):
            raise BenchmarkError(
                f"{root}: readable_names 'imagenet' needs ImageNet's {len(IMAGENET_CLASSNAMES)} WordNet-id class folders "
                f"(n01440764 ...) in sorted order; found {len(folders)} folders{f', e.g. {odd[0]!r}' if odd else ''}. "
                f"For other folders give a class-names file (lines '<folder> <name>')")
        return list(IMAGENET_CLASSNAMES)
    path = root / readable_names
    if not path.is_file():
        raise BenchmarkError(f"{path}: class-names file not found (readable_names is 'auto', 'folders', 'imagenet' or a file under {root})")
    names = {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            folder, _, name = line.strip().partition(" ")
            name = name.split(",")[0].strip()
            if not name:
                raise BenchmarkError(f"{path}: line {n} has no name after the folder {folder!r} (expected '<folder> <name>')")
            names[folder] = name
    missing = [f for f in folders if f not in names]
    if missing:
        raise BenchmarkError(f"{path}: no name for {len(missing)} class folder(s), e.g. {missing[0]!r}")
    return [names[f] for f in folders]


def zero_shot(root: Path, name: str, templates: list | str, classnames_file: str | None, held_out_file: str | None,
              readable_names: str = "auto") -> Task:
    """An image folder (one sub-folder per class), classified against prompt templates ("openai_imagenet" /
    "simple_imagenet": open_clip's) and readable class names (:func:`readable_class_names`) with open_clip's
    zero-shot classifier; top-1 and top-5."""
    if not root.is_dir():
        raise BenchmarkError(f"{root}: zero-shot image folder not found")
    listing = root / classnames_file if classnames_file else None
    if listing is not None and listing.is_file():
        folders = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    else:
        folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not folders:
        raise BenchmarkError(f"{root}: no class folders (an empty benchmark has no score)")
    held_classes = set()
    if held_out_file and (root / held_out_file).is_file():
        held_classes = {line.strip() for line in (root / held_out_file).read_text().splitlines() if line.strip()}
    images, labels, held = [], [], []
    for label, folder in enumerate(folders):
        directory = root / folder
        if not directory.is_dir():
            continue  # a class of the listing without test images (DVC does not keep empty folders)
        for file in sorted(directory.iterdir()):
            if file.suffix.lower() in IMAGE_SUFFIXES:
                images.append(ImageRef(file))
                labels.append(label)
                held.append(folder in held_classes)
    _nonempty(root, len(images))
    y = torch.tensor(labels)
    classnames = readable_class_names(root, folders, readable_names)
    prompts = imagenet_templates(templates) if isinstance(templates, str) else list(templates)

    top = min(5, len(classnames))

    def score(I, classes):
        logits = I @ classes.T  # classes: this model's class embeddings [classes, D]
        rank = metrics.class_rank(logits, y)
        others = logits.scatter(1, y[:, None], float("-inf")).max(dim=1).values
        result = _outcomes(["logit(true class)", "logit(best other class)"], [logits.gather(1, y[:, None]).squeeze(1), others],
                           {"top1": rank < 1, f"top{top}": rank < top}, "top1")
        result.predicted = [classnames[k] for k in logits.argmax(dim=1).tolist()]
        return result

    layout = Layout([str(ref.path.relative_to(root)) for ref in images], [[ref] for ref in images], [[classnames[k]] for k in labels],
                    [["class"]] * len(images), held)
    return Task(name, "zero_shot", "top1", images, [], len(images), score, layout, str(root),
                needs_classifier={"classnames": classnames, "templates": prompts})
