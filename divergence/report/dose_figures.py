"""The figures of the dose-ratio verdict, one function per figure (``docs/method.md``):

- log E(t) per replicate of every pair, the reference's saturated region shaded;
- log10(E_X / E_P)(t) per replicate, the window shaded and the pooled estimate with its interval;
- phi(t) of X and P per replicate with the 0.1 / 0.5 levels and t10 / t50;
- the outcome Delta per replicate against the seed margin (-m, m).

Every function draws what is finite and skips the rest: a degenerate store (all zero, NaN,
one replicate, no interval) gives a figure with less on it, or None, never an error.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from divergence.analysis import Analysis
from divergence.analysis.dose import HALF_WAY, SATURATED_E, SATURATED_PHI
from divergence.analysis.outcome import LAST_FRACTION
from divergence.analysis.verdict import Verdict
from divergence.report.canvas import DPI, save, subplots

COLORS = {
    "optimization": "#d62728",
    "precision": "#ff7f0e",
    "seed": "#1f77b4",
    "control": "#7f7f7f",
    "reordering": "#2ca02c",
}


def dose_figures(analysis: Analysis, out_dir: Path) -> dict[str, Path | None]:
    """Every dose-ratio figure, keyed for the HTML and wandb (``log_e``, ``dose_ratio/<study>``, ...)."""
    from divergence.recipe.names import file_stem

    figures: dict[str, Path | None] = {"log_e": log_e(analysis, out_dir)}
    for v in analysis.verdicts:
        stem = file_stem(v.study)
        figures[f"dose_ratio/{v.study}"] = dose_ratio(v, out_dir / f"dose_ratio_{stem}.png")
        figures[f"phi/{v.study}"] = phi(v, out_dir / f"phi_{stem}.png")
        figures[f"outcome/{v.study}"] = outcome(v, out_dir / f"outcome_{stem}.png")
    return figures


def log_e(analysis: Analysis, out_dir: Path) -> Path | None:
    """E(t) of every run on a log scale (replicates as thin lines); shaded: the reference saturated."""
    runs = [p for p in analysis.pairs if len(p.steps) and np.any(np.isfinite(p.rel_l2) & (p.rel_l2 > 0))]
    if not runs:
        return None
    fig, ax = subplots(figsize=(8, 4.6))
    labelled = set()
    for p in runs:
        ok = np.isfinite(p.rel_l2) & (p.rel_l2 > 0)
        label = None if p.name in labelled else f"{p.label} [{p.category}]"
        labelled.add(p.name)
        ax.plot(p.steps[ok], p.rel_l2[ok], color=COLORS.get(p.category, "black"), linewidth=1, alpha=0.8, label=label)
    starts = [e.saturated_at for v in analysis.verdicts for e in v.dose.estimates if e.saturated_at is not None]
    if starts:
        ax.axvspan(
            min(starts),
            max(int(p.steps[-1]) for p in runs),
            color="#999999",
            alpha=0.15,
            label=f"saturated (E >= {SATURATED_E:g} E_seed)",
        )
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("E(t) = ||theta_a - theta_b|| / ||theta_b||")
    ax.set_title("Whole-model relative weight difference, every replicate")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out_dir / "log_e.png", DPI)


def dose_ratio(v: Verdict, path: Path) -> Path | None:
    """log10(E_X / E_P)(t) per replicate; bold: the window; band: the pooled estimate and its interval."""
    dose = v.dose
    curves = [e for e in dose.estimates if np.isfinite(e.log_ratio).any()]
    if not curves:
        return None
    fig, ax = subplots(figsize=(8, 4.2))
    for e in curves:
        ok = np.isfinite(e.log_ratio)
        (line,) = ax.plot(e.steps[ok], e.log_ratio[ok], linewidth=0.8, alpha=0.5, label=f"replicate {e.replicate}")
        inside = ok & e.in_window
        ax.plot(e.steps[inside], e.log_ratio[inside], linewidth=2, color=line.get_color())
    if dose.window:
        first, last = dose.window
        ax.axvspan(first, last, color="#2ca02c", alpha=0.08, label=f"window {first}-{last}")
    if math.isfinite(dose.ratio.mean):
        ax.axhline(dose.ratio.mean, color="black", linewidth=1.2, label=f"estimate {dose.ratio.mean:+.2f}")
        if dose.ratio.interval:
            ax.axhspan(dose.ratio.lo, dose.ratio.hi, color="black", alpha=0.1, label="95% t interval")
    ax.axhline(0, color="#ff7f0e", linewidth=0.8, linestyle="--", label="as much as the reference")
    ax.set_xlabel("training step")
    ax.set_ylabel("log10(E_X / E_P)")
    ax.set_title(f"{v.study} against {v.reference}: the dose ratio over training")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path, DPI)


def phi(v: Verdict, path: Path) -> Path | None:
    """phi(t) = F / F_S of X (red) and P (orange) per replicate, with t10 and t50 marked."""
    curves = [e for e in v.dose.estimates if any(np.isfinite(e.phi.get(k, [])).any() for k in ("study", "reference"))]
    if not curves:
        return None
    fig, ax = subplots(figsize=(8, 4.2))
    for role, color in (("study", COLORS["optimization"]), ("reference", COLORS["precision"])):
        for i, e in enumerate(curves):
            values = np.asarray(e.phi.get(role, []), dtype=float)
            ok = np.isfinite(values) & (values > 0)
            ax.plot(
                e.steps[ok],
                values[ok],
                color=color,
                linewidth=1,
                alpha=0.7,
                label=(v.study if role == "study" else v.reference) if i == 0 else None,
            )
            for _level, which, style in ((SATURATED_PHI, e.t10, ":"), (HALF_WAY, e.t50, "--")):
                if which.get(role) is not None:
                    ax.axvline(which[role], color=color, linestyle=style, linewidth=0.8, alpha=0.6)
    for level, name in ((SATURATED_PHI, f"{SATURATED_PHI:g} (t10)"), (HALF_WAY, f"{HALF_WAY:g} (t50)")):
        ax.axhline(level, color="black", linewidth=0.6, linestyle=":" if level == SATURATED_PHI else "--", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    space = "probe F / F_S" if curves[0].space == "function" else "weight space E / E_S"
    ax.set_ylabel(f"phi ({space})")
    ax.set_title("Fraction of the way to a different-seed model")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path, DPI)


def outcome(v: Verdict, path: Path) -> Path | None:
    """Delta per replicate of X (and of the seed pair) against the margin (-m, m)."""
    result = v.outcome
    ours = {r: d for r, d in result.per_replicate.items() if math.isfinite(d)}
    seeds = {r: d for r, d in result.seed_per_replicate.items() if math.isfinite(d)}
    if not ours and not seeds:
        return None
    fig, ax = subplots(figsize=(8, 2.8))
    if math.isfinite(result.margin) and result.margin > 0:
        m = result.margin
        ax.axvspan(-m, m, color="#2ca02c", alpha=0.12, label=f"seed margin +/-{m:.2g}")
    ax.plot(list(ours.values()), [1] * len(ours), "o", color=COLORS["optimization"], label=f"{v.study} per replicate")
    ax.plot(list(seeds.values()), [0] * len(seeds), "o", color=COLORS["seed"], label="seed pair per replicate")
    if math.isfinite(result.delta.mean):
        ax.plot([result.delta.mean], [1.25], "D", color="black", label="mean (95% t interval)")
        if result.delta.interval:
            ax.plot([result.delta.lo, result.delta.hi], [1.25, 1.25], color="black")
    ax.axvline(0, color="black", linewidth=0.5)
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["seed", v.study])
    ax.set_ylim(-0.5, 1.6)
    where = "probe loss" if result.source == "probe" else "training loss"
    ax.set_xlabel(f"Delta = (l_a - l_b) / l_b, {where}, last {LAST_FRACTION:.0%} of steps")
    ax.set_title("Outcome: where training ends up, against seed-to-seed spread")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return save(fig, path, DPI)
