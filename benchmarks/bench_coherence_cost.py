"""What the update error's coherence costs a pair step: CPU seconds, robust to a loaded machine.

    python benchmarks/bench_coherence_cost.py [--pair flash-vs-baseline] [--precision bf16-mixed] [--reps 5]

Builds the pair's two arms as the lockstep trainer does (the study's deployment numerics: both arms
under --precision), then times with ``time.process_time`` (this process's CPU time, so other jobs on
a shared machine change it little) one lockstep step (both arms' forward, backward and optimizer
step) and one measurement of the update error (``divergence.training.update_error.UpdateError``:
two forward and backward passes of arm b), each --reps times on the steps' batches, one thread.
It prints the medians and the added share of a pair run at ``tracking.coherence_every`` = 1, 2, 3,
5 (measurement / (cadence x step)); the pair run's weight comparisons and probe add to the step, so
the share of a whole run is lower than printed.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.update_error import UpdateError
from divergence.variants.pair_recipe import load_pair_recipe

PAIRS = Path(__file__).resolve().parents[1] / "divergence" / "recipes" / "pairs"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="flash-vs-baseline")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    pair = load_pair_recipe(
        PAIRS / f"{args.pair}.yaml", [f"train.precision={args.precision}", "log.wandb=false", "train.accelerator=cpu"]
    )
    inputs = Inputs(pair.arm_recipes["b"])
    arms = {name: Arm(recipe, inputs.tokenizer) for name, recipe in pair.arm_recipes.items()}
    for arm in arms.values():
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
    error = UpdateError(arms["b"], pair.arm_recipes["a"])
    steps, measures = [], []
    for step in range(args.reps + 1):  # the first of each is a warm-up, left out
        batch = inputs.prepare(inputs.batches.batch(step))
        start = time.process_time()
        error.measure(batch)
        measures.append(time.process_time() - start)
        start = time.process_time()
        for arm in arms.values():
            arm.training_step(batch)
        steps.append(time.process_time() - start)
    step, measure = statistics.median(steps[1:]), statistics.median(measures[1:])
    print(f"{args.pair}, {args.precision}, batch {pair.base.train.batch_size}, CPU seconds (median of {args.reps}):")
    print(
        f"  lockstep step (both arms) {step:.3f} s; one update-error measurement {measure:.3f} s ({measure / step:.2f} steps)"
    )
    for every in (1, 2, 3, 5):
        print(f"  coherence_every={every}: +{measure / (every * step):.0%} of the pair's training steps")


if __name__ == "__main__":
    main()
