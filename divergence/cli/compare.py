"""``divergence compare A B``: per-layer divergence between two checkpoints.

Exit codes: 0 done, 1 a ``--fail-above`` threshold was exceeded (or a tensor holds NaN/inf
and ``--allow-nonfinite`` was not given), 2 bad input. Output paths are checked before the
comparison starts, so a typo in ``--json`` costs nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from divergence.cli import at_least
from divergence.errors import UserInputError
from divergence.tables import format_value, text_table, write_csv, write_json

METRIC_CHOICES = ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine")
RECORD_COLUMNS = (
    "name",
    "shape",
    "numel",
    "dtype_a",
    "dtype_b",
    *METRIC_CHOICES,
    "nonfinite_a",
    "nonfinite_b",
    "module",
    "kind",
)
EXIT_THRESHOLD = 1
_SHOW = 5


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="per-layer Wasserstein distance and max difference between two checkpoints",
        description="Compare two checkpoints tensor by tensor (safetensors, save_pretrained folders, "
        ".pt/.bin state dicts, Lightning .ckpt, torch.distributed.checkpoint folders). Pickles are loaded weights-only. Integer and bool "
        "buffers (num_batches_tracked, position_ids) are reported separately and left out of the "
        "whole-model numbers unless --include-buffers; complex tensors are compared on their real and "
        "imaginary parts, as 2n real numbers (their numel counts both).",
    )
    p.add_argument("a", help="first checkpoint (file or folder)")
    p.add_argument("b", help="second checkpoint (file or folder)")
    p.add_argument(
        "--group",
        choices=("tensor", "module", "kind", "model"),
        default="tensor",
        help="rows of the printed table (default: tensor)",
    )
    p.add_argument(
        "--sort", choices=METRIC_CHOICES, default="wasserstein", help="order rows by this metric, largest first"
    )
    p.add_argument("--top", type=int, default=20, metavar="N", help="rows to print (default 20; 0 for all)")
    p.add_argument(
        "--json", metavar="PATH", help='write {"tensors": [...], "summary": {...}, "skipped": [...]} to PATH'
    )
    p.add_argument("--csv", metavar="PATH", help="write the per-tensor records (buffers included) to PATH")
    p.add_argument(
        "--exclude",
        action="append",
        metavar="PATTERN",
        default=[],
        help="leave out tensors whose matched name contains a match of PATTERN, a Python regular "
        "expression (re.search, not a glob: --exclude 'ema\\.' --exclude '^text_encoder\\.'); repeatable",
    )
    p.add_argument(
        "--include-buffers", action="store_true", help="count integer and bool buffers in the whole-model numbers too"
    )
    p.add_argument(
        "--fail-above",
        action="append",
        metavar="METRIC=VALUE",
        default=[],
        help="exit 1 when the whole-model METRIC exceeds VALUE, or when any tensor holds NaN/inf (for CI); repeatable",
    )
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="with --fail-above, do not fail on tensors holding NaN/inf (they stay out of the numbers)",
    )
    reading_flags(p, None, "cuda if available, else cpu", "; list the rest as skipped")
    return p


def reading_flags(p, device: str | None, device_default: str, intersection: str = "") -> None:
    """The flags ``compare`` and ``track`` share: how the tensors are matched (``--map``,
    ``--intersection``), where compared (``--device``), which reader opens the checkpoints (``--format``,
    ``divergence.checkpoints.READERS``) and ``--quiet``."""
    from divergence.formats import AUTO, FORMATS, format_help

    p.add_argument(
        "--map",
        action="append",
        metavar="PATTERN=REPLACEMENT",
        default=[],
        help="rename tensors (regex, applied to both sides); repeatable",
    )
    p.add_argument(
        "--intersection", action="store_true", help="compare the tensors both checkpoints have" + intersection
    )
    p.add_argument("--device", default=device, help=f"where to compute (default: {device_default})")
    p.add_argument("--format", default=AUTO, choices=(AUTO, *FORMATS), help=format_help())
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    thresholds = _parse_thresholds(args.fail_above)
    at_least(0, ("--top", args.top), why=" (0: all rows)")
    _check_outputs(args)
    import torch
    from tqdm import tqdm

    device = _device(args.device, torch)
    progress = (
        None
        if args.quiet
        else (lambda items: tqdm(items, desc="comparing", unit="tensor", file=sys.stderr, leave=False, disable=None))
    )
    result = compare_with_flags(
        args.a, args.b, args.map, args.intersection, device, progress, args.exclude, args.include_buffers, args.format
    )
    _print_report(result, args)
    if args.json:
        write_json(args.json, {"tensors": result.records, "summary": result.summary, "skipped": result.skipped})
    if args.csv:
        write_csv(args.csv, result.records, RECORD_COLUMNS)
    return _check_thresholds(result, thresholds, args.allow_nonfinite)


def compare_with_flags(
    path_a,
    path_b,
    maps: list[str],
    intersection: bool,
    device,
    progress=None,
    exclude: list[str] | None = None,
    include_buffers: bool = False,
    format: str | None = None,
):
    """``divergence.compare_checkpoints`` as the commands run it: a mismatch or a bad rule is
    reported in the command's words (``--map``, ``--intersection``, ``--exclude``); ``format``
    forces a reader (``--format``)."""
    from divergence.checkpoints import match_tensors, open_checkpoint
    from divergence.checkpoints.compare import compare_sources, with_sources

    a, b = open_checkpoint(path_a, format), open_checkpoint(path_b, format)
    match = match_tensors(a, b, maps, intersection, exclude)
    return with_sources(compare_sources(a, b, match, device, progress, include_buffers), path_a, path_b, a, b)


def _device(name, torch):
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserInputError(f"--device {name!r}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    return device


def _parse_thresholds(items: list[str]) -> dict[str, float]:
    thresholds = {}
    for item in items:
        metric, _, value = item.partition("=")
        if metric not in METRIC_CHOICES:
            raise UserInputError(f"--fail-above {item!r}: metric must be one of {', '.join(METRIC_CHOICES)}")
        try:
            thresholds[metric] = float(value)
        except ValueError:
            raise UserInputError(f"--fail-above {item!r}: {value!r} is not a number") from None
        if thresholds[metric] != thresholds[metric]:
            raise UserInputError(f"--fail-above {item!r}: the threshold must be a number, not NaN")
    return thresholds


def _check_outputs(args) -> None:
    """Refuse --json/--csv paths that could not be written, before any tensor is read."""
    outputs = [(flag, value) for flag, value in (("--json", args.json), ("--csv", args.csv)) if value is not None]
    for flag, value in outputs:
        if not value.strip():
            raise UserInputError(
                f"{flag} {value!r}: an empty path; give a file name, e.g. {flag} out{flag.replace('--', '.')}"
            )
        path = Path(value)
        if path.is_dir():
            raise UserInputError(f"{flag} {path}: is a folder; give a file name inside it")
        if any(path.resolve() == Path(i).resolve() for i in (args.a, args.b)):
            raise UserInputError(f"{flag} {path}: is one of the checkpoints being compared; refusing to overwrite it")
        if not path.parent.is_dir():
            raise UserInputError(f"{path}: the folder {path.parent} does not exist")
        try:  # the writers rename a temporary file in this folder into place: prove that works
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe-"):
                pass
        except OSError as err:
            raise UserInputError(f"{flag} {path}: cannot write in {path.parent}: {err.strerror or err}") from None
        if path.exists() and not os.access(path, os.W_OK):
            raise UserInputError(f"{flag} {path}: exists and is read-only")
    if len(outputs) == 2 and Path(args.json).resolve() == Path(args.csv).resolve():
        raise UserInputError(f"--json and --csv both name {args.json}; give two different files")


def _print_report(result, args) -> None:
    from divergence.metrics import aggregate, is_buffer

    weights = result.records if args.include_buffers else [r for r in result.records if not is_buffer(r)]
    rows = aggregate(weights, args.group, args.include_buffers)
    for row in rows if args.group == "tensor" else ():
        if row.get("tied"):  # one tensor under several names, compared and counted once
            row["group"] += f" (tied: {', '.join(row['tied'])})"
    rows.sort(key=lambda r: _sort_key(r[args.sort]), reverse=True)
    shown = rows if args.top == 0 else rows[: args.top]
    columns = ["group", "numel", *METRIC_CHOICES] + (["kind"] if args.group == "tensor" else ["tensors"])
    print(f"{len(shown)} of {len(rows)} {args.group} rows, largest {args.sort} first")
    print(text_table(shown, columns))
    buffers = [r for r in result.records if is_buffer(r)]
    if buffers and not args.include_buffers:
        print(
            f"\n{len(buffers)} integer/bool buffers, compared but left out of the model numbers "
            "(--include-buffers counts them):"
        )
        print(
            text_table(
                [dict(r, group=r["name"]) for r in buffers[: max(args.top, 0) or None]],
                ["group", "numel", "max_abs_diff", "mean_abs_diff", "dtype_a", "dtype_b"],
            )
        )
    _print_summary(result)


def _print_summary(result) -> None:
    s = result.summary
    print()
    raw = " of the raw weights (the EMA under ema.* is summarized below, apart)" if "ema" in s else ""
    print(f"model: {s['tensors']} tensors, {s['numel']:,} values compared{raw}")
    tied = [f"{r['name']} = {', '.join(r['tied'])}" for r in result.records if r.get("tied")]
    if tied:
        print(f"  tied (one tensor, counted once): {'; '.join(tied[:_SHOW])}")
    if s.get("lora"):
        print(f"  {s['lora']}")
    for line in s.get("skipped_folders", ()):
        print(f"  {line}")
    for metric in METRIC_CHOICES:
        print(f"  {metric:<14} {format_value(s[metric])}")
    if "ema" in s:
        print(f"ema: {s['ema']['tensors']} EMA tensors (ema.*), {s['ema']['numel']:,} values compared")
        for metric in METRIC_CHOICES:
            print(f"  {metric:<14} {format_value(s['ema'][metric])}")
    for side in ("a", "b"):
        if s[f"stripped_prefix_{side}"]:
            print(f"  matched after stripping {s[f'stripped_prefix_{side}']!r} from {side.upper()}")
    if s["buffers"]:
        print(f"  left out: {s['buffers']} integer/bool buffers (listed above; --include-buffers counts them)")
    elif s["buffers_included"]:
        print("  integer/bool buffers are counted (--include-buffers)")
    if s["tensors_nonfinite"]:
        print(
            f"  warning: {s['tensors_nonfinite']} tensors hold NaN/inf (A: {s['nonfinite_a']} values, "
            f"B: {s['nonfinite_b']}); their metrics are NaN and left out of the model summary"
        )
    if result.skipped:
        print(
            f"  skipped {len(result.skipped)} tensors: "
            + ", ".join(f"{k['name']} ({k['reason']})" for k in result.skipped[:_SHOW])
        )


def _check_thresholds(result, thresholds: dict[str, float], allow_nonfinite: bool) -> int:
    summary = result.summary
    exceeded = [f"{m} = {summary[m]:.6g} > {v:g}" for m, v in thresholds.items() if not summary[m] <= v]
    if thresholds and not allow_nonfinite and summary["tensors_nonfinite"]:
        bad = [r["name"] for r in result.records if r["nonfinite_a"] or r["nonfinite_b"]]
        more = f", ... {len(bad) - _SHOW} more" if len(bad) > _SHOW else ""
        exceeded.append(
            f"{len(bad)} tensors hold NaN/inf ({', '.join(bad[:_SHOW])}{more}); "
            "--allow-nonfinite checks only the finite ones"
        )
    for line in exceeded:
        print(f"divergence compare: threshold exceeded: {line}", file=sys.stderr)
    return EXIT_THRESHOLD if exceeded else 0


def _sort_key(value) -> float:
    return float("-inf") if value is None or value != value else value
