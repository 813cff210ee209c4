"""compare_pairs / compare_tensors: the fused, threaded passes give the plain reference's bits."""

import functools
import gc
import json
import math
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest
import torch

from divergence.metrics import compare_pairs, compare_tensors
from divergence.metrics.parallel import SPAN
from divergence.metrics.tensors import CHUNK
from tests.metrics.reference import reference_record

LARGE = 2 * SPAN + CHUNK + 7  # split into three spans, the last chunk partial
MID = SPAN + 3  # split into two spans


def _bits(record: dict) -> dict:
    """Floats by their bits (NaN == NaN), the key order kept: what the stores would write."""
    return {k: (v.hex() if isinstance(v, float) else (type(v), v)) for k, v in record.items()}


def _pairs():
    g = torch.Generator().manual_seed(0)
    for n in (1, 7, CHUNK + 1, SPAN, SPAN + 1, LARGE):
        a = torch.randn(n, generator=g)
        yield f"float32 {n}", a, a + 1e-3 * torch.randn(n, generator=g)
    a = torch.randn(LARGE, generator=g)
    b = a + 1e-2 * torch.randn(LARGE, generator=g)
    yield "bf16 vs float32", a.bfloat16(), b
    yield "transposed view", a[: 1500 * 1400].reshape(1500, 1400).t(), b[: 1500 * 1400].reshape(1400, 1500)
    a, b = a[:MID], b[:MID]
    yield "float64, large values", a.double() * 1e6, b.double() * 1e6
    yield "float16 matrix", a[: 640 * 640].reshape(640, 640).half(), b[: 640 * 640].reshape(640, 640).half()
    yield "int64", (a * 100).long(), (b * 100).long()
    yield "bool", a > 0, b > 0
    yield "complex64", torch.complex(a, b), torch.complex(b, a)
    yield "identical", a, a.clone()
    for where, value in ((0, math.nan), (MID - 1, math.inf), (SPAN + 1, -math.inf)):
        bad = b.clone()
        bad[where] = value
        yield f"large pair with {value} at {where}", a, bad
    small = a[:1000].clone()
    small[10] = math.nan
    yield "small pair with nan", small, b[:1000]
    yield "empty", torch.zeros(0, 3), torch.zeros(0, 3)


PAIRS = list(_pairs())


@functools.cache
def _reference(index: int) -> dict:
    _, a, b = PAIRS[index]
    return _bits(reference_record(a, b))


@pytest.mark.parametrize("index", range(len(PAIRS)), ids=[p[0] for p in PAIRS])
def test_compare_tensors_gives_the_reference_bits(index):
    _, a, b = PAIRS[index]
    assert _bits(compare_tensors(a, b)) == _reference(index)


@pytest.mark.parametrize("window,budget", [(8, 1 << 25), (1, 0), (3, 10**9)])
def test_a_stream_gives_each_pair_its_own_bits_in_order(window, budget):
    records = list(compare_pairs(((a, b) for _, a, b in PAIRS), window=window, budget=budget))
    assert [_bits(r) for r in records] == [_reference(i) for i in range(len(PAIRS))]


def test_pairs_in_flight_stay_within_the_window_and_budget():
    """A pair is pulled only while fewer than ``window`` pairs and ``budget`` elements are open."""
    pulled = []

    def pairs(n, count):
        for i in range(count):
            pulled.append(i)
            yield torch.full((n,), float(i)), torch.zeros(n)

    ahead = []
    for i, _ in enumerate(compare_pairs(pairs(10, 12), window=3)):
        ahead.append(len(pulled) - i)
    assert max(ahead) == 3
    pulled.clear()
    ahead = [len(pulled) - i for i, _ in enumerate(compare_pairs(pairs(SPAN + 1, 4), budget=2 * SPAN))]
    assert max(ahead) == 2  # the second large pair reaches the budget: the first finishes, then the third


def test_errors_name_the_shapes_and_dtypes():
    with pytest.raises(ValueError, match=r"shapes differ, \(2, 3\) vs \(3, 2\)"):
        list(compare_pairs([(torch.zeros(4), torch.zeros(4)), (torch.zeros(2, 3), torch.zeros(3, 2))]))
    with pytest.raises(ValueError, match="one is complex"):
        compare_tensors(torch.zeros(2, dtype=torch.complex64), torch.zeros(2))


# the threads after importing, after comparing, and the exit code of a child forked then, comparing again
THREADS = f"""
    import json, os, signal, threading
    import divergence.metrics, divergence.checkpoints.compare
    imported = [t.name for t in threading.enumerate()]
    import torch
    from divergence.metrics import compare_tensors
    a, b = torch.ones({MID}), torch.zeros({MID})
    parent = compare_tensors(a, b)
    compared = [t.name for t in threading.enumerate()]
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a child that hangs (the bug) ends itself
        os._exit(0 if compare_tensors(a, b) == parent else 1)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(dict(imported=imported, compared=compared, child=os.waitstatus_to_exitcode(status))))
"""


@pytest.fixture(scope="module")
def fresh_process() -> dict:
    """``THREADS`` in one fresh interpreter (its imports cost ~3 s of CPU) for both tests of threads."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(THREADS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_starts_no_thread_and_comparing_starts_the_pool(fresh_process):
    assert len(fresh_process["imported"]) == 1, fresh_process["imported"]
    assert any(name.startswith("divergence-metrics") for name in fresh_process["compared"]), fresh_process


def test_a_forked_child_compares_on_its_own_threads(fresh_process):
    """After fork only the forking thread exists: a pool inherited from the parent would never run."""
    assert fresh_process["child"] == 0, fresh_process


def test_a_measured_pair_is_freed_without_the_garbage_collector():
    """Nothing of a pair outlives its record: a reference cycle would keep every tensor and
    sorted copy of a stream alive until a garbage collection (the whole model, measured)."""
    gc.disable()
    try:
        a, b = np.ones(MID, np.float32), np.zeros(MID, np.float32)  # the tensors' memory: numpy's, weakly referable
        alive = weakref.ref(a), weakref.ref(b)
        compare_tensors(a, b)
        del a, b
        for _ in range(100):  # a worker drops its last task's arguments just after the result is out
            if all(ref() is None for ref in alive):
                break
            time.sleep(0.01)
        assert [ref() is None for ref in alive] == [True, True]
    finally:
        gc.enable()
