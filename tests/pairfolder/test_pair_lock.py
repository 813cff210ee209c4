"""One writer of a pair folder: a pair writer (``LockstepPair``, the lockstep
``train``, ``track``, ``pair``) holds ``<pair>/writer.lock`` exclusively, an arm writer its arm's lock and
the pair's shared, so each kind refuses the other; the OS drops a dead holder's lock; ``is_held`` reads a
lock without taking one a writer could miss.

The issue's case (4): two ``LockstepPair`` processes on one folder were both accepted, and the store held
every step twice from two runs.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from divergence.errors import UserInputError
from divergence.pairfolder.arm.lock import ArmLock, PairLock
from divergence.writers import ArmWriter

ROOT = Path(__file__).resolve().parents[2]
PAIR_HOLDER = """
import sys, time
from divergence.pairfolder.arm.lock import PairLock
lock = PairLock(sys.argv[1])
print("holding", flush=True)
time.sleep(120)
"""


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_lockstep_pair_on_a_folder_is_refused_and_nothing_is_lost(tmp_path):
    """While a LockstepPair trains (stopped after its step 1), a second one on the folder is refused."""
    import lightning.pytorch as pl

    from divergence.lightning import LockstepPair
    from tests.byo.user_module import build, loader, trainer

    def second(resume=False):
        return LockstepPair(
            build(0), build(0, approximate="tanh"), out=tmp_path, every=1, name="gelu", dense=[], resume=resume
        )

    seen = {}

    class Second(pl.Callback):
        def on_train_batch_end(self, trainer_, pl_module, outputs, batch, batch_idx):
            if batch_idx == 0:
                seen["before"] = _files(tmp_path)
                seen["held"] = PairLock.is_held(tmp_path), ArmLock.is_held(tmp_path / "a")
                with pytest.raises(UserInputError) as err:
                    trainer(4).fit(second(resume=True), loader())  # before: accepted, the store cut
                seen["message"], seen["after"] = str(err.value), _files(tmp_path)

    pl.seed_everything(0, verbose=False)
    trainer(3, [Second()]).fit(second(), loader())
    message = seen["message"]
    assert "\n" not in message and str(tmp_path) in message and f"pid {os.getpid()}" in message
    assert "one writer of a pair folder at a time" in message
    assert seen["held"] == (True, True)  # a pair writer writes both arms
    assert seen["after"] == seen["before"]  # the first run's store and pair.json untouched
    from divergence.store import MetricsStore

    assert [r["step"] for r in MetricsStore(tmp_path).step_records()] == [0, 1, 2, 3]  # each step once
    assert not PairLock.is_held(tmp_path)  # released at the end of training


def test_a_killed_pair_writer_leaves_no_lock(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", PAIR_HOLDER, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    try:
        assert holder.stdout.readline().strip() == b"holding"
        assert PairLock.is_held(tmp_path)
        with pytest.raises(UserInputError, match=f"another process \\(pid {holder.pid} on .*is writing this pair"):
            PairLock(tmp_path)
        with pytest.raises(UserInputError, match=f"pid {holder.pid} on .*is writing the whole pair folder"):
            ArmWriter(tmp_path, "a", max_steps=2, every=1, dense=[])
        from divergence.training.lockstep import train_pair
        from tests.pairs.helpers import pair_recipe

        before = _files(tmp_path)
        with pytest.raises(UserInputError, match=f"pid {holder.pid} on .*is writing this pair folder"):
            train_pair(pair_recipe("seed-vs-seed", "train.max_steps=2"), tmp_path)  # (5): the lockstep train too
        assert _files(tmp_path) == before  # refused before anything is written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not PairLock.is_held(tmp_path)
    PairLock(tmp_path).release()


def test_a_failed_fit_releases_the_lock(tmp_path):
    from divergence.lightning import LockstepPair
    from tests.byo.user_module import build, loader, trainer

    class Boom(Exception):
        pass

    pair = LockstepPair(build(0), build(0), out=tmp_path, every=1, category="control")
    pair.module_b.training_step = lambda *a, **k: (_ for _ in ()).throw(Boom())
    with pytest.raises(Boom):
        trainer(2).fit(pair, loader())
    assert not PairLock.is_held(tmp_path)
    PairLock(tmp_path).release()  # free for the next writer in this process


def test_arm_writers_and_pair_writers_exclude_each_other(tmp_path):
    writer = ArmWriter(tmp_path, "a", max_steps=2, every=1, dense=[])
    assert ArmLock.is_held(tmp_path / "a") and not ArmLock.is_held(tmp_path / "b") and PairLock.is_held(tmp_path)
    with pytest.raises(UserInputError, match=f"pid {os.getpid()}.* still writes arm a of this pair folder"):
        PairLock(tmp_path)
    other = ArmWriter(tmp_path, "b", max_steps=2, every=1, dense=[])  # the other arm's writer shares the pair
    writer.finish("failed")
    other.finish("failed")
    assert not PairLock.is_held(tmp_path)
    with PairLock(tmp_path):
        assert ArmLock.is_held(tmp_path / "b")  # a pair writer writes every arm
        with pytest.raises(UserInputError, match="is writing the whole pair folder"):
            ArmWriter(tmp_path, "b", max_steps=2, every=1, dense=[])
        with pytest.raises(UserInputError, match="is writing this pair folder"):
            PairLock(tmp_path)
    assert not ArmLock.is_held(tmp_path / "b") and PairLock.holder(tmp_path)[0] == os.getpid()


def test_is_held_creates_nothing(tmp_path):
    assert not ArmLock.is_held(tmp_path / "x" / "a") and not PairLock.is_held(tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_random_sequences_of_writers_keep_one_writer_per_arm_and_pair(tmp_path, monkeypatch):
    """A seeded sweep of starts and ends of arm writers (a, b) and pair writers: each start is let in exactly when
    the model allows it (an arm: no writer of that arm and no pair writer; a pair: no writer at all), and
    ``is_held`` agrees with the model after every step."""
    import random

    from divergence.pairfolder.arm import lock as arm_lock

    monkeypatch.setattr(arm_lock, "ATTEMPTS", 1)  # no probe runs here: no need to try twice
    rng = random.Random(0)
    held: dict[str, list] = {"a": [], "b": [], "pair": []}
    for _ in range(300):
        kind = rng.choice(["a", "b", "pair"])
        if held[kind] and rng.random() < 0.5:
            held[kind].pop().release()
        else:
            allowed = not held["pair"] and (not held[kind] if kind != "pair" else not (held["a"] or held["b"]))
            try:
                lock = PairLock(tmp_path) if kind == "pair" else ArmLock(tmp_path / kind)
            except UserInputError as err:
                assert not allowed, (kind, str(err))
                assert "\n" not in str(err) and f"pid {os.getpid()}" in str(err)
            else:
                assert allowed, (kind, {k: len(v) for k, v in held.items()})
                held[kind].append(lock)
        for arm in ("a", "b"):
            assert ArmLock.is_held(tmp_path / arm) == bool(held[arm] or held["pair"])
        assert PairLock.is_held(tmp_path) == any(held.values())
    for locks in held.values():
        for lock in locks:
            lock.release()
    assert not PairLock.is_held(tmp_path)
