"""The run's sample order: one sequence for the whole run, the same for any number of ranks and loader workers.

Epoch e permutes the shards by (seed, e) and lays their samples end to end; the samples within each consecutive
block of ``block`` of them are then shuffled by (seed, e, block) — a shuffle buffer's mixing, but as a function of
the position, so any position is found without reading what comes before it. An epoch is the first
floor(N / global_batch) × global_batch samples of that sequence (at most one global batch's worth left out, a
different few each epoch), so every sample is trained once per epoch across all ranks.

Global position p is epoch p // L at p % L (L the epoch's length). Micro-batch i of rank r out of W ranks, at
``micro_batch`` m, holds positions (i·W + r)·m … (i·W + r)·m + m − 1: an optimiser step (accumulation × W × m =
global_batch positions) is the same samples whatever W is, so a relaunch on another number of ranks continues the
sequence where the checkpoint's step left it, and a resume seeks to its position instead of replaying.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


class SampleOrder:
    """Global positions → (shard number, sample number in the shard), for shards of ``counts`` samples."""

    def __init__(self, counts: list[int], seed: int, block: int, global_batch: int):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.total = int(self.counts.sum())
        if self.total < global_batch:
            raise ValueError(f"data.shards hold {self.total} samples, fewer than one global batch ({global_batch})")
        self.seed, self.block = seed, max(1, block)
        self.epoch_length = self.total // global_batch * global_batch
        self._layout = lru_cache(maxsize=2)(self._epoch_layout)
        self._shuffle = lru_cache(maxsize=8)(self._block_shuffle)

    def _epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's shard order and where each of them starts in the epoch's sequence."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.counts))
        starts = np.concatenate([[0], np.cumsum(self.counts[order])[:-1]])
        return order, starts

    def _block_shuffle(self, epoch: int, block: int) -> np.ndarray:
        length = min(self.block, self.total - block * self.block)
        return np.random.default_rng([self.seed, epoch, block, 1]).permutation(length)

    def locate(self, position: int) -> tuple[int, int]:
        epoch, offset = divmod(position, self.epoch_length)
        block, within = divmod(offset, self.block)
        laid = block * self.block + int(self._shuffle(epoch, block)[within])  # where in the shards laid end to end
        order, starts = self._layout(epoch)
        k = int(np.searchsorted(starts, laid, side="right")) - 1
        return int(order[k]), laid - int(starts[k])

    def micro_batch(self, index: int, rank: int, world: int, size: int) -> list[tuple[int, int]]:
        """The (shard, sample) pairs of rank ``rank``'s micro-batch ``index``."""
        first = (index * world + rank) * size
        return [self.locate(p) for p in range(first, first + size)]
