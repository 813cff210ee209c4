"""Variants for the training optimizations people ship beyond the paper's (the deviation atlas).

- ``fp8``: linear layers in FP8 with torchao.float8, ``tensorwise`` or ``rowwise`` scaling, against
  the bf16 arm it replaces (deployment: bf16 autocast for both arms); emulated off sm89+ GPUs;
- ``int8-mixed``: torchao's INT8 mixed-precision training of the linear layers;
- ``int8-qat``: torchao's quantization-aware training, linear layers fake-quantized to int8;
- ``tensor-parallel``: the DiT's attention and MLP linears sharded over N ranks (one batch for all);
- ``compile``: the denoiser under ``torch.compile`` (inductor) against eager;
- ``grad-accumulation``: ``KxB``, k micro-batches of b examples per optimizer step, against one
  batch of k b (``{grad-accumulation: 1x16}``): the same global batch, summed in another order;
- ``cpu-threads``: the arm's intra-op threads on a CPU (1 vs 2 should change nothing; it does:
  a CPU splits its reductions by thread).

How each is applied to the arm: ``divergence.models.optimizations`` (fp8, int8, qat, compile),
``divergence.training.tensor_parallel`` (tensor parallel, under Lightning's ModelParallelStrategy),
``divergence.training.arm.regroup`` (accumulation), ``divergence.training.determinism.arm_numerics``
(threads).
"""

from __future__ import annotations

import sys

from divergence.extras import require
from divergence.variants.deployment import Deployment
from divergence.variants.registry import Switch, Variant, one_batch, register

FP8_RECIPES = ("tensorwise", "rowwise")


class _Int8Switch(Switch):
    """A true/false variant that needs torchao (``divergence[int8]``) when on."""

    def validate(self):
        super().validate()
        if self.value:
            require("int8", "torchao")


@register
class FP8(Variant):
    name = "fp8"
    sets = ("train.fp8",)
    help = "linear layers trained in FP8 (torchao.float8): tensorwise or rowwise scaling; emulated off sm89+ GPUs"
    default = "tensorwise"
    choices = FP8_RECIPES

    def validate(self):
        super().validate()
        require("fp8", "torchao")

    def deployment(self):
        # FP8 training replaces a bf16 autocast recipe (torchao: "a drop-in for bf16 training")
        return Deployment(f"fp8 {self.value}", precisions=("bf16-mixed",))

    def verify(self, arm):
        from divergence.models.optimizations import fp8_layers

        layers = fp8_layers(arm)
        if not layers:
            raise RuntimeError(
                f"fp8 {self.value}: no linear layer converted (only nn.Linear layers whose two "
                "dimensions are multiples of 16 do)"
            )
        how = "emulated" if (arm.optimized or {}).get("fp8_emulated") else "scaled FP8 matmuls"
        _say_converted(f"fp8 {self.value}", f"in FP8 ({how})", arm, layers)


@register
class Int8Mixed(_Int8Switch):
    name = "int8-mixed"
    sets = ("train.int8",)
    help = "linear layers trained with torchao's INT8 mixed-precision matmuls (forward and backward)"

    def verify(self, arm):
        from divergence.models.optimizations import int8_layers

        layers = int8_layers(arm) if self.value else []
        if self.value and not layers:
            raise RuntimeError(
                "int8-mixed: no linear layer converted (only nn.Linear layers whose two dimensions "
                "are multiples of 16 do)"
            )
        if layers:
            _say_converted("int8-mixed", "with INT8 matmuls", arm, layers)


@register
class Int8QAT(_Int8Switch):
    name = "int8-qat"
    sets = ("train.qat",)
    help = "linear layers trained fake-quantized to int8 (torchao QAT: per-token activations, per-channel weights)"

    def verify(self, arm):
        from divergence.models.optimizations import qat_layers

        layers = qat_layers(arm) if self.value else []
        if self.value and not layers:
            raise RuntimeError("int8-qat: no linear layer converted to torchao's FakeQuantizedLinear")
        if not self.value and arm.recipe.train.qat:  # (no torchao import when off)
            raise RuntimeError("int8-qat false but the arm's recipe has train.qat on")
        if layers:
            _say_converted("int8-qat", "fake-quantized to int8", arm, layers)


@register
class Compile(Switch):
    name = "compile"
    sets = ("train.compile",)
    help = "the denoiser compiled with torch.compile (inductor) instead of run eagerly"
    fp32_equivalent = True  # the same graph; inductor fuses and reorders its fp32 operations

    def verify(self, arm):
        compiled = getattr(arm.unet, "_compiled_call_impl", None) is not None
        if compiled != self.value:
            raise RuntimeError(f"compile {self.value} but the denoiser is {'' if compiled else 'not '}compiled")


@register
class GradAccumulation(Variant):
    name = "grad-accumulation"
    sets = ("train.accumulate", "train.batch_size")
    help = "KxB: k micro-batches of b examples per optimizer step (1x16: one batch of 16)"
    default = "4x4"
    fp32_equivalent = True  # the same mean gradient over the same examples, summed in another order

    def validate(self):
        self.k, self.b = self.counts("KxB (micro-batches x examples each, e.g. 4x4 against 1x16)")

    def overrides(self):
        return {"train.accumulate": self.k, "train.batch_size": self.b}

    @classmethod
    def as_base(cls, recipe: dict, base: dict) -> dict:
        """The step's examples as one batch (``batch_size x accumulate``, accumulate 1): 4 micro-batches
        of 4 read as one batch of 16, the global batch they train on."""
        return one_batch(recipe, "accumulate")

    def verify(self, arm):
        train = arm.recipe.train
        if (train.accumulate, train.batch_size) != (self.k, self.b):
            raise RuntimeError(
                f"grad-accumulation {self.value} but the arm trains {train.accumulate}x{train.batch_size}"
            )


@register
class CpuThreads(Variant):
    name = "cpu-threads"
    sets = ("train.cpu_threads",)
    help = "torch intra-op threads of the arm's step on a CPU (train.cpu_threads)"
    default = 2
    fp32_equivalent = True  # the same kernels, their reductions split over another number of threads

    def validate(self):
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 1:
            self.fail(f"expected a positive number of threads, got {self.value!r}")

    def deployment(self):
        return Deployment("cpu-threads", devices=("cpu",))

    def verify(self, arm):
        if arm.recipe.train.cpu_threads != self.value:
            raise RuntimeError(f"cpu-threads {self.value} but the arm's recipe has {arm.recipe.train.cpu_threads}")


def _say_converted(what: str, how: str, arm, layers: list[str]) -> None:
    """One line into the run's log (a study keeps each pair run's output in logs/): how many linear
    layers converted, and which did not (a dimension not a multiple of 16)."""
    from divergence.models.optimizations import unconverted

    left = unconverted(arm, layers)
    rest = f"; not converted (a dimension not a multiple of 16): {', '.join(left)}" if left else "; every one"
    print(f"{what}: {len(layers)} linear layers {how}{rest}", file=sys.stderr, flush=True)


@register
class TensorParallel(Variant):
    name = "tensor-parallel"
    sets = ("train.tensor_parallel", "train.devices")
    help = "the DiT's attention and MLP linears sharded over N ranks (torch tensor parallel), one batch for all"
    default = 2
    fp32_equivalent = True  # the same sums over heads and hidden units, split into N partial sums

    def validate(self):
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 1:
            self.fail(f"expected the number of ranks (1: no tensor parallelism), got {self.value!r}")

    def overrides(self):
        return {"train.tensor_parallel": self.value, "train.devices": self.value}

    @classmethod
    def as_base(cls, recipe: dict, base: dict) -> dict:
        """Only a tensor-parallel recipe reads as one rank: the devices of a data-parallel arm (which
        ``data-parallel`` reads as one batch) are not this variant's."""
        train = recipe.get("train")
        if not isinstance(train, dict) or train.get("tensor_parallel") in (None, 1):
            return recipe
        return super().as_base(recipe, base)

    def verify(self, arm):
        from divergence.models.tensor_parallel import sharded_linears

        sharded = sharded_linears(arm.unet)
        if self.value > 1 and not sharded:
            raise RuntimeError(f"tensor-parallel {self.value}: no linear layer of the denoiser is sharded")
        if self.value == 1 and sharded:
            raise RuntimeError(f"tensor-parallel 1: {len(sharded)} linear layers are sharded")
        if sharded:
            print(f"tensor-parallel {self.value}: {len(sharded)} linear layers sharded", file=sys.stderr, flush=True)


@register
class FsdpOffload(Switch):
    name = "fsdp-offload"
    sets = ("train.strategy", "train.grad_clip")
    help = "FSDP with parameters, gradients and optimizer state offloaded to host memory (GPU only)"
    fp32_equivalent = True  # the same sharded fp32 step, its optimizer update computed on the host
    refines = ("train.strategy",)  # after {data-parallel: NxB}: FSDP over its N ranks of B

    def overrides(self):
        # Lightning's FSDPStrategy would clip by each rank's shard of the norm (training.separate_arm._check_fsdp)
        return {"train.strategy": "fsdp_cpu_offload" if self.value else "fsdp", "train.grad_clip": None}

    def deployment(self):
        return Deployment("fsdp-offload", devices=("cuda",))

    def verify(self, arm):
        want = self.overrides()["train.strategy"]
        if arm.recipe.train.strategy != want:
            raise RuntimeError(f"fsdp-offload {self.value} but the arm's train.strategy is {arm.recipe.train.strategy}")
