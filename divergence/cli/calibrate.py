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
from pathlib import Path

from divergence.cli.pair_runs import recipe_options, split_overrides, train
from divergence.tables import write_json


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate",
        help="train the grad-noise dose ladder beside seed and precision pairs; check the statistic",
        description="Calibrate the dose-ratio statistic on known doses: train pairs whose arm a multiplies every "
        "gradient by (1 + eps * xi) for a ladder of eps, beside the seed and precision references, with "
        "replicates; then write DIR/calibration.json with each criterion (monotone, log-log slope, horizon "
        "stability, recovery, coverage, synthetic bounded / not bounded) as a value and pass/fail.",
    )
    recipe_options(
        p,
        "calibration",
        out="folder: OUT/<pair>/r<replicate> per pair run, calibration.json",
        max_steps=" (horizons beyond it are clipped to it)",
        jobs="pairs trained at once (default: the recipe's jobs)",
        overrides="overrides for every pair (train.lr=1e-4) or the calibration (doses=[1.0e-6,1.0e-4,1.0e-2], "
        "horizons=[50,150], references.precision=pairs/fp16-vs-fp32.yaml)",
    )
    return p


def run(args) -> int:
    from divergence.extras import require

    require("train", "lightning", "diffusers", "transformers")
    from divergence.study.calibration import CALIBRATION_OVERRIDES, load_calibration
    from divergence.study.lock import study_lock
    from divergence.study.runner import device_type, parallel_jobs, plan_jobs

    device = device_type()
    overrides, pair_overrides = split_overrides(args, CALIBRATION_OVERRIDES)
    calibration = load_calibration(args.recipe, overrides, device)
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
        failed = train("calibrate", jobs, pair_overrides, parallel, args)
        if failed is not None:
            return failed
        result = evaluate_ladder(jobs, calibration.doses, horizons)
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
