"""``ArmWriterCallback``: one arm of a pair trained with the transformers ``Trainer``.

::

    args = TrainingArguments(output_dir="out/a", max_steps=1000, logging_steps=1, ...)
    Trainer(model, args, train_dataset=data,
            callbacks=[ArmWriterCallback("runs/pair", "a", every=50)]).train()
    # the other job: arm "b"; then  divergence watch runs/pair

An ``ArmWriter`` (``divergence.writers.arm_writer``) driven by the Trainer's events: the
model's weights at step 0 (``on_train_begin``), at every tracked step (``on_step_end``), and
each step's loss from the Trainer's own log (``on_log``: the mean over the step's
micro-batches and processes). That is why ``logging_steps=1`` is required: with a longer
interval the Trainer logs only the mean of several steps. Only the main process writes; the
weights are ``model.state_dict()`` of the main process (DDP replicas; FSDP and DeepSpeed
shards are not gathered here).
"""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from divergence.errors import UserInputError
from divergence.pairfolder.pair_json import DEFAULT_EVERY
from divergence.writers.arm_writer import ArmWriter


class ArmWriterCallback(TrainerCallback):
    """Write arm ``arm`` of the pair folder ``out``; ``module``: compare only this submodule."""

    def __init__(self, out: str | Path, arm: str, every: int = DEFAULT_EVERY, module: str | None = None, **pair):
        self.out, self.arm, self.every, self.module, self.pair = Path(out), arm, every, module, pair
        self.writer: ArmWriter | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.logging_steps != 1 or args.logging_strategy != "steps":
            raise UserInputError(f"TrainingArguments(logging_steps={args.logging_steps}, logging_strategy="
                                 f"{args.logging_strategy!s}): ArmWriterCallback needs each step's loss; "
                                 "set logging_steps=1 and logging_strategy='steps'")
        self.writer = ArmWriter(self.out, self.arm, max_steps=state.max_steps, every=self.every,
                                start_step=state.global_step, rank=0 if state.is_world_process_zero else 1,
                                **self.pair)
        self._save(state.global_step, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._save(state.global_step, model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        if logs and "loss" in logs and step > self.writer.last_step:
            self.writer.record(step, None, float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        self.writer.finish()

    def _save(self, step: int, model) -> None:
        if not self.writer.is_writer or not self.writer.tracked(step) or self.writer.saved_step == step:
            return
        target = model.get_submodule(self.module) if self.module else model
        self.writer.save(step, self.writer.weights(target))
