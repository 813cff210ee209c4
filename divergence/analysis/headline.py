"""The verdict in words: one paragraph a person reads, and the sentence on replicates.

The headline states, in this order: the status; the dose ratio as a factor, with its log10, 95%
interval, replicates and the window every replicate was read on (one common window, or each
replicate's); when the dose is inconclusive, how many replicates would exclude 0; the outcome's
own status (within / no larger than a seed change's / shifted / undecided with the replicates
that would decide); the noise floor; the equivalent gradient-noise dose. Replicates a reading left
out are counted in its sentence. A dose read on every valid step (``every_step``: no growth-rate
window in every replicate) is stated as the bound it is. An illustrative example (its figures invented, no measurement)::

    Bounded: flash perturbs training 2.3x less than bf16 vs fp32 (log10 dose ratio -0.37, 95% CI
    -0.62 to -0.12, 6 replicates, window steps 12-30 in every replicate); outcome undecided: final
    probe-loss difference +0.2% (95% CI -1.1% to +1.5%) against the seed margin +/-1.2%; about 9
    replicates would decide.
"""

from __future__ import annotations

import math

from divergence.analysis.every_step import left_out_text, spans_text

STATUS_WORDS = {
    "bounded": "Bounded",
    "not_bounded": "Not bounded",
    "inconclusive": "Inconclusive",
    "no_verdict": "No verdict",
    "preliminary": "Preliminary (single replicate, no interval)",
}


def headline(v, label: str, ref_label: str, floor_text: str | None = None) -> str:
    """One paragraph: status, dose ratio with its interval and window, outcome, floor, equivalent dose."""
    word = STATUS_WORDS[v.status]  # never no_verdict: judge words those itself
    span = spans_text(v.dose.estimates, "window steps", "windows steps")
    if v.dose.read_on == "valid_steps":
        text = f"{word}: {bound_text(v, label, ref_label)}{_undecided_dose(v)}; {outcome_text(v)}."
    elif not v.dose.dose_like:
        text = (
            f"{word}: {label} vs {ref_label} is not dose-like: log10(E_X/E_P) drifts by {v.dose.drift:+.2f} dex "
            f"across {span}, so no single ratio describes it; see the curve; {outcome_text(v)}."
        )
    else:
        direction = "less" if v.dose.ratio.mean < 0 else "more"
        pooled = interval_text(v.dose.ratio) + left_out_text(v.dose.estimates, v.dose.read_on)
        numbers = f"log10 dose ratio {v.dose.ratio.mean:+.2f}{pooled if v.dose.ratio.interval else ''}, {span}"
        text = (
            f"{word}: {label} perturbs training {factor_text(10 ** abs(v.dose.ratio.mean))}x {direction} than "
            f"{ref_label} ({numbers}){_undecided_dose(v)}; {outcome_text(v)}."
        )
    if v.indicative:
        text += f" The point estimates alone read {v.indicative.replace('_', ' ')}; train more replicates."
    if floor_text:
        text += f" {floor_text[0].upper()}{floor_text[1:]}."
    if v.dose.equivalent is not None:
        text += f" It perturbs training like a relative gradient noise of {v.dose.equivalent:.1g} per step."
    return text


def bound_text(v, label: str, ref_label: str) -> str:
    """The dose read on every valid step (``every_step``): a bound that holds at each of them, e.g.
    ``X's difference is at most 10^-3.9 of P's at every valid step (7900x less; ...)``."""
    below, m = v.dose.bound_side == "below", v.dose.ratio.mean
    which, at = ("largest", "at most") if below else ("smallest", "at least")
    numbers = (
        f"{which} log10 E_X/E_P over each replicate's valid steps, pooled {m:+.2f}{interval_text(v.dose.ratio)}"
        f"{left_out_text(v.dose.estimates, v.dose.read_on)}, {spans_text(v.dose.estimates)}"
    )
    return (
        f"{label}'s difference is {at} 10^{m:.1f} of {ref_label}'s at every valid step "
        f"({factor_text(10 ** abs(m))}x {'less' if m < 0 else 'more'}; {numbers}; read on every valid step, "
        "as the growth-rate window does not form in every replicate)"
    )


def interval_text(p) -> str:
    """A pooled reading's ``, 95% CI -0.62 to -0.12, 6 replicates``, or ``, one replicate``."""
    return f", 95% CI {p.lo:+.2f} to {p.hi:+.2f}, {p.n} replicates" if p.interval else ", one replicate"


def _undecided_dose(v) -> str:
    """For an inconclusive dose: the interval holds 0, and what would exclude it."""
    if v.dose.status != "inconclusive" or not v.dose.ratio.interval:
        return ""
    n = v.dose.replicates_needed.get("exclude_0")
    if n is None:
        return ": the interval holds 0, and at this mean no number of replicates within reach would exclude it"
    return f": the interval holds 0; about {n} replicates would exclude it"


def outcome_text(v) -> str:
    """The outcome's own status, with its number against the margin."""
    o = v.outcome.delta
    if not math.isfinite(o.mean):
        return "outcome undecided: no loss records"
    what = "final probe-loss difference" if v.outcome.source == "probe" else "final training-loss difference"
    ci = f" (95% CI {percent(o.lo)} to {percent(o.hi)})" if o.interval else ""
    number = f"{what} {percent(o.mean)}{ci}"
    if not math.isfinite(v.outcome.margin):
        return f"outcome undecided: {number}, no seed margin"
    scale = "a seed change's spread" if v.outcome.saturated else "the seed margin"
    margin = f"+/-{percent(v.outcome.margin)[1:]}"
    if v.outcome.status == "within":
        head = "outcome no larger than a seed change's" if v.outcome.saturated else "outcome within the seed margin"
        return f"{head}: {number} inside {scale} {margin}" + _saturated_note(v)
    if v.outcome.status == "shifted":
        return f"outcome shifted: {number} outside {scale} {margin}" + _saturated_note(v)
    decide = decide_text(v.outcome.replicates_needed, o)
    return f"outcome undecided: {number} against {scale} {margin}{_saturated_note(v)}; {decide}"


def decide_text(needed: int | None, pooled) -> str:
    """What would decide an undecided reading: the replicates (``replicates_to_clear``), or why none do."""
    if needed is not None:
        return f"about {needed} replicates would decide"
    return "no number of replicates within reach decides" if pooled.interval else "one replicate has no interval"


def _saturated_note(v) -> str:
    return " (the pair has saturated: its outcome is compared with a seed change's)" if v.outcome.saturated else ""


def replicates_sentence(v) -> str | None:
    """What more (or fewer) replicates would make of the dose interval, at the observed mean and spread."""
    if v.dose.status is None or not v.dose.ratio.interval or not math.isfinite(v.dose.ratio.mean):
        return None
    zero, two = v.dose.replicates_needed.get("exclude_0"), v.dose.replicates_needed.get("exclude_0.3_dex")
    side = "below -0.3" if v.dose.ratio.mean < 0 else "above +0.3"
    parts = [
        f"exclude 0 from {zero} replicates" if zero is not None else "not exclude 0 from any number within reach",
        f"lie {side} dex (a factor 2) from {two}"
        if two is not None
        else f"not lie {side} dex (a factor 2) from any number, its mean being within it"
        if abs(v.dose.ratio.mean) < 0.3
        else f"not lie {side} dex (a factor 2) from any number within reach",
    ]
    return (
        f"At the observed mean ({v.dose.ratio.mean:+.2f}) and spread of {v.dose.ratio.n} replicates, the dose interval "
        f"would {parts[0]} and {parts[1]}."
    )


def percent(x: float) -> str:
    """A relative difference in percent, two significant digits: +0.12%, -3e-05%."""
    return f"{100 * x:+.2g}%"


def factor_text(value: float) -> str:
    """A factor for people: 1000, 3.2, 1.2e+05."""
    if not math.isfinite(value):
        return "inf" if value > 0 else "nan"
    if value >= 1e4:
        return f"{value:.1e}"
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2g}"
