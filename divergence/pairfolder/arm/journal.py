"""``ArmJournal``: the arm side of the pair-folder contract, written once for every arm writer.

An arm trained as its own job leaves, in its folder (``divergence.pairfolder.ArmFolder``):

- ``status.json`` (``divergence.pairfolder.arm.status``): ``running`` from the (re)start, with the
  attempt (1, then + 1 at every restart), the step it started from, ``max_steps``, the world size,
  the weights' names in order (``tensor_order``) and, when known, the global batch; ``finished`` or
  ``failed`` with the last step at the end;
- ``losses.jsonl`` (``divergence.pairfolder.arm.losses``): one loss per optimizer step, in order;
- and, at a restart from step G, nothing of the steps after G (``records.drop_after``: the
  arm computes them again, and ``divergence watch`` follows the new attempt).

Every writer of an arm keeps this journal through ``divergence.writers.ArmWriter`` (for any loop;
through it Lightning's ``ArmCheckpoints``, the built-in trainer's arms and the transformers
callback), so the step rules (``docs/pair-folder.md``, "The step rules every arm writer checks";
``pairfolder.arm.steps``) are checked in one place, the step on every rank. Only global rank zero
calls ``start``, ``append`` and ``end``; ``ArmWriter`` also writes the weights files and holds the
arm's lock (``pairfolder.arm.lock.ArmLock``).
"""

from __future__ import annotations

from pathlib import Path

from divergence.pairfolder.arm.steps import check_step, check_tensor_names, loss_value
from divergence.pairfolder.folder import ArmFolder, as_arm_folder
from divergence.pairfolder.arm.records import drop_after
from divergence.pairfolder.arm.status import ArmStatus
from divergence.pairfolder.arm.losses import LossFile


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
