"""Why a CPU atlas's time depends on the CPU: PyTorch's bf16 attention on a CPU without bf16 instructions.

    python benchmarks/bench_cpu_bf16.py [--rounds 3] [--threads 1]

The atlas runs its bf16 pairs (the precision reference, the flash and fp8 rows) under emulated
autocast (``training.emulated_autocast``): convolutions and linears are fp32 kernels on 16-bit-rounded
values, but attention runs as PyTorch runs it, since attention is what the flash rows study. PyTorch's
CPU kernels compute a bf16 matrix product with native bf16 instructions where the CPU has them
(AVX512-BF16, AMX) and with a generic loop where it does not; attention is made of such products.
This benchmark times one training step (forward and backward, batch 16) of the tiny UNet
(``recipes/tiny.yaml``) in fp32 and under bf16 autocast, rounds alternating (a change of the machine's
load hits both alike), and the share of each step spent in attention (``torch.profiler``: the SDPA and
batched-product ops' self time). It prints the CPU's bf16 support beside the ratios.

On a 2-core CPU with AVX2 and no AVX512-BF16, one thread, the numbers are in docs/measurements.md
("The CPU atlas on an AVX2 CPU").
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
ATTENTION_OPS = ("scaled_dot_product", "bmm", "baddbmm")  # SDPA's kernels, and the baseline's products


def cpu_bf16_support() -> str:
    """What the CPU offers bf16 products: torch's vector ISA and the bf16 flags of ``/proc/cpuinfo``."""
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        line = next((x for x in cpuinfo.read_text().splitlines() if x.startswith("flags")), "")
        flags = {f for f in line.split() if "bf16" in f}
    return f"torch ISA {torch.backends.cpu.get_cpu_capability()}, bf16 flags: {' '.join(sorted(flags)) or 'none'}"


def tiny_unet():
    """The tiny recipe's UNet (emulated autocast applied, as the atlas's bf16 arms have it) and a batch."""
    from divergence.models.build import build_unet
    from divergence.recipe.model import UNetConfig
    from divergence.training.emulated_autocast import emulate_cpu_autocast

    recipe = yaml.safe_load((ROOT / "divergence" / "recipes" / "tiny.yaml").read_text())
    unet_keys = recipe["model"]["unet"]
    unet = build_unet(UNetConfig(**unet_keys), 3, 32, recipe["model"]["text_encoder"]["hidden_size"], 0)
    emulate_cpu_autocast(unet)
    batch = recipe["train"]["batch_size"]
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(batch, 3, 32, 32, generator=g)
    text = torch.randn(batch, recipe["model"]["tokenizer"]["max_length"], unet.config.cross_attention_dim, generator=g)
    timestep = torch.randint(0, 1000, (batch,), generator=g)
    return unet, (sample, timestep, text)


def step(unet, inputs, bf16: bool) -> None:
    """One forward and backward (the optimizer's update is the same in both numerics and left out)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = unet(*inputs).sample
    out.float().square().mean().backward()
    unet.zero_grad(set_to_none=True)


def attention_share(unet, inputs, bf16: bool) -> float:
    """The share of a step's CPU time in attention ops (profiler self time)."""
    from torch.profiler import profile

    with profile() as prof:
        step(unet, inputs, bf16)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    attention = sum(e.self_cpu_time_total for e in events if any(op in e.key for op in ATTENTION_OPS))
    return attention / total


def step_args(description: str) -> argparse.Namespace:
    """``--rounds`` and ``--threads`` of a tiny-UNet step benchmark, torch's threads set to the latter."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def main() -> None:
    args = step_args(__doc__.splitlines()[0])
    unet, inputs = tiny_unet()
    times = {False: [], True: []}
    for bf16 in (False, True):
        step(unet, inputs, bf16)  # burn-in
    for _ in range(args.rounds):
        for bf16 in (False, True):
            start = time.perf_counter()
            step(unet, inputs, bf16)
            times[bf16].append(time.perf_counter() - start)
    fp32, bf16 = statistics.median(times[False]), statistics.median(times[True])
    share = {numerics: attention_share(unet, inputs, numerics) for numerics in (False, True)}
    print(cpu_bf16_support())
    print(f"tiny UNet step (forward + backward, batch 16, {args.threads} thread), median of {args.rounds}:")
    print(f"  fp32 {fp32:.3f} s, bf16 autocast (emulated) {bf16:.3f} s: bf16 / fp32 = {bf16 / fp32:.2f}x")
    print(f"  attention's share of the step: fp32 {100 * share[False]:.0f}%, bf16 {100 * share[True]:.0f}%")
    print(f"  attention in bf16 / in fp32: {bf16 * share[True] / (fp32 * share[False]):.1f}x")
    print(f"  the rest of the step, bf16 / fp32: {bf16 * (1 - share[True]) / (fp32 * (1 - share[False])):.2f}x")


if __name__ == "__main__":
    main()
