"""``divergence report DIR... [--out DIR]``: the bounding verdict and its report from pair runs.

Each DIR is a pair run folder (``pair.json`` + ``metrics.jsonl``) or a folder whose subfolders
are, such as a study folder; runs trained elsewhere and copied in work the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from divergence.cli import at_least, send_to_wandb
from divergence.errors import UserInputError


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="the bounding verdict and its report (HTML, Markdown, JSON, figures) from pair runs",
        description="Analyse pair runs (replicates grouped by pair name): the dose ratio of each pair under study "
        "against the low-precision pair, log10(E_X/E_P) over the unsaturated window pooled over replicates, the "
        "outcome against the seed pair's spread, and the verdict. Writes report.html, report.md, summary.json and "
        "figures/ into --out, and logs them to wandb (offline unless wandb is configured).",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="a pair run folder, or a folder of them (a study)")
    p.add_argument("--out", metavar="DIR", help="where to write the report (default: DIR when one is given)")
    p.add_argument("--no-wandb", action="store_true", help="do not log the report to wandb")
    p.add_argument("--wandb-project", metavar="NAME", help="wandb project (default: $WANDB_PROJECT or divergence)")
    for gone in ("--bootstrap", "--seed"):  # the legacy slope ratio's draws: accepted, said gone, ignored
        p.add_argument(gone, type=int, metavar="N", help=argparse.SUPPRESS)
    p.add_argument(
        "--min-steps",
        type=int,
        default=5,
        metavar="N",
        help="tracked steps the unsaturated window must hold in a replicate (default 5)",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="calibration.json from divergence calibrate, to state equivalent gradient-noise doses "
        "(default: a calibration.json next to the inputs)",
    )
    p.add_argument(
        "--consequence",
        metavar="FILE",
        help="consequence.json from divergence consequence, to say what each dose predicts for the finished "
        "model on that recipe (default: a consequence.json next to the inputs)",
    )
    return p


def run(args) -> int:
    from divergence.extras import require

    require("report", "matplotlib", "scipy")
    if not args.out and len(args.dirs) > 1:
        raise UserInputError(f"{len(args.dirs)} input folders given: say where the report goes with --out DIR")
    out = Path(args.out or args.dirs[0])
    for flag, value in (("--bootstrap", args.bootstrap), ("--seed", args.seed)):
        if value is not None:
            print(f"note: {flag} is gone with the legacy slope ratio it drew; ignored", file=sys.stderr)
    at_least(3, ("--min-steps", args.min_steps), why=" (a window needs at least 3 steps for a local rate)")
    from divergence.report import build_report

    report = build_report(
        args.dirs, out, min_steps=args.min_steps, calibration=args.calibration, consequence=args.consequence
    )
    print_report(report)
    if not args.no_wandb:
        log_report_to_wandb(report, args.wandb_project)
    return 0


def print_report(report) -> None:
    from divergence.report.content import notes

    for v in report.analysis.verdicts:
        print(v.headline)
        for note in notes(v):
            print(f"  - {note}")
    if not report.analysis.verdicts:
        print("No verdict: no pair under study (category optimization) among the inputs.")
    for warning in report.analysis.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"report: {report.out / 'report.html'} (also report.md, summary.json, figures/)")


def log_report_to_wandb(report, project: str | None) -> None:
    from divergence.report.wandb_log import log_report

    folders = [p.folder for p in report.analysis.pairs if getattr(p, "folder", None)]
    where = send_to_wandb(
        lambda: log_report(report.summary, report.figures, report.files, report.out, project, folders),
        "the report files",
    )
    if where is not None:
        report.wandb = where
