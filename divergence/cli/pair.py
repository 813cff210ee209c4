"""``divergence pair DIR KEY=VALUE ...``: name a pair folder after the fact.

The keys are ``pair.json``'s identity (``docs/pair-folder.md``): ``name`` (what every verdict
calls the pair), ``category`` (its role in the verdict: ``control`` identical arms, ``seed``
only the seed, ``precision`` only the training precision, ``reordering`` only the order of fp32
sums (the reordering yardstick), ``optimization`` anything else, the pair under study),
``description`` (one line, the name's longer form), ``arms.a`` / ``arms.b`` (the arm's labels,
comma-separated: ``arms.a=attention=flash``; a description that was only the arms' labels
follows them). Nothing else in the folder changes. Refused while
a writer holds an arm (its ``writer.lock``): the arms' writers check ``pair.json`` when they
start, so it changes between runs, not under one.

``divergence pair set DIR KEY=VALUE ...``, its first spelling (``set`` its one action), still works
and says the new one once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from divergence.cli import plain
from divergence.errors import UserInputError
from divergence.pairfolder.layout import PAIR_FILE
from divergence.pairfolder.pair_json import CATEGORIES, PairInfo, arms_line

HELP = "set a pair folder's name, category, description or arm labels (pair.json) after the fact"
KEYS = ("name", "category", "description", "arms.a", "arms.b")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("pair", help=HELP, description=HELP + ". " + plain(__doc__.split("\n\n")[1]))
    p.add_argument("dir", metavar="DIR", help="the pair folder (holds pair.json)")
    p.add_argument("values", nargs="+", metavar="KEY=VALUE", help=f"keys: {', '.join(KEYS)}")
    return p


def parse_values(values: list[str]) -> dict:
    """``KEY=VALUE`` words as ``{key: value}``, each key known and given once, each value checked."""
    from divergence.recipe.names import check_name

    out = {}
    for word in values:
        key, sep, value = word.partition("=")
        if not sep or key not in KEYS:
            raise UserInputError(f"{word!r}: give KEY=VALUE with KEY one of {', '.join(KEYS)}")
        if key in out:
            raise UserInputError(f"{key}: given twice")
        if key == "name":
            check_name(value, "name", "pair name", "the pair in every verdict and report")
        elif key == "category" and value not in CATEGORIES:
            raise UserInputError(f"category={value!r}: must be one of {', '.join(CATEGORIES)}")
        elif key.startswith("arms.") and not [v for v in value.split(",") if v.strip()]:
            raise UserInputError(f"{key}={value!r}: give the arm's labels, comma-separated (arms.a=attention=flash)")
        out[key] = value
    return out


def _old_spelling(args) -> None:
    """``pair set DIR KEY=VALUE``: the first word ``set`` and a folder after it, not a KEY=VALUE."""
    if args.dir == "set" and "=" not in args.values[0]:
        print("divergence pair: note: 'divergence pair set DIR' is now 'divergence pair DIR'", file=sys.stderr)
        args.dir, args.values = args.values[0], args.values[1:]
        if not args.values:
            from divergence.errors import UserInputError

            raise UserInputError(f"{args.dir}: give KEY=VALUE with KEY one of {', '.join(KEYS)}")


def run(args) -> int:
    from divergence.pairfolder.arm.lock import PairLock

    _old_spelling(args)
    changes = parse_values(args.values)
    PairInfo.read(args.dir)  # a one-line error when missing or unreadable (before the lock creates anything)
    with PairLock(args.dir):  # no writer of the pair may start (or be running) while pair.json changes
        info = PairInfo.read(args.dir)
        derived = info.description == arms_line(info.arms)  # the writers' default: the arms' labels
        for key, value in changes.items():
            if key.startswith("arms."):
                info.arms = {**info.arms, key[5:]: [v.strip() for v in value.split(",") if v.strip()]}
            else:
                setattr(info, key, value)
        if derived and "description" not in changes:
            info.description = arms_line(info.arms)
        info.write(args.dir)
    shown = ", ".join(f"{k}={v}" for k, v in changes.items())
    print(f"{Path(args.dir) / PAIR_FILE}: {shown}; next: divergence report {args.dir}")
    return 0
