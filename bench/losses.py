"""Benchmark: the cost of the C2LIP concept losses, measured in one run.

    python bench/losses.py [--repeats 3] [--steps 10]

1. L_xac at the paper's per-GPU scale (96 images, 5 phrases each, 196 tokens, width 768, fp32, CPU):
   forward + backward time and extra peak memory (RSS, each variant in a fresh process) of the
   vectorised L_xac in one chunk (the default chunk of 512 holds all 480 phrases), of its chunked,
   checkpointed path (chunks of 96 phrases, recomputed in the backward pass), and of a per-phrase loop
   (each phrase vectorised over images), with the ratios.
2. L_xac's precision where a phrase's attended tokens nearly cancel (pairs of opposite tokens u, −u + δ, a
   phrase orthogonal to them, pooled norm |v| ≈ 1e-3 and 3e-4): the fp32 loss's relative error against
   float64, with the norm taken of the pooled vector (the loss's way) and as sqrt(aᵀ U Uᵀ a) (the formula
   used before, kept here as the reference it was replaced by).
3. Training-step time of a C2LIP step (L_sig + L_npc + L_xac, phrases encoded by the text tower) against
   a plain SigLIP step, tiny SigLIP-like config, batch 64, ShapesWorld captions and phrases, AdamW.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from measured import record  # noqa: E402  (bench/measured.py: the figures README shows)

from components.method.losses import xac_loss  # noqa: E402

M, PER_IMAGE, J, D = 96, 5, 196, 768
CHUNKED = 96  # 5 chunks of the 480 phrases: the checkpointed path


def xac_per_phrase_loop(tokens, phrases, owner, scale, bias):
    """The straightforward implementation: one phrase at a time, vectorised over images."""
    total = tokens.new_zeros(())
    images = torch.arange(tokens.shape[0])
    for k in range(phrases.shape[0]):
        c = phrases[k]
        attention = (tokens @ c).softmax(dim=-1)  # [M, J]
        pooled = F.normalize((attention.unsqueeze(-1) * tokens).sum(1), dim=-1)  # [M, D]
        labels = (images == owner[k]).float() * 2 - 1
        total = total - F.logsigmoid(labels * (scale * pooled @ c + bias)).sum()
    return total / phrases.shape[0]


def xac_gram_norm(tokens, phrases, owner, scale, bias):
    """L_xac with the pooled norm as sqrt(aᵀ U Uᵀ a), the formula before: no [M, K, D] tensor, but it cancels."""
    sims = torch.einsum("mjd,kd->mkj", tokens, phrases)
    attention = sims.softmax(dim=-1)
    norm = ((attention @ (tokens @ tokens.transpose(1, 2))) * attention).sum(-1).clamp_min(0).sqrt().clamp_min(1e-12)
    labels = (torch.arange(tokens.shape[0])[:, None] == owner[None, :]).to(tokens.dtype) * 2 - 1
    return -F.logsigmoid(labels * (scale * (attention * sims).sum(-1) / norm + bias)).sum() / phrases.shape[0]


def precision_errors(nudge: float) -> tuple[float, float, float]:
    """(pooled norm, relative error of the loss's way, of the old formula) for near-cancelling tokens."""
    g = torch.Generator().manual_seed(0)
    base = F.normalize(torch.randn(8, 32, generator=g, dtype=torch.float64), dim=-1)
    tokens = torch.cat([base, -base + nudge * torch.randn(8, 32, generator=g, dtype=torch.float64)])[None].repeat(2, 1, 1)
    phrase = torch.randn(1, 32, generator=g, dtype=torch.float64)
    phrase = F.normalize(phrase - (phrase @ base.T) @ torch.linalg.pinv(base.T), dim=-1)  # orthogonal to every u
    owner, s, b = torch.tensor([0]), torch.tensor([10.0], dtype=torch.float64), torch.tensor([-5.0], dtype=torch.float64)
    pooled = (torch.softmax(tokens[0] @ phrase[0], 0) @ tokens[0]).norm().item()
    reference = xac_loss(tokens, phrase, owner, s, b)
    ours = xac_loss(tokens.float(), phrase.float(), owner, s.float(), b.float())
    old = xac_gram_norm(tokens.float(), phrase.float(), owner, s.float(), b.float())
    return pooled, (abs(ours.double() - reference) / reference).item(), (abs(old.double() - reference) / reference).item()


def _inputs():
    g = torch.Generator().manual_seed(0)
    tokens = F.normalize(torch.randn(M, J, D, generator=g), dim=-1).requires_grad_()
    phrases = F.normalize(torch.randn(M * PER_IMAGE, D, generator=g), dim=-1).requires_grad_()
    owner = torch.arange(M).repeat_interleave(PER_IMAGE)
    return tokens, phrases, owner, torch.tensor([10.0], requires_grad=True), torch.tensor([-10.0], requires_grad=True)


def _measure_xac(variant: str, repeats: int, queue) -> None:
    torch.set_num_threads(torch.get_num_threads())
    tokens, phrases, owner, s, b = _inputs()
    if variant == "loop":
        fn = xac_per_phrase_loop
    else:
        chunk = {"vectorised": 512, "chunked": CHUNKED}[variant]
        fn = lambda *a: xac_loss(*a, chunk=chunk)  # noqa: E731
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss = fn(tokens, phrases, owner, s, b)
        loss.backward()
        times.append(time.perf_counter() - start)
        tokens.grad = phrases.grad = s.grad = b.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put((min(times), (peak - base) / 1024, loss.item()))


def measure_xac(variant: str, repeats: int) -> tuple[float, float, float]:
    ctx = mp.get_context("spawn")  # a fresh process: its peak RSS belongs to this variant alone
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure_xac, args=(variant, repeats, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def step_times(steps: int) -> dict[str, float]:
    from components.data import shapesworld
    from components.method.batches import concept_batch
    from components.method.losses import C2LIPLoss, ContrastiveLoss
    from components.method.models import TINY_SIGLIP, create_model
    from components.method.module import TrainingModule
    from components.shared.params import ShapesWorldParams

    world = ShapesWorldParams()
    held = shapesworld.held_out_pairs(world, 0)
    samples = [shapesworld.make_sample(world, 0, "train", i, held) for i in range(64)]
    # phrases as the concepts stage extracts them from long captions: full phrases and references
    phrases = [m["object_phrases"] + [f"the {o['color']} {o['shape']}" for o in m["objects"][:-1]] for _, _, m in samples]
    import io

    from PIL import Image

    results = {}
    for method, loss in (("siglip", ContrastiveLoss()), ("c2lip", C2LIPLoss())):
        torch.manual_seed(0)
        model, _, preprocess, tokenizer = create_model(TINY_SIGLIP)
        images = torch.stack([preprocess(Image.open(io.BytesIO(jpg))) for jpg, _, _ in samples])
        texts = tokenizer([c["long"] for _, c, _ in samples])
        module = TrainingModule(model, loss)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        times = []
        for step in range(steps + 2):
            start = time.perf_counter()
            batch = concept_batch(phrases, tokenizer) if method == "c2lip" else {}  # the collate's work counts
            total = sum(module(images, texts, **batch).values())
            optimizer.zero_grad()
            total.backward()
            optimizer.step()
            if step >= 2:  # warm-up steps excluded
                times.append(time.perf_counter() - start)
        results[method] = sorted(times)[len(times) // 2]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    fast_t, fast_mem, fast_loss = measure_xac("vectorised", args.repeats)
    chunk_t, chunk_mem, chunk_loss = measure_xac("chunked", args.repeats)
    loop_t, loop_mem, loop_loss = measure_xac("loop", args.repeats)
    print(f"L_xac, {M} images x {PER_IMAGE} phrases, {J} tokens, width {D}, fp32 CPU ({torch.get_num_threads()} threads), forward+backward")
    print(f"  per-phrase loop                 {loop_t:8.3f} s   extra peak RSS {loop_mem:8.0f} MiB   loss {loop_loss:.6f}")
    print(f"  vectorised, one chunk           {fast_t:8.3f} s   extra peak RSS {fast_mem:8.0f} MiB   loss {fast_loss:.6f}")
    print(f"  vectorised, chunks of {CHUNKED} (ckpt) {chunk_t:8.3f} s   extra peak RSS {chunk_mem:8.0f} MiB   loss {chunk_loss:.6f}")
    print(f"  speed-up over the loop: one chunk {loop_t / fast_t:.1f}x, chunked {loop_t / chunk_t:.1f}x  (target >= 20x); "
          f"chunked/one-chunk time {chunk_t / fast_t:.2f}x, memory {chunk_mem / max(fast_mem, 1):.2f}x")
    print("L_xac precision, fp32 loss against float64, near-cancelling tokens")
    for nudge in (1e-3, 3e-4):
        pooled, ours, old = precision_errors(nudge)
        print(f"  pooled norm {pooled:.1e}: norm of the pooled vector {ours:.1e}, sqrt(a^T U U^T a) {old:.1e} (relative error)")
    t = step_times(args.steps)
    print(f"Training step, tiny SigLIP-like config, batch 64, ShapesWorld (median of {args.steps})")
    print(f"  siglip step        {t['siglip']:8.3f} s")
    print(f"  c2lip step         {t['c2lip']:8.3f} s")
    print(f"  ratio c2lip/siglip {t['c2lip'] / t['siglip']:8.2f}x  (target <= 1.5x)")
    record("python bench/losses.py", f"`L_xac` forward+backward at the paper's per-GPU scale ({M} images × {PER_IMAGE} phrases, {J} tokens, "
           f"width {D}, fp32): vectorised in one chunk, its chunked, checkpointed path (chunks of {CHUNKED}), and a per-phrase loop; a "
           "C2LIP training step vs a SigLIP step (tiny SigLIP-like config, batch 64)",
           f"one chunk {fast_t:.2f} s / +{fast_mem:.0f} MiB, chunked {chunk_t:.2f} s / +{chunk_mem:.0f} MiB, loop {loop_t:.1f} s / "
           f"+{loop_mem:.0f} MiB: **{loop_t / fast_t:.0f}×** and **{loop_t / chunk_t:.0f}×** (target ≥ 20×; chunking costs "
           f"{chunk_t / fast_t:.2f}× the time for {chunk_mem / fast_mem:.2f}× the memory); step c2lip/siglip {t['c2lip']:.3f} / "
           f"{t['siglip']:.3f} s = **{t['c2lip'] / t['siglip']:.2f}×** (target ≤ 1.5×)")


if __name__ == "__main__":
    main()
