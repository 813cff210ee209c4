"""The whole analysis of a set of pair runs, and its plain-data form (``summary.json``).

Roles come from each pair's category: ``optimization`` pairs are under study (each gets a
verdict), ``precision`` pairs are the upper bound, ``seed`` pairs the reference, ``control``
pairs the noise floor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from divergence.analysis.growth import CONFIDENCE, MIN_FIT_STEPS, N_BOOT, Estimate, estimate_growth, layer_mean
from divergence.analysis.layers import NoiseFloor, kind_table, noise_floor, nonfinite_layers, top_layers
from divergence.analysis.trajectories import METRICS, PairData
from divergence.analysis.verdict import HEADLINE_METRIC, MIN_STEPS, Verdict, judge

SCHEMA = 1


@dataclass(frozen=True)
class Analysis:
    pairs: tuple[PairData, ...]
    growth: dict[str, dict[str, Estimate]]  # pair -> metric -> growth rate g with CI
    verdicts: tuple[Verdict, ...]  # one per pair under study
    noise_floors: tuple[NoiseFloor, ...]
    warnings: tuple[str, ...]
    settings: dict

    def by_category(self, category: str) -> list[PairData]:
        return [p for p in self.pairs if p.category == category]


def analyze(pairs: list[PairData], n_boot: int = N_BOOT, seed: int = 0, min_steps: int = MIN_STEPS) -> Analysis:
    """Growth rates of every pair, a verdict for every pair under study, the noise floor."""
    if not pairs:
        raise ValueError("analyze: no pairs to analyse")
    order = ("optimization", "precision", "seed", "control")
    pairs = sorted(pairs, key=lambda p: (order.index(p.category), p.name))  # study first, control last
    role = {c: [p for p in pairs if p.category == c] for c in ("optimization", "precision", "seed", "control")}
    floors = tuple(noise_floor(p) for p in role["control"])
    growth = {p.name: {m: estimate_growth(p, m, n_boot, seed) for m in METRICS} for p in pairs}
    unfinished = [p for p in pairs if not p.finished and p.category != "optimization"]
    verdicts = tuple(
        judge(p, role["precision"], role["seed"], list(floors), ([p] if not p.finished else []) + unfinished,
              n_boot, seed, min_steps)
        for p in role["optimization"]
    )
    settings = {"metrics": list(METRICS), "headline_metric": HEADLINE_METRIC, "confidence": CONFIDENCE,
                "bootstrap_replicates": n_boot, "seed": seed, "min_steps": min_steps, "min_fit_steps": MIN_FIT_STEPS,
                "growth_rate": "OLS slope over tracked steps of the numel-weighted mean of per-layer values "
                               "(metric units per training step)",
                "interval": "percentile, two-way bootstrap over layers and steps; ratios from the joint bootstrap"}
    return Analysis(tuple(pairs), growth, verdicts, floors, tuple(_warnings(pairs, floors, role)), settings)


def _warnings(pairs: list[PairData], floors: tuple[NoiseFloor, ...], role: dict) -> list[str]:
    warnings = []
    if not role["optimization"]:
        warnings.append("no pair under study (category optimization): the report shows the pairs but gives no verdict")
    for floor in floors:
        if not floor.exact:
            warnings.append(f"control pair {floor.pair} is not exactly zero (peak Wasserstein "
                            f"{floor.peak['wasserstein']:.3g}, max difference {floor.peak['max_abs_diff']:.3g})")
    for pair in pairs:
        if not len(pair.steps):
            warnings.append(f"{pair.name}: no tracked steps in its metrics store")
        bad = nonfinite_layers(pair)
        if bad:
            warnings.append(f"{pair.name}: {len(bad)} layers hold NaN/inf at some step (first: {bad[0]}); "
                            "they are left out of its growth rates")
    layer_sets = {frozenset(p.layers) for p in pairs if p.layers}
    if len(layer_sets) > 1:
        warnings.append("the pairs do not record the same layers; ratios use the layers both pairs recorded")
    return warnings


def to_summary(analysis: Analysis) -> dict:
    """Every number behind the verdicts, as plain data (the layout of ``summary.json``)."""
    return {
        "schema": SCHEMA,
        "settings": analysis.settings,
        "verdicts": [_verdict_dict(v) for v in analysis.verdicts],
        "noise_floor": [asdict(f) for f in analysis.noise_floors],
        "pairs": {p.name: _pair_dict(p, analysis.growth[p.name]) for p in analysis.pairs},
        "warnings": list(analysis.warnings),
    }


def _verdict_dict(v: Verdict) -> dict:
    return {
        "study": v.study, "status": v.status, "headline": v.headline,
        "reasons": list(v.reasons), "caveats": list(v.caveats),
        "metrics": {m: {"status": mv.status, "sentence": mv.sentence, "reasons": list(mv.reasons),
                        "ratios": [_ratio_dict(r) for r in mv.ratios]} for m, mv in v.metrics.items()},
    }


def _ratio_dict(r) -> dict:
    return {"reference": r.reference, "ratio": r.estimate.value, "lo": r.estimate.lo, "hi": r.estimate.hi,
            "study_rate": r.study_rate, "reference_rate": r.reference_rate,
            "reference_growing": r.reference_growing, "steps": r.estimate.n_steps, "layers": r.estimate.n_layers,
            "replicates": r.estimate.n_boot}


def _pair_dict(p: PairData, growth: dict[str, Estimate]) -> dict:
    n = len(p.steps)
    return {
        "category": p.category, "description": p.description, "folder": p.folder, "arms": p.arms,
        "finished": p.finished, "last_step": p.last_step, "max_steps": p.max_steps,
        "tracked_steps": n, "layers": len(p.layers),
        "growth_rate": {m: asdict(growth[m]) for m in METRICS},
        "model": {m: {"first": float(p.model[m][0]) if n else None, "final": float(p.model[m][-1]) if n else None,
                      "peak": float(np.nanmax(p.model[m])) if n and np.isfinite(p.model[m]).any() else None}
                  for m in METRICS},
        # whole-model values, and the numel-weighted layer mean y(t) the growth rate is fitted to
        "trajectory": {"step": p.steps.tolist(), **{m: p.model[m].tolist() for m in METRICS},
                       **{f"layer_mean_{m}": layer_mean(p, m).tolist() for m in METRICS}},
        "top_layers": top_layers(p),
        "kinds": kind_table(p),
        "spikes": {arm: p.loss_steps[p.spikes[arm]].tolist() for arm in "ab"},
        "nonfinite_layers": nonfinite_layers(p),
    }
