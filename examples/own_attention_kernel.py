"""Your own attention kernel in ``divergence microbench``, beside baseline and flash.

The microbenchmark calls any ``module:function`` given to ``--impl`` as::

    out = function(q, k, v, *, scale, causal)

with ``q``, ``k``, ``v`` of shape (B, H, L, D) in the number format under test (bf16, fp16, fp32,
fp64; the same values in every format) and ``out`` (B, H, L, D) in that format. It scores it
against the fp64 golden value like the built-in kernels (|error| and signed bias, of the output,
of D = rowsum(dO * O) and, when the output has an autograd graph, of dQ, dK, dV). The kernel
below is a two-pass attention that keeps the softmax in fp32 and rounds the probabilities to the
input format before P V, as a fused kernel's tensor-core product takes them. From the command
line (the module must be importable, so put its folder on ``PYTHONPATH``)::

    PYTHONPATH=examples divergence microbench --precision bf16 --seq-len 256 --input-dist ties \\
        --impl baseline flash own_attention_kernel:attention --out mb-own

or ``python examples/own_attention_kernel.py --quick --out mb-own``, which does the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def attention(q, k, v, *, scale, causal):
    """softmax(Q K^T * scale) V: scores and softmax in fp32, P rounded to q's format for P V."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return (p.float() @ v.float()).to(q.dtype)


def main(argv: list[str] | None = None) -> int:
    """``divergence microbench --impl baseline flash own_attention_kernel:attention`` plus ``argv``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # so the command can import this module
    from divergence.cli import main as divergence

    args = ["--quick", "--out", "mb-own"] if argv is None else argv
    return divergence(["microbench", "--impl", "baseline", "flash", "own_attention_kernel:attention", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
