"""Calibration with a known dose: does the statistic recover log10(eps_i / eps_j) on a ladder?

The ``grad-noise`` variant multiplies each gradient elementwise by (1 + eps xi), xi ~ N(0, 1),
so pair ``grad-noise-<eps>`` injects a known relative dose eps per step; eps = 0 is bitwise the
reference. For every dose i the statistic of ``dose``/``replicates`` is read against an anchor
dose a (the ladder's middle dose): lr_i = pooled median over the window of log10(E_i / E_a),
whose truth is log10(eps_i / eps_a). The criteria of ``docs/method.md`` ("Calibration"):

    monotone            Spearman rank correlation of lr_i with eps is 1 at every horizon
    slope               OLS slope b of lr_i on log10(eps_i / eps_a) within [0.85, 1.15]
    horizon_stability   |lr_i(H1) - lr_i(H2)| <= 0.15 dex for every dose
    recovery            |lr_i - log10(eps_i / eps_a)| <= 0.2 dex for every dose and horizon above
                        the arithmetic floor (below)
    coverage            the 95% t interval of R-1 replicates covers the truth in >= 85% of the
                        leave-one-replicate-out checks
    synthetic_bounded / synthetic_not_bounded
                        the ladder itself as a study with P = the anchor: the dose eps_a / 10 is
                        ``bounded`` at every horizon, the dose 10 eps_a ``not_bounded``

The arithmetic floor. Once two arms differ in any bit, their own rounding differs at every step
too, and that acts as a dose of its own, f, added to the injected one: E_i grows like eps_i + f.
On the tiny recipe in fp32 (60 steps, 3 replicates) the lowest dose 1e-6 is recovered at 2.0e-6
(0.31 dex above its truth) while 1e-5 ... 1 are within 0.09 dex: f ~ 1e-6 per step, and the
additive model then predicts 1e-5 and 1e-4 within 0.03 dex. Recovery is therefore checked where
the floor adds at most 0.04 dex (eps_i >= 10 f), f measured from the ladder's lowest dose,
f = max(0, eps_a 10^lr_min - eps_min) (that dose measures f and is not checked); ``calibration.json``
reports f and the doses below it. A ladder whose lowest dose sits above the floor checks every dose.

The fitted line lr = b log10(eps / eps_a) + c puts any pair on the ladder's scale: a pair X with
log10(E_X / E_P) = lr_XP against a reference P at lr_P on the ladder has
log10 eps_X = log10 eps_a + (lr_P + lr_XP - c) / b ("X perturbs training like a relative
gradient noise of eps_X per step"). Horizons beyond the runs' length are evaluated at the last
step there is, and said so in ``notes``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace

import numpy as np
from scipy import stats

from divergence.analysis.dose import SATURATED_PHI, estimate_replicates, probe_values, seed_at
from divergence.analysis.growth import ols_slope
from divergence.analysis.replicates import num, pool, pooled_dict, replicate_or_first, replicate_runs
from divergence.analysis.trajectories import PairData
from divergence.analysis.verdict import all_zero, judge
from divergence.config.schema import to_dict
from divergence.errors import UserInputError
from divergence.recipe.run import HARDWARE_KEYS, RunRecipe
from divergence.variants import as_base

SLOPE_RANGE = (0.85, 1.15)
MAX_HORIZON_SHIFT = 0.15
MAX_RECOVERY_ERROR = 0.2
FLOOR_MARGIN = 10  # recovery is checked on doses >= FLOOR_MARGIN x the arithmetic floor (<= 0.04 dex from it)
MIN_COVERAGE = 0.85
MIN_DOSES = 3  # a slope and a monotone order need three doses; a calibration recipe with fewer is refused up front
# Left out of the identity wherever they appear: run length, hardware (``HARDWARE_KEYS``, and how
# the ranks split the model's matmuls and hold the experts), seeds (they follow the replicate),
# logging and names.
_VOLATILE = {
    *HARDWARE_KEYS,
    "max_steps",
    "checkpoint_every",
    "tensor_parallel",
    "expert_parallel",
    "seed",
    "replicate",
    "tracking",
    "log",
    "sample",
    "name",
    "output",
    "variants",
    "workers",
    # What the first variants set, left out (rather than read as the base has them, as ``as_base``
    # reads every variant's keys) before variants declared their keys; kept out so the id of every
    # calibration.json written since stays the same. A new variant needs no entry here.
    "attention",
    "grad_noise",
    "precision",
    "tf32",
    "adamw_impl",
}
# Recipe sections and switches added after calibration files existed, left out of the identity while
# they are off (at the default recipe's value, of its type too: ``qat: 0`` is not off), so a recipe
# that does not use them keeps the id it had before they existed; switched on, they are part of the
# recipe like any other section. A new optional section or switch adds its name here.
_ADDED_LATER = ("moe", "qat", "shard_optimizer", "fsdp_sharding", "inject_bug", "max_shapes")
_DEFAULTS = {k: v for part in to_dict(RunRecipe()).values() if isinstance(part, dict) for k, v in part.items()}


def _off(key: str, value) -> bool:
    off = _DEFAULTS[key] if key in _ADDED_LATER else ...
    return off is not ... and type(value) is type(off) and value == off


def recipe_identity(recipe: dict) -> dict:
    """What makes two runs the same recipe for calibration: model, data and optimization, without run
    length, hardware, seeds (they follow the replicate), logging, or what any registered variant
    sets (``divergence.variants.as_base``: pair.json holds arm a's recipe, and the ladder's arm has
    grad_noise, a flash pair's its attention, an accumulation pair's its micro-batches: the base recipe
    decides). ``id``: 12 hex digits."""

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in sorted(node.items()) if k not in _VOLATILE and not _off(k, v)}
        return node

    kept = strip(as_base(recipe or {}))
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return {"id": digest, "sections": sorted(kept)}


def evaluate(
    ladder: dict[float, list[PairData]],
    seed_pairs: list[PairData],
    horizons=(100, 300),
    references: dict[str, list[PairData]] | None = None,
) -> dict:
    """The content of ``calibration.json``: every criterion as {"value", "pass", ...}, per-dose estimates."""
    doses = sorted(e for e in ladder if e > 0 and ladder[e])
    if len(doses) < MIN_DOSES:
        raise UserInputError(
            f"calibration needs at least {MIN_DOSES} non-zero doses with runs, got {len(doses)}: "
            "train a ladder of doses (e.g. 1e-7 ... 1e-1)"
        )
    anchor = doses[len(doses) // 2]
    last = min(int(p.steps[-1]) for e in doses for p in ladder[e] if len(p.steps))
    notes, used = [], []
    for h in horizons:
        if h > last:
            notes.append(f"horizon {h} exceeds the runs' {last} steps: evaluated at step {last}")
        used.append(min(int(h), last))
    cuts = {h: _cut(ladder, doses, seed_pairs, h) for h in dict.fromkeys(used)}
    per_h = {h: _ladder_at(cut, seeds, doses, anchor) for h, (cut, seeds) in cuts.items()}
    truth = {e: math.log10(e / anchor) for e in doses}
    first = per_h[used[0]]
    line = _line(first, truth)
    criteria = {
        "monotone": _monotone(per_h),
        "slope": _slope(per_h, truth),
        "horizon_stability": _stability(per_h, doses),
        "recovery": _recovery(per_h, truth, anchor),
        "coverage": _coverage(first, truth),
        **_synthetic(cuts, doses, anchor),
    }
    out = {
        "recipe": recipe_identity(ladder[doses[0]][0].recipe),
        "anchor_eps": anchor,
        "horizons": list(horizons),
        "horizons_used": used,
        "notes": notes,
        "line": {"anchor_eps": anchor, **line},
        "anchor_curve": _anchor_curve(ladder[anchor], seed_pairs),
        "criteria": criteria,
        "passed": all(c["pass"] for c in criteria.values()),
        "doses": [_dose_dict(e, truth[e], per_h) for e in doses],
        # eps = 0 must be bitwise the reference: its pair's difference exactly zero at every step
        "reference_exact": bool(all_zero(ladder[0])) if ladder.get(0) else None,
        "references": {},
    }
    for name, runs in (references or {}).items():  # reference pairs trained beside the ladder
        placed = place_reference(out, runs, None)["references"].get(runs[0].name if runs else name)
        if placed:
            out["references"][name] = placed
    return out


def truncate(pair: PairData, horizon: int) -> PairData:
    """The pair as if training had stopped at step ``horizon``."""
    t, s = pair.steps <= horizon, pair.loss_steps <= horizon
    return replace(
        pair,
        steps=pair.steps[t],
        rel_l2=pair.rel_l2[t],
        probe={k: v[t] for k, v in pair.probe.items()},
        router={k: v[t] for k, v in pair.router.items()},
        model={k: v[t] for k, v in pair.model.items()},
        loss_steps=pair.loss_steps[s],
        loss={k: v[s] for k, v in pair.loss.items()},
        spikes={k: v[s] for k, v in pair.spikes.items()},
        layer_values={k: v[:, t] for k, v in pair.layer_values.items()},
        kind_values={k: {m: v[t] for m, v in d.items()} for k, d in pair.kind_values.items()},
    )


def _cut(ladder, doses, seeds, horizon) -> tuple[dict[float, list[PairData]], list[PairData]]:
    """The doses' runs and the seed pair's runs, each cut at ``horizon`` (``truncate``)."""
    return {e: [truncate(p, horizon) for p in ladder[e]] for e in doses}, [truncate(p, horizon) for p in seeds]


def _ladder_at(cut, seeds, doses, anchor) -> dict[float, dict]:
    """dose -> {"pooled", "estimates"} of log10(E_i / E_anchor) from the runs cut at one horizon."""
    out = {}
    for e in doses:
        if e == anchor:
            out[e] = {"pooled": pool([0.0] * len(cut[e])), "estimates": []}
            continue
        estimates = estimate_replicates(replicate_runs(cut[e], cut[anchor], seeds))
        usable = [m for m in estimates if m.usable]
        out[e] = {"pooled": pool([m.log10 for m in usable]), "estimates": usable}
    return out


def _finite_doses(*results: dict) -> list[float]:
    """The doses with an estimate in every one of ``results`` (a dose saturated before the window has none)."""
    return [e for e in results[0] if all(math.isfinite(r[e]["pooled"].mean) for r in results)]


def _monotone(per_h: dict) -> dict:
    values = {}
    for h, result in per_h.items():
        doses = _finite_doses(result)
        rho = (
            stats.spearmanr(doses, [result[e]["pooled"].mean for e in doses])[0]
            if len(doses) >= MIN_DOSES
            else math.nan
        )
        values[str(h)] = None if not math.isfinite(rho) else float(rho)
    ok = all(v is not None and v > 1 - 1e-9 for v in values.values())
    return {
        "value": min((v for v in values.values() if v is not None), default=None),
        "per_horizon": values,
        "pass": ok,
        "rule": "Spearman 1 over unsaturated doses at every horizon",
    }


def _line(result: dict, truth: dict) -> dict:
    doses = _finite_doses(result)
    if len(doses) < 2:
        return {"slope": None, "intercept": None}
    x = np.array([truth[e] for e in doses])
    y = np.array([result[e]["pooled"].mean for e in doses])
    b = float(ols_slope(x, y))
    return {"slope": b, "intercept": float(y.mean() - b * x.mean())}


def _slope(per_h: dict, truth: dict) -> dict:
    slopes = {str(h): _line(r, truth)["slope"] for h, r in per_h.items()}
    ok = all(s is not None and SLOPE_RANGE[0] <= s <= SLOPE_RANGE[1] for s in slopes.values())
    first = next(iter(slopes.values()))
    return {"value": first, "per_horizon": slopes, "pass": ok, "range": list(SLOPE_RANGE)}


def _stability(per_h: dict, doses: list[float]) -> dict:
    results, used = list(per_h.values()), _finite_doses(*per_h.values())
    if len(results) < 2:
        return {"value": None, "pass": False, "rule": "needs two distinct horizons within the runs"}
    shifts = [abs(results[0][e]["pooled"].mean - results[-1][e]["pooled"].mean) for e in used]
    worst = max(shifts) if shifts else math.nan
    return {
        "value": num(worst),
        "pass": bool(len(used) >= 3 and worst <= MAX_HORIZON_SHIFT),
        "max_dex": MAX_HORIZON_SHIFT,
        "doses": used,
        "saturated": [e for e in doses if e not in used],
    }


def _recovery(per_h: dict, truth: dict, anchor: float) -> dict:
    """The worst recovery error over the doses above the arithmetic floor (module docstring)."""
    used = _finite_doses(*per_h.values())
    # f: the dose the lowest one is recovered at, less its own (0 when recovered at or below it)
    lowest = min(used, default=0.0)
    recovered = anchor * 10 ** next(iter(per_h.values()))[lowest]["pooled"].mean if used else 0.0
    floor = max(0.0, recovered - lowest)
    checked = [e for e in used if e >= FLOOR_MARGIN * floor]
    errors = [abs(r[e]["pooled"].mean - truth[e]) for r in per_h.values() for e in checked]
    worst = max(errors) if errors else math.nan
    return {
        "value": num(worst),
        "pass": bool(len(checked) >= 3 and worst <= MAX_RECOVERY_ERROR),
        "max_dex": MAX_RECOVERY_ERROR,
        "doses": checked,
        "floor_eps": num(floor),
        "below_floor": [e for e in used if e not in checked],
        "rule": f"doses >= {FLOOR_MARGIN} x the floor f = max(0, eps_a 10^lr_min - eps_min), from the lowest dose",
    }


def _coverage(result: dict, truth: dict) -> dict:
    hits = []
    for e, r in result.items():
        values = [m.log10 for m in r["estimates"]]
        for i in range(len(values)):
            rest = pool(values[:i] + values[i + 1 :])
            if rest.interval:
                hits.append(rest.lo <= truth[e] <= rest.hi)
    if not hits:
        return {"value": None, "pass": False, "checks": 0, "rule": "needs at least 3 replicates per dose"}
    share = float(np.mean(hits))
    return {"value": share, "pass": share >= MIN_COVERAGE, "checks": len(hits), "min": MIN_COVERAGE}


def _synthetic(cuts, doses, anchor) -> dict:
    """The ladder judged as a study: eps_a / 10 must be bounded, 10 eps_a not bounded, at every horizon."""
    out = {}
    for key, factor, want in (("synthetic_bounded", 0.1, "bounded"), ("synthetic_not_bounded", 10.0, "not_bounded")):
        near = min(doses, key=lambda e: abs(math.log10(e / (anchor * factor))))
        if abs(math.log10(near / (anchor * factor))) > 0.3:
            out[key] = {"value": None, "pass": False, "rule": f"no dose near {anchor * factor:.1g} on the ladder"}
            continue
        statuses = {}
        for h, (cut, seeds) in cuts.items():
            v = judge(cut[near], cut[anchor], seeds, [])
            statuses[str(h)] = v.indicative or v.status
        out[key] = {
            "value": statuses,
            "pass": all(s == want for s in statuses.values()),
            "study_eps": near,
            "reference_eps": anchor,
        }
    return out


def _anchor_curve(runs: list[PairData], seeds: list[PairData]) -> dict:
    """Mean over replicates of log10 E_anchor(t) at the steps before the anchor saturates."""
    by_step: dict[int, list[float]] = {}
    for p in runs:
        f_s, e_s = seed_at(replicate_or_first(seeds, p.replicate), p.steps)
        f = probe_values(p)
        with np.errstate(divide="ignore", invalid="ignore"):
            phi = f / f_s if np.isfinite(f).any() and np.isfinite(f_s).any() else p.rel_l2 / e_s
        ends = np.flatnonzero(phi >= SATURATED_PHI)
        for i in range(ends[0] if ends.size else len(p.steps)):
            if p.rel_l2[i] > 0:
                by_step.setdefault(int(p.steps[i]), []).append(math.log10(p.rel_l2[i]))
    steps = sorted(by_step)
    return {"steps": steps, "log10_rel_l2": [float(np.mean(by_step[t])) for t in steps]}


def place_reference(calibration: dict, runs: list[PairData], window) -> dict:
    """A copy of ``calibration`` with ``references[name]`` = log10(E_P / E_anchor), read from P's runs
    over ``window`` (or all of P's steps) where the anchor curve is defined; unchanged if present."""
    name = runs[0].name if runs else None
    if not runs or name in (calibration.get("references") or {}):
        return calibration
    curve = dict(zip(calibration["anchor_curve"]["steps"], calibration["anchor_curve"]["log10_rel_l2"]))
    values = []
    for p in runs:
        logs = [
            math.log10(e) - curve[int(t)]
            for t, e in zip(p.steps, p.rel_l2)
            if int(t) in curve and e > 0 and (window is None or window[0] <= t <= window[1])
        ]
        if logs:
            values.append(float(np.median(logs)))
    out = dict(calibration, references=dict(calibration.get("references") or {}))
    if values:
        out["references"][name] = {"log10_vs_anchor": float(np.mean(values)), "replicates": len(values)}
    return out


def equivalent_dose(calibration: dict, log10_ratio_vs_reference: float, reference: str) -> float | None:
    """eps_X: the relative gradient noise per step that perturbs training as much as X, or None
    when the calibration does not place ``reference`` or its line is unusable."""
    ref = (calibration.get("references") or {}).get(reference)
    line = calibration.get("line") or {}
    slope, intercept, anchor = line.get("slope"), line.get("intercept"), line.get("anchor_eps")
    if not ref or slope is None or intercept is None or not anchor or not slope > 0:
        return None
    if not math.isfinite(log10_ratio_vs_reference):
        return None
    log_eps = math.log10(anchor) + (ref["log10_vs_anchor"] + log10_ratio_vs_reference - intercept) / slope
    return float(10**log_eps)


def reference_doses(calibration: dict) -> dict[str, float]:
    """Each reference the calibration placed (``references``), as its own equivalent dose: the
    relative gradient noise per step that perturbs training as much as that reference does."""
    doses = {name: equivalent_dose(calibration, 0.0, name) for name in calibration.get("references") or {}}
    return {name: dose for name, dose in doses.items() if dose is not None}


def floor_dose(calibration: dict) -> float | None:
    """The arithmetic floor f the ladder measured (``criteria.recovery.floor_eps``), None when absent or 0."""
    floor = ((calibration.get("criteria") or {}).get("recovery") or {}).get("floor_eps")
    return floor if isinstance(floor, (int, float)) and floor > 0 else None


def _dose_dict(e: float, truth: float, per_h: dict) -> dict:
    first = next(iter(per_h.values()))[e]
    p = first["pooled"]
    windows = [m.window for m in first["estimates"] if m.window]
    return {
        "eps": e,
        "true_log10_vs_anchor": truth,
        **pooled_dict(p, "log10"),
        "window": [min(w[0] for w in windows), max(w[1] for w in windows)] if windows else None,
        "per_horizon": {str(h): num(r[e]["pooled"].mean) for h, r in per_h.items()},
    }
