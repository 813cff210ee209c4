"""The bias findings: does an implementation's error lean one way, forward and backward?

For every input distribution the sweep ran (the reference inputs and those of the input-scale
study) at one length, every format, and baseline, flash and flash-unbiased (the reference tile,
every accumulation mode), and the other kernels the sweep ran there (a user's ``module:function``
kernels run on every distribution): the relative bias ``|mean e| / rms e`` and the bias z-score
(mean over its standard error over independent units, ``se_units``) of the output, of the
gradients dQ, dK, dV and of D = rowsum(dO * O) against the fp64 golden value (:func:`divergence.microbench.metrics.signed_stats`). A magnitude ratio ("2.3x the
baseline's error") cannot tell an error that wanders (it grows like sqrt(t) over t training
steps) from one that drifts (like t); these columns can (Qiu and Yao, arXiv 2510.04212, 2025;
docs/method.md). ``flash-unbiased`` is flash with their row-maximum change.

Pure functions of the sweep's rows (dicts with the results.csv columns, numbers as numbers).
"""

from __future__ import annotations

import math

from divergence.microbench.scale_findings import MODE, scale_dists
from divergence.microbench.select import kernels, one, precisions, reference_flash

QUANTITIES = (("", "out"), ("dq_", "dQ"), ("dk_", "dK"), ("dv_", "dV"), ("delta_", "D"))
BIASED_Z = 3.0  # |z| at or above: the findings call the error biased


def dists(recipe):
    """The input distributions with bias rows: ties and low-rank ones first, then the reference, then the rest."""
    ref = recipe.inputs.reference_dist().spec
    return sorted(scale_dists(recipe), key=lambda d: (d.family not in ("ties", "lowrank"), d.spec != ref))


def length(rows, recipe, dist: str) -> int | None:
    """The length of ``dist``'s bias rows: the longest up to the reference length with gradients
    measured, else the longest with a baseline row."""
    seqs = sorted({r["seq_len"] for r in rows if r["input_dist"] == dist and r["impl"] == "baseline"}, reverse=True)
    seqs = [s for s in seqs if s <= recipe.sweep.reference_seq_len] or seqs
    with_grads = [s for s in seqs if s <= recipe.sweep.backward_max_seq_len]
    return (with_grads or seqs or [None])[0]


def impl_rows(rows, recipe, dist: str, seq_len: int, precision: str) -> list[tuple[str, dict]]:
    """``[(label, row), ...]``: baseline, then flash and flash-unbiased in each mode present, then
    the other kernels that ran on ``dist``."""
    out = []
    base = one(rows, impl="baseline", precision=precision, seq_len=seq_len, input_dist=dist)
    if base:
        out.append(("baseline", base))
    for impl in ("flash", "flash-unbiased"):
        for acc in recipe.sweep.accumulate:
            r = reference_flash(
                rows, recipe, impl=impl, precision=precision, seq_len=seq_len, accumulate=acc, input_dist=dist
            )
            if r:
                out.append((f"{impl} {MODE[acc]}", r))
    for impl in kernels(recipe):
        r = one(rows, impl=impl, precision=precision, seq_len=seq_len, input_dist=dist)
        if r:
            out.append((impl, r))
    return out


def bias_table(rows, recipe) -> tuple[list[str], list[list]]:
    """One line per (input, format, implementation): relative bias and z of out, dQ, dK, dV, D."""
    head = ["input", "seq", "format", "implementation"]
    for _, name in QUANTITIES:
        head += [f"{name} rel. bias", f"{name} z"]
    head.append("out majority sign")
    body = []
    for d in dists(recipe):
        seq = length(rows, recipe, d.spec)
        if seq is None:
            continue
        for p in precisions(recipe):
            for label, r in impl_rows(rows, recipe, d.spec, seq, p):
                line = [d.label, seq, p, label]
                for prefix, _ in QUANTITIES:
                    line += [_get(r, f"{prefix}rel_bias"), _get(r, f"{prefix}bias_z")]
                body.append(line + [_get(r, "majority_sign_frac")])
    return head, body


def bias_lines(rows, recipe) -> list[str]:
    """One sentence per (input, format) with flash: its bias beside flash-unbiased's and baseline's."""
    out = []
    for d in dists(recipe):
        seq = length(rows, recipe, d.spec)
        if seq is None:
            continue
        for p in [p for p in precisions(recipe) if p != "fp64"]:
            found = dict(impl_rows(rows, recipe, d.spec, seq, p))
            parts = [f"{label} {_values(row)}" for label, row in found.items() if label != "baseline"]
            if not parts or "baseline" not in found:
                continue
            out.append(
                f"On {d.label} inputs at {p}, seq {seq}, the error's relative bias |mean|/rms (z) for "
                f"out, dQ, dK, dV, D: baseline {_values(found['baseline'])}; " + "; ".join(parts) + "."
            )
    return out


def _values(row: dict) -> str:
    cells = []
    for prefix, _ in QUANTITIES:
        rb, z = _get(row, f"{prefix}rel_bias"), _get(row, f"{prefix}bias_z")
        if math.isnan(rb):
            cells.append("n/a")
        else:
            flag = "*" if abs(z) >= BIASED_Z else ""
            cells.append(f"{rb:.3f} ({z:+.1f}){flag}")
    return ", ".join(cells)


def _get(row: dict, key: str) -> float:
    value = row.get(key, "")
    return float(value) if value not in ("", None) else float("nan")


TABLE_TEXT = (
    "Signed error against the fp64 golden value: rel. bias = |mean e| / rms e (0 unbiased, 1 every "
    "element errs by the same amount), z = mean e over its standard error, across the B x H "
    "independent (batch, head) slices when there are at least 8 (--set inputs.heads=16), else across "
    "rows, which tie-heavy inputs correlate, inflating z (|z| >= 3, marked * in the findings: biased). Gradients for one seeded output gradient dO: autograd for "
    "baseline and other kernels, D = rowsum(dO * O) from each output in fp64, FlashAttention-2's backward from the stored output for flash and flash-unbiased "
    "(flash with Qiu and Yao's row-maximum change). all-low: every operation in the format (the "
    "paper's, and Qiu and Yao's PyTorch kernel); fp32-acc: kernel-faithful."
)
