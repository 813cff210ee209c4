"""An arm: one model being trained, with its own optimizer, LR schedule, precision and attention.

A single run holds one arm; a pair holds two stepping on the identical
``DiffusionInputs``. Everything that may differ between arms lives here (init seed, precision
policy, attention variant, optimizer state); everything they share lives in ``Inputs``. An arm
never reads a global RNG while training, so it computes bitwise the same alone or in lockstep.

Lifecycle, as a LightningModule drives it::

    arm = Arm(recipe, tokenizer)        # build on CPU from model.seed, apply the attention variant
    arm.setup(device)                   # fail now if device/dtype cannot run the variant
    arm.configure_optimizers()          # after Lightning moved the weights to the device
    out = arm.training_step(micro_batches, backward=module.manual_backward)  # one optimizer step

Gradient accumulation (``train.accumulate = k``): one optimizer step takes the step's ``k``
micro-batches, each loss divided by ``k`` before its backward, so the gradient is the mean over
the ``k x batch_size`` examples, as one batch of that size gives (up to summation order);
unscaling, grad-noise, clipping, the optimizer, LR and EMA steps happen once per optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from divergence.models.attention import apply_attention, check_attention, head_dim
from divergence.models.build import build_text_encoder
from divergence.models.denoiser import build_denoiser, denoise
from divergence.models.lora import apply_lora, tracked_weights
from divergence.models.moe import moe_aux_loss
from divergence.recipe.run import RunRecipe, latent_shape
from divergence.models.determinism import with_arm_numerics
from divergence.training.ema import ArmEMA
from divergence.training.emulated_autocast import emulate_cpu_autocast, emulates_cpu_autocast
from divergence.training.inputs import DiffusionInputs
from divergence.training.optim import build_lr_schedule, build_optimizer, optimizer_state
from divergence.models.optimizations import apply_optimizations
from divergence.training.precision import PrecisionPolicy
from divergence.training.tensor_parallel import clip_grad_norm, full_optimizer_state, model_parallel
from divergence.training.tensor_parallel import shard_optimizer_state


@dataclass
class StepOutput:
    """What one optimizer step of an arm reports (detached scalars)."""

    loss: torch.Tensor  # () float32: mean squared error of the prediction (mean over micro-batches)
    grad_norm: torch.Tensor  # () float32: global gradient norm after unscaling, before clipping
    lr: float  # learning rate used at this step
    loss_scale: float  # fp16 loss scale used at this step (1.0 when not scaling)
    skipped: bool  # the loss scaler skipped the step (overflowing fp16 gradients)


class Arm(torch.nn.Module):
    """UNet + text encoder of one recipe, trained with that recipe's precision and attention."""

    def __init__(self, recipe: RunRecipe, tokenizer, name: str = "arm", recorder=None):
        super().__init__()
        self.recipe, self.name = recipe, name
        seed = recipe.model.seed
        self.text_encoder = build_text_encoder(recipe.model.text_encoder, tokenizer, seed)
        channels, side, _ = latent_shape(recipe)
        # the denoiser (a UNet or a transformer) keeps the attribute name ``unet``: checkpoint keys
        self.unet = build_denoiser(
            recipe.model, channels, side, self.text_encoder.config.hidden_size, seed, recipe.data.resolution
        )
        apply_lora(self.unet, recipe.model.lora, seed)
        if recipe.model.gradient_checkpointing:
            self.unet.enable_gradient_checkpointing()
        self.processors = apply_attention(self.unet, recipe.attention, recorder)
        # 16-bit autocast on a CPU computed as a GPU computes it (train.cpu_autocast); 0: untouched
        self.emulated_modules = emulate_cpu_autocast(self) if emulates_cpu_autocast(recipe.train) else 0
        self.policy: PrecisionPolicy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler = None
        self._pending_state: dict | None = None
        # the EMA starts from the initial weights (its shadows follow them to the device later)
        self.ema = ArmEMA(self._ema_parameters(), recipe.train.ema) if recipe.train.ema is not None else None

    @property
    def train_text_encoder(self) -> bool:
        return self.recipe.model.text_encoder.train

    def trained_networks(self) -> list[torch.nn.Module]:
        """The networks the optimizer steps: the denoiser, and the text encoder when it trains."""
        return [self.unet, self.text_encoder] if self.train_text_encoder else [self.unet]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def _ema_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The trainable parameters by checkpoint key (``unet.<name>``, ``text_encoder.<name>``)."""
        return {name: p for name, p in self.named_parameters() if p.requires_grad}

    def setup(self, device: torch.device) -> None:
        """Choose the precision policy for ``device`` and check the attention variant runs there."""
        self.policy = PrecisionPolicy(self.recipe.train.precision, device)
        check_attention(self.recipe.attention, torch.device(device), self.policy.compute_dtype, head_dim(self.unet))
        apply_optimizations(self, torch.device(device))  # fp8 / int8 / compile, as the recipe says

    def configure_optimizers(self) -> None:
        """Build optimizer and LR schedule over the (already placed) weights; apply a resumed state."""
        if self.policy is None:
            self.setup(next(self.parameters()).device)
        self.optimizer = build_optimizer(self.trainable_parameters(), self.recipe.train)
        self.lr_scheduler = build_lr_schedule(self.optimizer, self.recipe.train)
        if self.ema is not None:
            self.ema.to(next(self.parameters()).device)
        if self._pending_state is not None:
            self._apply_train_state(self._pending_state)
            self._pending_state = None

    def predict(self, inputs: DiffusionInputs) -> torch.Tensor:
        """The UNet's prediction (B, C, h, w) under this arm's autocast."""
        with self.policy.autocast():
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.train_text_encoder):
                text = self.text_encoder(inputs.input_ids)  # (B, L, hidden) and pooled (B, hidden)
            return denoise(self.unet, inputs.noisy, inputs.timesteps, text)

    @with_arm_numerics  # TF32 as this arm's recipe says, for its step only
    def training_step(
        self,
        inputs: DiffusionInputs | Sequence[DiffusionInputs],
        *,
        backward: Callable[[torch.Tensor], None] | None = None,
    ) -> StepOutput:
        """One optimizer step on one batch or its micro-batches: forward and backward of each,
        then unscale, (grad-noise), clip, optimizer step, LR step, EMA step.

        ``backward`` runs the backward pass of the (scaled) loss; a LightningModule passes its
        ``manual_backward`` so distributed strategies see it. Default: ``loss.backward()``.
        """
        micro = regroup([inputs] if isinstance(inputs, DiffusionInputs) else list(inputs), self.recipe.train.accumulate)
        opt, scaler = self.optimizer, self.policy.scaler
        opt.zero_grad(set_to_none=True)
        losses = [self._accumulate(batch, len(micro), backward) for batch in micro]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        params = self.trainable_parameters()
        if self.recipe.train.expert_parallel > 1:  # no DDP: the ranks' gradients averaged here (collective)
            from divergence.training.expert_parallel import average_gradients

            average_gradients(params)
        scaler.unscale_(opt)
        if self.recipe.train.grad_noise is not None:
            multiply_grad_noise(params, self.recipe.train.grad_noise, self.recipe.data.seed, micro[0].step)
        clip = self.recipe.train.grad_clip
        clip = clip if clip is not None else float("inf")
        # the global gradient norm, over sharded (DTensor) and whole gradients alike when sharded
        grad_norm = clip_grad_norm(params, clip) if self.sharded else torch.nn.utils.clip_grad_norm_(params, clip)
        lr, scale = opt.param_groups[0]["lr"], float(scaler.get_scale()) if scaler.is_enabled() else 1.0
        scaler.step(opt)
        scaler.update()
        skipped = scaler.is_enabled() and float(scaler.get_scale()) < scale
        self.lr_scheduler.step()
        if self.ema is not None:
            self.ema.step(list(self._ema_parameters().values()))
        return StepOutput(loss, grad_norm.detach().float(), lr, scale, skipped)

    @property
    def sharded(self) -> bool:
        """Whether some weights are DTensor shards (``train.tensor_parallel``, ``train.fsdp_sharding``,
        ``train.expert_parallel``: ``tensor_parallel.model_parallel``)."""
        return model_parallel(self.recipe.train)

    def _accumulate(self, inputs: DiffusionInputs, k: int, backward) -> torch.Tensor:
        """Forward and backward of one of ``k`` micro-batches (loss / k: gradients add up to the mean).

        With ``model.moe`` the experts' load-balancing loss is added to what is differentiated;
        the loss reported stays the diffusion MSE (comparable across backbones)."""
        loss = F.mse_loss(self.predict(inputs).float(), inputs.target.float())
        aux = moe_aux_loss(self.unet)
        total = loss if aux is None else loss + aux
        (backward or torch.Tensor.backward)(self.policy.scaler.scale(total / k if k > 1 else total))
        return loss.detach()

    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight by checkpoint key: ``unet.<name>`` and ``text_encoder.<name>``, then with
        ``train.ema`` the EMA of the trainable ones, ``ema.unet.<name>``, ``ema.text_encoder.<name>``."""
        out = {f"unet.{k}": v for k, v in tracked_weights(self.unet).items()}
        out.update({f"text_encoder.{k}": v for k, v in self.text_encoder.state_dict().items()})
        if self.ema is not None:
            out.update(self.ema.weights())
        return out

    def train_state_dict(self) -> dict:
        """Optimizer, LR schedule, loss-scaler and EMA state (the weights are in ``state_dict``)."""
        optimizer = optimizer_state(self.optimizer)  # ZeRO-1's shards consolidated (collective)
        if self.sharded:  # AdamW's moments of sharded weights, gathered (collective)
            optimizer = full_optimizer_state(optimizer)
        state = {
            "optimizer": optimizer,
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "scaler": self.policy.scaler.state_dict(),
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_train_state_dict(self, state: dict) -> None:
        """Restore ``train_state_dict``; before ``configure_optimizers`` it is applied there."""
        if self.optimizer is None:
            self._pending_state = state
        else:
            self._apply_train_state(state)

    def _apply_train_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.sharded:
            shard_optimizer_state(self.optimizer)
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if state.get("scaler"):  # an empty dict when the scaler was disabled
            self.policy.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"], next(self.parameters()).device)


def multiply_grad_noise(params: list[torch.nn.Parameter], eps: float, data_seed: int, step: int) -> None:
    """The calibration dose: ``g <- g * (1 + eps * xi)`` for every gradient, ``xi ~ N(0, 1)`` in fp32.

    A relative gradient noise of known size ``eps`` per step (docs/method.md, "Calibration"). ``xi``
    comes from one CPU generator per step seeded by (data seed, eps, step), drawn parameter by
    parameter in order, so the dose is reproducible, identical on any device and across a
    resume, and independent between replicates (whose data seeds differ). ``eps = 0`` multiplies
    by exactly 1.0: bitwise the reference arm. Gradients that are None are skipped (no draw).
    """
    from divergence.recipe.seeds import derive_seed

    generator = torch.Generator().manual_seed(derive_seed("grad-noise", data_seed, repr(float(eps)), step))
    for param in params:
        if param.grad is None:
            continue
        xi = torch.randn(param.grad.shape, generator=generator, dtype=torch.float32)
        factor = xi.mul_(eps).add_(1.0).to(device=param.grad.device, dtype=param.grad.dtype)
        param.grad.mul_(factor)


def regroup(micro: list[DiffusionInputs], k: int) -> list[DiffusionInputs]:
    """The step's examples as ``k`` micro-batches: a pair whose arms accumulate differently (the
    ``grad-accumulation`` variant) gets one list from the shared inputs, and each arm splits or
    joins it into its own; the examples, their order and their draws are the same (every example is
    noised on its own), so k x b and one batch of k b see the same global batch. Unchanged when it
    already has ``k``."""
    if len(micro) == k:
        return micro
    fields = ("noisy", "timesteps", "input_ids", "target")
    whole = {f: torch.cat([getattr(m, f) for m in micro]) for f in fields}
    size = whole["noisy"].shape[0]
    if size % k:
        raise RuntimeError(f"train.accumulate={k} does not divide the step's {size} examples")
    return [
        DiffusionInputs(micro[0].step, *(whole[f][i * size // k : (i + 1) * size // k] for f in fields))
        for i in range(k)
    ]
