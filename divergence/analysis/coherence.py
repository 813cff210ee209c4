"""Does the studied optimization's update error drift or wander? C(T) over replicates, and its reading.

Each replicate of the pair under study records, at the steps ``tracking.coherence_every`` picks, the
coherence of its update error on the reference arm's weights (``divergence.training.callbacks.coherence``;
the step records' ``coherence*`` keys). Per replicate the last record gives ``C(T)`` over its ``T``
measured steps and the mean consecutive cosine; over replicates, the mean of C with its t interval
(``analysis.replicates.pool``). With ``e_t = b + n_t`` (a bias ``b``, independent noise of energy
``s^2``), ``C^2 = 1 + (T - 1) rho`` where ``rho = ||b||^2 / (||b||^2 + s^2)`` is the coherent share of the
error's energy (``divergence.metrics.coherence``). The reading (docs/method.md, "Coherence"):

- ``drifts``: the interval's low end is above ``sqrt(1 + (T - 1) DRIFT_SHARE)``: at least that share
  of the error's energy keeps one direction, and the error adds like ``t``;
- ``wanders``: its high end is below ``sqrt(1 + (T - 1) WANDER_SHARE)``: it adds like ``sqrt(t)``;
- ``undecided``: the interval reaches across a line (more replicates or measured steps decide);
- ``not measurable: <why>``: the pair's difference cannot be switched on one model.

With one replicate the point value is read the same way (no interval). Reference: Qiu and Yao,
arXiv 2510.04212 (2025): a biased rounding in bf16 flash attention compounds through the updates.
"""

from __future__ import annotations

import math

from divergence.analysis.replicates import pool

DRIFT_SHARE = 0.5  # coherent share of the error's energy from which the error "drifts"
WANDER_SHARE = 0.1  # coherent share below which it "wanders"


def run_coherence(folder) -> dict | None:
    """One run's coherence from its store: ``{C, cos, steps, layers, curve, status}``; None when the
    run has no coherence records (``tracking.coherence_every`` off)."""
    from divergence.store import MetricsStore

    records = [r for r in MetricsStore(folder).step_records() if "coherence" in r or "coherence_status" in r]
    if not records:
        return None
    measured = [r for r in records if isinstance(r.get("coherence"), (int, float))]
    if not measured:
        return {"status": records[-1]["coherence_status"]}
    last = measured[-1]
    return {
        "C": float(last["coherence"]),
        "cos": float(last["coherence_mean_cos"]),
        "steps": int(last["coherence_steps"]),
        "rel_err": float(last["coherence_err"]) / last["coherence_grad"] if last["coherence_grad"] else math.nan,
        "layers": dict(last.get("coherence_layers") or {}),
        "curve": [(int(r["step"]), int(r["coherence_steps"]), float(r["coherence"])) for r in measured],
        "status": "measured",
    }


def at_steps(curve: list, steps: int) -> float:
    """C at ``T = steps`` from a run's curve ``[(step, T, C), ...]``."""
    return next(c for _, t, c in curve if t == steps)


def line(steps: int, share: float) -> float:
    """The C(T) an error whose coherent energy share is ``share`` reaches at ``T = steps``."""
    return math.sqrt(1 + (steps - 1) * share)


def reading(c: float, lo: float | None, hi: float | None, steps: int) -> str:
    """``drifts``, ``wanders`` or ``undecided`` (module docstring); the point ``c`` when no interval."""
    low, high = (c, c) if lo is None or hi is None else (lo, hi)
    if not math.isfinite(low) or steps < 2:
        return "undecided"
    if low > line(steps, DRIFT_SHARE):
        return "drifts"
    if high < line(steps, WANDER_SHARE):
        return "wanders"
    return "undecided"


def pair_coherence(runs) -> dict | None:
    """``summary.json``'s ``coherence`` of one pair's replicates (``PairData`` with ``folder``): ``C``
    (mean over replicates), ``lo``, ``hi`` (t interval), ``cos``, ``rel_err``, ``replicates``, ``steps``
    (T, the fewest of any replicate), ``lines`` (the C of each reading's threshold at T), ``reading``,
    ``layers`` ({layer: mean C}, at each replicate's last T), ``per_replicate``; None when no replicate
    recorded it. Replicates that measured different numbers of steps (one still training) are compared
    at the fewest: each one's C(T) at that T, from its curve."""
    found = {p.replicate: run_coherence(p.folder) for p in runs if getattr(p, "folder", "")}
    found = {r: c for r, c in found.items() if c is not None}
    if not found:
        return None
    measured = {r: c for r, c in found.items() if c["status"] == "measured"}
    if not measured:
        return {"reading": next(iter(found.values()))["status"], "replicates": len(found)}
    steps = min(c["steps"] for c in measured.values())  # C of every replicate at a common T
    pooled = pool([at_steps(c["curve"], steps) for c in measured.values()])
    layers = sorted({name for c in measured.values() for name in c["layers"]})
    return {
        "C": pooled.mean,
        "lo": pooled.lo,
        "hi": pooled.hi,
        "cos": pool([c["cos"] for c in measured.values()]).mean,
        "rel_err": pool([c["rel_err"] for c in measured.values()]).mean,
        "replicates": pooled.n,
        "steps": steps,
        "lines": {"drifts": line(steps, DRIFT_SHARE), "wanders": line(steps, WANDER_SHARE), "sqrt_T": math.sqrt(steps)},
        "reading": reading(pooled.mean, pooled.lo, pooled.hi, steps),
        "layers": {n: pool([c["layers"].get(n) for c in measured.values()]).mean for n in layers},
        "per_replicate": [
            {"replicate": r, "C": c["C"], "cos": c["cos"], "steps": c["steps"], "curve": c["curve"]}
            for r, c in sorted(measured.items())
        ],
    }


def sentence(c: dict | None, label: str = "the optimization") -> str | None:
    """The report's one sentence beside the dose ratio; None without coherence records."""
    if c is None:
        return None
    if "C" not in c:
        return f"Coherence of {label}'s update error: {c['reading']}."
    t = c["steps"]
    spread = (
        f"95% interval {c['lo']:.2f} to {c['hi']:.2f} over {c['replicates']} replicates"
        if c["lo"] is not None
        else "one replicate, no interval"
    )
    verb = {"drifts": "it drifts", "wanders": "it wanders", "undecided": "undecided between drifting and wandering"}
    return (
        f"Coherence of {label}'s update error on the reference arm's weights: C(T={t}) = {c['C']:.2f} ({spread}; "
        f"about 1 if it wanders, sqrt(T) = {math.sqrt(t):.2f} if it drifts; drift line {c['lines']['drifts']:.2f}, "
        f"wander line {c['lines']['wanders']:.2f}), mean consecutive cosine {c['cos']:+.2f}, "
        f"|e|/|g| {c['rel_err']:.1e}: {verb[c['reading']]}."
    )
