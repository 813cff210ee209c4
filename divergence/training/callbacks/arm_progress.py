"""What a comparator needs from an arm trained as its own job: losses, and where the arm stands.

Writes, from global rank zero, ``<arm folder>/losses.jsonl`` (the loss of every step, see
``divergence.store.losses``) and ``<arm folder>/status.json`` (``running`` when training
starts, ``finished`` or ``failed`` when it ends; see ``divergence.store.arm_status``).

A restarted arm resumes from its last ``last.ckpt`` at step G and recomputes the steps after
G, so first it removes what the interrupted attempt left of them (loss lines, weights files
of later steps), then it writes a status with ``attempt`` + 1 and ``start_step`` G: a
comparator that stored steps after G from the old attempt recomputes them, as the lockstep
tracker does after a resume.

Must come before the resumable checkpoint in the callback list: the loss of a step is on
disk before a ``last.ckpt`` that resumes after it.

The rules every arm writer shares (``divergence.pairfolder``): each step recorded once and in
order (``arm_steps.check_step``), the loss a number (NaN and infinities stored as they are), a
restart's cut (``arm_records.drop_after``). The arm's lock (one writer per arm) is taken by
``divergence.training.separate_arm.train_arm`` before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lightning.pytorch.callbacks import Callback

from divergence.store.arm_records import drop_after
from divergence.pairfolder.arm_steps import check_step, loss_value
from divergence.store.arm_status import ArmStatus
from divergence.store.losses import LossFile


class ArmProgress(Callback):
    """Arm ``arm``'s progress: ``loss(pl_module)`` (the step's loss, averaged over ranks) and
    ``tensor_order(pl_module)`` (its weights' names in order), for any LightningModule."""

    def __init__(
        self,
        folder: str | Path,
        arm: str,
        per_rank_batch: int | None = None,
        *,
        loss: Callable[[object], float],
        tensor_order: Callable[[object], list],
    ):
        """``per_rank_batch``: examples per optimizer step on one rank (``batch_size x accumulate``);
        the status records ``global_batch`` = that x the world size (null when not given)."""
        self.folder, self.arm, self.per_rank_batch = Path(folder), arm, per_rank_batch
        self.loss, self.tensor_order = loss, tensor_order
        self.losses = LossFile(self.folder)
        self.status: ArmStatus | None = None
        self._next = 1  # the step whose loss comes next

    def on_train_start(self, trainer, pl_module) -> None:
        start = trainer.global_step
        self._next = start + 1
        if not trainer.is_global_zero:
            return
        drop_after(self.folder, start)
        previous = ArmStatus.read(self.folder)
        self.status = ArmStatus(
            arm=self.arm,
            attempt=previous.attempt + 1 if previous else 1,
            start_step=start,
            max_steps=trainer.max_steps,
            world_size=trainer.world_size,
            tensor_order=list(self.tensor_order(pl_module)),
            global_batch=self.per_rank_batch * trainer.world_size if self.per_rank_batch else None,
        )
        self.status.write(self.folder)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        where = f"{self.folder}: step {trainer.global_step}"  # checked on every rank: every rank stops alike
        limit = trainer.max_steps if trainer.max_steps > 0 else None
        step = check_step(trainer.global_step, expected=self._next, max_steps=limit, where=where)
        if trainer.is_global_zero:
            self.losses.append(step, loss_value(self.loss(pl_module), where))
        self._next = step + 1

    def on_train_end(self, trainer, pl_module) -> None:
        self._end(trainer, "finished")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._end(trainer, "failed")

    def _end(self, trainer, state: str) -> None:
        if trainer.is_global_zero and self.status is not None:
            self.status.state, self.status.last_step = state, trainer.global_step
            self.status.write(self.folder)
