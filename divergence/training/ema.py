"""An arm's EMA weights: ``diffusers.training_utils.EMAModel`` over its trainable parameters.

Released diffusion checkpoints are EMA weights, so a study tracks them beside the raw ones.
The average is diffusers' own class, stepped as diffusers' training scripts step it: once per
optimizer step (after the optimizer and LR steps; also when an fp16 loss scaler skipped the
step), over the denoiser's trainable parameters and the text encoder's when it is trained::

    ema <- ema - (1 - d_s) (ema - w)        d_s: EMAModel.get_decay(s), s = optimizer steps so far

(see ``divergence.recipe.run.EMAConfig`` for ``d_s``). The shadow copies live on the weights'
device in fp32 (the arms keep fp32 master weights), named ``ema.<checkpoint key>``
(``ema.unet.<name>``, ``ema.text_encoder.<name>``: ``divergence.checkpoints.families``).
``state_dict`` is EMAModel's (numbers, a bool and a list of tensors), part of the arm's resume
state, so a resumed run continues the average bitwise.
"""

from __future__ import annotations

import torch

from divergence.checkpoints.families import EMA_PREFIX
from divergence.recipe.run import EMAConfig


class ArmEMA:
    """The EMA of ``params`` (``{checkpoint key: parameter}``, in module order)."""

    def __init__(self, params: dict[str, torch.nn.Parameter], config: EMAConfig):
        from diffusers.training_utils import EMAModel

        self.names = [EMA_PREFIX + name for name in params]
        self.model = EMAModel(
            list(params.values()),
            decay=float(config.decay),
            min_decay=float(config.min_decay),
            update_after_step=int(config.update_after_step),
            use_ema_warmup=bool(config.use_warmup),
            inv_gamma=float(config.inv_gamma),
            power=float(config.power),
            foreach=bool(config.foreach),
        )

    def to(self, device: torch.device) -> None:
        self.model.to(device=device)

    def step(self, params: list[torch.nn.Parameter]) -> None:
        """One update, after an optimizer step (``params`` in the order given at construction)."""
        self.model.step(params)

    def weights(self) -> dict[str, torch.Tensor]:
        """``{ema.<key>: shadow tensor}`` (live tensors: copy before keeping them)."""
        return dict(zip(self.names, self.model.shadow_params))

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        if len(state["shadow_params"]) != len(self.names):
            raise ValueError(f"EMA state holds {len(state['shadow_params'])} tensors, the arm {len(self.names)}")
        self.model.load_state_dict(state)
        self.to(device)
