"""The coherence panel of a pair under study: does its update error drift or wander? (docs/method.md)

Left: C(T) against the measured steps, one line per replicate, with the curves an error reaches
when it wanders (1), at the reading's two lines (``WANDER_SHARE``, ``DRIFT_SHARE`` of its energy
coherent) and when it drifts entirely (sqrt(T)). Right: each layer's C(T) at the end (mean over
replicates), largest first. None when the pair has no coherence records, or they say "not measurable".
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from divergence.analysis import Analysis
from divergence.analysis.coherence import DRIFT_SHARE, WANDER_SHARE, line
from divergence.report.canvas import DPI, save, subplots

TOP_LAYERS = 12


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
