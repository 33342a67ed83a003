"""Every rank's rows of a batch, gathered with their gradient (what the losses of :mod:`components.method.losses` need
across processes), and the sum of per-rank shares of a global loss. Pure torch; one process is a world of one."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_gather as all_gather_with_grad


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Concatenate every rank's rows (counts may differ per rank), keeping gradients; also the counts.

    Rows are padded to the largest count for torch's autograd-aware all_gather, then unpadded.
    """
    if not distributed():
        return tensor, [tensor.shape[0]]
    count = torch.tensor([tensor.shape[0]], device=tensor.device)
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    counts = [int(c) for c in counts]
    padded = tensor.new_zeros((max(counts), *tensor.shape[1:]))
    padded = torch.cat([tensor, padded[tensor.shape[0]:]], 0)  # keeps the graph to ``tensor``
    gathered = torch.cat(all_gather_with_grad(padded), 0)  # backward sums every rank's gradient for our slice
    rows = max(counts)
    return torch.cat([gathered[r * rows:r * rows + n] for r, n in enumerate(counts)], 0), counts


def sum_over_ranks(partials: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each rank's share of global sums → terms whose value is the global sum (all-reduced, one collective for
    all of them) and whose gradient is W × the rank's share: what the data-parallel mean of the gradients
    needs, as for a loss every rank computes whole (module docstring)."""
    if not distributed() or not partials:
        return partials
    world = dist.get_world_size()
    values = torch.stack([v.detach().float() for v in partials.values()])
    dist.all_reduce(values)
    return {k: world * v + (total.to(v.dtype) - world * v.detach()) for (k, v), total in zip(partials.items(), values, strict=True)}


def gather_ids(ids: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's integer rows (no gradient; counts may differ per rank)."""
    if not distributed():
        return ids
    count = torch.tensor([ids.shape[0]], device=ids.device)
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    counts = [int(c) for c in counts]
    padded = torch.cat([ids, ids.new_zeros((max(counts) - ids.shape[0], *ids.shape[1:]))], 0)
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=False)], 0)
