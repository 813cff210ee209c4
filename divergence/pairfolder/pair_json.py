"""``PAIR/pair.json``: what a pair is, in model-agnostic terms; every reader of a pair folder needs it.

Keys (``docs/pair-folder.md``; ``PairInfo`` holds them):

- ``contract``: the version of the folder layout (``CONTRACT``); a reader refuses any other;
- ``name``: the pair's name (``flash-vs-baseline``);
- ``category``: what the two arms differ in, which decides its role in a bounding study:
  ``control`` (nothing), ``seed`` (weight-init seed only), ``precision`` (training precision
  only), ``reordering`` (only the order of fp32 sums: the reordering yardstick, e.g. 4x4
  gradient accumulation vs one batch of 16), ``optimization`` (anything else: the pair under study);
- ``arms``: ``{"a": [variant, ...], "b": [...]}``, each variant a short string
  (``attention=sdpa-flash``);
- ``description``: one line a person reads (``sdpa-flash vs baseline attention``);
- ``max_steps``, ``finished`` (bool), ``last_step`` (int or null); ``max_steps`` is null for an
  open-ended pair (writers not told their length: the arms' last step is where they finish,
  written here by ``divergence watch`` when the pair is complete);
- ``open_ended`` (optional, true): the pair's writers were not told its length, so ``max_steps``,
  once written, is where its arms last finished, a fact a reader re-reads from the arms (arms
  resumed after a finish train on past it), not a length to follow (``is_open_ended``);
- ``recipe``: the built-in trainer's resolved base recipe as plain data (arm a's, with its
  replicate's seeds); ``{}`` for any other training;
- ``replicate``: which replicate of the pair this run is (int, 0 when absent). Replicate r of
  every pair of a study shares its initial weights, batches and probe set;
- ``tracking``: the comparison schedule (``every``, ``dense`` as ``[[until, every], ...]``,
  ``checkpoint_every``, the spike rule ``spike_factor``/``spike_window``; the built-in trainer
  adds ``probe`` and ``attention_every``); ``{}`` when absent;
- ``log`` (optional): the ``log`` section ``divergence watch`` sends its logs with;
- ``numerics``: what each arm trains in, ``{"a": {...}, "b": {...}}`` with ``device`` (cpu,
  cuda), ``precision``, ``attention`` (the kernel), ``tf32``, ``deterministic`` and
  ``cpu_threads`` (torch intra-op threads, resolved); written by the built-in trainer, ``{}``
  when absent (other writers); a resume must train in the same numerics;
- ``outside_deployment``: one line when an arm trains a variant outside the numerics it is used
  in (``divergence.variants.deployment``: sdpa-flash in fp32, tf32 on a CPU), else null;
- ``start`` (optional, a string): where both arms' starting weights come from when they are not
  a fresh initialization (a fine-tune): a path, a hub id or a hash of the pretrained weights,
  the same string for every pair of one study (``docs/method.md``, "Fine-tuning"); absent or
  null: not recorded (training from scratch);
- ``expect_identity`` (optional, a bool): the pair's change should be the identity in fp32 (a
  reordering of fp32 sums at most: gradient accumulation, a fused optimizer, data parallelism), so
  a difference beyond a reordering reads "if it should be the identity, look for a bug" whatever
  the arms' labels; the built-in trainer writes true for the fp32-equivalent variants, a user's
  loop passes ``ArmWriter(expect_identity=True)``; absent: not declared.

Keys this version does not know are kept when ``PairInfo`` rewrites the file (``extra``), so a
reader that marks a pair finished never drops what a newer writer put there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from divergence.errors import RecipeError, UserInputError, check_int
from divergence.pairfolder.folder import PairFolder, as_pair_folder
from divergence.pairfolder.layout import ARMS, CONTRACT, PAIR_FILE
from divergence.pairfolder.settings import DENSE_DEFAULT, SPIKE_FACTOR, SPIKE_WINDOW, TrackingConfig
from divergence.tables import write_json

CATEGORIES = ("optimization", "seed", "precision", "control", "reordering")
DEFAULT_EVERY = 10


@dataclass
class PairInfo:
    name: str
    category: str
    arms: dict[str, list[str]]
    description: str = ""
    max_steps: int | None = 0
    finished: bool = False
    last_step: int | None = None
    recipe: dict = field(default_factory=dict)
    replicate: int = 0
    tracking: dict = field(default_factory=dict)
    numerics: dict = field(default_factory=dict)
    outside_deployment: str | None = None
    start: str | None = None  # the arms' pretrained starting weights (a fine-tune); written only when set
    expect_identity: bool | None = None  # the change should be the identity in fp32; written only when set
    contract: int = CONTRACT
    # keys of pair.json this version does not know (``log``, a newer writer's): written back as read
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise UserInputError(f"category={self.category!r}: must be one of {', '.join(CATEGORIES)}")

    def to_json(self) -> dict:
        data = asdict(self)
        extra = data.pop("extra")
        for key in ("start", "expect_identity"):  # optional: a pair from scratch, or not declared, writes no key
            if data[key] is None:
                del data[key]
        return {"contract": data.pop("contract"), **data, **{k: v for k, v in extra.items() if k not in data}}

    def write(self, pair_dir: str | Path) -> None:
        write_json(as_pair_folder(pair_dir).pair_json, self.to_json())

    @classmethod
    def read(cls, pair_dir: str | Path) -> "PairInfo":
        path = as_pair_folder(pair_dir).pair_json
        data = read_pair_json(pair_dir)
        known = {f.name for f in fields(cls)} - {"extra"}
        try:
            return cls(
                **{k: data[k] for k in data if k in known}, extra={k: v for k, v in data.items() if k not in known}
            )
        except (TypeError, ValueError) as err:
            raise UserInputError(f"{path}: {err}") from None


def read_pair_json(out: str | Path) -> dict:
    """``pair.json`` as plain data, of this package's ``CONTRACT`` (any other is refused in one line)."""
    path = as_pair_folder(out).pair_json
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"{path}: not found; is {out} a pair folder (docs/pair-folder.md)?") from None
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: unreadable ({err})") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: not a JSON object")
    contract = data.get("contract")
    if type(contract) is int and contract > CONTRACT:
        raise UserInputError(
            f"{path}: contract {contract} is newer than this divergence reads ({CONTRACT}); upgrade divergence"
        )
    if type(contract) is not int or contract != CONTRACT:
        raise UserInputError(
            f"{path}: contract {contract!r}, not {CONTRACT}: not written by this divergence; train the pair "
            "again (a writer of your own: write pair.json with divergence.writers.write_pair_files)"
        )
    return data


def tracking_schedule(
    every: int,
    spike_factor: float = SPIKE_FACTOR,
    spike_window: int = SPIKE_WINDOW,
    dense=DENSE_DEFAULT,
    checkpoint_every: int = 0,
) -> dict:
    """The ``tracking`` dict of ``pair.json``; the arguments checked as the recipe checks them.

    ``dense`` is the early schedule on top of ``every`` (``[[until, every], ...]``; default every
    step to 20 and every 5th to 100, where the dose ratio of ``docs/method.md`` is read; ``[]``: off).
    """
    check_int(every, "every", 1, " (compare the arms every N steps)")
    if not spike_factor > 1:
        raise UserInputError(f"spike_factor={spike_factor!r}: must be > 1")
    check_int(spike_window, "spike_window", 3)
    check_int(checkpoint_every, "checkpoint_every", 0, " (0: none)")
    schedule_config({"every": every, "dense": dense})  # checks dense
    return {
        "every": every,
        "dense": [list(d) for d in dense],
        "checkpoint_every": checkpoint_every,
        "spike_factor": float(spike_factor),
        "spike_window": spike_window,
    }


def schedule_config(tracking: dict) -> TrackingConfig:
    """The schedule of a ``tracking`` dict as ``is_tracked`` takes it (no ``dense``: none)."""
    try:
        return TrackingConfig(every=tracking["every"], dense=tuple(tuple(d) for d in tracking.get("dense", ())))
    except (RecipeError, TypeError, ValueError) as err:
        raise UserInputError(f"dense={tracking.get('dense')!r}: {err}") from None


def write_pair_files(
    out: str | Path,
    *,
    max_steps: int | None,
    every: int = DEFAULT_EVERY,
    name: str | None = None,
    category: str = "optimization",
    arms: dict | None = None,
    description: str = "",
    replicate: int = 0,
    spike_factor: float = SPIKE_FACTOR,
    spike_window: int = SPIKE_WINDOW,
    dense=DENSE_DEFAULT,
    log: dict | None = None,
    stride: int = 1,
    keep: int | None = None,
    start: str | None = None,
    expect_identity: bool | None = None,
) -> dict:
    """Write ``pair.json`` into ``out`` (created); return its content.

    ``max_steps``: the arms' number of optimizer steps, or None for an open-ended pair (an
    epoch-based loop that does not know it: the arms end where their writers ``finish``).
    ``name`` defaults to the folder's name; ``arms`` to ``{"a": ["a"], "b": ["b"]}`` (each
    arm's list of short labels, e.g. ``["attention=flash"]``); ``log``: the ``log`` section
    ``divergence watch`` sends its logs with (``{"wandb": false}`` for CSV only); ``stride``:
    the arms record every ``stride``-th step (``tracking.stride``, written when not 1; see
    ``divergence.pairfolder.arm.steps``); ``keep``: ``tracking.keep``, the files ``divergence
    watch`` keeps once it has compared a step (``divergence.comparator.retention``; None: all);
    ``start``, ``expect_identity``: those keys (the module docstring), None: not written.
    """
    from divergence.pairfolder.arm.steps import MAX_STEP, check_stride

    out = Path(out)
    if max_steps is not None and (
        not isinstance(max_steps, int) or isinstance(max_steps, bool) or not 1 <= max_steps <= MAX_STEP
    ):
        raise UserInputError(
            f"max_steps={max_steps!r}: must be an integer >= 1 (the arms' number of optimizer steps), "
            "or None (open-ended: the arms end where they finish)"
        )
    check_int(replicate, "replicate", 0)
    if start is not None and (not isinstance(start, str) or not start.strip()):
        raise UserInputError(
            f"start={start!r}: must be a non-empty string naming the pretrained weights both arms start from "
            "(a path, hub id or hash), or None"
        )
    if expect_identity is not None and not isinstance(expect_identity, bool):
        raise UserInputError(
            f"expect_identity={expect_identity!r}: must be True (the change should be the identity in fp32), "
            "False or None (not declared)"
        )
    if log is not None and not isinstance(log, dict):
        raise UserInputError(f"log={log!r}: must be a dict, the recipe's log section (e.g. {{'wandb': False}})")
    tracking = tracking_schedule(every, spike_factor, spike_window, dense)
    if check_stride(stride, max_steps, PAIR_FILE) > 1:
        tracking["stride"] = stride
    if check_keep(keep):
        tracking["keep"] = keep
    arms = _arm_labels(arms)
    info = PairInfo(
        name=name or out.resolve().name,
        category=category,
        arms=arms,
        description=description or arms_line(arms),
        max_steps=max_steps,
        replicate=replicate,
        tracking=tracking,
        start=start,
        expect_identity=expect_identity,
        extra={**({"log": dict(log)} if log else {}), **({"open_ended": True} if max_steps is None else {})},
    )
    out.mkdir(parents=True, exist_ok=True)
    info.write(out)
    return info.to_json()


def arms_line(arms: dict) -> str:
    """The arms' labels as one line, the ``description`` a pair gets when it is given none.

    >>> arms_line({"a": ["attention=flash"], "b": ["attention=sdpa"]})
    'attention=flash vs attention=sdpa'
    """
    return " vs ".join(", ".join(arms.get(arm) or ()) for arm in ARMS)


def pair_label(name: str, description: str, arms: dict) -> str:
    """What a verdict calls a pair: its ``description`` (the longer form of the name) when a
    person gave one, else its ``name``. A description that only repeats the arms' labels (what
    the writers store when given none: ``a vs b``) does not replace the name.

    >>> pair_label("flash-vs-baseline", "a vs b", {"a": ["a"], "b": ["b"]})
    'flash-vs-baseline'
    """
    return description if description and description != arms_line(arms or {}) else name


def finish_pair(pair_folder: PairFolder | str | Path, last_step: int | None, finished: bool) -> PairInfo:
    """Mark the pair of ``pair_folder`` ended: ``pair.json``'s ``last_step`` and ``finished``, and an
    open-ended pair's ``max_steps`` (its last step, once finished; every other key, also the ones
    this version does not know, as read). The one place a pair folder is finished: the lockstep
    trainer, ``LockstepPair``, ``divergence watch`` and ``divergence track``."""
    pair_folder = as_pair_folder(pair_folder)
    info = PairInfo.read(pair_folder)
    info.finished, info.last_step = finished, last_step
    if is_open_ended(info.to_json()) and finished and last_step:
        info.max_steps, info.extra["open_ended"] = last_step, True  # where it ended, not a length to follow
    info.write(pair_folder)
    return info


def is_open_ended(info: dict) -> bool:
    """``pair.json`` (``info``) of a pair whose writers were not told its length: ``max_steps`` null,
    or ``open_ended`` true (then ``max_steps`` is where the arms finished last, not a length)."""
    return info.get("max_steps") is None or info.get("open_ended") is True


def ensure_pair_files(out: str | Path, *, max_steps: int | None, every: int = DEFAULT_EVERY, **kwargs) -> dict:
    """The folder's ``pair.json``, written by ``write_pair_files`` when missing.

    The arm that starts first writes it; the other finds it and must agree on ``max_steps``,
    ``every`` and ``stride`` (the arms of a pair take the same steps and are compared at the
    same ones), and on the pair's identity where it gives one (``check_same_pair``).
    """
    existing = check_pair_files(out, max_steps=max_steps, every=every, **kwargs)
    return existing if existing is not None else write_pair_files(out, max_steps=max_steps, every=every, **kwargs)


def check_pair_files(
    out: str | Path, *, max_steps: int | None, every: int = DEFAULT_EVERY, stride: int = 1, **kwargs
) -> dict | None:
    """``pair.json`` of ``out`` when it describes this pair, None when there is none; otherwise a
    ``UserInputError`` (another pair, or another length or schedule). Reads only."""
    path = as_pair_folder(out).pair_json
    if not path.is_file():
        return None
    existing = read_pair_json(out)
    check_same_pair(out, existing, kwargs)
    schedule = existing.get("tracking") or {}
    keep = check_keep(kwargs.get("keep"))  # given: both arms must agree (None: not given, joins any)
    saved_keep = (schedule.get("keep") or None) if keep is not None else None
    saved_steps = (
        None if max_steps is None or is_open_ended(existing) else existing.get("max_steps")
    )  # None joins an open pair
    for key, now, saved in (
        ("max_steps", max_steps, saved_steps),
        ("every", every, schedule.get("every", every)),
        ("stride", stride, schedule.get("stride", 1)),
        ("keep", keep, saved_keep),
    ):
        if saved != now:
            raise UserInputError(
                f"{path}: the pair has {key}={saved!r}, this arm {key}={now!r}; "
                "train both arms with the same value, or use a new folder"
            )
    return existing


def check_keep(keep) -> int | None:
    """``keep`` when None or an integer >= 0, else a one-line error (``tracking.keep``'s rule)."""
    why = " (keep every keep-th tracked step's weights files) or None (all)"
    return check_int(keep, "keep", 0, why, optional=True) or None


IDENTITY = ("name", "category", "arms", "replicate")  # what makes two pair.json the same pair


def check_same_pair(out: str | Path, saved: dict, given: dict) -> None:
    """Refuse folder ``out`` whose ``pair.json`` (``saved``) names another pair than ``given``.

    Only the identity keys given (not None) are compared: a writer that names no pair joins
    the one there. One folder holds one pair: a second pair written into it would mix its
    records with the first's.
    """
    wanted = {k: given[k] for k in IDENTITY if given.get(k) is not None}
    if "arms" in wanted:
        wanted["arms"] = _arm_labels(wanted["arms"])
    for key, value in wanted.items():
        if saved.get(key, 0 if key == "replicate" else None) != value:
            raise UserInputError(
                f"{as_pair_folder(out).pair_json}: holds pair {saved.get('name')!r} with {key} "
                f"{saved.get(key)!r}, not {value!r}: one pair per folder; write this pair into a "
                f"new folder (or give the same {key} to continue that pair)"
            )


def _arm_labels(arms) -> dict:
    if arms is None:
        return {"a": ["a"], "b": ["b"]}
    if isinstance(arms, dict) and len(arms) == 1 and set(arms) < set(ARMS):
        (own,) = arms
        raise UserInputError(
            f"arms={arms!r}: labels arm {own!r} only; both arms pass the same dict, with both arms' labels "
            f"(it names the pair's two sides), e.g. arms={{'a': ['attention=flash'], 'b': ['attention=baseline']}}"
        )
    if not isinstance(arms, dict) or set(arms) != {"a", "b"}:
        raise UserInputError(
            f"arms={arms!r}: must be a dict with keys 'a' and 'b', e.g. "
            "{'a': ['attention=flash'], 'b': ['attention=baseline']}"
        )
    return {arm: [arms[arm]] if isinstance(arms[arm], str) else [str(v) for v in arms[arm]] for arm in ("a", "b")}
