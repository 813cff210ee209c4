"""``divergence atlas``: every optimization's pair beside the references, on one scale, with what it buys."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from divergence.atlas.looks import FIRST_REPLICATES
from divergence.cli import at_least
from divergence.cli.pair_runs import pair_runs_options
from divergence.errors import UserInputError


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "atlas",
        help="train every optimization's pair with the references; write atlas.json/.md/.html and a figure",
        description="The deviation atlas: each optimization (fp8, int8, compile, accumulation, threads, flash, "
        "checkpointing, fused AdamW, TF32, memory-efficient SDPA, ...) studied as `divergence study` studies one, "
        "on the tiny UNet and the tiny DiT (--backbone moe: the tiny MoE DiT's rows; --backbone all: all three), "
        "the references trained once per backbone; then its dose ratio against "
        "low precision beside its step time and peak memory. Finished pairs are not trained again.",
    )
    p.add_argument(
        "--out",
        required=True,
        help="atlas folder: OUT/<backbone>/<pair>/r<replicate>, the reports in "
        "OUT/<backbone>/reports/<optimization>, atlas.json/.md/.html and atlas.png at its top",
    )
    p.add_argument("--only", nargs="+", metavar="NAME", help="these optimizations only (default: all)")
    p.add_argument(
        "--backbone",
        help="unet, dit, moe (the MoE atlas) or all (default: unet and dit, the dense backbones)",
    )
    p.add_argument(
        "--replicates",
        type=int,
        help="replicates of every pair but the control (default: the study recipe's, 6); a row the first look "
        "decides stops at the first look's",
    )
    p.add_argument(
        "--first-replicates",
        type=int,
        default=FIRST_REPLICATES,
        metavar="K",
        help="the first look: every pair trains K replicates; a row they leave undecided trains --replicates "
        "where that many would decide it, with the references (default: %(default)s; K >= --replicates: one look)",
    )
    p.add_argument("--jobs", type=int, help="pairs trained at once (default: 2 on a CPU with 2+ cores, 1 on a GPU)")
    p.add_argument(
        "--calibration",
        help="calibration.json (divergence calibrate) for the equivalent gradient-noise "
        "dose (default: OUT/calibration.json when present)",
    )
    pair_runs_options(
        p,
        "overrides for every pair (train.max_steps=10) or the study (replicates=3, "
        "references.precision=pairs/fp16-vs-fp32.yaml)",
    )
    return p


def run(args) -> int:
    from divergence.atlas.catalog import backbones, check_rows, select
    from divergence.extras import require

    if args.only:  # `--only flash train.max_steps=60`: KEY=VALUE after the names are overrides, not names
        _split_only(args)
    optimizations, chosen = select(args.only), backbones(args.backbone)  # bad names: one line, before any import
    if args.only:
        check_rows(optimizations, chosen)
    at_least(1, ("--replicates", args.replicates))
    at_least(2, ("--first-replicates", args.first_replicates), why=" (one replicate has no interval to decide on)")
    calibration = Path(args.calibration) if args.calibration else None
    if calibration is not None:
        _check_calibration(calibration)
    require("train", "lightning", "diffusers", "transformers")
    require("report", "matplotlib", "scipy")
    from divergence.atlas.runner import run_atlas
    from divergence.study import PairFailed

    overrides = [
        *args.overrides,
        *([f"replicates={args.replicates}"] if args.replicates is not None else []),
        *(["log.wandb=false"] if args.no_wandb else []),
    ]
    try:
        atlas = run_atlas(
            Path(args.out),
            optimizations,
            chosen,
            overrides,
            jobs=args.jobs,
            calibration=calibration,
            quiet=args.quiet,
            first_replicates=args.first_replicates,
            command=" ".join(["divergence", "atlas", *sys.argv[2:]]),
            shared=not args.no_shared_arms,
        )
    except PairFailed as err:
        print(f"divergence atlas: error: {err}", file=sys.stderr)
        return 2 if err.exit_code == 2 else 1
    for row in atlas["rows"]:
        print(_line(row))
    print(f"atlas: {Path(args.out) / 'atlas.md'}, atlas.json, atlas.html, atlas.png")
    return 0


def _split_only(args) -> None:
    """``--only``'s names, and the KEY=VALUE overrides its list swallowed (``nargs="+"``) moved to the
    overrides; ``--only`` with overrides and no name is one line (it would train every row)."""
    names = [o for o in args.only if "=" not in o]
    if not names:
        raise UserInputError(
            f"--only {' '.join(args.only)}: names no optimization; name the rows, then the overrides "
            "(--only flash train.max_steps=2), or leave --only out for every row"
        )
    args.overrides = [*[o for o in args.only if "=" in o], *args.overrides]
    args.only = names


def _check_calibration(path) -> None:
    """``--calibration``: a file, said in one line when it is missing or a folder."""
    if path.is_dir():
        inside = path / "calibration.json"
        hint = f" (give {inside})" if inside.is_file() else ""
        raise UserInputError(
            f"--calibration {path}: a folder; expected the calibration.json that divergence calibrate "
            f"writes in its --out folder{hint}"
        )
    if not path.is_file():
        raise UserInputError(f"--calibration {path}: no such file; write one with divergence calibrate")


def _line(row: dict) -> str:
    from divergence.atlas.render import cells

    c = cells(row)
    if row["status"] == "unavailable":
        return f"{c[0]:<24} {c[1]:<5} {c[-1]}"
    return (
        f"{c[0]:<24} {c[1]:<5} dose {c[3]} {c[4]}, outcome {c[6]}, decide: {c[7]}, time a/b {c[8]}, memory a/b {c[9]}"
    )
