"""``divergence study``: train the pair under study and its reference pairs, then report the bound."""

from __future__ import annotations

import argparse
from pathlib import Path

from divergence.cli.pair_runs import recipe_options, split_overrides, train
from divergence.cli.report import log_report_to_wandb, print_report


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "study",
        help="train the pair under study beside seed, precision and control pairs, then report",
        description="Run a bounding study: the pair under study (flash vs baseline by default) beside a seed "
        "change, low-precision training and a control, on one base recipe; then build the report. Finished "
        "pairs are not trained again; an interrupted study resumes.",
    )
    recipe_options(
        p,
        "study",
        out="study folder: OUT/<pair>/r<replicate> per pair run, the report at its top",
        replicates="replicates of every pair but the control (default: the recipe's replicates)",
        jobs="pairs trained at once (default: the recipe's jobs; auto = 2 on a CPU with 2+ cores, 1 on a GPU)",
        overrides="overrides for every pair (train.lr=1e-4) or the study (base=sd15.yaml, "
        "study=pairs/fused-adamw.yaml, references.precision=pairs/fp16-vs-fp32.yaml, replicates=5)",
        no_wandb="no wandb: neither the pair runs nor the report log to it",
    )
    return p


def run(args) -> int:
    from divergence.extras import require

    require("train", "lightning", "diffusers", "transformers")
    require("report", "matplotlib", "scipy")
    from divergence.report import build_report
    from divergence.study import load_study
    from divergence.study.config import STUDY_OVERRIDES, fine_tuned
    from divergence.study.lock import study_lock
    from divergence.study.pretrain import ensure_pretrained
    from divergence.study.runner import device_type, parallel_jobs, plan_jobs

    device = device_type()
    study_overrides, pair_overrides = split_overrides(args, STUDY_OVERRIDES)
    study = load_study(args.recipe, study_overrides, device)
    out = Path(args.out)
    study = fine_tuned(study, out)  # with pretrain: every pair starts from OUT/pretrained
    jobs = plan_jobs(study, out, pair_overrides)  # every recipe checked; nothing written yet
    parallel = parallel_jobs(args.jobs, study.jobs, device, len(jobs))
    names = list(dict.fromkeys(j.pair.name for j in jobs))
    with study_lock(out):  # one study in a folder at a time
        print(
            f"study {study.name}: {len(names)} pairs ({', '.join(names)}), {study.replicates} replicate(s) "
            f"(the control once): {len(jobs)} pair runs, {parallel} at a time, into {out}"
        )
        for name, note in dict.fromkeys((j.pair.name, j.pair.note) for j in jobs if j.pair.note):  # once per pair
            print(f"note: {name}: {note}")
        if study.pretrain is not None:
            ensure_pretrained(study.base, study.pretrain, out, quiet=args.quiet, runs=[j.out for j in jobs])
        failed = train("study", jobs, pair_overrides, parallel, args)
        if failed is not None:
            return failed
        report = build_report([job.out for job in jobs], out)  # this study's runs: OUT/<pair>/r<replicate>
    print_report(report)
    if not args.no_wandb:
        log_report_to_wandb(report, None)
    return 0
