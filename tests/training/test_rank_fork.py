"""A separate pair's arm jobs and their Lightning ranks are forks of the one zygote (``training.rank_launch``).

One tiny DiT data-parallel pair (arm a: 2 gloo ranks of 2 examples, arm b: 1 process of 4; 2 steps)
is trained by a forked ``divergence train``: its arm jobs and arm a's rank 1 are forked from the
zygote that forked the pair's process (the zygote ``tests/training/test_child_start.py`` forks from
too: ``zygote_root``). Arm a alone is trained again, its rank 0 forked as before
but with ``DIVERGENCE_CHILD_START=popen``, so that its rank 1 is a fresh interpreter: the same
bytes. A
``sitecustomize`` on the children's path logs every interpreter that starts (a forked child starts
none), and in the zygote records which module reads a rank variable while ``PRELOAD`` imports.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from divergence.training import child_start
from tests.procs import children
from tests.training.forks import child_env as _env

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "train.max_steps=2",
    "train.checkpoint_every=2",
    "train.cpu_threads=1",
    "sample.enabled=false",
    "log.wandb=false",
    "log.progress_bar=false",
    "tracking.every=1",
    "tracking.probe.size=4",
]
PAIR = """name: data-parallel-dit
base: {root}/recipes/tiny-dit.yaml
arms:
  a: [{{data-parallel: 2x2}}]
  b: [{{data-parallel: 1x4}}]
"""


def _command(root: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "divergence", "train", "--recipe", str(root / "pair.yaml"), "--out", str(out), *extra]


def _starts(root: Path) -> list[list[str]]:
    return [json.loads(line)["argv"][1:3] for line in (root / "starts.jsonl").read_text().splitlines()]


def _run(command: list[str], env: dict[str, str], log: Path) -> int:
    with open(log, "w") as f:
        child = child_start.start(command, env, stdout=f, stderr=subprocess.STDOUT)
    return child.wait(timeout=600)


@pytest.fixture(scope="module")
def trained(zygote_root):
    """The pair trained forked (``fork/``, the fresh interpreters started meanwhile), then arm a with Popen;
    in the zygote's folder (``zygote_root``: its sitecustomize, its starts log), shared with test_child_start."""
    root = zygote_root
    (root / "pair.yaml").write_text(PAIR.format(root=ROOT))
    code = _run(_command(root, root / "fork", *QUICK), _env(root, "fork"), root / "fork.log")
    assert code == 0, (root / "fork.log").read_text()[-3000:]
    forked_starts = _starts(root)
    # arm a again, rank 0 forked as before but told to Popen its rank 1 (one fresh import, not two)
    (zygote,) = child_start._zygotes.values()
    with open(root / "popen.log", "w") as f:
        rank0 = zygote.fork(_command(root, root / "popen", *QUICK, "--arm", "a"), _env(root, "popen"), f, f)
    assert rank0.wait(timeout=600) == 0, (root / "popen.log").read_text()[-3000:]
    return root, forked_starts


def test_a_forked_rank_trains_the_popen_ranks_bytes(trained):
    root, _ = trained
    fork, popen = root / "fork" / "a", root / "popen" / "a"
    assert json.loads((fork / "status.json").read_text())["world_size"] == 2
    names = ["losses.jsonl", "checkpoints/step_000002.safetensors", "resume/last.ckpt"]
    for name in names:
        assert (fork / name).read_bytes() == (popen / name).read_bytes(), name
    assert (root / "fork" / "metrics.jsonl").stat().st_size > 0  # the comparator followed both arms


def test_the_pair_its_arm_jobs_and_rank_1_start_no_interpreter_but_the_one_zygote(trained):
    root, forked = trained
    (zygote,) = forked  # no second zygote, no fresh rank: the pair, both arm jobs and rank 1 were forked
    assert zygote[0] == "-c" and zygote[1].startswith("from divergence.training.child_start import serve"), forked
    popen = _starts(root)[1:]  # the arm whose rank 0 Popened its rank 1: a fresh interpreter
    assert popen == [["-m", "divergence.__main__"]], popen


def test_no_preloaded_module_reads_a_rank_variable_at_import_but_the_rank_readers(trained):
    root, _ = trained
    reads = {tuple(json.loads(line)) for line in (root / "starts.jsonl.reads").read_text().splitlines()}
    assert {module for _key, module in reads} == set(child_start.RANK_READERS), reads


def test_a_forked_rank_reads_its_rank_from_its_environment(monkeypatch):
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from torchmetrics.utilities import prints

    before = rank_zero_only.rank, prints.rank_zero_only.rank
    try:
        monkeypatch.setenv("LOCAL_RANK", "1")
        child_start._read_rank()
        assert (rank_zero_only.rank, prints.rank_zero_only.rank) == (1, 1)
    finally:
        rank_zero_only.rank, prints.rank_zero_only.rank = before


def test_a_killed_rank_1_stops_its_job(trained):
    """Arm a's rank 1, forked by the zygote, SIGKILLed as it starts: Lightning's observer sees its exit
    code through ``ForkedChild.poll`` and ends rank 0 (or rank 0's next collective fails), with the line."""
    root, _ = trained
    log = root / "killed.log"
    with open(log, "w") as f:
        command = _command(root, root / "killed", *QUICK, "train.max_steps=1000", "--arm", "a")
        rank0 = child_start.start(command, _env(root, "fork"), stdout=f, stderr=subprocess.STDOUT)
    (zygote,) = child_start._zygotes.values()
    assert type(rank0) is child_start.ForkedChild
    try:
        rank1 = _wait_for_sibling(zygote.process.pid, rank0.pid)
        os.kill(rank1, signal.SIGKILL)
        code = rank0.wait(timeout=120)
    finally:
        rank0.kill()
    text = log.read_text()
    why = (f"Child process with PID {rank1} terminated with code -9", "Check the logs of the remote worker")
    assert code != 0 and any(line in text for line in why), text[-2000:]


def _wait_for_sibling(zygote: int, rank0: int) -> int:
    """The zygote's child other than rank 0: rank 1, once rank 0 has launched it."""
    for _ in range(3000):
        others = [p for p in children(zygote) if p != rank0]
        if others:
            return others[0]
        time.sleep(0.05)
    raise AssertionError("rank 1 never started")
