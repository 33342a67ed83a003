"""FLOPs of one training step, per method and per phrase length, counted by torch's FlopCounterMode.

    python bench/flops.py [--batch 96] [--phrases-per-image 5]

The models are built on the meta device (shapes, no weights, no arithmetic), so the paper's models at the
paper's per-GPU batch are counted exactly in seconds on a CPU: forward + backward of the train stage's own
step (components.method.module.TrainingModule with the method's loss) for ViT-B-16-SigLIP (SigLIP's tower:
context 64, no causal mask) and ViT-B-16 (CLIP's: context 77, causal, pooled at the end-of-text token),
with the phrases padded to the context (as captions are) and trimmed to the batch's longest phrase
(``method.phrase_context: trimmed``; :func:`components.method.models.trim_padding`). Phrase lengths come
from the noun phrases of the hand-labelled real captions (tests/data/noun_phrases_gold.jsonl), tokenized by
open_clip's CLIP tokenizer (SigLIP's own tokenizer needs the model hub; its word pieces are of similar
length). Every phrase counts as distinct (the upper bound: the stage encodes each distinct phrase once).

Last, what trimming does to a tower that sees its padding: on the committed base export (a SigLIP-like
text tower: no causal mask), the cosine between each ShapesWorld phrase's embedding padded and trimmed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import open_clip  # noqa: E402
import torch  # noqa: E402
from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from components.method import models  # noqa: E402
from components.method.batches import concept_batch  # noqa: E402
from components.method.losses import C2LIPLoss, ContrastiveLoss  # noqa: E402
from components.method.module import TrainingModule  # noqa: E402

ARCHS = ("ViT-B-16-SigLIP", "ViT-B-16")


def real_phrases(n: int) -> list[str]:
    gold = [json.loads(line) for line in (ROOT / "tests" / "data" / "noun_phrases_gold.jsonl").read_text().splitlines()]
    pool = list(dict.fromkeys(p for g in gold for p in g["phrases"]))
    return [pool[k % len(pool)] + ("" if k < len(pool) else f" {k // len(pool)}") for k in range(n)]  # distinct strings


def step_flops(arch: str, method: str, batch: int, phrase_tokens: torch.Tensor | None) -> float:
    """TFLOP of one forward + backward of the train stage's step on the meta device."""
    with torch.device("meta"):
        model = open_clip.create_model(arch, pretrained=None, device="meta", nonscalar_logit_scale=True)
    size = model.visual.image_size if isinstance(model.visual.image_size, int) else model.visual.image_size[0]
    images = torch.empty(batch, 3, size, size, device="meta")
    texts = torch.zeros(batch, models.text_context_length(model), dtype=torch.long, device="meta")
    if method == "siglip":
        module, extra = TrainingModule(model, ContrastiveLoss()), {}
    else:
        loss = C2LIPLoss() if getattr(model, "logit_bias", None) is not None else C2LIPLoss(
            contrastive="softmax", concept_logit="own", init_logit_scale=2.0, init_logit_bias=-5.0)
        per_image = phrase_tokens.shape[0] // batch
        extra = {"phrase_tokens": phrase_tokens.to("meta"),
                 "phrase_inverse": torch.arange(phrase_tokens.shape[0], device="meta"),
                 "phrase_image_index": torch.arange(batch, device="meta").repeat_interleave(per_image)}
        module = TrainingModule(model, loss.to("meta"))  # "own" concept logits are parameters of the loss
    with FlopCounterMode(display=False) as counter:
        sum(module(images, texts, **extra).values()).backward()
    return counter.get_total_flops() / 1e12


def trimming_change(export: Path) -> tuple[float, float, int]:
    """(mean, min) cosine between padded and trimmed phrase embeddings on a trained export, and the count."""
    from components.data import shapesworld
    from components.shared.checkpoints import check_export
    from components.shared.params import ShapesWorldParams

    check_export(export)  # checked as every loader of an export checks it: changed weights are named, not measured
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{export}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{export}")
    world = ShapesWorldParams()
    held = shapesworld.held_out_pairs(world, 0)
    texts = sorted({p for i in range(200) for p in shapesworld.make_sample(world, 0, "train", i, held)[2]["object_phrases"]})
    padded = tokenizer(texts)
    with torch.no_grad():
        full = models.encode_text_at_length(model.eval(), padded)
        cut = models.encode_text_at_length(model, models.trim_padding(padded))
    cos = (full * cut).sum(-1)
    return float(cos.mean()), float(cos.min()), len(texts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--phrases-per-image", type=int, default=5)
    parser.add_argument("--export", default=str(ROOT / "models" / "base" / "export"))
    args = parser.parse_args()
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    phrases = real_phrases(args.batch * args.phrases_per_image)
    padded_clip = concept_batch([phrases], tokenizer)["phrase_tokens"]  # 77 columns
    trimmed = models.trim_padding(padded_clip)
    print(f"step FLOPs (forward + backward), batch {args.batch}, {len(phrases)} phrases (all distinct), "
          f"trimmed phrase length {trimmed.shape[1]} tokens; FlopCounterMode on the meta device")
    print(f"{'model':<17} {'method':<22} {'TFLOP/step':>10} {'vs siglip':>10}")
    figures = []
    for arch in ARCHS:
        with torch.device("meta"):
            context = models.text_context_length(open_clip.create_model(arch, pretrained=None, device="meta"))
        padded = torch.nn.functional.pad(trimmed, (0, context - trimmed.shape[1]))  # the context's padding
        siglip = step_flops(arch, "siglip", args.batch, None)
        rows = [("siglip", siglip), (f"c2lip, phrases at {context}", step_flops(arch, "c2lip", args.batch, padded)),
                (f"c2lip, phrases at {trimmed.shape[1]}", step_flops(arch, "c2lip", args.batch, trimmed))]
        for name, tflop in rows:
            print(f"{arch:<17} {name:<22} {tflop:10.2f} {tflop / siglip:9.2f}x")
        figures.append(f"{arch}: SigLIP {siglip:.2f} TFLOP, C2LIP {rows[1][1] / siglip:.2f}× ({rows[2][1] / siglip:.2f}× with trimmed phrases)")
    if Path(args.export).is_dir():
        mean, low, n = trimming_change(Path(args.export))
        print(f"trimming on a tower that sees its padding ({args.export}, no causal mask): cosine padded vs trimmed "
              f"over {n} ShapesWorld phrases: mean {mean:.4f}, min {low:.4f}")
    record("python bench/flops.py", f"FLOPs of one training step (forward + backward, FlopCounterMode on the meta device) at batch {args.batch}, "
           f"{args.phrases_per_image} real-caption phrases per image", "; ".join(figures), hardware="none (counted on the meta device)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
