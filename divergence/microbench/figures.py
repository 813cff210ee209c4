"""The paper's Figures 3-6 as PNG files, one function per figure, Figure 7 (input scale) and
Figure 8 (the bias of the error, forward and backward).

Each function takes the sweep's rows and the recipe, writes one PNG into ``out_dir`` and returns
its path (None when the sweep has no data for it). Deviations span many decades across number
formats, so every y-axis is logarithmic; a zero (the fp64 baseline against itself) cannot be
drawn on it and is left out.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from divergence.microbench import bias, scale_findings
from divergence.microbench.select import (
    MANTISSA_BITS,
    kernels,
    one,
    precisions,
    reference_flash,
    reference_rows,
    where,
)

COLORS = {"bf16": "#d62728", "fp16": "#ff7f0e", "fp32": "#2ca02c", "fp64": "#1f77b4"}
ACC_LABEL = {"none": "flash (all in format)", "fp32": "flash (fp32 accumulate)"}


def _subplots(*grid, figsize, **kwargs):
    """``pyplot.subplots`` without pyplot: no global backend is chosen or switched."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def _positive(value) -> float:
    return value if isinstance(value, (int, float)) and value > 0 else float("nan")


def _log_y(ax) -> None:
    """Log y-axis when the panel has a positive value to show; otherwise say it is empty."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    ys += [p.get_height() for p in ax.patches]
    if any(y == y and 0 < y < float("inf") for y in ys):
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no nonzero values in this sweep", transform=ax.transAxes, ha="center", color="gray")


def _finish(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _bars(ax, names, series: dict, metric: str) -> None:
    """Grouped bars: one group per format, one bar per series (a missing or zero value: no bar)."""
    width = 0.8 / max(1, len(series))
    for i, (label, rs) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [_positive(r[metric]) if r else float("nan") for r in rs], width, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{p}\n({MANTISSA_BITS[p]} bits)" for p in names])


def _by_format(rows, recipe, names, seq) -> dict:
    """Each format's row (None: not run) of every flash mode (reference tile), then of every real kernel."""
    series = {
        ACC_LABEL[a]: [reference_flash(rows, recipe, precision=p, seq_len=seq, accumulate=a) for p in names]
        for a in recipe.sweep.accumulate
    }
    return series | {k: [one(rows, impl=k, precision=p, seq_len=seq) for p in names] for k in kernels(recipe)}


def fig3_formats(rows, recipe, out_dir: Path) -> Path | None:
    """Fig. 3: max |impl - baseline| in each number format, at the reference length and tile."""
    names, seq = precisions(recipe), recipe.sweep.reference_seq_len
    series = _by_format(rows, recipe, names, seq)
    if not any(r for rs in series.values() for r in rs):
        return None
    fig, ax = _subplots(figsize=(8, 4.5))
    _bars(ax, names, series, "max_abs_diff_vs_baseline")
    _log_y(ax)
    ax.set_ylabel("max |output − baseline| (same format)")
    ax.set_title(f"Fig. 3 — deviation from baseline by number format (seq {seq}; zero: no bar)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, out_dir / "fig3_formats.png")


def fig4_golden(rows, recipe, out_dir: Path) -> Path | None:
    """Fig. 4: baseline and flash against the fp64 golden value, side by side, max and mean."""
    names, seq = precisions(recipe), recipe.sweep.reference_seq_len
    bars = {"baseline": [one(rows, impl="baseline", precision=p, seq_len=seq) for p in names]}
    bars |= _by_format(rows, recipe, names, seq)
    fig, axes = _subplots(1, 2, figsize=(12, 4.5))
    for ax, metric in zip(axes, ("max_abs_err", "mean_abs_err")):
        _bars(ax, names, bars, metric)
        _log_y(ax)
        ax.set_ylabel(f"{metric.replace('_', ' ')} vs fp64 golden")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_title(f"Fig. 4 — error against the fp64 golden value (seq {seq}): max")
    axes[1].set_title("mean (fp64 baseline is the golden: no bar)")
    axes[0].legend(fontsize=8)
    return _finish(fig, out_dir / "fig4_golden.png")


def fig5_seq_len(rows, recipe, out_dir: Path) -> Path | None:
    """Fig. 5: flash against baseline over sequence length, per format: max |flash - baseline|,
    mean (solid) and std (dotted) of it, and flash's error over baseline's (both vs golden)."""
    seqs = sorted(recipe.sweep.seq_lens)
    if "flash" not in recipe.sweep.impls:
        return None
    fig, axes = _subplots(1, 3, figsize=(15, 4.6))
    for p in precisions(recipe):
        for acc in recipe.sweep.accumulate:
            rs = [reference_flash(rows, recipe, precision=p, seq_len=s, accumulate=acc) for s in seqs]
            if not any(rs):
                continue
            style = {"color": COLORS[p], "marker": "o", "linestyle": "-" if acc == "none" else "--"}
            label = p + ("" if acc == "none" else " fp32 acc")
            col = lambda key, rs=rs: [_positive(r[key]) if r else float("nan") for r in rs]  # noqa: E731
            axes[0].plot(seqs, col("max_abs_diff_vs_baseline"), label=label, **style)
            axes[1].plot(seqs, col("mean_abs_diff_vs_baseline"), label=label, **style)
            if acc == "none":
                axes[1].plot(seqs, col("std_abs_diff_vs_baseline"), color=COLORS[p], linestyle=":", marker=".")
            bases = [one(rows, impl="baseline", precision=p, seq_len=s) for s in seqs]
            axes[2].plot(
                seqs,
                [
                    _positive(r["max_abs_err"] / b["max_abs_err"]) if r and b and b["max_abs_err"] else float("nan")
                    for r, b in zip(rs, bases)
                ],
                label=label,
                **style,
            )
    titles = (
        "max |flash − baseline|",
        "mean (solid) and std (dotted) of |flash − baseline|",
        "flash max error / baseline max error (vs golden)",
    )
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        _log_y(ax)
        ax.set_xlabel("sequence length")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[2].axhline(1.0, color="gray", linewidth=0.8)
    br, bc = recipe.tiles.reference_tile(recipe.inputs.head_dim)
    axes[0].set_ylabel(f"deviation (tile {br}x{bc}, fixed)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Fig. 5 — deviation against sequence length (more key/value tiles, more rescaling steps)")
    return _finish(fig, out_dir / "fig5_seq_len.png")


def fig6_tiles(rows, recipe, out_dir: Path) -> Path | None:
    """Fig. 6: block order (default, swapped, square) and block area, at each format."""
    seq, names = recipe.sweep.reference_seq_len, precisions(recipe)
    tiles = where(rows, impl="flash", seq_len=seq)
    if not tiles:
        return None
    fig, axes = _subplots(1, 2, figsize=(13, 4.8))
    _order_panel(axes[0], tiles, recipe, names)
    _area_panel(axes[1], tiles, recipe, names)
    fig.suptitle(f"Fig. 6 — tile shape and size (seq {seq}; max |flash − baseline|)")
    return _finish(fig, out_dir / "fig6_tiles.png")


def _order_panel(ax, tiles, recipe, names):
    br, bc = recipe.tiles.reference_tile(recipe.inputs.head_dim)
    shapes = {"default": (br, bc), "swapped": (bc, br), "square": (bc, bc)}
    series = {
        f"{order} ({q}x{kv})": [
            one(tiles, precision=p, accumulate="none", block_order=order, block_q=q, block_kv=kv) for p in names
        ]
        for order, (q, kv) in shapes.items()
        if order in recipe.tiles.orders
    }
    _bars(ax, names, series, "max_abs_diff_vs_baseline")
    _log_y(ax)
    ax.set_ylabel("max |flash − baseline|")
    ax.set_title("block order (Br x Bc)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def _area_panel(ax, tiles, recipe, names):
    for p in names:
        for acc in recipe.sweep.accumulate:
            rs = sorted(where(tiles, precision=p, accumulate=acc, block_order="default"), key=lambda r: r["block_area"])
            if not rs:
                continue
            ax.plot(
                [r["block_area"] for r in rs],
                [_positive(r["max_abs_diff_vs_baseline"]) for r in rs],
                marker="o",
                color=COLORS[p],
                linestyle="-" if acc == "none" else "--",
                label=p + ("" if acc == "none" else " fp32 acc"),
            )
            for r in rs if p == names[0] and acc == "none" else ():
                ax.annotate(
                    f"{r['block_q']}x{r['block_kv']}",
                    (r["block_area"], _positive(r["max_abs_diff_vs_baseline"])),
                    textcoords="offset points",
                    xytext=(0, 6),
                    fontsize=7,
                    ha="center",
                )
    ax.set_xscale("log", base=2)
    _log_y(ax)
    ax.set_xlabel("block area Br·Bc (default order)")
    ax.set_title("block area")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def fig7_input_scale(rows, recipe, out_dir: Path) -> Path | None:
    """Fig. 7: flash's error over baseline's (max and mean |err| vs golden) against the input
    distribution, at the longest length of the scale study; solid all-low, dashed fp32-acc."""
    dists = sorted(scale_findings.scale_dists(recipe), key=lambda d: d.std)
    lengths = recipe.sweep.scale_lengths()
    if len(dists) < 2 or not lengths:
        return None
    seq = lengths[-1]
    fig, axes = _subplots(1, 2, figsize=(13, 4.6))
    drawn = False
    for p, acc in scale_findings.columns(recipe):
        cells = [scale_findings.cell(rows, recipe, d.spec, seq, p, acc) for d in dists]
        if not any(cells):
            continue
        drawn = True
        style = {"color": COLORS[p], "marker": "o", "linestyle": "-" if acc == "none" else "--"}
        label = f"{p} {scale_findings.MODE[acc]}"
        for ax, i in zip(axes, (0, 1)):
            ax.plot(range(len(dists)), [_positive(c[i]) if c else float("nan") for c in cells], label=label, **style)
    if not drawn:
        return None
    for ax, stat in zip(axes, ("max", "mean")):
        ax.set_xticks(range(len(dists)))
        ax.set_xticklabels([f"{d.label}\n(std {d.std:.3g})" for d in dists])
        _log_y(ax)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_ylabel(f"flash / baseline ({stat} |err| vs fp64)")
        ax.set_title(f"{stat} |err| ratio", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Fig. 7 — flash/baseline error ratio against input scale (seq {seq}; sorted by input std)")
    return _finish(fig, out_dir / "fig7_input_scale.png")


def fig8_bias(rows, recipe, out_dir: Path) -> Path | None:
    """Fig. 8: the relative bias |mean e| / rms e of the output and of dQ, dK, dV, per (input,
    format), one bar per implementation; a bar with |z| >= 3 solid, one below faded."""
    groups = [
        (d, p, bias.length(rows, recipe, d.spec)) for d in bias.dists(recipe) for p in precisions(recipe) if p != "fp64"
    ]
    groups = [(d, p, seq) for d, p, seq in groups if seq is not None and bias.impl_rows(rows, recipe, d.spec, seq, p)]
    if not groups:
        return None
    labels = list(dict.fromkeys(lab for d, p, seq in groups for lab, _ in bias.impl_rows(rows, recipe, d.spec, seq, p)))
    palette = ["#7f7f7f", "#d62728", "#ff9896", "#1f77b4", "#aec7e8", "#2ca02c", "#98df8a"]
    fig, axes = _subplots(
        len(bias.QUANTITIES), 1, figsize=(max(8, 1.3 * len(groups) * len(labels) / 3), 2.75 * len(bias.QUANTITIES))
    )
    width = 0.8 / len(labels)
    for ax, (prefix, name) in zip(axes, bias.QUANTITIES):
        named = set()
        for i, label in enumerate(labels):
            for j, (d, p, seq) in enumerate(groups):
                found = dict(bias.impl_rows(rows, recipe, d.spec, seq, p))
                if label not in found:
                    continue
                rb, z = bias._get(found[label], f"{prefix}rel_bias"), bias._get(found[label], f"{prefix}bias_z")
                x = j + (i - (len(labels) - 1) / 2) * width
                alpha = 1.0 if abs(z) >= bias.BIASED_Z else 0.35
                ax.bar(
                    x, rb, width, color=palette[i % len(palette)], alpha=alpha, label=None if label in named else label
                )
                named.add(label)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{d.label}\n{p}, seq {seq}" for d, p, seq in groups], fontsize=8)
        ax.set_ylabel(f"{name}: |mean| / rms")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, ncol=min(4, len(labels)))
    fig.suptitle("Fig. 8 — relative bias of the error vs fp64 golden (solid: |z| >= 3; faded: below)")
    return _finish(fig, out_dir / "fig8_bias.png")


FIGURES = (fig3_formats, fig4_golden, fig5_seq_len, fig6_tiles)


def write_figures(rows, recipe, out_dir: Path) -> list[Path]:
    """Every figure the sweep has data for: Figs. 3-6 on the reference inputs, Fig. 7 on all."""
    ref = reference_rows(rows, recipe)
    paths = [f(ref, recipe, Path(out_dir)) for f in FIGURES]
    paths += [fig7_input_scale(rows, recipe, Path(out_dir)), fig8_bias(rows, recipe, Path(out_dir))]
    return [p for p in paths if p is not None]
