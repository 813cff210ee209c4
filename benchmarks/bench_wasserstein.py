"""divergence.metrics.wasserstein vs scipy.stats.wasserstein_distance, side by side.

    python benchmarks/bench_wasserstein.py [--n 10000000] [--repeats 3]

Prints where scipy's time goes (its stages timed one by one on the same arrays), our
time, the ratio, and the relative difference of the two answers (must be <= 1e-9).
Ratios, not absolute times, are the result: both run in this process on the same data.
"""

import argparse
import time

import numpy as np
import scipy.stats
import torch

from divergence.metrics import wasserstein


def best_of(repeats, fn):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def scipy_stages(u, v):
    """scipy's _cdf_distance (p=1), stage by stage, to show where its time goes."""
    stages = {}
    t = time.perf_counter()
    u_sorter, v_sorter = np.argsort(u), np.argsort(v)
    stages["argsort both inputs"] = time.perf_counter() - t
    t = time.perf_counter()
    all_values = np.concatenate((u, v))
    all_values.sort(kind="mergesort")
    stages["merge-sort the 2n concatenation"] = time.perf_counter() - t
    t = time.perf_counter()
    deltas = np.diff(all_values)
    u_cdf = u[u_sorter].searchsorted(all_values[:-1], "right") / u.size
    v_cdf = v[v_sorter].searchsorted(all_values[:-1], "right") / v.size
    stages["two searchsorted of 2n queries"] = time.perf_counter() - t
    t = time.perf_counter()
    np.sum(np.multiply(np.abs(u_cdf - v_cdf), deltas))
    stages["integrate"] = time.perf_counter() - t
    return stages


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(args.n, generator=g)
    b = a + 1e-3 * torch.randn(args.n, generator=g)  # realistic: two nearby weight tensors
    a_np, b_np = a.numpy(), b.numpy()

    print(f"wasserstein on two {args.n:,}-element float32 tensors, torch threads = {torch.get_num_threads()}")
    t_scipy, ref = best_of(1, lambda: scipy.stats.wasserstein_distance(a_np, b_np))
    stages = scipy_stages(a_np.astype(np.float64), b_np.astype(np.float64))
    for stage, seconds in stages.items():
        print(f"  scipy stage {stage:<34} {seconds:7.3f} s")
    da, db = a.to(args.device), b.to(args.device)
    wasserstein(da, db)  # burn-in
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t_ours, ours = best_of(args.repeats, lambda: wasserstein(da, db))
    rel = abs(ours - ref) / abs(ref)
    print(f"scipy.stats.wasserstein_distance   {t_scipy:8.3f} s   {ref!r}")
    print(f"divergence.metrics.wasserstein     {t_ours:8.3f} s   {ours!r}   ({args.device})")
    print(f"ratio scipy / divergence           {t_scipy / t_ours:8.1f}x   (target >= 20x)")
    print(f"relative difference of answers     {rel:.2e}   (must be <= 1e-9)")
    if rel > 1e-9:
        raise SystemExit("answers differ by more than 1e-9")


if __name__ == "__main__":
    main()
