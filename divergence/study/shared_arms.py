"""Every arm of a study trained once: arms are the unit of training, pairs are comparisons between arms.

The pairs of one replicate share arms. In the default study the fp32 baseline arm is arm b of
bf16-vs-fp32, arm a of the seed pair, arm b of the reordering and arm a of the control; the bf16
baseline-attention arm is arm b of the pair under study and arm a of bf16-vs-fp32. Two arms are the
same training when their resolved recipes are equal apart from their names (same start, same
batches, same numerics: on one machine, bitwise the same run) and their pairs keep the same weights
(``tracking.every`` and ``tracking.dense``, which decide the steps an arm saves).

The plan, replicate by replicate in the order the jobs start (``runner.start_order``): the first
pair that trains an arm owns it; a later pair with the same arm borrows it. A borrowed arm is a
relative link ``<pair>/r<r>/<arm> -> ../../<owner pair>/r<r>/<owner arm>`` in the borrowing pair's
folder, and the borrowing pair trains only its own arms, each as its own job, then the comparator
follows both arms into its metrics store (``training.separate_pair``), which is bitwise the store a
lockstep job writes. What a pair's folder holds is otherwise what it holds pair by pair
(docs/pair-folder.md, "Shared arms").

- The pair under study (an atlas row) and any pair whose tracker measures inside the training
  process (``tracking.coherence_every``, the shadow attention's output deviation) train in lockstep
  as they do pair by pair, and never borrow: its coherence is measured, and its arms' step times
  (the atlas's speed-up) are read side by side under one load. They lend their arms (``train
  --lend-arms``: each arm also keeps its weights at every tracked step and its journal). The
  references and the calibration's ladder borrow.
- The control keeps its meaning: its two arms are two trainings of one recipe, so its arm b never
  borrows (arm a may: it is the baseline).
- A pair that deletes compared weights (``tracking.keep``) neither lends nor borrows.

``DIR/arms.json`` records each pair run's role (what it borrows, whether it lends) and the arm-steps:
those the plan trains and those a pair-by-pair plan would (each pair both its arms). A study run
again reads it: a pair run keeps the role it started with, so an interrupted study resumes each arm
where it stopped, once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from divergence.atomic import write_atomic
from divergence.errors import UserInputError
from divergence.pairfolder.layout import ARMS, ARMS_FILE

PLACEMENT_KEYS = ("every", "dense")  # tracking keys that decide which steps an arm saves


@dataclass
class ArmRole:
    """How one pair run trains: ``borrowed`` its arms another pair run owns (``{arm: (owner label,
    owner arm)}``), ``lends`` whether other pair runs read its arms."""

    borrowed: dict = field(default_factory=dict)
    lends: bool = False


def arm_key(resolved, arm: str) -> str:
    """What makes arm ``arm`` of the resolved pair the training it is: its recipe without its name, and
    the tracking keys that place its saved weights. Equal keys: bitwise the same run."""
    from divergence.config.schema import to_dict

    recipe = {k: v for k, v in to_dict(resolved.arm_recipes[arm]).items() if k != "name"}
    tracking = to_dict(resolved.tracking)
    placement = {k: tracking[k] for k in PLACEMENT_KEYS}
    return yaml.safe_dump({"recipe": recipe, "tracking": placement}, sort_keys=True)


def in_process(resolved) -> bool:
    """Whether the pair's tracker measures inside the training process (lockstep only: the update
    error's coherence, the shadow attention's output deviation)."""
    from divergence.models.attention import SHADOW

    return bool(resolved.tracking.coherence_every) or any(
        resolved.arm_recipes[arm].attention.name == SHADOW for arm in ARMS
    )


def sharing_facts(resolved, role: str) -> dict:
    """What the plan needs of a pair run, read once from its resolved recipe and its role in the study
    (``runner.plan_jobs``); ``lockstep``: it trains both its arms in one job and never borrows."""
    return {
        "keys": tuple(arm_key(resolved, arm) for arm in ARMS),
        "lockstep": role == "study" or in_process(resolved),
        "keeps_all": resolved.tracking.keep is None or resolved.tracking.keep == 0,
        "control": bool(resolved.control),
    }


def plan_roles(jobs: list) -> dict[str, ArmRole]:
    """``{job label: ArmRole}`` for ``jobs`` in the order they start (``runner.start_order``: within a
    replicate, the lockstep pairs first), so an owner starts before its borrowers."""
    roles = {job.label: ArmRole() for job in jobs}
    owners: dict[tuple[int, str], tuple[str, str]] = {}  # (replicate, arm key) -> (owner label, arm)
    for job in jobs:
        facts = job.sharing
        if not facts["keeps_all"]:
            continue
        for arm, key in zip(ARMS, facts["keys"]):
            owner = owners.get((job.replicate, key))
            if owner is None or facts["lockstep"] or (facts["control"] and arm == "b"):
                owners.setdefault((job.replicate, key), (job.label, arm))
                continue
            if owner[0] == job.label:  # both arms one training: the pair compares it with itself
                continue
            roles[job.label].borrowed[arm] = owner
            roles[owner[0]].lends = True
    return roles


def arm_steps(runs: dict) -> dict:
    """``{"trained": ..., "pair_by_pair": ...}`` over the recorded pair runs: optimizer steps summed over
    the arms each plan trains (a pair run by pair: both its arms; shared: those it does not borrow)."""
    pair_by_pair = sum(len(ARMS) * run["max_steps"] for run in runs.values())
    borrowed = sum(len(run["borrowed"]) * run["max_steps"] for run in runs.values())
    return {"trained": pair_by_pair - borrowed, "pair_by_pair": pair_by_pair}


def assign(jobs: list, root: Path) -> dict:
    """Plan and record the roles of ``jobs`` (in start order) in ``DIR/arms.json``, keeping those an
    earlier run of the study recorded; set each job's ``borrowed`` (``{arm: owner arm folder}``) and
    ``lends``. Returns what ``arms.json`` holds."""
    path = root / ARMS_FILE
    recorded = read_arms(path)
    if recorded is None:
        _check_pair_by_pair(jobs, path)
        recorded = {"shared": True, "runs": {}}
    elif not recorded.get("shared"):
        raise UserInputError(f"{path}: the study in {root} trains pair by pair; run it again with --no-shared-arms")
    roles = plan_roles(jobs)
    saved = recorded["runs"]
    for label in roles:
        if label in saved:  # started before: it keeps its role
            roles[label] = ArmRole({a: tuple(o) for a, o in saved[label]["borrowed"].items()}, saved[label]["lends"])
        else:  # an owner that started before without lending keeps no journal to read: train the arm here
            role = roles[label]
            role.borrowed = {a: o for a, o in role.borrowed.items() if o[0] not in saved or saved[o[0]]["lends"]}
    folders = {label: root / run["folder"] for label, run in saved.items()}  # owners of earlier runs too
    folders.update({job.label: job.out for job in jobs})
    for job in jobs:
        role = roles[job.label]
        job.lends = role.lends
        job.borrowed = {arm: folders[owner] / owner_arm for arm, (owner, owner_arm) in role.borrowed.items()}
    return _write(path, recorded, jobs, roles)


def record_pair_by_pair(jobs: list, root: Path) -> dict:
    """``arms.json`` of a study trained pair by pair (``--no-shared-arms``): every pair both its arms."""
    path = root / ARMS_FILE
    recorded = read_arms(path) or {"shared": False, "runs": {}}
    if recorded.get("shared"):
        raise UserInputError(
            f"{path}: the study in {root} shares arms between pairs; run it again without --no-shared-arms"
        )
    return _write(path, recorded, jobs, {})


def _write(path: Path, recorded: dict, jobs: list, roles: dict[str, ArmRole]) -> dict:
    """``recorded`` with each job's role (none: both its arms its own) and the arm-steps, into ``arms.json``."""
    for job in jobs:
        role = roles.get(job.label, ArmRole())
        recorded["runs"][job.label] = {
            "borrowed": {a: list(o) for a, o in role.borrowed.items()},
            "lends": role.lends,
            "max_steps": job.max_steps,
            "folder": os.path.relpath(job.out, path.parent),
        }
    recorded["arm_steps"] = arm_steps(recorded["runs"])
    write_atomic(path, json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return recorded


def _check_pair_by_pair(jobs: list, path: Path) -> None:
    """A study folder trained pair by pair (no ``arms.json``): its pair runs hold their own arms."""
    started = [job for job in jobs if any((job.out / arm).is_dir() for arm in ARMS)]
    if started:
        raise UserInputError(
            f"{started[0].out}: trained pair by pair (no {path.name} beside it); run the study again with "
            "--no-shared-arms, or choose a new --out"
        )


def read_arms(path: Path) -> dict | None:
    """``arms.json`` as written (None when absent); one line naming it when it does not read."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserInputError(
            f"{path}: does not read as JSON ({err}); remove it only if no pair run has started"
        ) from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not all(_run_reads(run) for run in runs.values()):
        raise UserInputError(
            f"{path}: not an arms.json written by divergence study (runs: borrowed, lends, max_steps, folder)"
        )
    return data


def _run_reads(run) -> bool:
    return (
        isinstance(run, dict)
        and isinstance(run.get("borrowed"), dict)
        and all(isinstance(o, list) and len(o) == 2 for o in run["borrowed"].values())
        and isinstance(run.get("lends"), bool)
        and isinstance(run.get("max_steps"), int)
        and isinstance(run.get("folder"), str)
    )


def link_borrowed(job) -> None:
    """The links of ``job``'s borrowed arms in its folder (relative, so the study folder can move)."""
    job.out.mkdir(parents=True, exist_ok=True)
    for arm, owner in job.borrowed.items():
        link = job.out / arm
        target = os.path.relpath(owner, job.out)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        if link.exists() or link.is_symlink():
            raise UserInputError(
                f"{link}: expected a link to the shared arm {owner}; this pair run was trained otherwise: "
                "choose a new --out"
            )
        link.symlink_to(target, target_is_directory=True)


def describe(record: dict) -> str:
    """One line: ``arm-steps: 930 trained, 1500 pair by pair (0.62x)``."""
    steps = record["arm_steps"]
    ratio = steps["trained"] / steps["pair_by_pair"] if steps["pair_by_pair"] else 1.0
    how = "arms shared between pairs" if record.get("shared") else "pair by pair"
    return f"arm-steps: {steps['trained']} trained, {steps['pair_by_pair']} pair by pair ({ratio:.2f}x; {how})"
