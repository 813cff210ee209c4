"""Shadow attention: two kernels on identical inputs inside a real model, one of them returned.

This is the paper's in-model comparison (Golden et al., 2024, section 4): every attention call
(or every ``every``-th) runs a primary and a secondary kernel on the same query, key and value;
the model continues with the primary's output, so training is exactly the primary's, and the
per-layer output deviation goes to a :class:`ShadowRecorder` that a training callback drains::

    recorder = ShadowRecorder()
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            module.set_processor(ShadowAttnProcessor("sdpa-flash", "baseline",
                                                     recorder=recorder, layer_name=name))
    ...
    recorder.drain()  # {"down.0.attn1": {"max_abs_diff": ..., "mean_abs_diff": ..., "calls": 3}}

Deviations are kept as tensors on the model's device and turned into floats only by ``drain``,
so recording does not synchronize the device on every call.
"""

from __future__ import annotations

import threading

import torch

from divergence.attention.joint import KernelJointAttnProcessor
from divergence.attention.kernels import Kernel
from divergence.attention.processor import KernelAttnProcessor
from divergence.errors import check_int


class ShadowRecorder:
    """Per-layer max and mean absolute output difference, accumulated until :meth:`drain`.

    ``max_abs_diff`` is the largest ``|primary - secondary|`` element over the recorded calls;
    ``mean_abs_diff`` is the mean over calls of each call's mean ``|primary - secondary|``.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._stats: dict[str, dict] = {}

    def record(self, layer_name: str, primary: torch.Tensor, secondary: torch.Tensor) -> None:
        """Add one call's deviation between two same-shaped outputs of layer ``layer_name``."""
        diff = (primary.detach().double() - secondary.detach().double()).abs()
        with self._lock:
            entry = self._stats.setdefault(layer_name, {"max": None, "sum_mean": None, "calls": 0})
            top, mean = diff.max(), diff.mean()
            entry["max"] = top if entry["max"] is None else torch.maximum(entry["max"], top)
            entry["sum_mean"] = mean if entry["sum_mean"] is None else entry["sum_mean"] + mean
            entry["calls"] += 1

    def drain(self) -> dict[str, dict[str, float]]:
        """``{layer_name: {"max_abs_diff", "mean_abs_diff", "calls"}}`` since the last drain; resets."""
        with self._lock:
            stats, self._stats = self._stats, {}
        return {name: _summary(e) for name, e in stats.items()}


def _summary(entry: dict) -> dict:
    return {
        "max_abs_diff": float(entry["max"]),
        "mean_abs_diff": float(entry["sum_mean"]) / entry["calls"],
        "calls": entry["calls"],
    }


class ShadowAttnProcessor(KernelAttnProcessor):
    """Return ``primary_kernel``'s attention; every ``every``-th call also run ``secondary_kernel``.

    Parameters
    ----------
    primary_kernel, secondary_kernel : :class:`Kernel` or registered name
    every : compare on calls 1, 1 + every, 1 + 2 * every, ... (1 = every call)
    recorder : where deviations go; a fresh :class:`ShadowRecorder` when omitted
    layer_name : key of this layer in the recorder (the module's name in the model)
    """

    def __init__(
        self,
        primary_kernel: Kernel | str,
        secondary_kernel: Kernel | str,
        every: int = 1,
        recorder: ShadowRecorder | None = None,
        layer_name: str = "attn",
    ):
        super().__init__(primary_kernel)
        self.secondary = KernelAttnProcessor(secondary_kernel).kernel
        self.every = check_int(every, "every", 1)
        self.recorder = recorder if recorder is not None else ShadowRecorder()
        self.layer_name = layer_name
        self.calls = 0

    def _attend(self, query, key, value, attention_mask) -> torch.Tensor:
        out = self.kernel(query, key, value, attn_mask=attention_mask)
        if self.calls % self.every == 0:
            with torch.no_grad():  # a measurement: no graph, no gradient through the secondary
                other = self.secondary(query, key, value, attn_mask=attention_mask)
            self.recorder.record(self.layer_name, out, other)
        self.calls += 1
        return out


class ShadowJointAttnProcessor(ShadowAttnProcessor, KernelJointAttnProcessor):
    """:class:`ShadowAttnProcessor` for SD3 joint attention: the joint (image + caption) query,
    key and value go to both kernels; ``__call__`` is :class:`KernelJointAttnProcessor`'s."""
