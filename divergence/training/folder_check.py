"""May this folder be trained (or resumed) by this command? One check for runs, pairs and arms.

Before anything is built or written, ``check_folder`` refuses, in one line naming the folder and
the first differing key: a path that is not a folder; a folder of another kind (a single run, a
lockstep pair, separate arms); resume state or records that do not read (``check_resume``,
the metrics store, ``losses.jsonl``); and a saved recipe (``recipe.yaml`` or ``pair.yaml``)
that differs from the command's in a key that changes what is computed.

Keys that may differ: those a resumed run may change (``train.max_steps`` extends a run; the
cadence of checkpoints, samples and logs; data workers), the tracking of a lockstep
pair (the tracker's own), and for separate arms how each job runs (devices, strategy, accumulate). A key
absent from the saved recipe (a folder of another divergence version) is a change like any other.

``train.cpu_threads`` may not change on a resume: a CPU splits its reductions by thread, so the
same replicate trained with 1 and with 2 threads differs from the first step (``check_numerics``
also compares the numerics a lockstep pair recorded in ``pair.json``: device, precision, kernel,
TF32 and the resolved thread count, which ``cpu_threads: 0`` leaves to the machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from divergence.errors import UserInputError
from divergence.pairfolder.folder import PairFolder, RunFolder
from divergence.pairfolder.folder import as_run_folder
from divergence.pairfolder.folder import as_pair_folder
from divergence.pairfolder.layout import PAIR_FILE, PAIR_RECIPE_FILE, RUN_RECIPE_FILE
from divergence.config.yaml_safe import read_yaml, short
from divergence.recipe.run import HARDWARE_KEYS

# Keys of a run recipe that may differ between a folder and the command resuming it.
RESUMABLE_CHANGES = (
    "train.max_steps",
    "train.checkpoint_every",
    "data.workers",
    "log.",
    "sample.every",
    "sample.enabled",
)
# Keys of pair.yaml that may differ between the jobs of one pair folder: how each job runs,
# not what it computes. Different global batches (batch_size x devices x num_nodes x accumulate)
# are refused separately (``separate_arm.check_arm_folder``): they change the batches.
PER_JOB_KEYS = (*(f"train.{key}" for key in HARDWARE_KEYS), "train.accumulate", "data.workers", "log.")


@dataclass(frozen=True)
class FolderKind:
    """What a folder holds: its saved recipe file, what may change, and how to name it."""

    saved: str  # recipe.yaml or pair.yaml
    changeable: tuple  # prefixes of run-recipe keys that may change
    what: str  # "a run", "a pair", ...
    tracking_changes: bool  # tracking.* may change (the lockstep tracker reads it as it goes)
    fix: str = "resume with the same recipe or choose a new --out"


RUN = FolderKind(RUN_RECIPE_FILE, RESUMABLE_CHANGES, "a run", False)
LOCKSTEP = FolderKind(PAIR_RECIPE_FILE, RESUMABLE_CHANGES, "a pair", True)
SEPARATE = FolderKind(
    PAIR_RECIPE_FILE,
    PER_JOB_KEYS,
    "separate arms of a pair",
    False,
    "both arms and the comparator of a folder must train the same pair",
)


def check_folder(out: PairFolder | Path, kind: FolderKind, config: dict, *, arm: str | None = None) -> None:
    """Refuse ``out`` for this command (see the module docstring); ``config``: what the command
    would save (``to_dict(recipe)`` or ``pair_config(pair)``); ``arm``: the separate arm trained."""
    from divergence.store import MetricsStore
    from divergence.pairfolder.arm.losses import LossFile

    folder = as_pair_folder(out)  # a run's, a pair's or (``arm``) an arm's parent: the names are alike
    out = folder.path
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a folder")
    if kind is not RUN and folder.recipe.is_file():
        raise UserInputError(f"--out {out}: holds a single run, not a pair; choose a new --out")
    if kind is SEPARATE and folder.resume_dir.is_dir():
        raise UserInputError(f"--out {out}: holds a lockstep pair run; train separate arms in a new --out")
    check_resume(folder.arm(arm) if arm else folder)
    if kind is LOCKSTEP and MetricsStore(out).exists():
        MetricsStore(out).check()  # resuming cuts the store: every line of it must read first
    if arm:
        LossFile(folder.arm(arm)).check()  # a resumed arm cuts it: every line of it must read first
    saved_path = out / kind.saved
    trained = {
        RUN: folder.resume_dir.is_dir() or folder.checkpoints_dir.is_dir(),
        LOCKSTEP: folder.resume_dir.is_dir(),
        SEPARATE: True,
    }[kind]
    if saved_path.is_file() and trained:
        key, old, new = first_change(read_yaml(saved_path) or {}, config, kind)
        if key is not None:
            raise UserInputError(
                f"--out {out}: its {kind.saved} ({kind.what}) has {key} = {short(old)}, this command {short(new)}; {kind.fix}"
            )


def check_numerics(pair_folder: PairFolder | Path, numerics: dict) -> None:
    """Refuse to resume the lockstep pair in ``pair_folder`` in other numerics than ``pair.json`` recorded
    (``numerics``: arm -> ``arm_numerics``); a pair.json without them (another divergence version) is refused."""
    from divergence.pairfolder.pair_json import read_pair_json

    pair_folder = as_pair_folder(pair_folder)
    out = pair_folder.path
    if not (pair_folder.resume_dir.is_dir() and pair_folder.pair_json.is_file()):
        return
    saved = read_pair_json(pair_folder).get("numerics") or {}
    for arm in sorted(numerics):
        for key in sorted(numerics[arm]):
            if (saved.get(arm) or {}).get(key) != numerics[arm][key]:
                raise UserInputError(
                    f"--out {out}: its {PAIR_FILE} says arm {arm} trained with {key} = "
                    f"{(saved.get(arm) or {}).get(key)!r}, this command {numerics[arm][key]!r}; resume in the "
                    f"numerics the pair started in (set train.cpu_threads, train.accelerator to "
                    "match) or choose a new --out"
                )


def first_change(saved: dict, now: dict, kind: FolderKind) -> tuple:
    """``(key, saved value, current value)`` of the first key that may not change, or ``(None,) * 3``."""
    saved, now = flatten_keys(saved), flatten_keys(now)
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) == now.get(key) or _may_change(key, kind):
            continue
        return key, saved.get(key), now.get(key)
    return None, None, None


def _may_change(key: str, kind: FolderKind) -> bool:
    if kind.tracking_changes and key.startswith("tracking."):
        return True
    recipe_key = key.split(".", 2)[-1] if key.startswith("recipes.") else key
    return recipe_key.startswith(kind.changeable)


def check_resume(out: RunFolder | Path) -> None:
    """The folder's resume state loads without running code, before anything is written or run."""
    from divergence.training.callbacks.resume import resume_file
    from divergence.training.checkpoint_io import check_resume_file

    folder = as_run_folder(out)
    last = folder.resume_file
    for path in {resume_file(folder.resume_dir), last if last.exists() or last.is_symlink() else None} - {None}:
        check_resume_file(path)


def flatten_keys(data: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` (attention ``options`` stay one value)."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "options":
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
