"""Where a pair diverges: the top layers, each kind of layer, and the control's noise floor.

All values are read at the pair's last tracked step (where the difference has grown most),
with each layer's own growth rate b_l (OLS slope of D_l(t), see ``growth``) beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from divergence.analysis.growth import ols_slope
from divergence.analysis.trajectories import TRAJECTORY_METRICS, PairData

TOP_LAYERS = 10


def top_layers(pair: PairData, metric: str = "wasserstein", n: int = TOP_LAYERS) -> list[dict]:
    """The ``n`` layers with the largest final ``metric``: tensor, kind, numel, finals, slopes."""
    if not pair.layers or not len(pair.steps):
        return []
    final = pair.layer_values[metric][:, -1]
    order = [i for i in np.argsort(-np.nan_to_num(final, nan=-np.inf), kind="stable") if np.isfinite(final[i])]
    return [_layer_row(pair, i) for i in order[:n]]


def kind_table(pair: PairData, metric: str = "wasserstein") -> list[dict]:
    """One row per kind of layer, largest final ``metric`` first, with its top layer."""
    if not len(pair.steps):
        return []
    rows = []
    kinds = np.array(pair.kinds)
    final = pair.layer_values[metric][:, -1]
    for kind, series in pair.kind_values.items():
        members = np.flatnonzero(kinds == kind)
        finite = [i for i in members if np.isfinite(final[i])]
        top = max(finite, key=lambda i: final[i]) if finite else None
        rows.append(
            {
                "kind": kind,
                "tensors": int(len(members)),
                "numel": int(pair.numel[members].sum()),
                **{f"final_{m}": float(series[m][-1]) for m in TRAJECTORY_METRICS},
                **{
                    f"slope_{m}": float(ols_slope(pair.steps, series[m])) if len(pair.steps) > 1 else np.nan
                    for m in TRAJECTORY_METRICS
                },
                "top_tensor": pair.layers[top] if top is not None else "",
            }
        )
    rows.sort(key=lambda r: -np.nan_to_num(r[f"final_{metric}"], nan=-np.inf))
    return rows


def nonfinite_layers(pair: PairData) -> list[str]:
    """Layers with a NaN/inf metric at some tracked step: left out of every growth rate."""
    bad = ~np.all([pair.finite_layers(m) for m in TRAJECTORY_METRICS], axis=0) if pair.layers else []
    return [name for name, b in zip(pair.layers, bad) if b]


@dataclass(frozen=True)
class NoiseFloor:
    """The control pair (both arms identical): what run-to-run nondeterminism alone produces."""

    pair: str
    exact: bool  # every tracked whole-model and layer value is exactly 0
    peak: dict[str, float]  # metric -> largest whole-model value over tracked steps
    final: dict[str, float]  # metric -> whole-model value at the last tracked step
    first_nonzero_step: int | None
    n_steps: int


def noise_floor(control: PairData) -> NoiseFloor:
    """Read the control pair. Exactly zero means training is deterministic, so any difference
    in the other pairs comes from what they change, not from the hardware or the kernels."""
    nonzero = np.zeros(len(control.steps), dtype=bool)
    for m in TRAJECTORY_METRICS:
        layer = control.layer_values[m]
        nonzero |= (control.model[m] != 0) | (np.any(layer != 0, axis=0) if layer.size else False)
    first = int(control.steps[np.argmax(nonzero)]) if nonzero.any() else None
    return NoiseFloor(
        pair=control.name,
        exact=bool(len(control.steps)) and not nonzero.any(),
        peak={m: float(np.nanmax(control.model[m])) if len(control.steps) else np.nan for m in TRAJECTORY_METRICS},
        final={m: float(control.model[m][-1]) if len(control.steps) else np.nan for m in TRAJECTORY_METRICS},
        first_nonzero_step=first,
        n_steps=len(control.steps),
    )


def _layer_row(pair: PairData, i: int) -> dict:
    row = {"tensor": pair.layers[i], "kind": pair.kinds[i], "numel": int(pair.numel[i])}
    for m in TRAJECTORY_METRICS:
        series = pair.layer_values[m][i]
        row[f"final_{m}"] = float(series[-1])
        ok = np.isfinite(series)
        row[f"slope_{m}"] = float(ols_slope(pair.steps[ok], series[ok])) if ok.sum() > 1 else np.nan
    return row
