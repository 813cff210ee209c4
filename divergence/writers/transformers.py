"""``ArmWriterCallback``: one arm of a pair trained with the transformers ``Trainer``.

::

    args = TrainingArguments(output_dir="out/a", max_steps=1000, logging_steps=1, ...)
    Trainer(model, args, train_dataset=data,
            callbacks=[ArmWriterCallback("runs/pair", "a", every=50)]).train()
    # the other job: arm "b"; then  divergence watch runs/pair

An ``ArmWriter`` (``divergence.writers.arm_writer``) driven by the Trainer's events: the
model's weights at step 0 (``on_train_begin``), at every tracked step (``on_step_end``), and
each step's loss from the Trainer's own log (``on_log``: the mean over the step's
micro-batches and processes), and each resumable checkpoint the Trainer saves (``on_save``). That is why ``logging_steps=1`` is required: with a longer
interval the Trainer logs only the mean of several steps. Only the main process writes; the
weights are ``model.state_dict()`` of the main process (DDP replicas; FSDP and DeepSpeed
shards are not gathered here).

Non-finite losses are stored as they are. The Trainer's ``logging_nan_inf_filter`` (on by
default) logs a NaN or infinite step loss as the mean of the earlier ones, so the log alone
would hide a diverged step. The callback therefore also reads the loss the model returns
(a forward hook on the model, in training mode: ``output.loss``), on every process, and
when any micro-batch of the step on any process was NaN or infinite it stores the step's
loss as that (NaN when a NaN is among them, else the infinity). Where the model's output
holds no loss (a ``compute_loss`` of your own, a label smoother), it cannot see them: then
``logging_nan_inf_filter=False`` is required, and the logged loss is exact.

A fresh ``train()`` into an arm folder holding records of later steps is refused: resume it
(``train(resume_from_checkpoint=...)``), or pass ``resume=True`` to train it again from step 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import TrainerCallback

from divergence.errors import UserInputError, in_script
from divergence.pairfolder.pair_json import DEFAULT_EVERY
from divergence.writers.arm_writer import ArmWriter
from divergence.writers.every_rank import on_every_rank


class _Writer(ArmWriter):
    how_to_resume = "resume the Trainer from its checkpoint (trainer.train(resume_from_checkpoint=...))"


class ArmWriterCallback(TrainerCallback):
    """Write arm ``arm`` of the pair folder ``out``; ``module``: compare only this submodule;
    ``resume``: train the arm again from step 0 into an arm folder that holds its records."""

    def __init__(
        self,
        out: str | Path,
        arm: str,
        every: int = DEFAULT_EVERY,
        module: str | None = None,
        resume: bool = False,
        **pair,
    ):
        self.out, self.arm, self.module = Path(out), arm, module
        self.options = dict(pair, every=every, resume=resume)  # the ArmWriter options given
        self.writer: ArmWriter | None = None
        self._hook = None
        self._seen: list[torch.Tensor] = []  # the step's micro-batch losses as the model returned them
        self._nonfinite: dict[int, float] = {}  # step -> its loss, when not finite

    @in_script
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.logging_steps != 1 or args.logging_strategy != "steps":
            raise UserInputError(
                f"TrainingArguments(logging_steps={args.logging_steps}, logging_strategy="
                f"{getattr(args.logging_strategy, 'value', args.logging_strategy)}): ArmWriterCallback needs each "
                "step's loss; "
                "set logging_steps=1 and logging_strategy='steps'"
            )
        self.writer = on_every_rank(
            lambda: _Writer(
                self.out,
                self.arm,
                max_steps=state.max_steps,
                start_step=state.global_step,
                rank=0 if state.is_world_process_zero else 1,
                **self.options,
            )
        )
        self._hook = model.register_forward_hook(self._capture)
        self._save(state.global_step, model)
        if state.global_step == 0:
            self.writer.record(0)  # its weights are saved: step 0 is recorded

    @in_script
    def on_step_end(self, args, state, control, model=None, **kwargs):
        loss = _step_nonfinite(self._seen, getattr(args, "device", None))  # every process: a collective
        if loss is None and not self._seen and getattr(args, "logging_nan_inf_filter", False):
            self.writer.finish("failed")  # the Trainer has no exception hook: release the arm now
            raise UserInputError(
                "ArmWriterCallback: the model's output holds no loss (a compute_loss of your own, "
                "or a label smoother?), so a NaN or infinite loss would be logged as the mean of "
                "the earlier ones; set TrainingArguments(logging_nan_inf_filter=False)"
            )
        self._seen = []
        if loss is not None:
            self._nonfinite[state.global_step] = loss
        self._save(state.global_step, model)

    @in_script
    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        if logs and "loss" in logs and step >= self.writer.next_step:
            self.writer.record(step, None, self._nonfinite.pop(step, logs["loss"]))

    @in_script
    def on_save(self, args, state, control, **kwargs):
        """The Trainer saved a resumable checkpoint of ``state.global_step`` (``checkpoint-N/``): a
        restart resumes there or later, which ``divergence watch`` needs to keep the weights files
        a restart recomputes (``tracking.keep``; ``ArmWriter.checkpointed``)."""
        if state.global_step <= self.writer.last_step:
            self.writer.checkpointed(state.global_step)

    @in_script
    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
        self.writer.finish()

    def _capture(self, module, inputs, output) -> None:
        if not module.training:
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._seen.append(loss.detach().reshape(()).float())

    def _save(self, step: int, model) -> None:
        if not self.writer.is_writer or not self.writer.tracked(step) or self.writer.saved_step == step:
            return
        target = model.get_submodule(self.module) if self.module else model
        self.writer.save(step, self.writer.weights(target))


def _step_nonfinite(losses: list[torch.Tensor], device) -> float | None:
    """The step's loss when a micro-batch loss on any process was NaN or infinite, else None.

    NaN when a NaN (or both infinities) is among them, else the infinity they hold: the value
    their mean has. Under ``torch.distributed`` the three flags are summed over processes
    (every process calls this once per step).
    """
    device = device if device is not None else losses[0].device if losses else "cpu"  # one device on every rank
    flags = torch.zeros(3, dtype=torch.float64, device=device)
    for loss in losses:
        flags += torch.stack([loss.isnan(), loss == math.inf, loss == -math.inf]).to(flags)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(flags)
    nan, pos, neg = (bool(f) for f in flags.tolist())
    if nan or (pos and neg):
        return math.nan
    return math.inf if pos else -math.inf if neg else None
