"""The architectures open_clip builds by name that it does not ship: our tiny configs (``model_configs/``) and the
timm tower one of them names. Importing this module registers them; whatever loads a c2lip model by config name or
from an export folder imports it first (the method's model builders, the suite's loader, the registered pyfunc).

It sits on the ground floor so that the pyfunc, which every registered model version runs, needs nothing above it.
"""

from __future__ import annotations

from pathlib import Path

import open_clip
import timm
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer as TimmViT

CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"
# SigLIP-like (timm ViT, MAP head, sigmoid loss) and CLIP-like (class token + proj). The names avoid
# "siglip": open_clip then picks its HF SigLIP tokenizer, which needs transformers and the hub; both
# use open_clip's built-in tokenizer, which ships in the package.
TINY_SIGLIP = "c2lip-tiny-map"
TINY_CLIP = "c2lip-tiny-cls"
# The default for ShapesWorld: a CLIP-style ResNet (attention pooling) with SigLIP's sigmoid loss and
# logit bias. From scratch on 2 CPU cores it learns shapes where the ViTs above learn only colours, and
# it is built by open_clip alone (no timm registration), so its exports load anywhere.
TINY_RN = "c2lip-tiny-rn"


# The tiny SigLIP-like tower: a timm ViT with a MAP head and no class token, as in SigLIP, small enough to
# train from scratch on 2 CPU cores. Registered with timm so an open_clip config can name it.
if "c2lip_vit_tiny_map" not in timm.list_models("c2lip_*"):

    @register_model
    def c2lip_vit_tiny_map(pretrained: bool = False, **kwargs) -> TimmViT:
        """64 px, patch 8 (64 tokens), width 128, 4 layers, 4 heads, MAP pooling, no class token."""
        args = dict(
            img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=4, mlp_ratio=2.0,
            class_token=False, global_pool="map", num_classes=0,
        )
        for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm's factory bookkeeping
            kwargs.pop(key, None)
        args.update(kwargs)
        if pretrained:
            raise ValueError("c2lip_vit_tiny_map has no pretrained weights; train it with the base stage")
        return TimmViT(**args)


open_clip.add_model_config(CONFIG_DIR)
