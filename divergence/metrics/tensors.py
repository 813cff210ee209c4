"""Input handling shared by the metrics: any array in, a flat torch tensor out, float64 sums."""

from __future__ import annotations

import math

import numpy as np
import torch

# Elements per chunk when a float64 temporary is needed: bounds the extra memory to
# 8 * CHUNK bytes per temporary whatever the tensor size, and keeps it in cache (2 MiB):
# on CPU, 4M-element chunks ran 7x slower than these, from page faults on each allocation.
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


def float64_chunks(a: torch.Tensor, b: torch.Tensor):
    """(x, y) float64 chunks of two flat tensors of equal length: numpy arrays on CPU,
    torch tensors elsewhere. Both types support ``-``, ``*``, ``abs()``, ``.sum()``, ``.max()``.

    On CPU, numpy's float32 -> float64 conversion and reductions on small chunks run ~5-50x
    faster than torch's, whose per-chunk allocations fault pages (measured in
    benchmarks/bench_wasserstein.py).
    """
    for s in chunks(a.numel()):
        if a.device.type == "cpu":
            yield _numpy64(a[s]), _numpy64(b[s])
        else:
            yield a[s].double(), b[s].double()


def _numpy64(x: torch.Tensor) -> np.ndarray:
    if x.dtype == torch.bfloat16 or not x.dtype.is_floating_point and x.dtype != torch.bool:
        x = x.double()
    return x.detach().numpy().astype(np.float64, copy=False)


def float64_sum(parts) -> float:
    """Sum of an iterable of float64 chunk sums, exactly rounded across chunks."""
    return math.fsum(float(p) for p in parts)
