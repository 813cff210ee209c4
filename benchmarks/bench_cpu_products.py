"""The CPU atlas's 16-bit and int8 products with fp32 kernels, against PyTorch's own CPU kernels, side by side.

    python benchmarks/bench_cpu_products.py [--rounds 3] [--threads 1]

Two products of the atlas's arms have no fast kernel on a CPU without AVX512-BF16/VNNI (or AMX):
the baseline attention's bf16 matrix products (the precision reference, the flash and fp8 rows:
``divergence.attention.reference.matmul``) and torchao's int8 product (the ``int8-mixed`` row:
``divergence.models.int8_matmul``). Both are now computed with fp32 kernels on values that fp32
holds exactly: the same formula, the bf16 products up to the order of the fp32 sums, the int8
ones bitwise. This benchmark times one training step (forward and backward, batch 16) of the tiny
UNet (``recipes/tiny.yaml``, baseline attention on every attention module, as the atlas's arms) in
each numerics, with the fp32-kernel products ("now") and with PyTorch's own ("before"), rounds
alternating so that a change of the machine's load hits both alike, and checks that the int8
step's gradients are bitwise equal both ways.
"""

from __future__ import annotations

import copy
import statistics
import time
from contextlib import contextmanager, nullcontext

import torch
from bench_cpu_bf16 import cpu_bf16_support, step_args, tiny_unet

from divergence.attention import reference


def baseline_attention_on(unet) -> None:
    """Every attention module of ``unet`` on the baseline kernel (the base recipe's ``attention``)."""
    from divergence.attention.processor import KernelAttnProcessor

    unet.set_attn_processor(KernelAttnProcessor("baseline"))


def int8_unet(unet):
    """A copy of ``unet`` with torchao's INT8 mixed-precision linears (the ``int8-mixed`` arm)."""
    from divergence.models.optimizations import convert_int8

    twin = copy.deepcopy(unet)
    convert_int8({"unet": twin})
    return twin


@contextmanager
def pytorch_products():
    """PyTorch's own CPU kernels for both products: ``torch.matmul`` in bf16, ``torch._int_mm``."""
    from torchao.prototype.quantized_training import int8_mixed_precision as torchao_int8

    from divergence.models import int8_matmul

    saved = reference.matmul, torchao_int8.scaled_int8_mm
    reference.matmul, torchao_int8.scaled_int8_mm = torch.matmul, int8_matmul._TORCHAO[0]
    try:
        yield
    finally:
        reference.matmul, torchao_int8.scaled_int8_mm = saved


def step(unet, inputs, bf16: bool) -> list[torch.Tensor]:
    """One forward and backward; the gradients."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = unet(*inputs).sample
    out.float().square().mean().backward()
    grads = [p.grad.clone() for p in unet.parameters() if p.grad is not None]
    unet.zero_grad(set_to_none=True)
    return grads


def main() -> None:
    args = step_args(__doc__.splitlines()[0])
    unet, inputs = tiny_unet()
    baseline_attention_on(unet)
    int8 = int8_unet(unet)
    cases = {"fp32": (unet, False), "bf16": (unet, True), "int8-mixed": (int8, False)}
    times = {(name, way): [] for name in cases for way in ("now", "before")}
    grads = {}
    for rnd in range(args.rounds + 1):  # round 0: burn-in
        for name, (model, bf16) in cases.items():
            for way in ("now", "before"):
                with pytorch_products() if way == "before" else nullcontext():
                    start = time.perf_counter()
                    g = step(model, inputs, bf16)
                    if rnd:
                        times[name, way].append(time.perf_counter() - start)
                    if name == "int8-mixed":
                        grads[way] = g
    med = {key: statistics.median(value) for key, value in times.items()}
    same = all(torch.equal(a, b) for a, b in zip(grads["now"], grads["before"]))
    print(cpu_bf16_support())
    print(
        f"tiny UNet step, baseline attention (forward + backward, batch 16, {args.threads} thread), median of {args.rounds}:"
    )
    for name in cases:
        now, before = med[name, "now"], med[name, "before"]
        print(
            f"  {name:10s} now {now:.3f} s ({now / med['fp32', 'now']:.2f}x fp32), "
            f"before {before:.3f} s ({before / med['fp32', 'now']:.2f}x fp32): before / now = {before / now:.2f}x"
        )
    print(f"  int8-mixed gradients bitwise equal both ways: {same}")


if __name__ == "__main__":
    main()
