"""``divergence export DIR --csv PATH [--parquet PATH]``: the metrics store, flat."""

from __future__ import annotations

import argparse

from divergence.errors import UserInputError
from divergence.store import MetricsStore


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export",
        help="write a run's metrics store as one row per (step, tensor)",
        description="Export DIR/metrics.jsonl as CSV and/or Parquet, one row per (step, tensor).",
    )
    p.add_argument("dir", metavar="DIR", help="a paired-training run folder (holds metrics.jsonl)")
    p.add_argument("--csv", metavar="PATH", help="write CSV here")
    p.add_argument("--parquet", metavar="PATH", help="write Parquet here")
    return p


def run(args) -> int:
    from divergence.store.export import export_csv, export_parquet

    if not (args.csv or args.parquet):
        raise UserInputError("nothing to write: give --csv PATH and/or --parquet PATH")
    if args.parquet:
        from divergence.extras import require

        require("parquet", "pyarrow")
    store = MetricsStore(args.dir)
    store.steps()  # a clear error when DIR holds no store
    for path, writer in ((args.csv, export_csv), (args.parquet, export_parquet)):
        if path:
            rows = writer(store, path)
            print(f"wrote {rows} rows to {path}")
    return 0
