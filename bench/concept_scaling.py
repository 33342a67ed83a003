"""Benchmark: C2LIP's concept terms per rank as the number of ranks grows, at a fixed per-rank batch.

    python bench/concept_scaling.py [--images 16] [--per-image 5] [--tokens 49] [--width 256] [--steps 3]

1. Measured on CPU (gloo, one torch thread per rank): the CPU seconds one rank spends in the forward + backward of
   L_npc + L_xac per step, at 1, 2 and 4 ranks with the same images per rank, for
   - ``global`` (the way before): every rank gathers every rank's image tokens and computes the whole global batch's
     [M·W, K·W] terms;
   - ``own rows`` (the loss now, :class:`components.method.losses.C2LIPLoss`): every rank scores its own M images
     against the K·W gathered phrases.
   CPU time of the rank's process (not wall time: 4 ranks share 2 cores here), the median of ``--steps`` steps after
   one warm-up. Both give the same loss and gradients (tests/test_scale_out.py).
2. Counted: the FLOPs of L_xac per rank and step (forward + backward ≈ 3 × the forward's two [M, K, J, D] products) and
   the image-token bytes a rank gathers (bf16 towers), at the paper's 96 images per GPU (5 phrases each, 196 tokens,
   width 768) on 1, 8 and 64 GPUs, both ways.
3. Modelled, not measured: per-GPU samples/s of SigLIP and C2LIP at 1, 8 and 64 GPUs × 96, before and after, from the
   one-GPU figures measured on an H200 (docs/performance.md "GPU figures": SigLIP 625, C2LIP 405 samples/s at batch
   96) plus L_xac's extra FLOPs at W GPUs run at an assumed ``--xac-tflops`` (fp32, no tensor cores). Gradient
   all-reduce and the contrastive loss's gathered B² term are left out (the same for both methods, and small beside a
   ViT-B step at these sizes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from components.method.losses import C2LIPLoss, gather_rows, npc_loss, xac_loss  # noqa: E402


def global_terms(loss: C2LIPLoss, images, tokens, phrases, owner_local, scale, bias):
    """The concept terms as they were computed before: the whole global batch on every rank."""
    all_images, counts = gather_rows(images)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    all_phrases, _ = gather_rows(phrases)
    owner, _ = gather_rows(owner_local + sum(counts[:rank]))
    all_tokens, _ = gather_rows(tokens)
    return (loss.lambda_npc * npc_loss(all_images, all_phrases, owner, scale, bias)
            + loss.lambda_xac * xac_loss(all_tokens, all_phrases, owner, scale, bias, chunk=loss.xac_chunk))


def own_rows_terms(loss: C2LIPLoss, images, tokens, phrases, owner_local, scale, bias):
    texts = images  # the contrastive term is not measured here: only the concept terms' share is
    terms = loss(images, texts, scale, bias, phrase_features=phrases, phrase_image_index=owner_local, image_tokens=tokens)
    return terms["npc_loss"] + terms["xac_loss"]


def _rank(rank: int, world: int, port: int, args, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    m, k = args.images, args.images * args.per_image
    loss = C2LIPLoss(xac_chunk=10 ** 9)  # one chunk: the vectorised path, no recomputation
    scale, bias = torch.tensor(10.0, requires_grad=True), torch.tensor(-10.0, requires_grad=True)
    results = {}
    for way, fn in (("global", global_terms), ("own rows", own_rows_terms)):
        times = []
        for _ in range(args.steps + 1):
            images = torch.nn.functional.normalize(torch.randn(m, args.width, generator=g), dim=-1).requires_grad_()
            tokens = torch.nn.functional.normalize(torch.randn(m, args.tokens, args.width, generator=g), dim=-1).requires_grad_()
            phrases = torch.nn.functional.normalize(torch.randn(k, args.width, generator=g), dim=-1).requires_grad_()
            owner = torch.arange(m).repeat_interleave(args.per_image)
            torch.distributed.barrier()
            started = time.process_time()
            fn(loss, images, tokens, phrases, owner, scale, bias).backward()
            times.append(time.process_time() - started)
        results[way] = statistics.median(times[1:])
    torch.save(results, os.path.join(out, f"{world}-{rank}.pt"))
    torch.distributed.destroy_process_group()


def xac_flops(images: int, phrases: int, tokens: int, width: int) -> float:
    """Forward + backward of L_xac: two [M, K, J, D] contractions forward (similarities, pooled vectors), twice that back."""
    return 3 * 2 * 2 * images * phrases * tokens * width


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=16, help="images per rank")
    parser.add_argument("--per-image", type=int, default=5, help="phrases per image")
    parser.add_argument("--tokens", type=int, default=49, help="image tokens (7 × 7)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--xac-tflops", type=float, default=25.0, help="the model's assumed fp32 rate of L_xac on the GPU")
    args = parser.parse_args()
    print(f"# CPU ({os.cpu_count()} cores), gloo, 1 thread per rank; per rank: {args.images} images, {args.per_image} phrases each, "
          f"{args.tokens} tokens, width {args.width}; CPU seconds per step of L_npc + L_xac (forward + backward), median of {args.steps}")
    measured = {}
    with tempfile.TemporaryDirectory() as out:
        from components.shared.distributed import free_port

        for world in (1, 2, 4):
            mp.spawn(_rank, args=(world, free_port(), args, out), nprocs=world, join=True)
            per_rank = [torch.load(os.path.join(out, f"{world}-{r}.pt")) for r in range(world)]
            measured[world] = {way: max(r[way] for r in per_rank) for way in per_rank[0]}
    print(f"{'ranks':>5} {'global (before)':>16} {'own rows (now)':>15} {'before/now':>10}")
    for world, row in measured.items():
        print(f"{world:>5} {row['global']:>15.4f}s {row['own rows']:>14.4f}s {row['global'] / row['own rows']:>9.2f}×")
    for way in ("global", "own rows"):
        print(f"{way}: 2 ranks / 1 rank {measured[2][way] / measured[1][way]:.2f}×, 4 ranks / 1 rank {measured[4][way] / measured[1][way]:.2f}×")

    print("\n# counted, L_xac per rank and step at the paper's size (96 images per GPU, 5 phrases each, 196 tokens, width 768, fp32)")
    m, per, j, d = 96, 5, 196, 768
    print(f"{'GPUs':>5} {'global TFLOP':>13} {'own rows TFLOP':>15} {'tokens gathered (global)':>25} {'(own rows)':>11}")
    for gpus in (1, 8, 64):
        before = xac_flops(m * gpus, m * per * gpus, j, d)
        now = xac_flops(m, m * per * gpus, j, d)
        gathered = m * gpus * j * d * 2 if gpus > 1 else 0
        print(f"{gpus:>5} {before / 1e12:>13.2f} {now / 1e12:>15.2f} {gathered / 1e9:>23.2f} GB {0:>9} GB")

    siglip, c2lip = 625.0, 405.0  # samples/s at 96 on one H200 (measured; docs/performance.md)
    print(f"\n# MODELLED per-GPU samples/s at 96 per GPU: one-H200 figures (SigLIP {siglip:.0f}, C2LIP {c2lip:.0f}) + L_xac's extra "
          f"FLOPs at {args.xac_tflops:g} TFLOP/s (assumed)")
    print(f"{'GPUs':>5} {'SigLIP':>7} {'C2LIP before':>13} {'C2LIP now':>10} {'C2LIP total now':>16}")
    one_step, base_xac = m / c2lip, xac_flops(m, m * per, j, d)
    for gpus in (1, 8, 64):
        extra_before = (xac_flops(m * gpus, m * per * gpus, j, d) - base_xac) / (args.xac_tflops * 1e12)
        extra_now = (xac_flops(m, m * per * gpus, j, d) - base_xac) / (args.xac_tflops * 1e12)
        before, now = m / (one_step + extra_before), m / (one_step + extra_now)
        print(f"{gpus:>5} {siglip:>7.0f} {before:>13.0f} {now:>10.0f} {now * gpus:>16,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
