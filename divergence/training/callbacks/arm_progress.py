"""What a comparator needs from an arm trained as its own job: losses, and where the arm stands.

Writes, from global rank zero, ``<arm folder>/losses.jsonl`` (the loss of every step, see
``divergence.pairfolder.arm.losses``) and ``<arm folder>/status.json`` (``running`` when training
starts, ``finished`` or ``failed`` when it ends; see ``divergence.pairfolder.arm.status``).

A restarted arm resumes from its last ``last.ckpt`` at step G and recomputes the steps after
G, so first it removes what the interrupted attempt left of them (loss lines, weights files
of later steps), then it writes a status with ``attempt`` + 1 and ``start_step`` G: a
comparator that stored steps after G from the old attempt recomputes them, as the lockstep
tracker does after a resume.

Must come before the resumable checkpoint in the callback list: the loss of a step is on
disk before a ``last.ckpt`` that resumes after it.

A thin adapter: the arm side of the contract (status, losses, the step order, a restart's cut) is
``divergence.pairfolder.arm.journal.ArmJournal``, the journal ``divergence.writers.ArmWriter`` keeps
too; this callback only reads the trainer (its step, world size, ``max_steps``) and the module
(the step's loss, the weights' names). It is not built on ``ArmWriter`` itself, which also writes
``pair.json``, the weights files and takes the arm's lock: here ``WeightCheckpoint`` writes the
weights (gathered under FSDP, with the arm's recipe in their metadata, also at
``checkpoint_every`` steps), and ``divergence.training.separate_arm.train_arm`` writes
``pair.yaml``/``pair.json`` and holds the lock (``pairfolder.arm.lock``) before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lightning.pytorch.callbacks import Callback

from divergence.pairfolder.folder import ArmFolder
from divergence.pairfolder.arm.journal import ArmJournal
from divergence.training.tensor_parallel import data_parallel


class ArmProgress(Callback):
    """Arm ``arm``'s progress: ``loss(pl_module)`` (the step's loss, averaged over ranks) and
    ``tensor_order(pl_module)`` (its weights' names in order), for any LightningModule."""

    def __init__(
        self,
        arm_folder: ArmFolder | str | Path,
        arm: str,
        per_rank_batch: int | None = None,
        *,
        loss: Callable[[object], float],
        tensor_order: Callable[[object], list],
        router_drop: Callable[[object], float | None] | None = None,
    ):
        """``per_rank_batch``: examples per optimizer step on one rank (``batch_size x accumulate``);
        the status records ``global_batch`` = that x the world size (null when not given).
        ``router_drop(pl_module)``: the step's capacity-drop fraction over every rank (called on
        every rank, it may reduce), written beside the loss; None for an arm without experts."""
        self.journal = ArmJournal(arm_folder, arm, max_steps=None)
        self.arm_folder, self.arm, self.per_rank_batch = self.journal.arm_folder, arm, per_rank_batch
        self.loss, self.tensor_order, self.router_drop = loss, tensor_order, router_drop
        self._saving: int | None = None  # the step of a resumable checkpoint being written

    @property
    def status(self):
        """The arm's ``ArmStatus`` as written (rank zero, once training started; else None)."""
        return self.journal.status

    def on_train_start(self, trainer, pl_module) -> None:
        start = trainer.global_step
        self.journal.max_steps = trainer.max_steps if trainer.max_steps > 0 else None
        self.journal.resume_at(start, initial=False)  # step 0 has no loss: the first is start + 1
        if not trainer.is_global_zero:
            return
        self.journal.start(
            start,
            world_size=trainer.world_size,
            tensor_order=list(self.tensor_order(pl_module)),
            global_batch=self.per_rank_batch * data_parallel(trainer)[1] if self.per_rank_batch else None,
            max_steps=trainer.max_steps,
        )

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._saving = trainer.global_step  # written after this hook returns: said at the next step's end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero and self._saving is not None:
            self.journal.checkpointed(self._saving)  # a restart resumes there or later (tracking.keep)
            self._saving = None
        where = f"{self.arm_folder}: step {trainer.global_step}"  # checked on every rank: every rank stops alike
        step = self.journal.check(trainer.global_step, where)
        drop = self.router_drop(pl_module) if self.router_drop is not None else None  # every rank: it reduces
        if trainer.is_global_zero:
            self.journal.append(step, self.loss(pl_module), where, router_drop=drop)
        self.journal.advance(step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._end(trainer, "finished")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._end(trainer, "failed")

    def _end(self, trainer, state: str) -> None:
        if trainer.is_global_zero:
            self.journal.end(state, trainer.global_step)
