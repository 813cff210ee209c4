"""Paired training costs, measured side by side in one process on the tiny recipe.

    python benchmarks/bench_pair.py [--pair flash-vs-baseline] [--steps 20] [--rounds 3] [--threads 1] [--probes 2]

1. Lockstep overhead: the pair's step time over the sum of its two arms' step times alone
   (target <= 1.05). Each "alone" step prepares its own batch, as a single run does; the pair
   prepares one batch for both arms.
2. Tracking overhead: wall time of pair steps with the divergence tracking every
   ``tracking.every`` steps (losses and spike rule every step, store writes; the dense early
   schedule off) over the same steps without it (target <= 1.03).
3. Probe cost: one function-space probe evaluation of both arms (``tracking.probe.size`` items,
   fp32, baseline attention) and one whole-model weight comparison, each over one pair step,
   timed side by side; then what they add at the default cadence (``is_tracked``: dense early,
   then every ``tracking.every``; the probe at the tracked steps ``probe_due`` picks, every
   ``tracking.probe.every`` steps, beside "before": the probe at every tracked step in forward
   passes of ``--before-batch`` items, timed in the same rounds) over runs of several lengths:
   evaluations x cost / (steps x pair step). Target for the probe: <= 10% of pair step time.

Rounds alternate the variants so drift in machine load hits all of them; medians are printed.
``--clock cpu`` times this process's CPU time instead of wall time: with one torch thread it
is what the work costs, whatever else a shared machine runs meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from divergence.variants.pair_recipe import load_pair_recipe
from divergence.store import MetricsStore
from divergence.tracking.records import divergence_records, loss_record
from divergence.pairfolder.settings import is_tracked, probe_due
from divergence.tracking.spikes import SpikeDetector
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs
from divergence.training.probe import FunctionProbe

PAIRS = Path(__file__).resolve().parents[1] / "recipes" / "pairs"


def build(pair_name: str, overrides: list[str]):
    pair = load_pair_recipe(PAIRS / f"{pair_name}.yaml", overrides)
    inputs = Inputs(pair.arm_recipes["a"])
    arms = {name: Arm(pair.arm_recipes[name], inputs.tokenizer, name=name) for name in "ab"}
    for arm in arms.values():
        arm.setup(torch.device("cpu"))
        arm.configure_optimizers()
    return pair, inputs, arms


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(fn, steps: int, start: int) -> float:
    begin = clock()
    for step in range(start, start + steps):
        fn(step)
    return (clock() - begin) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="flash-vs-baseline")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed stage")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probes", type=int, default=2, help="probe evaluations per timed stage")
    parser.add_argument(
        "--before-batch",
        type=int,
        default=64,
        help="probe batch size of the 'before' "
        "variant timed beside the configured probe (64: the default until it became 16)",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or this process's CPU time (one thread: robust to other load)",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
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
    sparse = replace(pair.tracking, dense=())
    probe = FunctionProbe(inputs, pair.tracking.probe, pair.probe_seed)
    before = FunctionProbe(inputs, replace(pair.tracking.probe, batch_size=args.before_batch), pair.probe_seed)

    def tracked(step):
        outputs = lockstep(step)
        record = loss_record({a: float(o.loss) for a, o in outputs.items()}, detectors)
        tensors = []
        if is_tracked(step + 1, max_steps, sparse, ckpt):
            tensors, summary = divergence_records(arms["a"].weights(), arms["b"].weights())
            record.update(summary, tracked=True)
        store.append_step(step + 1, tensors, record)  # steps grow across stages and rounds

    def probed(step):
        probe.record(arms["a"], arms["b"])

    def probed_before(step):
        before.record(arms["a"], arms["b"])

    def compared(step):
        divergence_records(arms["a"].weights(), arms["b"].weights())

    timed(lockstep, 3, 0)  # burn-in
    probed(0), probed_before(0)
    results = {
        "a alone": [],
        "b alone": [],
        "pair": [],
        "pair + tracking": [],
        "probe (both arms)": [],
        "probe before": [],
        "weight comparison": [],
    }
    start = 3
    for _ in range(args.rounds):
        for label, fn, steps in (
            ("a alone", alone("a"), args.steps),
            ("b alone", alone("b"), args.steps),
            ("pair", lockstep, args.steps),
            ("pair + tracking", tracked, args.steps),
            ("probe (both arms)", probed, args.probes),
            ("probe before", probed_before, args.probes),
            ("weight comparison", compared, 2),
        ):
            results[label].append(timed(fn, steps, start))
            start += steps
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"pair {pair.name}, {args.steps} steps x {args.rounds} rounds, torch threads {args.threads}, {args.clock} clock"
    )
    for label, seconds in med.items():
        print(f"  {label:<16} {seconds * 1000:8.1f} ms/step")
    ratio = med["pair"] / (med["a alone"] + med["b alone"])
    overhead = med["pair + tracking"] / med["pair"]
    print(f"lockstep: pair / (a alone + b alone) = {ratio:.3f}   (target <= 1.05)")
    print(f"tracking: with / without, every {every} steps = {overhead:.3f}   (target <= 1.03)")
    probe_ratio, compare_ratio = med["probe (both arms)"] / med["pair"], med["weight comparison"] / med["pair"]
    before_ratio = med["probe before"] / med["pair"]
    size, batch = pair.tracking.probe.size, pair.tracking.probe.batch_size
    print(
        f"probe: one evaluation ({size} items, both arms) / one pair step = {probe_ratio:.2f} at batch {batch}, "
        f"{before_ratio:.2f} at batch {args.before_batch} (before); weight comparison / pair step = {compare_ratio:.2f}"
    )
    dense, config = [list(d) for d in pair.tracking.dense], pair.tracking.probe
    print(
        f"default cadence: tracked on dense {dense}, then every {every}; before: probe at every tracked step, "
        f"batch {args.before_batch}; after: at tracked steps every {config.every} (and the last), batch {batch}"
        f"   (probe target <= 10%)"
    )
    for steps in sorted({100, 200, 500, 2000, max_steps}):
        tracked_steps = [s for s in range(steps + 1) if is_tracked(s, steps, pair.tracking, ckpt)]
        probed = sum(probe_due(s, steps, config) for s in tracked_steps)
        count = len(tracked_steps)
        print(
            f"  over {steps:>4} steps: {count:>3} tracked, weight comparison adds {count * compare_ratio / steps:6.1%}; "
            f"probe before: {count:>3} evaluations, adds {count * before_ratio / steps:6.1%}; "
            f"after: {probed:>3}, adds {probed * probe_ratio / steps:6.1%}"
        )


if __name__ == "__main__":
    main()
