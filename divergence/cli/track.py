"""``divergence track A B DIR``: a pair folder from two checkpoint series trained anywhere.

A and B are folders of step-numbered checkpoints (``divergence.checkpoints.series``). Steps
are matched by number; for each step both series have, the two checkpoints are compared
(``divergence.checkpoints.compare``) and the records appended to ``PAIR/metrics.jsonl`` with
``divergence.tracking.records.comparison_records``, exactly as a tracker stores a tracked
step (the losses are unknown: NaN). ``PAIR/pair.json`` describes the pair, so ``divergence
report``, ``export`` and wandb logging work on it. Steps only one series has are listed.

Nothing is written before the inputs are checked (DIR a folder, or a path that can become
one, holding no store; the series' steps within int64), and the pair folder is built in a
hidden staging folder beside it and moved into place at the end: a failure mid-way (a
checkpoint that cannot be read or matched) names the step and both files, and leaves no
half-written pair folder. ``track`` is a writer of the pair folder like any other: it holds the
folder's ``PairLock`` (``divergence.pairfolder.arm.lock``) while it builds and publishes, so it is
refused in one line while an arm writer, a lockstep run or another ``track`` writes DIR.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from divergence.cli import chosen_folder, folder_argument
from divergence.cli.compare import compare_with_flags, reading_flags
from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.pair_json import CATEGORIES, finish_pair, write_pair_files
from divergence.store import MetricsStore

HELP = "after training: turn two saved checkpoint series, from any trainer, into a pair folder and its store"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "track",
        help=HELP,
        description=HELP + ". Series: accelerate/diffusers checkpoint-N/ folders (with --component unet), "
        "Lightning .ckpt files (numbered by their global_step), step_N.safetensors files, save_pretrained or "
        "torch.distributed.checkpoint folders (step-N/, checkpoint-N/). It compares the steps both series hold, "
        "once, and knows no losses (the store's losses are NaN). To follow two arms while they train, writing "
        "into one pair folder, use divergence watch.",
    )
    p.add_argument("a", metavar="A", help="folder of arm a's checkpoints")
    p.add_argument("b", metavar="B", help="folder of arm b's checkpoints")
    folder_argument(p, "the pair folder to write (must not hold a store yet; --out DIR works too)")
    p.add_argument(
        "--component",
        default=None,
        metavar="NAME",
        help="the subfolder of each checkpoint folder holding the model (e.g. unet)",
    )
    p.add_argument("--name", default=None, help="the pair's name (default: the DIR folder's name)")
    p.add_argument(
        "--category",
        default="optimization",
        choices=CATEGORIES,
        help="what the arms differ in (default: optimization)",
    )
    reading_flags(p, "cpu", "cpu")
    return p


def run(args) -> int:
    from divergence.checkpoints.matching import parse_maps
    from divergence.checkpoints.series import find_series
    from divergence.pairfolder.arm.steps import MAX_STEP

    args.out = chosen_folder(args)
    parse_maps(args.map)  # a bad rule fails before any work
    out = _check_out(Path(args.out))
    series = {"a": find_series(args.a, args.component), "b": find_series(args.b, args.component)}
    for step, path in [*series["a"].items(), *series["b"].items()]:
        if step > MAX_STEP:
            raise UserInputError(
                f"{path}: step {step} does not fit in 64 bits (the store's steps are int64); rename it with its real step"
            )
    steps = sorted(series["a"].keys() & series["b"].keys())
    for arm, other in (("a", "b"), ("b", "a")):
        missing = sorted(series[arm].keys() - series[other].keys())
        if missing:
            print(
                f"divergence track: steps only in {arm} ({getattr(args, arm)}), skipped: {_steps(missing)}",
                file=sys.stderr,
            )
    if not steps:
        raise UserInputError(
            f"{args.a} and {args.b}: no step in common (a: {_steps(list(series['a']))}; b: {_steps(list(series['b']))})"
        )
    _write_store(args, out, steps, series)
    print(f"{out}: {len(steps)} steps compared ({_steps(steps)}); next: divergence report {out}")
    return 0


def _check_out(out):
    """DIR can hold a new pair folder: a folder without a store, or a path under folders only."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{out}: exists and is not a folder; give a folder for the pair")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserInputError(f"{out}: {parent} is a file, not a folder")
            break
    if MetricsStore(out).exists():
        raise UserInputError(f"{out}: already holds a metrics store; choose a new folder or remove it")
    return out


def _write_store(args, out, steps: list[int], series: dict) -> None:
    """Build the pair folder in a staging folder, then move it into place (see the module docstring)."""
    import shutil

    from divergence.pairfolder.arm.lock import PairLock

    lock = PairLock(out) if out.is_dir() else None  # refused while an arm writer (or any writer) writes it
    try:
        _check_out(out)  # again, under the lock
        staging = _staging(out)
        lock = lock or PairLock(staging)  # a new folder's lock, moved into place with it
        try:
            _build(args, staging, out, steps, series)
            _publish(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        if lock is not None:
            lock.release()


def _build(args, folder, out, steps: list[int], series: dict) -> None:
    from tqdm import tqdm

    from divergence.tracking.recorder import StepRecorder
    from divergence.tracking.records import comparison_records

    gaps = [b - a for a, b in zip(steps, steps[1:])]
    write_pair_files(
        folder,
        max_steps=max(steps[-1], 1),
        every=min(gaps) if gaps else 1,
        name=args.name or out.resolve().name,
        category=args.category,
        arms={"a": [str(args.a)], "b": [str(args.b)]},
    )
    recorder = StepRecorder(MetricsStore(folder).open_for_append())
    for step in tqdm(steps, desc="track", unit="step", file=sys.stderr, disable=args.quiet or None):
        a, b = series["a"][step], series["b"][step]
        try:
            result = compare_with_flags(a, b, args.map, args.intersection, args.device, format=args.format)
        except UserInputError as err:
            raise UserInputError(f"step {step} ({a} vs {b}): {err}; nothing was written to {out}") from None
        recorder.commit(step, recorder.losses(None), comparison_records(result))
    finish_pair(folder, steps[-1], True)


def _staging(out):
    """A new hidden folder on ``out``'s file system: inside ``out`` when it exists, else beside it."""
    try:
        if out.is_dir():
            staging = out / f".track-{os.getpid()}"
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            staging = out.parent / f".{out.name}.track-{os.getpid()}"
        staging.mkdir()
    except OSError as err:
        raise UserInputError(
            f"{out}: cannot write there ({err.strerror or err}); choose a folder you can write to"
        ) from None
    return staging


def _publish(staging, out) -> None:
    """Move the built pair into ``out``: one rename when ``out`` is new, else the store, then
    ``pair.json`` (each rename atomic; ``pair.json`` last, since readers start from it)."""
    from divergence.atomic import fsync_folder

    if staging.parent != out:
        os.replace(staging, out)
        fsync_folder(out.parent)
        return
    built, target = PairFolder(staging), PairFolder(out)
    os.replace(built.metrics, target.metrics)
    os.replace(built.pair_json, target.pair_json)  # last: readers start from it
    fsync_folder(out)


def _steps(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 8 else "")
