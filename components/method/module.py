"""Model + a method's loss as one module, so DDP or DeepSpeed can wrap a whole training step's forward."""

from __future__ import annotations

import torch
import torch.nn as nn
from open_clip.modified_resnet import ModifiedResNet

from components.method.models import encode_text_rows


class TrainingModule(nn.Module):
    """``forward(**batch)`` returns the step's loss terms (a dict whose values sum to the loss): the loss
    module's ``step`` encodes what the batch carries with this module's towers.

    ``freeze_image_tower``: the image tower gets no gradient and keeps its normalisation statistics
    (CLIC fine-tunes the text tower only).

    A convolutional image tower (open_clip's ModifiedResNet) gets its images in channels-last memory format,
    which its activations then keep: oneDNN's convolutions and their backward are ~25% faster so on CPU, and the
    result is the same convolution (bench/train.py). The weights stay contiguous: DeepSpeed broadcasts and
    flattens parameters through byte views that a channels-last weight refuses."""

    def __init__(self, model: nn.Module, loss: nn.Module, freeze_image_tower: bool = False):
        super().__init__()
        self.model, self.loss = model, loss
        self.freeze_image_tower = freeze_image_tower
        if freeze_image_tower:
            model.visual.requires_grad_(False)
        self.channels_last = isinstance(model.visual, ModifiedResNet)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, D], L2-normalised."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        if not self.freeze_image_tower:
            return self.model.encode_image(images, normalize=True)
        # a frozen tower keeps its normalisation statistics too (eval mode: BatchNorm's running means do
        # not move), and needs no graph
        self.model.visual.eval()
        with torch.no_grad():
            return self.model.encode_image(images, normalize=True)

    def encode_text(self, texts: torch.Tensor) -> torch.Tensor:
        """[T, L] tokens -> [T, D], L2-normalised."""
        return encode_text_rows(self.model, texts)

    def logit_scale_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(s = exp(logit_scale), b or None when the model has no bias)."""
        return self.model.logit_scale.exp(), getattr(self.model, "logit_bias", None)

    def forward(self, images: torch.Tensor, texts: torch.Tensor, **batch: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.loss.step(self, images, texts, **batch)
