"""``ArmJournal``: the arm side of the pair-folder contract, written once for every arm writer.

An arm trained as its own job leaves, in its folder (``divergence.pairfolder.ArmFolder``):

- ``status.json`` (``divergence.pairfolder.arm.status``): ``running`` from each (re)start, with
  its attempt, then ``finished`` or ``failed`` with the last step;
- ``losses.jsonl`` (``divergence.pairfolder.arm.losses``): one loss per optimizer step, in order;
- and, at a restart from step G, nothing of the steps after G (``drop_after``: the arm computes
  them again, and ``divergence watch`` follows the new attempt).

Every writer of an arm keeps this journal through ``divergence.writers.ArmWriter`` (for any loop;
through it Lightning's ``ArmCheckpoints``, the built-in trainer's arms and the transformers
callback), so the step rules (``docs/pair-folder.md``, "The step rules every arm writer checks";
``pairfolder.arm.steps``) are checked in one place, the step on every rank. Only global rank zero
calls ``start``, ``append`` and ``end``; ``ArmWriter`` also writes the weights files and holds the
arm's lock (``pairfolder.arm.lock.ArmLock``).

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
from divergence.pairfolder.arm.steps import check_step, check_tensor_names, loss_value
from divergence.pairfolder.arm.weights_dcp import remove_weights
from divergence.pairfolder.folder import ArmFolder, as_arm_folder, weight_steps


class ArmJournal:
    """The journal of arm ``arm`` in arm folder ``arm_dir``: its steps (every rank), its status and
    losses (rank zero's ``start``, ``append``, ``end``)."""

    def __init__(self, arm_dir: ArmFolder | str | Path, arm: str, *, max_steps: int | None, stride: int = 1):
        """``max_steps``: the last step (None: no limit); ``stride``: steps counted per record."""
        self.arm_folder, self.arm, self.max_steps, self.stride = as_arm_folder(arm_dir), arm, max_steps, stride
        self.status: ArmStatus | None = None
        self.losses = LossFile(self.arm_folder)
        self.last_step, self.next_step = 0, 0  # the step recorded (or resumed from) last, and the one expected next

    def resume_at(self, start_step: int, *, initial: bool) -> None:
        """Expect the steps after ``start_step`` next; ``initial``: ``start_step`` itself first (a fresh
        start whose writer records step 0, the initial weights)."""
        self.last_step = start_step
        self.next_step = start_step if initial else start_step + self.stride

    def start(
        self,
        start_step: int,
        *,
        world_size: int,
        tensor_order: list | None = None,
        global_batch: int | None = None,
        max_steps: int | None = None,
    ) -> ArmStatus:
        """Rank zero, at a (re)start from ``start_step``: cut the records of later steps, then write
        ``status.json`` with the next attempt. ``tensor_order``: the weights' names when known now;
        else a restart keeps the earlier attempt's (a fresh start learns them at its first save).
        ``max_steps``: what the status records, when not the journal's (Lightning's -1: no limit)."""
        previous = ArmStatus.read(self.arm_folder)
        drop_after(self.arm_folder, start_step)
        if tensor_order is None:
            tensor_order = previous.tensor_order if previous is not None and start_step > 0 else []
        self.status = ArmStatus(
            self.arm,
            attempt=previous.attempt + 1 if previous is not None else 1,
            start_step=start_step,
            checkpoint_step=start_step,  # resumed from it (or, at step 0, started over from nothing)
            max_steps=self.max_steps if max_steps is None else max_steps,
            world_size=world_size,
            tensor_order=list(tensor_order),
            global_batch=global_batch,
        )
        self.status.write(self.arm_folder)
        return self.status

    def check(self, step, where: str | None = None) -> int:
        """``step`` when it is the one recorded next (``steps.check_step``), else a one-line error."""
        return check_step(
            step,
            expected=self.next_step,
            max_steps=self.max_steps,
            stride=self.stride,
            where=where or f"{self.arm_folder}: step {step!r}",
        )

    def advance(self, step: int) -> None:
        """``step`` is recorded: the next one is ``step + stride``."""
        self.last_step, self.next_step = step, step + self.stride

    def append(self, step: int, loss, where: str, router_drop: float | None = None) -> None:
        """Rank zero: the loss of ``step`` into ``losses.jsonl`` (read as a number: a device sync), with
        the arm's training drop fraction where it has MoE layers."""
        self.losses.append(step, loss_value(loss, where), router_drop)

    def check_tensors(self, names, step: int) -> None:
        """The weights of tracked step ``step`` hold the names of the first (which ``status.json`` records)."""
        if not self.status.tensor_order:
            self.status.tensor_order = list(names)
            self.status.write(self.arm_folder)
        else:
            check_tensor_names(names, self.status.tensor_order, step, f"{self.arm_folder}")

    def checkpointed(self, step: int) -> None:
        """Rank zero: a resumable checkpoint of ``step`` is saved, so a restart resumes at ``step`` or
        later (``status.json``'s ``checkpoint_step``: ``divergence watch`` with ``tracking.keep``
        deletes no weights file after it)."""
        if self.status is not None and step != self.status.checkpoint_step:
            self.status.checkpoint_step = step
            self.status.write(self.arm_folder)

    def end(self, state: str, last_step: int) -> None:
        """Rank zero: ``status.json`` says ``state`` (``finished`` or ``failed``) at ``last_step``."""
        if self.status is not None:
            self.status.state, self.status.last_step = state, last_step
            self.status.write(self.arm_folder)


def drop_after(arm_dir: str | Path, step: int) -> None:
    """Remove the loss lines and weights files of the steps after ``step`` (a restart recomputes them).

    The loss file is read whole first: an unreadable line is an error and nothing is cut.
    """
    arm_folder = as_arm_folder(arm_dir)
    LossFile(arm_folder).truncate_after(step)
    for s in weight_steps(arm_folder):
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
    later = [s for s in (*losses, *weight_steps(arm_dir)) if s > start_step]  # a loss or weights file after it
    if not later:
        return
    status = ArmStatus.read(arm_dir)
    state = f" ({status.state}, attempt {status.attempt})" if status is not None else ""
    raise UserInputError(
        f"{arm_dir}: already holds arm {arm}'s records up to step {max(later)}{state}; starting at step 0 "
        f"would cut them. To continue it, {how_to_resume}; to train it again from step 0, pass "
        "resume=True; or write into a new pair folder"
    )
