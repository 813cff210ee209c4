"""Input distributions of the microbenchmark, named by a short spec: the input-scale axis.

The flash/baseline error ratio depends on the softmax temperature the inputs produce. For
Q, K ~ N(0, s^2) the scaled scores ``q . k / sqrt(d)`` have standard deviation ``s^2``: at
s = 0.25 the softmax is nearly flat over thousands of keys (every weight tiny, the running sum
``l`` large, many roundings of similar size), at s = 2 it is peaked. U(0, 1) inputs give scores
with a large common offset and a spread of about 0.17 (d = 64), a nearly flat softmax too.
So the paper's "~10x" belongs to an input scale, a length and a baseline, not to flash alone
(``docs/method.md``, "The microbenchmark's ~10x").

Specs:

- ``normal:S``: N(0, S^2), e.g. ``normal:0.25``;
- ``uniform:LO:HI``: U(LO, HI), e.g. ``uniform:0:1``.

>>> d = parse_dist("uniform:0:1")
>>> d.label, round(d.std, 4)
('U(0, 1)', 0.2887)
>>> parse_dist("normal:0.5").label
'N(0, 0.5²)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from divergence.errors import RecipeError

# |x| stays far below fp16's largest value (65504) so no format overflows in Q K^T.
_LIMIT = 100.0
DEFAULT_SCALES = ("normal:0.25", "normal:0.5", "normal:1", "normal:2", "uniform:0:1")


@dataclass(frozen=True)
class InputDist:
    """One input distribution: ``family`` normal (``a`` = 0 mean, ``b`` = std) or uniform
    (``a`` = low, ``b`` = high)."""

    family: str
    a: float
    b: float

    @property
    def spec(self) -> str:
        """The canonical spec, the ``input_dist`` column of results.csv."""
        if self.family == "normal":
            return f"normal:{_num(self.b)}"
        return f"uniform:{_num(self.a)}:{_num(self.b)}"

    @property
    def label(self) -> str:
        """Human-readable: ``N(0, 0.25²)`` or ``U(0, 1)``."""
        if self.family == "normal":
            return "N(0, 1)" if self.b == 1 else f"N(0, {_num(self.b)}²)"
        return f"U({_num(self.a)}, {_num(self.b)})"

    @property
    def std(self) -> float:
        """Standard deviation of one input element: S, or (HI - LO) / sqrt(12)."""
        return self.b if self.family == "normal" else (self.b - self.a) / math.sqrt(12)


def parse_dist(spec: str, key: str = "inputs.scales") -> InputDist:
    """``"normal:S"`` or ``"uniform:LO:HI"`` -> :class:`InputDist`; a RecipeError naming ``key``."""
    parts = str(spec).strip().split(":")
    hint = "expected normal:STD (e.g. normal:0.5) or uniform:LOW:HIGH (e.g. uniform:0:1)"
    try:
        numbers = [float(p) for p in parts[1:]]
    except ValueError:
        numbers = None
    if parts[0] == "normal" and numbers is not None and len(numbers) == 1:
        std = numbers[0]
        if not 0 < std <= _LIMIT:
            raise RecipeError(f"{key}: {spec!r}: the std must be in (0, {_LIMIT:g}] so fp16 cannot overflow")
        return InputDist("normal", 0.0, std)
    if parts[0] == "uniform" and numbers is not None and len(numbers) == 2:
        lo, hi = numbers
        if not (-_LIMIT <= lo < hi <= _LIMIT):
            raise RecipeError(f"{key}: {spec!r}: needs LOW < HIGH, both within ±{_LIMIT:g}")
        return InputDist("uniform", lo, hi)
    raise RecipeError(f"{key}: {spec!r}: {hint}")


def legacy_dist(distribution: str, std: float) -> InputDist:
    """The distribution of ``inputs.distribution`` and ``inputs.std``: N(0, std^2) or U(-std, std)."""
    return InputDist("normal", 0.0, std) if distribution == "normal" else InputDist("uniform", -std, std)


def _num(x: float) -> str:
    return f"{x:g}"
