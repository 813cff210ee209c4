"""``divergence repair DIR``: make an unreadable metrics store or loss file readable, losing nothing.

``divergence store repair DIR``, its first spelling (a group of this one action), still works, hidden
from ``--help``, and says the new one once.
"""

from __future__ import annotations

import argparse
import sys

from divergence.pairfolder.layout import METRICS_FILE

HELP = "repair a pair folder's metrics store and loss files (keeps every committed record)"
DESCRIPTION = (
    "Keep every committed step block of DIR/metrics.jsonl and every readable line of DIR/<arm>/losses.jsonl; move "
    "the lines readers refuse (not a record, a duplicated step block, a tensor record of another step) byte for byte "
    "into FILE.unreadable-<UTC time> beside each file. Run it while no job writes to DIR."
)
DIR_HELP = "a pair folder (holds metrics.jsonl, a/losses.jsonl, b/losses.jsonl)"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("repair", help=HELP, description=HELP + ". " + DESCRIPTION)
    p.add_argument("dir", metavar="DIR", help=DIR_HELP)
    old = subparsers.add_parser("store", description=DESCRIPTION)  # no help=: not listed by --help
    actions = old.add_subparsers(dest="action", metavar="ACTION", parser_class=type(old))
    actions.required = True
    actions.add_parser("repair", description=DESCRIPTION).add_argument("dir", help=DIR_HELP)
    old.set_defaults(_run=_run_old)
    return p


def _run_old(args) -> int:
    print("divergence store: note: 'divergence store repair DIR' is now 'divergence repair DIR'", file=sys.stderr)
    return run(args)


def run(args) -> int:
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
