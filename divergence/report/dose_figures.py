"""The figures of the dose-ratio verdict, one function per figure (``docs/method.md``):

- log E(t) per replicate of every pair, the reference's saturated region shaded;
- log10(E_X / E_P)(t) per replicate, the window shaded and the pooled estimate with its interval;
- phi(t) of X and P per replicate with the 0.1 / 0.5 levels and t10 / t50;
- the outcome Delta per replicate against the seed margin (-m, m);
- the coherence panel of a pair under study: does its update error drift or wander? Left: C(T)
  against the measured steps, one line per replicate, with the curves an error reaches when it
  wanders (1), at the reading's two lines (``WANDER_SHARE``, ``DRIFT_SHARE`` of its energy
  coherent) and when it drifts entirely (sqrt(T)). Right: each layer's C(T) at the end (mean over
  replicates), largest first. None when the pair has no coherence records, or they say "not
  measurable".

Every function draws what is finite and skips the rest: a degenerate store (all zero, NaN,
one replicate, no interval) gives a figure with less on it, or None, never an error.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from divergence.analysis import Analysis
from divergence.analysis.coherence import DRIFT_SHARE, WANDER_SHARE, line
from divergence.analysis.dose import HALF_WAY, SATURATED_E, SATURATED_PHI
from divergence.analysis.outcome import LAST_FRACTION
from divergence.analysis.verdict import Verdict
from divergence.report.canvas import DPI, finish, save, subplots

COLORS = {
    "optimization": "#d62728",
    "precision": "#ff7f0e",
    "seed": "#1f77b4",
    "control": "#7f7f7f",
    "reordering": "#2ca02c",
}
TOP_LAYERS = 12  # the coherence panel's layers


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
    title = "Whole-model relative weight difference, every replicate"
    return finish(fig, ax, out_dir / "log_e.png", "E(t) = ||theta_a - theta_b|| / ||theta_b||", title, log=True)


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
    title = f"{v.study} against {v.reference}: the dose ratio over training"
    return finish(fig, ax, path, "log10(E_X / E_P)", title, fontsize=7, ncol=2)


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
    space = "probe F / F_S" if curves[0].space == "function" else "weight space E / E_S"
    return finish(fig, ax, path, f"phi ({space})", "Fraction of the way to a different-seed model", log=True)


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


def coherence_figures(analysis: Analysis, out_dir: Path) -> dict[str, Path | None]:
    """``coherence/<study>`` of every verdict whose pair recorded its coherence."""
    from divergence.recipe.names import file_stem

    return {
        f"coherence/{v.study}": coherence_panel(v.coherence, v.study, out_dir / f"coherence_{file_stem(v.study)}.png")
        for v in analysis.verdicts
    }


def coherence_panel(c: dict | None, name: str, path: Path) -> Path | None:
    if not c or "C" not in c:
        return None
    fig, (left, right) = subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    t = np.arange(1, max(r["steps"] for r in c["per_replicate"]) + 1)
    for share, label, style in (
        (1.0, "drifts entirely: sqrt(T)", ":"),
        (DRIFT_SHARE, "drift line", "--"),
        (WANDER_SHARE, "wander line", "--"),
        (0.0, "wanders: 1", ":"),
    ):
        left.plot(t, [line(int(x), share) for x in t], color="grey", linestyle=style, linewidth=1, label=label)
    for r in c["per_replicate"]:
        curve = [(n, v) for _, n, v in r["curve"] if v is not None and math.isfinite(v)]
        if curve:
            left.plot(*zip(*curve), color="#d62728", alpha=0.7, linewidth=1.2, marker=".")
    left.set_xlabel("measured steps T")
    left.set_ylabel("C(T) = |sum e_t| / sqrt(sum |e_t|^2)")
    interval = f" [{c['lo']:.2f}, {c['hi']:.2f}]" if c.get("lo") is not None else ""
    left.set_title(f"{name}: C = {c['C']:.2f}{interval}, {c['reading']}", fontsize=10)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    layers = sorted(((v, k) for k, v in c["layers"].items() if v is not None and math.isfinite(v)), reverse=True)
    layers = layers[:TOP_LAYERS]
    if layers:
        right.barh(range(len(layers)), [v for v, _ in layers], color="#d62728", alpha=0.7)
        right.set_yticks(range(len(layers)), [k for _, k in layers], fontsize=7)
        right.invert_yaxis()
        right.axvline(1.0, color="grey", linestyle=":")
        right.axvline(line(c["steps"], DRIFT_SHARE), color="grey", linestyle="--")
    right.set_xlabel("C(T) per layer (mean over replicates)")
    return save(fig, path, DPI)
