"""``divergence compare A B``: per-layer divergence between two checkpoints.

Exit codes: 0 done, 1 a ``--fail-above`` threshold was exceeded, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys

from divergence.errors import UserInputError

METRIC_CHOICES = ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine")
RECORD_COLUMNS = (
    "name", "shape", "numel", "dtype_a", "dtype_b", *METRIC_CHOICES, "nonfinite_a", "nonfinite_b", "module", "kind",
)
EXIT_THRESHOLD = 1


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="per-layer Wasserstein distance and max difference between two checkpoints",
        description="Compare two checkpoints tensor by tensor (safetensors, save_pretrained folders, "
        ".pt/.bin state dicts, Lightning .ckpt). Pickles are loaded weights-only.",
    )
    p.add_argument("a", help="first checkpoint (file or folder)")
    p.add_argument("b", help="second checkpoint (file or folder)")
    p.add_argument("--group", choices=("tensor", "module", "kind", "model"), default="tensor",
                   help="rows of the printed table (default: tensor)")
    p.add_argument("--sort", choices=METRIC_CHOICES, default="wasserstein", help="order rows by this metric, largest first")
    p.add_argument("--top", type=int, default=20, metavar="N", help="rows to print (default 20; 0 for all)")
    p.add_argument("--json", metavar="PATH", help='write {"tensors": [...], "summary": {...}} to PATH')
    p.add_argument("--csv", metavar="PATH", help="write the per-tensor records to PATH")
    p.add_argument("--map", action="append", metavar="PATTERN=REPLACEMENT", default=[],
                   help="rename tensors (regex, applied to both sides); repeatable")
    p.add_argument("--intersection", action="store_true",
                   help="compare the tensors both checkpoints have; list the rest as skipped")
    p.add_argument("--fail-above", action="append", metavar="METRIC=VALUE", default=[],
                   help="exit 1 when the whole-model METRIC exceeds VALUE (for CI); repeatable")
    p.add_argument("--device", default=None, help="where to compute (default: cuda if available, else cpu)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run(args) -> int:
    thresholds = _parse_thresholds(args.fail_above)
    if args.top < 0:
        raise UserInputError(f"--top {args.top}: must be 0 (all) or a positive number of rows")
    import torch
    from tqdm import tqdm

    from divergence.comparison import compare_checkpoints

    device = _device(args.device, torch)
    progress = None if args.quiet else (lambda items: tqdm(items, desc="comparing", unit="tensor", file=sys.stderr, leave=False, disable=None))
    result = compare_checkpoints(args.a, args.b, args.map, args.intersection, device, progress)
    _print_report(result, args)
    _write_outputs(result, args)
    return _check_thresholds(result.summary, thresholds)


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
    return thresholds


def _print_report(result, args) -> None:
    from divergence.metrics import aggregate
    from divergence.tables import text_table

    rows = aggregate(result.records, args.group)
    rows.sort(key=lambda r: _sort_key(r[args.sort]), reverse=True)
    shown = rows if args.top == 0 else rows[: args.top]
    columns = ["group", "numel", *METRIC_CHOICES] + (["kind"] if args.group == "tensor" else ["tensors"])
    print(f"{len(shown)} of {len(rows)} {args.group} rows, largest {args.sort} first")
    print(text_table(shown, columns))
    _print_summary(result)


def _print_summary(result) -> None:
    from divergence.tables import format_value

    s = result.summary
    print()
    print(f"model: {s['matched']} tensors, {s['numel']:,} values compared")
    for metric in METRIC_CHOICES:
        print(f"  {metric:<14} {format_value(s[metric])}")
    for side in ("a", "b"):
        if s[f"stripped_prefix_{side}"]:
            print(f"  matched after stripping {s[f'stripped_prefix_{side}']!r} from {side.upper()}")
    if s["tensors_nonfinite"]:
        print(f"  warning: {s['tensors_nonfinite']} tensors hold NaN/inf (A: {s['nonfinite_a']} values, "
              f"B: {s['nonfinite_b']}); their metrics are NaN and left out of the model summary")
    if result.skipped:
        print(f"  skipped {len(result.skipped)} tensors (--intersection): "
              + ", ".join(f"{k['name']} ({k['reason']})" for k in result.skipped[:5]))


def _write_outputs(result, args) -> None:
    from divergence.tables import write_csv, write_json

    if args.json:
        write_json(args.json, {"tensors": result.records, "summary": result.summary, "skipped": result.skipped})
    if args.csv:
        write_csv(args.csv, result.records, RECORD_COLUMNS)


def _check_thresholds(summary: dict, thresholds: dict[str, float]) -> int:
    exceeded = [f"{m} = {summary[m]:.6g} > {v:g}" for m, v in thresholds.items() if not summary[m] <= v]
    for line in exceeded:
        print(f"divergence compare: threshold exceeded: {line}", file=sys.stderr)
    return EXIT_THRESHOLD if exceeded else 0


def _sort_key(value) -> float:
    return float("-inf") if value is None or value != value else value
