"""The methods by name: each is one loss module (:mod:`components.method.losses`) and one batch builder
(:mod:`components.method.batches`). ``method.name`` in params/train.yaml picks one; adding a method is
one entry here (docs/architecture.md, "Add a method")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from components.method import batches
from components.method.losses import C2LIPLoss, CLICLoss, ContrastiveLoss, HardExampleLoss


@dataclass(frozen=True)
class Method:
    """``make_loss(method_params, model)`` builds the loss module; ``make_batch(decoded, context)`` a
    training batch; ``needs_phrases``: the run loads the concepts stage's noun phrases;
    ``freezes_image_tower(method_params)``: only the text tower trains."""

    make_loss: Callable[[Any, nn.Module], nn.Module]
    make_batch: Callable[[list, batches.BatchContext], dict]
    needs_phrases: bool = False
    freezes_image_tower: Callable[[Any], bool] = lambda method_params: False


def _c2lip_loss(m, model: nn.Module) -> C2LIPLoss:
    bias = getattr(model, "logit_bias", None)
    return C2LIPLoss(contrastive=m.contrastive, lambda_npc=m.lambda_npc, lambda_xac=m.lambda_xac,
                     xac_temperature=m.xac_temperature, xac_chunk=m.xac_chunk, concept_logit=m.concept_logit,
                     concept_labels=m.concept_labels, concept_text_grad=m.concept_text_grad,
                     init_logit_scale=float(model.logit_scale.detach().reshape(-1)[0]),
                     init_logit_bias=float(bias.detach().reshape(-1)[0]) if bias is not None else 0.0)


METHODS: dict[str, Method] = {
    # SigLIP (or CLIP with contrastive: softmax) fine-tuning on the captions alone: the reference arm
    "siglip": Method(lambda m, model: ContrastiveLoss(m.contrastive), batches.captions_batch),
    # C2LIP: noun-phrase concept losses L_npc and L_xac beside the contrastive loss
    "c2lip": Method(_c2lip_loss, batches.concepts_batch, needs_phrases=True),
    # NegCLIP: hard negatives as extra texts
    "negclip": Method(lambda m, model: HardExampleLoss(m.contrastive), batches.hard_negatives_batch),
    # hard positives + negatives (2412.15396): a hard positive per caption as well
    "hp_hn": Method(lambda m, model: HardExampleLoss(m.contrastive), batches.hard_positives_negatives_batch),
    # CLIC: concatenated image pairs every other step, text tower only unless clic.train_image_tower
    "clic": Method(lambda m, model: CLICLoss(m.contrastive, m.clic.weight_cont, m.clic.weight_sneg, m.clic.weight_uni),
                   batches.clic_batch, freezes_image_tower=lambda m: not m.clic.train_image_tower),
}


def method_for(name: str) -> Method:
    """The method registered as ``name``; an unknown name is an error listing the known ones."""
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]
