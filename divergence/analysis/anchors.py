"""The rules the big trainers use to call a loss difference a bug, as pure functions of loss curves.

Each takes the per-step losses of a test run and of its baseline (``{step: loss}``, the step the loss
of which was computed before the step's update, as ``ArmWriter`` records it) and answers True when the
rule passes (the runs are "the same"), False when it flags a difference. Each is implemented from its
published definition, cited below; none normalizes the gap by a measured noise.

- ``titan_assert_equal``: torchtitan ``scripts/loss_compare.py --assert-equal`` (pytorch/torchtitan):
  the losses parsed from both training logs must be equal at every step (``unittest``'s assertEqual per
  step, same set of steps). The log prints ``loss: {global_avg_loss:7.4f}``
  (``torchtitan/components/metrics.py``) and the script parses that text (``step:\\s*(\\d+)\\s*loss:
  \\s*(\\d+\\.\\d+)``), so the published rule compares losses rounded to 4 decimals: ``decimals=4``.
  ``decimals=None`` is bitwise equality of the floats.
- ``titan_step1_rtol``: torchtitan's CI for FSDP vs HSDP (pytorch/torchtitan PR #3847,
  ``.github/workflows/integration_test_8gpu_features.yaml``: ``loss_compare.py ... --assert-equal
  ${RTOL} --steps=1``, RTOL 1e-5, "a benign ~1e-6 cross-layout floating-point reduction-order
  effect"): the loss of step 1 only, |x - b| <= rtol |b|.
- ``megatron_golden``: Megatron-LM's functional tests (NVIDIA/Megatron-LM,
  ``tests/functional_tests/python_test_utils/test_ci_pipeline.py``, ``margin_loss = 0.05``;
  ``common.py``: ``METRIC_TO_THRESHOLD["lm loss"] = 0.05``): the actual ``lm loss`` list sliced
  ``[start_step:end_step:step_interval]`` (the golden values' ``step_interval`` 5) must equal the golden
  values within ``pytest.approx(rel=0.05)``: |x - g| <= max(0.05 |g|, 1e-12).
- ``megatron_band``: Megatron-LM's ``compute_golden_statistics.py``
  (``tests/functional_tests/python_test_utils/``): over repeated runs of the baseline, per step the mean
  and each sample's |sample - mean| / |mean|; the recommended relative tolerance is
  ``max(confidence_multiplier * max_relative_variance, 0.001)`` rounded to 4 decimals, the multiplier
  1.5 by default; the test run then passes when every step is within that tolerance of the runs' mean.
  Two identical repeats give the 0.1% floor.
"""

from __future__ import annotations

import math

TITAN_RTOL = 1e-5  # torchtitan CI, FSDP vs HSDP, step 1
GOLDEN_RTOL = 0.05  # Megatron-LM functional tests, "lm loss"
GOLDEN_INTERVAL = 5  # the golden values' step_interval
GOLDEN_ABS = 1e-12  # pytest.approx's default absolute tolerance
BAND_MULTIPLIER = 1.5  # compute_golden_statistics.py --confidence-multiplier default
BAND_FLOOR = 0.001  # its minimum recommended relative tolerance (0.1%)
RULES = ("titan_assert_equal", "titan_step1_rtol", "megatron_golden", "megatron_band")


def _steps(test: dict, base: dict) -> list[int]:
    return sorted(set(test) & set(base))


def titan_assert_equal(test: dict, base: dict, decimals: int | None = 4) -> bool:
    """Every step's loss equal, as logged with ``decimals`` places (None: the floats bit for bit)."""
    if set(test) != set(base):
        return False

    def shown(x: float) -> float:
        return float(f"{x:.{decimals}f}") if decimals is not None else x

    return all(shown(test[s]) == shown(base[s]) for s in base)


def titan_step1_rtol(test: dict, base: dict, rtol: float = TITAN_RTOL) -> bool:
    """The first step's loss within ``rtol`` of the baseline's."""
    first = min(_steps(test, base))
    return abs(test[first] - base[first]) <= rtol * abs(base[first])


def megatron_golden(
    test: dict, base: dict, rtol: float = GOLDEN_RTOL, interval: int = GOLDEN_INTERVAL, start: int = 0
) -> bool:
    """Every ``interval``-th loss (from index ``start`` of the list of steps) within ``rtol`` of the golden one."""
    steps = _steps(test, base)[start::interval]
    return all(abs(test[s] - base[s]) <= max(rtol * abs(base[s]), GOLDEN_ABS) for s in steps)


def band_rtol(repeats: list[dict], multiplier: float = BAND_MULTIPLIER) -> float:
    """``compute_golden_statistics``'s recommended relative tolerance from repeated baseline runs."""
    steps = sorted(set.intersection(*(set(r) for r in repeats)))
    worst = 0.0
    for s in steps:
        values = [r[s] for r in repeats]
        mean = sum(values) / len(values)
        if abs(mean) > 1e-9:
            worst = max(worst, max(abs(v - mean) / abs(mean) for v in values))
    return round(max(worst * multiplier, BAND_FLOOR), 4)


def megatron_band(test: dict, repeats: list[dict], multiplier: float = BAND_MULTIPLIER) -> bool:
    """Every step within ``band_rtol(repeats)`` of the repeats' mean at that step."""
    rtol = band_rtol(repeats, multiplier)
    steps = sorted(set(test).intersection(*(set(r) for r in repeats)))
    for s in steps:
        mean = sum(r[s] for r in repeats) / len(repeats)
        if not math.isfinite(test[s]) or abs(test[s] - mean) > rtol * abs(mean):
            return False
    return True


def all_rules(test: dict, base: dict, repeats: list[dict]) -> dict[str, bool]:
    """Each rule's answer (True: passes, "the same") on one test run, its baseline and the baseline's repeats."""
    return {
        "titan_assert_equal": titan_assert_equal(test, base),
        "titan_step1_rtol": titan_step1_rtol(test, base),
        "megatron_golden": megatron_golden(test, base),
        "megatron_band": megatron_band(test, repeats),
    }
