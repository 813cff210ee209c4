"""``divergence watch DIR``: follow the two arm jobs of a pair and write its metrics store.

Started before the arms have created ``DIR``, it waits for them (``comparator.follow.wait_for_pair``).
Exit codes: 0 the pair is complete (both arms finished, every step stored), 1 ``--timeout``
seconds passed without progress (no step stored, no new loss, no arm status change), 2 bad
input (an unreadable store or loss file, checkpoints of the two arms that cannot be matched) or
a step that can never come: an arm that finished or failed before it, or with a gap where it
should be, or a folder without arm folders (``divergence.comparator.stalls``).
Under ``torchrun`` the checkpoint pairs are divided among the ranks (gloo on CPU, NCCL on GPUs).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from divergence.cli import Renamed
from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.pair_json import read_pair_json
from divergence.store import MetricsStore

HELP = "while a pair's two arms train, follow them and write its metrics store as they go (live)"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "watch",
        help=HELP,
        description=HELP + ". The arms write into one pair folder (divergence.ArmWriter, Lightning's "
        "ArmCheckpoints, transformers' ArmWriterCallback, or divergence train --arm); watch computes each step's "
        "records as soon as both arms' losses and checkpoints for it are complete, with their losses; restarted, "
        "it continues where it stopped. Launch under torchrun to divide each comparison among ranks. "
        "For two checkpoint series that are already saved, by any trainer, use divergence track.",
    )
    p.add_argument("dir", metavar="DIR", help="pair folder the arms train into (divergence train DIR --arm a|b)")
    p.add_argument(
        "--poll",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between looks at the arms' files when nothing is ready (default 5)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit 1 after this many seconds without progress: no step stored, no new loss, no arm "
        "status change, even while a step is retried (default: wait as long as it takes)",
    )
    p.add_argument("--device", default="auto", help="auto (this rank's GPU if any), cpu or cuda")
    p.add_argument(
        "--no-wandb",
        action="store_true",
        help="no wandb run: the store and its CSV logs (the store alone where Lightning is not installed)",
    )
    p.add_argument(
        "--no-log",
        action=Renamed,
        new="--no-wandb",
        note=" (no wandb run, CSV logs kept); --no-log still writes the store only, no logs",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar; only the result line")
    return p


def _can_log(no_wandb: bool, no_wandb_name: str = "--no-wandb") -> bool:
    """The logs are Lightning's loggers (CSV, wandb, TensorBoard): without Lightning, ``--no-wandb``
    writes the store alone (said in one line), and a watch that would log to wandb is refused."""
    from divergence.extras import MissingExtra, require

    try:
        require("train", "lightning")
    except MissingExtra as err:
        if not no_wandb:
            raise MissingExtra(f"{err}; or pass {no_wandb_name} (the store without logs)") from None
        print("divergence watch: note: Lightning is not installed: the store only, no CSV logs", file=sys.stderr)
        return False
    return True


@dataclass(frozen=True)
class WatchResult:
    """What a watch ended with: ``code`` 0 the pair is complete (both arms finished, every step
    stored), 1 timed out without progress, 2 a step that can never come (said on stderr);
    ``steps`` stored and ``compared`` (tracked) in the store, its ``last_step`` (None: none)."""

    code: int
    steps: int
    compared: int
    last_step: int | None
    seconds: float

    @property
    def complete(self) -> bool:
        return self.code == 0


def watch(
    pair_folder: str | Path,
    *,
    poll: float = 5.0,
    timeout: float | None = None,
    device: str = "auto",
    wandb: bool = True,
    logs: bool = True,
    quiet: bool = False,
) -> WatchResult:
    """Follow the two arm jobs of ``pair_folder`` while they train and write its metrics store:
    ``divergence watch DIR`` as a function, with its waits, output and rules.

    ::

        result = divergence.watch("runs/adamw-foreach-vs-fused", poll=0.5, timeout=600, wandb=False)
        if result.complete:
            divergence.build_report(["runs"], "report")

    It waits for the arms to start (up to ``timeout``), then stores each step once both arms'
    losses (and, at a tracked step, both weights files) are written, and returns when the pair is
    complete, after ``timeout`` seconds without progress (no step stored, no new loss, no arm
    status change), or at a step that can never come (an arm ended before it). Restarted, it
    continues after the last stored step. ``poll``: seconds between looks when nothing is ready;
    ``device``: ``auto`` (this rank's GPU if any), ``cpu`` or ``cuda``; ``wandb=False``: no wandb
    run, the CSV logs kept; ``logs=False``: the store alone; ``quiet``: no progress bar, only the
    result line (printed on a complete pair: steps stored, the last ``max_abs_diff``, the next
    command). Under ``torchrun`` every rank calls it and the comparisons are divided among them.
    Bad input (an unreadable store, weights that cannot be matched) raises ``UserInputError``.
    """
    return _watch(pair_folder, poll, timeout, device, wandb, logs, quiet, PYTHON_NAMES)


CLI_NAMES = {"poll": "--poll {:g}", "timeout": "--timeout {:g}", "no_wandb": "--no-wandb"}
PYTHON_NAMES = {"poll": "watch(poll={!r})", "timeout": "watch(timeout={!r})", "no_wandb": "wandb=False"}


def _watch(out, poll, timeout, device, wandb, logs, quiet, names) -> WatchResult:
    if not poll > 0:
        raise UserInputError(f"{names['poll'].format(poll)}: must be > 0 seconds")
    if timeout is not None and not timeout > 0:
        raise UserInputError(f"{names['timeout'].format(timeout)}: must be > 0 seconds")
    if Path(out).exists() and not Path(out).is_dir():
        raise UserInputError(f"{out}: not a folder; give the pair folder the arms train into")
    log = logs and _can_log(not wandb, names["no_wandb"])
    from divergence.comparator.follow import Comparator, wait_for_pair
    from divergence.training.probe_files import FileProbe

    started = time.monotonic()
    pair_folder = PairFolder(out)  # built once here, handed down as the object
    if not wait_for_pair(pair_folder, poll, timeout):
        from divergence.pairfolder.schedule import how_to_start

        print(
            f"divergence watch: timed out: {out} holds no started pair after {timeout:g} s; "
            f"start the arms: {how_to_start(out, 'a')}",
            file=sys.stderr,
        )
        return _result(out, 1, started)
    from divergence.comparator.distributed import ranks_from_environment

    ranks, device = ranks_from_environment(device)
    started = time.monotonic()
    try:
        comparator = Comparator(
            pair_folder,
            ranks,
            device,
            log=log,
            wandb=wandb,
            progress=not quiet and ranks.is_zero,
            probe=FileProbe,  # the built-in trainer's probe over the arms' weights files
        )
        code = comparator.run(poll, timeout)
        return _result(out, code, started, say=code == 0 and ranks.is_zero)
    finally:
        ranks.close()


def _result(out, code: int, started: float, say: bool = False) -> WatchResult:
    """The result of a watch of ``out`` ended with ``code``, its counts read from the store; ``say``: print
    what a complete watch leaves (steps compared, the last tracked step's max_abs_diff, the time, the next
    command)."""
    store = MetricsStore(out)
    try:
        records = store.step_records() if store.exists() else []
    except UserInputError:  # an unreadable store: the stop said so already
        records = []
    tracked = [r for r in records if r.get("tracked")]
    seconds = time.monotonic() - started
    if say:
        last = f"; step {tracked[-1]['step']}: max_abs_diff {tracked[-1]['max_abs_diff']:.4g}" if tracked else ""
        print(f"{out}: {len(records)} steps stored ({len(tracked)} compared){last}; {seconds:.1f} s; {next_step(out)}")
    return WatchResult(code, len(records), len(tracked), records[-1]["step"] if records else None, seconds)


def run(args) -> int:
    result = _watch(
        args.dir,
        args.poll,
        args.timeout,
        args.device,
        wandb=not (args.no_wandb or args.no_log),
        logs=not args.no_log,
        quiet=args.quiet,
        names=CLI_NAMES,
    )
    return result.code


NEEDS = (
    "a verdict needs this pair beside a precision pair (bf16 vs fp32), a seed pair, a control and a reordering "
    'pair, 3 or more replicates each (README, "What a verdict needs"): divergence report FOLDER, FOLDER holding '
    "them all"
)


def next_step(out) -> str:
    """What to run next: ``divergence report`` on the folder that holds this pair beside a pair under study
    and a precision pair (the pair folders one or two levels below its parent), else what a verdict needs:
    a report of one pair folder shows its curves but can decide nothing."""
    from divergence.report.inputs import find_runs

    parent = Path(out).resolve().parent
    try:
        categories = {read_pair_json(run).get("category") for run in find_runs([parent])}
    except UserInputError:
        categories = set()
    if {"optimization", "precision"} <= categories:
        return f"next: divergence report {parent}"
    return f"next: {NEEDS}"
