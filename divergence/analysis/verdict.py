"""The bounding verdict: does the change X perturb training less than low precision P, and does it
leave the outcome within seed-to-seed spread? (``docs/method.md``, "The two answers".)

Per replicate r, ``dose.estimate`` gives lr_r = median over the unsaturated window of
log10(E_X / E_P); replicates pool to a mean with a t interval [lo, hi] (``replicates.pool``).
The outcome Delta (``outcome``) pools the same way, against the margin m = 0.5 sigma_S. Two
questions, each decided on its own, then one status:

    dose (horizon-free), from [lo, hi]:
        bounded       hi < 0 (X perturbs less than P)
        not_bounded   lo > 0
        inconclusive  otherwise, or when log10(E_X/E_P) drifts by more than 0.5 dex across the
                      window ("not dose-like": no single ratio describes it)
    outcome (the end of training), from its interval against (-m, m): within / shifted /
        undecided (``outcome.decide``); a pair saturated at the end is held to the seed spread
        itself (m = sigma_S: "no larger than a seed change's")
    status        the dose's; a shifted outcome makes it not_bounded (and is always said); an
                  undecided outcome is said with the replicates that would decide it, and does not
                  by itself make the verdict inconclusive
    no_verdict    no reference pair P; no replicate with a window of at least 5 steps ("track
                  earlier"); or a control pair whose difference is at least as large as X's
    preliminary   one replicate: point estimates, no interval; ``indicative`` says what the
                  point estimates alone would give

Replicates that would decide (``replicates.replicates_to_clear``, at the observed mean and
spread): to exclude 0 from the dose interval, and to put it beyond +-0.3 dex (a factor 2).

The noise floor (refines the method's first rule, "control pair not exactly zero"): the control
pair C trains two identical arms, so any E_C > 0 is run-to-run nondeterminism of the hardware and
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

from divergence.analysis import every_step, outcome
from divergence.analysis.dose import MIN_WINDOW, WindowEstimate, estimate_replicates
from divergence.analysis.finetune import FineTune, ceiling_text, saturation_level
from divergence.analysis.no_window import crossing_text, why_no_window, why_valid_steps
from divergence.analysis.headline import STATUS_WORDS, factor_text, headline, percent
from divergence.analysis.layers import noise_floor
from divergence.analysis.replicates import Pooled, pool, replicate_of, replicate_runs, replicates_to_clear
from divergence.analysis.trajectories import PairData

STATUSES = ("bounded", "not_bounded", "inconclusive", "no_verdict", "preliminary")
MAX_DRIFT = 0.5  # dex across the window: beyond it the ratio is "not dose-like"
OUTSIDE = "studied outside its deployment numerics"  # the caveat's opening words
FACTOR_2_DEX = 0.3  # log10(2): an interval beyond +-0.3 dex says "at least 2x less (more)"
MAX_DISAGREEMENT = 0.3  # dex between the weight-space and function-space dose ratios
METRIC = "rel_l2"


NOT_READ = Pooled(math.nan, None, None, 0, ())  # no replicate read


@dataclass(frozen=True)
class Dose:
    """The dose question: log10(E_X / E_P) per replicate, pooled, and what its interval decides."""

    ratio: Pooled = NOT_READ  # log10(E_X/E_P), per replicate pooled
    function: Pooled = NOT_READ  # the same from the probe F
    window: tuple[int, int] | None = None  # the union of the replicates' windows
    estimates: tuple[WindowEstimate, ...] = ()
    drift: float = math.nan  # mean over replicates, dex
    status: str | None = None  # bounded / not_bounded / inconclusive, from the dose interval alone (None: no dose read)
    read_on: str = "window"  # every_step.READ_ON: the growth-rate window, or every valid step
    bound_side: str | None = None  # read on the valid steps: every step "below" or "above" 0
    # replicates that would decide, at the observed mean and spread: "exclude_0" and "exclude_0.3_dex";
    # None where none within reach (or one replicate)
    replicates_needed: dict = field(default_factory=dict)
    equivalent: float | None = None  # relative gradient noise per step, from a calibration

    @property
    def dose_like(self) -> bool:
        """One ratio describes the pair: read on a window, with no drift beyond ``MAX_DRIFT`` (a bound
        read on every valid step needs no constant ratio, and is no dose ratio)."""
        return self.read_on == "window" and not (math.isfinite(self.drift) and abs(self.drift) > MAX_DRIFT)


@dataclass(frozen=True)
class Outcome:
    """The outcome question: the end-of-training difference Delta against the seed margin m."""

    delta: Pooled = NOT_READ  # Delta, per replicate pooled
    source: str = "training"  # the loss it is read on: "training" or "probe"
    margin: float = math.nan  # m = margin_factor x sigma_S
    margin_factor: float = outcome.MARGIN_FACTOR
    status: str | None = None  # outcome.OUTCOME_STATUSES, from the outcome interval alone
    saturated: bool = False  # X saturated at the end: its outcome is held to the seed spread itself
    replicates_needed: int | None = None  # replicates that would decide (None: none within reach)
    per_replicate: dict = field(default_factory=dict)  # replicate -> Delta of the pair under study
    seed_per_replicate: dict = field(default_factory=dict)  # replicate -> Delta of the seed pair


@dataclass(frozen=True)
class Verdict:
    """One pair under study's verdict: the status and its words, and the readings it rests on."""

    study: str
    reference: str | None
    status: str
    headline: str = ""
    reasons: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()
    dose: Dose = field(default_factory=Dose)
    outcome: Outcome = field(default_factory=Outcome)
    floor: float | None = None  # N, X's deviation over the control's; None: exact or no control
    indicative: str | None = None  # a preliminary verdict's status from point estimates
    reordering: object | None = None  # X against the reordering reference, a ``reordering.Reordering``
    coherence: dict | None = None  # the pair's coherence over its replicates (``coherence.pair_coherence``)
    prediction: str | None = None  # what the dose means at convergence (``consequence_file.prediction``)


def judge(
    study: list[PairData],
    reference: list[PairData],
    seeds: list[PairData],
    controls: list[PairData],
    margin_factor: float = outcome.MARGIN_FACTOR,
    start: int | None = None,
    min_window: int = MIN_WINDOW,
    fine_tune: FineTune | None = None,
) -> Verdict:
    """The verdict for the replicates of one pair under study against the replicates of P;
    ``fine_tune`` (``finetune.recognize``): the pairs fine-tune one start, so a window ends at
    ``SATURATED_FINETUNE`` of the data-order seed pair's E, said in a caveat."""
    name, label = study[0].name, study[0].label
    if not reference:
        return _no_verdict(
            name,
            None,
            "no precision pair (category precision, e.g. bf16 vs fp32) among the "
            "inputs: it is the yardstick of the dose ratio; add one",
            label=label,
        )
    floor, floor_text, blocked = _floor(study, controls)
    if blocked:
        return _no_verdict(name, reference[0].name, blocked, floor=floor, label=label)
    level = saturation_level(fine_tune)
    windows, caveats = _estimates(study, reference, seeds, start, min_window, level)
    caveats += _setup_caveats(study, controls)
    if fine_tune is not None:
        caveats.insert(0, ceiling_text(fine_tune, seeds))
    if not any(e.usable for e in windows) and all_zero(study) and not all_zero(reference):
        return _no_drift(study, reference, caveats)
    read_on, estimates = every_step.choose(windows, 0.0)
    side = every_step.side(every_step.steps_of(estimates), 0.0) if read_on == "valid_steps" else None
    usable = [e for e in estimates if e.usable] if read_on == "window" or side else []
    if not usable:
        why = why_no_window(study, reference, windows, min_window, seeds, level) + crossing_text(estimates)
        v = _no_verdict(name, reference[0].name, why, floor=floor, label=label)
        return replace(v, caveats=caveats[:1]) if fine_tune is not None else v
    if side:
        estimates = every_step.bound(estimates, side)
        caveats.append(why_valid_steps(study, reference, windows, min_window, seeds, level))
    caveats += _left_out(estimates, read_on)
    dose, reasons = _dose_reading(estimates, read_on, side)
    result, margin_caveat = _outcome_reading(study, seeds, dose, margin_factor)
    caveats += [c for c in (margin_caveat, floor_text, _disagreement(dose.ratio, dose.function)) if c]
    reasons += _outcome_reasons(result.status, result.delta, result.margin, seeds)
    status = "not_bounded" if result.status == "shifted" else dose.status
    indicative = None
    if dose.ratio.n == 1:
        status, indicative = "preliminary", _indicative(dose.status, result.delta, result.margin)
    v = Verdict(
        study=name,
        reference=reference[0].name,
        status=status,
        reasons=tuple(reasons),
        caveats=tuple(caveats),
        dose=dose,
        outcome=result,
        floor=floor,
        indicative=indicative,
    )
    return replace(v, headline=headline(v, label, reference[0].label, floor_text))


def _dose_reading(estimates, read_on: str, side: str | None) -> tuple[Dose, list[str]]:
    """The dose question on the usable estimates: pooled ratio, its status and the reasons for it."""
    usable = [e for e in estimates if e.usable]
    ratio, function = pool([e.log10 for e in usable]), pool([e.log10_function for e in usable])
    drift = float(np.mean([e.drift for e in usable]))
    status, reasons = every_step.bound_status(ratio, side) if side else _dose_status(ratio, drift)
    dose = Dose(
        ratio=ratio,
        function=function,
        window=(min(e.window[0] for e in usable), max(e.window[1] for e in usable)),
        estimates=tuple(estimates),
        drift=drift,
        status=status,
        read_on=read_on,
        bound_side=side,
        replicates_needed={
            "exclude_0": replicates_to_clear(ratio, abs(ratio.mean)),
            "exclude_0.3_dex": replicates_to_clear(ratio, abs(ratio.mean) - FACTOR_2_DEX),
        },
    )
    return dose, reasons


def _outcome_reading(study, seeds, dose: Dose, margin_factor: float) -> tuple[Outcome, str | None]:
    """The outcome question on the replicates the dose read, and the margin's caveat (None: none)."""
    read = {e.replicate for e in dose.estimates if e.usable}
    where = outcome.source(study + seeds)
    deltas = {p.replicate: outcome.delta(p, where) for p in study if p.replicate in read}
    delta = pool(list(deltas.values()))
    saturated = outcome.saturated_at_end([phi_at_end(e) for e in dose.estimates if e.usable])
    factor = max(margin_factor, outcome.SATURATED_FACTOR) if saturated else margin_factor
    m, margin_caveat = outcome.margin(seeds, where, factor)
    status, needed = outcome.decide(delta, m)
    result = Outcome(
        delta=delta,
        source=where,
        margin=m,
        margin_factor=factor,
        status=status,
        saturated=saturated,
        replicates_needed=needed,
        per_replicate=deltas,
        seed_per_replicate={p.replicate: outcome.delta(p, where) for p in seeds},
    )
    return result, margin_caveat


def phi_at_end(e: WindowEstimate) -> float:
    """phi of the pair under study at its last tracked step with a finite phi (NaN: none)."""
    phi = np.asarray(e.phi.get("study", np.zeros(0)), dtype=float)
    finite = phi[np.isfinite(phi)]
    return float(finite[-1]) if finite.size else math.nan


def all_zero(runs: list[PairData]) -> bool:
    """Every run's E exactly 0 at every tracked step (bitwise equal arms)."""
    return all(len(p.rel_l2) and np.all(p.rel_l2 == 0) for p in runs)


def _no_drift(study, reference, caveats) -> Verdict:
    """X's arms stay bitwise equal where P's differ: no dose at all, said in words (no log of 0)."""
    status = "bounded" if len(study) > 1 else "preliminary"
    text = (
        f"{STATUS_WORDS[status]}: {study[0].label} does not perturb training at all: both arms are bitwise "
        f"equal at every tracked step of {'every replicate' if len(study) > 1 else 'its run'}, where "
        f"{reference[0].label}'s differ."
    )
    return Verdict(
        study=study[0].name,
        reference=reference[0].name,
        status=status,
        headline=text,
        caveats=tuple(caveats),
        dose=Dose(status="bounded"),
        indicative="bounded" if status == "preliminary" else None,
    )


def _setup_caveats(study: list[PairData], controls: list[PairData]) -> list[str]:
    out = (
        []
        if controls
        else [
            "no control pair: determinism was not checked, so part of each pair's difference "
            "may be run-to-run noise (add a control pair: both arms identical)"
        ]
    )
    outside = next((p.outside_deployment for p in study if p.outside_deployment), None)
    if outside:
        out.append(f"{OUTSIDE}: {outside}")
    out += [
        f"{p.key} is unfinished (last step {p.last_step} of {p.max_steps}): the estimate reads the steps it reached"
        for p in study
        if not p.finished
    ]
    return out


def _estimates(study, reference, seeds, start, min_window, level) -> tuple[list[WindowEstimate], list[str]]:
    caveats = [
        f"replicate {x.replicate} of {x.name} has no replicate {x.replicate} of "
        f"{reference[0].name} (common random numbers): left out"
        for x in study
        if replicate_of(reference, x.replicate) is None
    ]
    return estimate_replicates(replicate_runs(study, reference, seeds), start, min_window, level), caveats


def _left_out(estimates, read_on: str) -> list[str]:
    """The caveat naming the replicates a reading left out (none when every replicate was read)."""
    short = every_step.left_out(estimates)
    if not short or len(short) == len(estimates):
        return []
    n = estimates[0].min_window
    why = f"window under {n} steps" if read_on == "window" else f"under {n} valid steps"
    return [f"replicate(s) {', '.join(map(str, short))} left out: {why}"]


def _dose_status(dose: Pooled, drift: float) -> tuple[str, list[str]]:
    """The dose question alone: bounded / not_bounded / inconclusive, with the reason."""
    if abs(drift) > MAX_DRIFT:
        return "inconclusive", [
            f"not dose-like: log10(E_X/E_P) drifts by {drift:+.2f} dex across the window "
            f"(more than {MAX_DRIFT}); read the curve, not a single ratio"
        ]
    lo, hi = (dose.lo, dose.hi) if dose.interval else (dose.mean, dose.mean)
    if hi < 0:
        return "bounded", []
    if lo > 0:
        return "not_bounded", []
    return "inconclusive", [
        f"the dose ratio's interval ({lo:+.2f} to {hi:+.2f} dex) holds 0: X and P are not told apart"
    ]


def _outcome_reasons(status: str, result: Pooled, m: float, seeds) -> list[str]:
    """Why the outcome is undecided (none when it is decided)."""
    if status != "undecided":
        return []
    if not seeds:
        return ["no seed pair: the outcome has no margin (sigma_S); add a seed pair with replicates"]
    if not (math.isfinite(m) and m > 0):
        return ["the seed pair's outcome spread is zero or unknown: no margin for the outcome test"]
    if not math.isfinite(result.mean):
        return ["no loss records to compare the outcome on"]
    if not result.interval:
        return []
    return [
        f"the outcome interval ({percent(result.lo)} to {percent(result.hi)}) crosses the margin +/-{percent(m)[1:]}"
    ]


def _indicative(dose_status: str, result: Pooled, m: float) -> str:
    """A single replicate's status from point estimates: the dose's, not bounded past the margin."""
    if math.isfinite(m) and m > 0 and math.isfinite(result.mean) and abs(result.mean) >= m:
        return "not_bounded"
    return dose_status


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
        return (
            None,
            (
                f"control pair {name} is not exactly zero, but shares no tracked step with a non-zero "
                "difference with the pair under study: the floor could not be measured"
            ),
            None,
        )
    n = float(10 ** np.median(logs))
    if n <= 1:
        return (
            n,
            None,
            (
                f"control pair {name} (two identical arms) differs as much as or more than {study[0].name} "
                f"({factor_text(n)}x its difference): the change cannot be told apart from run-to-run "
                "nondeterminism; make training deterministic (train.deterministic) and rerun"
            ),
        )
    return (
        n,
        (
            f"{study[0].label}'s deviation is {factor_text(n)} times the run-to-run floor of this hardware "
            f"(control pair {name} is not exactly zero)"
        ),
        None,
    )


def _disagreement(dose: Pooled, dose_f: Pooled) -> str | None:
    if math.isfinite(dose.mean) and math.isfinite(dose_f.mean) and abs(dose.mean - dose_f.mean) > MAX_DISAGREEMENT:
        return (
            f"weight space and function space disagree: log10 dose ratio {dose.mean:+.2f} by rel_l2, "
            f"{dose_f.mean:+.2f} by the probe (more than {MAX_DISAGREEMENT} dex apart)"
        )
    return None


def _no_verdict(name, reference, reason, floor=None, label: str | None = None) -> Verdict:
    headline = f"No verdict for {label or name}: {reason}."
    return Verdict(
        study=name, reference=reference, status="no_verdict", headline=headline, reasons=(reason,), floor=floor
    )
