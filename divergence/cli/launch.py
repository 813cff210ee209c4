"""``divergence launch``: job scripts for a pair trained as separate jobs, and their submission.

Writes, under ``OUT/launch``, a script per arm and one for the comparator
(``divergence watch``), plus a driver: ``submit.sh`` (SLURM: both arms, then the comparator
with a dependency on their start) or ``start.sh`` (torchrun: all three on this node).
``--dry-run`` prints them and writes nothing.
"""

from __future__ import annotations

import argparse

HELP = "write and submit (SLURM) or start (torchrun) the jobs of a pair: both arms and the comparator"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("launch", help=HELP, description=HELP + ".")
    p.add_argument("--recipe", required=True, help="pair recipe (recipes/pairs/NAME.yaml)")
    p.add_argument("--scheduler", required=True, choices=("slurm", "torchrun"))
    p.add_argument("--out", help="pair folder (default: runs/<pair name>)")
    p.add_argument("--nodes", type=int, default=1, help="nodes per arm (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=1, metavar="G",
                   help="GPUs (processes) per node per arm (default 1)")
    p.add_argument("--strategy", default="ddp", help="Lightning strategy of each arm (default ddp; fsdp shards)")
    p.add_argument("--comparator-gpus", type=int, default=1, metavar="K",
                   help="ranks of the comparator; > 1 runs it under torchrun (default 1)")
    p.add_argument("--cpu", action="store_true", help="CPU processes (gloo) instead of GPUs, e.g. to try the scripts")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--time", help="SLURM time limit per job, e.g. 2-00:00:00")
    p.add_argument("--account", help="SLURM account")
    p.add_argument("--group", help="wandb group of the arms and the comparator (default: the pair folder's name)")
    p.add_argument("--command", default="divergence", help="how the jobs call divergence (default: divergence)")
    p.add_argument("--dry-run", action="store_true", help="print the scripts; write and submit nothing")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for both arms")
    return p


def run(args) -> int:
    from pathlib import Path

    from divergence.errors import UserInputError
    from divergence.launch.scripts import LaunchPlan
    from divergence.launch.submit import launch, render
    from divergence.recipe.pair import is_pair_recipe, load_pair_recipe

    for flag, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node),
                        ("--comparator-gpus", args.comparator_gpus)):
        if value < 1:
            raise UserInputError(f"{flag} {value}: must be >= 1")
    if not Path(args.recipe).is_file() or not is_pair_recipe(args.recipe):
        raise UserInputError(f"--recipe {args.recipe}: not a pair recipe file (recipes/pairs/NAME.yaml)")
    pair = load_pair_recipe(args.recipe, args.overrides)  # fail here, not in the jobs
    out = Path(args.out or Path("runs") / pair.name).resolve()
    plan = LaunchPlan(
        recipe=Path(args.recipe).resolve(), out=out, name=pair.name, scheduler=args.scheduler, nodes=args.nodes,
        gpus_per_node=args.gpus_per_node, accelerator="cpu" if args.cpu else "gpu", strategy=args.strategy,
        comparator_gpus=args.comparator_gpus, overrides=tuple(args.overrides), command=args.command,
        partition=args.partition, time=args.time, account=args.account, group=args.group,
    )
    if args.dry_run:
        print(render(plan))
        return 0
    return launch(plan)
