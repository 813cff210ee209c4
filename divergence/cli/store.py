"""``divergence store repair DIR``: make an unreadable metrics store or loss file readable, losing nothing."""

from __future__ import annotations

import argparse

HELP = "repair a pair folder's metrics store and loss files (keeps every committed record)"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "store",
        help=HELP,
        description="Tools for a run folder's metrics store (DIR/metrics.jsonl) and loss files "
        "(DIR/<arm>/losses.jsonl).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True
    repair = actions.add_parser(
        "repair",
        help="keep every committed record; move unreadable lines aside",
        description="Keep every committed step block of DIR/metrics.jsonl and every readable line of DIR/<arm>/"
        "losses.jsonl; move the lines readers refuse (not a record, a duplicated step block, a tensor record "
        "of another step) byte for byte into FILE.unreadable-<UTC time> beside each file. Run it while no "
        "job writes to DIR.",
    )
    repair.add_argument("dir", help="a pair folder (holds metrics.jsonl, a/losses.jsonl, b/losses.jsonl)")
    return p


def run(args) -> int:
    from divergence.pairfolder.layout import METRICS_FILE
    from divergence.store.repair import repair_folder

    for result in repair_folder(args.dir):
        if not result.moved:
            print(f"{result.path}: nothing to repair ({result.kept} lines, every one readable)")
            continue
        what = f"{result.committed} committed steps" if result.path.name == METRICS_FILE else f"{result.kept} lines"
        print(f"{result.path}: kept {what}; moved {len(result.moved)} lines to {result.side_file}")
        for number, reason in result.moved:
            print(f"  line {number}: {reason}")
    return 0
