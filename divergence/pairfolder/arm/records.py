"""An arm folder's records at a (re)start: what an earlier attempt left, and the cut of a restart.

An arm restarted from its checkpoint of step G recomputes the steps after G, so its writer first
removes what the earlier attempt left of them: the ``losses.jsonl`` lines and the weights files
of steps after G (``drop_after``). That is a resume, and the writer must be told so (a
``start_step`` G > 0, a Trainer resumed from a checkpoint, or ``resume=True``): a writer started
at step 0 into an arm folder that holds later records is refused (``claim_arm_folder``), since
cutting them would silently throw away a finished or running arm's work. A resume from a step the
arm's records do not reach (``start_step`` 5 over losses that end at 3) is refused as well: the steps
between would be a gap that ``divergence watch`` finds only when the arm ends.
"""

from __future__ import annotations

from pathlib import Path

from divergence.errors import UserInputError
from divergence.pairfolder.arm.losses import LossFile
from divergence.pairfolder.arm.status import ArmStatus
from divergence.pairfolder.arm.weights_dcp import remove_weights
from divergence.pairfolder.folder import as_arm_folder
from divergence.pairfolder.layout import weights_step


def drop_after(arm_dir: str | Path, step: int) -> None:
    """Remove the loss lines and weights files of the steps after ``step`` (a restart recomputes them).

    The loss file is read whole first: an unreadable line is an error and nothing is cut.
    """
    arm_folder = as_arm_folder(arm_dir)
    LossFile(arm_folder).truncate_after(step)
    for s in _weights_steps(arm_folder):
        if s > step:
            for path in (arm_folder.weights(s), arm_folder.weights_dcp(s)):
                remove_weights(path)  # a file, or a DCP folder


def claim_arm_folder(arm_dir: str | Path, arm: str, start_step: int, resume: bool, how_to_resume: str) -> None:
    """Refuse to start arm ``arm`` at step 0 over records of later steps unless ``resume`` says so,
    and to resume it at a ``start_step`` past its recorded losses (the steps between would be a gap).

    ``how_to_resume``: how this writer is told to continue from a checkpoint (its own words).
    """
    if start_step <= 0 and resume:
        return
    loss_file = LossFile(arm_dir)
    losses = loss_file.read_new()
    if start_step > 0:  # the losses reach it: a resume continues its records, it does not skip steps
        last = max(losses, default=None)
        if last is not None and last >= start_step:
            return
        held, fix = (
            (f"end at step {last}", f"resume from a checkpoint of step {last} or earlier")
            if last is not None
            else ("hold no step yet", "start it at step 0")
        )
        raise UserInputError(
            f"{arm_dir}: start_step={start_step}, but arm {arm}'s records ({loss_file.path.name}) {held}: the "
            f"steps between would be a gap divergence watch waits on; {fix}"
        )
    later = [s for s in (*losses, *_weights_steps(arm_dir)) if s > start_step]  # a loss or weights file after it
    if not later:
        return
    status = ArmStatus.read(arm_dir)
    state = f" ({status.state}, attempt {status.attempt})" if status is not None else ""
    raise UserInputError(
        f"{arm_dir}: already holds arm {arm}'s records up to step {max(later)}{state}; starting at step 0 "
        f"would cut them. To continue it, {how_to_resume}; to train it again from step 0, pass "
        "resume=True; or write into a new pair folder"
    )


def _weights_steps(arm_dir: str | Path) -> list[int]:
    checkpoints = as_arm_folder(arm_dir).checkpoints_dir
    if not checkpoints.is_dir():
        return []
    return [s for s in (weights_step(p.name) for p in checkpoints.iterdir()) if s is not None]
