"""``consequence.png``: early dose against what it did to the finished model, every replicate a point.

Top left: the converged score shift (arm a minus arm b, the hit rate of ``score.attribute``, in
points) with its paired seed-bootstrap interval; top right: the sample distance (how far apart both
arms' pictures from the same noises are, ``metrics.sample_distance``) with its interval, a seed
change's dashed; bottom left: the converged probe-loss shift (relative). x: the early dose in dex
vs the precision pair (bf16-vs-fp32). The shift panels' grey band is the seed margin (+-m); on the
score's, dotted lines mark the rungs the threshold lies between, and a note counts the runs with
no early dose (not drawn). Ladder rungs are dots coloured by eps, rows and the precision reference
diamonds of a colour each, in one legend under the panels. Bottom right: the seed pair's arms over
training (``analysis.plateau``), their mean score and probe loss, each plateau step dotted and the
score's band (final +- the arms' spread) shaded.

``consequence-samples.png``: what the finished models draw, arm a beside arm b for one replicate of
the references, the lowest and highest ladder rungs and every row (the first ``SHOWN`` captions of
the score, its first sampling seed: both arms from the same noises), each titled with both scores.
"""

from __future__ import annotations

import math
from pathlib import Path

from divergence.report.canvas import DPI, save, subplots

# the two figures' files beside consequence.json (the report copies them into its figures)
FILES = {"consequence": "consequence.png", "consequence_samples": "consequence-samples.png"}
SHOWN = 18  # images an arm shows, in rows of COLUMNS
COLUMNS = 9


def consequence_figure(result: dict, path: Path) -> Path | None:
    """Draw ``result`` (``consequence.json``'s content) into ``path``; None when no run has an early dose."""
    runs = [r for r in result["runs"] if r["early_dex"] is not None]
    if not runs:
        return None
    fig, grid = subplots(2, 2, figsize=(12, 8))
    axes = [grid[0][0], grid[1][0], grid[1][1], grid[0][1]]  # score, probe, convergence, sample distance
    for ax, key, scale, label in (
        (axes[0], "score", 100.0, f"converged score shift, a - b (points, {result['score']['attribute']})"),
        (axes[1], "probe", 1.0, "converged probe-loss shift (l_a - l_b) / l_b"),
    ):
        _panel(ax, runs, key, scale, result["seed_margin"][key]["value"])
        ax.set_xlabel(f"early dose (dex vs {result['precision_reference']})")
        ax.set_ylabel(label)
    _distance(axes[3], runs, result.get("sample_distance"), result["precision_reference"])
    for edge in (result["threshold"].get("below_dex"), result["threshold"].get("above_dex")):
        if edge is not None:
            axes[0].axvline(edge, color="black", linestyle=":", linewidth=0.8)
    if len(runs) < len(result["runs"]):
        axes[0].text(
            0.99,
            0.02,
            f"{len(result['runs']) - len(runs)} run(s) with no early dose not drawn",
            transform=axes[0].transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
            color="0.3",
        )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=7, frameon=False)
    _convergence(axes[2], result.get("convergence"))
    fig.suptitle(_title(result), fontsize=9)
    bottom = 0.02 + 0.025 * math.ceil(len(labels) / 7)
    return save(fig, path, DPI, rect=(0, bottom, 1, 0.96))


def _distance(ax, runs: list[dict], distance: dict | None, reference: str) -> None:
    """Early dose against the sample distance D (log scale where every D > 0), a seed change's D_S dashed."""
    seed = (distance or {}).get("seed")
    _panel(ax, runs, "distance", 1.0, None, zero=False)
    if seed:
        line = ax.axhline(seed, color="0.3", linestyle="--", linewidth=0.9, label="a seed change's distance")
        ax.legend(handles=[line], loc="lower right", fontsize=7)
    values = [r["sample_distance"]["value"] for r in runs if r.get("sample_distance")]
    if values and min(values) > 0:
        ax.set_yscale("log")
    ax.set_xlabel(f"early dose (dex vs {reference})")
    ax.set_ylabel("sample distance, RMS pixel difference a vs b")


def _panel(ax, runs: list[dict], key: str, scale: float, margin, zero: bool = True) -> None:
    from matplotlib import colormaps

    if margin is not None and math.isfinite(margin):
        ax.axhspan(-margin * scale, margin * scale, color="0.85", label="seed margin")
    if zero:
        ax.axhline(0.0, color="0.5", linewidth=0.6)
    doses = sorted({r["eps"] for r in runs if r["role"] == "ladder"})
    cmap = colormaps["viridis"]
    others = list(dict.fromkeys(r["pair"] for r in runs if r["role"] != "ladder"))
    palette = colormaps["tab10"].colors  # a colour each (viridis is the ladder's)
    labelled = set()
    for r in runs:
        y, err = _y(r, key, scale)
        if y is None:
            continue
        if r["role"] == "ladder":
            colour = cmap(doses.index(r["eps"]) / max(1, len(doses) - 1))
            name, marker = f"eps {r['eps']:g}", "o"
        else:
            colour, name, marker = palette[(1 + others.index(r["pair"])) % len(palette)], r["pair"], "D"
        ax.errorbar(
            r["early_dex"],
            y,
            yerr=err,
            fmt=marker,
            color=colour,
            markersize=5,
            capsize=2,
            label=None if name in labelled else name,
        )
        labelled.add(name)


def _convergence(ax, converged: dict | None) -> None:
    """The seed pair's arms over training: mean score (left axis) and probe loss (right), each with its
    plateau step dotted."""
    ax.set_title("the seed pair's arms over training (mean over arms)", fontsize=8)
    ax.set_xlabel("step")
    if not converged:
        return
    right = ax.twinx()
    for axis, key, scale, colour, label in (
        (ax, "score", 100.0, "tab:blue", "score (%)"),
        (right, "probe", 1.0, "tab:red", "probe loss"),
    ):
        p = converged[key]
        if p["mean"]:
            axis.plot(p["steps"], [v * scale for v in p["mean"]], color=colour, marker="." if key == "score" else None)
        if p["plateau_step"] is not None:
            axis.axvline(p["plateau_step"], color=colour, linestyle=":", linewidth=0.9)
        if key == "score" and p.get("final") is not None and p.get("spread") is not None:
            low, high = (p["final"] - p["spread"]) * scale, (p["final"] + p["spread"]) * scale
            axis.axhspan(low, high, color=colour, alpha=0.12, linewidth=0)
        axis.set_ylabel(label, color=colour)


def _y(run: dict, key: str, scale: float):
    if key == "probe":
        value = run["probe_shift"]
        return (value * scale, None) if value is not None else (None, None)
    shift = run.get("sample_distance" if key == "distance" else "score_shift")
    if not shift or shift["value"] is None:
        return None, None
    v = shift["value"] * scale
    return v, [[v - shift["lo"] * scale], [shift["hi"] * scale - v]]


def _title(result: dict) -> str:
    said = [f"{result['recipe']}, {result['steps']} steps: Spearman rho of early dose with |score shift| "]
    said.append(_rho_text(result["spearman"]["score"]))
    if result["spearman"].get("distance"):
        said.append(", with sample distance " + _rho_text(result["spearman"]["distance"]))
    return "".join(said)


def _rho_text(c: dict) -> str:
    rho = "n/a" if c["rho"] is None else f"{c['rho']:+.2f}"
    return rho + ("" if c.get("lo") is None else f" [{c['lo']:+.2f}, {c['hi']:+.2f}]")


def samples_figure(panels: list[dict], path: Path) -> Path | None:
    """Draw ``panels`` (each ``{"title", "a", "b"}``, ``a`` and ``b`` (N, H, W, 3) uint8 images of
    the same captions and noises) as one row each, arm a left, arm b right; None without panels."""
    from divergence.models.sampling import image_grid

    if not panels:
        return None
    fig, axes = subplots(len(panels), 2, figsize=(9, 1.25 * len(panels) + 0.4), squeeze=False)
    for row, panel in zip(axes, panels):
        for ax, arm in zip(row, ("a", "b")):
            shown = panel[arm][:SHOWN]
            ax.imshow(image_grid(shown, min(COLUMNS, len(shown))), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{panel['title']}: arm {arm}, {panel['score_' + arm]}", fontsize=7)
    fig.suptitle("what the finished models draw (first sampling seed, same noises for both arms)", fontsize=9)
    return save(fig, path, DPI, rect=(0, 0, 1, 0.97))
