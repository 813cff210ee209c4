"""How to start an arm of a pair folder, told the way its arms were started.

The folder says which trainer wrote it: the built-in trainer leaves its resolved recipe
(``pair.yaml``, and ``pair.json``'s ``recipe``); any other writer (``ArmWriter`` in a plain
loop, the Lightning callbacks ``ArmCheckpoints`` / ``LockstepPair``, the transformers
``ArmWriterCallback``) leaves ``recipe`` empty. Advice that names ``divergence train`` to a
person whose arms are their own script points the wrong way, so it is given only where the
folder shows the built-in trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

from divergence.pairfolder.folder import as_pair_folder

# the writers of one arm each (LockstepPair trains both arms in one process: never one missing)
OWN_WRITERS = "divergence.ArmWriter, Lightning's ArmCheckpoints or transformers' ArmWriterCallback"


def started_by_builtin(out: str | Path) -> bool | None:
    """True: the built-in trainer started this pair; False: another writer did; None: nothing
    started it yet (no ``pair.json``, no ``pair.yaml``) or ``pair.json`` is unreadable."""
    folder = as_pair_folder(out)
    if folder.pair_yaml.is_file():
        return True
    try:
        info = json.loads(folder.pair_json.read_text())
    except (OSError, ValueError):
        return None
    return bool(info.get("recipe")) if isinstance(info, dict) else None


def how_to_start(out: str | Path, arm: str) -> str:
    """The words that start ``arm`` of pair folder ``out`` (both arms, when nothing started it):
    ``run arm b's training script, whose writer (...) writes into OUT as arm 'b'`` for a pair of
    one's own writers, ``divergence train --recipe PAIR --arm b --out OUT`` for the built-in trainer."""
    builtin = started_by_builtin(out)
    command = f"divergence train --recipe PAIR --arm {arm} --out {out}"
    if builtin:
        return f"{command} (PAIR: the pair recipe arm a was started with)"
    if builtin is False:
        return f"run arm {arm}'s training script, whose writer ({OWN_WRITERS}) writes into {out} as arm {arm!r}"
    return (
        f"run each arm's training script, whose writer ({OWN_WRITERS}) writes into {out}, the first to start "
        f"writing pair.json; or, for the built-in trainer, {command}"
    )
