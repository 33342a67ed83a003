"""Long-caption retrieval in DOCCI's format (arXiv 2404.19753): one long, detailed description per image, R@1/5/10
image→text and text→image, as "Improved Semantic Guidance" (arXiv 2412.15396) reports it.

The release's ``docci_descriptions.jsonlines`` holds one JSON object a line: ``example_id``, ``split`` (train, test,
qual_dev, qual_test), ``image_file`` (under ``images/``) and ``description``. ShapesWorld's benchmarks stage writes
its own file in that format (``long_captions/``), each description every fact of a test scene, plus a ``held_out``
flag. A description longer than a model's context is cut by its tokenizer, as in the paper's CLIP baselines.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.suite.formats import BenchmarkError, ImageRef, Task
from components.suite.retrieval import retrieval_scorer

FIELDS = ("example_id", "split", "image_file", "description")


def read_docci(path: Path, split: str) -> list[tuple[str, str, bool]]:
    """(image file, description, held_out) of the items of ``split``; a bad line is named by its number and key."""
    if not path.is_file():
        raise BenchmarkError(f"{path}: does not exist")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise BenchmarkError(f"{path}: line {number}: not JSON ({err.msg})") from None
        if not isinstance(item, dict):
            raise BenchmarkError(f"{path}: line {number}: not a JSON object")
        for key in FIELDS:
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise BenchmarkError(f"{path}: line {number}: {key!r} missing or not a non-empty string")
        if item["split"] == split:
            rows.append((item["image_file"], " ".join(item["description"].split()), bool(item.get("held_out", False))))
    if not rows:
        raise BenchmarkError(f"{path}: no items of split {split!r} (an empty benchmark has no score)")
    return rows


def long_caption_retrieval(path: Path, image_root: Path, name: str, split: str) -> Task:
    """Retrieval with one long description per image: headline mean R@1 of the two directions."""
    rows = read_docci(path, split)
    images = [ImageRef(image_root / image) for image, _, _ in rows]
    texts = [description for _, description, _ in rows]
    score, layout = retrieval_scorer(images, texts, list(range(len(rows))), [h for *_, h in rows])
    return Task(name, "long_retrieval", "mean_r1", images, texts, len(images), score, layout, str(path))
