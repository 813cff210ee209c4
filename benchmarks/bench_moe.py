"""The mixture-of-experts backbone's pair step over the tiny DiT's, measured side by side in one run.

    python benchmarks/bench_moe.py [--steps 5] [--rounds 3] [--threads 1] [--batch 16] [--clock wall]

Builds a lockstep pair (two identical arms stepping on the same inputs, the control's work) of
``recipes/tiny-dit.yaml`` and one of ``recipes/tiny-moe.yaml`` (4 experts, top-2, capacity 1.25,
the balance loss; experts grouped, and with ``--loop`` also the loop over experts), and times
``--steps`` pair steps of each per round; rounds alternate the backbones so drift in machine load
hits both; medians are printed with their ratio (target: MoE / DiT <= 2).
``--clock cpu`` times this process's CPU time (one torch thread: the work itself, whatever else
a shared machine runs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from divergence.recipe.run import load_run_recipe
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def build(recipe_name: str, overrides: list[str]):
    recipe = load_run_recipe(RECIPES / recipe_name, overrides)
    inputs = Inputs(recipe)
    arms = [Arm(recipe, inputs.tokenizer, name=name) for name in "ab"]
    for arm in arms:
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
    return inputs, arms


def pair_steps(inputs, arms, start: int, steps: int, clock) -> float:
    """Seconds per pair step (one shared batch, both arms' optimizer steps)."""
    begin = clock()
    for step in range(start, start + steps):
        batch = inputs.prepare_step(inputs.batches.batch(step))
        for arm in arms:
            arm.training_step(batch)
    return (clock() - begin) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--loop", action="store_true", help="also time the loop over experts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    common = [f"train.batch_size={args.batch}", "log.wandb=false", "train.accelerator=cpu"]
    setups = {"tiny-dit": ("tiny-dit.yaml", []), "tiny-moe (grouped)": ("tiny-moe.yaml", [])}
    if args.loop:
        setups["tiny-moe (loop)"] = ("tiny-moe.yaml", ["model.moe.expert_compute=loop"])
    built = {name: build(recipe, [*common, *extra]) for name, (recipe, extra) in setups.items()}
    clock = CLOCKS[args.clock]
    for inputs, arms in built.values():  # warm-up: allocator, first-call costs
        pair_steps(inputs, arms, 0, 1, clock)
    times = {name: [] for name in built}
    for r in range(args.rounds):
        for name, (inputs, arms) in built.items():
            times[name].append(pair_steps(inputs, arms, 1 + r * args.steps, args.steps, clock))
    base = statistics.median(times["tiny-dit"])
    print(
        f"pair step, batch {args.batch}, {args.threads} thread(s), {args.clock} clock, median of {args.rounds} rounds"
    )
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"  {name:20s} {median * 1000:8.1f} ms   x{median / base:.2f} of tiny-dit   (rounds: "
            + ", ".join(f"{v * 1000:.0f}" for v in values)
            + ")"
        )


if __name__ == "__main__":
    main()
