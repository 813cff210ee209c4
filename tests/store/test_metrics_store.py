"""The metrics store keeps committed steps whatever happens to the writer."""

import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from divergence.errors import UserInputError
from divergence.store import MetricsStore


def _tensor(name, value):
    return {"tensor": name, "wasserstein": value, "max_abs_diff": 2 * value}


def test_round_trip_with_nonfinite_values(tmp_path):
    store = MetricsStore(tmp_path).open_for_append()
    store.append_step(0, [_tensor("a", 0.0), {"tensor": "b", "rel_l2": math.inf, "wasserstein": math.nan}], {"loss_a": 1.0})
    store.append_step(10, [_tensor("a", 0.5)], {"loss_a": 0.5})
    again = MetricsStore(tmp_path)
    assert again.steps() == [0, 10] and again.last_step() == 10
    records = list(again.tensor_records())
    assert [(r["step"], r["tensor"]) for r in records] == [(0, "a"), (0, "b"), (10, "a")]
    assert records[1]["rel_l2"] == math.inf and math.isnan(records[1]["wasserstein"])
    assert again.step_records()[1] == {"loss_a": 0.5, "type": "step", "step": 10, "tensors": 1}


def test_steps_only_move_forward(tmp_path):
    store = MetricsStore(tmp_path).open_for_append()
    store.append_step(5, [_tensor("a", 1.0)], {})
    with pytest.raises(ValueError, match="not after the last stored step 5"):
        store.append_step(5, [_tensor("a", 1.0)], {})
    with pytest.raises(ValueError):
        MetricsStore(tmp_path).append_step(3, [], {})


def test_torn_tail_is_ignored_then_cut(tmp_path):
    store = MetricsStore(tmp_path).open_for_append()
    store.append_step(0, [_tensor("a", 0.0)], {})
    with open(store.path, "a") as f:  # a writer killed mid-step: records without their commit, a torn line
        f.write('{"type":"tensor","step":1,"tensor":"a","wasserstein":1}\n{"type":"tens')
    assert MetricsStore(tmp_path).steps() == [0]
    assert [r["step"] for r in MetricsStore(tmp_path).tensor_records()] == [0]
    reopened = MetricsStore(tmp_path).open_for_append()
    reopened.append_step(1, [_tensor("a", 1.0)], {})
    assert [(r["step"], r["wasserstein"]) for r in reopened.tensor_records()] == [(0, 0.0), (1, 1.0)]


def test_truncate_after_for_resume(tmp_path):
    store = MetricsStore(tmp_path).open_for_append()
    for step in (0, 10, 20, 30):
        store.append_step(step, [_tensor("a", step)], {})
    assert store.truncate_after(10) == 2
    assert store.steps() == [0, 10]
    store.append_step(20, [_tensor("a", 20)], {})
    assert store.steps() == [0, 10, 20]


def test_sigkill_mid_write_keeps_every_committed_step(tmp_path):
    """A real writer process killed with SIGKILL while appending large steps."""
    script = textwrap.dedent(f"""
        import sys
        from divergence.store import MetricsStore
        store = MetricsStore({str(tmp_path)!r}).open_for_append()
        step = 0
        while True:
            store.append_step(step, [{{"tensor": f"t{{i}}", "wasserstein": float(step)}} for i in range(2000)], {{}})
            if step == 3:
                print("ready", flush=True)
            step += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = MetricsStore(tmp_path)
    steps = store.steps()
    assert steps == list(range(len(steps))) and len(steps) >= 4
    per_step = {}
    for record in store.tensor_records():
        per_step.setdefault(record["step"], []).append(record["wasserstein"])
    assert all(len(v) == 2000 and set(v) == {float(s)} for s, v in per_step.items())


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(UserInputError, match="no metrics store here"):
        MetricsStore(tmp_path / "nothing").steps()
