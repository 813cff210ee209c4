"""Everything random about inputs, as a pure function of (data seed, global step).

Two runs that share a data seed must see bitwise identical batches, noise and timesteps whatever
their model seed, precision or attention, and a resumed run must see what an uninterrupted one
saw. So nothing here reads a global RNG or DataLoader shuffle state: every draw comes from a
``torch.Generator`` seeded by hashing ``(seed, stream, step, rank)``, drawn on the CPU (so a GPU
run sees the same numbers as a CPU run).

Data order is epoch-wise without replacement: the ``p``-th example of the run, counting across
steps and ranks, is ``perm_e[p mod N]`` with ``e = p // N`` and ``perm_e`` a permutation seeded
by ``(seed, e)``. Each rank takes its own slice of every global batch (``batch_indices`` with the
rank's ``batch_size x accumulate`` examples is that slice); the batch's random draws are made
for the whole global batch from the rank-0 stream and sliced (``divergence.data.batches``).
"""

from __future__ import annotations

import functools

import torch

from divergence.recipe.seeds import derive_seed


def step_generator(seed: int, stream: str, step: int, rank: int = 0) -> torch.Generator:
    """A CPU generator for one named stream (``noise``, ``timesteps``, ...) of one step on one rank."""
    return torch.Generator().manual_seed(derive_seed(seed, stream, step, rank))


@functools.lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, num_examples: int) -> torch.Tensor:
    return torch.randperm(num_examples, generator=step_generator(seed, "order", epoch))


def batch_indices(
    num_examples: int, batch_size: int, seed: int, step: int, rank: int = 0, world_size: int = 1
) -> list[int]:
    """Dataset indices of rank ``rank``'s batch at ``step``: each epoch visits every example once.

    >>> sorted(i for s in range(5) for i in batch_indices(10, 2, seed=0, step=s)) == list(range(10))
    True
    """
    start = (step * world_size + rank) * batch_size
    out = []
    for position in range(start, start + batch_size):
        epoch, offset = divmod(position, num_examples)
        out.append(int(_epoch_permutation(seed, epoch, num_examples)[offset]))
    return out
