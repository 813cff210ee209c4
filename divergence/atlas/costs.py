"""What an optimization buys: arm a's step time and peak memory over arm b's, from ``costs.jsonl``.

Both arms of a pair step one after the other in one process on the same inputs
(``divergence.training.step_costs``), so a step's ratio a/b compares them under the same load.
Over every replicate's steps past the first ``WARMUP`` (first-call costs: lazy initialisation,
``torch.compile``'s compile, the allocator growing), the atlas states the median of the per-step
ratios (robust to a step slowed by another process) and each arm's median.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from divergence.training.step_costs import read_costs

WARMUP = 2  # steps 1 and 2 (a costs line is written after step s with global_step s + 1)


def pair_costs(folders: list[str | Path], warmup: int = WARMUP) -> dict | None:
    """``{"time_ratio", "memory_ratio", "seconds": {a, b}, "peak_bytes": {a, b}, "memory", "steps",
    "ranks"}`` over the pair runs in ``folders``, or None when none recorded costs; ``ranks``:
    ``{arm: [{"seconds", "peak_bytes"} per rank]}`` for arms that recorded their ranks (separate
    jobs), else None."""
    times, memory, seconds, peaks, kinds = [], [], {"a": [], "b": []}, {"a": [], "b": []}, set()
    per_rank: dict[str, list[dict[str, list]]] = {}
    for folder in folders:
        for step, row in sorted(read_costs(Path(folder)).items()):
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
