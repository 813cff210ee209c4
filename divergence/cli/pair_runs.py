"""What the commands that train a study's pair runs share: their closing options (``study``,
``calibrate``, ``consequence``, ``atlas``); for the first three, their opening options, the split of
``KEY=VALUE`` overrides between the command's own recipe and every pair, and the training of the
planned pair runs (the atlas plans and trains its looks in ``atlas.runner``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from divergence.cli import at_least, shorthand


NO_WANDB = "no wandb: the pair runs do not log to it (log.wandb=false)"


def recipe_options(
    parser: argparse.ArgumentParser,
    kind: str,
    out: str,
    jobs: str,
    overrides: str,
    max_steps: str = "",
    replicates: str = "replicates of every pair (default: the recipe's)",
    no_wandb: str = NO_WANDB,
) -> None:
    """The options of such a command but the atlas: ``--recipe`` (default: ``recipes/<kind>.yaml``),
    ``--out``, ``--max-steps``, ``--replicates`` and ``--jobs``, then ``pair_runs_options``."""
    default = Path(__file__).resolve().parents[1] / "recipes" / f"{kind}.yaml"
    parser.add_argument("--recipe", default=default, help=f"{kind} recipe (default: recipes/{kind}.yaml)")
    parser.add_argument("--out", required=True, help=out)
    parser.add_argument("--max-steps", type=int, help="the same as train.max_steps=N, for every pair" + max_steps)
    parser.add_argument("--replicates", type=int, help=replicates)
    parser.add_argument("--jobs", type=int, help=jobs)
    pair_runs_options(parser, overrides, no_wandb)


def pair_runs_options(parser: argparse.ArgumentParser, overrides: str, no_wandb: str = NO_WANDB) -> None:
    """The options such a command ends with: ``--no-wandb``, ``--no-shared-arms``, ``--quiet`` and the
    ``KEY=VALUE`` overrides; ``no_wandb`` and ``overrides`` say what they reach in that command."""
    parser.add_argument("--no-wandb", action="store_true", help=no_wandb)
    parser.add_argument(
        "--no-shared-arms",
        action="store_true",
        help="train every pair both its arms (the pair-by-pair plan); by default an arm several pairs of a "
        "replicate share is trained once (docs/pair-folder.md, Shared arms)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=overrides)


def split_overrides(args: argparse.Namespace, recipe_keys: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``(recipe overrides, pair overrides)``: the command's recipe reads every override and
    ``--replicates``; every pair reads the overrides that are not the recipe's own keys
    (``recipe_keys``, prefixes such as ``"doses="``), ``--max-steps`` and ``--no-wandb``. A count
    flag below 1 is one line."""
    at_least(1, ("--max-steps", args.max_steps), ("--replicates", args.replicates))
    recipe = list(args.overrides)
    shorthand(recipe, "--replicates", "replicates", args.replicates)
    pair = [o for o in args.overrides if not o.startswith(recipe_keys)]
    shorthand(pair, "--max-steps", "train.max_steps", args.max_steps)
    shorthand(pair, "--no-wandb", "log.wandb", "false" if args.no_wandb else None)
    return recipe, pair


def train(command: str, jobs: list, pair_overrides: list[str], parallel: int, args: argparse.Namespace) -> int | None:
    """Write every pair run's recipe and train the unfinished ones, ``parallel`` at a time, each arm
    once unless ``--no-shared-arms``. None when all trained; else the exit code of a failed pair run
    (2 for a user's mistake, 1 otherwise), its error said in one line."""
    from divergence.study import PairFailed, run_jobs
    from divergence.study.runner import write_recipes

    write_recipes(jobs)
    try:
        run_jobs(jobs, pair_overrides, parallel, show_progress=not args.quiet, shared=not args.no_shared_arms)
    except PairFailed as err:
        print(f"divergence {command}: error: {err}", file=sys.stderr)
        return 2 if err.exit_code == 2 else 1
    return None
