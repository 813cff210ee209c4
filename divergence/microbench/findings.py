"""The findings table: how many times more flash deviates than baseline, and what moves it.

Pure functions of the sweep's rows; ``report`` renders them as Markdown and HTML.
"""

from __future__ import annotations

import math

from divergence.microbench.select import kernels, one, precisions, ratio, reference_flash, where


def format_table(rows, recipe) -> tuple[list[str], list[list]]:
    """By number format at the reference length: errors vs golden and the flash/baseline ratio."""
    seq = recipe.sweep.reference_seq_len
    head = ["precision", "baseline max err", "flash max err", "flash / baseline (max)", "flash / baseline (mean)"]
    accs = [a for a in recipe.sweep.accumulate if a != "none"]
    head += [f"flash {a}-acc / baseline (max)" for a in accs]
    head += [f"{k} / baseline (max)" for k in kernels(recipe)]
    body = []
    for p in precisions(recipe):
        base = one(rows, impl="baseline", precision=p, seq_len=seq)
        flash = reference_flash(rows, recipe, precision=p, seq_len=seq)
        if not base or not flash:
            continue
        line = [
            p,
            base["max_abs_err"],
            flash["max_abs_err"],
            ratio(flash["max_abs_err"], base["max_abs_err"]),
            ratio(flash["mean_abs_err"], base["mean_abs_err"]),
        ]
        others = [reference_flash(rows, recipe, precision=p, seq_len=seq, accumulate=a) for a in accs]
        others += [one(rows, impl=k, precision=p, seq_len=seq) for k in kernels(recipe)]
        line += [ratio(r["max_abs_err"], base["max_abs_err"]) if r else float("nan") for r in others]
        body.append(line)
    return head, body


def length_table(rows, recipe) -> tuple[list[str], list[list]]:
    """By sequence length, per format: the flash/baseline error ratio and max |flash - baseline|."""
    head = ["seq len", "rescalings"]
    names = [p for p in precisions(recipe) if p != "fp64"] or precisions(recipe)
    head += [f"{p} flash/baseline (max)" for p in names] + [f"{p} max |flash − baseline|" for p in names]
    body = []
    for seq in sorted(recipe.sweep.seq_lens):
        flashes = [reference_flash(rows, recipe, precision=p, seq_len=seq) for p in names]
        bases = [one(rows, impl="baseline", precision=p, seq_len=seq) for p in names]
        if not all(flashes) or not all(bases):
            continue
        line = [seq, flashes[0]["rescalings"]]
        line += [ratio(f["max_abs_err"], b["max_abs_err"]) for f, b in zip(flashes, bases)]
        line += [f["max_abs_diff_vs_baseline"] for f in flashes]
        body.append(line)
    return head, body


def headlines(rows, recipe) -> list[str]:
    """One sentence per finding, numbers included."""
    seq, out = recipe.sweep.reference_seq_len, []
    for p in precisions(recipe):
        base = one(rows, impl="baseline", precision=p, seq_len=seq)
        flash = reference_flash(rows, recipe, precision=p, seq_len=seq)
        if base and flash and base["max_abs_err"] > 0:
            out.append(
                f"At {p}, seq {seq}, flash deviates {_x(flash['max_abs_err'], base['max_abs_err'])} "
                f"as much as baseline from the fp64 golden value (max abs error; mean "
                f"{_x(flash['mean_abs_err'], base['mean_abs_err'])})."
            )
    out += _length_lines(rows, recipe) + _tile_lines(rows, recipe)
    return out


def _length_lines(rows, recipe) -> list[str]:
    seqs = sorted(recipe.sweep.seq_lens)
    if len(seqs) < 2:
        return []
    out = []
    for p in precisions(recipe):
        lo, hi = (reference_flash(rows, recipe, precision=p, seq_len=s) for s in (seqs[0], seqs[-1]))
        blo, bhi = (one(rows, impl="baseline", precision=p, seq_len=s) for s in (seqs[0], seqs[-1]))
        if not (lo and hi and blo and bhi) or not blo["max_abs_err"] or not bhi["max_abs_err"]:
            continue
        out.append(
            f"At {p}, flash's max error over baseline's goes from {_x(lo['max_abs_err'], blo['max_abs_err'])} "
            f"at seq {seqs[0]} to {_x(hi['max_abs_err'], bhi['max_abs_err'])} at seq {seqs[-1]} "
            f"({hi['rescalings']} rescalings); the absolute max |flash − baseline| changes "
            f"{_x(hi['max_abs_diff_vs_baseline'], lo['max_abs_diff_vs_baseline'])} while the output scale max |golden| "
            f"changes {_x(hi['max_abs_err'] / hi['max_rel_err'], lo['max_abs_err'] / lo['max_rel_err'])}."
        )
    return out


def _tile_lines(rows, recipe) -> list[str]:
    seq, out = recipe.sweep.reference_seq_len, []
    br, bc = recipe.tiles.reference_tile(recipe.inputs.head_dim)
    p = precisions(recipe)[0]
    default = reference_flash(rows, recipe, precision=p, seq_len=seq)
    for order, tile in (("swapped", (bc, br)), ("square", (bc, bc))):
        if tile == (br, bc):
            continue  # a square reference tile: the order changes nothing by construction
        r = one(
            rows,
            impl="flash",
            precision=p,
            seq_len=seq,
            accumulate="none",
            block_order=order,
            block_q=tile[0],
            block_kv=tile[1],
        )
        if r and default and default["max_abs_diff_vs_baseline"] > 0:
            out.append(
                f"At {p}, {order} tiles ({tile[0]}x{tile[1]} instead of {br}x{bc}) change max |flash − baseline| "
                f"{_x(r['max_abs_diff_vs_baseline'], default['max_abs_diff_vs_baseline'])}."
            )
    area = sorted(
        where(rows, impl="flash", precision=p, seq_len=seq, accumulate="none", block_order="default"),
        key=lambda r: r["block_area"],
    )
    if len(area) >= 2 and area[-1]["max_abs_diff_vs_baseline"] > 0:
        small, big = area[0], area[-1]
        out.append(
            f"At {p}, the smallest tile ({small['block_q']}x{small['block_kv']}) deviates "
            f"{_x(small['max_abs_diff_vs_baseline'], big['max_abs_diff_vs_baseline'])} as much as the largest "
            f"({big['block_q']}x{big['block_kv']}) from baseline."
        )
    return out


def _x(a: float, b: float = 1.0) -> str:
    """``a / b`` as a factor (``2.3x``), ``n/a`` where undefined."""
    r = ratio(a, b)
    return "n/a" if math.isnan(r) else f"{r:.2f}x" if r < 1 else f"{r:.1f}x" if r < 10 else f"{r:.0f}x"
