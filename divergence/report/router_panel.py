"""The router panel of an MoE study: flip fraction over steps beside E(t), and its sentence.

For the pairs whose store holds the router's record (``router_flip`` at the probed steps,
``divergence.metrics.router``), the panel draws, per replicate,

    left:  E(t) = ||theta_a - theta_b|| / ||theta_b||   (log scale, the dose ratio's E)
    right: flip(t) = #{(token, slot) : expert_a != expert_b} / #(token, slot)  on the probe set

so a reader sees whether the arms part through the router (flip rising with E, or ahead of it)
or only through the experts' and attention's numbers (flip 0 while E grows). The sentence gives
each pair's flip fraction at its last probed step (median over replicates) and each arm's
capacity drops in training at the first and the last probed step that recorded them (medians
over replicates). A drop fraction is one training batch's, and it falls as the balance loss
evens the load (tiny MoE, 30 steps: 14-19% of the choices at step 10, 0-2% at step 30), so a
mean over the probed steps, or the last step alone (0.0 in one replicate there), would misstate it.
A study without MoE pairs has neither (``router_figure`` returns None, ``router_text`` an empty list).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from divergence.analysis import Analysis, PairData
from divergence.report.canvas import DPI, save, subplots
from divergence.report.dose_figures import COLORS

LINTHRESH = 1e-5  # the flip axis is linear below this (under one choice in 10^5), logarithmic above
FIGURE = "router_flip"  # the figure's key (report figures, wandb) and file stem
CAPTION = (
    "MoE pairs: left, E(t) per replicate (log scale); right, the fraction of the probe's (token, slot) "
    "choices whose expert differs between the two arms, at the probed steps (0: the routers agree)."
)


def router_pairs(analysis: Analysis) -> list[PairData]:
    """The pair runs with the router's record (MoE pairs), in the analysis's order."""
    return [p for p in analysis.pairs if p.has_router()]


def router_figure(analysis: Analysis, out_dir: Path) -> Path | None:
    """The two panels side by side (shared step axis); None without MoE pairs."""
    pairs = router_pairs(analysis)
    if not pairs:
        return None
    fig, (left, right) = subplots(1, 2, figsize=(11, 4.2), sharex=True)
    labelled: set[str] = set()
    for p in pairs:
        color = COLORS.get(p.category, "black")
        label = None if p.name in labelled else p.name
        labelled.add(p.name)
        positive = p.rel_l2 > 0
        left.plot(p.steps[positive], p.rel_l2[positive], color=color, linewidth=1, alpha=0.8, label=label)
        flips = p.router["router_flip"]
        probed = np.isfinite(flips)
        right.plot(p.steps[probed], flips[probed], color=color, marker="o", markersize=3, linewidth=1, label=label)
    left.set_yscale("log")
    left.set_ylabel("E(t), relative weight difference")
    right.set_yscale("symlog", linthresh=LINTHRESH)  # flips of 1e-4 beside a seed pair's 0.5; 0 drawn
    right.set_ylabel("router flip fraction (symlog)")
    right.set_ylim(bottom=0)
    for ax, title in ((left, "E(t)"), (right, "expert choices that differ between the arms")):
        ax.set_xlabel("training step")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    right.legend(fontsize=8)
    return save(fig, out_dir / f"{FIGURE}.png", DPI)


def router_text(analysis: Analysis) -> list[str]:
    """One sentence per MoE pair: its flip fraction at the last probed step and each arm's drops at
    the first and the last; [] without MoE."""
    by_name: dict[str, list[PairData]] = {}
    for p in router_pairs(analysis):
        by_name.setdefault(p.name, []).append(p)
    if not by_name:
        return []
    lines = [
        "Router (MoE pairs): the share of the probe's (token, slot) choices that arm a sends to another "
        "expert than arm b, at the last probed step (median over replicates; per replicate in brackets)."
    ]
    for name, runs in by_name.items():
        finals = [_last(p, "router_flip") for p in runs]
        line = f"{name}: {_pct(statistics.median(finals))} of choices flipped ({', '.join(map(_pct, finals))})"
        lines.append(line + _drops_text(runs) + ".")
    return lines


def _drops_text(runs: list[PairData]) -> str:
    """``; the capacity limit dropped 17% of arm a's choices in the training batch of step 10 and
    1% in that of step 30, arm b's ...``: each arm's drop fraction at the first and the last probed
    step recording it (medians over replicates); empty where an arm has none."""
    ends = {arm: _ends(runs, f"router_drop_{arm}") for arm in "ab"}
    if None in ends.values():
        return ""
    (first, last), a0, a1 = ends["a"]
    _, b0, b1 = ends["b"]
    if first == last:
        return (
            f"; the capacity limit dropped {_pct(a0)} of arm a's choices and {_pct(b0)} of arm b's in the "
            f"training batch of step {last} (medians over replicates)"
        )
    return (
        f"; the capacity limit dropped {_pct(a0)} of arm a's choices in the training batch of step {first} and "
        f"{_pct(a1)} in that of step {last}, arm b's {_pct(b0)} and {_pct(b1)} (medians over replicates)"
    )


def _ends(runs: list[PairData], key: str) -> tuple[tuple[int, int], float, float] | None:
    """``((first step, last step), median at the first, median at the last)`` of ``key`` over the
    steps where any replicate recorded it; None where none did."""
    at: dict[int, list[float]] = {}
    for p in runs:
        values = p.router.get(key)
        for step, value in zip(p.steps, values if values is not None else []):
            if np.isfinite(value):
                at.setdefault(int(step), []).append(float(value))
    if not at:
        return None
    first, last = min(at), max(at)
    return (first, last), statistics.median(at[first]), statistics.median(at[last])


def _last(pair: PairData, key: str) -> float | None:
    """``key``'s value at the pair's last probed step (where ``router_flip`` is finite); None if absent."""
    values = pair.router.get(key)
    probed = np.flatnonzero(np.isfinite(pair.router["router_flip"]))
    if values is None or not len(probed) or not np.isfinite(values[probed[-1]]):
        return None
    return float(values[probed[-1]])


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"
