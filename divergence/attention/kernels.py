"""Real attention kernels, registered by name, each checked against a device and dtype.

A kernel is called like SDPA on (B, H, L, D) tensors: ``kernel(q, k, v, scale=None,
causal=False)`` returns (B, H, Lq, D) in ``q.dtype``. ``kernel.check(device, dtype)`` raises a
:class:`UserInputError` with a one-line reason when it cannot run there. A forced SDPA backend
runs under ``sdpa_kernel([backend])`` alone, so an unavailable backend errors instead of
PyTorch quietly dispatching to another one.

====================  ==========================================================
name                  what runs
====================  ==========================================================
``baseline``          :func:`~divergence.attention.reference.baseline_attention`
``sdpa``              ``scaled_dot_product_attention``, PyTorch's choice of backend
``sdpa-flash``        SDPA, flash backend forced (CUDA; also a CPU kernel)
``sdpa-math``         SDPA, math backend forced
``sdpa-efficient``    SDPA, memory-efficient backend forced (CUDA)
``sdpa-cudnn``        SDPA, cuDNN backend forced (CUDA)
``flash-attn``        ``flash_attn.flash_attn_func`` from the flash-attn package
``tiled``             :func:`~divergence.attention.tiled.flash_attention_tiled`; options
                      ``block_q``, ``block_kv``, ``accumulate``, ``block_order``
``flash-unbiased``    ``tiled`` with Qiu and Yao's row-maximum change (arXiv
                      2510.04212), kernel-faithful (fp32 accumulators) by default,
                      FlashAttention-2's backward
                      (:mod:`~divergence.attention.tiled_backward`); options those of
                      ``tiled`` and ``beta``, ``tie_tol``
====================  ==========================================================

>>> get_kernel("tiled", block_q=64, block_kv=256).name
'tiled'
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from divergence.attention.reference import baseline_attention
from divergence.attention.tiled import flash_attention_tiled
from divergence.attention.tiled_backward import trainable_flash_attention
from divergence.errors import UserInputError

# Backends with no CPU implementation: say so instead of PyTorch's generic "no viable backend".
_CUDA_ONLY = {"sdpa-efficient", "sdpa-cudnn"}

_SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-math": "MATH",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}


@dataclass(frozen=True)
class Kernel:
    """A named attention kernel on (B, H, L, D) tensors; see the module docstring."""

    name: str
    fn: Callable[..., torch.Tensor]
    description: str
    options: dict = field(default_factory=dict)
    probe: bool = True  # check availability by running a tiny input (SDPA backends)

    def __call__(self, q, k, v, *, scale=None, causal=False, attn_mask=None) -> torch.Tensor:
        return self.fn(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, **self.options)

    def check(self, device: str | torch.device, dtype: torch.dtype, head_dim: int = 64) -> None:
        """Raise UserInputError, one line, when this kernel cannot run on ``device``/``dtype``."""
        reason = self.unavailable_reason(device, dtype, head_dim)
        if reason:
            raise UserInputError(f"kernel {self.name!r} cannot run on {device} in {dtype_name(dtype)}: {reason}")

    def unavailable_reason(self, device, dtype, head_dim: int = 64) -> str | None:
        """Why this kernel cannot run there, or None when it can."""
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        if device.type != "cuda" and self.name in _CUDA_ONLY:
            return f"the {_SDPA_BACKENDS[self.name]} backend has no {device.type} kernel; it runs on CUDA"
        if not self.probe:
            return None
        return _probe(self, device, dtype, head_dim)


def _probe(kernel: Kernel, device, dtype, head_dim) -> str | None:
    """Run the kernel on a tiny input; turn its failure (and PyTorch's warnings) into a reason."""
    x = torch.zeros(1, 1, 8, head_dim, dtype=dtype, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            kernel(x, x, x)
            return None
        except (RuntimeError, UserInputError, NotImplementedError) as err:
            # PyTorch warns why each backend was skipped ("... requires q,k,v to have dtype ...").
            hints = [str(w.message).strip().splitlines()[0] for w in caught]
            hints = [h for h in hints if h and "not used because" not in h]
            return (hints[0] if hints else str(err).strip().splitlines()[0]).strip()


def _sdpa(q, k, v, *, scale, causal, attn_mask, backend: str | None = None):
    if attn_mask is not None and causal:
        raise UserInputError("pass either causal=True or attn_mask, not both (as SDPA requires)")
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, backend)]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale)


def _flash_attn(q, k, v, *, scale, causal, attn_mask):
    if attn_mask is not None:
        raise UserInputError("kernel 'flash-attn' takes no attention mask; use an sdpa kernel")
    from flash_attn import flash_attn_func

    # flash-attn wants (B, L, H, D).
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=causal)
    return out.transpose(1, 2)


class _FlashAttnKernel(Kernel):
    def unavailable_reason(self, device, dtype, head_dim: int = 64) -> str | None:
        if importlib.util.find_spec("flash_attn") is None:
            return "the flash-attn package is not installed (pip install flash-attn)"
        if torch.device(device).type != "cuda":
            return "flash-attn runs on CUDA only"
        if dtype not in (torch.float16, torch.bfloat16):
            return "flash-attn takes fp16 or bf16 only"
        return super().unavailable_reason(device, dtype, head_dim)


def _fixed(cls: type[Kernel], name: str, *args, **kwargs) -> Callable[..., Kernel]:
    """The factory of a kernel that takes no options: ``cls(name, *args, **kwargs)``."""

    def make(**options) -> Kernel:
        if options:
            raise UserInputError(f"kernel {name!r} takes no options, got {', '.join(sorted(options))}")
        return cls(name, *args, **kwargs)

    return make


def _make_sdpa(name: str) -> Callable[..., Kernel]:
    backend = _SDPA_BACKENDS.get(name)
    what = f"SDPA, {backend} backend forced" if backend else "SDPA, PyTorch's choice of backend"
    return _fixed(Kernel, name, _sdpa, what, options={"backend": backend})


_TILED_OPTIONS = ("block_q", "block_kv", "accumulate", "block_order")
# The number formats by their short names (recipes, the microbenchmark's precisions, messages).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
_ACCUMULATE_NAMES = {"none": None, **DTYPES}


def _tiled_options(name: str, options: dict, allowed: tuple[str, ...], defaults: dict) -> dict:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise UserInputError(f"kernel {name!r}: unknown option {unknown[0]!r}; allowed: {', '.join(allowed)}")
    options = {**defaults, **options}
    acc = options.get("accumulate")
    if isinstance(acc, str):  # from a recipe: "none", "fp32", ...
        if acc not in _ACCUMULATE_NAMES:
            raise UserInputError(f"kernel {name!r}: accumulate {acc!r} is not one of {', '.join(_ACCUMULATE_NAMES)}")
        options["accumulate"] = _ACCUMULATE_NAMES[acc]
    return options


def _make_tiled(**options) -> Kernel:
    options = _tiled_options("tiled", options, _TILED_OPTIONS, {"block_q": 64, "block_kv": 256})
    return Kernel(
        "tiled", flash_attention_tiled, "FlashAttention re-implemented in PyTorch", options=options, probe=False
    )


def _make_flash_unbiased(**options) -> Kernel:
    defaults = {"block_q": 64, "block_kv": 256, "accumulate": torch.float32, "unbiased": True}
    options = _tiled_options("flash-unbiased", options, (*_TILED_OPTIONS, "beta", "tie_tol"), defaults)
    what = "FlashAttention re-implemented, row-maximum change of Qiu and Yao (2025), FlashAttention-2 backward"
    return Kernel("flash-unbiased", trainable_flash_attention, what, options=options, probe=False)


KERNELS: dict[str, Callable[..., Kernel]] = {
    "baseline": _fixed(Kernel, "baseline", baseline_attention, "explicit softmax(Q K^T * scale) V", probe=False),
    "sdpa": _make_sdpa("sdpa"),
    **{name: _make_sdpa(name) for name in _SDPA_BACKENDS},
    "flash-attn": _fixed(_FlashAttnKernel, "flash-attn", _flash_attn, "flash_attn.flash_attn_func"),
    "tiled": _make_tiled,
    "flash-unbiased": _make_flash_unbiased,
}


def get_kernel(name: str, **options: Any) -> Kernel:
    """The kernel registered as ``name``, built with ``options`` (only ``tiled`` and ``flash-unbiased`` take any)."""
    if name not in KERNELS:
        raise UserInputError(f"unknown attention kernel {name!r}; known: {', '.join(KERNELS)}")
    return KERNELS[name](**options)


def available_kernels(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, head_dim: int = 64
) -> list[str]:
    """Names of the registered kernels that run on ``device`` in ``dtype`` (default options)."""
    return [n for n in KERNELS if get_kernel(n).unavailable_reason(device, dtype, head_dim) is None]


def dtype_name(dtype: torch.dtype) -> str:
    """``bf16``, ``fp16``, ``fp32`` or ``fp64``; any other dtype as torch spells it."""
    return next((name for name, known in DTYPES.items() if known == dtype), str(dtype))
