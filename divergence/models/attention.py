"""Apply an attention variant, by name, to ONE model, then verify every attention module took it.

diffusers' ``set_attention_backend`` changes a process-wide default and skips processors it does
not know, so two models in one process can silently share a kernel. Here instead each attention
module of the given model gets a processor calling the named kernel from ``divergence.attention``,
and ``verify_attention`` fails loudly if any module holds another processor. The variant applies
to the denoiser: the text encoder keeps one fixed implementation in every arm (see
``divergence.models.build``).

Attention modules are found by their processor interface (``processor`` and ``set_processor``),
not by class, so UNet, PixArt and SD3 attention are all found. The processor a module gets
follows the math its current processor does: plain (self or cross) attention gets
``KernelAttnProcessor``, SD3's joint attention (``JointAttnProcessor2_0``) gets
``KernelJointAttnProcessor``; any other processor (Flux's ``FluxAttnProcessor``, with rotary
embeddings) is an error naming the module, never a silent swap to different math.
"""

from __future__ import annotations

import torch

from divergence.errors import RecipeError, UserInputError
from divergence.recipe.model import AttentionConfig

SHADOW = "shadow"


PLAIN, JOINT = "plain", "joint"


def attention_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every module of ``model`` with a swappable attention processor, by qualified name."""
    return {
        name: m
        for name, m in model.named_modules()
        if callable(getattr(m, "set_processor", None)) and hasattr(m, "processor")
    }


def attention_form(module: torch.nn.Module, name: str) -> str:
    """``plain`` or ``joint``: the attention math the module's current processor computes."""
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0, JointAttnProcessor2_0

    from divergence.attention.joint import KernelJointAttnProcessor
    from divergence.attention.processor import KernelAttnProcessor

    processor = module.processor
    if isinstance(processor, (JointAttnProcessor2_0, KernelJointAttnProcessor)):
        return JOINT
    if isinstance(processor, (AttnProcessor, AttnProcessor2_0, KernelAttnProcessor)):
        return PLAIN
    raise UserInputError(
        f"attention module {name!r} uses {type(processor).__name__}, which divergence has no kernel "
        "processor for (it supports diffusers' AttnProcessor2_0 and JointAttnProcessor2_0: UNet, PixArt, SD3)"
    )


def head_dim(model: torch.nn.Module) -> int:
    """The smallest attention head width among ``model``'s attention modules (64 if it has none)."""
    dims = [
        m.inner_dim // m.heads
        for m in attention_modules(model).values()
        if getattr(m, "inner_dim", None) and getattr(m, "heads", None)
    ]
    return min(dims, default=64)


def build_kernels(config: AttentionConfig) -> list:
    """The kernel objects a variant runs (two for ``shadow``); unknown names name the recipe key."""
    from divergence.attention.kernels import get_kernel

    options = dict(config.options)
    try:
        if config.name == SHADOW:
            unknown = sorted(set(options) - {"primary", "secondary", "every"})
            if unknown:
                raise RecipeError(f"attention.options.{unknown[0]}: shadow takes primary, secondary, every")
            return [get_kernel(options.get("primary", "sdpa-flash")), get_kernel(options.get("secondary", "baseline"))]
        return [get_kernel(config.name, **options)]
    except RecipeError:
        raise
    except (UserInputError, TypeError, KeyError) as err:
        raise RecipeError(f"attention.name {config.name!r} (options {options}): {err}") from None


def check_attention(config: AttentionConfig, device: torch.device, dtype: torch.dtype, head_dim: int = 64) -> None:
    """Fail at start, with the kernel's own reason, if ``device``/``dtype`` cannot run the variant."""
    for kernel in build_kernels(config):
        try:
            kernel.check(device, dtype, head_dim)
        except UserInputError as err:
            raise UserInputError(f"attention.name {config.name!r}: {err}") from None


def apply_attention(model: torch.nn.Module, config: AttentionConfig, recorder=None) -> dict[str, object]:
    """Give every attention module of ``model`` a processor for ``config``; return them by module name.

    ``recorder`` is the ``ShadowRecorder`` receiving the ``shadow`` variant's per-layer deviations.
    """
    modules = attention_modules(model)
    if not modules:
        raise UserInputError(
            f"attention.name {config.name!r}: the model has no attention modules to apply it to; "
            "use cross-attention blocks in model.unet.down_block_types / up_block_types, or a transformer"
        )
    kernels = build_kernels(config)
    forms = {name: attention_form(module, name) for name, module in modules.items()}
    processors = {name: _processor(config, kernels, recorder, name, forms[name]) for name in modules}
    for name, module in modules.items():
        module.set_processor(processors[name])
    verify_attention(model, processors)
    return processors


def verify_attention(model: torch.nn.Module, expected: dict[str, object]) -> None:
    """Raise if any attention module of ``model`` does not hold exactly its expected processor."""
    modules = attention_modules(model)
    wrong = sorted(n for n, m in modules.items() if m.processor is not expected.get(n))
    missing = sorted(set(expected) - set(modules))
    if wrong or missing:
        example = (wrong or missing)[0]
        raise RuntimeError(
            f"attention variant not applied to {len(wrong) + len(missing)} of {len(expected)} "
            f"attention modules (e.g. {example!r} holds "
            f"{type(getattr(modules.get(example), 'processor', None)).__name__})"
        )


def _processor(config: AttentionConfig, kernels: list, recorder, layer_name: str, form: str = PLAIN):
    from divergence.attention.joint import KernelJointAttnProcessor
    from divergence.attention.processor import KernelAttnProcessor
    from divergence.attention.shadow import ShadowAttnProcessor, ShadowJointAttnProcessor

    if config.name == SHADOW:
        shadow = ShadowJointAttnProcessor if form == JOINT else ShadowAttnProcessor
        every = int(config.options.get("every", 1))
        return shadow(kernels[0], kernels[1], every=every, recorder=recorder, layer_name=layer_name)
    return (KernelJointAttnProcessor if form == JOINT else KernelAttnProcessor)(kernels[0])
