"""The worker threads CPU comparisons run on: started on first use, shared by every metric.

numpy releases the GIL inside ``np.sort`` and inside its elementwise loops and reductions,
so threads run on separate cores; the Python between numpy calls is a few microseconds per
CHUNK of 2^18 elements. One pool serves W1's sorts and the difference passes, so a free
thread always takes the next task of either kind (see ``divergence.metrics.pair.compare_pairs``).
Importing this module starts nothing.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from divergence.metrics.tensors import CHUNK

# Elements per task of a split pass: 8 chunks, about 10 ms of float64 work on one core.
# A multiple of CHUNK, so a split pass has exactly the chunks of the whole pass.
SPAN = 8 * CHUNK


def workers() -> int:
    """Threads in the pool: the usable cores, at least 2 (W1 sorts both sides at once), at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 2
    return min(8, max(2, cores))


_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The shared pool, created on the first call in this process (a forked child gets its own:
    the parent's threads do not exist there)."""
    with _lock:
        if os.getpid() not in _pools:
            _pools[os.getpid()] = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="divergence-metrics")
        return _pools[os.getpid()]
