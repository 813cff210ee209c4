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
rank zero writes; with ``format="dcp"`` every rank writes its shards of each tracked step into a
DCP folder instead (no gather; rank zero marks it complete). A run resumed from a checkpoint at step G starts a new attempt from G. A Trainer with no finite
length (an iterable dataset, no ``max_steps``) trains an open-ended arm: its last step is where
``fit`` ends, its weights saved then (``divergence.writers.arm_writer``). A Trainer stopped early
by a callback (``EarlyStopping``: ``trainer.should_stop``) finishes the arm at the step reached, its
weights saved there; ``divergence watch`` ends the pair there once both arms stopped at it.

Put it before a ``ModelCheckpoint`` in the callback list, so a step's weights exist before
a resumable checkpoint of that step does.

A fresh ``fit`` (global step 0) into an arm folder that holds records of later steps is refused
(a re-run would cut them): resume the Trainer from its checkpoint (``fit(ckpt_path=...)``), or
pass ``resume=True`` to train the arm again from step 0.

Steps are Lightning's ``global_step``. A module with manual optimization moves it once per
optimizer step: with k optimizers each stepped once per batch, the arm records steps 0, k, 2k,
... (``stride`` k in ``pair.json``'s ``tracking``, read by ``divergence watch``), ``max_steps`` must
be a multiple of k, and a weights file is saved at the first recorded step at or after each
scheduled one (``divergence.pairfolder.arm.steps.tracked_with_stride``). A batch that moves
``global_step`` by anything else (an optimizer skipped) is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from lightning.pytorch.callbacks import Callback

from divergence.errors import UserInputError, in_script
from divergence.lightning.gather import gather_state, max_steps, sharded_state, submodule
from divergence.pairfolder.arm.steps import check_loss
from divergence.pairfolder.pair_json import DEFAULT_EVERY
from divergence.writers.arm_writer import ArmWriter
from divergence.writers.every_rank import on_every_rank


def step_loss(outputs) -> torch.Tensor:
    """The loss in what ``training_step`` returned: the tensor itself or its ``"loss"`` entry."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if not isinstance(loss, torch.Tensor):
        raise UserInputError(
            f"ArmCheckpoints: training_step returned {_described(outputs)}, not a loss tensor or a "
            "dict with 'loss'; return the loss, or pass loss=<function of the output>"
        )
    return loss.detach().float()


def _described(outputs) -> str:
    """What ``training_step`` returned, in words (Lightning hands ``{}`` on for a returned None)."""
    if isinstance(outputs, dict):
        if not outputs:
            return "nothing (None, which Lightning passes on as {}, so it skipped the step)"
        return "a dict without a 'loss' tensor (keys: " + ", ".join(map(str, list(outputs)[:5])) + ")"
    return f"a {type(outputs).__name__}"


class ArmCheckpoints(Callback):
    """Write arm ``arm`` of the pair folder ``out`` from any LightningModule.

    Parameters
    ----------
    out : the pair folder both arms train into.
    arm : ``"a"`` or ``"b"``.
    every : compare the arms' weights every ``every`` optimizer steps (and at 0 and the last).
    module : the submodule whose weights are compared (``"unet"``); default the whole module.
    loss : ``training_step output -> loss tensor``; default ``step_loss``.
    resume : train the arm again from step 0 into an arm folder that holds its records.
    format : ``"safetensors"`` (default: the weights gathered to rank zero, one file a step) or
        ``"dcp"``: under a sharded strategy (``ModelParallelStrategy``'s FSDP2, ``FSDPStrategy``)
        every rank writes its own shards into the step's DCP folder, nothing gathered
        (``gather.sharded_state``, ``divergence.pairfolder.arm.weights_dcp``).
    **options : ``ArmWriter``'s keyword options: ``pair.json``'s fields for the arm that starts
        first (``name``, ``category``, ``arms``, ``description``, ``replicate``, ``dense``, ``log``,
        ``keep``, ...), ``global_batch``, ``weights`` (``module -> {name: tensor}``).

    A subclass may replace ``step_loss`` (the step's loss) and ``router_drop`` (a mixture of
    experts' capacity drops), as the built-in trainer's arms do
    (``divergence.training.callbacks.arm_files``).
    """

    def __init__(
        self,
        out: str | Path,
        arm: str,
        every: int = DEFAULT_EVERY,
        module: str | None = None,
        loss: Callable | None = None,
        resume: bool = False,
        format: str = "safetensors",
        **options,
    ):
        self.out, self.arm, self.module, self.loss_of = Path(out), arm, module or "", loss or step_loss
        self.options = dict(options, every=every, resume=resume, format=format)  # the ArmWriter options given
        self.writer: ArmWriter | None = None
        self._losses: list[torch.Tensor] = []
        self._step = 0
        self._saving: int | None = None  # the step of a resumable checkpoint being written

    # -- Lightning hooks -------------------------------------------------------------------
    @in_script
    def on_train_start(self, trainer, pl_module) -> None:
        submodule(pl_module, self.module)  # a wrong name fails before any file is written
        self._step = trainer.global_step
        stride = 1 if pl_module.automatic_optimization else max(1, len(trainer.optimizers))
        self.writer = on_every_rank(  # checks and writes on rank 0 only; its one-line error raised on every rank
            lambda: _Writer(
                self.out,
                self.arm,
                max_steps=max_steps(trainer, stride, required=False),
                start_step=self._step,
                stride=stride,
                rank=trainer.global_rank,
                **self.options,
            ),
        )
        if self.writer.tracked(self._step):  # step 0, or the resumed step (its file may have been cut)
            self._save(trainer, pl_module, self._step)
        if self._step == 0:
            self.writer.record(0)  # its weights are saved: step 0 is recorded

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._saving = trainer.global_step  # written after this hook returns: said at the next batch's end

    @in_script
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._saving is not None and self.writer is not None:
            self.writer.checkpointed(self._saving)  # a restart resumes there or later (tracking.keep)
            self._saving = None
        loss = self.step_loss(trainer, pl_module, outputs)
        step = trainer.global_step
        if step == self._step:
            return  # a micro-batch of a step still accumulating gradients
        self._step = step
        self.writer.check(step, f"ArmCheckpoints: global_step {step} after a batch")  # before any file is written
        if self.writer.tracked(step):
            self._save(trainer, pl_module, step)
        self.writer.record(step, None, loss, router_drop=self.router_drop(pl_module))

    @in_script
    def on_train_end(self, trainer, pl_module) -> None:
        last = self.writer.last_step
        early = bool(trainer.should_stop) and last > 0  # a callback stopped fit: a finish at the step reached
        if (self.writer.max_steps is None or early) and last > 0 and not self.writer.tracked(last):
            self._save(trainer, pl_module, last)  # a run that ends off the schedule is compared there (every rank)
        self.writer.finish("finished" if early else None)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.writer is not None:
            self.writer.finish("failed")

    # -- what a subclass may replace ---------------------------------------------------------
    def step_loss(self, trainer, pl_module, outputs):
        """Every rank, after each batch: the loss of the optimizer step it ended (the mean over the
        step's micro-batches, averaged over ranks), or None while the step still accumulates."""
        loss = self.loss_of(outputs)
        check_loss(loss, "ArmCheckpoints: the loss of a batch")  # one value: a vector is not averaged away
        self._losses.append(torch.as_tensor(loss, dtype=torch.float32).reshape(()))
        if trainer.global_step == self._step:
            return None
        loss = trainer.strategy.reduce(torch.stack(self._losses).mean(), reduce_op="mean")  # every rank
        self._losses = []
        return loss

    def router_drop(self, pl_module) -> float | None:
        """Every rank, once a step: the fraction of expert choices dropped by capacity (None: no experts)."""
        return None

    # -- helpers -----------------------------------------------------------------------------
    def _save(self, trainer, pl_module, step: int) -> None:
        if self.writer.dcp:  # every rank its shards (a collective save)
            weights = self.writer.weights(sharded_state(trainer, pl_module, self.module))
        else:  # collective under FSDP
            weights = gather_state(trainer, pl_module, self.module, self.writer.weights)
        if weights is not None:
            self.writer.save(step, weights)


class _Writer(ArmWriter):
    how_to_resume = "resume the Trainer from its checkpoint (trainer.fit(module, data, ckpt_path=...))"
