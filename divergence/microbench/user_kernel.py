"""Bring your own kernel: ``--impl module:function`` runs any attention callable in the sweep.

The callable's contract (``docs/bias.md``, "Your own kernel")::

    out = function(q, k, v, *, scale: float, causal: bool)

- ``q``, ``k``, ``v``: (B, H, L, D) tensors in the number format under test (bf16, fp16, fp32
  or fp64), bit-identical across formats (:mod:`.inputs`); ``scale`` is the score multiplier
  ``1 / sqrt(D)``; ``causal`` is ``inputs.causal`` (query i sees keys j <= i).
- ``out``: (B, H, L, D), in the inputs' dtype, every element finite.
- Backward: when ``out`` carries an autograd graph back to ``q``, ``k``, ``v`` (a
  ``torch.autograd.Function``, or plain differentiable operations), the sweep measures dQ, dK,
  dV through it; otherwise those cells stay empty.

``module`` is imported as Python imports it (``sys.path``, so ``PYTHONPATH`` or the current
folder); ``function`` may be a dotted attribute path (``module:Class.method``). A kernel that
cannot be imported, is not callable, or returns the wrong shape, dtype or a non-finite value is
a :class:`~divergence.errors.UserInputError` naming the spec: one line, exit 2 at the command line.
"""

from __future__ import annotations

import importlib
import re
from typing import Callable

import torch

from divergence.attention.kernels import dtype_name
from divergence.errors import UserInputError

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_user_impl(spec: str) -> bool:
    """``module:function`` (a user's kernel), not a built-in name."""
    return bool(_SPEC.match(str(spec)))


def load_user_kernel(spec: str) -> Callable[..., torch.Tensor]:
    """The callable ``spec`` names; UserInputError (one line) when it cannot be had."""
    module_name, attr = str(spec).split(":", 1)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise UserInputError(f"--impl {spec}: cannot import module {module_name!r} ({err})") from None
    except Exception as err:  # the module's own code failed: still the user's file, still one line
        raise UserInputError(
            f"--impl {spec}: importing {module_name!r} raised {type(err).__name__}: {_first_line(err)}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserInputError(f"--impl {spec}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserInputError(f"--impl {spec}: {attr!r} is a {type(obj).__name__}, not a callable")
    return obj


def call_user_kernel(spec: str, fn, q, k, v, *, causal: bool) -> torch.Tensor:
    """``fn``'s output on (B, H, L, D) inputs, checked against the contract (module docstring)."""
    scale = q.shape[-1] ** -0.5
    try:
        out = fn(q, k, v, scale=scale, causal=causal)
    except UserInputError:
        raise
    except Exception as err:
        raise UserInputError(f"--impl {spec}: raised {type(err).__name__}: {_first_line(err)}") from None
    check_output(spec, out, q)
    return out


def check_output(spec: str, out, q: torch.Tensor) -> None:
    """UserInputError unless ``out`` is a finite tensor of ``q``'s shape (B, H, L, D) and dtype."""
    where = f"--impl {spec} on {tuple(q.shape)} {dtype_name(q.dtype)} inputs"
    if not isinstance(out, torch.Tensor):
        raise UserInputError(f"{where}: returned a {type(out).__name__}, expected a tensor")
    if tuple(out.shape) != tuple(q.shape):
        raise UserInputError(f"{where}: returned shape {tuple(out.shape)}, expected (B, H, L, D) = {tuple(q.shape)}")
    if out.dtype != q.dtype:
        raise UserInputError(
            f"{where}: returned dtype {dtype_name(out.dtype)}, expected the inputs' {dtype_name(q.dtype)}"
        )
    bad = int((~torch.isfinite(out.detach())).sum())
    if bad:
        raise UserInputError(f"{where}: {bad} of {out.numel()} output elements are not finite")


def user_backward(spec: str, fn, q, k, v, dout, *, causal: bool):
    """``(dq, dk, dv)`` by autograd through ``fn``, or None when its output has no graph."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = call_user_kernel(spec, fn, *leaves, causal=causal)
    if out.grad_fn is None:
        return None
    try:
        grads = torch.autograd.grad(out, leaves, dout, allow_unused=True)
    except Exception as err:
        raise UserInputError(f"--impl {spec}: backward raised {type(err).__name__}: {_first_line(err)}") from None
    for name, g, x in zip(("dq", "dk", "dv"), grads, leaves):
        if g is None or tuple(g.shape) != tuple(x.shape) or not bool(torch.isfinite(g).all()):
            raise UserInputError(f"--impl {spec}: backward gave no finite {name} of shape {tuple(x.shape)}")
    return grads


def probe(spec: str, device: str, dtype: torch.dtype, head_dim: int, causal: bool) -> None:
    """Load ``spec`` and run it on a small seeded input: the checks before any work is written."""
    fn = load_user_kernel(spec)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, head_dim, generator=gen).to(device=device, dtype=dtype) for _ in range(3))
    call_user_kernel(spec, fn, q, k, v, causal=causal)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"
