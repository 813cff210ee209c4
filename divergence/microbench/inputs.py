"""Seeded Q, K, V that every number format represents exactly.

Values are drawn in fp64, rounded to bf16 (the coarsest mantissa) and kept out of fp16's
subnormal range (``|x| < 2**-14`` becomes 0), so casting them to bf16, fp16, fp32 or fp64 is
exact: every implementation sees bit-identical inputs, the fp64 golden value is the exact
attention of what each format computes on, and all measured error is arithmetic, not input
quantization.
"""

from __future__ import annotations

import torch

from divergence.microbench.config import InputsConfig
from divergence.microbench.scales import InputDist

_FP16_MIN_NORMAL = 2.0**-14


def make_inputs(
    cfg: InputsConfig, seq_len: int, device: str = "cpu", dist: InputDist | None = None
) -> tuple[torch.Tensor, ...]:
    """``(q, k, v)``, each (B, H, seq_len, D) fp64 on ``device``; same cfg, seq_len and dist,
    same values. ``dist`` defaults to the reference distribution (``cfg.distribution``, ``cfg.std``).

    The generator is seeded with ``(cfg.seed, seq_len)`` so adding a length to a sweep does not
    change the inputs of the others, and every distribution of one family transforms the same
    draws (common random numbers): ``normal:0.25`` and ``normal:2`` differ by a power of two,
    which bf16 represents exactly, so their inputs are scaled copies and only the scale differs.
    ``ties`` inputs are the normal ones with every key replaced by one of the first ``N``
    keys and V shifted by ``-S``; ``lowrank`` inputs are one shared row plus noise (:mod:`.scales`).
    """
    dist = dist or cfg.reference_dist()
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed * 1_000_003 + seq_len)
    shape = (cfg.batch, cfg.heads, seq_len, cfg.head_dim)
    out = []
    for i in range(3):
        if dist.family == "lowrank":
            x = _similar_rows(gen, shape, dist, shift=-dist.b if i == 2 else 0.0)
        elif dist.family in ("normal", "ties"):
            x = torch.randn(shape, generator=gen, dtype=torch.float64) * dist.b
            if dist.family == "ties" and i == 2:
                x = x - dist.b  # V ~ N(-S, S^2): mostly negative
        else:
            x = dist.a + torch.rand(shape, generator=gen, dtype=torch.float64) * (dist.b - dist.a)
        x = x.to(torch.bfloat16).double()
        x = torch.where(x.abs() < _FP16_MIN_NORMAL, torch.zeros_like(x), x)
        out.append(x)
    if dist.family == "ties":  # keys repeated: each key is one of the first int(dist.a) keys
        pick = torch.randint(int(dist.a), (seq_len,), generator=gen)
        out[1] = out[1][..., pick, :]
    return tuple(x.to(device) for x in out)


def make_grad_output(
    cfg: InputsConfig, seq_len: int, device: str = "cpu", dist: InputDist | None = None
) -> torch.Tensor:
    """The output gradient ``dO`` of the backward measurements: (B, H, seq_len, D) fp64 from
    N(0, 1) (for ``lowrank`` inputs: one shared N(0, 1) row plus the distribution's noise, as
    the rows of a low-rank model's gradient are alike), exact in every format as Q, K, V are;
    its own generator, so the forward inputs do not change with it."""
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed * 1_000_003 + seq_len + 7_919)
    shape = (cfg.batch, cfg.heads, seq_len, cfg.head_dim)
    if dist is not None and dist.family == "lowrank":
        x = _similar_rows(gen, shape, InputDist("lowrank", dist.a, 1.0))
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = x.to(torch.bfloat16).double()
    return torch.where(x.abs() < _FP16_MIN_NORMAL, torch.zeros_like(x), x).to(device)


def _similar_rows(gen, shape, dist: InputDist, shift: float = 0.0) -> torch.Tensor:
    """Per (batch, head) one shared N(shift, S^2) row plus N(0, (NOISE * S)^2) noise on every row."""
    shared = torch.randn((*shape[:2], 1, shape[-1]), generator=gen, dtype=torch.float64) * dist.b + shift
    return shared + torch.randn(shape, generator=gen, dtype=torch.float64) * (dist.a * dist.b)
