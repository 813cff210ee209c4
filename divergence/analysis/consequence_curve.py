"""The consequence curve: does a pair's early dose say what it does to the finished model?

Read from the pair runs of ``divergence consequence`` (each: its early dose in dex vs the precision
pair, bf16-vs-fp32; its converged score shift and probe-loss shift, ``analysis.consequence``):

- **Seed margin** m: how far a seed change moves the finished model, from the seed pair's shifts
  s_r over its R replicates: m = f x sqrt(mean_r s_r^2), their root mean square about 0, f =
  ``SATURATED_FACTOR`` (1: "no larger than a seed change's"). Which seed is arm a is arbitrary, so
  a seed change's shift has no sign of its own and its size is its spread about 0, not about the
  replicates' mean: two seed shifts of +7 and +3 points say a seed change moves the score by about
  5, where their standard deviation (2.6) would say the seed pair is consistent. With one
  replicate m is its |shift| (said as a caveat). At convergence a pair has had every step to
  saturate, so its shift is held to the seed spread itself, as the outcome holds a pair saturated
  at its end.
- **Within**: a ladder rung stays within the margin when every replicate's |shift| <= m (each
  point inside the band of the figure).
- **Threshold**: the rungs ordered by early dose (their mean over replicates); the threshold lies
  between the highest rung up to which every rung stayed within and the next rung up. Stated as
  that pair of early doses (dex vs the precision pair): the ladder's spacing is its interval. Rungs above it
  that are within again are counted, not hidden.
- **Rank correlation** of early dose with |score shift| over every pair run of the ladder, the rows
  and the precision reference (Spearman's rho, scipy), with a 95% percentile bootstrap interval
  (Efron & Tibshirani 1993) that resamples whole pairs (their replicates kept together, a cluster
  bootstrap: a pair's replicates share its dose and are not independent points). An interval
  that holds 0 says early dose does not predict the converged outcome on this recipe.
- **Sample distance** beside them (``metrics.sample_distance``): D, how far apart both arms'
  pictures from the same noises are, against the seed pair's D_S (their mean over replicates), and
  its rank correlation with early dose, read and stated as the score's. A hit rate moves only when
  a shape crosses the checker's line; D moves with every pixel, so it can resolve what the score's
  seed margin hides.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from divergence.analysis.outcome import SATURATED_FACTOR

MARGIN_FACTOR = SATURATED_FACTOR
RESAMPLES = 2000
CONFIDENCE = 0.95
MIN_POINTS = 3  # a rank correlation of fewer points says nothing


def seed_margin(shifts: list[float], factor: float = MARGIN_FACTOR) -> dict:
    """``{"value", "factor", "replicates", "caveat"}``: m = factor x the root mean square of the finite
    ``shifts`` (module docstring)."""
    values = [x for x in shifts if x is not None and math.isfinite(x)]
    caveat = None
    if not values:
        value = math.nan
    elif len(values) == 1:
        value = factor * abs(values[0])
        caveat = "one seed replicate: its |shift| stands in for the seed-to-seed spread; train more replicates"
    else:
        value = factor * math.sqrt(float(np.mean(np.square(values))))
    return {"value": value, "factor": factor, "replicates": len(values), "caveat": caveat}


def rungs(rows: list[dict], margin: float, key: str = "score_shift") -> list[dict]:
    """The ladder's rungs ordered by early dose: ``{"eps", "early_dex", "within", "shifts"}``; a rung
    whose replicates have no early dose or no shift is left out."""
    by_eps = defaultdict(list)
    for row in rows:
        if row["role"] == "ladder":
            by_eps[row["eps"]].append(row)
    out = []
    for eps, runs in by_eps.items():
        dex = [r["early_dex"] for r in runs if finite(r["early_dex"])]
        shifts = [_shift(r, key) for r in runs if finite(_shift(r, key))]
        if dex and shifts:
            within = bool(math.isfinite(margin) and all(abs(s) <= margin for s in shifts))
            out.append({"eps": eps, "early_dex": float(np.mean(dex)), "within": within, "shifts": shifts})
    return sorted(out, key=lambda r: r["early_dex"])


def threshold(ladder: list[dict], margin: float) -> dict:
    """``{"below_dex", "above_dex", "within_again"}``: the early doses the threshold lies between (module
    docstring); ``below_dex`` None when even the lowest rung left the margin, ``above_dex`` None when
    none did. ``{}`` when there is no margin or no rung to read."""
    if not ladder or not math.isfinite(margin):
        return {}
    held = 0
    while held < len(ladder) and ladder[held]["within"]:
        held += 1
    return {
        "below_dex": ladder[held - 1]["early_dex"] if held else None,
        "above_dex": ladder[held]["early_dex"] if held < len(ladder) else None,
        "within_again": [r["eps"] for r in ladder[held + 1 :] if r["within"]],
    }


def spearman(rows: list[dict], key: str = "score_shift", resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Spearman's rho of early dose with |shift| over the pair runs that have both, with the cluster
    bootstrap's interval over pairs; ``rho`` None under ``MIN_POINTS`` points or two pairs."""
    points = [(r["pair"], r["early_dex"], _shift(r, key)) for r in rows if r.get("reference") != "seed"]
    points = [(name, x, abs(y)) for name, x, y in points if finite(x) and finite(y)]
    pairs = sorted({p[0] for p in points})
    empty = {"rho": None, "lo": None, "hi": None, "points": len(points), "pairs": len(pairs), "why": "too few"}
    if len(points) < MIN_POINTS or len(pairs) < 2:
        return empty
    rho = _rho([p[1] for p in points], [p[2] for p in points])
    if not math.isfinite(rho):
        return {**empty, "why": "constant"}
    groups = [[(x, y) for name, x, y in points if name == pair] for pair in pairs]
    gen = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        picked = [pt for i in gen.integers(0, len(groups), len(groups)) for pt in groups[i]]
        draws.append(_rho([x for x, _ in picked], [y for _, y in picked]))
    draws = np.array([d for d in draws if math.isfinite(d)])
    tail = (1 - CONFIDENCE) / 2
    lo, hi = (float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))) if draws.size else (None, None)
    return {
        "rho": rho,
        "lo": lo,
        "hi": hi,
        "points": len(points),
        "pairs": len(pairs),
        "resamples": int(draws.size),
        "why": None,
    }


def sentence(
    threshold_: dict,
    margin: float,
    correlation: dict,
    recipe: str,
    steps: int,
    reference: str = "bf16-vs-fp32",
    distance: dict | None = None,
) -> str:
    """The plain statement: what held and what did not, and that it holds on this recipe only;
    early doses in dex vs ``reference``, the precision pair; ``distance``: the sample distance's
    ``{"spearman", "seed", "ratios"}`` (its sentence follows the score's)."""
    parts = [_threshold_text(threshold_, margin, reference), _correlation_text(correlation)]
    if distance is not None:
        parts.append(_distance_text(distance))
    parts.append(f"Measured on this recipe only ({recipe}, {steps} steps); another recipe needs its own curve.")
    return " ".join(parts)


def _threshold_text(t: dict, margin: float, reference: str) -> str:
    if not math.isfinite(margin):
        return "No seed margin (the seed pair has no score shift), so no threshold is read."
    if not t:
        return "No ladder rung has both an early dose and a converged score shift, so no threshold is read."
    band = f"the seed margin (+-{100 * margin:.1f} points)"
    again = (
        f" Rungs above it were within again (eps {', '.join(f'{e:g}' for e in t['within_again'])}): the boundary is not sharp."
        if t["within_again"]
        else ""
    )
    if t["below_dex"] is None:
        return f"Even the lowest ladder rung ({t['above_dex']:+.2f} dex vs {reference}) moved the converged score beyond {band}."
    if t["above_dex"] is None:
        return (
            f"At convergence every ladder rung left the score within {band}, up to the highest at "
            f"{t['below_dex']:+.2f} dex vs {reference}: the threshold lies above the ladder."
        )
    return (
        f"At convergence, doses up to {t['below_dex']:+.2f} dex vs {reference} left the score within {band}; the rung "
        f"at {t['above_dex']:+.2f} dex did not: the threshold lies between them.{again}"
    )


def _correlation_text(c: dict) -> str:
    if c.get("why") == "constant":
        return (
            f"The early doses or the converged score shifts of the {c['points']} pair runs are all equal: no rank "
            "correlation to read, so no statement on prediction."
        )
    if c.get("rho") is None:
        return (
            f"Too few pair runs with an early dose and a score shift to rank ({c.get('points', 0)} runs of "
            f"{c.get('pairs', 0)} pairs; {MIN_POINTS} runs of 2 pairs needed): no statement on prediction."
        )
    said = f"Spearman rho {c['rho']:+.2f}"
    if c["lo"] is None:
        return f"The rank correlation of early dose with |converged score shift| is {said}, without an interval."
    said += f" [{c['lo']:+.2f}, {c['hi']:+.2f}] over {c['points']} pair runs of {c['pairs']} pairs"
    if c["lo"] > 0:
        return f"Early dose predicts the size of the converged score shift here: {said}."
    if c["hi"] < 0:
        return f"Larger early doses went with smaller converged score shifts ({said}): early dose does not predict the converged outcome here."
    return f"Early dose does not predict the converged outcome here: {said}, an interval that includes 0."


def _distance_text(d: dict) -> str:
    c, seed = d["spearman"], d["seed"]
    if c.get("rho") is None or seed is None:
        return "The sample distance has too few pair runs or no seed pair to read: no statement on it."
    said = f"Spearman rho {c['rho']:+.2f}"
    said += "" if c["lo"] is None else f" [{c['lo']:+.2f}, {c['hi']:+.2f}]"
    low, high = d["ratios"]
    head = (
        f"What the finished models draw from the same noises moved by {low:.2f}x to {high:.2f}x a seed change's "
        f"sample distance ({seed:.3f}); early dose ranks it with {said}"
    )
    if c["lo"] is not None and c["lo"] > 0:
        return f"{head}: early dose predicts how far the finished model's pictures move."
    return f"{head}: early dose does not predict it here."


def sample_distances(rows: list[dict]) -> dict:
    """``{"seed", "replicates", "ratios", "spearman"}``: the seed pair's mean sample distance D_S, how many
    replicates it is over, the smallest and largest D / D_S of the other pair runs with an early dose, and
    the rank correlation of early dose with D."""
    seeds = [_shift(r, "sample_distance") for r in rows if r.get("reference") == "seed"]
    seeds = [v for v in seeds if finite(v)]
    seed = float(np.mean(seeds)) if seeds and np.mean(seeds) > 0 else None
    ratios = [
        _shift(r, "sample_distance") / seed
        for r in rows
        if seed and r.get("reference") != "seed" and finite(r["early_dex"]) and finite(_shift(r, "sample_distance"))
    ]
    return {
        "seed": seed,
        "replicates": len(seeds),
        "ratios": [min(ratios), max(ratios)] if ratios else None,
        "spearman": spearman(rows, "sample_distance"),
    }


def _rho(x, y) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks (``scipy.stats.spearmanr``'s
    definition, in numpy: the bootstrap calls it thousands of times); NaN when either side is constant."""
    rx, ry = _ranks(x) - (len(x) + 1) / 2, _ranks(y) - (len(y) + 1) / 2
    norm = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / norm if norm > 0 else math.nan


def _ranks(values) -> np.ndarray:
    """1-based ranks, ties given their average rank (``scipy.stats.rankdata``'s default)."""
    _, inverse, counts = np.unique(np.asarray(values, dtype=float), return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[inverse]


def _shift(row: dict, key: str) -> float | None:
    value = row.get(key)
    return value.get("value") if isinstance(value, dict) else value


def finite(x) -> bool:
    """Whether ``x`` is a finite number (not a boolean)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def curve(rows: list[dict], recipe: str, steps: int) -> dict:
    """Everything ``consequence.json`` states beside its pair runs: the seed margins (score and probe
    loss), the ladder's rungs, the threshold, the rank correlations (score, probe loss and, where the
    runs have it, sample distance), the seed pair's sample distance and the sentence."""
    seeds = [r for r in rows if r.get("reference") == "seed"]
    margins = {
        "score": seed_margin([_shift(r, "score_shift") for r in seeds]),
        "probe": seed_margin([r["probe_shift"] for r in seeds]),
    }
    m = margins["score"]["value"]
    ladder = rungs(rows, m)
    found = threshold(ladder, m)
    correlation = {"score": spearman(rows, "score_shift"), "probe": spearman(rows, "probe_shift")}
    distance = sample_distances(rows) if any("sample_distance" in r for r in rows) else None
    if distance is not None:
        correlation["distance"] = distance["spearman"]
    reference = next((r["pair"] for r in rows if r.get("reference") == "precision"), "the precision pair")
    left_out = [
        f"{r['pair']}#{r['replicate']}" for r in rows if r.get("reference") != "seed" and not finite(r["early_dex"])
    ]
    said = sentence(found, m, correlation["score"], recipe, steps, reference, distance)
    if left_out:
        said = (
            f"{len(left_out)} pair run(s) had no early dose (no window or valid steps in the early steps, e.g. "
            f"saturated before them) and are not on the curve: {', '.join(left_out)}. {said}"
        )
    return {
        "precision_reference": reference,
        "seed_margin": margins,
        "ladder": ladder,
        "threshold": found,
        "spearman": correlation,
        "sample_distance": {k: v for k, v in (distance or {}).items() if k != "spearman"} or None,
        "left_out": left_out,
        "sentence": said,
    }
