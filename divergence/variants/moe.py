"""Variants of a mixture-of-experts denoiser (``model.moe``, ``divergence.models.moe``).

- ``router-bf16``: the router's logits and softmax in the arm's autocast dtype (bf16) instead of
  fp32 (``model.moe.router_precision: autocast``), both arms otherwise under bf16 autocast; MoE
  practice keeps the router in fp32 (DeepSeek-V3 report, sec. 3.3) because a logit rounded to 8
  bits of mantissa can send a token to another expert;
- ``expert-grouped`` / ``expert-loop``: every expert in one batched matmul over an (E, C, D)
  buffer vs one matmul per expert over its own tokens (``model.moe.expert_compute``): the same
  math, other orders of sums (fp32-equivalent);
- ``expert-parallel``: ``NxB``, each MoE layer's experts spread over N ranks of B examples each,
  tokens sent to their experts' ranks and back by all-to-all (``train.expert_parallel``,
  ``divergence.models.expert_parallel``), vs ``1xNB``: all experts on one process, the same global
  batch; the identity in fp32, its arms trained as separate jobs (``per_process``).

Each verifies on the built arm that every MoE layer computes as it says; an arm without MoE
layers (``model.moe: null``) is refused, naming the fix.
"""

from __future__ import annotations

from divergence.variants.deployment import Deployment
from divergence.variants.parallel import DataParallel
from divergence.variants.registry import Switch, register


def _moe_layers(arm, what: str) -> dict:
    from divergence.models.moe import moe_layers

    layers = moe_layers(arm.unet)
    if not layers:
        raise RuntimeError(
            f"{what}: the denoiser has no mixture-of-experts layers; set model.moe (recipes/tiny-moe.yaml)"
        )
    return layers


class _MoEFlag(Switch):
    """A true/false switch of one ``model.moe`` key: ``key`` set to ``on`` (true) or ``off`` (false)."""

    key_name: str = ""
    on: str = ""
    off: str = ""

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


@register
class ExpertParallel(DataParallel):
    """``data-parallel``'s NxB (N ranks of B examples, the same global batch as one process of N B),
    with each MoE layer's experts spread over the N ranks and tokens sent to them by all-to-all."""

    name = "expert-parallel"
    sets = ("train.expert_parallel", "train.devices", "train.batch_size")
    help = "NxB: MoE experts spread over N ranks of B examples each, tokens sent by all-to-all (1x16: all on one)"
    fp32_equivalent = True  # the same experts on the same tokens; the router's and gradients' sums split over ranks
    per_process = True

    def overrides(self):
        return {"train.expert_parallel": self.ranks, "train.devices": self.ranks, "train.batch_size": self.per_rank}

    @classmethod
    def as_base(cls, recipe: dict, base: dict) -> dict:
        """The experts on one rank, and N ranks of B read as one batch of N B (``data-parallel``'s)."""
        recipe = super().as_base(recipe, base)
        train = recipe.get("train")
        if not isinstance(train, dict) or "expert_parallel" not in train:
            return recipe
        return {**recipe, "train": {**train, "expert_parallel": base["train"]["expert_parallel"]}}

    def verify(self, arm):
        from divergence.models.expert_parallel import sharded_experts

        super().verify(arm)  # N ranks of B examples
        layers = _moe_layers(arm, self.name)
        sharded = sharded_experts(arm.unet)
        want = {name: self.ranks for name in layers} if self.ranks > 1 else {}
        if sharded != want:
            raise RuntimeError(
                f"expert-parallel {self.value}: experts sharded over {sharded or 'no ranks'}, not {want}"
            )
