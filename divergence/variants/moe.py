"""Variants of a mixture-of-experts denoiser (``model.moe``, ``divergence.models.moe``).

- ``router-bf16``: the router's logits and softmax in the arm's autocast dtype (bf16) instead of
  fp32 (``model.moe.router_precision: autocast``), both arms otherwise under bf16 autocast; MoE
  practice keeps the router in fp32 (DeepSeek-V3 report, sec. 3.3) because a logit rounded to 8
  bits of mantissa can send a token to another expert;
- ``expert-grouped`` / ``expert-loop``: every expert in one batched matmul over an (E, C, D)
  buffer vs one matmul per expert over its own tokens (``model.moe.expert_compute``): the same
  math, other orders of sums (fp32-equivalent).

Each verifies on the built arm that every MoE layer computes as it says; an arm without MoE
layers (``model.moe: null``) is refused, naming the fix.
"""

from __future__ import annotations

from divergence.variants.deployment import Deployment
from divergence.variants.registry import Variant, register


def _moe_layers(arm, what: str) -> dict:
    from divergence.models.moe import moe_layers

    layers = moe_layers(arm.unet)
    if not layers:
        raise RuntimeError(
            f"{what}: the denoiser has no mixture-of-experts layers; set model.moe (recipes/tiny-moe.yaml)"
        )
    return layers


class _MoEFlag(Variant):
    """A true/false switch of one ``model.moe`` key: ``key`` set to ``on`` (true) or ``off`` (false)."""

    key_name: str = ""
    on: str = ""
    off: str = ""

    def validate(self):
        if not isinstance(self.value, bool):
            self.fail(f"expected true or false, got {self.value!r}")

    def setting(self) -> str:
        return self.on if self.value else self.off

    def overrides(self):
        return {f"model.moe.{self.key_name}": self.setting()}

    def verify(self, arm):
        for name, layer in _moe_layers(arm, self.name).items():
            got = getattr(layer.config, self.key_name)
            if got != self.setting():
                raise RuntimeError(f"{self.name}: layer {name} has {self.key_name} {got}, not {self.setting()}")


@register
class RouterBF16(_MoEFlag):
    name = "router-bf16"
    sets = ("model.moe.router_precision",)
    help = "MoE router logits and softmax in the bf16 autocast dtype instead of fp32 (model.moe.router_precision)"
    key_name, on, off = "router_precision", "autocast", "fp32"

    def deployment(self):
        return Deployment("router-bf16", precisions=("bf16-mixed",))


@register
class ExpertGrouped(_MoEFlag):
    name = "expert-grouped"
    sets = ("model.moe.expert_compute",)
    help = "all MoE experts in one batched matmul over a (experts, capacity, width) buffer (model.moe.expert_compute)"
    fp32_equivalent = True  # the same expert MLPs, summed in another order
    key_name, on, off = "expert_compute", "grouped", "loop"


@register
class ExpertLoop(_MoEFlag):
    name = "expert-loop"
    sets = ("model.moe.expert_compute",)
    help = "one matmul per MoE expert over its own tokens, outputs added expert by expert (model.moe.expert_compute)"
    fp32_equivalent = True
    key_name, on, off = "expert_compute", "loop", "grouped"
