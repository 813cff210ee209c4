"""Separate-job pairs: two tiny arms trained once per session, then followed by the comparator."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from divergence.training.separate_arm import train_arm
from divergence.training.lockstep import train_pair
from tests.pairs.helpers import PAIR_FAST, PAIRS, pair_recipe
from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse: tiny models, one thread)

# the tiny DiT (a quarter of the UNet's CPU a step); steps 0..4; tracked: 0, 2 (checkpoint), 3 (every),
# 4 (checkpoint, last); probed: 0, 2, 4 (not 3)
STEPS = (
    "model.denoiser=transformer",
    "train.max_steps=4",
    "train.checkpoint_every=2",
    "tracking.every=3",
    "tracking.dense=[]",
    "tracking.probe.every=2",
)


def seed_pair(*overrides):
    return pair_recipe("seed-vs-seed", *STEPS, *overrides)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """``lockstep``: the pair trained in lockstep; ``arms``: the same pair as two separate jobs."""
    root = tmp_path_factory.mktemp("trained")
    train_pair(seed_pair(), root / "lockstep")
    for arm in "ab":
        train_arm(seed_pair(), arm, root / "arms")
    return root


@pytest.fixture
def arms(trained, tmp_path):
    """A fresh copy of the separately trained arms (no store yet)."""
    out = tmp_path / "pair"
    shutil.copytree(trained / "arms", out)
    return out


@pytest.fixture(scope="session")
def job_env():
    """The environment ``divergence train`` runs its separate-job pairs' arm jobs in here (one thread,
    this checkout on the path): the same for every test using it, so their arm jobs fork from one
    zygote (``training.child_start`` keys a zygote by the environment; ~9 s of CPU to start) when they
    run on one xdist worker. Set it with ``pytest.MonkeyPatch``."""
    return {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}


TWO_RANKS_TIMEOUT = 420  # seconds: a hang (one rank waiting in a collective) fails the tests instead of the suite


@pytest.fixture(scope="session")  # named after ``trained``: its tests join that fixture's xdist group
def two_rank_runs(trained, tmp_path_factory):
    """Every 2-rank DDP run of these tests, ONE torchrun launch (``tests.scaleout.ddp_train``): ROOT
    with each job's folder and, per rank r, ``NAME.rank{r}.code`` and ``NAME.rank{r}.err``."""
    root = tmp_path_factory.mktemp("two_ranks")
    ddp = (*PAIR_FAST, *STEPS, "train.strategy=ddp", "train.devices=2")
    seed = str(PAIRS / "seed-vs-seed.yaml")
    shutil.copytree(trained / "arms", root / "pair")  # the compare job's pair folder to follow
    a, b = (str(trained / "arms" / arm / "checkpoints/step_000004.safetensors") for arm in "ab")
    jobs = [
        dict(name="arm", kind="train", args=["--recipe", seed, "--arm", "a", "--out", str(root / "arm"), *ddp]),
        dict(
            name="control",
            kind="train",
            args=["--recipe", str(PAIRS / "control.yaml"), "--out", str(root / "control"), *ddp],
        ),
        dict(name="compare", kind="compare", args=[a, b, str(root / "pair"), str(root / "compared.pkl")]),
        dict(name="nan", kind="train", args=["--recipe", seed, "--out", str(root / "nan"), *ddp], nan_at_step=1),
    ]
    (root / "jobs.json").write_text(json.dumps(jobs))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    command = [torchrun, "--standalone", "--nproc-per-node=2", "-m", "tests.scaleout.ddp_train", str(root)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TWO_RANKS_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def rank_results(root, name: str) -> list[tuple[int, str]]:
    """``[(exit code, stderr)]`` of job ``name`` of ``two_rank_runs``, by rank."""
    return [
        (int((root / f"{name}.rank{r}.code").read_text()), (root / f"{name}.rank{r}.err").read_text()) for r in (0, 1)
    ]
