"""The report's figures as PNG files, one function per figure.

Each function writes one PNG into ``out_dir`` and returns its path, or None when there is
nothing to draw. Colours follow the pair's role: the pair under study red, low precision
orange, seed blue, control grey.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import matplotlib
from matplotlib.colors import LogNorm

from divergence.analysis import METRIC_LABELS, TRAJECTORY_METRICS, Analysis, PairData, layer_mean
from divergence.report.canvas import DPI, finish, save, subplots
from divergence.report.consequence_figure import FILES as CONSEQUENCE_FIGURES
from divergence.report.dose_figures import COLORS, coherence_figures, dose_figures
from divergence.report.router_panel import FIGURE as ROUTER_FIGURE, router_figure
from divergence.recipe.names import file_stem  # every figure named after a pair: one name, one file

STYLES = ("-", "--", ":", "-.")
HEATMAP_ROWS = 30


def short_label(pair) -> str:
    """A legend-sized name: the description when it is short, else the pair's name."""
    return pair.label if len(pair.label) <= 48 else pair.name


def run_label(pair) -> str:
    """The legend name of one run: the pair's, with its replicate when there are several."""
    return short_label(pair) + (f" (r{pair.replicate})" if pair.replicate else "")


def _style(pairs: list[PairData]) -> dict[str, dict]:
    """Colour by role; line style tells apart several pairs of one role (replicates share a style)."""
    seen: dict[str, int] = {}
    names: dict[str, dict] = {}
    out = {}
    for p in pairs:
        if p.name not in names:
            i = seen.get(p.category, 0)
            seen[p.category] = i + 1
            names[p.name] = {"color": COLORS.get(p.category, "black"), "linestyle": STYLES[i % len(STYLES)]}
        out[p.name] = out[p.key] = names[p.name]
    return out


def trajectory(analysis: Analysis, metric: str, out_dir: Path) -> Path | None:
    """Whole-model metric of every pair over training (paper Fig. 7), log scale: pairs span decades."""
    pairs = [p for p in analysis.pairs if len(p.steps)]
    if not pairs:
        return None
    style = _style(pairs)
    fig, ax = subplots(figsize=(8, 4.6))
    for p in pairs:
        values = p.model[metric]
        positive = values > 0
        label = f"{run_label(p)} [{p.category}]"
        if not positive.any():
            ax.plot([], [], label=f"{label}: exactly 0, not drawn", **style[p.name])
            continue
        ax.plot(p.steps[positive], values[positive], marker="o", markersize=2.5, label=label, **style[p.name])
    label = METRIC_LABELS[metric]
    title = f"Weight difference between the two arms of each pair: {label}"
    return finish(fig, ax, out_dir / f"trajectory_{metric}.png", f"whole-model {label}", title, log=True)


def relative_growth(analysis: Analysis, metric: str, out_dir: Path) -> Path | None:
    """Growth since the first tracked step with its fitted slope (paper Fig. 8), linear scale."""
    pairs = [p for p in analysis.pairs if len(p.steps) > 1]
    if not pairs:
        return None
    style = _style(pairs)
    fig, ax = subplots(figsize=(8, 4.6))
    for p in pairs:
        y = layer_mean(p, metric)
        rel = y - y[0]
        g = analysis.growth[p.key][metric]
        rate = f"g = {g.value * 1000:.3g}/1k steps" if np.isfinite(g.value) else "g undefined"
        if g.defined:
            rate += f" ({g.lo * 1000:.3g}-{g.hi * 1000:.3g})"
        ax.plot(p.steps, rel, marker="o", markersize=2.5, label=f"{run_label(p)}: {rate}", **style[p.name])
        if np.isfinite(g.value):
            fit = g.value * (p.steps - p.steps.mean()) + rel.mean()  # the OLS line through the points
            ax.plot(p.steps, fit, color=style[p.name]["color"], alpha=0.45, linewidth=1, linestyle=(0, (4, 3)))
    label = f"increase in {METRIC_LABELS[metric]}\nsince the first tracked step"
    title = f"Relative growth and fitted rate g (95% CI): {METRIC_LABELS[metric]}"
    return finish(fig, ax, out_dir / f"relative_{metric}.png", label, title)


def heatmap(pair: PairData, out_dir: Path, metric: str = "wasserstein", rows: int = HEATMAP_ROWS) -> Path | None:
    """Per-layer metric over steps for the ``rows`` layers with the largest final value."""
    if not pair.layers or not len(pair.steps):
        return None
    values = pair.layer_values[metric]
    final = np.nan_to_num(values[:, -1], nan=-np.inf)
    order = np.argsort(-final, kind="stable")[:rows]
    shown = values[order]
    positive = shown[np.isfinite(shown) & (shown > 0)]
    if positive.size == 0:
        return None  # all zero (a deterministic control): nothing to colour
    fig, ax = subplots(figsize=(10, 0.26 * len(order) + 1.9))
    masked = np.ma.masked_where(~(np.isfinite(shown) & (shown > 0)), shown)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(
        masked,
        aspect="auto",
        interpolation="nearest",
        cmap=cmap,
        norm=LogNorm(vmin=positive.min(), vmax=positive.max()),
    )
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{pair.layers[i]}  [{pair.kinds[i]}]" for i in order], fontsize=7)
    ticks = np.arange(0, len(pair.steps), -(-len(pair.steps) // 10))  # at most 10 evenly spaced labels
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(pair.steps[i]) for i in ticks], fontsize=8)
    ax.set_xlabel("training step")
    fig.colorbar(image, ax=ax, label=METRIC_LABELS[metric], pad=0.01)
    ax.set_title(
        f"{short_label(pair)}: top {len(order)} layers by final {METRIC_LABELS[metric]} (grey: zero or NaN)",
        fontsize=10,
    )
    return save(fig, out_dir / f"heatmap_{file_stem(pair.name)}.png", DPI)


def losses(pair: PairData, out_dir: Path) -> Path | None:
    """Training loss of both arms, with the trainer's loss-spike flags marked."""
    if not len(pair.loss_steps) or not any(np.isfinite(pair.loss[arm]).any() for arm in "ab"):
        return None
    fig, ax = subplots(figsize=(8, 3.6))
    for arm, color in (("a", "#2ca02c"), ("b", "#9467bd")):
        ax.plot(pair.loss_steps, pair.loss[arm], color=color, linewidth=1, label=f"arm {arm}")
        flagged = pair.spikes[arm]
        if flagged.any():
            ax.plot(
                pair.loss_steps[flagged],
                pair.loss[arm][flagged],
                linestyle="none",
                marker="v",
                markersize=8,
                color="#d62728",
                markeredgecolor="black",
                label=f"spike flagged in arm {arm} ({flagged.sum()})",
            )
    title = f"{short_label(pair)}: loss of both arms"
    return finish(fig, ax, out_dir / f"loss_{file_stem(pair.name)}.png", "training loss", title)


def all_figures(analysis: Analysis, out_dir: Path) -> dict[str, Path]:
    """Every figure; keys name them for the HTML and wandb (``trajectory_wasserstein``, ``loss/<pair>``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path | None] = {}
    for metric in TRAJECTORY_METRICS:
        figures[f"trajectory_{metric}"] = trajectory(analysis, metric, out_dir)
        figures[f"relative_{metric}"] = relative_growth(analysis, metric, out_dir)
    figures.update(dose_figures(analysis, out_dir))
    figures[ROUTER_FIGURE] = router_figure(analysis, out_dir)  # MoE pairs only
    figures.update(coherence_figures(analysis, out_dir))
    for pair in shown_runs(analysis):
        figures[f"heatmap/{pair.name}"] = heatmap(pair, out_dir)
        figures[f"loss/{pair.name}"] = losses(pair, out_dir)
    figures.update(consequence_figures(analysis.consequence, out_dir))
    return {k: v for k, v in figures.items() if v is not None}


def consequence_figures(consequence: dict | None, out_dir: Path) -> dict[str, Path]:
    """The consequence curve's figures (the curve, the sample grids of both arms), copied from beside
    its ``consequence.json`` into the report's figures: what a prediction rests on, seen."""
    import shutil

    if not consequence or not consequence.get("source_file"):
        return {}
    folder, copied = Path(consequence["source_file"]).parent, {}
    for key, name in CONSEQUENCE_FIGURES.items():
        if (folder / name).is_file():
            copied[key] = Path(shutil.copyfile(folder / name, out_dir / name))
    return copied


def shown_runs(analysis: Analysis) -> list[PairData]:
    """One run per pair name (its lowest replicate) for the per-pair sections: layers and losses."""
    seen, out = set(), []
    for p in analysis.pairs:
        if p.name not in seen:
            seen.add(p.name)
            out.append(p)
    return out
