"""Paired training costs, measured side by side in one process on the tiny recipe.

    python benchmarks/bench_pair.py [--pair flash-vs-baseline] [--steps 20] [--rounds 3] [--threads 1]

1. Lockstep overhead: the pair's step time over the sum of its two arms' step times alone
   (target <= 1.05). Each "alone" step prepares its own batch, as a single run does; the pair
   prepares one batch for both arms.
2. Tracking overhead: wall time of pair steps with the divergence tracking at the recipe's
   cadence (compare every ``tracking.every`` steps, losses and spike rule every step, store
   writes) over the same steps without it (target <= 1.03).

Rounds alternate the variants so drift in machine load hits all of them; medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from divergence.recipe.pair import load_pair_recipe
from divergence.store import MetricsStore
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.records import divergence_records, is_tracked, loss_record
from divergence.training.spikes import SpikeDetector

PAIRS = Path(__file__).resolve().parents[1] / "recipes" / "pairs"


def build(pair_name: str, overrides: list[str]):
    pair = load_pair_recipe(PAIRS / f"{pair_name}.yaml", overrides)
    inputs = Inputs(pair.arm_recipes["a"])
    arms = {name: Arm(pair.arm_recipes[name], inputs.tokenizer, name=name) for name in "ab"}
    for arm in arms.values():
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
    return pair, inputs, arms


def timed(fn, steps: int, start: int) -> float:
    begin = time.perf_counter()
    for step in range(start, start + steps):
        fn(step)
    return (time.perf_counter() - begin) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="flash-vs-baseline")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed stage")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair, inputs, arms = build(args.pair, args.overrides)
    batch = lambda step: inputs.prepare(inputs.batches.batch(step))  # noqa: E731

    def alone(name):
        return lambda step: arms[name].training_step(batch(step))

    def lockstep(step):
        shared = batch(step)
        return {name: arm.training_step(shared) for name, arm in arms.items()}

    folder = Path(tempfile.mkdtemp())
    store = MetricsStore(folder).open_for_append()
    detectors = {a: SpikeDetector(pair.tracking.spike_factor, pair.tracking.spike_window) for a in "ab"}
    every, ckpt, max_steps = pair.tracking.every, pair.base.train.checkpoint_every, pair.base.train.max_steps

    def tracked(step):
        outputs = lockstep(step)
        record = loss_record({a: float(o.loss) for a, o in outputs.items()}, detectors)
        tensors = []
        if is_tracked(step + 1, max_steps, every, ckpt):
            tensors, summary = divergence_records(arms["a"].weights(), arms["b"].weights())
            record.update(summary, tracked=True)
        store.append_step(step + 1, tensors, record)  # steps grow across stages and rounds

    timed(lockstep, 3, 0)  # burn-in
    results = {"a alone": [], "b alone": [], "pair": [], "pair + tracking": []}
    start = 3
    for _ in range(args.rounds):
        for label, fn in (("a alone", alone("a")), ("b alone", alone("b")), ("pair", lockstep),
                          ("pair + tracking", tracked)):
            results[label].append(timed(fn, args.steps, start))
            start += args.steps
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"pair {pair.name}, {args.steps} steps x {args.rounds} rounds, torch threads {args.threads}")
    for label, seconds in med.items():
        print(f"  {label:<16} {seconds * 1000:8.1f} ms/step")
    ratio = med["pair"] / (med["a alone"] + med["b alone"])
    overhead = med["pair + tracking"] / med["pair"]
    print(f"lockstep: pair / (a alone + b alone) = {ratio:.3f}   (target <= 1.05)")
    print(f"tracking: with / without, every {every} steps = {overhead:.3f}   (target <= 1.03)")


if __name__ == "__main__":
    main()
