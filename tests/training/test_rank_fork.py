"""A separate pair's arm jobs are forks of the one zygote; a multi-rank arm's rank 1 is Lightning's.

One tiny DiT data-parallel pair (arm a: 2 gloo ranks of 2 examples, arm b: 1 process of 4; 2 steps)
is trained by a forked ``divergence train``: its arm jobs are forked from the zygote that forked the
pair's process (the zygote ``tests/training/test_child_start.py`` forks from too: ``zygote_root``),
and arm a's rank 1 is a fresh interpreter that Lightning's own launcher starts from rank 0. Arm a
alone is trained again, started with ``Popen`` (``DIVERGENCE_CHILD_START=popen``): the same bytes.
A ``sitecustomize`` on the children's path logs every interpreter that starts (a forked child
starts none).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from divergence.training import child_start
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
ZYGOTE = ["-c", "from divergence.training.child_start import serve"]  # the start of the zygote's argv
RANK = ["-m", "divergence.__main__"]  # Lightning's command of a rank it launches (``python -m`` of __main__)


def _command(root: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "divergence", "train", "--recipe", str(root / "pair.yaml"), "--out", str(out), *extra]


def _starts(root: Path) -> list[list[str]]:
    """The interpreters started so far with the starts log on: each one's ``-m MODULE`` or ``-c CODE``."""
    path = root / "starts.jsonl"
    return [json.loads(line)["argv"][1:3] for line in path.read_text().splitlines()] if path.exists() else []


def _run(command: list[str], env: dict[str, str], log: Path):
    with open(log, "w") as f:
        child = child_start.start(command, env, stdout=f, stderr=subprocess.STDOUT)
    assert child.wait(timeout=600) == 0, log.read_text()[-3000:]
    return child


@pytest.fixture(scope="module")
def trained(zygote_root):
    """The pair trained forked (``fork/``), then arm a alone with Popen (``popen/``), and the fresh
    interpreters each started (the zygote's own start aside); in the zygote's folder, shared with
    test_child_start."""
    root = zygote_root
    (root / "pair.yaml").write_text(PAIR.format(root=ROOT))
    runs, starts = {}, {}
    for mode, extra in (("fork", ()), ("popen", ("--arm", "a"))):
        before = len(_starts(root))
        command = _command(root, root / mode, *QUICK, *extra)
        runs[mode] = _run(command, _env(root, mode), root / f"{mode}.log")
        starts[mode] = [s for s in _starts(root)[before:] if s[0] != ZYGOTE[0]]
    return root, runs, starts


def test_an_arm_with_lightnings_rank_1_trains_the_popen_runs_bytes(trained):
    root, _, _ = trained
    fork, popen = root / "fork" / "a", root / "popen" / "a"
    assert json.loads((fork / "status.json").read_text())["world_size"] == 2
    names = ["losses.jsonl", "checkpoints/step_000002.safetensors", "resume/last.ckpt"]
    for name in names:
        assert (fork / name).read_bytes() == (popen / name).read_bytes(), name
    assert (root / "fork" / "metrics.jsonl").stat().st_size > 0  # the comparator followed both arms


def test_the_pair_and_its_arm_jobs_are_forked_and_rank_1_is_a_fresh_interpreter_lightning_starts(trained):
    root, runs, starts = trained
    assert type(runs["fork"]) is child_start.ForkedChild and type(runs["popen"]) is subprocess.Popen
    (zygote,) = [s for s in _starts(root) if s[0] == ZYGOTE[0]]  # one zygote forked every forked child
    assert zygote[1].startswith(ZYGOTE[1]), zygote
    # forked: the pair's process and both arm jobs start no interpreter; arm a's rank 1 is Lightning's Popen
    assert starts["fork"] == [RANK], starts
    assert starts["popen"] == [["-m", "divergence"], RANK], starts  # Popen: rank 0 too is a fresh interpreter
