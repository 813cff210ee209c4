"""The bounding verdict: does the change X perturb training less than low precision P, and does it
leave the outcome within seed-to-seed spread? (``METHOD.md``, "Verdict".)

Per replicate r, ``dose.estimate`` gives lr_r = median over the unsaturated window of
log10(E_X / E_P); replicates pool to a mean with a t interval [lo, hi] (``replicates.pool``).
The outcome Delta (``outcome``) pools the same way, against the margin m = 0.5 sigma_S.

    bounded       hi < 0 (X perturbs less than P) and the outcome interval lies within (-m, m)
    not_bounded   lo > 0, or the outcome interval lies wholly outside (-m, m)
    inconclusive  anything else, with the reason; also when log10(E_X/E_P) drifts by more than
                  0.5 dex across the window ("not dose-like": no single ratio describes it)
    no_verdict    no reference pair P; no replicate with a window of at least 5 steps ("track
                  earlier"); or a control pair whose difference is at least as large as X's
    preliminary   one replicate: point estimates, no interval; ``indicative`` says what the
                  point estimates alone would give

The noise floor (refines METHOD.md's "control pair not exactly zero"): the control pair C
trains two identical arms, so any E_C > 0 is run-to-run nondeterminism of the hardware and
kernels. When C is not exactly zero the floor ratio

    N = 10 ** median over shared steps t (E_C(t) > 0) and replicates of log10(E_X(t) / E_C(t))

is stated ("X's deviation is N times the run-to-run floor of this hardware"). N <= 1 (the
control at least as large as the pair under study) gives no_verdict: X cannot be told apart
from the floor. N > 1 keeps the verdict: nondeterminism adds to E_X, so the dose ratio is, if
anything, overstated and a bound remains a bound.

The seed pair is the ceiling in function space (phi) and the scale of the margin, never a rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from divergence.analysis import outcome
from divergence.analysis.dose import MIN_WINDOW, WindowEstimate, estimate, local_rates
from divergence.analysis.layers import noise_floor
from divergence.analysis.replicates import Pooled, pool, replicate_of
from divergence.analysis.trajectories import PairData

STATUSES = ("bounded", "not_bounded", "inconclusive", "no_verdict", "preliminary")
STATUS_WORDS = {"bounded": "Bounded", "not_bounded": "Not bounded", "inconclusive": "Inconclusive",
                "no_verdict": "No verdict", "preliminary": "Preliminary (single replicate, no interval)"}
MAX_DRIFT = 0.5  # dex across the window: beyond it the ratio is "not dose-like"
MAX_DISAGREEMENT = 0.3  # dex between the weight-space and function-space dose ratios
METRIC = "rel_l2"


@dataclass(frozen=True)
class Verdict:
    study: str
    reference: str | None
    status: str
    headline: str
    reasons: tuple[str, ...]
    caveats: tuple[str, ...] = ()
    dose: Pooled = Pooled(math.nan, None, None, 0, ())  # log10(E_X/E_P), per replicate pooled
    dose_function: Pooled = Pooled(math.nan, None, None, 0, ())  # the same from the probe F
    window: tuple[int, int] | None = None  # the union of the replicates' windows
    estimates: tuple[WindowEstimate, ...] = ()
    drift: float = math.nan  # mean over replicates, dex
    outcome: Pooled = Pooled(math.nan, None, None, 0, ())
    outcome_source: str = "training"
    margin: float = math.nan
    floor: float | None = None  # N, X's deviation over the control's; None: exact or no control
    indicative: str | None = None  # a preliminary verdict's status from point estimates
    equivalent_dose: float | None = None  # relative gradient noise per step, from a calibration
    extra: dict = field(default_factory=dict)

    @property
    def dose_like(self) -> bool:
        return not (math.isfinite(self.drift) and abs(self.drift) > MAX_DRIFT)


def judge(study: list[PairData], reference: list[PairData], seeds: list[PairData], controls: list[PairData],
          margin_factor: float = outcome.MARGIN_FACTOR, start: int | None = None,
          min_window: int = MIN_WINDOW) -> Verdict:
    """The verdict for the replicates of one pair under study against the replicates of P."""
    name, label = study[0].name, study[0].label
    if not reference:
        return _no_verdict(name, None, "no precision pair (category precision, e.g. bf16 vs fp32) among the "
                                       "inputs: it is the yardstick of the dose ratio; add one", label=label)
    floor, floor_text, blocked = _floor(study, controls)
    if blocked:
        return _no_verdict(name, reference[0].name, blocked, floor=floor, label=label)
    estimates, caveats = _estimates(study, reference, seeds, start, min_window)
    caveats += _setup_caveats(study, controls)
    usable = [e for e in estimates if e.usable]
    if not usable and _all_zero(study) and not _all_zero(reference):
        return _no_drift(study, reference, caveats)
    if not usable:
        return _no_verdict(name, reference[0].name, _why_no_window(study, reference, estimates, min_window),
                           floor=floor, label=label)
    dose, dose_f = pool([e.log10 for e in usable]), pool([e.log10_function for e in usable])
    where = outcome.source(study + seeds)
    deltas = {p.replicate: outcome.delta(p, where) for p in study if p.replicate in {e.replicate for e in usable}}
    result = pool(list(deltas.values()))
    m, margin_caveat = outcome.margin(seeds, where, margin_factor)
    caveats += [c for c in (margin_caveat, floor_text, _disagreement(dose, dose_f)) if c]
    drift = float(np.mean([e.drift for e in usable]))
    status, reasons = _status(dose, result, m, drift, seeds)
    indicative = None
    if dose.n == 1:
        status, indicative = "preliminary", status
    window = (min(e.window[0] for e in usable), max(e.window[1] for e in usable))
    v = Verdict(name, reference[0].name, status, "", tuple(reasons), tuple(caveats), dose, dose_f, window,
                tuple(estimates), drift, result, where, m, floor, indicative,
                extra={"outcome_per_replicate": deltas,
                       "seed_outcome_per_replicate": {p.replicate: outcome.delta(p, where) for p in seeds}})
    return _with_headline(v, label, reference[0].label, floor_text)


def _all_zero(runs: list[PairData]) -> bool:
    """Every run's E exactly 0 at every tracked step (bitwise equal arms)."""
    return all(len(p.rel_l2) and np.all(p.rel_l2 == 0) for p in runs)


def _no_drift(study, reference, caveats) -> Verdict:
    """X's arms stay bitwise equal where P's differ: no dose at all, said in words (no log of 0)."""
    status = "bounded" if len(study) > 1 else "preliminary"
    text = (f"{STATUS_WORDS[status]}: {study[0].label} does not perturb training at all: both arms are bitwise "
            f"equal at every tracked step of {'every replicate' if len(study) > 1 else 'its run'}, where "
            f"{reference[0].label}'s differ.")
    return Verdict(study[0].name, reference[0].name, status, text, (), tuple(caveats),
                   indicative="bounded" if status == "preliminary" else None)


def _why_no_window(study, reference, estimates, min_window) -> str:
    """The reason no replicate has a window: a reference that does not drift, a pair that does not
    grow, or tracking too sparse in the early steps."""
    if _all_zero(reference) or not any(np.any(np.isfinite(p.rel_l2) & (p.rel_l2 > 0)) for p in reference):
        return (f"{reference[0].name}'s difference is zero (or missing) at every tracked step, so it cannot serve "
                "as the yardstick: check that its arms differ in precision")
    rates = np.concatenate([local_rates(p.steps, p.rel_l2) for p in study]) if study else np.zeros(0)
    rates = rates[np.isfinite(rates)]
    if rates.size and np.median(rates) <= 0:
        return (f"{study[0].name}'s difference does not grow over training (constant or shrinking), unlike a "
                "perturbation that training amplifies: there is no dose ratio to read; see the curves")
    longest = max((e.n_window for e in estimates), default=0)
    return (f"the window where {study[0].name} and {reference[0].name} both still grow alike is {longest} tracked "
            f"step(s) (need {min_window}): track earlier and densely (every step in the first tens of steps)")


def _setup_caveats(study: list[PairData], controls: list[PairData]) -> list[str]:
    out = [] if controls else ["no control pair: determinism was not checked, so part of each pair's difference "
                               "may be run-to-run noise (add a control pair: both arms identical)"]
    out += [f"{p.key} is unfinished (last step {p.last_step} of {p.max_steps}): the estimate reads the steps it "
            "reached" for p in study if not p.finished]
    return out


def _estimates(study, reference, seeds, start, min_window) -> tuple[list[WindowEstimate], list[str]]:
    estimates, caveats = [], []
    for x in study:
        p = replicate_of(reference, x.replicate)
        if p is None:
            caveats.append(f"replicate {x.replicate} of {x.name} has no replicate {x.replicate} of "
                           f"{reference[0].name} (common random numbers): left out")
            continue
        s = replicate_of(seeds, x.replicate) or (seeds[0] if seeds else None)
        estimates.append(estimate(x, p, s, start, min_window))
    short = [e.replicate for e in estimates if not e.usable]
    if short and len(short) < len(estimates):
        caveats.append(f"replicate(s) {', '.join(map(str, short))} left out: window under {min_window} steps")
    return estimates, caveats


def _status(dose: Pooled, result: Pooled, m: float, drift: float, seeds) -> tuple[str, list[str]]:
    lo, hi = (dose.lo, dose.hi) if dose.interval else (dose.mean, dose.mean)
    olo, ohi = (result.lo, result.hi) if result.interval else (result.mean, result.mean)
    has_margin = math.isfinite(m) and m > 0
    has_outcome = math.isfinite(olo) and math.isfinite(ohi)
    if abs(drift) > MAX_DRIFT:
        return "inconclusive", [f"not dose-like: log10(E_X/E_P) drifts by {drift:+.2f} dex across the window "
                                f"(more than {MAX_DRIFT}); read the curve, not a single ratio"]
    if lo > 0 or (has_margin and has_outcome and (olo >= m or ohi <= -m)):
        return "not_bounded", []
    within = has_margin and has_outcome and -m < olo and ohi < m
    if hi < 0 and within:
        return "bounded", []
    reasons = []
    if not hi < 0:
        reasons.append(f"the dose ratio's interval ({lo:+.2f} to {hi:+.2f} dex) holds 0: X and P are not told apart")
    if not seeds:
        reasons.append("no seed pair: the outcome has no margin (sigma_S); add a seed pair with replicates")
    elif not has_margin:
        reasons.append("the seed pair's outcome spread is zero or unknown: no margin for the outcome test")
    elif not has_outcome:
        reasons.append("no loss records to compare the outcome on")
    elif not within:
        reasons.append(f"the outcome interval ({olo:+.3g} to {ohi:+.3g}) crosses the margin +/-{m:.3g}")
    return "inconclusive", reasons


def _floor(study: list[PairData], controls: list[PairData]) -> tuple[float | None, str | None, str | None]:
    """(N, the floor sentence, a no-verdict reason) from the control pair(s)."""
    noisy = [c for c in controls if len(c.steps) and not (noise_floor(c).exact and not np.any(c.rel_l2 != 0))]
    if not noisy:
        return None, None, None
    logs = []
    for x in study:
        c = replicate_of(noisy, x.replicate) or noisy[0]
        _, i, j = np.intersect1d(x.steps, c.steps, return_indices=True)
        e_x, e_c = x.rel_l2[i], c.rel_l2[j]
        ok = np.isfinite(e_x) & np.isfinite(e_c) & (e_c > 0)
        with np.errstate(divide="ignore"):
            logs.extend(np.log10(np.where(e_x[ok] > 0, e_x[ok], 0.0) / e_c[ok]).tolist())
    name = noisy[0].name
    if not logs:
        return None, (f"control pair {name} is not exactly zero, but shares no tracked step with a non-zero "
                      "difference with the pair under study: the floor could not be measured"), None
    n = float(10 ** np.median(logs))
    if n <= 1:
        return n, None, (f"control pair {name} (two identical arms) differs as much as or more than {study[0].name} "
                         f"({_factor(n)}x its difference): the change cannot be told apart from run-to-run "
                         "nondeterminism; make training deterministic (train.deterministic) and rerun")
    return n, (f"{study[0].label}'s deviation is {_factor(n)} times the run-to-run floor of this hardware "
               f"(control pair {name} is not exactly zero)"), None


def _disagreement(dose: Pooled, dose_f: Pooled) -> str | None:
    if math.isfinite(dose.mean) and math.isfinite(dose_f.mean) and abs(dose.mean - dose_f.mean) > MAX_DISAGREEMENT:
        return (f"weight space and function space disagree: log10 dose ratio {dose.mean:+.2f} by rel_l2, "
                f"{dose_f.mean:+.2f} by the probe (more than {MAX_DISAGREEMENT} dex apart)")
    return None


def _no_verdict(name, reference, reason, floor=None, label: str | None = None) -> Verdict:
    return Verdict(name, reference, "no_verdict", f"No verdict for {label or name}: {reason}.", (reason,), floor=floor)


def _with_headline(v: Verdict, label: str, ref_label: str, floor_text: str | None) -> Verdict:
    return replace(v, headline=headline(v, label, ref_label, floor_text))


def headline(v: Verdict, label: str, ref_label: str, floor_text: str | None = None) -> str:
    """One paragraph a person reads: status, dose ratio with its interval, outcome, floor, equivalent dose."""
    word = STATUS_WORDS[v.status]
    if v.status == "no_verdict":
        return f"{word} for {label}: {v.reasons[0]}."
    span = f"window steps {v.window[0]}-{v.window[1]}"
    if not v.dose_like:
        text = (f"{word}: {label} vs {ref_label} is not dose-like: log10(E_X/E_P) drifts by {v.drift:+.2f} dex "
                f"across {span}, so no single ratio describes it; see the curve.")
    else:
        direction = "less" if v.dose.mean < 0 else "more"
        if v.dose.interval:
            numbers = (f"log10 dose ratio {v.dose.mean:+.2f}, 95% CI {v.dose.lo:+.2f} to {v.dose.hi:+.2f}, "
                       f"{v.dose.n} replicates, {span}")
        else:
            numbers = f"log10 dose ratio {v.dose.mean:+.2f}, {span}"
        text = (f"{word}: {label} perturbs training {_factor(10 ** abs(v.dose.mean))}x {direction} than {ref_label} "
                f"({numbers}); {_outcome_text(v)}.")
    if v.indicative:
        text += f" The point estimates alone read {v.indicative.replace('_', ' ')}; train more replicates."
    if floor_text:
        text += f" {floor_text[0].upper()}{floor_text[1:]}."
    if v.equivalent_dose is not None:
        text += f" It perturbs training like a relative gradient noise of {v.equivalent_dose:.1g} per step."
    return text


def _outcome_text(v: Verdict) -> str:
    o = v.outcome
    if not math.isfinite(o.mean):
        return "no outcome (no loss records)"
    what = "final probe-loss difference" if v.outcome_source == "probe" else "final training-loss difference"
    ci = f" (95% CI {_pct(o.lo)} to {_pct(o.hi)})" if o.interval else ""
    margin = f"the seed margin +/-{_pct(v.margin)[1:]}" if math.isfinite(v.margin) else "no seed margin"
    return f"{what} {_pct(o.mean)}{ci} against {margin}"


def _pct(x: float) -> str:
    """A relative difference in percent, two significant digits: +0.12%, -3e-05%."""
    return f"{100 * x:+.2g}%"


def _factor(value: float) -> str:
    """A factor for people: 1000, 3.2, 1.2e+05."""
    if not math.isfinite(value):
        return "inf" if value > 0 else "nan"
    if value >= 1e4:
        return f"{value:.1e}"
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2g}"
