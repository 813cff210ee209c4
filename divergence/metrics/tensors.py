"""Input handling shared by the metrics: any array in, a flat torch tensor out, float64 sums."""

from __future__ import annotations

import numpy as np
import torch

# Elements per chunk when a float64 temporary is needed: bounds the extra memory to
# 8 * CHUNK bytes per temporary whatever the tensor size, and keeps it in cache (2 MiB):
# on CPU, 4M-element chunks ran 7x slower than these, from page faults on each allocation.
# Every sum is taken chunk by chunk and the chunk sums added with ``math.fsum``, so where
# a chunk is summed (which thread, in which order) never changes a result.
CHUNK = 1 << 18


def as_tensor(x) -> torch.Tensor:
    """A torch view of ``x`` (torch tensor or numpy array / array-like), detached."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.as_tensor(np.asarray(x))


def check_same_shape(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")


def chunks(n: int, size: int = CHUNK):
    """Slices that cover range(n) in pieces of at most ``size``."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def numpy_values(x: torch.Tensor) -> np.ndarray:
    """The values of a CPU tensor as a flat float32 or float64 numpy array, exactly.

    float32 and float64 are viewed, not copied (when contiguous); narrower floats (fp16,
    bf16, fp8: numpy has no bf16) widen to float32 and integers and bool to float64, all
    exact (int64 beyond 2^53 rounds to nearest, as ``torch.Tensor.double`` does).
    """
    if x.is_floating_point() and x.element_size() < 4:
        x = x.float()
    elif not x.is_floating_point():
        x = x.double()
    return x.detach().contiguous().numpy().reshape(-1)


def float64_chunks(a: torch.Tensor, b: torch.Tensor):
    """(x, y) float64 torch chunks of two flat tensors of equal length, on their device.

    The CPU passes use numpy on reused float64 buffers instead (``numpy_values``): torch's
    per-chunk allocations fault pages and its reductions on small chunks run ~5-50x slower
    (measured in benchmarks/bench_wasserstein.py).
    """
    for s in chunks(a.numel()):
        yield a[s].double(), b[s].double()
