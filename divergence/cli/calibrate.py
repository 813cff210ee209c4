"""``divergence calibrate``: train the known-dose ladder and its references, then check the statistic.

Trains every pair of a calibration recipe (``recipes/calibration.yaml``: ``grad-noise-<eps>`` pairs
for a ladder of doses, the seed and precision references) with replicates, like ``divergence
study`` (side by side, with progress; finished runs are not trained again, interrupted ones
resume), then writes ``DIR/calibration.json`` from
``divergence.analysis.calibration.evaluate(ladder, seed_pairs, horizons)``: each criterion of
docs/method.md ("Calibration: a known dose") as a value and pass/fail.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate",
        help="train the grad-noise dose ladder beside seed and precision pairs; check the statistic",
        description="Calibrate the dose-ratio statistic on known doses: train pairs whose arm a multiplies every "
        "gradient by (1 + eps * xi) for a ladder of eps, beside the seed and precision references, with "
        "replicates; then write DIR/calibration.json with each criterion (monotone, log-log slope, horizon "
        "stability, recovery, coverage, synthetic bounded / not bounded) as a value and pass/fail.",
    )
    p.add_argument("--recipe", default=None, help="calibration recipe (default: recipes/calibration.yaml)")
    p.add_argument("--out", required=True, help="folder: OUT/<pair>/r<replicate> per pair run, calibration.json")
    p.add_argument(
        "--max-steps",
        type=int,
        help="the same as train.max_steps=N, for every pair (horizons beyond it are clipped to it)",
    )
    p.add_argument("--replicates", type=int, help="replicates of every pair (default: the recipe's)")
    p.add_argument("--jobs", type=int, help="pairs trained at once (default: the recipe's jobs)")
    from divergence.cli import pair_runs_options

    pair_runs_options(
        p,
        no_wandb="no wandb: the pair runs do not log to it (log.wandb=false)",
        overrides="overrides for every pair (train.lr=1e-4) or the calibration (doses=[1.0e-6,1.0e-4,1.0e-2], "
        "horizons=[50,150], references.precision=pairs/fp16-vs-fp32.yaml)",
    )
    return p


def run(args) -> int:
    from pathlib import Path

    from divergence.extras import require

    require("train", "lightning", "diffusers", "transformers")
    from divergence.study.runner import device_type, parallel_jobs
    from divergence.cli import shorthand
    from divergence.errors import UserInputError
    from divergence.study import PairFailed, run_jobs
    from divergence.study.calibration import CALIBRATION_OVERRIDES, load_calibration
    from divergence.study.lock import study_lock
    from divergence.study.runner import plan_jobs, write_recipes

    for flag, value in (("--max-steps", args.max_steps), ("--replicates", args.replicates)):
        if value is not None and value < 1:
            raise UserInputError(f"{flag} {value}: must be >= 1")
    device = device_type()
    overrides = list(args.overrides)
    if args.replicates is not None:
        shorthand(overrides, "--replicates", "replicates", args.replicates)
    calibration = load_calibration(args.recipe or _default_recipe(), overrides, device)
    pair_overrides = [o for o in args.overrides if not o.startswith(CALIBRATION_OVERRIDES)]
    if args.max_steps is not None:
        shorthand(pair_overrides, "--max-steps", "train.max_steps", args.max_steps)
    if args.no_wandb:
        shorthand(pair_overrides, "--no-wandb", "log.wandb", "false")
    out = Path(args.out)
    jobs = plan_jobs(calibration.study, out, pair_overrides)  # every recipe checked; nothing written yet
    parallel = parallel_jobs(args.jobs, calibration.study.jobs, device, len(jobs))
    horizons = _horizons(calibration.horizons, min(j.max_steps for j in jobs))
    references = [p.name for p in calibration.study.pairs if p.role != "ladder"]
    with study_lock(out):  # one study or calibration in a folder at a time
        print(
            f"calibration {calibration.study.name}: doses {', '.join(f'{d:g}' for d in calibration.doses)}"
            f"{' beside ' + ', '.join(references) if references else ''}, {calibration.study.replicates} "
            f"replicate(s): {len(jobs)} pair runs, {parallel} at a time, into {out}"
        )
        write_recipes(jobs)
        try:
            run_jobs(jobs, pair_overrides, parallel, show_progress=not args.quiet, shared=not args.no_shared_arms)
        except PairFailed as err:
            print(f"divergence calibrate: error: {err}", file=sys.stderr)
            return 2 if err.exit_code == 2 else 1
        result = evaluate_ladder(jobs, calibration.doses, horizons)
        from divergence.tables import write_json

        write_json(out / "calibration.json", result)
    print(f"calibration: {out / 'calibration.json'}")
    return 0


def evaluate_ladder(jobs, doses, horizons: tuple[int, ...]) -> dict:
    """Read every trained run and hand the ladder and the seed pairs to the calibration analysis."""
    from divergence.analysis.calibration import evaluate
    from divergence.report.inputs import load_pair
    from divergence.study.calibration import LADDER_ROLE, ladder_name

    by_name = {ladder_name(eps): eps for eps in doses}
    ladder: dict[float, list] = {eps: [] for eps in doses}
    seed_pairs, references = [], {}
    for job in jobs:
        if job.pair.role == LADDER_ROLE:
            ladder[by_name[job.pair.name]].append(load_pair(job.out))
        elif job.pair.role == "seed":
            seed_pairs.append(load_pair(job.out))
        else:  # the precision reference: placed on the ladder (its equivalent dose)
            references.setdefault(job.pair.name, []).append(load_pair(job.out))
    return evaluate(ladder, seed_pairs, horizons=horizons, references=references)


def _horizons(horizons: tuple[int, ...], max_steps: int) -> tuple[int, ...]:
    kept = tuple(h for h in horizons if h <= max_steps)
    if len(kept) < len(horizons):
        kept = tuple(sorted(set(kept) | {max_steps}))
        print(f"note: horizons {list(horizons)} reach past train.max_steps {max_steps}; using {list(kept)}")
    return kept


def _default_recipe():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "recipes" / "calibration.yaml"
