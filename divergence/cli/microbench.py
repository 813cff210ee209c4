"""``divergence microbench``: the attention numerics microbenchmark (the paper's Figures 3-6).

Runs baseline attention, the FlashAttention re-implementation and real kernels on the same
seeded inputs in every number format, scores each against the fp64 golden value and the
baseline, and writes ``results.csv``, ``validation.csv``, the figures, ``summary.md``,
``index.html`` and the resolved ``recipe.yaml`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from divergence.cli import plain
from divergence.errors import UserInputError
from divergence.pairfolder.folder import RunFolder


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "microbench",
        help="attention numerics microbenchmark: flash vs baseline vs fp64 golden (paper Figs. 3-6)",
        description=plain(__doc__.split("\n\n")[1]),
    )
    p.add_argument("--recipe", help="microbench recipe YAML (default: the built-in one, as recipes/microbench.yaml)")
    p.add_argument("--precision", nargs="+", metavar="P", help="number formats: bf16 fp16 fp32 fp64")
    p.add_argument(
        "--seq-len",
        nargs="+",
        type=int,
        metavar="L",
        help="sequence lengths; the reference length becomes the largest unless it is among them",
    )
    p.add_argument(
        "--block-size",
        nargs="+",
        metavar="N|BRxBC",
        help="explicit tiles (N means Br = Bc = N); the first is the reference tile",
    )
    p.add_argument(
        "--impl",
        nargs="+",
        metavar="NAME",
        help="baseline, flash (the re-implementation), flash-unbiased (it with Qiu and Yao's row-maximum "
        "change), sdpa, sdpa-flash, sdpa-math, sdpa-efficient, sdpa-cudnn, flash-attn, or your own kernel "
        "as module:function, called f(q, k, v, *, scale, causal) -> out on (B, H, L, D) tensors in the "
        "format under test (docs/bias.md)",
    )
    p.add_argument(
        "--accumulate",
        nargs="+",
        metavar="MODE",
        help="flash accumulation: none (all in the input format, the paper's) and/or fp32 (kernel-faithful)",
    )
    p.add_argument(
        "--input-dist",
        nargs="+",
        metavar="SPEC",
        help="distributions of the input-scale study: normal:STD (N(0, STD^2)), uniform:LOW:HIGH, or "
        "ties[:STD[:KEYS]] (repeated keys: ties at the row maximum), or lowrank[:STD[:NOISE]] (similar "
        "rows: one shared row plus noise), e.g. normal:0.25 uniform:0:1 ties lowrank",
    )
    p.add_argument("--device", help="cpu or cuda")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any recipe key, e.g. --set inputs.heads=4 (repeatable)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny sweep of seconds (tests, smoke runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", required=True, help="output folder (created)")
    return p


def _overrides(args) -> list[str]:
    """Command-line flags as recipe overrides (JSON values: YAML reads them); --set comes last and wins."""
    out = []
    flags = (
        ("precision", "sweep.precisions"),
        ("seq_len", "sweep.seq_lens"),
        ("block_size", "tiles.block_sizes"),
        ("impl", "sweep.impls"),
        ("accumulate", "sweep.accumulate"),
        ("input_dist", "inputs.scales"),
    )
    for attr, key in flags:
        values = getattr(args, attr)
        if values:
            out.append(f"{key}={json.dumps(values)}")
    if args.device:
        out.append(f"sweep.device={json.dumps(args.device)}")
    return out + list(args.set)


def run(args) -> int:
    import time

    import yaml

    from divergence.extras import require

    require("report", "matplotlib")  # the figures
    from divergence.config.schema import to_dict
    from divergence.microbench.config import load_recipe, reference_seq_len_override
    from divergence.microbench.figures import write_figures
    from divergence.microbench.report import write_reports
    from divergence.microbench.sweep import COLUMNS, check_kernels, plan, run_sweep
    from divergence.microbench.validation import COLUMNS as VALIDATION_COLUMNS
    from divergence.tables import write_csv

    # The reference-length fix first, so that an explicit --set sweep.reference_seq_len wins.
    overrides = reference_seq_len_override(args.recipe, args.seq_len, args.quick) + _overrides(args)
    recipe = load_recipe(args.recipe, overrides, quick=args.quick)
    check_kernels(recipe)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    # a run folder's resolved recipe, as train's
    RunFolder(out).recipe.write_text(yaml.safe_dump(to_dict(recipe), sort_keys=False))

    cases, notes = plan(recipe)
    start = time.perf_counter()
    rows, checks = run_sweep(recipe, cases, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    write_csv(out / "results.csv", rows, COLUMNS)
    write_csv(out / "validation.csv", checks, VALIDATION_COLUMNS)
    figures = write_figures(rows, recipe, out)
    md, page = write_reports(out, rows, checks, recipe, figures, notes, seconds)
    print(f"{len(rows)} runs in {seconds:.0f} s; wrote {out / 'results.csv'}, {len(figures)} figures, {md}, {page}")
    return 0
