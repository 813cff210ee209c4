"""``divergence watch`` over arms that restart, retry or die:
a correct store, or one line and exit 2, and nothing lost. Arms are written through ``ArmWriter``
with tiny modules, as a user's loop writes them."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from divergence.comparator.follow import Comparator
from divergence.errors import CheckpointError
from divergence.store import MetricsStore
from divergence.writers import ArmWriter

ROOT = Path(__file__).resolve().parents[2]


def write_arm(out, arm, losses, every=1, start=0, state=None, **options):
    """Arm ``arm`` recording ``losses`` (``{step: loss}``, in order) with a tiny linear module."""
    net = torch.nn.Linear(2, 2)
    writer = ArmWriter(out, arm, every=every, dense=[], log={"wandb": False}, start_step=start, **options)
    if start == 0:
        writer.record(0, net)
    for step, loss in losses.items():
        with torch.no_grad():
            net.weight.add_(0.01 * loss)
        writer.record(step, net, loss)
    writer.finish(state)
    return writer


class FailsOnce:
    """A function-space probe (``Comparator``'s ``probe`` interface) whose first reading fails as a
    file replaced mid-read does."""

    def __init__(self, step):
        self.step, self.failed = step, False

    def due(self, step):
        return True

    def record(self, paths):
        if not self.failed and str(self.step).zfill(6) in str(paths["a"]):
            self.failed = True
            raise CheckpointError("replaced while read")
        return {}


def test_a_step_retried_after_a_probe_failure_feeds_the_spike_detector_once(tmp_path):
    """The retry of step 2 fed its loss to the detectors twice, so step 3 (5x the median)
    was flagged a spike before the window (3 losses) was full."""
    losses = {1: 1.0, 2: 1.0, 3: 5.0}
    for arm in "ab":
        write_arm(tmp_path, arm, losses, max_steps=3, spike_window=3)
    comparator = Comparator(tmp_path, log=False, progress=False)
    comparator.planner.probe = FailsOnce(2)
    assert comparator.run(poll=0.01, timeout=5) == 0
    assert comparator.planner.probe.failed  # step 2 was retried
    assert comparator.planner.recorder.spikes["a"].history == [1.0, 1.0, 5.0]
    assert [r["spike_a"] for r in MetricsStore(tmp_path).step_records()[1:]] == [False, False, False]


def watch(out, capsys, *options):
    """``divergence watch`` in a thread (``options``: its flags), ended or not after 60 s: (code, stderr
    lines, seconds)."""
    from divergence.cli import main

    result, started = {}, time.monotonic()
    thread = threading.Thread(
        target=lambda: result.update(code=main(["watch", str(out), "--no-wandb", "--quiet", *options])), daemon=True
    )
    thread.start()
    thread.join(60)
    took = time.monotonic() - started
    return result.get("code"), capsys.readouterr().err.strip().splitlines(), took


def test_an_arm_that_failed_is_blamed_not_the_one_that_finished(tmp_path, capsys):
    """Minor finding: a finished at step 3 and b failed at step 3 (an open-ended pair); watch said
    "arm a finished at step 3, before step 4". The arm to restart is b."""
    write_arm(tmp_path, "a", {1: 1.0, 2: 1.0, 3: 1.0})
    write_arm(tmp_path, "b", {1: 1.0, 2: 1.0, 3: 1.0}, state="failed")
    code, err, _ = watch(tmp_path, capsys, "--poll", "0.02", "--timeout", "10")
    assert code == 2 and len(err) == 1
    assert "arm b failed at step 3, before step 4" in err[0]
    assert MetricsStore(tmp_path).steps() == [0, 1, 2, 3]


ARM_THAT_HANGS = """
import sys, time, torch
from divergence.writers import ArmWriter
writer = ArmWriter(sys.argv[1], "a", max_steps=6, every=2, dense=[], log={"wandb": False})
net = torch.nn.Linear(2, 2)
writer.record(0, net)
for step in (1, 2):
    writer.record(step, net, 0.5)
print("ready", flush=True)
time.sleep(600)
"""


def test_watch_ends_within_its_poll_interval_on_an_arm_killed_with_sigkill(tmp_path, capsys):
    """Minor finding: arm a's process was SIGKILLed at step 2; its status still says running, and
    watch without --timeout waited forever. Its lock is free: it is dead, said in one line (exit 2)."""
    arm = subprocess.Popen(
        [sys.executable, "-c", ARM_THAT_HANGS, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert arm.stdout.readline().strip() == "ready"
        write_arm(tmp_path, "b", {step: 0.5 for step in range(1, 7)}, every=2, max_steps=6)
        assert watch(tmp_path, capsys, "--poll", "0.02", "--timeout", "1")[0] == 1  # alive: waited for
    finally:
        arm.send_signal(signal.SIGKILL)
        arm.wait()
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "running"
    code, err, took = watch(tmp_path, capsys, "--poll", "0.5")  # no --timeout
    assert code == 2 and len(err) == 1, err
    assert (
        "arm a died: its a/status.json says running (attempt 1, from step 0) but no process holds a/writer.lock"
        in (err[0])
    )
    assert "Restart the arm (from its checkpoint, saying where it resumes)" in err[0]
    assert took < 0.5 * 2 + 5  # two looks a poll apart (a stall is acted on when seen twice), and the startup
    assert MetricsStore(tmp_path).steps() == [0, 1, 2]  # what arm a wrote is stored


def saved_steps(folder):
    return sorted(int(p.stem[5:]) for p in (folder / "checkpoints").iterdir())


def test_keep_leaves_the_files_a_restart_from_the_last_checkpoint_needs(tmp_path, capsys):
    """With tracking.keep, watch compared to step 8 and deleted both arms' files of the
    steps it does not keep; arm a was requeued from its checkpoint of step 4, and b's files of 5-8
    were gone. Files are now deleted only up to both arms' newest checkpoints (4 here), so the
    restart is followed to a complete store; once both arms finish, the rest goes."""
    writers, net = {}, torch.nn.Linear(2, 2)
    for arm in "ab":  # tracked 0..8; keep 2 keeps 0, 2, 4, 6, 8
        writers[arm] = ArmWriter(tmp_path, arm, max_steps=8, every=1, dense=[], keep=2, log={"wandb": False})
        writers[arm].record(0, net)
        for step in range(1, 9):
            writers[arm].record(step, net, 1.0 / step)
            if step == 4:
                writers[arm].checkpointed(4)  # its resumable checkpoint (a Lightning callback says so itself)
    code, err, _ = watch(tmp_path, capsys, "--poll", "0.02", "--timeout", "1")
    assert code == 1 and MetricsStore(tmp_path).steps() == list(range(9))  # the arms still run
    assert saved_steps(tmp_path / "a") == saved_steps(tmp_path / "b") == [0, 2, 4, 5, 6, 7, 8]
    writers["a"].lock.release()  # arm a's job killed, requeued from its checkpoint of step 4
    write_arm(tmp_path, "a", {step: 2.0 / step for step in range(5, 9)}, start=4, max_steps=8, keep=2)
    writers["b"].finish()
    code, err, _ = watch(tmp_path, capsys, "--poll", "0.02", "--timeout", "10")
    assert (code, err) == (0, [])
    records = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in records] == list(range(9)) and all(r["tracked"] for r in records)
    assert [r["loss_a"] for r in records[5:]] == [2.0 / step for step in range(5, 9)]  # the new attempt's
    assert saved_steps(tmp_path / "a") == saved_steps(tmp_path / "b") == [0, 2, 4, 6, 8]
    assert not (tmp_path / "retention.json").exists()


def test_a_restart_from_before_deleted_files_is_one_line_and_keeps_the_store(tmp_path, capsys):
    """The files gone anyway: both arms finished at 8 (their last checkpoint) and watch
    deleted 1, 3, 5, 7; arm a then restarts from step 4. Watch blamed arm b ("no step_000005") and
    had cut the store after 4. Now: one line naming the restart and the files, the store untouched."""
    for arm in "ab":
        write_arm(tmp_path, arm, {step: 1.0 / step for step in range(1, 9)}, max_steps=8, keep=2)
    assert watch(tmp_path, capsys, "--poll", "0.02", "--timeout", "10")[:2] == (0, [])
    assert saved_steps(tmp_path / "b") == [0, 2, 4, 6, 8]
    store = (tmp_path / "metrics.jsonl").read_bytes()
    write_arm(tmp_path, "a", {step: 2.0 / step for step in range(5, 9)}, start=4, max_steps=8, keep=2)
    code, err, _ = watch(tmp_path, capsys, "--poll", "0.02", "--timeout", "10")
    assert code == 2 and len(err) == 1, err
    assert (
        "arm a restarted from step 4, but arm b's weights files of the compared steps 5, 7 after it are gone"
        in (err[0])
    )
    assert "Restart arm a from a checkpoint of step 7 or later, or arm b too, from step 4 or earlier" in err[0]
    assert (tmp_path / "metrics.jsonl").read_bytes() == store  # nothing lost


def csv_steps(out):
    import csv

    with open(out / "csv" / "metrics.csv", newline="") as file:
        return sorted({int(float(row["step"])) for row in csv.DictReader(file) if row.get("train/loss_a")})


def test_a_restarted_watch_continues_the_csv_log(tmp_path, capsys):
    """A restarted watch (as a resumed ``divergence train``) started ``csv/metrics.csv``
    over, deleting the rows of the steps it had logged before."""
    from divergence.cli import main

    writers, net = {}, torch.nn.Linear(2, 2)
    for arm in "ab":
        writers[arm] = ArmWriter(tmp_path, arm, max_steps=6, every=2, dense=[], log={"wandb": False})
        writers[arm].record(0, net)
        for step in (1, 2, 3):
            writers[arm].record(step, net, 1.0 / step)
    assert main(["watch", str(tmp_path), "--quiet", "--poll", "0.02", "--timeout", "1"]) == 1  # waits at 3
    assert csv_steps(tmp_path)[:2] == [1, 2]  # (3 is held back until an arm is past it: it may be the last)
    for arm in "ab":
        for step in (4, 5, 6):
            writers[arm].record(step, net, 1.0 / step)
        writers[arm].finish()
    assert main(["watch", str(tmp_path), "--quiet", "--poll", "0.02", "--timeout", "10"]) == 0
    assert csv_steps(tmp_path) == [1, 2, 3, 4, 5, 6]
