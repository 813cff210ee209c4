"""An arm's own precision policy: autocast dtype and loss scaler, from a Lightning precision name.

The Trainer stays at ``32-true``; each arm applies its policy itself, so two arms in one process
can train at different precisions on the same batch, and an arm alone computes what it computes
in a pair. ``16-mixed`` scales the loss (``torch.amp.GradScaler``, also on the CPU) so small fp16
gradients do not flush to zero; a step whose gradients overflow is skipped and the scale lowered.
Weights and optimizer state stay fp32 in every policy.
"""

from __future__ import annotations

import contextlib

import torch

from divergence.errors import UserInputError

_AUTOCAST = {"32-true": None, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


class PrecisionPolicy:
    """``autocast()`` context and ``scaler`` for one precision name on one device."""

    def __init__(self, name: str, device: torch.device):
        if name not in _AUTOCAST:
            raise UserInputError(f"train.precision {name!r}: not one of {', '.join(_AUTOCAST)}")
        self.name, self.device = name, torch.device(device)
        self.dtype = _AUTOCAST[name]
        # A disabled scaler is the identity (scale, unscale_, step, update), so one code path serves all.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype is torch.float16)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matmuls (and so attention) run in under this policy."""
        return self.dtype or torch.float32

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)
