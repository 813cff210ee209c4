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
    store.append_step(
        0, [_tensor("a", 0.0), {"tensor": "b", "rel_l2": math.inf, "wasserstein": math.nan}], {"loss_a": 1.0}
    )
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
    with pytest.raises(ValueError, match="not after the last stored step 5"):  # a fresh handle reads it
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


def test_tail_step_reads_the_last_step_record_from_the_end_of_the_file(tmp_path):
    store = MetricsStore(tmp_path)
    assert store.tail_step() is None  # no file yet
    store = store.open_for_append()
    for step in range(5):
        store.append_step(step, [_tensor(f"t{i}", 0.1 * step) for i in range(50)], {"loss_a": 1.0})
    block = store.path.stat().st_size // 5
    with open(store.path, "a") as f:  # a step in flight: its tensor records (as long as a block), a torn line
        f.write("".join(f'{{"type":"tensor","step":5,"tensor":"t{i}","wasserstein":1}}\n' for i in range(50)))
        f.write('{"type":"st')
    assert store.tail_step() == store.last_step() == 4
    assert store.tail_step(windows=(block // 4, 3 * block)) == 4  # found in the second, longer window
    assert store.tail_step(windows=(block // 4,)) is None  # no step record within the bytes read


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


# -- unreadable lines: an error naming the line, never a silent stop or a cut; repair loses nothing --
def _steps(folder, steps, tensors=("w", "b")):
    store = MetricsStore(folder).open_for_append()
    for step in steps:
        store.append_step(step, [_tensor(name, float(step)) for name in tensors], {"loss_a": 1.0})
    return store


def _insert(path, at, *new_lines):
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[: at - 1] + [line + b"\n" for line in new_lines] + lines[at - 1 :]))


def test_a_garbage_line_mid_file_is_an_error_and_resume_cuts_nothing(tmp_path):
    """The issue's case: readers stopped at the garbage line (steps 0-2 exported, exit 0) and the
    next resume cut the file there, deleting steps 3-8 from disk."""
    store = _steps(tmp_path, range(9))
    _insert(store.path, 10, b"\x00garbage")  # after step 2's block (3 lines a step)
    before = store.path.read_bytes()
    for read in (
        lambda s: s.steps(),
        lambda s: list(s.tensor_records()),
        lambda s: s.open_for_append(),
        lambda s: s.truncate_after(7),
    ):
        with pytest.raises(UserInputError, match=r"metrics.jsonl: line 10: not JSON .*divergence repair"):
            read(MetricsStore(tmp_path))
    assert store.path.read_bytes() == before


def test_repair_keeps_every_committed_block_and_moves_the_unreadable_lines_aside(tmp_path, capsys):
    from divergence.cli import main

    store = _steps(tmp_path, range(9))
    clean = store.path.read_bytes().splitlines(keepends=True)
    _insert(store.path, 10, b"[]")  # garbage between blocks
    _insert(store.path, 5, b'{"type":"step"}')  # inside step 1's block
    with open(store.path, "ab") as f:
        f.write(b"".join(clean[6:9]))  # step 2's block again, at the end
        f.write(b'{"type":"tensor","step":9,"tensor":"w"')  # and a torn final line
    assert main(["repair", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "kept 9 committed steps; moved 5 lines" in out and "line 5:" in out and "line 11:" in out
    side = list(tmp_path.glob("metrics.jsonl.unreadable-*"))
    assert len(side) == 1
    assert side[0].read_bytes() == b'{"type":"step"}\n[]\n' + b"".join(clean[6:9])
    repaired = MetricsStore(tmp_path)
    assert repaired.steps() == list(range(9))
    assert store.path.read_bytes() == b"".join(clean) + b'{"type":"tensor","step":9,"tensor":"w"'
    assert main(["repair", str(tmp_path)]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_a_duplicated_step_block_is_refused_naming_the_step(tmp_path):
    store = _steps(tmp_path, range(4))
    lines = store.path.read_bytes().splitlines(keepends=True)
    store.path.write_bytes(b"".join(lines[:6] + lines[3:6] + lines[6:]))  # step 1's block twice
    with pytest.raises(UserInputError, match="line 9: step 1 is stored twice"):
        MetricsStore(tmp_path).steps()
    store.path.write_bytes(b"".join(lines[:9] + lines[3:6] + lines[9:]))  # step 1 again after step 2
    with pytest.raises(UserInputError, match="line 12: step 1 comes after step 2"):
        MetricsStore(tmp_path).steps()


def test_a_tensor_record_of_another_step_inside_a_block_is_refused(tmp_path):
    store = _steps(tmp_path, range(3))
    _insert(store.path, 5, b'{"type":"tensor","step":7,"tensor":"x"}')
    with pytest.raises(UserInputError, match="line 5: a tensor record of step 7 inside the block of step 1"):
        list(MetricsStore(tmp_path).tensor_records())


def test_a_garbage_loss_line_is_an_error_and_a_resumed_arm_cuts_nothing(tmp_path, capsys):
    from divergence.cli import main
    from divergence.pairfolder.arm.losses import LossFile

    losses = LossFile(tmp_path / "a")
    for step in range(1, 6):
        losses.append(step, 0.5)
    _insert(losses.path, 3, b'{"step": 2, "loss": "x"}')
    before = losses.path.read_bytes()
    for read in (lambda f: f.read_new(), lambda f: f.truncate_after(2), lambda f: f.check()):
        with pytest.raises(UserInputError, match=r"losses.jsonl: line 3: its loss 'x' is not a number"):
            read(LossFile(tmp_path / "a"))
    assert losses.path.read_bytes() == before
    assert main(["repair", str(tmp_path)]) == 0
    assert "moved 1 lines" in capsys.readouterr().out
    assert sorted(LossFile(tmp_path / "a").read_new()) == [1, 2, 3, 4, 5]


def test_the_incremental_loss_reader_follows_a_file_cut_and_rewritten_by_a_resumed_arm(tmp_path):
    from divergence.pairfolder.arm.losses import LossFile

    writer, reader = LossFile(tmp_path), LossFile(tmp_path)
    for step in range(1, 6):
        writer.append(step, 1.0)
    assert sorted(reader.read_new()) == [1, 2, 3, 4, 5]
    writer.truncate_after(2)  # the arm resumed from step 2 ...
    for step in range(3, 9):
        writer.append(step, 2.0)  # ... and wrote more than before before the reader looked again
    assert reader.read_new() == {1: 1.0, 2: 1.0, **{s: 2.0 for s in range(3, 9)}}


def test_an_moe_arm_s_training_drops_ride_with_its_losses_and_a_bad_one_names_its_line(tmp_path):
    from divergence.pairfolder.arm.losses import LossFile

    writer, reader = LossFile(tmp_path / "a"), LossFile(tmp_path / "a")
    writer.append(1, 1.0, router_drop=0.171875)
    writer.append(2, 0.9)  # an arm without experts writes none
    assert reader.read_new() == {1: 1.0, 2: 0.9} and reader.router_drops == {1: 0.171875}
    writer.truncate_after(0)  # a resumed arm's cut takes the drops with the losses
    writer.append(1, 1.0, router_drop=0.25)
    assert reader.read_new() == {1: 1.0} and reader.router_drops == {1: 0.25}
    _insert(writer.path, 2, b'{"step": 2, "loss": 0.5, "router_drop": 1.5}')
    with pytest.raises(
        UserInputError, match=r"losses.jsonl: line 2: its router_drop 1.5 is not a fraction in \[0, 1\]"
    ):
        LossFile(tmp_path / "a").check()
