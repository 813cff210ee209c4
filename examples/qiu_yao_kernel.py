"""Qiu and Yao's own flash-attention kernel in ``divergence microbench``, from a local copy.

Their pure-PyTorch FlashAttention-2 (``attention.py`` of github.com/ucker/why-low-precision-training-fails,
arXiv 2510.04212, 2025) is not part of this repository. Get it, then point this adapter at it::

    git clone https://github.com/ucker/why-low-precision-training-fails /tmp/ucker
    pip install einops                                  # their file imports it
    QIU_YAO_ATTENTION=/tmp/ucker/attention.py PYTHONPATH=examples \\
        divergence microbench --precision bf16 --input-dist ties --seq-len 512 --block-size 64x256 \\
        --impl baseline flash flash-unbiased qiu_yao_kernel:unstable qiu_yao_kernel:stable \\
        --set inputs.heads=16 --out mb-theirs

``unstable`` runs it with ``STABLE=0``, ``stable`` with ``STABLE=1`` (their row-maximum change),
each setting the variable only around the forward pass, which is where their code reads it.
Tiles: ``QIU_YAO_TILE`` (``BRxBC`` or ``N``), default 512x512, their GPT-2 model's
(``model.py``: ``FlashAttentionFunction.apply(q, k, v, None, True, 512, 512)``); ``64x256`` is
the microbenchmark's reference tile. Their kernel keeps every tensor in the inputs' format
(O, the row sums and maxima, and the logsumexp it saves for the backward pass), and its scale
is always 1/sqrt(D), which is the scale the microbenchmark passes.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path

from divergence.errors import UserInputError

_loaded = {}


def _their_function():
    """``FlashAttentionFunction`` from the file ``QIU_YAO_ATTENTION`` names (loaded once)."""
    path = os.environ.get("QIU_YAO_ATTENTION", "")
    if path in _loaded:
        return _loaded[path]
    if not path or not Path(path).is_file():
        raise UserInputError(
            f"QIU_YAO_ATTENTION={path!r}: set it to your copy of their attention.py "
            "(github.com/ucker/why-low-precision-training-fails)"
        )
    if importlib.util.find_spec("einops") is None:
        raise UserInputError(f"{path}: their attention.py imports einops; pip install einops")
    spec = importlib.util.spec_from_file_location("qiu_yao_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "FlashAttentionFunction"):
        raise UserInputError(f"{path}: has no FlashAttentionFunction; is it their attention.py?")
    _loaded[path] = module.FlashAttentionFunction
    return _loaded[path]


def _tile() -> tuple[int, int]:
    text = os.environ.get("QIU_YAO_TILE", "512x512")
    try:
        sizes = [int(x) for x in text.lower().split("x")]
    except ValueError:
        sizes = []
    if len(sizes) not in (1, 2) or min(sizes) < 1:
        raise UserInputError(f"QIU_YAO_TILE={text!r}: expected BRxBC or N, e.g. 64x256")
    return sizes[0], sizes[-1]


@contextmanager
def _stable(flag: str):
    old = os.environ.get("STABLE")
    os.environ["STABLE"] = flag
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("STABLE")
        else:
            os.environ["STABLE"] = old


def _attend(q, k, v, scale, causal, flag):
    if abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise UserInputError(f"their kernel's scale is 1/sqrt(D) = {q.shape[-1] ** -0.5:g}, not {scale:g}")
    block_q, block_kv = _tile()
    with _stable(flag):
        return _their_function().apply(q, k, v, None, causal, block_q, block_kv)


def unstable(q, k, v, *, scale, causal):
    """Their kernel with ``STABLE=0``: FlashAttention-2 in the inputs' format."""
    return _attend(q, k, v, scale, causal, "0")


def stable(q, k, v, *, scale, causal):
    """Their kernel with ``STABLE=1``: with their row-maximum change."""
    return _attend(q, k, v, scale, causal, "1")
