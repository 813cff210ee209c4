"""One writer per arm: a second process writing arm ``a`` is refused naming the arm folder and the
holder's pid; a holder killed with SIGKILL leaves no lock behind.

The issue's case: two processes writing arm ``a`` were not refused, their loss lines and weights
files interleaved, and the repair ``watch`` suggested paired one's losses with the other's weights.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from divergence.errors import UserInputError
from divergence.pairfolder.arm.lock import ArmLock
from divergence.writers import ArmWriter

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
import torch
from divergence.writers import ArmWriter
writer = ArmWriter(sys.argv[1], "a", max_steps=3, every=1, dense=[])
writer.record(0, torch.nn.Linear(2, 1))
print("holding", flush=True)
time.sleep(120)
"""


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def holder(tmp_path):
    """Another process writing arm ``a`` of ``tmp_path`` (it waits after step 0)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    try:
        assert process.stdout.readline().strip() == b"holding"
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_second_writer_is_refused_and_a_killed_one_leaves_no_lock(tmp_path, holder):
    before = _files(tmp_path)
    with pytest.raises(UserInputError) as err:
        ArmWriter(tmp_path, "a", max_steps=3, every=1, dense=[])
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "a") in message and f"pid {holder.pid}" in message
    assert "one writer per arm" in message
    assert _files(tmp_path) == before  # the holder's records are untouched
    ArmWriter(tmp_path, "b", max_steps=3, every=1, dense=[]).finish("failed")  # the other arm is free
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert holder.returncode == -signal.SIGKILL
    writer = ArmWriter(tmp_path, "a", max_steps=3, every=1, dense=[])  # the OS released the dead holder's lock
    writer.record(0, torch.nn.Linear(2, 1))
    writer.finish("failed")
    assert ArmLock(tmp_path / "a").held  # and finish() released this one


def test_the_built_in_arm_is_refused_too(tmp_path, holder):
    from divergence.training.separate_arm import train_arm
    from tests.pairs.helpers import pair_recipe

    with pytest.raises(UserInputError, match=f"pid {holder.pid}.*one writer per arm"):
        train_arm(pair_recipe("seed-vs-seed", "train.max_steps=2"), "a", tmp_path)
    assert not (tmp_path / "pair.yaml").exists()  # refused before the pair's files are written


def test_other_ranks_take_no_lock(tmp_path):
    held = ArmLock(tmp_path / "a")
    quiet = ArmWriter(tmp_path, "a", max_steps=3, every=1, rank=1)  # a rank that does not write
    quiet.record(0, torch.nn.Linear(2, 1))
    quiet.finish()
    assert quiet.lock is None and held.held
    held.release()
