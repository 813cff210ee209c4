"""Random step sequences through ``ArmWriter`` for both arms, then ``divergence watch``: a correct
store, a one-line refusal, or exit 2, within a bounded time; never a wait without end.

Each case (seeded: ``SEED + case``, ``CASES`` of them) draws a pair (``max_steps`` 1-5, ``every``
1-3) and drives each arm with random calls: mostly the step the writer expects next with a
loss (finite, NaN, infinite, a 0-d or one-element tensor), sometimes a duplicate, an earlier or
a skipped step, a float, a bool, a negative step or one past ``max_steps``, a vector, a string or
no loss. Each arm stops at a random step (often ``max_steps``); some are "killed" there and
restarted, with and without saying where they resume. Then:

- every call either records (and was the step expected) or is refused in one line, changing
  no file of the pair folder;
- ``watch`` (its ``--timeout`` a bound it must never need: both arms have ended) exits 0 with
  the store of steps 0..max_steps holding each arm's recorded losses when both arms reached
  the end, and otherwise exits 2 in one line naming the arm and step where it stopped.

One case more runs ``divergence watch`` as a process with no ``--timeout`` at all, under a
wall-clock bound: it must end by itself.
"""

import math
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from divergence.comparator.follow import Comparator
from divergence.training.probe_files import FileProbe
from divergence.errors import UserInputError
from divergence.store import MetricsStore
from divergence.writers import ArmWriter

SEED, CASES = 24, 24
BOUND = 5.0  # seconds: watch's --timeout, which ended arms must never need
ROOT = Path(__file__).resolve().parents[2]


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _loss(rng: random.Random):
    return rng.choice(
        [
            rng.uniform(0.1, 2.0),
            rng.uniform(0.1, 2.0),
            math.inf,
            math.nan,
            torch.tensor(rng.uniform(0.1, 2.0)),
            torch.tensor([rng.uniform(0.1, 2.0)]),
        ]
    )


def _bad_call(rng: random.Random, writer: ArmWriter):
    """A step and loss that are (most likely) wrong: what a buggy loop hands the writer."""
    nxt, last = writer.next_step, writer.next_step - writer.stride
    return rng.choice(
        [
            (last, 0.5),
            (last - 1, 0.5),
            (nxt + 1, 0.5),
            (nxt + 2, 0.5),
            (float(nxt), 0.5),
            (True, 0.5),
            (-1, 0.5),
            (writer.max_steps + 1, 0.5),
            (nxt, torch.ones(3)),
            (nxt, "0.5"),
            (nxt, None),
        ]
    )


def _value(loss) -> float:
    return float(loss.reshape(())) if isinstance(loss, torch.Tensor) else float(loss)


class Arm:
    """One arm driven at random; ``losses``: what it recorded, by step."""

    def __init__(self, out: Path, name: str, max_steps: int, every: int, rng: random.Random):
        self.out, self.name, self.max_steps, self.every, self.rng = out, name, max_steps, every, rng
        self.model = torch.nn.Linear(2, 1)
        self.losses: dict[int, float] = {}
        self.writer = self._writer(0)

    def _writer(self, start: int, resume: bool = False) -> ArmWriter:
        return ArmWriter(
            self.out,
            self.name,
            max_steps=self.max_steps,
            every=self.every,
            dense=[],
            start_step=start,
            resume=resume,
            log={"wandb": False},
        )

    def drive(self, stop: int) -> None:
        for _ in range(60):
            if self.writer.next_step > stop:
                return
            good = self.rng.random() < 0.6
            step, loss = (self.writer.next_step, _loss(self.rng)) if good else _bad_call(self.rng, self.writer)
            expected, before = self.writer.next_step, _files(self.out)
            try:
                self.writer.record(step, self.model, loss)
            except UserInputError as err:
                assert "\n" not in str(err), str(err)
                assert _files(self.out) == before, f"a refused record({step!r}, ..., {loss!r}) changed a file"
                continue
            assert step == expected and type(step) is int, f"record({step!r}) was taken; expected {expected}"
            with torch.no_grad():
                self.model.weight.add_(0.01 * step)
            if step > 0:
                self.losses[step] = _value(loss)

    def restart(self) -> None:
        """Killed (its lock dropped, as the OS drops a dead process's), then started again."""
        self.writer.lock.release()
        last = max(self.losses, default=0)
        with pytest.raises(UserInputError, match="starting at step 0 would cut them") if last else _nothing():
            self._writer(0).lock.release()  # a restart that does not say where it resumes
        start = self.rng.randint(0, last)
        self.writer = self._writer(start, resume=start == 0)
        self.losses = {s: v for s, v in self.losses.items() if s <= start}
        if start == 0:
            self.writer.record(0, self.model)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _check_store(out: Path, arms: dict) -> None:
    records = MetricsStore(out).step_records()
    max_steps = arms["a"].max_steps
    assert [r["step"] for r in records] == list(range(max_steps + 1))
    for record in records[1:]:
        for name, arm in arms.items():
            stored, recorded = record[f"loss_{name}"], arm.losses[record["step"]]
            assert stored == recorded or (math.isnan(stored) and math.isnan(recorded))


@pytest.mark.parametrize("case", range(CASES))
def test_random_step_sequences_end_in_a_store_or_one_line(tmp_path, capsys, case):
    rng = random.Random(SEED + case)
    max_steps, every = rng.randint(1, 5), rng.randint(1, 3)
    arms = {name: Arm(tmp_path, name, max_steps, every, rng) for name in ("a", "b")}
    for arm in arms.values():
        stop = rng.choice([max_steps, max_steps, rng.randint(0, max_steps)])
        arm.drive(stop)
        if rng.random() < 0.3:
            arm.restart()
            arm.drive(stop)
        arm.writer.finish()
    capsys.readouterr()
    started = time.monotonic()
    code = Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=BOUND)
    took = time.monotonic() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 1 and took < BOUND, f"watch waited on ended arms ({err})"
    ends = {name: max(arm.losses, default=0) for name, arm in arms.items()}
    if min(ends.values()) == max_steps:
        assert code == 0
        _check_store(tmp_path, arms)
    else:
        short = min(ends, key=lambda name: (ends[name], name))
        assert code == 2 and len(err) == 1
        assert f"arm {short} failed at step {ends[short]}, before step {ends[short] + 1}" in err[0]


def test_watch_ends_by_itself_without_a_timeout(tmp_path):
    """As a process, with no --timeout: arms that stopped early end watch (exit 2), it never hangs."""
    for name in ("a", "b"):
        with ArmWriter(tmp_path, name, max_steps=4, every=2, dense=[], log={"wandb": False}) as writer:
            writer.record(0, torch.nn.Linear(2, 1))
            writer.record(1, torch.nn.Linear(2, 1), 0.5)
    run = subprocess.run(
        [sys.executable, "-m", "divergence", "watch", str(tmp_path), "--no-wandb", "--quiet", "--poll", "0.05"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        "divergence watch: arm a failed at step 1, before step 2 (max_steps 4); the pair cannot be completed as it "
        "is. Restart the arm (from its checkpoint, saying where it resumes), then run watch again: it continues "
        "from its store"
    ]


RESTART_CASES = 8


@pytest.mark.parametrize("case", range(RESTART_CASES))
def test_arms_requeued_under_a_running_watch_end_in_a_complete_store(tmp_path, case):
    """Restart cases: both arms record part of the pair (with ``keep`` or not, saying some
    of their checkpoints), a watch follows them while they run, then each arm may be killed and
    requeued from its newest checkpoint and trains to the end. A second watch ends in the complete
    store of the last attempts' losses (no file a restart needs was deleted), and with ``keep`` the
    kept files are there. Each writer, a requeued one too, saves its weights as safetensors or as
    DCP folders (drawn apart, so the steps drawn do not depend on it)."""
    rng = random.Random(SEED * 1000 + case)
    formats = random.Random(SEED * 7 + case)
    max_steps, every, keep = rng.randint(2, 6), rng.randint(1, 3), rng.choice([None, 1, 2])
    options = dict(max_steps=max_steps, every=every, dense=[], keep=keep, log={"wandb": False})
    writers, losses, newest, net = {}, {}, {}, torch.nn.Linear(2, 1)

    def format():
        return formats.choice(["safetensors", "dcp"])

    for name in ("a", "b"):
        writers[name], losses[name], newest[name] = ArmWriter(tmp_path, name, format=format(), **options), {}, 0
        writers[name].record(0, net)
        for step in range(1, rng.randint(1, max_steps) + 1):
            losses[name][step] = rng.uniform(0.1, 2.0)
            writers[name].record(step, net, losses[name][step])
            if rng.random() < 0.4:
                writers[name].checkpointed(step)
                newest[name] = step
    watch = Comparator(tmp_path, log=False, progress=False, probe=FileProbe)
    assert watch.run(poll=0.01, timeout=0.3) == 1  # the arms still run: waited for
    for name in ("a", "b"):
        if rng.random() < 0.5:  # killed (the OS drops its lock), requeued from its newest checkpoint
            writers[name].lock.release()
            start = newest[name]
            writers[name] = ArmWriter(tmp_path, name, start_step=start, resume=start == 0, format=format(), **options)
            if start == 0:
                writers[name].record(0, net)
            losses[name] = {s: v for s, v in losses[name].items() if s <= start}
        for step in range(writers[name].next_step, max_steps + 1):
            losses[name][step] = rng.uniform(0.1, 2.0)
            writers[name].record(step, net, losses[name][step])
        writers[name].finish()
    code = Comparator(tmp_path, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=BOUND)
    assert code == 0
    records = MetricsStore(tmp_path).step_records()
    assert [r["step"] for r in records] == list(range(max_steps + 1))
    for record in records[1:]:
        assert all(record[f"loss_{name}"] == losses[name][record["step"]] for name in ("a", "b"))
    tracked = [r["step"] for r in records if r["tracked"]]
    kept = tracked if not keep else [s for i, s in enumerate(tracked) if i % keep == 0 or s == max_steps]
    for name in ("a", "b"):
        saved = sorted(int(p.stem[5:]) for p in (tmp_path / name / "checkpoints").iterdir())
        assert saved == kept
