"""One row of the atlas per optimization and backbone, from its report's ``summary.json`` and costs.

A row states, for the pair under study (arm a: the optimization, arm b: what it replaces):

- ``numerics``: what each arm trained in (``pair.json``'s numerics: device, precision, threads...);
- ``dose_ratio``: log10(E_X / E_P) against the precision reference, its 95% interval over
  replicates, its status and the replicates that would decide (``docs/method.md``); where fewer
  than 2 replicates formed an unsaturated window (no interval, nothing to plan replicates from),
  ``windows`` says how many did and what would give the others one;
- ``equivalent_dose``: the relative gradient noise per step it equals, when a calibration is given;
- ``outcome``: the final relative loss difference's status and interval;
- ``reordering``: log10(E_X / E_R) against the reordering reference R (a reordering of fp32 sums),
  its interval, replicates and status (``reordering_like``, ``beyond_reordering``, ``inconclusive``;
  ``divergence.analysis.reordering``) and where it was read (``read_on``: ``window``, or
  ``valid_steps`` when X and R do not grow alike), None when the study has no reordering reference;
- ``cost``: arm a's step time and peak memory over arm b's (``pair_costs``, below);
- ``router_flip``: on an MoE backbone, the share of the probe's (token, slot) choices whose expert
  differs between the arms at the last probed step (``final``: the median over replicates, and
  each replicate's; ``divergence.metrics.router``), None without the router's record;
- ``status``: the verdict's, or ``unavailable`` with the reason (a GPU-only row on a CPU).

Per backbone, ``seed_ceiling``: log10(E_seed / E_precision) at the last tracked step (medians over
replicates): where a model as different as another initialization sits on the same scale. The
precision reference is 0 by definition.

Costs come from ``costs.jsonl``: both arms of a pair step one after the other in one process on the
same inputs (``divergence.training.step_costs``), so a step's ratio a/b compares them under the same
load. Over every replicate's steps past the first ``WARMUP`` (first-call costs: lazy initialisation,
``torch.compile``'s compile, the allocator growing), the atlas states the median of the per-step
ratios (robust to a step slowed by another process) and each arm's median.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from divergence.atlas.catalog import Optimization
from divergence.pairfolder.folder import PairFolder
from divergence.training.step_costs import read_costs

WARMUP = 2  # steps 1 and 2 (a costs line is written after step s with global_step s + 1)


def measured_row(opt: Optimization, backbone: str, pair_name: str, summary: dict, report: str) -> dict:
    """The row of ``opt`` on ``backbone`` from its report's summary (``pair_name``: its pair under study)."""
    verdict = verdict_of(summary, pair_name)
    runs = [p for p in summary.get("pairs", {}).values() if p.get("name") == pair_name]
    row = _row(opt, backbone)
    row.update(
        pair=pair_name,
        report=report,
        numerics=(runs[0].get("numerics") if runs else None) or {},
        cost=pair_costs([p["folder"] for p in runs if p.get("folder")]),
        router_flip=router_flip(runs),
    )
    if verdict is None:
        row.update(status="no_verdict", reason="the report has no verdict for this pair")
        return row
    dose, outcome = verdict["dose_ratio"], verdict["outcome"]
    min_window = (summary.get("settings") or {}).get("min_window")
    row.update(
        status=verdict["status"],
        headline=verdict.get("headline"),
        dose_ratio={
            **{
                k: dose.get(k)
                for k in ("log10", "lo", "hi", "replicates", "status", "replicates_needed", "reference", "read_on")
            },
            "windows": windows(verdict, runs, min_window),
        },
        equivalent_dose=verdict.get("equivalent_dose"),
        outcome={k: outcome.get(k) for k in ("status", "mean", "lo", "hi", "margin", "replicates_needed")},
        reordering=_reordering(verdict.get("reordering")),
        coherence=_coherence(verdict.get("coherence")),
        outside_deployment=verdict.get("outside_deployment"),
        reasons=list(verdict.get("reasons") or []),
        reason=(verdict.get("reasons") or [None])[0],
    )
    return row


def verdict_of(summary: dict, pair_name: str) -> dict | None:
    """The verdict of pair ``pair_name`` in a report's summary, or None when it has none."""
    return next((v for v in summary.get("verdicts", []) if v.get("study") == pair_name), None)


def windows(verdict: dict, runs: list[dict], min_window: int | None) -> dict | None:
    """``{"formed", "replicates", "to_decide"}`` when fewer than 2 replicates formed a window (so the
    dose ratio has no interval and no replicate count can be planned from it), else None.

    ``to_decide`` says what gives the others a window of ``min_window`` tracked steps: tracking
    every step (``tracking.every=1``) where the pair's tracked steps leave gaps from the window's
    first step t0 on (``dose_ratio.common_start``), and a run twice as long (``train.max_steps``);
    where every replicate formed one (a single replicate), more replicates."""
    per = verdict.get("per_replicate") or []
    formed = sum(1 for r in per if _finite(r.get("log10")))
    if not per or formed >= 2:
        return None
    if formed == len(per):
        return {"formed": formed, "replicates": len(per), "to_decide": "1 replicate, no interval: --replicates 3"}
    start = (verdict.get("dose_ratio") or {}).get("common_start") or 0
    steps = [[t for t in (p.get("trajectory") or {}).get("step") or [] if t >= start] for p in runs]
    sparse = any(b - a > 1 for s in steps for a, b in zip(s, s[1:]))
    longest = max((p.get("max_steps") or 0 for p in runs), default=0)
    fixes = [*(["tracking.every=1"] if sparse else []), *([f"train.max_steps={2 * longest}"] if longest else [])]
    need = f" of {min_window} tracked steps" if min_window else ""
    return {
        "formed": formed,
        "replicates": len(per),
        "to_decide": f"{formed} of {len(per)} formed a window{need}: {' or '.join(fixes) or 'a longer run'}",
    }


def unavailable_row(opt: Optimization, backbone: str, reason: str) -> dict:
    return {**_row(opt, backbone), "status": "unavailable", "reason": reason}


def _row(opt: Optimization, backbone: str) -> dict:
    return {
        "optimization": opt.name,
        "backbone": backbone,
        "what": opt.what,
        "pair": None,
        "status": None,
        "reason": None,
        "numerics": {},
        "dose_ratio": None,
        "equivalent_dose": None,
        "outcome": None,
        "reordering": None,
        "cost": None,
        "router_flip": None,
        "report": None,
    }


def _coherence(coherence: dict | None) -> dict | None:
    """The verdict's coherence without its per-replicate curves (``summary.json``'s ``coherence``)."""
    if not coherence:
        return None
    return {k: coherence.get(k) for k in ("C", "lo", "hi", "cos", "replicates", "steps", "reading") if k in coherence}


def _reordering(reordering: dict | None) -> dict | None:
    keys = ("log10", "lo", "hi", "replicates", "status", "replicates_needed", "reference", "fp32_equivalent", "read_on")
    return {k: reordering.get(k) for k in keys} if reordering else None


def seed_ceiling(summary: dict) -> float | None:
    """log10(median E_seed / median E_precision) at the last step both reached, over replicates."""
    last = {}
    for category in ("seed", "precision"):
        finals = {}
        for p in summary.get("pairs", {}).values():
            trajectory = p.get("trajectory") or {}
            if p.get("category") == category and trajectory.get("step"):
                finals[trajectory["step"][-1], p.get("replicate")] = trajectory["rel_l2"][-1]
        last[category] = finals
    steps = {s for s, _ in last["seed"]} & {s for s, _ in last["precision"]}
    if not steps:
        return None
    step = max(steps)
    seed = [v for (s, _), v in last["seed"].items() if s == step and _finite(v)]
    precision = [v for (s, _), v in last["precision"].items() if s == step and _finite(v)]
    if not seed or not precision or statistics.median(precision) <= 0 or statistics.median(seed) <= 0:
        return None
    return math.log10(statistics.median(seed) / statistics.median(precision))


def router_flip(runs: list[dict]) -> dict | None:
    """``{"step", "final", "replicates"}``: the flip fraction at the last probed step each replicate
    reached (``summary.json``'s ``router``), the median over them as ``final``; None without MoE."""
    records = [p["router"] for p in runs if (p.get("router") or {}).get("flip")]
    finals = [r["flip"][-1] for r in records if _finite(r["flip"][-1])]
    if not finals:
        return None
    return {"step": max(r["step"][-1] for r in records), "final": statistics.median(finals), "replicates": finals}


def reference_flips(summary: dict, names) -> dict:
    """``{reference pair: its router_flip}`` for the references of ``names`` that have one."""
    out = {}
    for name in names:
        flip = router_flip([p for p in summary.get("pairs", {}).values() if p.get("name") == name])
        if flip is not None:
            out[name] = flip
    return out


def numerics_text(numerics: dict) -> str:
    """``bf16-mixed (cpu, emulated autocast, 1 thread)`` for arm a; arm b's differences after ``vs``."""
    if not numerics:
        return ""
    a, b = numerics.get("a") or {}, numerics.get("b") or {}
    text = _numerics_line(a)
    return text if _numerics_line(b) == text else f"{text} vs {_numerics_line(b)}"


def _numerics_line(n: dict) -> str:
    if not n:
        return "?"
    bits = [n.get("device", "?")]
    if n.get("cpu_autocast") == "emulate":
        bits.append("emulated autocast")
    if n.get("device") == "cpu" and n.get("cpu_threads"):
        bits.append(f"{n['cpu_threads']} thread{'s' if n['cpu_threads'] != 1 else ''}")
    if n.get("tf32"):
        bits.append("tf32")
    return f"{n.get('precision', '?')} ({', '.join(bits)})"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def pair_costs(folders: list[str | Path], warmup: int = WARMUP) -> dict | None:
    """``{"time_ratio", "memory_ratio", "seconds": {a, b}, "peak_bytes": {a, b}, "memory", "steps",
    "ranks"}`` over the pair runs in ``folders``, or None when none recorded costs; ``ranks``:
    ``{arm: [{"seconds", "peak_bytes"} per rank]}`` for arms that recorded their ranks (separate
    jobs), else None."""
    times, memory, seconds, peaks, kinds = [], [], {"a": [], "b": []}, {"a": [], "b": []}, set()
    per_rank: dict[str, list[dict[str, list]]] = {}
    for folder in folders:
        for step, row in sorted(read_costs(PairFolder(folder).costs).items()):
            arms = row.get("arms") or {}
            if step <= warmup or not all(isinstance(arms.get(arm), dict) for arm in "ab"):
                continue
            a, b = arms["a"], arms["b"]
            kinds.add(row.get("memory"))
            _add_ranks(per_rank, arms)
            if _positive(a.get("seconds")) and _positive(b.get("seconds")):
                times.append(a["seconds"] / b["seconds"])
                seconds["a"].append(a["seconds"]), seconds["b"].append(b["seconds"])
            if _positive(a.get("peak_bytes")) and _positive(b.get("peak_bytes")):
                memory.append(a["peak_bytes"] / b["peak_bytes"])
                peaks["a"].append(a["peak_bytes"]), peaks["b"].append(b["peak_bytes"])
    if not times:
        return None
    return {
        "time_ratio": statistics.median(times),
        "memory_ratio": statistics.median(memory) if memory else None,
        "seconds": {arm: statistics.median(v) for arm, v in seconds.items()},
        "peak_bytes": {arm: statistics.median(v) if v else None for arm, v in peaks.items()},
        "memory": "/".join(sorted(k for k in kinds if k)) or None,
        "steps": len(times),
        "ranks": {
            arm: [{k: statistics.median(v) if v else None for k, v in slot.items()} for slot in slots]
            for arm, slots in sorted(per_rank.items())
        }
        or None,
    }


def _add_ranks(per_rank: dict, arms: dict) -> None:
    """Each rank's step seconds and peak bytes of a costs line's arms, appended per (arm, rank)."""
    for arm, cost in arms.items():
        for rank, values in enumerate(cost.get("ranks") or []):
            slots = per_rank.setdefault(arm, [])
            while len(slots) <= rank:
                slots.append({"seconds": [], "peak_bytes": []})
            for key in ("seconds", "peak_bytes"):
                if _positive(values.get(key)):
                    slots[rank][key].append(values[key])


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
