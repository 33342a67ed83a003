"""GPU figures for the paper architecture: samples/s, peak memory and model FLOPs utilisation (MFU) of
`siglip` and `c2lip` training steps under DeepSpeed, on synthetic batches.

    python bench/train_gpu.py                          # ViT-B-16-SigLIP, 224 px, bf16, ZeRO 1, batch 96
    python bench/train_gpu.py --model c2lip-tiny-map --image-size 64 --batch 8 --steps 3 --cpu   # a CPU dry run

Random initialisation (no weights are fetched) and synthetic inputs: random images, random caption
token ids, 5 random phrases per image — the step's cost does not depend on the values. FLOPs per step
are counted once with torch's FlopCounterMode (forward + backward); MFU = FLOPs/s ÷ `--peak-tflops`
(989 for an H100/H200 in dense bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import open_clip  # noqa: E402
import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import components.method.models  # noqa: E402,F401  (registers the tiny configs)
from components.method.losses import C2LIPLoss, ContrastiveLoss  # noqa: E402
from components.method.module import TrainingModule  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def synthetic_batch(batch: int, image_size: int, context: int, phrases_per_image: int, vocab: int, device,
                    phrase_length: int | None = None) -> dict:
    g = torch.Generator().manual_seed(0)
    def tokens(n, length=context):
        return torch.randint(1, vocab - 1, (n, length), generator=g)

    owners = torch.arange(batch).repeat_interleave(phrases_per_image)
    return {
        "images": torch.randn(batch, 3, image_size, image_size, generator=g).to(device),
        "texts": tokens(batch).to(device),
        "phrase_tokens": tokens(batch * phrases_per_image, phrase_length or context).to(device),
        "phrase_inverse": torch.arange(batch * phrases_per_image).to(device),
        "phrase_image_index": owners.to(device),
    }


def measure(method: str, args, device, phrase_length: int | None = None) -> dict:
    import deepspeed

    # the model alone: open_clip's SigLIP tokenizer would need the hub, and the tokens here are synthetic
    model = open_clip.create_model(args.model, nonscalar_logit_scale=True)
    loss = C2LIPLoss(contrastive="sigmoid", lambda_npc=1.0, lambda_xac=0.01) if method == "c2lip" else ContrastiveLoss("sigmoid")
    module = TrainingModule(model, loss)
    config = json.loads((ROOT / "infra" / "deepspeed" / ("zero1_fp32.json" if args.cpu else "zero1_bf16.json")).read_text())
    config.update(train_batch_size=args.batch * int(os.environ.get("WORLD_SIZE", 1)), train_micro_batch_size_per_gpu=args.batch,
                  gradient_accumulation_steps=1, gradient_clipping=1.0, zero_allow_untested_optimizer=True)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    context = model.context_length
    vocab = model.vocab_size
    batch = synthetic_batch(args.batch, args.image_size, context, 5, vocab, device, phrase_length)
    if method != "c2lip":  # a siglip batch carries images and captions only (method/batches.py)
        batch = {k: batch[k] for k in ("images", "texts")}
    if not args.cpu:
        batch["images"] = batch["images"].to(torch.bfloat16)

    def step():
        terms = engine(**batch)
        total = sum(terms.values())
        engine.backward(total)
        engine.step()
        return total

    for _ in range(args.warmup):
        step()
    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    result = {"method": method + (f" (phrases at {phrase_length})" if phrase_length else ""), "samples_per_s": args.batch / seconds,
              "step_s": seconds, "tflops_per_step": flops / 1e12, "mfu": flops / seconds / (args.peak_tflops * 1e12)}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B-16-SigLIP")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--cpu", action="store_true", help="fp32 on CPU (a dry run of this script)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--phrase-length", type=int, default=16,
                        help="also time c2lip with phrases trimmed to this many tokens (method.phrase_context: trimmed; 0: skip)")
    args = parser.parse_args()
    one_process = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
    os.environ.update({k: v for k, v in one_process.items() if k not in os.environ})
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if args.cpu else "nccl")
    device = torch.device("cpu") if args.cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    results = [measure(method, args, device) for method in ("siglip", "c2lip")]
    if args.phrase_length:
        results.append(measure("c2lip", args, device, args.phrase_length))
    for r in results:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    print(f"{args.model}, {args.image_size} px, batch {args.batch}: c2lip/siglip samples/s "
          f"{results[1]['samples_per_s'] / results[0]['samples_per_s']:.2f}"
          + (f"; with phrases at {args.phrase_length} tokens {results[2]['samples_per_s'] / results[0]['samples_per_s']:.2f}" if args.phrase_length else ""))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
