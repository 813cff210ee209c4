"""What the report says, independent of format: tables of strings and paragraphs.

``html`` and ``markdown`` render the same content, so the two files never disagree.
Growth rates are shown per 1,000 steps (per step they are unreadably small).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from divergence.analysis import METRIC_LABELS, METRICS, Analysis, PairData, kind_table, top_layers
from divergence.analysis.growth import Estimate

ROLES = {"optimization": "under study", "precision": "upper bound", "seed": "reference", "control": "noise floor"}
PER = 1000  # growth rates per this many steps

METHOD = [
    "Each pair trains two models that differ in one thing and compares their weights at tracked steps: "
    "the 1-D Wasserstein distance between each tensor's value distributions and the maximum absolute "
    "elementwise difference (as in Golden et al., \"Is Flash Attention Stable?\", 2024, Fig. 7).",
    "Growth rate g: the least-squares slope, over the tracked steps, of y(t) = sum_l n_l D_l(t) / sum_l n_l, "
    "the mean of the per-layer metric D_l weighted by each layer's element count n_l. For the Wasserstein "
    "distance y(t) is the whole-model value. Relative growth is y(t) - y(t_1), the increase since the first "
    "tracked step (the paper's Fig. 8); subtracting a constant leaves the slope unchanged.",
    "Intervals: 95% percentile bootstrap that resamples layers and steps with replacement. A ratio "
    "g_study / g_reference is fitted on the steps and layers both pairs recorded, and its interval comes "
    "from the joint bootstrap (the same draws for both pairs). Consecutive steps are correlated, so "
    "intervals are on the narrow side.",
    "Verdict: bounded when the pair under study grows clearly slower than every low-precision pair (whole "
    "interval below 1) and not clearly faster than a seed change (interval not above 1); not bounded when "
    "it grows clearly faster than either; inconclusive when an interval against a low-precision pair holds 1 "
    "or the set-up is incomplete (missing reference, non-zero control, unfinished run). The paper found "
    "Flash Attention's drift comparable to or below a seed change and about 2-5x below FP16 vs FP32.",
]


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align_left: int = 1  # leading columns of text; the rest are numbers


def number(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"
    return str(value)


def rate(e: Estimate) -> str:
    if not math.isfinite(e.value):
        return "–"
    interval = f" ({number(e.lo * PER)} – {number(e.hi * PER)})" if e.defined else ""
    return number(e.value * PER) + interval


def ratio_table(analysis: Analysis) -> Table:
    rows = []
    for v in analysis.verdicts:
        for metric, mv in v.metrics.items():
            for r in mv.ratios:
                e = r.estimate
                ci = f"{number(e.lo)} – {number(e.hi)}" if e.defined else "undefined"
                rows.append((v.study, r.reference, METRIC_LABELS[metric], number(e.value), ci,
                             number(r.study_rate * PER), number(r.reference_rate * PER), str(e.n_steps),
                             str(e.n_layers)))
    return Table(("pair under study", "reference", "metric", "ratio of rates", "95% CI", f"g study /{PER} steps",
                  f"g reference /{PER} steps", "steps", "layers"), tuple(rows), align_left=3)


def pairs_table(analysis: Analysis) -> Table:
    rows = []
    for p in analysis.pairs:
        g = analysis.growth[p.name]
        n = len(p.steps)
        rows.append((p.name, ROLES.get(p.category, p.category), p.label,
                     "yes" if p.finished else f"no (step {p.last_step} of {p.max_steps})", str(n),
                     *(number(float(p.model[m][-1])) if n else "–" for m in METRICS),
                     *(rate(g[m]) for m in METRICS)))
    columns = ("pair", "role", "description", "finished", "tracked steps",
               *(f"final {METRIC_LABELS[m]}" for m in METRICS), *(f"g {METRIC_LABELS[m]} /{PER} steps (95% CI)"
                                                                   for m in METRICS))
    return Table(columns, tuple(rows), align_left=4)


def top_layers_table(pair: PairData) -> Table:
    rows = tuple((r["tensor"], r["kind"], str(r["numel"]), *(number(r[f"final_{m}"]) for m in METRICS),
                  *(number(r[f"slope_{m}"] * PER) for m in METRICS)) for r in top_layers(pair))
    return Table(("tensor", "kind", "numel", *(f"final {METRIC_LABELS[m]}" for m in METRICS),
                  *(f"slope {METRIC_LABELS[m]} /{PER} steps" for m in METRICS)), rows, align_left=2)


def kinds_table(pair: PairData) -> Table:
    rows = tuple((r["kind"], r["top_tensor"], str(r["tensors"]), str(r["numel"]),
                  *(number(r[f"final_{m}"]) for m in METRICS), number(r["slope_wasserstein"] * PER))
                 for r in kind_table(pair))
    return Table(("kind", "most divergent tensor", "tensors", "numel", *(f"final {METRIC_LABELS[m]}" for m in METRICS),
                  f"slope {METRIC_LABELS['wasserstein']} /{PER} steps"), rows, align_left=2)


def noise_floor_text(analysis: Analysis) -> list[str]:
    if not analysis.noise_floors:
        return ["No control pair: determinism was not checked, so part of each pair's drift may be "
                "run-to-run noise."]
    out = []
    for f in analysis.noise_floors:
        if f.exact:
            out.append(f"Control pair {f.pair} is exactly zero at all {f.n_steps} tracked steps: training is "
                       "deterministic, so every difference in the other pairs comes from what they change.")
        else:
            out.append(f"Warning: control pair {f.pair} is not zero (from step {f.first_nonzero_step}; peak "
                       f"Wasserstein {number(f.peak['wasserstein'])}, peak max difference "
                       f"{number(f.peak['max_abs_diff'])}). This is the noise floor: drift at or below it "
                       "cannot be told apart from run-to-run nondeterminism.")
    return out


def all_zero(pair: PairData) -> bool:
    """Every layer exactly 0 at every tracked step (a deterministic control): no tables to show."""
    return bool(pair.layers) and all((pair.layer_values[m] == 0).all() for m in METRICS)


def spikes_text(pair: PairData) -> str:
    parts = []
    for arm in "ab":
        steps = pair.loss_steps[pair.spikes[arm]].tolist()
        if steps:
            shown = ", ".join(map(str, steps[:12])) + (" …" if len(steps) > 12 else "")
            parts.append(f"arm {arm}: {len(steps)} flagged loss spike(s) at step {shown}")
    return "; ".join(parts) if parts else "No loss spikes flagged in either arm."
