"""The per-step update error of an optimization, measured on the reference arm's own weights and batch.

For a pair whose arm a runs an optimization and arm b the reference, the update error of step t is

    e_t = g_on(w_t, x_t) - g_off(w_t, x_t)

the gradient of the reference arm's loss with the optimization switched on minus with it off, both
on the reference arm's weights ``w_t`` and the step's batch ``x_t`` (before the step's update). As
the shadow attention (``divergence.attention.shadow``) compares two kernels' outputs on identical
inputs, this compares the two gradients on identical weights: it is free of the chaotic
amplification that makes the weight differences of two diverged arms directionless. A sequence of
``e_t`` is read by ``divergence.metrics.coherence`` (does it drift or wander?).

Only what can be switched on one model is measured (``SWITCHABLE``: the attention kernel, the
autocast precision). A pair whose arms' recipes differ in anything else (an init seed, an optimizer
implementation, fp8 layers, compilation) is "not measurable" with the differing key named
(``not_measurable``), never a wrong number. Reference: Qiu and Yao, arXiv 2510.04212 (2025), whose
biased flash-attention rounding this is built to see.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from divergence.config.schema import to_dict

# Recipe keys (dotted prefixes) whose difference can be switched on one model: the attention
# processors are swapped on the reference arm's modules, the autocast policy is swapped for the pass.
SWITCHABLE = ("attention.", "train.precision")
IGNORED = ("name",)  # the arms' recipe names differ in every pair


def not_measurable(reference, optimized) -> str | None:
    """Why ``optimized``'s difference from ``reference`` (two ``RunRecipe``) cannot be switched on
    the reference arm's model, or None when it can (identical arms: e_t = 0, measurable)."""
    from divergence.training.folder_check import flatten_keys

    ref, opt = flatten_keys(to_dict(reference)), flatten_keys(to_dict(optimized))
    differing = [k for k in sorted(set(ref) | set(opt)) if ref.get(k) != opt.get(k) and k not in IGNORED]
    fixed = [k for k in differing if not k.startswith(SWITCHABLE)]
    if fixed:
        return (
            f"not measurable: the arms differ in {fixed[0]}, which cannot be switched on one model "
            f"(only {', '.join(s.rstrip('.') for s in SWITCHABLE)} can)"
        )
    return None


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its path up to the first list index (``unet.down_blocks.1``,
    ``unet.transformer_blocks.3``), else its first two parts (``unet.conv_in``, ``unet.mid_block``).

    >>> layer_of("unet.down_blocks.1.attentions.0.to_q.weight"), layer_of("unet.conv_in.weight")
    ('unet.down_blocks.1', 'unet.conv_in')
    """
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


class UpdateError:
    """``e_t`` of ``optimized`` (a ``RunRecipe``) on ``arm`` (the reference ``Arm``, already set up).

    ``measure(inputs)`` returns ``(errors, grad_norm)``: ``{parameter name: e (float32, flat)}`` of
    the arm's trainable parameters and ``||g_off||``. The arm is left as it was (its processors and
    precision policy restored), so its own training is unchanged.
    """

    def __init__(self, arm, optimized):
        from divergence.models.attention import apply_attention

        self.arm, self.optimized = arm, optimized
        self.names = [n for n, p in arm.named_parameters() if p.requires_grad]
        self.off = dict(arm.processors)
        self.on = self.off
        if to_dict(optimized.attention) != to_dict(arm.recipe.attention):
            self.on = apply_attention(arm.unet, optimized.attention)  # built once, then switched
            self._set(self.off)
        self.policy = None  # the optimized precision policy, on the arm's device at the first call

    def measure(self, inputs) -> tuple[dict[str, torch.Tensor], float]:
        """``{name: e_t}`` and ``||g_off||`` on ``inputs`` (one batch or the step's micro-batches)."""
        micro = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        off = self._gradient(micro, self.arm.policy)
        self._set(self.on)
        try:
            on = self._gradient(micro, self._on_policy())
        finally:
            self._set(self.off)
        grad_norm = float(torch.sqrt(sum(g.double().square().sum() for g in off)))
        return {n: (b - a).flatten() for n, a, b in zip(self.names, off, on)}, grad_norm

    def _gradient(self, micro, policy) -> list[torch.Tensor]:
        """The arm's loss gradient under ``policy`` (``Arm._accumulate``'s loss, mean over micro-batches)."""
        from divergence.models.moe import moe_aux_loss

        saved, self.arm.policy = self.arm.policy, policy
        params = [p for p in self.arm.parameters() if p.requires_grad]
        try:
            total = None
            for batch in micro:
                loss = F.mse_loss(self.arm.predict(batch).float(), batch.target.float())
                aux = moe_aux_loss(self.arm.unet)
                loss = (loss if aux is None else loss + aux) / len(micro)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                grads = [torch.zeros_like(p) if g is None else g.detach().float() for p, g in zip(params, grads)]
                total = grads if total is None else [t + g for t, g in zip(total, grads)]
            return total
        finally:
            self.arm.policy = saved

    def _on_policy(self):
        if self.policy is None:
            from divergence.models.attention import check_attention, head_dim
            from divergence.training.emulated_autocast import emulate_cpu_autocast, emulates_cpu_autocast
            from divergence.training.precision import PrecisionPolicy

            device = next(self.arm.parameters()).device
            self.policy = PrecisionPolicy(self.optimized.train.precision, device)
            check_attention(self.optimized.attention, device, self.policy.compute_dtype, head_dim(self.arm.unet))
            if emulates_cpu_autocast(self.optimized.train) and not self.arm.emulated_modules:
                # the reference arm is fp32 (not_measurable refuses the rest): its emulated modules run
                # the parent forward whenever CPU autocast is off, so its own steps are bitwise unchanged
                self.arm.emulated_modules = emulate_cpu_autocast(self.arm)
        return self.policy

    def _set(self, processors: dict) -> None:
        from divergence.models.attention import attention_modules

        for name, module in attention_modules(self.arm.unet).items():
            module.set_processor(processors[name])
