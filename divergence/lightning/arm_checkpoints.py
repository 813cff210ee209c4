"""``ArmCheckpoints``: one arm of a pair, trained by your own LightningModule as its own job.

::

    trainer = Trainer(max_steps=1000, callbacks=[ArmCheckpoints("runs/pair", "a", every=50)])
    trainer.fit(MyModule(attention="flash"), loader)       # job 1; job 2: arm "b"
    # meanwhile, or afterwards:  divergence watch runs/pair

The callback is an ``ArmWriter`` driven by Lightning's hooks (see
``divergence.writers.arm_writer`` for the files): the loss of each optimizer step (the mean
over its accumulated micro-batches, averaged over ranks), the weights at step 0, every
``every`` steps and at the last step, and the arm's status (running, finished, failed).
Nothing is asked of the module: the loss is ``training_step``'s returned loss (or what the
``loss`` function takes from its output), the weights are the module's own (or those of its
submodule ``module``, e.g. ``"unet"``), gathered from every rank under FSDP. Only global
rank zero writes. A run resumed from a checkpoint at step G starts a new attempt from G.

Put it before a ``ModelCheckpoint`` in the callback list, so a step's weights exist before
a resumable checkpoint of that step does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from lightning.pytorch.callbacks import Callback

from divergence.errors import UserInputError
from divergence.lightning.gather import gather_state, max_steps, submodule
from divergence.pairfolder.pair_json import DEFAULT_EVERY
from divergence.writers.arm_writer import ArmWriter


def step_loss(outputs) -> torch.Tensor:
    """The loss in what ``training_step`` returned: the tensor itself or its ``"loss"`` entry."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if not isinstance(loss, torch.Tensor):
        raise UserInputError(f"ArmCheckpoints: training_step returned {type(outputs).__name__}, not a loss "
                             "tensor or a dict with 'loss'; pass loss=<function of the output>")
    return loss.detach().float()


class ArmCheckpoints(Callback):
    """Write arm ``arm`` of the pair folder ``out`` from any LightningModule.

    Parameters
    ----------
    out : the pair folder both arms train into.
    arm : ``"a"`` or ``"b"``.
    every : compare the arms' weights every ``every`` optimizer steps (and at 0 and the last).
    module : the submodule whose weights are compared (``"unet"``); default the whole module.
    loss : ``training_step output -> loss tensor``; default ``step_loss``.
    **pair : ``pair.json`` fields for the arm that starts first (``name``, ``category``,
        ``arms``, ``description``, ``replicate``, ``log``); see ``write_pair_files``.
    """

    def __init__(self, out: str | Path, arm: str, every: int = DEFAULT_EVERY, module: str | None = None,
                 loss: Callable | None = None, **pair):
        self.out, self.arm, self.every, self.module = Path(out), arm, every, module or ""
        self.loss_of, self.pair = loss or step_loss, pair
        self.writer: ArmWriter | None = None
        self._losses: list[torch.Tensor] = []
        self._step = 0

    # -- Lightning hooks -------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        submodule(pl_module, self.module)  # a wrong name fails before any file is written
        self._step = trainer.global_step
        self.writer = ArmWriter(self.out, self.arm, max_steps=max_steps(trainer), every=self.every,
                                start_step=self._step, rank=trainer.global_rank, **self.pair)
        if self.writer.tracked(self._step):  # step 0, or the resumed step (its file may have been cut)
            self._save(trainer, pl_module, self._step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._losses.append(self.loss_of(outputs))
        step = trainer.global_step
        if step == self._step:
            return  # a micro-batch of a step still accumulating gradients
        loss = trainer.strategy.reduce(torch.stack(self._losses).mean(), reduce_op="mean")  # every rank
        self._losses, self._step = [], step
        if self.writer.tracked(step):
            self._save(trainer, pl_module, step)
        self.writer.record(step, None, float(loss))

    def on_train_end(self, trainer, pl_module) -> None:
        self.writer.finish()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.writer is not None:
            self.writer.finish("failed")

    # -- helpers -----------------------------------------------------------------------------
    def _save(self, trainer, pl_module, step: int) -> None:
        weights = gather_state(trainer, pl_module, self.module)  # collective under FSDP
        if weights is not None:
            self.writer.save(step, self.writer.weights(weights))
