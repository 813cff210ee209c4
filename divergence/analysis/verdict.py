"""The bounding verdict: is the pair under study's drift bounded by the reference pairs?

The paper's claim has two sides: the optimization's weight difference grows no faster than
a change of init seed (the *reference*: a change everyone accepts as giving an equivalent
model), and slower than low-precision training (the *upper bound*). With rho_ref = g_study /
g_ref and its joint-bootstrap interval [lo, hi] (``growth.compare_growth``), per metric:

    bounded       hi < 1 against every precision pair, and lo <= 1 against every seed pair
    not_bounded   lo > 1 against some precision or seed pair (clearly faster than it)
    inconclusive  a ratio's interval against a precision pair holds 1 (the pairs' rates are
                  not distinguishable), or the set-up cannot carry a verdict: a reference
                  pair is missing, the control pair is not exactly zero, a run is unfinished
    no_verdict    nothing to compare: no reference pair, fewer than ``min_steps`` tracked
                  steps in common, or a reference whose growth is not clearly positive

A ratio holding 1 against the seed pair is the paper's "comparable to" and still bounded.
The headline is by Wasserstein distance (the metric of the paper's Fig. 8); the max
difference is judged the same way and reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from divergence.analysis.growth import N_BOOT, Ratio, compare_growth
from divergence.analysis.layers import NoiseFloor
from divergence.analysis.trajectories import METRIC_LABELS, METRICS, PairData

MIN_STEPS = 5
HEADLINE_METRIC = "wasserstein"
STATUSES = ("bounded", "not_bounded", "inconclusive", "no_verdict")
_STATUS_WORDS = {"bounded": "Bounded", "not_bounded": "Not bounded", "inconclusive": "Inconclusive",
                 "no_verdict": "No verdict"}


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    status: str
    sentence: str  # "X drifts 3.4x (2.1-5.0) slower than Y and 0.8x (0.6-1.1) the rate of a seed change, by ..."
    reasons: tuple[str, ...]  # why the status is inconclusive or no_verdict
    ratios: tuple[Ratio, ...]


@dataclass(frozen=True)
class Verdict:
    study: str
    status: str  # the headline metric's status
    headline: str  # one line: status word, sentence, first reason
    reasons: tuple[str, ...]
    caveats: tuple[str, ...]  # worth knowing, not blocking
    metrics: dict[str, MetricVerdict]


def judge(study: PairData, precision: list[PairData], seeds: list[PairData], controls: list[NoiseFloor],
          unfinished: list[PairData], n_boot: int = N_BOOT, seed: int = 0, min_steps: int = MIN_STEPS) -> Verdict:
    """The verdict for one pair under study against its reference pairs."""
    setup = _setup_reasons(precision, seeds, controls, unfinished)
    caveats = () if controls else ("no control pair: determinism was not checked, so part of each pair's drift "
                                   "may be run-to-run noise (add a control pair: both arms identical)",)
    metrics = {m: _judge_metric(study, precision, seeds, setup, m, n_boot, seed, min_steps) for m in METRICS}
    main = metrics[HEADLINE_METRIC]
    return Verdict(study.name, main.status, _headline(main), main.reasons, caveats, metrics)


def _judge_metric(study, precision, seeds, setup, metric, n_boot, seed, min_steps) -> MetricVerdict:
    upper = [compare_growth(study, p, metric, n_boot, seed) for p in precision]
    reference = [compare_growth(study, s, metric, n_boot, seed) for s in seeds]
    labels = {p.name: p.label for p in precision + seeds}
    blocking = list(setup["blocking"])
    for r in upper + reference:
        if r.estimate.n_steps < min_steps:
            blocking.append(f"only {r.estimate.n_steps} tracked steps shared by {r.study} and {r.reference} "
                            f"(need {min_steps}): track weights more often or train longer")
        elif not r.reference_growing:
            blocking.append(f"{r.reference}'s {METRIC_LABELS[metric]} does not clearly grow over the shared steps "
                            f"(rate {r.reference_rate:.3g}/step), so it cannot serve as a yardstick: train longer")
    overlap = [f"{r.study}'s rate is not distinguishable from {r.reference}'s "
               f"(ratio {_x(r.estimate.value)}, interval {_x(r.estimate.lo)}-{_x(r.estimate.hi)} holds 1)"
               for r in upper if r.estimate.defined and r.estimate.lo <= 1 <= r.estimate.hi]
    faster = [r for r in upper + reference if r.estimate.defined and r.estimate.lo > 1]
    if blocking:
        status, reasons = "no_verdict", blocking + setup["inconclusive"]
    elif faster:
        status, reasons = "not_bounded", setup["inconclusive"]
    elif setup["inconclusive"] or overlap:
        status, reasons = "inconclusive", setup["inconclusive"] + overlap
    else:
        status, reasons = "bounded", []
    sentence = _sentence(study, upper, reference, labels, metric, many_seeds=len(seeds) > 1)
    return MetricVerdict(metric, status, sentence, tuple(reasons), tuple(upper + reference))


def _setup_reasons(precision, seeds, controls, unfinished) -> dict[str, list[str]]:
    blocking, inconclusive = [], []
    if not precision and not seeds:
        blocking.append("no reference pair (category seed or precision) among the inputs: "
                        "add a seed pair and a precision pair, as divergence study runs them")
    elif not precision:
        inconclusive.append("no precision pair (e.g. fp16 vs fp32): the upper bound is missing; add one")
    elif not seeds:
        inconclusive.append("no seed pair: the reference bound (a change of init seed) is missing; add one")
    for floor in controls:
        if not floor.exact:
            inconclusive.append(
                f"control pair {floor.pair} is not zero (peak Wasserstein {floor.peak['wasserstein']:.3g}, "
                f"max difference {floor.peak['max_abs_diff']:.3g}, from step {floor.first_nonzero_step}): training "
                "is not deterministic, so every pair's drift includes run-to-run noise; make the runs deterministic")
    for pair in unfinished:
        inconclusive.append(f"{pair.name} is unfinished (last step {pair.last_step} of {pair.max_steps}): "
                            "resume it; until then the ratios cover only the steps both pairs reached")
    return {"blocking": blocking, "inconclusive": inconclusive}


def _sentence(study, upper, reference, labels, metric, many_seeds: bool) -> str:
    parts = [_upper_part(r, labels[r.reference]) for r in upper if r.estimate.defined]
    parts += [f"{_interval(r.estimate.value, r.estimate.lo, r.estimate.hi)} the rate of a seed change"
              + (f" ({labels[r.reference]})" if many_seeds else "") for r in reference if r.estimate.defined]
    if not parts:
        return ""
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{study.label} drifts {joined}, by {METRIC_LABELS[metric]}"


def _upper_part(r: Ratio, label: str) -> str:
    e = r.estimate
    if e.hi <= 0 and e.value == 0:  # bitwise identical arms: no drift in any bootstrap replicate
        return f"not at all, where {label} does (ratio 0 in every bootstrap replicate)"
    if e.hi < 1:
        if e.lo <= 0:  # the study pair may not drift at all: no finite "N times slower"
            return f"at least {_x(1 / e.hi)}x slower than {label} (ratio {_interval(e.value, e.lo, e.hi)})"
        return f"{_interval(1 / e.value if e.value > 0 else float('inf'), 1 / e.hi, 1 / e.lo)} slower than {label}"
    if e.lo > 1:
        return f"{_interval(e.value, e.lo, e.hi)} faster than {label}"
    return f"{_interval(e.value, e.lo, e.hi)} the rate of {label} (no detectable difference)"


def _headline(v: MetricVerdict) -> str:
    word = _STATUS_WORDS[v.status]
    if v.status == "no_verdict" or not v.sentence:
        return f"{word}: {v.reasons[0]}." if v.reasons else f"{word}."
    return f"{word}: {v.sentence}."


def _interval(value: float, lo: float, hi: float) -> str:
    return f"{_x(value)}x ({_x(lo)}-{_x(hi)})"


def _x(value: float) -> str:
    """A factor for people: two significant digits, no exponent below 1000."""
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 0.01 or value == 0:
        return f"{value:.2g}" if abs(value) < 1 else f"{value:.1f}"
    return f"{value:.1e}"
