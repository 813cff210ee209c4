"""Per-layer divergence over the tracked steps as one heatmap: layers (rows) x steps (columns).

A thousand per-module line charts cannot be read; one image can. The wandb run gets
``divergence/heatmap`` at the table steps (checkpoint steps and the last step): one panel per
metric (``wasserstein``, ``max_abs_diff``), row i module i in model order, column j the j-th
tracked step so far, the colour log10 of the module's value (zeros at the floor of the scale). The values are those of the metrics store (per-module aggregates of its tensor
records, ``divergence.metrics.aggregate``), so the image can be recomputed from the store.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from divergence.metrics import TRAJECTORY_METRICS, aggregate

LABEL_ROWS = 48  # name each row only while the names stay readable


class LayerHistory:
    """``{step: {module: {metric: value}}}`` of the tracked steps, seeded from the store on resume."""

    def __init__(self):
        self.steps: dict[int, dict[str, dict[str, float]]] = {}

    def seed(self, store_dir: Path, before: int) -> None:
        """The store's tracked steps before ``before`` (a resumed run logs only the steps after)."""
        from divergence.store import MetricsStore

        store = MetricsStore(store_dir)
        if not store.exists():
            return
        by_step: dict[int, list[dict]] = {}
        for record in store.tensor_records():
            if record["step"] < before:
                by_step.setdefault(record["step"], []).append(dict(record, name=record["tensor"]))
        for step, records in by_step.items():
            self.add(step, aggregate(records, "module"))

    def add(self, step: int, modules: list[dict]) -> None:
        self.steps[step] = {row["group"]: {m: row[m] for m in TRAJECTORY_METRICS} for row in modules}

    def matrix(self, metric: str) -> tuple[list[str], list[int], np.ndarray]:
        """(modules in first-seen order, steps, values (L, T)); NaN where a module has no value."""
        steps = sorted(self.steps)
        modules = list(dict.fromkeys(m for s in steps for m in self.steps[s]))
        values = np.full((len(modules), len(steps)), math.nan)
        for j, step in enumerate(steps):
            for i, module in enumerate(modules):
                if module in self.steps[step]:
                    values[i, j] = self.steps[step][module][metric]
        return modules, steps, values


def heatmap_image(history: LayerHistory) -> np.ndarray:
    """An RGB image (H, W, 3) uint8: one panel per ``TRAJECTORY_METRICS`` entry, log10 colour,
    rows modules in model order, columns tracked steps, each with its colour bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modules, steps, _ = history.matrix(TRAJECTORY_METRICS[0])
    # constrained layout: room for the module names and for every colour bar's label (the last one's
    # was cut at the right edge with fixed margins)
    fig = Figure(figsize=(12, min(12, 2 + 0.15 * len(modules))), dpi=72, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(TRAJECTORY_METRICS), sharey=True)
    for ax, metric in zip(axes, TRAJECTORY_METRICS):
        _panel(fig, ax, *history.matrix(metric), metric)
    if len(modules) <= LABEL_ROWS:
        axes[0].set_yticks(range(len(modules)), modules, fontsize=6)
    else:
        axes[0].set_ylabel(f"{len(modules)} modules, in model order")
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _panel(fig, ax, modules: list[str], steps: list[int], values: np.ndarray, metric: str) -> None:
    positive = values[np.isfinite(values) & (values > 0)]
    floor = positive.min() if positive.size else 1e-12
    shown = np.log10(np.where(np.isfinite(values), np.maximum(values, floor), np.nan))
    image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(image, ax=ax, label=f"log10 {metric}")
    ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 8)).round().astype(int))
    ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
    ax.set_xlabel("step")
    ax.set_title(f"{metric} per module")
