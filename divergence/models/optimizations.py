"""Training optimizations an arm applies to its built model where it trains: FP8 or INT8 linear
layers (torchao), INT8 quantization-aware training (torchao's fake-quantized linears) and ``torch.compile``.

They are applied in ``Arm.setup(device)``, after the weights exist and before the optimizer is
built, because the FP8 choice depends on the device: torchao's ``Float8Linear`` computes

    y = dequant(q8(x) @ q8(w)^T),   q8(t) = rnd_e4m3(t * s),  s = 448 / amax(t)

(tensorwise: one scale per tensor; rowwise: one per row, as a power of 2), with real scaled FP8
matmuls on an sm89+ GPU (``torch._scaled_mm``) and the same quantize / dequantize arithmetic on
anything else (``Float8LinearConfig.emulate``; torchao, "float8 training",
https://github.com/pytorch/ao/tree/main/torchao/float8). Only ``nn.Linear`` layers whose two
dimensions are multiples of 16 convert (the FP8 kernels' constraint); the names of those that did
are kept (``Arm.optimized``) so a variant can say which.

INT8 mixed-precision training (torchao.prototype.quantized_training): the inputs and weights of
every linear layer's forward and backward matmuls are quantized rowwise to int8 and the int32
product scaled back. torchao offers it as a weight tensor subclass or as a module swap; with
torch 2.13 the subclass silently falls back to the plain fp32 ``linear`` (measured: outputs and
gradients bitwise equal to the unconverted layer), so this uses the module swap
(``module_swap=True``), whose outputs differ. On a CPU its int8 products are computed exactly
with fp32 kernels (``divergence.models.int8_matmul``: bitwise the same, 25x faster without VNNI).

``torch.compile`` compiles the denoiser in place (``nn.Module.compile``: parameter names and
checkpoints unchanged) with inductor; ``TORCHINDUCTOR_CACHE_DIR`` decides where the compiled
artifacts are cached across runs.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with FP8 tensor cores


def apply_optimizations(arm, device: torch.device) -> dict:
    """Apply ``arm.recipe.train``'s fp8 / int8 / compile to ``arm`` (once); return what was done::

    {"fp8_layers": [...], "fp8_emulated": bool, "int8_layers": [...], "qat_layers": [...], "compiled": bool}
    """
    if getattr(arm, "optimized", None) is not None:
        return arm.optimized
    train = arm.recipe.train
    done = {"fp8_layers": [], "fp8_emulated": None, "int8_layers": [], "qat_layers": [], "compiled": False}
    modules = trained_modules(arm)
    if train.fp8 is not None:
        done["fp8_emulated"] = not fp8_hardware(torch.device(device))
        done["fp8_layers"] = convert_fp8(modules, train.fp8, emulate=done["fp8_emulated"])
    if train.int8:
        done["int8_layers"] = convert_int8(modules)
    if train.qat:
        done["qat_layers"] = convert_qat(modules)
    if train.compile:
        arm.unet.compile()
        done["compiled"] = True
    arm.optimized = done
    return done


def trained_modules(arm) -> dict[str, torch.nn.Module]:
    """The arm's modules whose linear layers train: the denoiser, and the text encoder when it trains."""
    modules = {"unet": arm.unet}
    if arm.train_text_encoder:
        modules["text_encoder"] = arm.text_encoder
    return modules


def fp8_hardware(device: torch.device) -> bool:
    """Whether ``device`` runs FP8 matmuls natively (a CUDA GPU of compute capability 8.9 or later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY


def convertible(module: torch.nn.Module) -> bool:
    """An ``nn.Linear`` whose input and output dimensions are multiples of 16."""
    return isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_fp8(modules: dict[str, torch.nn.Module], recipe: str, emulate: bool) -> list[str]:
    """Swap every convertible linear layer of ``modules`` for torchao's ``Float8Linear`` with the
    ``recipe`` scaling; return the converted layers' names (``unet.<fqn>``)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    names = []
    for prefix, module in modules.items():
        names += [f"{prefix}.{n}" for n, m in module.named_modules() if n and convertible(m)]
        convert_to_float8_training(module, config=config, module_filter_fn=lambda m, fqn: convertible(m))
    return names


def convert_int8(modules: dict[str, torch.nn.Module]) -> list[str]:
    """Swap every convertible linear layer for ``Int8Linear`` (torchao's INT8 mixed-precision training
    linear, module swap: see the module docstring); return the converted layers' names."""
    from torchao.prototype.quantized_training import int8_mixed_precision_training

    from divergence.models.int8_matmul import use_exact_cpu_int8_mm

    use_exact_cpu_int8_mm()  # bitwise torchao's own products, 25x faster on a CPU without VNNI
    config = int8_mixed_precision_training(module_swap=True)
    names = []
    for prefix, module in modules.items():
        for name, layer in module.named_modules():
            if name and convertible(layer) and not isinstance(layer, int8_linear_class()):
                layer.__class__, layer.config = int8_linear_class(), config
                names.append(f"{prefix}.{name}")
    return names


def convert_qat(modules: dict[str, torch.nn.Module]) -> list[str]:
    """Swap every ``nn.Linear`` of ``modules`` for torchao's ``FakeQuantizedLinear`` (quantization-aware
    training, ``QATConfig(step="prepare")``); return the converted layers' names. Each forward computes

        y = fq(x) fq(W)^T + b,   fq(t) = (clamp(round(t / s) + z, qmin, qmax) - z) s

    with int8 activations per token (asymmetric: scale and zero point from each row's min and max) and
    int8 weights per output channel (symmetric: s = amax / 127), recomputed every step; the backward
    passes gradients straight through the rounding (torchao, "Quantization-Aware Training",
    https://github.com/pytorch/ao/tree/main/torchao/quantization/qat). Weight names are unchanged."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    config = QATConfig(
        activation_config=IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False),
        weight_config=IntxFakeQuantizeConfig(torch.int8, "per_channel"),
        step="prepare",
    )
    names = []
    for prefix, module in modules.items():
        names += [f"{prefix}.{n}" for n, m in module.named_modules() if n and type(m) is torch.nn.Linear]
        quantize_(module, config, filter_fn=lambda m, fqn: type(m) is torch.nn.Linear)
    return names


def qat_layers(arm) -> list[str]:
    """The names of the arm's layers that train fake-quantized now (torchao's ``FakeQuantizedLinear``)."""
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    return _layers_of(arm, FakeQuantizedLinear)


@functools.cache
def int8_linear_class() -> type:
    """torchao's ``Int8MixedPrecisionTrainingLinear`` fed contiguous tensors: its int8 matmul views
    its input and the output's gradient as 2-D (``A.view(-1, A.shape[-1])``), which fails on the
    transposed activations of an attention block; ``.contiguous()`` copies them first (same values)."""
    from torchao.prototype.quantized_training.int8_mixed_precision import (
        Int8MixedPrecisionTrainingLinear,
        _Int8MixedPrecisionTrainingLinearFunction,
    )

    class ContiguousGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad.contiguous()

    class Int8Linear(Int8MixedPrecisionTrainingLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., in_features)
            y = _Int8MixedPrecisionTrainingLinearFunction.apply(x.contiguous(), self.weight, self.bias, self.config)
            return ContiguousGrad.apply(y)  # (..., out_features)

    return Int8Linear


def fp8_layers(arm) -> list[str]:
    """The names of the arm's layers that compute in FP8 now (``Float8Linear``)."""
    from torchao.float8.float8_linear import Float8Linear

    return _layers_of(arm, Float8Linear)


def int8_layers(arm) -> list[str]:
    """The names of the arm's layers that compute with INT8 mixed-precision matmuls now."""
    return _layers_of(arm, int8_linear_class())


def unconverted(arm, converted: list[str]) -> list[str]:
    """The arm's trained ``nn.Linear`` layers (torchao's replacements count as converted) not in ``converted``."""
    done = set(converted)
    return [name for name in _layers_of(arm, torch.nn.Linear) if name not in done]


def _layers_of(arm, cls: type) -> list[str]:
    """The names (``unet.<fqn>``) of the arm's trained modules that are ``cls`` instances."""
    return [
        f"{p}.{n}"
        for p, module in trained_modules(arm).items()
        for n, m in module.named_modules()
        if isinstance(m, cls)
    ]
