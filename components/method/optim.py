"""The model, the optimiser's parameter groups, the learning-rate schedule and the logit calibration
of a training run. Pure torch (and open_clip for the model), no I/O besides loading ``model.init``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from components.method.models import create_model
from components.shared.checkpoints import EXPORT_CONFIG, EXPORT_WEIGHTS
from components.shared.params import ParamsError, TrainParams


def build_model(params: TrainParams):
    """(model, train transform, eval transform, tokenizer) from ``model.name`` and ``model.init``."""
    init = params.model.init
    if init == "scratch":
        pretrained = None
    elif Path(init).is_dir():
        pretrained = str(Path(init) / EXPORT_WEIGHTS)
        check_text_tower(Path(init), params)
    else:
        pretrained = init
    return create_model(params.model.name, pretrained=pretrained, text_tower=params.model.text_tower,
                        aug_cfg={"scale": tuple(params.data.crop_scale)})


def check_text_tower(export: Path, params: TrainParams) -> None:
    """An export's text tower must be the one ``model.text_tower`` asks for: a base exported with open_clip's own
    tower cannot start a run with a Hugging Face one (its weights have nowhere to go), and the reverse."""
    config_file = export / EXPORT_CONFIG
    if not config_file.is_file():
        return  # check_export names a broken export when the weights are loaded
    exported = json.loads(config_file.read_text()).get("model_cfg", {}).get("text_cfg", {}).get("hf_model_name")
    wanted = params.model.text_tower.hf_model_name if params.model.text_tower else None
    if exported != wanted:
        raise ParamsError(f"model.init {export}: exported with text tower {exported or 'open_clip (no hf_model_name)'}, but "
                          f"model.text_tower asks for {wanted or 'none'}; train a base with the same model.text_tower "
                          "(params/base.yaml) or start from scratch (model.init: scratch)")


def param_groups(module: torch.nn.Module, optim) -> list[dict]:
    """AdamW groups: decay on matrices; none on gains, biases and the logit scale/bias (the paper's rule, docs/architecture.md), which
    also get ``logit_lr_multiplier`` (a model trained from scratch needs them to move ~10× faster)."""
    decay, no_decay, logit = [], [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if "logit_scale" in name or "logit_bias" in name:
            logit.append(p)
        elif p.ndim < 2 or "bias" in name or "norm" in name or "ln_" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": optim.weight_decay, "lr": optim.lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": optim.lr},
        {"params": logit, "weight_decay": 0.0, "lr": optim.lr * optim.logit_lr_multiplier},
    ]


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def _similarities(model, batches) -> list[torch.Tensor]:
    sims = []
    for batch in batches:
        images = model.encode_image(batch["images"], normalize=True)
        texts = model.encode_text(batch["texts"], normalize=True)
        sims.append(images @ texts.T)
    return sims


def calibrate_logits(model, batches, max_log_scale: float) -> tuple[float, float]:
    """Fit (log s, b) of the sigmoid loss on frozen embeddings of ``batches``: L-BFGS on two numbers.

    A base trained with the softmax loss never needed a bias (it cancels in a softmax), so fine-tuning it
    with the sigmoid loss would otherwise spend its first hundreds of steps moving s and b."""
    was_training = model.training
    model.eval()
    sims = _similarities(model, batches)
    model.train(was_training)
    log_scale = model.logit_scale.detach().reshape(-1)[:1].clone().requires_grad_()
    bias = (model.logit_bias.detach().reshape(-1)[:1].clone() if getattr(model, "logit_bias", None) is not None
            else torch.zeros(1)).requires_grad_()
    opt = torch.optim.LBFGS([log_scale, bias], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        total = 0.0
        for sim in sims:
            labels = 2 * torch.eye(sim.shape[0]) - 1
            logits = log_scale.clamp(0, max_log_scale).exp() * sim + bias
            total = total - torch.nn.functional.logsigmoid(labels * logits).sum() / sim.shape[0]
        total = total / len(sims)
        total.backward()
        return total

    opt.step(closure)
    return float(log_scale.detach().clamp(0, max_log_scale)), float(bias.detach())
