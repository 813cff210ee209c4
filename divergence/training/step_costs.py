"""What each arm's optimizer step costs, measured side by side in the same run: ``costs.jsonl``.

An optimization exists to be faster or smaller, so a pair records, for every step and arm, the
wall time of the arm's step and the memory it took above what the process held when the step
began. The arms of a lockstep pair step one after the other in one process on the same inputs,
so their ratio compares them under the same load.

- Time: ``perf_counter`` around the arm's step (forward, backward, optimizer), after a CUDA
  synchronize on a GPU.
- Memory on a GPU: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus
  what was allocated at the step's start (``memory: cuda``).
- Memory on a CPU: the peak resident set size of the step above its start (``memory: rss``):
  glibc's free heap is handed back first (``malloc_trim(0)``, else the previous step's freed
  pages would hide this one's growth), then the kernel's high-water mark is reset
  (``/proc/self/clear_refs`` <- 5, Linux >= 4.0) and ``VmHWM - VmRSS`` read after the step.
  Where either is unavailable ``peak_bytes`` is null. Read on every ``MEMORY_EVERY``-th step only
  (:func:`measures_memory`; null on the others): handing the heap back makes the step fault in
  every page it touches again. Read on every step, that was 12% of a tiny UNet pair run's CPU
  (101.8 -> 89.2 s for 30 steps, 5.0M -> 1.0M page faults), and every step's ``seconds`` held it.
  A step's peak is the same from step to step (the same shapes), so a sample of steps states it.

One JSON line per step (a resumed run appends the steps it recomputes; the last line of a step wins)::

    {"step": 12, "memory": "rss", "arms": {"a": {"seconds": 0.41, "peak_bytes": 31457280}, "b": {...}}}

A pair whose arms train as separate multi-process jobs (``training.separate_pair``): every rank of
an arm job appends its own line to ``<arm>/costs.rank<R>.jsonl`` (``{"step", "memory", "seconds",
"peak_bytes"}``), and once both arms finished ``merge_rank_costs`` writes the pair's
``costs.jsonl`` in the same form, each arm's ``seconds`` and ``peak_bytes`` those of its slowest and
largest rank (what a step of the job waits for, and what each of its ranks must hold), with every
rank's own under ``ranks``::

    {"step": 12, "memory": "rss", "arms": {"a": {"seconds": 0.3, "peak_bytes": 2e7, "ranks": [{...}, {...}]}, ...}}
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import re
import time
from pathlib import Path

import torch

from divergence.pairfolder.folder import as_pair_folder


MEMORY_EVERY = 5  # a CPU step's peak memory is read on steps 2, 7, 12, ... (costs.jsonl's 3, 8, 13, ...)


def measures_memory(step: int) -> bool:
    """Whether a CPU arm reads its peak memory at (0-based) ``step``: every ``MEMORY_EVERY``-th, from
    step 2 on, the first past the atlas's warm-up (``atlas.rows.WARMUP``: costs lines 1 and 2).

    >>> [s for s in range(15) if measures_memory(s)]
    [2, 7, 12]
    """
    return step % MEMORY_EVERY == 2


@contextlib.contextmanager
def step_cost(device: torch.device, memory: bool = True):
    """Measure the block: yields a dict that holds ``seconds`` and ``peak_bytes`` after it.
    ``memory=False``: on a CPU, ``peak_bytes`` is None and the heap is left as it is (a GPU's peak
    costs nothing to read and is read whatever ``memory`` says)."""
    cost: dict = {}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start_bytes = torch.cuda.memory_allocated(device)
    else:
        start_bytes = _reset_rss_peak() if memory else None
    start = time.perf_counter()
    yield cost
    if cuda:
        torch.cuda.synchronize(device)
    cost["seconds"] = time.perf_counter() - start
    if cuda:
        cost["peak_bytes"] = int(torch.cuda.max_memory_allocated(device) - start_bytes)
    else:
        peak = _status_kib("VmHWM") if start_bytes is not None else None
        cost["peak_bytes"] = None if peak is None else max(0, peak * 1024 - start_bytes)


def memory_kind(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "rss"


def _reset_rss_peak() -> int | None:
    """Trim the free heap, reset the high-water mark; the resident bytes now, or None if unsupported."""
    libc = _libc()
    if libc is None:
        return None
    libc.malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    rss = _status_kib("VmRSS")
    return None if rss is None else rss * 1024


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


def append_costs(path: Path, step: int, memory: str, **fields) -> None:
    """Append one step's line to a costs file: the pair's ``costs.jsonl`` (``arms=``), or a rank's
    ``costs.rank<R>.jsonl`` (its ``seconds`` and ``peak_bytes``)."""
    line = json.dumps({"step": int(step), "memory": memory, **fields}, allow_nan=False)
    with open(path, "a") as f:
        f.write(line + "\n")


def read_costs(path: Path) -> dict[int, dict]:
    """``step -> line`` of a costs file (``costs.jsonl`` or a rank's; the last line of a step); {}
    when absent. A torn last line (a run killed mid-write) is skipped."""
    if not path.is_file():
        return {}
    rows = {}
    for text in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(text)
            rows[int(row["step"])] = row
        except (ValueError, KeyError, TypeError):
            continue
    return rows


def merge_rank_costs(out: Path) -> int:
    """The pair's ``costs.jsonl`` from its arms' rank files (the steps every rank of both arms
    recorded), written whole and atomically, so it can be redone after a resume; the lines written."""
    from divergence.atomic import write_atomic
    from divergence.pairfolder.layout import ARMS

    pair = as_pair_folder(out)
    ranks = {arm: _rank_rows(pair.arm(arm)) for arm in ARMS}
    if not all(ranks.values()):
        return 0
    steps = sorted(set.intersection(*(set(rows) for per_arm in ranks.values() for rows in per_arm)))
    lines = []
    for step in steps:
        arms = {arm: _slowest([rows[step] for rows in per_arm]) for arm, per_arm in ranks.items()}
        memory = ranks[ARMS[0]][0][step].get("memory")
        lines.append(json.dumps({"step": step, "memory": memory, "arms": arms}, allow_nan=False))
    write_atomic(pair.costs, "".join(line + "\n" for line in lines))
    return len(lines)


def _rank_rows(arm_folder) -> list[dict[int, dict]]:
    """``[step -> line]`` of each rank file of an arm, rank 0 first, until the first rank missing."""
    found, rank = [], 0
    while (path := arm_folder.rank_costs(rank)).is_file():
        found.append(read_costs(path))
        rank += 1
    return found


def _slowest(rows: list[dict]) -> dict:
    def top(key):
        values = [r.get(key) for r in rows]
        return None if any(v is None for v in values) else max(values)

    keep = [{"seconds": r.get("seconds"), "peak_bytes": r.get("peak_bytes")} for r in rows]
    return {"seconds": top("seconds"), "peak_bytes": top("peak_bytes"), "ranks": keep}
