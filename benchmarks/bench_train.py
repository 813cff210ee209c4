"""Steps per second of the tiny recipe on the CPU: batch building plus one arm's training step.

Burn-in steps first (allocator and kernel warm-up), then a timed stage; on a GPU the stage is
bracketed by device synchronization. Lightning's own per-step overhead is not included.

    python benchmarks/bench_train.py [--steps 20] [--threads N] [key=value ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from divergence.recipe.run import RunRecipe
from divergence.config.schema import apply_overrides, parse
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--burn-in", type=int, default=3, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. train.batch_size=8")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = parse(RunRecipe, apply_overrides({}, args.overrides))
    device = torch.device(args.device)
    inputs = Inputs(recipe).to(device)
    arm = Arm(recipe, inputs.tokenizer).to(device)
    arm.setup(device)
    arm.configure_optimizers()
    params = sum(p.numel() for p in arm.parameters())

    def step(i: int) -> float:
        return arm.training_step(inputs.prepare(inputs.batches.batch(i).to(device))).loss

    for i in range(args.burn_in):
        step(i)
    _sync(device)
    start = time.perf_counter()
    for i in range(args.burn_in, args.burn_in + args.steps):
        loss = step(i)
    _sync(device)
    elapsed = time.perf_counter() - start
    print(
        f"recipe {recipe.name}: {params / 1e6:.2f}M params, batch {recipe.train.batch_size}, "
        f"{recipe.data.resolution}px, {recipe.train.precision}, attention {recipe.attention.name}, "
        f"{torch.get_num_threads()} threads on {device}"
    )
    print(
        f"{args.steps / elapsed:.2f} steps/s ({1000 * elapsed / args.steps:.0f} ms/step), last loss {float(loss):.4f}"
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
