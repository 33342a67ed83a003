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


class OpenClipEmbedder(mlflow.pyfunc.PythonModel):
    """Image or text embeddings from the open_clip export stored with the model."""

    def load_context(self, context) -> None:
        import open_clip

        import components.shared.architectures  # noqa: F401  registers our tiny configs with open_clip (and timm)
        from components.shared.checkpoints import refuse_export_code

        folder = context.artifacts[EXPORT_ARTIFACT]
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
        with torch.no_grad():
            if "text" in given:
                texts = list(model_input["text"])
                if bad := next((k for k, t in enumerate(texts) if not isinstance(t, str)), None):
                    raise ValueError(f"text row {bad}: {type(texts[bad]).__name__}, not a string (every row of a call "
                                     "is embedded; give a text in each)")
                tokens = self.tokenizer(texts)
                features = self.model.encode_text(to_model(tokens, self.model), normalize=True)
            elif "image" in given:
                root = image_root()
                images = [self.preprocess(Image.open(image_source(value, k, root)).convert("RGB"))
                          for k, value in enumerate(model_input["image"])]
                features = self.model.encode_image(to_model(torch.stack(images), self.model), normalize=True)
            else:
                raise ValueError(f"input needs a 'text' or an 'image' column, got {columns}")
        return np.asarray(features.float().cpu().numpy())


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
