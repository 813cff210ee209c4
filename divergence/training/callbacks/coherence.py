"""Coherence of an optimization's update error in training: does it drift or wander?

Every ``every`` steps (``tracking.coherence_every``), before the step's update, ``measure(pl_module,
batch)`` returns the update error ``e_t`` of the step by parameter name and the reference gradient's
norm (``divergence.training.update_error``: the optimization switched on minus off, on the
reference arm's own weights and batch); the errors are grouped by layer and accumulated
(``divergence.metrics.coherence.LayeredCoherence``). The step record of the state the update makes
(step ``N`` = the step whose loss is of this batch) gets the keys of ``record_keys`` (``COHERENCE_KEYS``)
through the tracker's ``extras``; the loggers send them as ``divergence/coherence/*``
(``divergence.loggers.step_logging``). When the pair's difference cannot be switched on one model,
``reason`` ("not measurable: ...") is recorded under ``coherence_status`` at the same steps instead
of a number.

Cost: two forward and backward passes of one arm per measured step (on the global rank zero, on its
share of the batch); memory: two float64 copies of the trainable parameters (the running sum and the
last error). Resume: the running sums are this callback's state in the resume checkpoint, so a
resumed run continues C(T) where the saved step left it.
"""

from __future__ import annotations

from typing import Callable

import torch
from lightning.pytorch.callbacks import Callback

from divergence.metrics.coherence import LayeredCoherence
from divergence.training.update_error import layer_of

# the step-record keys (docs/pair-folder.md, "metrics.jsonl"); coherence_status alone when not measurable
COHERENCE_KEYS = (
    "coherence",  # C(T), whole model, over the measured steps so far
    "coherence_steps",  # T
    "coherence_cos",  # cos(e_t, e_{t-1}), whole model (NaN at the first)
    "coherence_mean_cos",  # mean of those cosines so far
    "coherence_err",  # ||e_t||
    "coherence_grad",  # ||g_t||, the reference gradient (optimization off)
    "coherence_layers",  # {layer: C(T)}
)
STATUS_KEY = "coherence_status"


class UpdateCoherence(Callback):
    """Measure ``measure(pl_module, batch) -> ({name: e_t}, ||g_t||)`` every ``every`` steps and keep
    C(T); ``extras(step)`` hands the step record its keys (the tracker calls it)."""

    def __init__(
        self,
        every: int,
        measure: Callable[[object, object], tuple[dict, float]] | None,
        reason: str | None = None,
        layer: Callable[[str], str] = layer_of,
    ):
        self.every, self.measure, self.reason, self.layer = every, measure, reason, layer
        self.sums = LayeredCoherence()
        self._pending: tuple[int, dict] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1  # the state this batch's update makes: measured every every-th, 0 is off
        if not (self.every > 0 and step % self.every == 0) or not trainer.is_global_zero:
            return
        if self.reason is not None:
            self._pending = (step, {STATUS_KEY: self.reason})
            return
        with torch.enable_grad():
            errors, grad_norm = self.measure(pl_module, batch)
        layers: dict[str, list] = {}
        for name, e in errors.items():
            layers.setdefault(self.layer(name), []).append(e.flatten())
        out = self.sums.add({name: torch.cat(parts) for name, parts in layers.items()})
        model = out["model"]
        self._pending = (
            step,
            {
                "coherence": model["coherence"],
                "coherence_steps": model["steps"],
                "coherence_cos": model["cos"],
                "coherence_mean_cos": model["mean_cos"],
                "coherence_err": model["err_norm"],
                "coherence_grad": grad_norm,
                "coherence_layers": out["layers"],
            },
        )

    def extras(self, step: int) -> dict:
        """The keys for step ``step``'s record (empty at a step not measured)."""
        if self._pending is None or self._pending[0] != step:
            return {}
        return self._pending[1]

    def state_dict(self) -> dict:
        return {"sums": self.sums.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if "sums" in state_dict:
            self.sums.load_state_dict(state_dict["sums"])
