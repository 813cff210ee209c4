"""``DIR/pair.json`` (and ``DIR/pair.yaml``) for a pair trained by someone else's code.

``pair.json`` is the model-agnostic description every reader takes (``docs/pair-folder.md``):
``name, category, arms, description, max_steps, finished, last_step, recipe`` (``PairInfo``)
plus ``contract`` (the version of the folder layout, read with a default of 1),
``replicate`` (0 unless the pair is one of several replicates) and ``tracking``: the schedule
on which the arms' weights are compared (``every``, ``checkpoint_every``, and the loss-spike
rule's ``spike_factor`` and ``spike_window``).

``divergence watch`` of this version learns the schedule from ``pair.yaml`` (the resolved
pair recipe the built-in trainer writes), so a minimal one goes beside it: the pair's name,
its ``tracking`` and a run recipe holding only ``train.max_steps`` and
``train.checkpoint_every: 0``; every other recipe key keeps its default and means nothing
for a model we did not build.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from divergence.atomic import write_atomic
from divergence.errors import RecipeError, UserInputError
from divergence.recipe.pair import DENSE_DEFAULT, TrackingConfig
from divergence.store.pair_info import CATEGORIES, FILENAME, PairInfo
from divergence.tables import write_json

CONTRACT = 1
RECIPE_FILE = "pair.yaml"
DEFAULT_EVERY = 10
SPIKE_FACTOR, SPIKE_WINDOW = 3.0, 20


def tracking_schedule(every: int, spike_factor: float = SPIKE_FACTOR, spike_window: int = SPIKE_WINDOW,
                      dense=DENSE_DEFAULT) -> dict:
    """The ``tracking`` dict of ``pair.json``; the arguments checked as the recipe checks them.

    ``dense`` is the early schedule on top of ``every`` (``[[until, every], ...]``; default every
    step to 20 and every 5th to 100, where the dose ratio of ``METHOD.md`` is read; ``[]``: off).
    """
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise UserInputError(f"every={every!r}: must be an integer >= 1 (compare the arms every N steps)")
    if not spike_factor > 1:
        raise UserInputError(f"spike_factor={spike_factor!r}: must be > 1")
    if not isinstance(spike_window, int) or spike_window < 3:
        raise UserInputError(f"spike_window={spike_window!r}: must be an integer >= 3")
    schedule_config({"every": every, "dense": dense})  # checks dense
    return {"every": every, "dense": [list(d) for d in dense], "checkpoint_every": 0,
            "spike_factor": float(spike_factor), "spike_window": spike_window}


def schedule_config(tracking: dict) -> TrackingConfig:
    """The schedule of a ``tracking`` dict as ``is_tracked`` takes it (older folders: no dense)."""
    try:
        return TrackingConfig(every=tracking["every"], dense=tuple(tuple(d) for d in tracking.get("dense", ())))
    except (RecipeError, TypeError, ValueError) as err:
        raise UserInputError(f"dense={tracking.get('dense')!r}: {err}") from None


def write_pair_files(out: str | Path, *, max_steps: int, every: int = DEFAULT_EVERY, name: str | None = None,
                     category: str = "optimization", arms: dict | None = None, description: str = "",
                     replicate: int = 0, spike_factor: float = SPIKE_FACTOR, spike_window: int = SPIKE_WINDOW,
                     dense=DENSE_DEFAULT, log: dict | None = None) -> dict:
    """Write ``pair.json`` and ``pair.yaml`` into ``out`` (created); return ``pair.json``'s content.

    ``name`` defaults to the folder's name; ``arms`` to ``{"a": ["a"], "b": ["b"]}`` (each
    arm's list of short labels, e.g. ``["attention=flash"]``); ``log``: the ``log`` section
    ``divergence watch`` sends its logs with (``{"wandb": false}`` for CSV only).
    """
    out = Path(out)
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        raise UserInputError(f"max_steps={max_steps!r}: must be an integer >= 1 (the arms' number of optimizer steps)")
    if category not in CATEGORIES:
        raise UserInputError(f"category={category!r}: must be one of {', '.join(CATEGORIES)}")
    if not isinstance(replicate, int) or replicate < 0:
        raise UserInputError(f"replicate={replicate!r}: must be an integer >= 0")
    arms = _arm_labels(arms)
    tracking = tracking_schedule(every, spike_factor, spike_window, dense)
    name = name or out.resolve().name
    info = PairInfo(name=name, category=category, arms=arms, description=description or " vs ".join(
        ", ".join(arms[a]) for a in ("a", "b")), max_steps=max_steps)
    payload = {"contract": CONTRACT, **asdict(info), "replicate": replicate, "tracking": tracking}
    out.mkdir(parents=True, exist_ok=True)
    _write_recipe(out, name, max_steps, tracking, log or {})
    write_json(out / FILENAME, payload)
    return payload


def ensure_pair_files(out: str | Path, *, max_steps: int, every: int = DEFAULT_EVERY, **kwargs) -> dict:
    """The folder's ``pair.json``, written by ``write_pair_files`` when missing.

    The arm that starts first writes it; the other finds it and must agree on ``max_steps``
    and ``every`` (the arms of a pair take the same number of steps and are compared at the
    same steps).
    """
    path = Path(out) / FILENAME
    if not path.is_file():
        return write_pair_files(out, max_steps=max_steps, every=every, **kwargs)
    existing = read_pair_json(out)
    schedule = existing.get("tracking") or {}
    for key, now, saved in (("max_steps", max_steps, existing.get("max_steps")),
                            ("every", every, schedule.get("every", every))):
        if saved != now:
            raise UserInputError(f"{path}: the pair has {key}={saved!r}, this arm {key}={now!r}; "
                                 "train both arms with the same value, or use a new folder")
    return existing


def read_pair_json(out: str | Path) -> dict:
    """``pair.json`` as plain data, with ``contract`` defaulting to 1 (folders written before it)."""
    path = Path(out) / FILENAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: unreadable ({err})") from None
    data.setdefault("contract", 1)
    if data["contract"] > CONTRACT:
        raise UserInputError(f"{path}: contract {data['contract']} is newer than this divergence reads "
                             f"({CONTRACT}); upgrade divergence")
    return data


def _arm_labels(arms) -> dict:
    if arms is None:
        return {"a": ["a"], "b": ["b"]}
    if not isinstance(arms, dict) or set(arms) != {"a", "b"}:
        raise UserInputError(f"arms={arms!r}: must be a dict with keys 'a' and 'b', e.g. "
                             "{'a': ['attention=flash'], 'b': ['attention=baseline']}")
    return {arm: [arms[arm]] if isinstance(arms[arm], str) else [str(v) for v in arms[arm]] for arm in ("a", "b")}


def _write_recipe(out: Path, name: str, max_steps: int, tracking: dict, log: dict) -> None:
    import yaml

    recipe = {"name": name, "train": {"max_steps": max_steps, "checkpoint_every": tracking["checkpoint_every"]},
              "log": dict(log)}
    config = {"name": name, "contract": CONTRACT,
              # no probe: it evaluates models divergence builds, not the user's
              "tracking": {**{k: tracking[k] for k in ("every", "dense", "spike_factor", "spike_window")},
                           "probe": {"enabled": False}},
              "recipes": {"a": recipe}}
    write_atomic(out / RECIPE_FILE, yaml.safe_dump(config, sort_keys=False))
