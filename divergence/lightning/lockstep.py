"""``LockstepPair``: two of your LightningModules trained side by side on the identical batch.

::

    pair = LockstepPair(MyModule(attention="flash"), MyModule(attention="baseline"),
                        out="runs/flash-vs-baseline", every=10)
    Trainer(max_steps=500).fit(pair, loader)

Each optimizer step, for arm a then arm b: the global RNG state is set to the state saved
before arm a's step (``rng_state``), the arm's own ``training_step`` computes
its loss on the batch, gradients are cleared, ``manual_backward`` runs, the arm's own
optimizers (from its own ``configure_optimizers``) step, and its step-interval LR schedulers
step. Both arms see the same batch and draw the same noise, timesteps and dropout masks, so
two copies of one module (a control pair) stay bitwise equal, and the pair tracker
(``pair_tracker``) compares their weights at step 0, every ``every`` steps and the last step.

What is used of your modules: ``training_step``, ``configure_optimizers`` and ``log`` (a
module's ``self.log("loss", x)`` arrives as ``a/loss`` or ``b/loss``). Other hooks of theirs
are not called, and Lightning's automatic-optimization options (``gradient_clip_val``,
``accumulate_grad_batches``) do not apply: pass ``gradient_clip_val`` here. ``global_step``
counts batches (each arm steps once per batch). A ``training_step`` must not change the
batch in place: arm b gets the same objects after arm a.

``out`` holds one pair, written by one process at a time: a second ``LockstepPair`` (or any
other writer) on a folder being written is refused naming the holder's pid. A folder whose ``pair.json`` names another pair is refused; so is a
fresh ``fit`` into a folder whose store already holds steps (it would cut them), unless
``resume=True`` says to train the pair again from step 0 (its stored steps are replaced). To
continue a pair, resume the Trainer from its checkpoint (``fit(pair, data, ckpt_path=...)``):
the stored steps after the checkpoint's step are dropped and computed again.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.core.optimizer import do_nothing_closure

from divergence.errors import UserInputError
from divergence.lightning.arm_checkpoints import step_loss
from divergence.lightning.gather import gather_state, submodule
from divergence.lightning.tracker import DivergenceTracker, mean_over_ranks
from divergence.pairfolder.pair_json import DEFAULT_EVERY
from divergence.tracking.pair_tracker import PairTracker
from divergence.tracking.records import ARMS
from divergence.writers.arm_writer import state_weights

RESTART_ADVICE = (
    "To continue it, resume the Trainer from its checkpoint (trainer.fit(pair, data, ckpt_path=...)); to train "
    "it again from step 0, pass LockstepPair(..., resume=True)"
)


class LockstepPair(pl.LightningModule):
    """Train ``module_a`` and ``module_b`` in lockstep and track how far apart their weights move.

    Parameters
    ----------
    module_a, module_b : your LightningModules (automatic optimization), built with the same
        architecture so their weights match by name.
    out : the pair folder (``pair.json``, ``metrics.jsonl``).
    every : compare the weights every ``every`` steps (and at 0 and the last step).
    module : compare this submodule of each arm (``"unet"``); default the whole module.
    gradient_clip_val : clip each arm's gradient norm to this before its optimizers step.
    resume : train the pair again from step 0 into a folder whose store holds its steps.
    **pair : ``pair.json`` fields: ``name``, ``category``, ``arms``, ``description``,
        ``replicate``, ``spike_factor``, ``spike_window``.
    """

    def __init__(
        self,
        module_a: pl.LightningModule,
        module_b: pl.LightningModule,
        out: str | Path,
        every: int = DEFAULT_EVERY,
        module: str | None = None,
        gradient_clip_val: float | None = None,
        resume: bool = False,
        **pair,
    ):
        super().__init__()
        for arm, m in (("a", module_a), ("b", module_b)):
            if not isinstance(m, pl.LightningModule):
                raise UserInputError(f"module_{arm}: a LightningModule is needed, got {type(m).__name__}")
            if not m.automatic_optimization:
                raise UserInputError(
                    f"module_{arm}: {type(m).__name__} uses manual optimization; LockstepPair "
                    "steps each arm's optimizers itself and needs automatic_optimization=True"
                )
            submodule(m, module or "")
        if module_a is module_b:
            raise UserInputError(
                "module_a and module_b are the same object; build two modules (a control pair "
                "is two copies built from the same seed)"
            )
        self.automatic_optimization = False
        self.module_a, self.module_b = module_a, module_b
        self.compared = module or ""
        self.gradient_clip_val = gradient_clip_val
        self.tracker = PairTracker.of_pair(out, every, pair, resume=resume, restart_advice=RESTART_ADVICE)
        self._optimizers: dict[str, list[int]] = {}
        self._schedulers: dict[str, list[tuple[int, str]]] = {}
        for arm in ARMS:
            self.arm(arm).log = partial(self._arm_log, arm)
            self.arm(arm).log_dict = partial(self._arm_log_dict, arm)

    def arm(self, name: str) -> pl.LightningModule:
        return self.module_a if name == "a" else self.module_b

    # -- optimizers: each arm's own ----------------------------------------------------------
    def configure_optimizers(self):
        optimizers, schedulers = [], []
        for arm in ARMS:
            opts, scheds = split_optimizers(self.arm(arm).configure_optimizers(), f"module_{arm}")
            self._optimizers[arm] = list(range(len(optimizers), len(optimizers) + len(opts)))
            self._schedulers[arm] = [(len(schedulers) + i, interval) for i, (_, interval) in enumerate(scheds)]
            optimizers += opts
            schedulers += [s for s, _ in scheds]
        return optimizers, schedulers

    # -- one step: both arms on the batch, the RNG forked ------------------------------------------
    def training_step(self, batch, batch_idx):
        forked = rng_state()
        losses = {}
        for arm in ARMS:
            set_rng_state(forked)
            losses[arm] = self._arm_step(arm, batch, batch_idx)
        self._losses = mean_over_ranks(self.trainer, losses)  # the global loss: every rank's detectors see the same
        return None

    def _arm_step(self, arm: str, batch, batch_idx) -> torch.Tensor:
        output = self.arm(arm).training_step(batch, batch_idx)
        loss = output.get("loss") if isinstance(output, dict) else output
        step_loss(loss)  # a clear error when training_step returned no loss tensor
        optimizers = _as_list(self.optimizers())
        for i in self._optimizers[arm]:
            optimizers[i].zero_grad()
        self.manual_backward(loss)
        for i in self._optimizers[arm]:
            if self.gradient_clip_val is not None:
                self.clip_gradients(optimizers[i], gradient_clip_val=self.gradient_clip_val)
            if arm == "a" and i == self._optimizers["a"][0]:  # the one Lightning counts: global_step counts batches
                optimizers[i].step()
            else:
                self.trainer.strategy.optimizer_step(optimizers[i].optimizer, do_nothing_closure)
        schedulers = _as_list(self.lr_schedulers())
        for i, interval in self._schedulers[arm]:
            if interval == "step":
                schedulers[i].step()
        return loss.detach().float()

    # -- tracking: the pair's tracker, driven by its callback ----------------------------------
    def configure_callbacks(self):
        return [DivergenceTracker(self.tracker, losses=lambda m: m._losses, weights=lambda m: m._pair_weights())]

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.tracker.stop_if_diverged(self.trainer.global_step, self._losses)  # after every callback's records

    def on_train_epoch_end(self) -> None:
        schedulers = _as_list(self.lr_schedulers())
        for arm in ARMS:
            for i, interval in self._schedulers[arm]:
                if interval == "epoch":
                    schedulers[i].step()

    def _pair_weights(self):
        """Both arms' weights on rank zero (collective under FSDP), None elsewhere."""
        states = [
            gather_state(self.trainer, self, f"module_{arm}" + (f".{self.compared}" if self.compared else ""))
            for arm in ARMS
        ]
        return None if states[0] is None else tuple(state_weights(s) for s in states)

    # -- the arms' own self.log calls, namespaced by arm ----------------------------------------
    def _arm_log(self, arm: str, name: str, value, *args, **kwargs):
        return self.log(f"{arm}/{name}", value, *args, **kwargs)

    def _arm_log_dict(self, arm: str, dictionary: dict, *args, **kwargs):
        return self.log_dict({f"{arm}/{k}": v for k, v in dictionary.items()}, *args, **kwargs)


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def rng_state() -> dict:
    """The process's global random state: torch's, numpy's and ``random``'s, and the CUDA generators' only
    when CUDA is already initialized (no CUDA query of ours initializes it). An arm's ``training_step`` may
    draw from all of them (diffusion noise and timesteps, dropout masks); restored before arm b's step,
    the state saved before arm a's gives b exactly a's draws."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def split_optimizers(output, owner: str) -> tuple[list, list[tuple[object, str]]]:
    """What a module's ``configure_optimizers`` returned, as ``(optimizers, [(scheduler, interval), ...])``;
    interval ``step`` or ``epoch`` (Lightning's default). Lightning accepts an optimizer; a list or tuple of
    them; ``([optimizers], [schedulers])``; a dict ``{"optimizer": ..., "lr_scheduler": scheduler or
    {"scheduler": ..., "interval": "step" | "epoch"}}``; or a list of such dicts: all are read."""
    if isinstance(output, torch.optim.Optimizer):
        return [output], []
    if isinstance(output, dict):
        return _from_dicts([output], owner)
    if isinstance(output, (list, tuple)):
        if len(output) == 2 and all(isinstance(x, (list, tuple)) for x in output):
            return list(output[0]), [_scheduler(s, owner) for s in output[1]]
        if all(isinstance(x, dict) for x in output):
            return _from_dicts(output, owner)
        if all(isinstance(x, torch.optim.Optimizer) for x in output):
            return list(output), []
    raise UserInputError(
        f"{owner}.configure_optimizers returned {type(output).__name__}; return an optimizer, "
        "a list of them, ([optimizers], [schedulers]) or {'optimizer': ..., 'lr_scheduler': ...}"
    )


def _from_dicts(dicts, owner: str):
    optimizers, schedulers = [], []
    for d in dicts:
        if "optimizer" not in d:
            raise UserInputError(f"{owner}.configure_optimizers: a dict without 'optimizer' ({sorted(d)})")
        optimizers.append(d["optimizer"])
        if d.get("lr_scheduler") is not None:
            schedulers.append(_scheduler(d["lr_scheduler"], owner))
    return optimizers, schedulers


def _scheduler(spec, owner: str) -> tuple[object, str]:
    if isinstance(spec, dict):
        interval = spec.get("interval", "epoch")
        if interval not in ("step", "epoch"):
            raise UserInputError(
                f"{owner}.configure_optimizers: lr_scheduler interval {interval!r}; must be 'step' or 'epoch'"
            )
        return spec["scheduler"], interval
    return spec, "epoch"
