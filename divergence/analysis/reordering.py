"""The reordering yardstick: is the pair under study X more than a reordering of fp32 sums?

A parallelization, a fused kernel or a compiled graph is mathematically the identity: it only
reorders fp32 sums. A bug in it (a gradient averaged over the wrong group, a scale off by 1e-3)
can still sit far below low precision and read "bounded" against the precision reference P. The
second reference R is a pair whose arms differ only in the order of fp32 sums (by default 4x4
gradient accumulation vs one batch of 16, ``recipes/pairs/reordering.yaml``; category
``reordering``). X is stated against it with the dose ratio's own machinery (``docs/method.md``,
"The reordering yardstick"): per replicate r, on the unsaturated window of X against R
(``dose.estimate_replicates``),

    lr_r = median over U_r of log10(E_X / E_R)                          (read_on "window")

pooled over replicates to a mean with a t interval [lo, hi] (``replicates.pool``). With the
threshold d = ``REORDERING_DEX`` (+1 dex: 10x a reordering):

    reordering_like     hi <= d  (no more than 10x the reordering reference, however far below it)
    beyond_reordering   lo > d   ("perturbs training N x more than a reordering of fp32 sums: if X
                                  should be the identity, look for a bug")
    inconclusive        lo <= d < hi, with the replicates that would decide at the observed mean
                        and spread (``replicates.replicates_to_clear`` with the gap |mean - d|)

One replicate: the point estimate decides, no interval, no replicates planned. X's arms bitwise
equal at every tracked step where R's differ: reordering_like, no number.

Not a window in every replicate: the valid steps. The window asks for a constant ratio in a shared
exponential regime, a dose ratio's premise; the reordering question is one of magnitude ("more
than 10x a reordering of fp32 sums at every step"), and a bug's difference grows unlike a
reordering's (a bias injected each step adds up; rounding is amplified, or sits at its floor),
so no window forms exactly where the question matters. Measured on 2 gloo ranks, 6 steps, the
tiny UNet: rank 1's gradient scaled by 1 + 1e-3 sits +2.0 dex above R at every step, a parameter
left out of the all-reduce +2.2 to +2.9 dex, and neither forms a window (on the tiny DiT,
``tests/scaleout/test_parallel_rows.py``, the scaled gradient's ratio is flat enough for one,
+2.0 to +2.1 dex, steps 2-6; the parameter left out, +3.0 to +3.2 dex and growing, forms none).
So, when a replicate has none, the replicates are read over their valid steps V_r as
``every_step.choose`` decides (its docstring defines V_r and when which reading applies)

    lr_r = median over V_r of log10(E_X / E_R)      (at least ``min_window`` steps; read_on "valid_steps")

pooled and decided as above, with one more condition, since a drifting ratio is not one number
and its median alone must not call it: beyond_reordering needs log10(E_X / E_R) > d at every
step of every V_r, reordering_like at most d at every one; a ratio that crosses d is
inconclusive, and no number of replicates decides it (the reason says where it crosses). No
reading (status None, with the reason): R's arms bitwise equal, or fewer than ``min_window``
valid steps in every replicate (``no_window.why_no_window`` says which condition failed).

The verdict's sentence says it for every pair; the "look for a bug" clause only for a pair that
declares its change should be the identity (``pair.json``'s ``expect_identity``, which the built-in
fp32-equivalent variants set and ``ArmWriter(expect_identity=True)`` writes; undeclared: no).
Without a reordering pair the headline says that "bug or noise" was not asked. Examples, three
replicates each (t_{0.975, 2} = 4.30):

>>> decide(pool([0.2, 0.4, 0.3])), decide(pool([2.9, 3.1, 3.0])), decide(pool([0.5, 1.5, 1.0]))
('reordering_like', 'beyond_reordering', 'inconclusive')

On the valid steps, a ratio above d at every step decides; one that rises through it does not,
whatever its median (+1.18 here):

>>> steady, rising = np.log10([200.0, 300.0, 400.0]), np.log10([3.0, 15.0, 30.0])
>>> crossing(steady), crossing(rising)
(None, 'log10(E_X/E_R) crosses +1 dex over the valid steps (+0.48 to +1.48): a drifting ratio, not one number')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from divergence.analysis import dose, every_step
from divergence.analysis.dose import MIN_WINDOW, SATURATED_E, WindowEstimate, estimate_replicates
from divergence.analysis.every_step import left_out_text
from divergence.analysis.headline import decide_text, factor_text, interval_text
from divergence.analysis.no_window import why_no_window
from divergence.analysis.replicates import Pooled, pool, replicate_runs, replicates_to_clear
from divergence.analysis.trajectories import PairData
from divergence.analysis.verdict import all_zero
from divergence.variants.registry import VARIANTS

REORDERING_DEX = 1.0  # log10(E_X / E_R) above which X perturbs more than a reordering of fp32 sums
FP32_EQUIVALENT = tuple(sorted(name for name, cls in VARIANTS.items() if cls.fp32_equivalent))  # the variants' word
STATUSES = ("reordering_like", "beyond_reordering", "inconclusive")
NOT_ASKED = (  # the headline's line, and summary.json's warning, without a reordering pair
    "Bug or noise was not asked: no reordering pair (category reordering, arms that differ only in the order "
    "of fp32 sums) among the inputs, so nothing says whether the change is more than a reordering."
)


def method_text() -> str:
    """The report's Method paragraph on the reordering yardstick, rendered from the constants."""
    return (
        "Reordering reference: a second yardstick R, a pair whose arms differ only in the order of fp32 sums "
        "(by default 4x4 gradient accumulation vs one batch of 16, in fp32). log10(E_X / E_R) is read per "
        "replicate as the dose ratio is (the median over the unsaturated window of X against R) and pooled with "
        f"the same t interval: reordering-like when the interval's upper end is at most +{REORDERING_DEX:g} dex "
        f"({10**REORDERING_DEX:g}x a reordering, however far below it), beyond reordering when its lower end is "
        "above it, inconclusive when it holds it (with the replicates that would decide). When X and R do not grow "
        "alike in every replicate (a bug's bias injected each step adds up, a reordering's rounding does not), "
        f"every replicate is read over its valid steps instead (both E > 0 and finite, unsaturated, at least "
        f"{dose.MIN_WINDOW} of them), and a status then also needs every step on its side of the threshold: a "
        "ratio that crosses it is inconclusive (and the replicates with a window are read on it, the others left "
        "out and counted). For a pair that declares its change should be the identity (pair.json's "
        f"expect_identity, set by the fp32-equivalent variants {', '.join(FP32_EQUIVALENT)} and by "
        "ArmWriter(expect_identity=True)), beyond reordering means: if it should be the identity, look for a bug."
    )


@dataclass(frozen=True)
class Reordering:
    """X against the reordering reference R: log10(E_X / E_R) pooled over replicates, and its status."""

    reference: str  # R's name
    label: str  # what a person reads for R
    ratio: Pooled  # log10(E_X / E_R), per replicate pooled
    status: str | None  # STATUSES; None: no reading (``reason``)
    replicates_needed: int | None  # for inconclusive: the replicates that would decide
    fp32_equivalent: bool  # X's variants declare it the identity in fp32
    drift: float = math.nan  # mean over replicates of log10(E_X/E_R)'s change across the window, dex
    estimates: tuple[WindowEstimate, ...] = ()
    reason: str | None = None  # why there is no number (none is needed: bitwise-equal arms; none decides)
    read_on: str | None = None  # every_step.READ_ON: the window, or the valid steps if no window forms; None: not read


def against_reordering(
    study: list[PairData],
    reordering: list[PairData],
    seeds: list[PairData],
    start: int | None = None,
    min_window: int = MIN_WINDOW,
    saturated: float = SATURATED_E,
) -> Reordering:
    """The replicates of the pair under study against the replicates of the reordering pair R
    (``saturated``: the E / E_S that ends a window, a fine-tune's where the pairs are one)."""
    common = dict(
        reference=reordering[0].name, label=reordering[0].label, fp32_equivalent=bool(study[0].expect_identity)
    )
    empty = pool([])
    if all_zero(reordering):
        reason = f"{reordering[0].name}'s arms are bitwise equal at every tracked step: no reordering to compare with"
        return Reordering(ratio=empty, status=None, replicates_needed=None, reason=reason, **common)
    if all_zero(study):
        reason = "its arms are bitwise equal at every tracked step"
        return Reordering(ratio=empty, status="reordering_like", replicates_needed=None, reason=reason, **common)
    windows = tuple(estimate_replicates(replicate_runs(study, reordering, seeds), start, min_window, saturated))
    read_on, estimates = every_step.choose(windows, REORDERING_DEX)
    estimates = tuple(estimates)
    usable = [e for e in estimates if e.usable]
    if not usable:
        reason = why_no_window(study, reordering, list(windows), min_window, seeds, saturated)
        return Reordering(ratio=empty, status=None, replicates_needed=None, reason=reason, estimates=windows, **common)
    ratio = pool([e.log10 for e in usable])
    status, reason = decide(ratio), None
    if read_on == "valid_steps":
        reason = crossing(np.concatenate([e.log_ratio[e.in_window] for e in usable]))
        status = "inconclusive" if reason else status
    gap = abs(ratio.mean - REORDERING_DEX)
    needed = replicates_to_clear(ratio, gap) if status == "inconclusive" and reason is None else None
    return Reordering(
        ratio=ratio,
        status=status,
        replicates_needed=needed,
        drift=float(np.mean([e.drift for e in usable])),
        estimates=estimates,
        reason=reason,
        read_on=read_on,
        **common,
    )


def crossing(values: np.ndarray) -> str | None:
    """Why no status holds at every valid step: log10(E_X / E_R) ``values`` on both sides of
    ``REORDERING_DEX`` (no number of replicates puts every step on one side); None when on one side."""
    above = values > REORDERING_DEX
    if above.all() or not above.any():
        return None
    return (
        f"log10(E_X/E_R) crosses +{REORDERING_DEX:g} dex over the valid steps ({values.min():+.2f} to "
        f"{values.max():+.2f}): a drifting ratio, not one number"
    )


def decide(ratio: Pooled) -> str:
    """reordering_like / beyond_reordering / inconclusive from the interval (the point with one replicate)."""
    lo, hi = (ratio.lo, ratio.hi) if ratio.interval else (ratio.mean, ratio.mean)
    if hi <= REORDERING_DEX:
        return "reordering_like"
    if lo > REORDERING_DEX:
        return "beyond_reordering"
    return "inconclusive"


def with_reordering(
    v, study: list[PairData], reordering: list[PairData], seeds, start, min_window, saturated: float = SATURATED_E
):
    """The verdict ``v`` with X against R and the sentence that says it; without R, the line that says
    the question was not asked."""
    if not reordering:
        return replace(v, headline=f"{v.headline} {NOT_ASKED}")
    r = against_reordering(study, reordering, seeds, start, min_window, saturated)
    other_batch = batch_caveat(study[0], reordering[0])
    caveats = v.caveats + (other_batch,) if other_batch else v.caveats
    return replace(v, reordering=r, headline=f"{v.headline} {sentence(r, study[0].label)}", caveats=caveats)


def batch_caveat(x: PairData, r: PairData) -> str | None:
    """The caveat when the reordering pair R trained on another global batch than X (its pair file fixes
    one, e.g. 4x4 vs 1x16, whatever the study's recipe sets): R is then a reordering of another
    training's sums. None when they agree or a recipe does not say."""
    mine, theirs = global_batch(x.recipe), global_batch(r.recipe)
    if mine is None or theirs is None or mine == theirs:
        return None
    return (
        f"the reordering yardstick {r.name} trained on a global batch of {theirs}, {x.name} on {mine}: a reordering "
        f"of another training's sums (give its arms grad-accumulation KxB with K x B = {mine} to read it at this one)"
    )


def global_batch(recipe: dict) -> int | None:
    """Examples per optimizer step of a resolved recipe: batch_size x data-parallel replicas x accumulate
    (``training.separate_arm.global_batch``); None when the recipe does not hold them."""
    train = (recipe or {}).get("train")
    if not isinstance(train, dict):
        return None
    keys = ("batch_size", "accumulate", "devices", "num_nodes", "tensor_parallel")
    values = [train.get(k, 1 if k != "batch_size" else None) for k in keys]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        return None
    batch, accumulate, devices, nodes, tensor = values
    return batch * (devices * nodes // tensor) * accumulate


def sentence(r: Reordering, label: str) -> str:
    """The verdict's reordering clause, one sentence."""
    against = f"Against a reordering of fp32 sums ({r.label})"
    if r.status is None:
        return f"{against}: no reading: {r.reason}."
    if not math.isfinite(r.ratio.mean):
        return f"{against}: reordering-like: {r.reason}."
    m = r.ratio.mean
    numbers = f"log10 E_X/E_R {m:+.2f}{interval_text(r.ratio)}{left_out_text(r.estimates, r.read_on or 'window')}"
    numbers += where_read(r)
    factor = factor_text(10 ** abs(m))
    limit = factor_text(10**REORDERING_DEX)
    if r.status == "beyond_reordering" and r.fp32_equivalent:
        return (
            f"{label} perturbs training {factor}x more than a reordering of fp32 sums ({r.label}; {numbers}): "
            f"if {label} should be the identity, look for a bug."
        )
    how = "as much" if factor == "1" else f"{factor}x {'less' if m < 0 else 'more'}"
    said = f"{against}: {how} ({numbers})"
    if r.status == "reordering_like":
        fits = ", as an fp32-equivalent transformation should be" if r.fp32_equivalent else ""
        return f"{said}: reordering-like, no more than {limit}x a reordering{fits}."
    if r.status == "beyond_reordering":
        return f"{said}: beyond reordering."
    if r.reason:  # a ratio that crosses the threshold on the valid steps
        return f"{said}: inconclusive: {r.reason}, which more replicates do not decide; see the curves."
    decide = decide_text(r.replicates_needed, r.ratio)
    return f"{said}: inconclusive, the interval holds +{REORDERING_DEX:g} dex ({limit}x a reordering); {decide}."


def where_read(r: Reordering) -> str:
    """``; read over the valid steps 1-6, as X and R do not grow alike`` when no window formed, else nothing."""
    if r.read_on != "valid_steps":
        return ""
    spans = sorted({e.window for e in r.estimates if e.usable})
    steps = f" {spans[0][0]}-{spans[0][1]}" if len(spans) == 1 else ""
    return f"; read over the valid steps{steps}, as X and R do not grow alike"
