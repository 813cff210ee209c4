"""``divergence train``: train one text-to-image diffusion model from a recipe (resumes in place)."""

from __future__ import annotations

import argparse

from divergence.cli import at_least, chosen_folder, folder_argument, shorthand
from divergence.errors import UserInputError

HELP = "train a text-to-image diffusion model from a recipe"


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help=HELP,
        description=HELP + ". Running it again with the same DIR resumes.",
    )
    parser.add_argument(
        "--recipe",
        help="recipe YAML: a run (default: the embedded tiny recipe, recipes/tiny.yaml) "
        "or a pair of arms (recipes/pairs/*.yaml), trained in lockstep",
    )
    folder_argument(parser, "the run or pair folder: checkpoints, samples, logs, resume state (--out DIR works too)")
    parser.add_argument(
        "--arm",
        choices=("a", "b"),
        help="with a pair recipe: train only this arm, as its own "
        "job (any strategy, devices, nodes); `divergence watch DIR` compares the arms as they go",
    )
    parser.add_argument("--max-steps", type=int, help="the same as train.max_steps=N")
    parser.add_argument("--checkpoint-every", type=int, help="the same as train.checkpoint_every=N")
    parser.add_argument(
        "--no-wandb", action="store_true", help="no wandb: the run does not log to it (log.wandb=false)"
    )
    parser.add_argument(
        "--replicate",
        type=int,
        metavar="N",
        help="with a pair recipe: train replicate N (its data, "
        "init and probe seeds derived from N the same way for every pair; 0 is the recipe's seeds)",
    )
    parser.add_argument("--lend-arms", action="store_true", help=argparse.SUPPRESS)  # a study's shared arms
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.lr=1e-4")
    return parser


def run(args: argparse.Namespace) -> int:
    from divergence.extras import require

    require("train", "lightning", "diffusers", "transformers")
    from divergence.config.schema import apply_overrides, parse
    from divergence.recipe.pair import is_pair_recipe
    from divergence.recipe.run import RunRecipe, load_run_recipe
    from divergence.variants.pair_recipe import load_pair_recipe

    _split_words(args)
    args.out = chosen_folder(args)
    overrides = list(args.overrides)
    shorthand(overrides, "--max-steps", "train.max_steps", args.max_steps)
    shorthand(overrides, "--checkpoint-every", "train.checkpoint_every", args.checkpoint_every)
    shorthand(overrides, "--no-wandb", "log.wandb", "false" if args.no_wandb else None)
    at_least(0, ("--replicate", args.replicate))
    is_pair = args.recipe is not None and is_pair_recipe(args.recipe)
    for flag, value in (("--replicate", args.replicate), ("--arm", args.arm)):
        if value is not None and not is_pair:
            raise UserInputError(f"{flag} {value}: needs a pair recipe (--recipe recipes/pairs/NAME.yaml)")
    if args.replicate is not None:
        overrides.append(f"replicate={args.replicate}")
    if is_pair:
        pair = load_pair_recipe(args.recipe, overrides)  # a bad recipe fails before torch is imported
        if args.arm is not None:
            from divergence.training.separate_arm import train_arm

            train_arm(pair, args.arm, args.out)
            return 0
        from divergence.training.separate_pair import borrowed_arms, separate_jobs

        borrowed = borrowed_arms(args.out)
        if separate_jobs(pair) is not None or borrowed:  # each arm its own job (or another pair's), then the comparator
            return _train_separate(pair, args, overrides, borrowed)
        from divergence.training.lockstep import train_pair

        train_pair(pair, args.out, lend_arms=args.lend_arms)
        return 0
    if args.recipe is not None:
        recipe = load_run_recipe(args.recipe, overrides)
    else:
        recipe = parse(RunRecipe, apply_overrides({}, overrides))

    from divergence.training.single import train_run

    train_run(recipe, args.out)
    return 0


def _split_words(args) -> None:
    """DIR and the KEY=VALUE overrides in any order (argparse fills DIR with the first word)."""
    words = [w for w in (args.dir, *args.overrides) if w is not None]
    folders = [w for w in words if "=" not in w]
    if len(folders) > 1:
        raise UserInputError(f"{' '.join(folders)}: give one folder (DIR) and KEY=VALUE overrides")
    args.dir, args.overrides = (folders[0] if folders else None), [w for w in words if "=" in w]


def _train_separate(pair, args, overrides: list[str], borrowed: tuple[str, ...] = ()) -> int:
    """The pair's arms as separate multi-process jobs, followed by the comparator ``divergence watch`` runs;
    ``borrowed``: arms another pair of a study trains (links in ``--out``), followed, not trained."""
    from divergence.comparator.follow import Comparator
    from divergence.models.determinism import comparing_threads
    from divergence.training.probe_files import FileProbe
    from divergence.training.separate_pair import arm_command, separate_jobs, train_separate

    why = separate_jobs(pair) or f"arm {', '.join(borrowed)} shared with another pair"
    print(f"{pair.name}: the arms train as separate jobs ({why}), then the comparator follows them")

    def follow(out) -> int:
        # the probe's forwards on the pair's own thread count (train.cpu_threads), as in a lockstep job:
        # torch's default, every core, oversubscribes the cores the study's other jobs use (on 2 busy
        # cores the comparator of a 30-step pair took 136 s of CPU with 2 threads, 23 s with 1)
        comparing_threads(pair.base.train)
        return Comparator(out, log=True, progress=False, probe=FileProbe).run(poll=0.2, timeout=FOLLOW_TIMEOUT)

    return train_separate(pair, args.out, arm_command(args.recipe, args.out, overrides), follow, borrowed)


FOLLOW_TIMEOUT = 3600.0  # seconds without any progress once both arms finished: the comparator stops (exit 1)
