"""``divergence launch``: job scripts for a pair trained as separate jobs, and their submission.

Writes, under ``OUT/launch``, a script per arm and one for the comparator
(``divergence watch``), plus a driver: ``submit.sh`` (SLURM: both arms, then the comparator
with a dependency on their start) or ``start.sh`` (torchrun: all three on this node).
``--study`` does that for every pair run of a study and adds its report job
(``divergence.launch.study``). ``--dry-run`` prints them and writes nothing.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from divergence.cli import at_least
from divergence.errors import UserInputError

HELP = "write and submit (SLURM) or start (torchrun) the jobs of a pair or of a whole study"
# #SBATCH options launch writes itself: --sbatch may not repeat them (the flag to use instead, if any)
OWN_SBATCH = {
    **dict.fromkeys(("job-name", "output", "signal", "requeue", "dependency")),  # no flag of launch's
    "nodes": "--nodes",
    "ntasks-per-node": "--gpus-per-node",
    "gres": "--gpus-per-node",
    **{option: f"--{option}" for option in ("cpus-per-task", "mem", "partition", "time", "account")},
}
# --sbatch KEY[=VALUE]: VALUE as divergence.launch.scripts.SBATCH_VALUE allows
SBATCH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9-]*)(=(?!-)[\w.:,+=@/%&|\[\]*!~^()-]+)?")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("launch", help=HELP, description=HELP + ".")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--recipe", help="pair recipe (recipes/pairs/NAME.yaml)")
    what.add_argument("--study", help="study recipe (recipes/study.yaml): every pair run (SLURM), then the report")
    p.add_argument("--scheduler", required=True, choices=("slurm", "torchrun"))
    p.add_argument("--out", help="pair or study folder (default: runs/<pair or study name>)")
    p.add_argument("--nodes", type=int, default=1, help="nodes per arm (default 1)")
    p.add_argument(
        "--gpus-per-node", type=int, default=1, metavar="G", help="GPUs (processes) per node per arm (default 1)"
    )
    p.add_argument("--strategy", default="ddp", help="Lightning strategy of each arm (default ddp; fsdp shards)")
    p.add_argument(
        "--comparator-gpus",
        type=int,
        default=1,
        metavar="K",
        help="ranks of the comparator; > 1 runs it under torchrun (default 1)",
    )
    p.add_argument(
        "--comparator-cpu",
        action="store_true",
        help="the comparator job asks for no GPU and compares on CPU (watch --device cpu)",
    )
    p.add_argument("--cpu", action="store_true", help="CPU processes (gloo) instead of GPUs, e.g. to try the scripts")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--time", help="SLURM time limit per job, e.g. 2-00:00:00")
    p.add_argument("--account", help="SLURM account")
    p.add_argument("--cpus-per-task", type=int, metavar="N", help="SLURM --cpus-per-task of every job")
    p.add_argument("--mem", help="SLURM --mem of every job (memory per node), e.g. 200G")
    p.add_argument(
        "--container-image",
        metavar="IMAGE",
        help="run every srun in this enroot/pyxis image (e.g. /shared/images/divergence.sqsh), "
        "the pair folder and the recipe's folder mounted at the same paths",
    )
    p.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra #SBATCH --KEY=VALUE line in every job (repeatable), e.g. constraint=a100",
    )
    p.add_argument("--group", help="wandb group of the arms and the comparator (default: the pair folder's name)")
    p.add_argument("--command", default="divergence", help="how the jobs call divergence (default: divergence)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the scripts (with --study: every job and what it waits for); write and submit nothing",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for both arms")
    return p


def run(args) -> int:
    from divergence.launch.scripts import LaunchPlan
    from divergence.launch.submit import launch, pair_scripts, render

    _check_numbers(args)
    if args.study:
        return _run_study(args)
    from divergence.recipe.pair import is_pair_recipe
    from divergence.variants.pair_recipe import load_pair_recipe

    if not Path(args.recipe).is_file() or not is_pair_recipe(args.recipe):
        raise UserInputError(f"--recipe {args.recipe}: not a pair recipe file (recipes/pairs/NAME.yaml)")
    pair = load_pair_recipe(args.recipe, args.overrides)  # fail here, not in the jobs
    out = Path(args.out or Path("runs") / pair.name).resolve()
    plan = LaunchPlan(
        recipe=Path(args.recipe).resolve(),
        out=out,
        name=pair.name,
        overrides=tuple(args.overrides),
        **_cluster_options(args),
    )
    if args.dry_run:
        print(render(pair_scripts(plan)))
        return 0
    return launch(plan)


def _check_numbers(args) -> None:
    at_least(
        1,
        ("--nodes", args.nodes),
        ("--gpus-per-node", args.gpus_per_node),
        ("--comparator-gpus", args.comparator_gpus),
        ("--cpus-per-task", args.cpus_per_task),
    )
    if args.container_image and args.scheduler != "slurm":
        raise UserInputError(
            "--container-image: needs --scheduler slurm (pyxis); with torchrun, start the "
            "container yourself (docker/README.md)"
        )
    for option in args.sbatch:
        match = SBATCH_OPTION.fullmatch(option.removeprefix("--"))
        if match is None:
            raise UserInputError(
                f"--sbatch {option!r}: expected KEY=VALUE (or KEY), e.g. constraint=a100, the "
                "value without spaces, quotes or newlines"
            )
        if match.group(1) in OWN_SBATCH:
            use = OWN_SBATCH[match.group(1)]
            raise UserInputError(
                f"--sbatch {option}: launch sets --{match.group(1)} itself" + (f"; use {use}" if use else "")
            )


def _cluster_options(args) -> dict:
    """The LaunchPlan fields every job of a pair or study shares: the flags of the same names, and these two."""
    from dataclasses import fields

    from divergence.launch.scripts import LaunchPlan

    own = {f.name for f in fields(LaunchPlan)} - {"recipe", "out", "overrides"}
    return dict(
        {name: getattr(args, name) for name in own if hasattr(args, name)},
        accelerator="cpu" if args.cpu else "gpu",
        extra_sbatch=tuple(f"--{o.removeprefix('--')}" for o in args.sbatch),
    )


def _run_study(args) -> int:
    from divergence.launch.scripts import LaunchPlan
    from divergence.launch.study import plan_study, render_study, write_study
    from divergence.launch.submit import need_tool, run_driver
    from divergence.study.config import STUDY_OVERRIDES, load_study

    if args.scheduler != "slurm":
        raise UserInputError(
            "--study: needs --scheduler slurm (a study is many jobs; on one machine use divergence study)"
        )
    if not Path(args.study).is_file():
        raise UserInputError(f"--study {args.study}: no such file (a study recipe, e.g. recipes/study.yaml)")
    study = load_study(args.study, args.overrides, "cpu" if args.cpu else "cuda")
    out = Path(args.out or Path("runs") / study.name).resolve()
    pair_overrides = [o for o in args.overrides if not o.startswith(STUDY_OVERRIDES)]
    template = LaunchPlan(recipe=out, out=out, name=study.name, **_cluster_options(args))
    launch = plan_study(study, out, pair_overrides, template)
    if args.dry_run:
        print(render_study(launch))
        return 0
    need_tool("slurm", "the jobs")
    submit = write_study(launch)
    print(f"wrote the recipes and scripts of {len(launch.plans)} pair runs under {out}; running {submit}", flush=True)
    return run_driver(submit)
