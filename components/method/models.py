"""Models for the C2LIP method: construction for any open_clip architecture, the tiny configs we ship,
and image token features in the joint embedding space (no new parameters).

Pure torch (plus open_clip/timm for the modules themselves); no file I/O besides open_clip's own
checkpoint loading.
"""

from __future__ import annotations

from contextlib import contextmanager

import open_clip
import torch
from open_clip.modified_resnet import AttentionPool2d, ModifiedResNet
from open_clip.timm_model import TimmModel
from open_clip.tokenizer import HFTokenizer
from open_clip.transformer import VisionTransformer as OpenClipViT
from timm.layers import AttentionPoolLatent
from timm.models.vision_transformer import VisionTransformer as TimmViT

# our tiny configs, registered with open_clip (and timm) on import; their names are re-exported for the method's callers
from components.shared.architectures import CONFIG_DIR, TINY_CLIP, TINY_RN, TINY_SIGLIP  # noqa: F401
from components.shared.safe_load import refuse_remote_code


def hf_text_cfg(text_tower) -> dict:
    """open_clip's text_cfg for a Hugging Face text tower (``text_tower``: HFTextTowerParams)."""
    return {
        "hf_model_name": text_tower.hf_model_name,
        "hf_tokenizer_name": text_tower.tokenizer_name,
        "hf_model_pretrained": text_tower.pretrained,
        "hf_pooler_type": text_tower.pooler,
        "hf_proj_type": text_tower.proj,
        "context_length": text_tower.context_length,
    }


def model_config(name: str, text_tower=None) -> dict:
    """The open_clip model config of ``name``, its text_cfg replaced by a Hugging Face tower when ``text_tower``
    is given (what an export must record to be rebuilt)."""
    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise ValueError(f"model {name!r} is not an open_clip architecture")
    if text_tower is not None:
        cfg["text_cfg"] = hf_text_cfg(text_tower)
        cfg["custom_text"] = True
    return cfg


def hf_layers(transformer: torch.nn.Module) -> torch.nn.ModuleList:
    """The Hugging Face encoder's stack of layers: the ModuleList as long as ``config.num_hidden_layers`` (BERT's
    ``encoder.layer``, T5's ``block``, ...), found by shape rather than by a per-architecture attribute name."""
    depth = getattr(transformer.config, "num_hidden_layers", None)
    stacks = [m for m in transformer.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == depth]
    if not stacks:
        raise ValueError(f"{type(transformer).__name__}: no stack of {depth} layers found to lock")
    return stacks[0]


def lock_hf_text_tower(text: torch.nn.Module, unlocked_layers: int, freeze_layer_norm: bool = True) -> None:
    """Train only the last ``unlocked_layers`` layers of a Hugging Face text tower (and what open_clip puts after
    it: pooler, projection). open_clip's own ``lock`` needs a per-architecture layer name that its table lacks
    for BERT; this finds the stack by its length."""
    layers = hf_layers(text.transformer)
    if unlocked_layers > len(layers):
        raise ValueError(f"unlocked_layers={unlocked_layers}: the text tower has only {len(layers)} layers")
    for name, p in text.transformer.named_parameters():
        is_norm = any(part.lower().startswith(("layernorm", "layer_norm", "ln")) for part in name.split("."))
        p.requires_grad = is_norm and not freeze_layer_norm
    for layer in layers[len(layers) - unlocked_layers:]:
        layer.requires_grad_(True)


def create_model(name: str, pretrained: str | None = None, nonscalar_logit_scale: bool = True, text_tower=None, **kwargs):
    """(model, train transform, eval transform, tokenizer) for any open_clip architecture by name.

    ``pretrained`` is an open_clip tag (``webli``) or a local checkpoint path; a checkpoint whose logit
    scale/bias are 0-dim loads into the 1-dim ones that ``nonscalar_logit_scale`` gives (DeepSpeed 0.19.8
    fails on 0-dim parameters). ``text_tower`` (HFTextTowerParams) swaps in a Hugging Face text tower: its
    weights load by name or folder (``pretrained: true``, and no checkpoint given), its layers are locked as
    ``unlocked_layers`` says, and the tokenizer is its own. Extra keyword arguments go to
    ``open_clip.create_model_and_transforms``.
    """
    if name not in open_clip.list_models():
        raise ValueError(f"model {name!r} is not an open_clip architecture; known: c2lip tiny configs "
                         f"{[TINY_SIGLIP, TINY_CLIP]} and {len(open_clip.list_models())} others")
    if text_tower is not None:
        # open_clip's HF tower calls transformers without trust_remote_code, which would ask on stdin: refuse first
        for setting, hf_name in (("model.text_tower.hf_model_name", text_tower.hf_model_name),
                                 ("model.text_tower.hf_tokenizer_name", text_tower.tokenizer_name)):
            refuse_remote_code(hf_name, setting)
        kwargs["text_cfg"] = hf_text_cfg(text_tower)
        kwargs["pretrained_hf"] = text_tower.pretrained  # open_clip skips it anyway when a checkpoint is loaded
        kwargs["force_custom_text"] = True
    model, preprocess_train, preprocess_val = open_clip.create_model_and_transforms(
        name, pretrained=pretrained, nonscalar_logit_scale=nonscalar_logit_scale, **kwargs
    )
    if text_tower is None:
        return model, preprocess_train, preprocess_val, open_clip.get_tokenizer(name)
    if text_tower.unlocked_layers is not None:
        lock_hf_text_tower(model.text, text_tower.unlocked_layers, text_tower.freeze_layer_norm)
    tokenizer = HFTokenizer(text_tower.tokenizer_name, context_length=text_tower.context_length)
    return model, preprocess_train, preprocess_val, tokenizer


# --------------------------------------------------------------------------------------------------
# image token features
# --------------------------------------------------------------------------------------------------


def _map_token_features(pool: AttentionPoolLatent, tokens: torch.Tensor) -> torch.Tensor:
    """Each token through the MAP head's value path: value half of ``kv`` (heads merged), ``proj``,
    then the residual MLP ``u + mlp(norm(u))`` — what the head outputs when attention picks one token."""
    B, N, C = tokens.shape
    if pool.pos_embed is not None:
        tokens = tokens + pool.pos_embed.unsqueeze(0).to(tokens.dtype)
    kv = pool.kv(tokens).reshape(B, N, 2, C)  # channel layout (2, heads, head_dim): heads merged = C
    u = pool.proj_drop(pool.proj(kv[:, :, 1]))
    return u if pool.mlp is None else u + pool.mlp(pool.norm(u))


def _attnpool_token_features(pool: AttentionPool2d, feature_map: torch.Tensor) -> torch.Tensor:
    """Each spatial position through CLIP-ResNet attention pooling's value path (position embedding,
    ``v_proj``, ``c_proj``): what the pool outputs when its attention picks that one position."""
    x = feature_map.flatten(2).transpose(1, 2)  # [B, HW, C]
    x = x + pool.positional_embedding[1:].unsqueeze(0).to(x.dtype)  # row 0 belongs to the mean token
    return pool.c_proj(pool.v_proj(x))


@contextmanager
def _output_tokens(visual: OpenClipViT):
    previous = visual.output_tokens
    visual.output_tokens = True
    try:
        yield
    finally:
        visual.output_tokens = previous


def image_features_and_tokens(model, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass of the image tower: (pooled features [B, D], token features [B, J, D]), both not yet
    L2-normalised; the pooled features equal ``model.encode_image(images)``.

    Token features are the patch tokens mapped into the joint space by the pooling layer's own modules:
    - timm ViT with a MAP head: see :func:`_map_token_features`, then the layers after pooling;
    - open_clip class-token ViT: ``ln_post`` (if not already applied) then ``proj``;
    - open_clip's CLIP ResNet (attention pooling): see :func:`_attnpool_token_features`.
    Only the training losses call this; ``encode_image`` never takes this path.
    """
    visual = model.visual
    if isinstance(visual, TimmModel) and isinstance(visual.trunk, TimmViT) and isinstance(visual.trunk.attn_pool, AttentionPoolLatent):
        trunk = visual.trunk
        x = trunk.forward_features(images)
        pooled = visual.head(trunk.forward_head(x))
        tokens = _map_token_features(trunk.attn_pool, x[:, trunk.num_prefix_tokens:])
        # the same post-pool layers the pooled vector goes through (identity for timm_proj: none)
        tokens = visual.head(trunk.head(trunk.head_drop(trunk.fc_norm(tokens))))
        return pooled, tokens
    if isinstance(visual, OpenClipViT) and visual.attn_pool is None:
        with _output_tokens(visual):
            pooled, tokens = visual(images)
        if visual.final_ln_after_pool:
            tokens = visual.ln_post(tokens)  # otherwise ln_post was applied before pooling, to all tokens
        if visual.proj is not None:
            tokens = tokens @ visual.proj
        return pooled, tokens
    if isinstance(visual, ModifiedResNet) and isinstance(visual.attnpool, AttentionPool2d):
        x = visual.layer4(visual.layer3(visual.layer2(visual.layer1(visual.stem(images)))))
        return visual.attnpool(x), _attnpool_token_features(visual.attnpool, x)
    raise NotImplementedError(
        f"token features are defined for a timm ViT with a MAP head, open_clip's class-token ViT and "
        f"open_clip's attention-pooled ResNet; "
        f"this model's image tower is {type(visual).__name__}"
    )


def text_context_length(model) -> int:
    """The context the text tower was built for (captions are always tokenized to it)."""
    text = getattr(model, "text", None)
    return int(text.context_length if text is not None else model.context_length)


def trimming_is_exact(model) -> bool:
    """True where a phrase encoded at its own length has exactly the embedding it has padded to the context:
    a causal text tower (no token sees a later one, so no token sees the padding) pooling at a token no later
    than the end-of-text one (CLIP's argmax / eos / first). SigLIP's tower (no causal mask, every token sees
    the padding, pooled at the last position) is not: trimming changes its embeddings (bench/flops.py)."""
    text = getattr(model, "text", None)
    if text is None:  # open_clip's CLIP: the text tower's modules sit on the model
        return getattr(model, "attn_mask", None) is not None and getattr(model, "text_pool_type", "argmax") in ("argmax", "eos", "first")
    if not hasattr(text, "pool_type") or getattr(text, "cls_emb", None) is not None:
        return False  # a Hugging Face tower or CoCa's appended class token: not checked, never trimmed by "auto"
    return text.attn_mask is not None and text.pool_type in ("argmax", "eos", "first")


def trims_phrases(phrase_context: str, model) -> bool:
    """``method.phrase_context`` resolved for ``model``: 'trimmed' always, 'context' never, 'auto' where
    :func:`trimming_is_exact`."""
    if phrase_context not in ("auto", "context", "trimmed"):
        raise ValueError(f"phrase_context must be 'auto', 'context' or 'trimmed', got {phrase_context!r}")
    return phrase_context == "trimmed" or (phrase_context == "auto" and trimming_is_exact(model))


class _EncodeText(torch.nn.Module):
    """``model.encode_text`` as a module's forward, so :func:`torch.func.functional_call` can run it with a
    few parameters and buffers swapped for their first L positions (gradients reach the originals)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return encode_text_rows(self.model, tokens)


def encode_text_rows(model, tokens: torch.Tensor) -> torch.Tensor:
    """L2-normalised text embeddings [N, D] of ``tokens`` [N, L], N = 0 included: open_clip's batch-first attention
    cannot reshape an empty batch, so one row is encoded and none kept (a batch without phrases or hard negatives)."""
    if len(tokens) == 0:
        return model.encode_text(tokens.new_zeros(1, tokens.shape[1]), normalize=True)[:0]
    return model.encode_text(tokens, normalize=True)


def encode_text_at_length(model, tokens: torch.Tensor) -> torch.Tensor:
    """L2-normalised text embeddings of ``tokens`` [N, L] for any L up to the context: the tower runs on L
    positions, its positional embedding and causal mask cut to their first L (open_clip builds both for the
    full context and, for CLIP, adds the whole positional embedding)."""
    length, context = tokens.shape[1], text_context_length(model)
    if length == context:
        return encode_text_rows(model, tokens)
    if length > context:
        raise ValueError(f"text tokens of length {length} exceed the text tower's context of {context}")
    text = getattr(model, "text", None)
    if text is None:
        owner, prefix, swaps = model, "model.", {"positional_embedding": model.positional_embedding[:length]}
    else:
        owner, prefix, swaps = text, "model.text.", {}  # TextTransformer cuts its positional embedding itself
    if getattr(owner, "attn_mask", None) is not None:
        swaps["attn_mask"] = owner.attn_mask[:length, :length]
    return torch.func.functional_call(_EncodeText(model), {prefix + k: v for k, v in swaps.items()}, (tokens,), strict=False)


def trim_padding(tokens: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """``tokens`` [N, C] cut to the longest row's length plus at least one padding column (so the last column
    is padding in every row), rounded up to ``multiple`` and never beyond C. Padding is the last column's
    value, where that column is one value; otherwise nothing is cut."""
    n, width = tokens.shape
    if n == 0 or width == 0 or not bool((tokens[:, -1] == tokens[0, -1]).all()):
        return tokens
    used = (tokens != tokens[0, -1]).any(dim=0).nonzero()
    longest = int(used.max()) + 1 if len(used) else 0
    length = min(width, -(-(longest + 1) // multiple) * multiple)
    return tokens[:, :length]


def encode_concepts(model, phrase_tokens: torch.Tensor, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """L2-normalised embeddings of phrases, each encoded on its own by the text tower, tokenized like
    captions (same tokenizer and padding); at the context length, or shorter where the batch builder
    trimmed the padding (``method.phrase_context``, :func:`trim_padding`).

    ``phrase_tokens`` [U, L] holds the distinct phrases of a batch; ``inverse`` [K] maps every phrase
    occurrence to its row, so a phrase shared by several images is encoded once (gather's backward adds
    the gradients of its occurrences, so loss and gradients equal those of encoding each occurrence).
    """
    features = encode_text_at_length(model, phrase_tokens)
    return features if inverse is None else features[inverse]
