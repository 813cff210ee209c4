"""The whole analysis of a set of pair runs, and its plain-data form (``summary.json``, schema 2).

Roles come from each pair's category: ``optimization`` pairs are under study (each gets a
verdict), ``precision`` pairs are the reference P of the dose ratio, ``seed`` pairs the ceiling
in function space and the scale of the outcome margin (never a rate), ``control`` pairs the
noise floor, ``reordering`` pairs the second yardstick (``analysis.reordering``: X against a
reordering of fp32 sums). Runs of one pair name are its replicates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from divergence.analysis import finetune, outcome
from divergence.analysis.coherence import pair_coherence
from divergence.analysis.consequence_file import summary_of
from divergence.analysis.dose import MIN_WINDOW
from divergence.analysis.growth import N_BOOT, Estimate, estimate_growth, layer_mean
from divergence.analysis.layers import NoiseFloor, kind_table, noise_floor, nonfinite_layers, top_layers
from divergence.analysis.every_step import left_out
from divergence.analysis.reordering import NOT_ASKED, REORDERING_DEX, Reordering, with_reordering
from divergence.analysis.replicates import CONFIDENCE, group, num, pooled_dict
from divergence.analysis.trajectories import TRAJECTORY_METRICS, PairData, router_summary
from divergence.analysis.headline import headline
from divergence.analysis.verdict import MAX_DRIFT, METRIC, OUTSIDE, Dose, Verdict, judge

SCHEMA = 2
ORDER = ("optimization", "precision", "seed", "control", "reordering")
# the PairData fields a ``pairs`` entry of summary.json opens with, as they are
PAIR_FIELDS = ("name", "replicate", "category", "description", "folder", "arms", "finished", "last_step", "max_steps")
PAIR_FIELDS += ("numerics", "outside_deployment")


@dataclass(frozen=True)
class Analysis:
    pairs: tuple[PairData, ...]
    growth: dict[str, dict[str, Estimate]]  # pair key -> metric -> growth rate g with CI (``growth``)
    verdicts: tuple[Verdict, ...]  # one per pair (name) under study
    noise_floors: tuple[NoiseFloor, ...]
    warnings: tuple[str, ...]
    settings: dict
    calibration: dict | None = None
    consequence: dict | None = None


def analyze(
    pairs: list[PairData],
    n_boot: int = N_BOOT,
    seed: int = 0,
    min_steps: int = MIN_WINDOW,
    margin_factor: float = outcome.MARGIN_FACTOR,
    start: int | None = None,
    calibration: dict | None = None,
    consequence: dict | None = None,
) -> Analysis:
    """A verdict for every pair under study, the noise floor, and each pair's growth rates."""
    if not pairs:
        raise ValueError("analyze: no pairs to analyse")
    pairs = sorted(pairs, key=lambda p: (ORDER.index(p.category), p.name, p.replicate))  # study first
    groups = group(pairs)
    role = {c: [runs for runs in groups.values() if runs[0].category == c] for c in ORDER}
    reference = role["precision"][0] if role["precision"] else []
    seeds = role["seed"][0] if role["seed"] else []
    controls = [p for runs in role["control"] for p in runs]
    reordering = role["reordering"][0] if role["reordering"] else []
    fine_tune = finetune.recognize(pairs)
    verdicts = []
    for study in role["optimization"]:
        v = judge(study, reference, seeds, controls, margin_factor, start, min_steps, fine_tune)
        v = _with_calibration(v, study, reference, calibration)
        v = with_reordering(v, study, reordering, seeds, start, min_steps, finetune.saturation_level(fine_tune))
        v = _with_consequence(v, study, reference, consequence)
        verdicts.append(replace(v, coherence=pair_coherence(study)))
    growth = {p.key: {m: estimate_growth(p, m, n_boot, seed) for m in TRAJECTORY_METRICS} for p in pairs}
    floors = tuple(noise_floor(p) for p in controls)
    settings = {
        "metric": METRIC,
        "confidence": CONFIDENCE,
        "min_window": min_steps,
        "window_start": start,
        "margin_factor": margin_factor,
        "max_drift_dex": MAX_DRIFT,
        "bootstrap_replicates": n_boot,
        "seed": seed,
        "reference": reference[0].name if reference else None,
        "reordering_reference": reordering[0].name if reordering else None,
        "reordering_threshold_dex": REORDERING_DEX,
        "fine_tune": _fine_tune_dict(fine_tune, seeds),
        "dose_ratio": "per replicate, median over the unsaturated window of log10(E_X/E_P), E = whole-model "
        "rel_l2; pooled mean over replicates with a t interval (R-1 degrees of freedom)",
        "outcome": f"mean over the last {outcome.LAST_FRACTION:.0%} of steps of (l_a - l_b) / l_b; margin = factor x the seed "
        "pair's spread over replicates",
    }
    return Analysis(
        pairs=tuple(pairs),
        growth=growth,
        verdicts=tuple(verdicts),
        noise_floors=floors,
        warnings=tuple(_warnings(pairs, floors, role)),
        settings=settings,
        calibration=calibration,
        consequence=consequence,
    )


def _fine_tune_dict(fine_tune: finetune.FineTune | None, seeds: list[PairData]) -> dict | None:
    """``settings.fine_tune``: how the pairs were recognized as a fine-tune, its seed reference and the
    share of that reference's E that ends a window (None: training from scratch)."""
    if fine_tune is None:
        return None
    return {
        "recognized_from": fine_tune.how,
        "start": fine_tune.start,
        "seed_reference": seeds[0].name if seeds else None,
        "saturated": finetune.SATURATED_FINETUNE,
        "ceiling": finetune.ceiling_text(fine_tune, seeds),
    }


def _with_calibration(v: Verdict, study, reference, calibration) -> Verdict:
    """The studied pair's equivalent gradient-noise dose, when a calibration of this recipe exists."""
    if calibration is None or not math.isfinite(v.dose.ratio.mean) or not v.dose.dose_like or not reference:
        return v
    from divergence.analysis.calibration import equivalent_dose, place_reference, recipe_identity

    if calibration.get("recipe", {}).get("id") != recipe_identity(study[0].recipe)["id"]:
        return replace(v, caveats=v.caveats + ("the calibration given is for another recipe: no equivalent dose",))
    calibration = place_reference(calibration, reference, v.dose.window)
    dose = equivalent_dose(calibration, v.dose.ratio.mean, reference[0].name)
    if dose is None:
        return v
    v = replace(v, dose=replace(v.dose, equivalent=dose))
    floor_text = next((c for c in v.caveats if "run-to-run floor" in c), None)
    return replace(v, headline=headline(v, study[0].label, reference[0].label, floor_text))


def _with_consequence(v: Verdict, study, reference, consequence) -> Verdict:
    """What the studied pair's dose predicts for the finished model, when a consequence curve of this
    recipe against the same precision pair exists (``analysis.consequence_file``)."""
    if consequence is None or not math.isfinite(v.dose.ratio.mean) or not v.dose.dose_like or not reference:
        return v
    from divergence.analysis.calibration import recipe_identity
    from divergence.analysis.consequence_file import prediction

    if consequence["recipe_id"] != recipe_identity(study[0].recipe)["id"]:
        return replace(v, caveats=v.caveats + ("the consequence curve given is for another recipe: no prediction",))
    if consequence.get("precision_reference", reference[0].name) != reference[0].name:
        return replace(
            v,
            caveats=v.caveats
            + (f"the consequence curve reads doses against {consequence['precision_reference']}: no prediction",),
        )
    said = prediction(consequence, v.dose.ratio.mean, reference[0].label)
    return replace(v, prediction=said, headline=f"{v.headline} {said}")


def _warnings(pairs: list[PairData], floors: tuple[NoiseFloor, ...], role: dict) -> list[str]:
    warnings = []
    if not role["optimization"]:
        warnings.append("no pair under study (category optimization): the report shows the pairs but gives no verdict")
    if len(role["precision"]) > 1:
        names = ", ".join(runs[0].name for runs in role["precision"][1:])
        warnings.append(
            f"several precision pairs: the verdict uses {role['precision'][0][0].name}; {names} are "
            "shown but not used as the reference"
        )
    if role["optimization"] and not role["reordering"]:
        warnings.append(NOT_ASKED)
    if len(role["reordering"]) > 1:
        names = ", ".join(runs[0].name for runs in role["reordering"][1:])
        warnings.append(
            f"several reordering pairs: the verdict uses {role['reordering'][0][0].name}; {names} are "
            "shown but not used as the reordering reference"
        )
    for floor in floors:
        if not floor.exact:
            warnings.append(
                f"control pair {floor.pair} is not exactly zero (peak Wasserstein "
                f"{floor.peak['wasserstein']:.3g}, max difference {floor.peak['max_abs_diff']:.3g})"
            )
    for pair in pairs:
        if not len(pair.steps):
            warnings.append(f"{pair.key}: no tracked steps in its metrics store")
        bad = nonfinite_layers(pair)
        if bad:
            warnings.append(
                f"{pair.key}: {len(bad)} layers hold NaN/inf at some step (first: {bad[0]}); "
                "they are left out of its growth rates"
            )
        if pair.category != "optimization" and not pair.finished:
            warnings.append(f"{pair.key} is unfinished (last step {pair.last_step} of {pair.max_steps})")
    return warnings


def to_summary(analysis: Analysis) -> dict:
    """Every number behind the verdicts, as plain data (``summary.json``, schema 2)."""
    return {
        "schema": SCHEMA,
        "settings": analysis.settings,
        "verdicts": [verdict_dict(v) for v in analysis.verdicts],
        "noise_floor": [asdict(f) for f in analysis.noise_floors],
        "pairs": {p.key: _pair_dict(p, analysis.growth[p.key]) for p in analysis.pairs},
        "warnings": list(analysis.warnings),
        "calibration": _calibration_dict(analysis.calibration),
        "consequence": summary_of(analysis.consequence),
    }


def verdict_dict(v: Verdict) -> dict:
    """One entry of ``verdicts`` (the schema-2 contract)."""
    dose, result = v.dose, v.outcome
    usable = [e for e in dose.estimates if e.usable]
    return {
        "study": v.study,
        "status": v.status,
        "headline": v.headline,
        "dose_ratio": {
            "reference": v.reference,
            "metric": METRIC,
            **pooled_dict(dose.ratio, "log10"),
            "window": list(dose.window) if dose.window else None,
            "common_start": usable[0].window_start if usable else None,
            "status": dose.status,
            "replicates_needed": {k: dose.replicates_needed.get(k) for k in ("exclude_0", "exclude_0.3_dex")},
            "read_on": dose.read_on if dose.estimates else None,
            # each replicate's log10: the median over its window, or, read on every valid step, the largest
            # (every step below 0: a bound from above) or the smallest (every step above 0) there
            "statistic": {"below": "max", "above": "min"}.get(dose.bound_side, "median") if dose.estimates else None,
            "left_out": list(left_out(dose.estimates)) if dose.estimates else [],
        },
        "outcome": {
            **pooled_dict(result.delta, "mean"),
            "margin": num(result.margin),
            "source": result.source,
            "status": result.status,
            "replicates_needed": result.replicates_needed,
            "margin_factor": num(result.margin_factor),
            "saturated": result.saturated,
        },
        "reasons": list(v.reasons),
        "caveats": list(v.caveats),
        "indicative": v.indicative,
        "outside_deployment": next((c for c in v.caveats if c.startswith(OUTSIDE)), None),
        "function_space": {"metric": "probe_rel_diff", **pooled_dict(dose.function, "log10")},
        "flatness": {"drift_dex": num(dose.drift), "max_drift_dex": MAX_DRIFT, "dose_like": dose.dose_like},
        "lambda": {k: num(np.mean([e.lam[k] for e in usable])) if usable else None for k in ("study", "reference")},
        "t10": _phi_steps(dose, "t10"),
        "t50": _phi_steps(dose, "t50"),
        "noise_floor_ratio": num(v.floor),
        "equivalent_dose": dose.equivalent,
        "reordering": reordering_dict(v.reordering),
        "coherence": _finite(v.coherence),
        "prediction": v.prediction,
        "outcome_per_replicate": {str(r): num(d) for r, d in result.per_replicate.items()},
        "per_replicate": [
            {
                "replicate": e.replicate,
                "space": e.space,
                "window": list(e.window) if e.window else None,
                "settled_at": e.settled_at,
                "steps_in_window": e.n_window,
                "log10": num(e.log10),
                "log10_function": num(e.log10_function),
                "drift_dex": num(e.drift),
                "lambda": {k: num(x) for k, x in e.lam.items()},
                "t10": e.t10,
                "t50": e.t50,
            }
            for e in dose.estimates
        ],
    }


def reordering_dict(r: Reordering | None) -> dict | None:
    """``verdicts[i].reordering`` (None: the study has no reordering reference)."""
    if r is None:
        return None
    return {
        **pooled_dict(r.ratio, "log10"),
        "status": r.status,
        "replicates_needed": r.replicates_needed,
        "reference": r.reference,
        "threshold_dex": REORDERING_DEX,
        "fp32_equivalent": r.fp32_equivalent,
        "drift_dex": num(r.drift),
        "reason": r.reason,
        "read_on": r.read_on,
        "left_out": list(left_out(r.estimates)) if r.read_on else [],
        "per_replicate": [
            {"replicate": e.replicate, "window": list(e.window) if e.window else None, "log10": num(e.log10)}
            for e in r.estimates
        ],
    }


def _phi_steps(dose: Dose, which: str) -> dict:
    """Per pair role: each replicate's first step with phi at the level (None: censored) and the median."""
    out = {}
    for role in ("study", "reference"):
        steps = [getattr(e, which).get(role) for e in dose.estimates]
        reached = [s for s in steps if s is not None]
        out[role] = {
            "per_replicate": steps,
            "median": float(np.median(reached)) if reached else None,
            "censored": len(steps) - len(reached),
        }
    return out


def _finite(data):
    """``data`` with every non-finite float as None (JSON holds no NaN for a reader to trip on)."""
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return None if isinstance(data, float) and not math.isfinite(data) else data


def _calibration_dict(calibration: dict | None) -> dict | None:
    if calibration is None:
        return None
    from divergence.analysis.calibration import floor_dose, reference_doses

    return {
        "recipe": calibration.get("recipe"),
        "line": calibration.get("line"),
        "criteria": {k: c.get("pass") for k, c in (calibration.get("criteria") or {}).items()},
        "reference_doses": reference_doses(calibration),
        "floor_eps": floor_dose(calibration),
    }


def _pair_dict(p: PairData, growth: dict[str, Estimate]) -> dict:
    n = len(p.steps)
    return {
        **{key: getattr(p, key) for key in PAIR_FIELDS},
        "tracked_steps": n,
        "layers": len(p.layers),
        "probe": p.has_probe(),
        "growth_rate": {m: asdict(growth[m]) for m in TRAJECTORY_METRICS},
        "model": {
            m: {
                "first": float(p.model[m][0]) if n else None,
                "final": float(p.model[m][-1]) if n else None,
                "peak": float(np.nanmax(p.model[m])) if n and np.isfinite(p.model[m]).any() else None,
            }
            for m in TRAJECTORY_METRICS
        },
        "trajectory": {
            "step": p.steps.tolist(),
            "rel_l2": p.rel_l2.tolist(),
            "probe_rel_diff": p.probe.get("probe_rel_diff", np.zeros(0)).tolist(),
            **{m: p.model[m].tolist() for m in TRAJECTORY_METRICS},
            **{f"layer_mean_{m}": layer_mean(p, m).tolist() for m in TRAJECTORY_METRICS},
        },
        "top_layers": top_layers(p),
        "kinds": kind_table(p),
        "spikes": {arm: p.loss_steps[p.spikes[arm]].tolist() for arm in "ab"},
        "nonfinite_layers": nonfinite_layers(p),
        "router": router_summary(p),
    }
