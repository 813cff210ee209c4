"""Coherence of a sequence of errors: does it drift (one direction) or wander (random directions)?

For per-step error vectors ``e_1 .. e_T`` (for example the gradient with an optimization on
minus the gradient with it off, on the same weights and batch)::

    C(T)       = ||sum_t e_t|| / sqrt(sum_t ||e_t||^2)
    mean_cos   = mean over t of cos(e_t, e_{t+1})

Independent zero-mean errors add like a random walk: ``E ||sum e_t||^2 = sum ||e_t||^2``, so
C stays near 1. Errors with a common direction (a bias) add like ``t``: for identical ``e_t``,
C = sqrt(T). Between the two, with ``e_t = b + n_t`` (a bias ``b`` and independent noise of
energy ``s^2`` per step), ``C^2`` tends to ``1 + (T - 1) ||b||^2 / (||b||^2 + s^2)``. This is why a
biased rounding (Qiu and Yao, arXiv 2510.04212, 2025) matters more than its size suggests, and
what a magnitude ratio cannot tell (docs/method.md). ``mean_cos`` says the same per step:
near 0 for wandering errors, near 1 for drifting ones.

Pure functions: errors are tensors or arrays of one shape (flattened), sums in float64.

>>> import torch
>>> e = [torch.tensor([1.0, 0.0])] * 4
>>> coherence(e)["coherence"], coherence(e)["mean_cos"]
(2.0, 1.0)
"""

from __future__ import annotations

import math

import torch


def coherence(errors) -> dict[str, float]:
    """``{"coherence": C(T), "mean_cos": ..., "steps": T}`` of a sequence of error vectors
    (module docstring); C is NaN when every error is zero, mean_cos NaN for fewer than 2 steps."""
    errors = [_flat(e) for e in errors]
    if not errors:
        raise ValueError("coherence needs at least one error vector")
    if len({e.numel() for e in errors}) != 1:
        raise ValueError(f"error vectors differ in size: {sorted({e.numel() for e in errors})}")
    sums = CoherenceSums()
    out = [sums.add(e) for e in errors][-1]
    return {"coherence": out["coherence"], "mean_cos": out["mean_cos"], "steps": out["steps"]}


def coherence_curve(errors) -> list[float]:
    """``C(1), C(2), .. C(T)``: the coherence of every prefix, in one pass."""
    sums = CoherenceSums()
    return [sums.add(e)["coherence"] for e in errors]


def _flat(error) -> torch.Tensor:
    return torch.as_tensor(error).detach().double().flatten()


def _ratio(norm: float, energy: float) -> float:
    """``||S|| / sqrt(E)``; NaN when every error is zero."""
    return norm / math.sqrt(energy) if energy > 0 else float("nan")


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else float("nan")


class CoherenceSums:
    """``C(T)`` and the consecutive cosines of a stream of errors, without keeping the sequence.

    Holds ``S = sum_t e_t`` (float64), ``E = sum_t ||e_t||^2`` and the last ``e_t``, so
    ``add(e)`` returns what :func:`coherence` would return of every error added so far
    (``coherence`` ``||S|| / sqrt(E)``, ``cos`` of ``e`` with the previous error, ``mean_cos``,
    ``steps``). Memory: two float64 copies of one error vector. ``state_dict`` /
    ``load_state_dict`` carry it across a resume.

    >>> sums = CoherenceSums()
    >>> [round(sums.add(torch.tensor([1.0, 0.0]))["coherence"], 3) for _ in range(4)]
    [1.0, 1.414, 1.732, 2.0]
    """

    def __init__(self):
        self.total: torch.Tensor | None = None
        self.last: torch.Tensor | None = None
        self.energy, self.cos_sum, self.cos_count, self.steps = 0.0, 0.0, 0, 0

    def add(self, error) -> dict[str, float]:
        e = _flat(error)
        if self.total is not None and e.numel() != self.total.numel():
            raise ValueError(f"error vector of {e.numel()} elements after ones of {self.total.numel()}")
        self.total = e.clone() if self.total is None else self.total + e
        self.energy += float(e.square().sum())
        cos = _cos(self.last, e) if self.last is not None else float("nan")
        if not math.isnan(cos):
            self.cos_sum, self.cos_count = self.cos_sum + cos, self.cos_count + 1
        self.last, self.steps = e, self.steps + 1
        return {
            "coherence": _ratio(float(self.total.norm()), self.energy),
            "cos": cos,
            "mean_cos": self.cos_sum / self.cos_count if self.cos_count else float("nan"),
            "steps": self.steps,
        }

    def state_dict(self) -> dict:
        return dict(vars(self))  # total, last, energy, cos_sum, cos_count, steps

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


class LayeredCoherence:
    """:class:`CoherenceSums` per layer, and the whole model's from the same sums (no second copy).

    For errors split into layers ``e_t = (e_t^1, .., e_t^L)``: ``||S||^2 = sum_l ||S^l||^2``,
    ``E = sum_l E^l`` and ``<e_t, e_{t-1}> = sum_l <e_t^l, e_{t-1}^l>``, so the whole model's C(T)
    and cosines are exactly :func:`coherence` of the concatenated vectors.

    >>> c = LayeredCoherence()
    >>> out = [c.add({"x": torch.tensor([1.0]), "y": torch.tensor([0.0, 1.0])}) for _ in range(4)]
    >>> round(out[-1]["model"]["coherence"], 3), out[-1]["layers"]["x"]
    (2.0, 2.0)
    """

    def __init__(self):
        self.layers: dict[str, CoherenceSums] = {}
        self.cos_sum, self.cos_count, self.steps = 0.0, 0, 0

    def add(self, errors: dict) -> dict:
        """``{"model": {coherence, cos, mean_cos, steps, err_norm}, "layers": {layer: C(T)}}`` after adding ``errors``."""
        if self.layers and set(errors) != set(self.layers):
            raise ValueError(f"layers changed: {sorted(set(errors) ^ set(self.layers))[:3]}")
        dot = sq_now = sq_last = 0.0
        for name, error in errors.items():
            sums = self.layers.setdefault(name, CoherenceSums())
            e = _flat(error)
            if sums.last is not None:
                dot += float(e @ sums.last)
                sq_last += float(sums.last.square().sum())
            sq_now += float(e.square().sum())
            sums.add(e)
        cos = dot / math.sqrt(sq_now * sq_last) if self.steps and sq_now > 0 and sq_last > 0 else float("nan")
        if not math.isnan(cos):
            self.cos_sum, self.cos_count = self.cos_sum + cos, self.cos_count + 1
        self.steps += 1
        energy = sum(s.energy for s in self.layers.values())
        total = math.sqrt(sum(float(s.total.square().sum()) for s in self.layers.values()))
        return {
            "model": {
                "coherence": _ratio(total, energy),
                "cos": cos,
                "mean_cos": self.cos_sum / self.cos_count if self.cos_count else float("nan"),
                "steps": self.steps,
                "err_norm": math.sqrt(sq_now),
            },
            "layers": {name: _ratio(float(s.total.norm()), s.energy) for name, s in self.layers.items()},
        }

    def state_dict(self) -> dict:
        return {
            "layers": {name: s.state_dict() for name, s in self.layers.items()},
            "cos_sum": self.cos_sum,
            "cos_count": self.cos_count,
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.layers = {}
        for name, sums in state["layers"].items():
            self.layers[name] = CoherenceSums()
            self.layers[name].load_state_dict(sums)
        self.cos_sum, self.cos_count, self.steps = state["cos_sum"], state["cos_count"], state["steps"]
