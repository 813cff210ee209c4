"""What a reader of a pair folder needs to follow it: the pair's length and comparison schedule.

Read from ``pair.json`` alone (``max_steps``, ``tracking``, ``log``; the built-in trainer's
``recipe.train.checkpoint_every`` and ``recipe.log`` where its folders keep them), so
``divergence watch`` follows a pair trained by any code. ``pair.yaml``, the built-in trainer's
resolved pair recipe, is what the function-space probe builds its models from: without it (a
pair trained by someone else's code) there is no probe.

How to start an arm (``how_to_start``) is told the way the folder's arms were started: the
built-in trainer leaves its resolved recipe (``pair.yaml``, and ``pair.json``'s ``recipe``); any
other writer (``ArmWriter`` in a plain loop, the Lightning callbacks ``ArmCheckpoints`` /
``LockstepPair``, the transformers ``ArmWriterCallback``) leaves ``recipe`` empty. Advice that
names ``divergence train`` to a person whose arms are their own script points the wrong way, so
it is given only where the folder shows the built-in trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from divergence.atomic import read_json
from divergence.config.schema import parse
from divergence.config.yaml_safe import read_yaml
from divergence.errors import RecipeError, UserInputError
from divergence.pairfolder.arm.steps import check_stride, tracked_with_stride
from divergence.pairfolder.folder import PairFolder, as_pair_folder
from divergence.pairfolder.layout import PAIR_FILE
from divergence.pairfolder.pair_json import is_open_ended, read_pair_json
from divergence.pairfolder.settings import LogConfig, ProbeConfig, TrackingConfig, is_tracked

_TRACKING_KEYS = {f.name for f in fields(TrackingConfig)}


@dataclass(frozen=True)
class PairSchedule:
    """The pair of a folder as its readers follow it."""

    name: str
    max_steps: int | None  # None: an open-ended pair, whose last step is where its arms finish
    checkpoint_every: int
    tracking: TrackingConfig  # every, dense, the spike rule; probe enabled only with a pair.yaml
    log: LogConfig
    replicate: int
    info: dict  # pair.json as read
    recipe_config: dict | None  # pair.yaml as read (None: absent), what the probe builds models from
    stride: int = 1  # the arms record every stride-th step (tracking.stride; divergence.pairfolder.arm.steps)

    def tracked(self, step: int) -> bool:
        return tracked_with_stride(
            step, self.stride, lambda t: is_tracked(t, self.max_steps, self.tracking, self.checkpoint_every)
        )

    def next_step(self, last: int | None) -> int:
        """The step recorded after ``last`` (None: nothing yet, so step 0)."""
        return 0 if last is None else last + self.stride


def read_schedule(out: str | Path) -> PairSchedule:
    """The ``PairSchedule`` of pair folder ``out``; a ``UserInputError`` naming the file and key."""
    out = as_pair_folder(out)
    if not out.pair_json.is_file():
        raise UserInputError(f"{out}: no {PAIR_FILE}; start the arms first: {how_to_start(out, 'a')}")
    info = read_pair_json(out)
    tracking = info.get("tracking") or {}
    if "every" not in tracking:
        raise UserInputError(
            f"{out.pair_json}: no tracking.every; write {PAIR_FILE} with divergence.writers.write_pair_files"
        )
    config, recipe = _read_recipe(out), info.get("recipe") or {}
    train = recipe.get("train") or {}
    try:
        parsed = parse(TrackingConfig, {k: v for k, v in tracking.items() if k in _TRACKING_KEYS}, "tracking")
        checkpoint_every = int(tracking.get("checkpoint_every", train.get("checkpoint_every", 0)) or 0)
        log = parse(LogConfig, info.get("log", recipe.get("log")), "log")
        max_steps = info["max_steps"]
        max_steps = None if is_open_ended(info) else int(max_steps)  # an open pair's end is its arms' to say
        name = str(info["name"])
        stride = check_stride(tracking.get("stride", 1), max_steps, "tracking.stride")
    except (KeyError, TypeError, ValueError) as err:
        raise UserInputError(f"{out.pair_json}: {err}") from None
    if config is None and parsed.probe.enabled:  # the probe builds our models from pair.yaml
        parsed = replace(parsed, probe=ProbeConfig(enabled=False))
    replicate = int(info.get("replicate", 0) or 0)
    return PairSchedule(name, max_steps, checkpoint_every, parsed, log, replicate, info, config, stride)


def _read_recipe(out: PairFolder) -> dict | None:
    """``pair.yaml`` as plain data, read by the hardened loader (``divergence.config.yaml_safe``)."""
    path = out.pair_yaml
    if not path.is_file():
        return None
    try:
        config = read_yaml(path) or {}
    except OSError as err:
        raise UserInputError(f"{path}: unreadable ({err})") from None
    except RecipeError as err:  # names the file already
        raise UserInputError(str(err)) from None
    if not isinstance(config, dict):
        raise UserInputError(f"{path}: not a pair file (a mapping)")
    return config


# the writers of one arm each (LockstepPair trains both arms in one process: never one missing)
OWN_WRITERS = "divergence.ArmWriter, Lightning's ArmCheckpoints or transformers' ArmWriterCallback"


def started_by_builtin(out: str | Path) -> bool | None:
    """True: the built-in trainer started this pair; False: another writer did; None: nothing
    started it yet (no ``pair.json``, no ``pair.yaml``) or ``pair.json`` is unreadable."""
    folder = as_pair_folder(out)
    if folder.pair_yaml.is_file():
        return True
    info = read_json(folder.pair_json)
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
