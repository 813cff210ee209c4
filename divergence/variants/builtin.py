"""The variants divergence ships: the paper's three, and training optimizations beyond them.

- ``attention``: the attention kernel (flash vs baseline is the paper's question);
- ``seed``: the weight-init seed (the paper's reference bound: models that differ only by
  initialization are considered equivalent);
- ``data-seed``: the data order and noise (a fine-tune's seed reference: the init stays shared);
- ``precision``: the training precision (the paper's upper bound, FP16 vs FP32);
- ``gradient-checkpointing``: recompute UNet activations in the backward pass;
- ``adamw-impl``: the AdamW implementation (``foreach``, ``fused``, ``loop``), a fused-kernel
  optimization of the kind the paper names as future work;
- ``tf32``: TensorFloat-32 matmuls and convolutions for the arm (``train.tf32``), the CUDA
  speed-up people ask this exact question about; a no-op on a CPU;
- ``grad-noise``: a known dose for calibration, every gradient multiplied by ``1 + eps * xi``
  (``divergence calibrate``).
"""

from __future__ import annotations

import math

from divergence.recipe.run import ADAMW_IMPLS as TRAIN_ADAMW_IMPLS, PRECISIONS
from divergence.variants.deployment import Deployment
from divergence.variants.registry import Switch, Variant, register

ADAMW_IMPLS = tuple(i for i in TRAIN_ADAMW_IMPLS if i != "default")  # the variant names one explicitly
# Kernels that exist on GPUs for fp16/bf16 inputs only: wherever they are deployed, training runs
# under fp16/bf16 autocast (CUDA's flash SDPA backend and flash-attn refuse fp32; the fp32 "flash"
# kernel of a CPU is another kernel). bf16 first: no loss scaling, and on a CPU fp16 is slower still.
# flash-unbiased (Qiu and Yao's mitigation of bf16 flash attention's biased rounding) is used
# where the bias it removes arises: under bf16 autocast.
LOW_PRECISION_KERNELS = ("sdpa-flash", "flash-attn", "flash-unbiased")
LOW_PRECISIONS = ("bf16-mixed", "16-mixed")


@register
class Attention(Variant):
    name = "attention"
    sets = ("attention.name", "attention.options")
    help = "attention kernel of every UNet attention module (a name, or {name, options})"
    default = "sdpa"

    def validate(self):
        if not (isinstance(self.value, str) or (isinstance(self.value, dict) and "name" in self.value)):
            self.fail(f"expected a kernel name such as sdpa-flash, or {{name: ..., options: ...}}, got {self.value!r}")

    def overrides(self):
        if isinstance(self.value, str):
            return {"attention.name": self.value, "attention.options": {}}
        return {"attention.name": self.value["name"], "attention.options": dict(self.value.get("options", {}))}

    def deployment(self):
        name = self.value if isinstance(self.value, str) else self.value["name"]
        return Deployment(name, precisions=LOW_PRECISIONS) if name in LOW_PRECISION_KERNELS else None

    def verify(self, arm):
        from divergence.models.attention import attention_modules

        modules = attention_modules(arm.unet)
        wrong = [n for n, m in modules.items() if m.processor is not arm.processors.get(n)]
        if not modules or wrong:
            raise RuntimeError(
                f"attention variant {self.label()} did not reach {len(wrong) or 'any'} attention modules"
            )


@register
class Seed(Variant):
    name = "seed"
    sets = ("model.seed",)
    help = "weight-initialization seed of the arm (the data seed stays shared)"
    category = "seed"
    default = 1

    def validate(self):
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            self.fail(f"expected a non-negative integer seed, got {self.value!r}")


@register
class DataSeed(Seed):
    """A data-order / noise seed: the arm's ``data.seed``, which orders the examples and draws the noise,
    timesteps and caption dropout of every step (``divergence.data.sampling``; the shapes source draws
    its examples from it too: another sample of the same distribution). Its init stays shared, so in a
    fine-tune, where every arm starts from the same pretrained weights, this is the seed that matters
    (diffusers' ``--seed``) and the seed reference (``docs/method.md``, "Fine-tuning"); the lockstep
    pair gives such an arm its own batches (``training.arms_module``)."""

    name = "data-seed"
    sets = ("data.seed",)
    help = "data-order and noise seed of the arm (its init stays shared): the seed reference of a fine-tune"


@register
class Precision(Variant):
    name = "precision"
    sets = ("train.precision",)
    help = "training precision: 32-true, 16-mixed (with loss scaling) or bf16-mixed"
    category = "precision"
    default = "16-mixed"
    choices = PRECISIONS

    def verify(self, arm):
        if arm.policy is not None and arm.policy.name != self.value:
            raise RuntimeError(f"precision variant {self.value} but the arm trains in {arm.policy.name}")


@register
class GradientCheckpointing(Switch):
    name = "gradient-checkpointing"
    sets = ("model.gradient_checkpointing",)
    help = "recompute UNet activations during the backward pass instead of storing them"
    fp32_equivalent = True  # the same forward computed again: identical up to the order of fp32 sums

    def verify(self, arm):
        if bool(arm.unet.is_gradient_checkpointing) != self.value:
            raise RuntimeError(f"gradient checkpointing should be {self.value} but the UNet says otherwise")


@register
class AdamWImpl(Variant):
    name = "adamw-impl"
    sets = ("train.adamw_impl",)
    help = "AdamW implementation: loop (per-tensor), foreach (multi-tensor) or fused (one kernel)"
    default = "fused"
    choices = ADAMW_IMPLS
    fp32_equivalent = True  # the same update rule, its fp32 operations fused or ordered differently

    def verify(self, arm):
        defaults = arm.optimizer.defaults if arm.optimizer is not None else None
        if defaults is None:
            return
        actual = "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "loop"
        if actual != self.value:
            raise RuntimeError(f"adamw-impl {self.value} but the optimizer runs {actual}")


@register
class TF32(Switch):
    name = "tf32"
    sets = ("train.tf32",)
    help = "TensorFloat-32 tensor-core math for the arm's fp32 matmuls and convolutions (CUDA; no effect on a CPU)"

    def deployment(self):
        return Deployment("tf32", devices=("cuda",)) if self.value else None

    def verify(self, arm):
        from divergence.models.determinism import arm_numerics, numerics_state

        if arm.recipe.train.tf32 != self.value:
            raise RuntimeError(f"tf32 variant {self.value} but the arm's recipe has train.tf32 {arm.recipe.train.tf32}")
        if not getattr(type(arm).training_step, "applies_arm_numerics", False):
            raise RuntimeError("tf32 variant: the arm's training step does not apply its TF32 setting")
        with arm_numerics(arm.recipe.train):
            state = numerics_state()
        if (state["tf32_matmul"], state["tf32_cudnn"]) != (self.value, self.value):
            raise RuntimeError(f"tf32 variant {self.value} but the arm's step would run with {state}")


@register
class GradNoise(Variant):
    name = "grad-noise"
    sets = ("train.grad_noise",)
    help = "calibration dose eps: every gradient multiplied elementwise by (1 + eps * xi), xi ~ N(0, 1)"
    default = 0.0

    def validate(self):
        value = self.value
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            self.fail(f"expected a finite relative dose eps >= 0, e.g. 1e-4, got {self.value!r}")
        self.value = float(value)

    def verify(self, arm):
        if arm.recipe.train.grad_noise != self.value:
            raise RuntimeError(f"grad-noise {self.value} but the arm trains with {arm.recipe.train.grad_noise}")
