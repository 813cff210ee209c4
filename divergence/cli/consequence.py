"""``divergence consequence``: what an early dose does to the finished model, measured.

Phase 1 trains every pair run of a consequence recipe (``recipes/consequence.yaml``: a grad-noise
ladder, real rows, the seed and precision references, to convergence) like ``divergence calibrate``
(side by side, arms shared; finished runs are not trained again, interrupted ones resume). Phase 2
reads each pair run (``study.consequence_runs``): its early dose, each arm's sample score (scored
once into ``<pair run>/<arm>/score.json``, ``--jobs`` arms at a time) and its score and probe-loss
shifts. Phase 3 writes ``DIR/consequence.json`` (``analysis.consequence_curve``: the seed margin,
the threshold, the rank correlation and the sentence), ``DIR/consequence.png`` and prints the table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from divergence.cli import send_to_wandb
from divergence.cli.pair_runs import recipe_options, split_overrides, train
from divergence.errors import UserInputError
from divergence.tables import text_table, write_json


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "consequence",
        help="train pairs to convergence; does their early dose predict what the finished models draw?",
        description="Train a grad-noise ladder and real pairs beside the seed and precision references to "
        "convergence, with replicates; read each pair run's early dose (dex vs bf16-vs-fp32) and, at its last "
        "step, the sample score of both arms and the probe-loss shift; then write DIR/consequence.json (the "
        "seed margin, the dose below which the score stays within it, the rank correlation of early dose with "
        "the converged shift) and DIR/consequence.png. Run again on DIR to resume.",
    )
    recipe_options(
        p,
        "consequence",
        out="folder: OUT/<pair>/r<replicate> per pair run, consequence.json",
        max_steps=" (the run's length)",
        jobs="pairs trained, then arms scored, at once (default: the recipe's jobs)",
        overrides="overrides for every pair (train.lr=1e-4) or the recipe (doses=[1.0e-4,1.0e-2], early=[30,60], "
        "score.seeds=2, rows=[], references.precision=pairs/fp16-vs-fp32.yaml)",
        no_wandb="no wandb: the pair runs do not log to it (log.wandb=false), nor does the result",
    )
    return p


def run(args) -> int:
    from divergence.extras import require

    require("train", "lightning", "diffusers", "transformers")
    from divergence.study.lock import study_lock
    from divergence.study.runner import device_type, parallel_jobs

    device, out = device_type(), Path(args.out)
    consequence, jobs, pair_overrides = _plan(args, out, device)
    steps = min(j.max_steps for j in jobs)
    parallel = parallel_jobs(args.jobs, consequence.study.jobs, device, len(jobs))
    with study_lock(out):  # one study, calibration or consequence in a folder at a time
        print(
            f"consequence {consequence.study.name}: doses {', '.join(f'{d:g}' for d in consequence.doses)}, "
            f"{len({j.pair.name for j in jobs})} pairs, {consequence.study.replicates} replicate(s): {len(jobs)} "
            f"pair runs of {steps} steps, {parallel} at a time, into {out}"
        )
        started = time.monotonic()
        failed = train("consequence", jobs, pair_overrides, parallel, args)
        if failed is not None:
            return failed
        trained = sum(not j.skipped for j in jobs)
        print(
            f"trained {trained} pair run(s), {len(jobs) - trained} finished before ({time.monotonic() - started:.0f} s)"
        )
        result, figures = _measure(jobs, consequence, steps, device, parallel, quiet=args.quiet)
    print(table(result["runs"]))
    print(result["convergence"]["sentence"])
    print(result["sentence"])
    print(f"consequence: {', '.join(str(p) for p in (out / 'consequence.json', *figures.values()) if p)}")
    if not args.no_wandb:  # offline unless configured; trouble there is a warning: the files are written
        from divergence.report.wandb_log import log_consequence

        send_to_wandb(lambda: log_consequence(result, figures, out, None), "the files")
    return 0


def _plan(args, out, device: str):
    """``(consequence, jobs, pair overrides)``: the recipe read and every pair run's recipe checked, the
    early window within the run; nothing written yet (a mistake is one line, exit 2)."""
    from divergence.study.consequence import CONSEQUENCE_OVERRIDES, load_consequence
    from divergence.study.runner import plan_jobs

    overrides, pair_overrides = split_overrides(args, CONSEQUENCE_OVERRIDES)
    consequence = load_consequence(args.recipe, overrides, device)
    jobs = plan_jobs(consequence.study, out, pair_overrides)
    steps = min(j.max_steps for j in jobs)
    if consequence.early[1] > steps:
        raise UserInputError(
            f"{consequence.study.source}: early: {list(consequence.early)} reaches past train.max_steps {steps}; "
            "give early=[FIRST,LAST] within the run, or a longer run"
        )
    return consequence, jobs, pair_overrides


def _measure(jobs, consequence, steps: int, device: str, workers: int = 1, quiet: bool = False) -> tuple[dict, dict]:
    """Phases 2 and 3: score every arm (in ``workers`` processes) and read every pair run, then write
    consequence.json and the figures: ``(result, {"curve": png, "samples": png})``."""
    from divergence.analysis.consequence_curve import curve
    from divergence.analysis.plateau import plateau
    from divergence.analysis.plateau import sentence as plateau_sentence
    from divergence.report.consequence_figure import FILES, consequence_figure, samples_figure
    from divergence.study.consequence_runs import read_runs, sample_panels, score_all, score_tasks, seed_pair_series

    out = jobs[0].out.parent.parent
    started = time.monotonic()
    tasks = score_tasks(jobs, consequence)
    if tasks:
        print(f"scoring {len(tasks)} arm weights file(s), {min(workers, len(tasks))} at a time")
    score_all(tasks, workers, device, progress=(lambda line: None) if quiet else print)
    scored = sum(final for *_, final in tasks)
    rows, counts = read_runs(jobs, consequence, device)
    score_series, probe_series = seed_pair_series(jobs, consequence, device)
    converged = {"score": plateau(score_series), "probe": plateau(probe_series)}
    converged["sentence"] = plateau_sentence(converged["score"], converged["probe"], steps)
    print(
        f"scored {scored} arm(s), {counts['scored'] + counts['reused'] - scored} read back from score.json "
        f"({time.monotonic() - started:.0f} s)"
    )
    score = consequence.score
    result = {
        "recipe": consequence.study.name,
        "recipe_id": _recipe_id(jobs),
        "source": str(consequence.study.source),
        "steps": steps,
        "early": list(consequence.early),
        "doses": list(consequence.doses),
        "replicates": consequence.study.replicates,
        "score": {**score.as_dict(), "captions": len(score.captions), "attribute": score.attribute},
        "runs": rows,
        "convergence": converged,
        **curve(rows, consequence.study.name, steps),
    }
    write_json(out / "consequence.json", result)
    figures = {
        "curve": consequence_figure(result, out / FILES["consequence"]),
        "samples": samples_figure(sample_panels(rows, score, device), out / FILES["consequence_samples"]),
    }
    return result, figures


def _recipe_id(jobs) -> str:
    """The calibration's recipe identity of the pair runs (a study's report finds its curve by it)."""
    from divergence.analysis.calibration import recipe_identity
    from divergence.report.inputs import load_pair

    seed = next((j for j in jobs if j.pair.role == "seed"), jobs[0])
    return recipe_identity(load_pair(seed.out).recipe)["id"]


def table(rows: list[dict]) -> str:
    """One line per pair run: its early dose, both arms' scores, the score shift and the probe-loss shift."""

    def num(x, spec):
        return "-" if x is None else format(x, spec)

    lines = []
    for r in rows:
        s = r["score_shift"]
        interval = "" if s["lo"] is None else f" [{100 * s['lo']:+.1f}, {100 * s['hi']:+.1f}]"
        lines.append(
            {
                "pair": r["pair"],
                "role": r["reference"] or r["role"],
                "r": str(r["replicate"]),
                "early dex": num(r["early_dex"], "+.2f"),
                "score a": num(r["score_a"], ".3f"),
                "score b": num(r["score_b"], ".3f"),
                "shift (points)": f"{100 * s['value']:+.1f}{interval}",
                "probe shift": num(r["probe_shift"], "+.4f"),
            }
        )
    return text_table(lines, ["pair", "role", "r", "early dex", "score a", "score b", "shift (points)", "probe shift"])
