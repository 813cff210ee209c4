"""The function-space probe: both arms evaluated on one fixed input set in the reference numerics.

Weight-space distance says how far apart two models are as parameter vectors; the probe says
how differently they compute. A fixed probe set Q of ``size`` items (image, noise, timestep,
caption), drawn once from the probe seed exactly as training batches are drawn (the recipe's
dataset, caption dropout, noise and timestep streams), is run through each arm's UNet and text
encoder in the reference numerics: fp32, baseline attention on every attention module, no
autocast, no gradients, eval mode. At every tracked step the store gets::

    probe_rel_diff = ||out_a(Q) - out_b(Q)|| / ||out_b(Q)||      (float64, Frobenius over Q)
    probe_loss_a   = mean((out_a(Q) - target(Q))^2)               (the diffusion loss on Q)
    probe_loss_b   = mean((out_b(Q) - target(Q))^2)

and, for a mixture-of-experts denoiser (``model.moe``), the router's record (``ROUTER_KEYS``;
``divergence.metrics.router``): ``router_flip``, the fraction of the probe's (token, slot)
choices whose expert differs between the arms in the reference numerics, ``router_flip_layers``
the same per MoE layer ({layer: fraction}), and ``router_drop_a``, ``router_drop_b``, the
fraction of choices each arm's capacity limit dropped in its last training forward (the step's
last micro-batch; absent where the arm has not trained in this process, e.g. arms read back from
files). So F(t) = probe_rel_diff is the function-space twin of the whole-model ``rel_l2`` (docs/method.md,
"The statistic"), and the probe losses give the outcome without the arms' own numerics in it.

Cadence (``probe_due``): at tracked steps that are multiples of ``tracking.probe.every`` (20 by
default) and at the last step. One evaluation (64 items, two forward passes in fp32 with
baseline attention) costs about 1.6 pair steps of the tiny recipe (batch 16, forward and
backward): its cost is the forward passes themselves (profile: convolutions ~30%, baseline
attention ~40%, text encoder ~4%), so at every tracked step of the dense schedule it would add
19-61% to a run (2000 to 100 steps); every 20 steps it adds 8.2-9.7% (docs/measurements.md).
The trade: the window's saturation test (phi < 0.1) and the function-space twin lr^F are read
at probed steps only (``divergence.analysis.dose``); ``every: 1`` probes every tracked step.

The evaluation must not change training: it swaps the arm's attention processors for baseline
ones and puts its modules in eval mode, then restores every processor object and every
module's training flag exactly (``verify_attention`` checks the processors); it reads no
global RNG and writes no weights, so a run with the probe is bitwise the run without it.
Weights are used as they are: an arm whose weights are not fp32 is refused (autocast arms keep
fp32 weights, so every shipped precision qualifies).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import replace

import torch

from divergence.models.denoiser import denoise
from divergence.models.moe import moe_layers, recording_routes
from divergence.pairfolder.settings import ProbeConfig
from divergence.training.inputs import DiffusionInputs, Inputs

PROBE_KEYS = ("probe_rel_diff", "probe_loss_a", "probe_loss_b")
ROUTER_KEYS = ("router_flip", "router_flip_layers", "router_drop_a", "router_drop_b")


class FunctionProbe:
    """A fixed probe set of ``config.size`` items from ``seed``, evaluated on two arms at once."""

    def __init__(self, inputs: Inputs, config: ProbeConfig, seed: int):
        self.inputs, self.config, self.seed = inputs, config, seed
        self._probe: DiffusionInputs | None = None  # prepared on the arms' device at first use
        self._baseline = None

    def record(self, arm_a, arm_b) -> dict[str, float]:
        """``probe_rel_diff, probe_loss_a, probe_loss_b`` of the two arms' current weights, and
        with MoE layers the router's record (``ROUTER_KEYS``)."""
        # each layer's last training forward's (recording_routes leaves it to the probe's forwards)
        drops = {"router_drop_a": training_drops(arm_a), "router_drop_b": training_drops(arm_b)}
        probe = self._inputs(next(arm_b.parameters()).device)
        with recording_routes(arm_a.unet) as routes_a, recording_routes(arm_b.unet) as routes_b:
            out_a, out_b = self.evaluate(arm_a, probe), self.evaluate(arm_b, probe)
        diff = torch.linalg.vector_norm((out_a - out_b).double())
        norm_b = torch.linalg.vector_norm(out_b.double())
        target = probe.target.double()
        return {
            "probe_rel_diff": float(diff / norm_b) if norm_b > 0 else float("nan"),
            "probe_loss_a": float(torch.mean((out_a.double() - target) ** 2)),
            "probe_loss_b": float(torch.mean((out_b.double() - target) ** 2)),
            **router_flips_on_probe(routes_a, routes_b),
            **{key: value for key, value in drops.items() if value is not None},
        }

    @torch.no_grad()
    def evaluate(self, arm, probe: DiffusionInputs) -> torch.Tensor:
        """The arm's prediction on the probe, (size, C, h, w) float32, in the reference numerics."""
        outputs = []
        with reference_numerics(arm, self._baseline_for):
            for start in range(0, probe.noisy.shape[0], self.config.batch_size):
                part = slice(start, start + self.config.batch_size)
                text = arm.text_encoder(probe.input_ids[part])  # (b, L, hidden) and pooled (b, hidden)
                outputs.append(denoise(arm.unet, probe.noisy[part], probe.timesteps[part], text).float())
        return torch.cat(outputs)

    def _inputs(self, device: torch.device) -> DiffusionInputs:
        if self._probe is None or self._probe.noisy.device != device:
            self._probe = probe_inputs(self.inputs, self.config.size, self.seed, device)
        return self._probe

    def _baseline_for(self, module):
        """Baseline attention in the module's form: joint (SD3: image + caption) or plain."""
        from divergence.attention.joint import KernelJointAttnProcessor
        from divergence.attention.processor import KernelAttnProcessor

        joint = (
            isinstance(module.processor, KernelJointAttnProcessor)
            or type(module.processor).__name__ == "JointAttnProcessor2_0"
        )
        if self._baseline is None:
            self._baseline = {False: KernelAttnProcessor("baseline"), True: KernelJointAttnProcessor("baseline")}
        return self._baseline[joint]


def router_flips_on_probe(routes_a: dict, routes_b: dict) -> dict:
    """``router_flip`` and ``router_flip_layers`` of two arms' recorded routings (``{layer:
    [Routing per probe batch]}``); empty without MoE layers."""
    from divergence.metrics.router import layer_flip_fractions

    if not routes_a:
        return {}
    experts_a = {name: torch.cat([r.experts for r in runs]) for name, runs in routes_a.items()}
    experts_b = {name: torch.cat([r.experts for r in runs]) for name, runs in routes_b.items()}
    overall, per_layer = layer_flip_fractions(experts_a, experts_b)
    return {"router_flip": overall, "router_flip_layers": per_layer}


def training_drops(arm, *, across_ranks: bool = False) -> float | None:
    """The fraction of choices dropped by capacity over the arm's MoE layers in their last
    forward, or None without MoE layers or before any forward.

    ``across_ranks``: the fraction over every rank's tokens, ``sum_r dropped_r / sum_r choices_r``
    (one all-reduce of two counts; every rank must call it), for an arm whose ranks each route
    their own slice of the batch (data or expert parallel); one process's fraction otherwise."""
    from divergence.metrics.router import drop_fraction

    layers = moe_layers(arm.unet)
    if not layers or any(layer.routing is None for layer in layers.values()):
        return None
    kept = {name: layer.routing.kept for name, layer in layers.items()}
    if not across_ranks or not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return drop_fraction(kept)
    masks = list(kept.values())
    counts = torch.tensor(
        [float(sum(int((~m).sum()) for m in masks)), float(sum(m.numel() for m in masks))],
        dtype=torch.float64,
        device=masks[0].device,
    )
    torch.distributed.all_reduce(counts)  # (dropped, choices) summed over the ranks
    return float(counts[0] / counts[1]) if counts[1] > 0 else None


def probe_inputs(inputs: Inputs, size: int, seed: int, device) -> DiffusionInputs:
    """The probe set: ``size`` items drawn like one training batch, from the recipe's dataset, with
    example order, caption dropout, noise and timesteps from the seed ``derive_seed("probe", seed)``
    (never a training batch's streams, whatever the data seed)."""
    from divergence.recipe.seeds import derive_seed

    draws = copy.copy(inputs.batches)  # the recipe's draws: its dataset, tokenizer and shapes
    draws.config = replace(draws.config, seed=derive_seed("probe", seed) % 2**31)
    draws.batch_size, draws.accumulate = size, 1
    with torch.no_grad():
        return inputs.prepare(draws.batch(0).to(device))


@contextlib.contextmanager
def reference_numerics(arm, baseline_for):
    """Inside: every attention module of ``arm.unet`` runs ``baseline_for(module)``, all modules in eval mode,
    autocast off. After: the arm's own processors and training flags, exactly as before."""
    from divergence.models.attention import attention_modules, verify_attention

    bad = sorted({p.dtype for p in arm.parameters() if p.dtype != torch.float32}, key=str)
    if bad:
        raise RuntimeError(
            f"probe: arm {arm.name} holds {bad[0]} weights; the probe evaluates fp32 weights "
            "(set tracking.probe.enabled=false for this pair)"
        )
    modules = attention_modules(arm.unet)
    saved = {name: module.processor for name, module in modules.items()}
    modes = [(module, module.training) for module in arm.modules()]
    device = next(arm.parameters()).device.type
    try:
        for module in modules.values():
            module.set_processor(baseline_for(module))
        arm.eval()
        with torch.autocast(device, enabled=False):
            yield
    finally:
        for name, module in modules.items():
            module.set_processor(saved[name])
        for module, training in modes:
            module.training = training
        verify_attention(arm.unet, saved)
