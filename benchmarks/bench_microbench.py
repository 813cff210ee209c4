"""Time the FlashAttention re-implementation against baseline attention on one long sequence.

    .venv/bin/python benchmarks/bench_microbench.py [--seq-len 16384] [--heads 4] [--precision bf16]

One burn-in call, then the median of ``--repeats`` timed calls per implementation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from divergence.attention.reference import baseline_attention
from divergence.attention.tiled import flash_attention_tiled
from divergence.microbench.sweep import DTYPES


def _time(fn, repeats: int) -> float:
    fn()  # burn-in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    shape = (1, args.heads, args.seq_len, args.head_dim)  # (B, H, L, D)
    q, k, v = (torch.randn(shape, generator=g).to(DTYPES[args.precision]) for _ in range(3))
    runs = {
        "baseline": lambda: baseline_attention(q, k, v),
        "flash (all in format)": lambda: flash_attention_tiled(q, k, v, block_q=64, block_kv=256),
        "flash (fp32 accumulate)": lambda: flash_attention_tiled(
            q, k, v, block_q=64, block_kv=256, accumulate=torch.float32
        ),
    }
    print(f"B=1 H={args.heads} L={args.seq_len} D={args.head_dim} {args.precision}, {torch.get_num_threads()} threads")
    for name, fn in runs.items():
        print(f"{name:>24}: {_time(fn, args.repeats):.2f} s")


if __name__ == "__main__":
    main()
