"""The MLflow form of an exported model: an MLflow pyfunc that carries the open_clip export.

A registered version's artifacts hold the export folder itself (``open_clip_config.json`` +
``open_clip_model.safetensors``), so ``models:/c2lip@champion`` loads two ways:
- as an open_clip model: download the artifacts and ``create_model_and_transforms("local-dir:<folder>")``
  (what the evaluate stage does);
- as an MLflow pyfunc: ``mlflow.pyfunc.load_model(uri).predict(df)`` with a ``text`` column (strings) or an
  ``image`` column (file paths) returns one L2-normalised embedding per row. The model's signature says so (two
  optional string columns in, a float32 vector per row out), and a frame with both columns is refused: which one to
  embed would be a guess.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import mlflow.pyfunc

from components.shared.devices import place_model, to_model

EXPORT_ARTIFACT = "open_clip"  # the artifact key (and folder name) of the export inside the model
# What one call may ask of a served model, so that a request cannot exhaust the serving host (10,000 texts took 3.9 GB,
# a 79 kB PNG can decode to 81 M pixels): rows per call and pixels per image, each refused beyond its bound with a
# message. The serving host sets others by these variables; rows are embedded BATCH_ROWS at a time.
MAX_ROWS_ENV, MAX_ROWS = "C2LIP_PYFUNC_MAX_ROWS", 1024
MAX_PIXELS_ENV, MAX_PIXELS = "C2LIP_PYFUNC_MAX_PIXELS", 25_000_000
BATCH_ROWS = 64


def limit(env: str, default: int) -> int:
    """A positive whole-number bound from the environment, else ``default``; a bad value is named."""
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"{env}={raw!r}: not a positive whole number")
    return int(raw)


class OpenClipEmbedder(mlflow.pyfunc.PythonModel):
    """Image or text embeddings from the open_clip export stored with the model."""

    def load_context(self, context) -> None:
        import open_clip

        import components.shared.architectures  # noqa: F401  registers our tiny configs with open_clip (and timm)
        from components.shared.checkpoints import check_export, refuse_export_code

        folder = context.artifacts[EXPORT_ARTIFACT]
        check_export(folder)  # its checksums: changed weights are named, never served
        refuse_export_code(folder, "registered model")  # a text tower with its own code never runs on a "y"
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
        # served from the GPU when the serving host has one (C2LIP_PYFUNC_DEVICE=cpu keeps it on the CPU)
        place_model(self.model.eval(), os.environ.get("C2LIP_PYFUNC_DEVICE", "auto"))
        self.tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")

    def predict(self, context, model_input, params: dict[str, Any] | None = None):
        import numpy as np
        import torch
        from PIL import Image

        columns = list(getattr(model_input, "columns", []))
        given = [c for c in ("text", "image") if c in columns and model_input[c].notna().any()]
        if len(given) > 1:
            raise ValueError("input has both a 'text' and an 'image' column: give one of them per call (each row is embedded "
                             "as a text or as an image)")
        if not given:
            raise ValueError(f"input needs a 'text' or an 'image' column, got {columns}")
        rows, max_rows = len(model_input), limit(MAX_ROWS_ENV, MAX_ROWS)
        if rows > max_rows:
            raise ValueError(f"{rows} rows in one call; a call embeds at most {max_rows} ({MAX_ROWS_ENV}): split the input")
        values = list(model_input[given[0]])
        if given == ["text"]:
            if (bad := next((k for k, t in enumerate(values) if not isinstance(t, str)), None)) is not None:
                raise ValueError(f"text row {bad}: {type(values[bad]).__name__}, not a string (every row of a call "
                                 "is embedded; give a text in each)")
        else:
            root, max_pixels = image_root(), limit(MAX_PIXELS_ENV, MAX_PIXELS)
            opened = [image_source(value, k, root) for k, value in enumerate(values)]  # every row checked before any decode
            for k, source in enumerate(opened):
                with Image.open(source) as image:  # reads the header only: the size is known before the pixels are
                    width, height = image.size
                if width * height > max_pixels:
                    raise ValueError(f"image row {k}: {width}×{height} pixels; an image may have at most {max_pixels:,} "
                                     f"({MAX_PIXELS_ENV}): resize it first")
                if isinstance(source, io.BytesIO):
                    source.seek(0)
            values = opened
        features = []
        with torch.no_grad():
            for start in range(0, rows, BATCH_ROWS):
                batch = values[start:start + BATCH_ROWS]
                if given == ["text"]:
                    features.append(self.model.encode_text(to_model(self.tokenizer(batch), self.model), normalize=True))
                else:
                    images = torch.stack([self.preprocess(Image.open(source).convert("RGB")) for source in batch])
                    features.append(self.model.encode_image(to_model(images, self.model), normalize=True))
        return np.asarray(torch.cat(features).float().cpu().numpy())


IMAGE_ROOT_ENV = "C2LIP_IMAGE_ROOT"  # the one folder whose images a served model reads by path


def image_root() -> Path:
    """The folder image paths are read from: ``$C2LIP_IMAGE_ROOT``, else the serving process's working directory."""
    return Path(os.environ.get(IMAGE_ROOT_ENV) or os.getcwd()).resolve()


def image_source(value: Any, row: int, root: Path):
    """A row's image to open: its bytes, or a path inside ``root``. A URL, a missing value or a path outside the root is
    refused before the file system is asked, so the answer never tells which files exist elsewhere on the host."""
    if isinstance(value, (bytes, bytearray)):
        return io.BytesIO(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"image row {row}: {type(value).__name__}, not an image path or the image's bytes")
    if "://" in value:
        raise ValueError(f"image row {row}: URLs are not supported; give the image's bytes or a path under {IMAGE_ROOT_ENV}")
    path = (root / value).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"image row {row}: outside the image folder the model may read ({IMAGE_ROOT_ENV}); give its bytes")
    if not path.is_file():
        raise ValueError(f"image row {row}: {value}: no such image under the image folder")
    return path


def signature(export_dir: Path):
    """The pyfunc's signature: a ``text`` or an ``image`` (file path) column, each optional; out, one float32 embedding
    of the export's width per row."""
    import json

    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema, TensorSpec

    width = json.loads((Path(export_dir) / "open_clip_config.json").read_text())["model_cfg"]["embed_dim"]
    inputs = Schema([ColSpec("string", "text", required=False), ColSpec("string", "image", required=False)])
    return ModelSignature(inputs=inputs, outputs=Schema([TensorSpec(np.dtype("float32"), (-1, width))]))


def log_export(export_dir: Path, name: str = "model", registered_model_name: str | None = None):
    """Log ``export_dir`` as a pyfunc model in the active run (optionally registering a version).
    Returns MLflow's ModelInfo. ``pip_requirements`` is given: MLflow's inference of them takes seconds."""
    import open_clip
    import torch

    return mlflow.pyfunc.log_model(
        signature=signature(export_dir),
        name=name,
        python_model=str(Path(__file__).with_name("pyfunc_entry.py")),  # models-from-code: no pickle to load
        artifacts={EXPORT_ARTIFACT: str(export_dir)},
        code_paths=[str(Path(__file__).resolve().parents[1])],
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"open_clip_torch=={open_clip.__version__}", "pillow", "numpy"],
        registered_model_name=registered_model_name,
    )
