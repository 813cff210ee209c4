"""``divergence watch DIR``: follow the two arm jobs of a pair and write its metrics store.

Started before the arms have created ``DIR``, it waits for them (``divergence.comparator.wait``).
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
from pathlib import Path

from divergence.cli import renamed_flag
from divergence.errors import UserInputError

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
    renamed_flag(
        p, "--no-log", "--no-wandb", " (no wandb run, CSV logs kept); --no-log still writes the store only, no logs"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar; only the result line")
    return p


def _file_probe(pair, device):
    """The built-in trainer's probe over the arms' weights files (only for a pair with ``pair.yaml``)."""
    from divergence.training.probe_files import FileProbe

    return FileProbe(pair, device)


def _can_log(no_wandb: bool) -> bool:
    """The logs are Lightning's loggers (CSV, wandb, TensorBoard): without Lightning, ``--no-wandb``
    writes the store alone (said in one line), and a watch that would log to wandb is refused."""
    from divergence.extras import MissingExtra, require

    try:
        require("train", "lightning")
    except MissingExtra as err:
        if not no_wandb:
            raise MissingExtra(f"{err}; or pass --no-wandb (the store without logs)") from None
        print("divergence watch: note: Lightning is not installed: the store only, no CSV logs", file=sys.stderr)
        return False
    return True


def run(args) -> int:
    from divergence.errors import UserInputError

    if args.poll <= 0:
        raise UserInputError(f"--poll {args.poll:g}: must be > 0 seconds")
    if args.timeout is not None and args.timeout <= 0:
        raise UserInputError(f"--timeout {args.timeout:g}: must be > 0 seconds")
    if Path(args.dir).exists() and not Path(args.dir).is_dir():
        raise UserInputError(f"{args.dir}: not a folder; give the pair folder the arms train into")
    log = not args.no_log and _can_log(args.no_wandb)
    from divergence.comparator.follow import Comparator
    from divergence.comparator.wait import wait_for_pair
    from divergence.pairfolder.folder import PairFolder

    pair_folder = PairFolder(args.dir)  # built once here, handed down as the object
    if not wait_for_pair(pair_folder, args.poll, args.timeout):
        from divergence.pairfolder.starting import how_to_start

        print(
            f"divergence watch: timed out: {args.dir} holds no started pair after {args.timeout:g} s; "
            f"start the arms: {how_to_start(args.dir, 'a')}",
            file=sys.stderr,
        )
        return 1
    from divergence.comparator.ranks import ranks_from_environment

    ranks, device = ranks_from_environment(args.device)
    started = time.monotonic()
    try:
        comparator = Comparator(
            pair_folder,
            ranks,
            device,
            log=log,
            wandb=not (args.no_wandb or args.no_log),
            progress=not args.quiet and ranks.is_zero,
            probe=_file_probe,
        )
        code = comparator.run(args.poll, args.timeout)
        if code == 0 and ranks.is_zero:
            print(summary_line(args.dir, time.monotonic() - started))
        return code
    finally:
        ranks.close()


def summary_line(out, seconds: float) -> str:
    """What a complete watch leaves: steps compared, the last tracked step's max_abs_diff, the time, the next command."""
    from divergence.store import MetricsStore

    records = MetricsStore(out).step_records()
    tracked = [r for r in records if r.get("tracked")]
    last = f"; step {tracked[-1]['step']}: max_abs_diff {tracked[-1]['max_abs_diff']:.4g}" if tracked else ""
    return f"{out}: {len(records)} steps stored ({len(tracked)} compared){last}; {seconds:.1f} s; {next_step(out)}"


NEEDS = (
    "a verdict needs this pair beside a precision pair (bf16 vs fp32), a seed pair, a control and a reordering "
    'pair, 3 or more replicates each (README, "What a verdict needs"): divergence report FOLDER, FOLDER holding '
    "them all"
)


def next_step(out) -> str:
    """What to run next: ``divergence report`` on the folder that holds this pair beside a pair under study
    and a precision pair (the pair folders one or two levels below its parent), else what a verdict needs:
    a report of one pair folder shows its curves but can decide nothing."""
    from divergence.pairfolder.pair_json import read_pair_json
    from divergence.report.inputs import find_runs

    parent = Path(out).resolve().parent
    try:
        categories = {read_pair_json(run).get("category") for run in find_runs([parent])}
    except UserInputError:
        categories = set()
    if {"optimization", "precision"} <= categories:
        return f"next: divergence report {parent}"
    return f"next: {NEEDS}"
