"""GPU figures for the paper architecture: samples/s, peak memory and model FLOPs utilisation (MFU) of
`siglip` and `c2lip` training steps under DeepSpeed, on synthetic batches, and what each speed lever changes.

    python bench/train_gpu.py                          # ViT-B-16-SigLIP, 224 px, bf16, ZeRO 1, batch 96
    python bench/train_gpu.py --batch 256 --levers sync-every-step compile autocast grad-checkpointing --distinct-share 0.76
    python bench/train_gpu.py --model c2lip-tiny-map --image-size 64 --batch 8 --steps 3 --cpu   # a CPU dry run

Random initialisation (no weights are fetched) and synthetic inputs: random images, random caption
token ids, 5 random phrases per image — the step's cost does not depend on the values. FLOPs per step
are counted once with torch's FlopCounterMode (forward + backward); MFU = FLOPs/s ÷ `--peak-tflops`
(989 for an H100/H200 in dense bf16).

The default is the train stage's own step: DeepSpeed's engine (bf16 on a GPU, fp32 with --cpu), the loss read back
only on logging steps, each distinct phrase of a batch encoded once. ``--levers`` times each lever alone against it,
in the same run (the ratio is what to read; machines are noisy), for both methods:

- ``sync-every-step``: read every loss term back (``.item()``) after every step, as the train loop did before;
- ``compile``: ``torch.compile`` of each transformer block of both towers (:func:`compile_blocks`);
- ``autocast``: fp32 weights (DeepSpeed's fp32 engine) with ``torch.autocast`` to bf16 around the forward pass,
  instead of DeepSpeed's bf16 engine (GPU only);
- ``grad-checkpointing``: activation checkpointing of the image tower, where the activations are (memory for time).

``--distinct-share S``: the synthetic phrases repeat so that a batch holds S·K distinct phrases of its K (real
captions: bench/phrase_repeats.py measures S), and c2lip is also timed encoding every occurrence (``no-dedupe``).
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
from components.shared.devices import batch_to_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def synthetic_batch(batch: int, image_size: int, context: int, phrases_per_image: int, vocab: int, device,
                    phrase_length: int | None = None, distinct_share: float = 1.0, dedupe: bool = True) -> dict:
    """A c2lip batch of random tokens; ``distinct_share`` of its phrase occurrences are distinct texts, the others
    repeat them (as "a man" or "the street" repeat in real captions). ``dedupe``: one row per distinct phrase, as the
    batch builder makes it; else one row per occurrence."""
    g = torch.Generator().manual_seed(0)

    def tokens(n, length=context):
        return torch.randint(1, vocab - 1, (n, length), generator=g)

    occurrences = batch * phrases_per_image
    distinct = max(1, round(occurrences * distinct_share))
    texts_of = torch.cat([torch.arange(distinct), torch.randint(0, distinct, (occurrences - distinct,), generator=g)])
    distinct_tokens = tokens(distinct, phrase_length or context)
    owners = torch.arange(batch).repeat_interleave(phrases_per_image)
    rows, inverse = (distinct_tokens, texts_of) if dedupe else (distinct_tokens[texts_of], torch.arange(occurrences))
    return {
        "images": torch.randn(batch, 3, image_size, image_size, generator=g).to(device),
        "texts": tokens(batch).to(device),
        "phrase_tokens": rows.to(device),
        "phrase_inverse": inverse.to(device),
        "phrase_image_index": owners.to(device),
    }


def compile_blocks(model: torch.nn.Module) -> int:
    """``torch.compile`` each block of every stack of identical blocks (the towers' transformer layers), in place, as
    torchtune compiles per layer: one compiled graph serves every layer, and the code between the blocks (the
    pooling, C2LIP's token features) stays eager. Returns the number of blocks compiled."""
    compiled = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            for block in module:
                block.compile()
                compiled += 1
    return compiled


def measure(method: str, args, device, phrase_length: int | None = None, lever: str | None = None,
            dedupe: bool = True) -> dict:
    import deepspeed

    # the model alone: open_clip's SigLIP tokenizer would need the hub, and the tokens here are synthetic
    torch.manual_seed(0)
    model = open_clip.create_model(args.model, nonscalar_logit_scale=True)
    loss = C2LIPLoss(contrastive="sigmoid", lambda_npc=1.0, lambda_xac=0.01) if method == "c2lip" else ContrastiveLoss("sigmoid")
    if lever == "grad-checkpointing":
        # the image tower's, where the activations are (197 tokens per image against 64 per text); open_clip's text
        # towers of custom blocks fail under its checkpointing call
        model.visual.set_grad_checkpointing(True)
    if lever == "compile":
        compile_blocks(model)
    module = TrainingModule(model, loss)
    bf16_engine = not args.cpu and lever != "autocast"
    config = json.loads((ROOT / "infra" / "deepspeed" / ("zero1_bf16.json" if bf16_engine else "zero1_fp32.json")).read_text())
    config.update(train_batch_size=args.batch * int(os.environ.get("WORLD_SIZE", 1)), train_micro_batch_size_per_gpu=args.batch,
                  gradient_accumulation_steps=1, gradient_clipping=1.0, zero_allow_untested_optimizer=True)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1, fused=True)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    context = model.context_length
    vocab = model.vocab_size
    batch = synthetic_batch(args.batch, args.image_size, context, 5, vocab, device, phrase_length, args.distinct_share, dedupe)
    if method != "c2lip":  # a siglip batch carries images and captions only (method/batches.py)
        batch = {k: batch[k] for k in ("images", "texts")}
    batch = batch_to_model(batch, engine.module)  # as the train loop does: pixels in the engine's dtype
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=lever == "autocast")
    read_back = lever == "sync-every-step"

    def step():
        with autocast:
            terms = engine(**batch)
            total = sum(terms.values())
        engine.backward(total)
        engine.step()
        if read_back:  # the loop before: every term read back after every step
            return {k: v.item() for k, v in terms.items()}
        return total.detach()

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
        last = step()
    if isinstance(last, torch.Tensor):
        last.item()  # the one read back at the end: every step has finished
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    label = method + (f" (phrases at {phrase_length})" if phrase_length else "") + (f", {lever}" if lever else "")
    label += "" if dedupe else ", no-dedupe"
    result = {"method": label, "samples_per_s": args.batch / seconds,
              "step_s": seconds, "tflops_per_step": flops / 1e12, "mfu": flops / seconds / (args.peak_tflops * 1e12)}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result  # the engine, its model and optimiser state go with this frame before the next measurement


LEVERS = ("sync-every-step", "compile", "autocast", "grad-checkpointing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B-16-SigLIP")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, nargs="+", default=[96], help="batch per GPU; several: each measured in turn, in one process")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--cpu", action="store_true", help="fp32 on CPU (a dry run of this script)")
    parser.add_argument("--json", default=None, help="also write the results here (several batches: a path with {batch} in it)")
    parser.add_argument("--phrase-length", type=int, default=16,
                        help="also time c2lip with phrases trimmed to this many tokens (method.phrase_context: trimmed; 0: skip)")
    parser.add_argument("--levers", nargs="*", default=[], choices=LEVERS, help="each timed alone against the default")
    parser.add_argument("--distinct-share", type=float, default=1.0,
                        help="distinct phrases per phrase occurrence (bench/phrase_repeats.py measures it on real captions; "
                             "below 1, c2lip is also timed encoding every occurrence)")
    args = parser.parse_args()
    if not 0 < args.distinct_share <= 1:
        parser.error("--distinct-share must be in (0, 1]")
    if args.json and len(args.batch) > 1 and "{batch}" not in args.json:
        parser.error("--json: with several batches the path needs {batch} in it (one file per batch)")
    one_process = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
    os.environ.update({k: v for k, v in one_process.items() if k not in os.environ})
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if args.cpu else "nccl")
    device = torch.device("cpu") if args.cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    for batch in args.batch:  # one process for every batch: the start-up (imports, DeepSpeed's set-up) is paid once
        measure_batch(argparse.Namespace(**{**vars(args), "batch": batch}), device, hardware)


def measure_batch(args: argparse.Namespace, device: torch.device, hardware: str) -> None:
    """Every measurement at one batch size: the default step of both methods, then the variants asked for."""
    default = {method: measure(method, args, device) for method in ("siglip", "c2lip")}
    results = list(default.values())
    ratios = []
    if args.phrase_length:
        results.append(measure("c2lip", args, device, args.phrase_length))
        ratios.append((f"c2lip, phrases at {args.phrase_length} tokens", results[-1]["samples_per_s"] / default["c2lip"]["samples_per_s"]))
    if args.distinct_share < 1:
        results.append(measure("c2lip", args, device, dedupe=False))
        ratios.append((f"c2lip, each distinct phrase once (share {args.distinct_share:g}) against every occurrence",
                       default["c2lip"]["samples_per_s"] / results[-1]["samples_per_s"]))
    for lever in args.levers:
        if lever == "autocast" and device.type != "cuda":
            print(f"{lever}: skipped on the CPU (bf16 autocast there is emulated; its speed means nothing for a GPU)")
            continue
        for method in ("siglip", "c2lip"):
            if device.type == "cuda":
                torch.cuda.empty_cache()
            results.append(measure(method, args, device, lever=lever))
            ratios.append((f"{method}, {lever}", results[-1]["samples_per_s"] / default[method]["samples_per_s"]))
    for r in results:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    print(f"{args.model}, {args.image_size} px, batch {args.batch}, {hardware}: c2lip/siglip samples/s "
          f"{default['c2lip']['samples_per_s'] / default['siglip']['samples_per_s']:.2f}")
    for name, ratio in ratios:
        print(f"  {name}: {ratio:.2f}x the default's samples/s")
    if args.json:
        figures = {"hardware": hardware, "model": args.model, "batch": args.batch, "results": results, "ratios": dict(ratios)}
        Path(args.json.format(batch=args.batch)).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
