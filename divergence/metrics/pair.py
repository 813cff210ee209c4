"""All metrics of tensor pairs, as the records ``divergence compare`` and the stores use."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Iterable, Iterator

import numpy as np
import torch

from divergence.metrics.difference import DifferenceSums, chunk_sums, difference_sums
from divergence.metrics.parallel import SPAN, pool
from divergence.metrics.tensors import as_tensor, check_same_shape, chunks, numpy_values
from divergence.metrics.wasserstein import distance_chunks, ends_finite, mean_distance, wasserstein

# The metric keys of a record, in display order. A contract: the JSON, CSV and the
# metrics store use exactly these names.
METRIC_NAMES = ("wasserstein", "max_abs_diff", "mean_abs_diff", "rms_diff", "rel_l2", "cosine")
# The two weight metrics of the paper (Fig. 7) followed over steps: 1-D Wasserstein distance between
# the value distributions, and the elementwise maximum absolute difference. The analysis's
# trajectories, the step logger's per-kind keys and the layer heatmap all take these.
TRAJECTORY_METRICS = ("wasserstein", "max_abs_diff")
NAN = float("nan")
# compare_pairs starts a pair while fewer pairs, and fewer elements, than these are in flight:
# with their sorted copies, under 1 GB of float32 (SD 1.5's largest tensor has 29.5M elements).
WINDOW = 8
BUDGET = 1 << 25


def count_nonfinite(x: torch.Tensor) -> int:
    """Number of NaN and +-inf values in ``x``."""
    if not x.is_floating_point():
        return 0
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.float32, torch.float64):
        flat = x.detach().contiguous().numpy().reshape(-1)  # numpy's isfinite is ~20x faster on CPU
        return int(flat.size - np.count_nonzero(np.isfinite(flat)))
    return int(x.numel() - torch.isfinite(x).sum())


def comparable(x: torch.Tensor) -> torch.Tensor:
    """``x`` in a dtype every metric supports, with the same values.

    A complex tensor becomes ``torch.view_as_real(x)``, shape ``(*x.shape, 2)``: its real and
    imaginary parts side by side, so a complex pair is measured as the 2n real numbers it
    holds (rel_l2 and cosine are then exactly the complex ||a - b|| / ||a|| and
    Re<a, b> / (||a|| ||b||); max_abs_diff is the largest difference of one part). float8
    tensors (e4m3, e5m2), which torch cannot test for NaN, are widened to float32 exactly.
    """
    if x.is_complex():
        return torch.view_as_real(x.to(torch.complex64) if x.dtype == torch.complex32 else x)
    if x.is_floating_point() and x.element_size() == 1:
        return x.float()
    return x


def compare_tensors(a, b) -> dict:
    """Every metric of the pair (a, b), same shape, computed in float64 on a's device.

    Complex tensors are compared on their real and imaginary parts (see ``comparable``), so
    ``numel`` is then 2n, the count of real numbers measured, which keeps every aggregate
    exact; integer and bool tensors are compared as float64 values.

    Returns a dict with ``numel``, each name in ``METRIC_NAMES``, ``nonfinite_a``/``nonfinite_b``
    (count of NaN/inf values) and ``norm_a``/``norm_b`` (L2 norms, which let aggregates such
    as a global rel_l2 be exact). A pair holding any non-finite value gets NaN metrics: no
    finite number would be honest, and aggregates skip such pairs and count them instead.

    An empty pair (0 elements, e.g. a ``(0, 3)`` buffer) holds no value that differs: every
    difference is 0 (``wasserstein``, ``max_abs_diff``, ``mean_abs_diff``, ``rms_diff``,
    ``rel_l2``), ``cosine`` is 1 and both norms 0, the values of two equal all-zero tensors.
    It weighs nothing in the numel-weighted aggregates, so it changes none of them.
    """
    return next(compare_pairs([(a, b)]))


def compare_pairs(pairs: Iterable[tuple], window: int = WINDOW, budget: int = BUDGET) -> Iterator[dict]:
    """``compare_tensors(a, b)`` of each pair, in order, the same bits, with the work overlapped.

    CPU pairs run on the shared threads (``divergence.metrics.parallel``). A pair of more
    than SPAN elements is split into tasks: sort a, sort b and the difference pass in spans
    at once, then W1's distance pass in spans as soon as both sorts are done; a smaller pair
    is one task. So the sorts, the other metrics' passes and the next pairs' work keep every
    core busy while the caller loads the next pairs. The next pair is pulled from ``pairs``
    only while fewer than ``window`` pairs, holding fewer than ``budget`` elements, are in
    flight (each may hold its two sorted copies); otherwise the oldest is finished first.
    Pairs on other devices are measured as they arrive.

    Non-finite values are found from the sorted ends (NaN sorts last, -inf first) and only
    then counted, so a finite pair costs no extra pass for ``nonfinite_a/b``.
    """
    in_flight: deque = deque()
    elements = 0
    for a, b in pairs:
        in_flight.append(_start(a, b))
        elements += in_flight[-1].numel
        while in_flight and (len(in_flight) >= window or elements >= budget):
            elements -= in_flight[0].numel
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()


def _start(a, b):
    """The pair checked, and its measurement started: something with ``numel`` and ``result()``."""
    a, b = as_tensor(a), as_tensor(b)
    check_same_shape(a, b, "compare_tensors")
    if a.is_complex() != b.is_complex():
        raise ValueError(f"compare_tensors: cannot compare {a.dtype} with {b.dtype} (one is complex)")
    a, b = comparable(a).reshape(-1), comparable(b).to(a.device).reshape(-1)
    if a.numel() == 0:
        return _Done(0, _empty_record())
    if a.device.type != "cpu":
        return _Done(a.numel(), _on_device(a, b))
    if a.numel() <= SPAN:
        return _Done(a.numel(), pool().submit(_measure, a, b))
    return _CpuPair(a, b)


class _Done:
    """A pair measured now (a record) or by one task (a future of the record)."""

    def __init__(self, numel: int, record):
        self.numel, self.record = numel, record

    def result(self) -> dict:
        return self.record.result() if isinstance(self.record, Future) else self.record


def _measure(a: torch.Tensor, b: torch.Tensor) -> dict:
    """A CPU pair measured in the calling thread, one pass after the other."""
    va, vb = numpy_values(a), numpy_values(b)
    sa, sb = np.sort(va), np.sort(vb)
    if not (ends_finite(sa) and ends_finite(sb)):
        return _nan_record(a, b)
    return _record(
        DifferenceSums.from_chunks(va.size, chunk_sums(va, vb)), mean_distance(va.size, distance_chunks(sa, sb))
    )


class _CpuPair:
    """A large CPU pair as tasks on the pool, with the sums of ``_measure``, span by span."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        self.a, self.b, self.numel = a, b, a.numel()
        va, vb = numpy_values(a), numpy_values(b)
        self.sorts = [pool().submit(np.sort, v) for v in (va, vb)]  # the longest tasks first
        self.differences = [pool().submit(chunk_sums, va, vb, s) for s in chunks(self.numel, SPAN)]
        self.distances = Future()  # the distance pass's futures, or None for a non-finite pair
        self._unsorted, self._lock = 2, threading.Lock()
        for future in self.sorts:
            future.add_done_callback(self._sorted)

    def _sorted(self, _) -> None:
        """When both sorts are done (on the thread that finished the second): queue W1's pass."""
        with self._lock:
            self._unsorted -= 1
            if self._unsorted:
                return
        sorts, self.sorts = self.sorts, None  # no cycle self -> future -> callback -> self holds the arrays
        try:
            sa, sb = (f.result() for f in sorts)
            finite = ends_finite(sa) and ends_finite(sb)
            self.distances.set_result(
                [pool().submit(distance_chunks, sa, sb, s) for s in chunks(self.numel, SPAN)] if finite else None
            )
        except BaseException as error:  # a failed sort fails the record, in the caller's thread
            self.distances.set_exception(error)

    def result(self) -> dict:
        distances = self.distances.result()
        if distances is None:
            for future in self.differences:
                future.cancel()
            return _nan_record(self.a, self.b)
        sums = DifferenceSums.from_chunks(self.numel, [p for f in self.differences for p in f.result()])
        return _record(sums, mean_distance(self.numel, [p for f in distances for p in f.result()]))


def _on_device(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The pair measured on its (non-CPU) device, one metric after the other."""
    if count_nonfinite(a) or count_nonfinite(b):
        return _nan_record(a, b)
    return _record(difference_sums(a, b), wasserstein(a, b))


def _record(sums: DifferenceSums, w1: float) -> dict:
    """The record of a finite pair (the key order is the JSON's)."""
    return {
        "numel": sums.n,
        "nonfinite_a": 0,
        "nonfinite_b": 0,
        "wasserstein": w1,
        "max_abs_diff": sums.max_abs_diff,
        "mean_abs_diff": sums.mean_abs_diff,
        "rms_diff": sums.rms_diff,
        "rel_l2": sums.rel_l2,
        "cosine": sums.cosine,
        "norm_a": sums.norm_a,
        "norm_b": sums.norm_b,
    }


def _empty_record() -> dict:
    """The record of an empty pair: the values of two equal all-zero tensors (see compare_tensors)."""
    record = {"numel": 0, "nonfinite_a": 0, "nonfinite_b": 0}
    record.update({m: 0.0 for m in METRIC_NAMES}, cosine=1.0, norm_a=0.0, norm_b=0.0)
    return record


def _nan_record(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The record of a pair holding a NaN or an infinity: counts, NaN metrics."""
    record = {"numel": a.numel(), "nonfinite_a": count_nonfinite(a), "nonfinite_b": count_nonfinite(b)}
    record.update({m: NAN for m in METRIC_NAMES}, norm_a=NAN, norm_b=NAN)
    return record
