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
- ``uniform:LO:HI``: U(LO, HI), e.g. ``uniform:0:1``;
- ``ties:S:N`` (``ties`` = ``ties:1:16``, ``ties:S`` = ``ties:S:16``): Q from N(0, S^2), every
  key one of ``N`` distinct N(0, S^2) keys (repeated keys, a low-rank K), so every query row has
  about ``L / N`` scores exactly tied at its maximum, and V from N(-S, S^2), mostly negative: the
  two conditions under which Qiu and Yao (arXiv 2510.04212, 2025, section 3.3.2 and Fig. 6a)
  find bf16 flash attention's rounding of ``P V`` biased;
- ``lowrank:S:NOISE`` (``lowrank`` = ``lowrank:1:0.01``): similar low-rank representations, as
  they find late in training (their section 3.3.1): in each (batch, head) every row of Q, K, V
  and of the output gradient dO is one shared N(0, S^2) vector plus N(0, (NOISE * S)^2) noise,
  V's shared vector shifted by -S (mostly negative), so every row's scores are nearly equal and
  several tie at its maximum in bf16.

>>> d = parse_dist("uniform:0:1")
>>> d.label, round(d.std, 4)
('U(0, 1)', 0.2887)
>>> parse_dist("normal:0.5").label
'N(0, 0.5²)'
>>> parse_dist("ties").spec, parse_dist("ties:0.5:8").label
('ties:1:16', 'ties(N(0, 0.5²), 8 keys)')
>>> parse_dist("lowrank").spec, parse_dist("lowrank:1:0.05").label
('lowrank:1:0.01', 'low-rank(N(0, 1), noise 0.05)')
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
    """One input distribution: ``family`` normal (``a`` = 0 mean, ``b`` = std), uniform
    (``a`` = low, ``b`` = high), ties (``a`` = distinct keys, ``b`` = std) or lowrank (``a`` =
    the noise's share of the std, ``b`` = std)."""

    family: str
    a: float
    b: float

    @property
    def spec(self) -> str:
        """The canonical spec, the ``input_dist`` column of results.csv."""
        if self.family == "normal":
            return f"normal:{_num(self.b)}"
        if self.family == "ties":
            return f"ties:{_num(self.b)}:{int(self.a)}"
        if self.family == "lowrank":
            return f"lowrank:{_num(self.b)}:{_num(self.a)}"
        return f"uniform:{_num(self.a)}:{_num(self.b)}"

    @property
    def label(self) -> str:
        """Human-readable: ``N(0, 0.25²)`` or ``U(0, 1)``."""
        normal = "N(0, 1)" if self.b == 1 else f"N(0, {_num(self.b)}²)"
        if self.family == "normal":
            return normal
        if self.family == "ties":
            return f"ties({normal}, {int(self.a)} keys)"
        if self.family == "lowrank":
            return f"low-rank({normal}, noise {_num(self.a)})"
        return f"U({_num(self.a)}, {_num(self.b)})"

    @property
    def std(self) -> float:
        """Standard deviation of one input element: S, or (HI - LO) / sqrt(12)."""
        return self.b if self.family in ("normal", "ties", "lowrank") else (self.b - self.a) / math.sqrt(12)


def parse_dist(spec: str, key: str = "inputs.scales") -> InputDist:
    """``"normal:S"`` or ``"uniform:LO:HI"`` -> :class:`InputDist`; a RecipeError naming ``key``."""
    parts = str(spec).strip().split(":")
    hint = (
        "expected normal:STD (e.g. normal:0.5), uniform:LOW:HIGH (e.g. uniform:0:1), ties[:STD[:KEYS]] "
        "(e.g. ties:1:16) or lowrank[:STD[:NOISE]] (e.g. lowrank:1:0.01)"
    )
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
    if parts[0] == "ties" and numbers is not None and len(numbers) <= 2:
        std, keys = (numbers + [1.0, 16.0][len(numbers) :])[:2]
        if not 0 < std <= _LIMIT or keys != int(keys) or keys < 1:
            raise RecipeError(f"{key}: {spec!r}: needs 0 < STD <= {_LIMIT:g} and a whole number of KEYS >= 1")
        return InputDist("ties", float(int(keys)), std)
    if parts[0] == "lowrank" and numbers is not None and len(numbers) <= 2:
        std, noise = (numbers + [1.0, 0.01][len(numbers) :])[:2]
        if not 0 < std <= _LIMIT or not 0 <= noise <= 1:
            raise RecipeError(f"{key}: {spec!r}: needs 0 < STD <= {_LIMIT:g} and 0 <= NOISE <= 1")
        return InputDist("lowrank", noise, std)
    raise RecipeError(f"{key}: {spec!r}: {hint}")


def _num(x: float) -> str:
    return f"{x:g}"
